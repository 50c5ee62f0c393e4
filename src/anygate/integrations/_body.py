"""Response bodies that hold a gate slot until they end, fail or are closed.

:class:`~anygate.integrations._transport.TransportCore` wraps every streamed response in one
of these; the flavour modules combine them with their library's byte-stream classes so the
client's ``isinstance`` checks pass. The slot is returned exactly once, by whichever comes
first: the body ends, reading it fails or is cancelled, or the response is closed; an
unclosed response collected by the garbage collector is reported here and reclaimed by the
gate's leak reclaim.
"""

from __future__ import annotations

import warnings
from contextlib import suppress
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from .. import Token
    from ._transport import TransportCore

__all__ = ["AsyncBody", "SyncBody"]


def _where(request: Any) -> str:
    """``METHOD scheme://host/path`` of a request; the query is dropped (it may hold keys)."""
    try:
        url = request.url
        return f"{request.method} {url.scheme}://{url.netloc.decode('ascii')}{url.path}"
    except Exception:  # a repr must never fail, least of all inside __del__
        return "a request"


class _Body:
    """What both body kinds share: the slot, and the unclosed-response report."""

    # Slots although the flavour classes also derive from httpx's stream classes, which
    # have a __dict__: attributes in slots leave that dict unallocated, one object fewer
    # per response (issue 14).
    __slots__ = ("_core", "_done", "_ended", "_inner", "_iterator", "_request", "_token")

    _inner: Any
    _token: Token
    _request: Any
    _core: TransportCore

    _done: bool
    # The inner iterator ran to its end: closing it would do nothing, so aclose() and
    # close() only close the inner stream.
    _ended: bool
    _iterator: Any  # the inner stream's iterator once read; each kind says which

    def __init__(self, inner: Any, token: Token, request: Any, core: TransportCore) -> None:
        self._inner = inner
        self._token = token
        self._request = request
        self._core = core
        self._done = False
        self._ended = False
        self._iterator = None

    def __del__(self) -> None:
        # Releasing here could deadlock: a cyclic collection may run inside the gate's own
        # locked section on this thread. So we only report; the token, collected with us,
        # returns the slot through the gate's reentrancy-safe leak reclaim. (Our own flag,
        # not token.released: in a reference cycle the token may be finalised first.)
        if not getattr(self, "_done", True):
            core = self._core
            warnings.warn(
                f"an unclosed {core.flavour.name} response ({_where(self._request)}) held a "
                f"slot of gate {core.gate.name!r} until it was garbage-collected; close "
                "streamed responses (`async with client.stream(...)`, `response.aclose()`, "
                "or the SDK stream's `close()`) so the slot comes back at once",
                ResourceWarning,
                stacklevel=2,
            )


async def aclose_stream(iterator: object, inner: Any) -> None:
    """Close a half-read inner iterator, then its stream.

    Closing the iterator now rather than leaving it to the garbage collector matters (trio
    warns about each generator it has to finalise), unless another task is inside it right
    now: then it raises "already running", and closing the stream is what makes that reader
    stop. Used by the slot-holding bodies and the metered streams alike.
    """
    try:
        aclose = getattr(iterator, "aclose", None)
        if aclose is not None:
            with suppress(RuntimeError):
                await aclose()
    finally:
        await inner.aclose()


def close_stream(iterator: object, inner: Any) -> None:
    """The blocking twin of :func:`aclose_stream` ("generator already executing" is a
    ``ValueError`` when another thread is inside it)."""
    try:
        close = getattr(iterator, "close", None)
        if close is not None:
            with suppress(ValueError):
                close()
    finally:
        inner.close()


class AsyncBody(_Body):
    """A response body that holds a gate slot until it ends, fails or is closed.

    Flavour modules combine it with their library's ``AsyncByteStream`` so the client's
    ``isinstance`` checks pass. Iterating it iterates the inner stream once.
    """

    _iterator: AsyncIterator[bytes] | None

    def __aiter__(self) -> AsyncIterator[bytes]:
        if self._iterator is None:
            self._iterator = self._inner.__aiter__()
        return self

    async def __anext__(self) -> bytes:
        iterator = self._iterator
        if iterator is None:
            iterator = self._iterator = self._inner.__aiter__()
        try:
            return await iterator.__anext__()
        except BaseException as exc:
            # The body ended (StopAsyncIteration), broke, or the reader was cancelled: in
            # every case nothing more will be read, so the provider is done with us.
            # The slot goes back inline, here and in aclose(): a call fewer per response.
            if isinstance(exc, StopAsyncIteration):
                self._ended = True
            self._done = True
            self._token.release()
            raise

    async def aclose(self) -> None:
        if self._ended:
            # The common case, read to the end and then closed: the slot went back at the
            # end and the finished inner iterator has nothing to close. (Returning the
            # inner aclose() from a plain method spared a coroutine, but httpx declares
            # aclose async and pyright refuses the override.)
            await self._inner.aclose()
            return
        await self._aclose()

    async def _aclose(self) -> None:
        try:
            await aclose_stream(self._iterator, self._inner)
        finally:
            if not self._done:
                self._done = True
                self._token.release()


class SyncBody(_Body):
    """The blocking twin of :class:`AsyncBody`, for ``httpx.Client`` / ``httpx2.Client``."""

    _iterator: Iterator[bytes] | None

    def __iter__(self) -> Iterator[bytes]:
        if self._iterator is None:
            self._iterator = iter(self._inner)
        return self

    def __next__(self) -> bytes:
        iterator = self._iterator
        if iterator is None:
            iterator = self._iterator = iter(self._inner)
        try:
            return next(iterator)
        except BaseException as exc:
            if isinstance(exc, StopIteration):
                self._ended = True
            self._done = True
            self._token.release()
            raise

    def close(self) -> None:
        try:
            if self._ended:
                self._inner.close()
            else:
                close_stream(self._iterator, self._inner)
        finally:
            if not self._done:
                self._done = True
                self._token.release()
