"""Per-route gating for Starlette and FastAPI, and a streaming response that closes its body.

Two problems of streaming LLM answers from a web route, both met in issue 15:

- Starlette's ``StreamingResponse`` stops iterating its body when the client disconnects
  (or a ``send`` fails) but never calls ``aclose()`` on it. A generator stopped at a
  ``yield`` is then closed by the garbage collector, in a new task, after the app returned:
  its ``finally`` (cancelling the upstream call, counting, logging) runs after the slot went
  to the next request. :class:`StreamingResponse` closes the body before it returns.
- Apps that gate some routes only want a slot per request, held through the response and
  turned into ``429`` + ``Retry-After`` when it does not come: :class:`RouteGate`, a FastAPI
  dependency and a Starlette endpoint decorator.
"""

from __future__ import annotations

import functools
import math
from collections import deque
from typing import TYPE_CHECKING, final

import anyio
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.responses import StreamingResponse as _StarletteStreamingResponse

from .. import Busy, Gate
from ._asgi import _check_seconds, admit_at_once, retry_after_seconds, wait_watching

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    from starlette.types import Receive, Scope, Send

    from .. import Token

__all__ = ["RouteGate", "StreamingResponse"]


async def _close_body(iterator: object) -> None:
    aclose = getattr(iterator, "aclose", None)
    if aclose is None:
        return
    # Shielded: we are often here *because* of a cancellation (the disconnect watcher
    # cancelled the streaming task), and the generator's clean-up must still run.
    with anyio.CancelScope(shield=True):
        await aclose()


class StreamingResponse(_StarletteStreamingResponse):
    """Starlette's ``StreamingResponse``, but the body is closed before the response returns.

    A drop-in replacement (same arguments) for routes that stream from an async generator.
    When the client disconnects mid-stream, Starlette stops iterating and leaves the
    generator to the garbage collector; this class calls its ``aclose()`` (shielded from
    cancellation) before returning, so the generator's ``finally`` runs while the request
    still holds its slot of :class:`~anygate.asgi.GateMiddleware` or :class:`RouteGate`.
    A body that is not an async generator (no ``aclose``) is left alone.
    """

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await _close_body(self.body_iterator)


@final
class _HeldResponse(Response):
    """Wraps an endpoint's response so the request's slot is released after it is sent."""

    def __init__(self, response: Response, token: Token) -> None:  # no super(): a wrapper
        self._response = response
        self._token = token
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._response(scope, receive, send)
        finally:
            try:
                if isinstance(self._response, _StarletteStreamingResponse):
                    await _close_body(self._response.body_iterator)
            finally:
                self._token.release()


@final
class RouteGate:
    """A slot of ``gate`` per request, for the routes that ask for it.

    For apps that gate some routes only (the others stay ungated, unlike
    :class:`~anygate.asgi.GateMiddleware`'s path prefixes it needs no routing knowledge).
    A request waits up to ``timeout`` for a slot; if none comes, it is answered ``429 Too
    Many Requests`` with ``Retry-After`` (an ``HTTPException``, so the app's own handler
    shapes the body: FastAPI's ``{"detail": ...}``). A client that hangs up while queued
    leaves the queue and the endpoint never runs.

    The slot is held until the response has been sent, or the client left and the
    response returned; a streaming body is closed (its ``finally`` has run) before the slot
    is given back.

    FastAPI, as a dependency (it is an async generator dependency; FastAPI exits it after
    the response, so a ``StreamingResponse`` keeps the slot; use
    :class:`StreamingResponse` so a generator stopped by a disconnect is closed first)::

        chat_gate = RouteGate(anygate.shared_gate("chat", capacity=8), timeout=30)

        @app.post("/v1/chat", dependencies=[Depends(chat_gate)])
        async def chat(body: Question) -> StreamingResponse: ...

    Starlette, as an endpoint decorator (the slot covers the endpoint and its response)::

        @chat_gate.route
        async def chat(request: Request) -> Response: ...

    Args:
        gate: the gate requests take their slots from.
        timeout: longest wait for a slot, in seconds; ``0`` answers 429 at once when the
            gate is full, ``None`` waits as long as it takes. Default 60 s.
        retry_after: seconds for the ``Retry-After`` header (rounded up). Default 1.

    Raises:
        TypeError: ``gate`` is not a Gate, or a number of the wrong type.
        ValueError: a negative or NaN ``timeout`` or ``retry_after``.
    """

    __slots__ = ("_gate", "_retry_after", "_timeout")

    def __init__(
        self, gate: Gate, *, timeout: float | None = 60.0, retry_after: float = 1.0
    ) -> None:
        given: object = gate
        if not isinstance(given, Gate):
            msg = f"gate must be an anygate.Gate (got {gate!r} of type {type(gate).__name__})"
            raise TypeError(msg)
        self._gate = gate
        self._timeout = _check_seconds("timeout", timeout, allow_none=True)
        retry = _check_seconds("retry_after", retry_after, allow_none=False)
        assert retry is not None
        self._retry_after = math.ceil(retry)

    @property
    def gate(self) -> Gate:
        """The gate requests take their slots from."""
        return self._gate

    def __repr__(self) -> str:
        return f"<anygate.starlette.RouteGate gate={self._gate.name!r} timeout={self._timeout}>"

    async def _admit(self, request: Request) -> Token:
        """Wait for a slot, watching for the client leaving; raise the 429 or a disconnect."""
        try:
            if self._timeout == 0:
                token: Token | None = await self._gate.acquire(timeout=0)
            else:
                token = admit_at_once(self._gate)
                if token is None:
                    token = await self._wait(request)
        except Busy as exc:
            raise HTTPException(
                status_code=429,
                detail=str(exc),
                headers={"Retry-After": str(retry_after_seconds(exc, self._retry_after))},
            ) from exc
        if token is None:
            # The client left while queued. 499 is nginx's "client closed request"; nobody
            # reads it, but the exception stops the endpoint from running.
            raise HTTPException(status_code=499, detail="client disconnected while queued")
        return token

    async def _wait(self, request: Request) -> Token | None:
        """Queue for a slot (the gate is busy), watching the client from before queueing."""
        # Read (and cache on the request) the body first: afterwards the only message the
        # server can send is http.disconnect, so watching for it consumes nothing the
        # endpoint needs. Only here, not for a request admitted at once: that one needs no
        # watching, and its body is the endpoint's to read (or not) as it streams.
        try:
            await request.body()
        except ClientDisconnect:
            return None  # hung up before even queueing
        except RuntimeError:
            # A stream the app already consumed cannot be watched (nor be read twice).
            return await self._gate.acquire(timeout=self._timeout)
        return await wait_watching(self._gate, self._timeout, request.receive, deque())

    async def __call__(self, request: Request) -> AsyncIterator[Token]:
        """The FastAPI dependency: hold a slot for the request, yield its token."""
        token = await self._admit(request)
        try:
            yield token
        finally:
            token.release()

    def route(
        self, endpoint: Callable[[Request], Awaitable[Response]]
    ) -> Callable[[Request], Awaitable[Response]]:
        """Decorate a Starlette endpoint so it runs, and its response is sent, with a slot."""

        @functools.wraps(endpoint)
        async def gated(request: Request) -> Response:
            token = await self._admit(request)
            try:
                response = await endpoint(request)
            except BaseException:
                token.release()
                raise
            return _HeldResponse(response, token)

        return gated


# FastAPI resolves a dependency's string annotations in the callable's ``__globals__``, which
# an instance does not have; without the real class, ``request`` would become a query field.
RouteGate.__call__.__annotations__["request"] = Request
