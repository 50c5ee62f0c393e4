"""What :meth:`anygate.Gate.acquire` returns: an awaitable that is also an async context manager.

The uncontended path lives here, spelled out in both ``__await__`` and ``__aenter__`` (one
delegating to the other would cost a generator per acquire); queuing is the gate's
``_wait``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, final

from . import _waiters
from ._waiters import ki_protected

if TYPE_CHECKING:
    from collections.abc import Generator
    from types import CodeType, TracebackType

    from ._gate import Gate
    from ._token import Token

__all__ = ["_Acquire"]


@final
class _Acquire:
    """What :meth:`Gate.acquire` returns: awaitable, and an async context manager."""

    __slots__ = ("_code", "_gate", "_lasti", "_priority", "_timeout", "_token", "_tokens")

    def __init__(
        self,
        gate: Gate,
        timeout: float | None,
        tokens: int,
        priority: int,
        code: CodeType,
        lasti: int,
    ) -> None:
        self._gate = gate
        self._timeout = timeout
        self._tokens = tokens
        self._priority = priority
        self._code = code
        self._lasti = lasti
        self._token: Token | None = None

    @ki_protected
    def __await__(self) -> Generator[Any, None, Token]:
        # A generator that, with fast_acquire, usually never yields: that path is measured
        # against anyio.Semaphore(fast_acquire=True), so it avoids awaiting anything at all.
        gate = self._gate
        # Unlocked hint (I2 is re-checked under the lock): a caller that will queue anyway
        # skips the fast path's lock round trip, and its park is the schedule point.
        free = not gate._live and gate._in_flight < gate._limit
        # Checked even when we are about to queue: a grant can complete the wait before
        # anyio delivers a pending cancellation, and acquire() must fail in a cancelled scope.
        if free and not gate._fast_acquire:
            yield from _waiters.full_checkpoint().__await__()  # let others run first
        else:
            check = _waiters.cancellation_check()
            if check is not None:
                yield from check.__await__()  # raises a pending cancellation
        if free:
            token = gate._try_fast(self._code, self._lasti, self._tokens)
            if token is not None:
                return token
        return (yield from gate._wait(self).__await__())

    @ki_protected
    async def __aenter__(self) -> Token:
        # The steps of __await__ spelled out: delegating to it would cost a generator.
        gate = self._gate
        free = not gate._live and gate._in_flight < gate._limit
        if free and not gate._fast_acquire:
            await _waiters.full_checkpoint()
        else:
            check = _waiters.cancellation_check()
            if check is not None:
                await check
        token = None
        if free:
            token = gate._try_fast(self._code, self._lasti, self._tokens)
        if token is None:
            token = await gate._wait(self)
        self._token = token
        return token

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        if self._token is not None:
            self._token.release()
