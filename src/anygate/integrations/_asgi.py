"""GateMiddleware: admit an ASGI HTTP request only with a gate slot, else answer 429.

The slot is taken before the app runs and given back exactly once, by whichever comes
first: the last byte of the response was handed to the server, or the app returned or
raised. A client that disconnects does *not* free the slot by itself: the app's work for
that request (a model still generating, a streaming body's clean-up) goes on until the app
returns, and the slot bounds that work. The app returning always happens, so even a
streaming body that never started (lilbee's case) cannot strand the slot.

While a request is queued, the middleware reads from the client so that a client that
hangs up in the queue leaves it: its handler never runs (paid model work for nobody).
The body read meanwhile is replayed to the app. Pure ASGI 3; no framework import.
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import TYPE_CHECKING, Any, final

import anyio

from .. import Busy, Gate
from .._validation import MAX_SECONDS, check_number, check_wait

if TYPE_CHECKING:
    from .. import Token

__all__ = ["ASGIApp", "GateMiddleware", "acquire_watching", "admit_at_once", "wait_watching"]

# How much request body a queued request may buffer while we watch for its client leaving.
# Past this the watch stops (the rest of the body waits in the server's flow control, as it
# would without us) and a later disconnect is noticed only after admission.
_MAX_BUFFERED = 1 << 20

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def _check_seconds(name: str, value: object, *, allow_none: bool) -> float | None:
    # The shared number check: huge ints and absurd floats get an error naming `name`.
    if allow_none:
        return check_wait(name, value)
    return check_number(name, value, maximum=MAX_SECONDS)


def _check_paths(paths: object) -> tuple[str, ...] | None:
    if paths is None:
        return None
    if isinstance(paths, (str, bytes)) or not isinstance(paths, Iterable):
        msg = f"paths must be an iterable of path prefixes such as ['/v1/chat'] (got {paths!r})"
        raise TypeError(msg)
    checked: list[str] = []
    for path in paths:
        if not isinstance(path, str) or not path.startswith("/"):
            msg = f"paths entries must be str starting with '/' (got {path!r})"
            raise ValueError(msg)
        checked.append(path.rstrip("/") or "/")
    return tuple(checked)


def _matches(path: str, prefixes: tuple[str, ...]) -> bool:
    # Whole segments only: "/v1/chat" gates "/v1/chat" and "/v1/chat/x", not "/v1/chatter".
    for prefix in prefixes:
        if prefix == "/" or path == prefix or path.startswith(prefix + "/"):
            return True
    return False


@final
class GateMiddleware:
    """ASGI middleware admitting each HTTP request only while it holds a slot of ``gate``.

    Put it in front of the routes that stream chat responses (Starlette:
    ``app.add_middleware(GateMiddleware, gate=gate, timeout=30, paths=["/v1/chat"])``).
    A request waits up to ``timeout`` seconds for a slot, in strict arrival order; if none
    comes it is answered at once with ``429 Too Many Requests``, a ``Retry-After`` header
    and a JSON body ``{"error": {"type": "busy", "code": "gate_busy", "message": ...}}``,
    without running the app.

    The slot is held until the response has been completely handed to the server, or the
    app returns or raises, whichever comes first: work the app does after the last byte
    (Starlette background tasks) runs without it. A client that disconnects mid-response
    does not free the slot early: the app is still working for it until it returns, and
    the slot bounds that work. (Starlette's own ``StreamingResponse`` leaves a body
    generator that was stopped at a ``yield`` to the garbage collector, so its ``finally``
    runs after the app returned; :class:`anygate.starlette.StreamingResponse` closes it
    before returning.) A client that hangs up while *queued* leaves the queue and its
    request never runs.

    Lifespan and websocket traffic, and HTTP paths outside ``paths``, pass straight
    through. This is not a rate limiter: it bounds how many requests run at once.

    Args:
        app: the ASGI 3 application to protect.
        gate: the gate requests take their slots from (often
            ``anygate.shared_gate("chat", capacity=...)``, shared with other code).
        timeout: longest wait for a slot, in seconds; ``0`` answers 429 at once when full,
            ``None`` waits as long as it takes. Default 60 s.
        paths: path prefixes to gate, matched on whole segments (``"/v1/chat"`` covers
            ``/v1/chat/completions`` but not ``/v1/chatter``); ``None`` gates every HTTP
            request.
        retry_after: seconds suggested in the ``Retry-After`` header of a 429 (rounded up
            to whole seconds, as HTTP requires). Default 1.

    Raises:
        TypeError: ``gate`` is not a Gate, ``app`` not callable, ``paths`` a single string
            or not iterable, or a number of the wrong type.
        ValueError: a negative or NaN ``timeout`` or ``retry_after``, or a path that does
            not start with ``/``.
    """

    __slots__ = ("_app", "_gate", "_paths", "_retry_after", "_timeout")

    def __init__(
        self,
        app: ASGIApp,
        *,
        gate: Gate,
        timeout: float | None = 60.0,
        paths: Iterable[str] | None = None,
        retry_after: float = 1.0,
    ) -> None:
        given: tuple[object, object] = (gate, app)
        if not isinstance(given[0], Gate):
            msg = f"gate must be an anygate.Gate (got {gate!r} of type {type(gate).__name__})"
            raise TypeError(msg)
        if not callable(given[1]):
            msg = f"app must be an ASGI application (a callable), got {app!r}"
            raise TypeError(msg)
        self._app = app
        self._gate = gate
        self._timeout = _check_seconds("timeout", timeout, allow_none=True)
        retry = _check_seconds("retry_after", retry_after, allow_none=False)
        assert retry is not None
        self._retry_after = math.ceil(retry)
        self._paths = _check_paths(paths)

    @property
    def gate(self) -> Gate:
        """The gate requests take their slots from."""
        return self._gate

    def __repr__(self) -> str:
        paths = "all paths" if self._paths is None else ", ".join(self._paths)
        return f"<anygate.asgi.GateMiddleware gate={self._gate.name!r} timeout={self._timeout} {paths}>"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (
            self._paths is not None and not _matches(scope["path"], self._paths)
        ):
            await self._app(scope, receive, send)
            return
        buffered: deque[Message] = deque()
        try:
            token = await acquire_watching(self._gate, self._timeout, receive, buffered)
        except Busy as exc:
            await self._reject(send, exc)
            return
        if token is None:
            return  # the client hung up while queued: nobody to run the request for
        release = token.release
        trailers = False

        async def replaying_receive() -> Message:
            if buffered:
                return buffered.popleft()  # body read while we watched the queued client
            return await receive()

        async def gated_send(message: Message) -> None:
            nonlocal trailers
            kind = message["type"]
            if kind == "http.response.start":
                trailers = bool(message.get("trailers", False))
            await send(message)
            if (
                (kind == "http.response.body" and not trailers and not message.get("more_body"))
                or (kind == "http.response.trailers" and not message.get("more_trailers"))
                or kind == "http.response.pathsend"
            ):
                release()  # the whole response is with the server; background work is free

        try:
            await self._app(scope, replaying_receive if buffered else receive, gated_send)
        finally:
            # Returned or raised: the last chance, and it always comes. A disconnect or a
            # failed send does not release earlier: the app may still be working (issue 15:
            # a generator's clean-up ran after the slot went to the next request).
            release()

    async def _reject(self, send: Send, busy: Busy) -> None:
        retry_after = retry_after_seconds(busy, self._retry_after)
        body = json.dumps(
            {
                "error": {
                    "type": "busy",
                    "code": "gate_busy",
                    "message": str(busy),
                    "retry_after": retry_after,
                }
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 429,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"retry-after", str(retry_after).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body, "more_body": False})


def retry_after_seconds(busy: Busy, default: int) -> int:
    """Whole seconds for ``Retry-After``: the gate's own estimate when its rate budget
    decided (``Busy.retry_after_s``: when this caller could have been admitted), else
    ``default``; never below 1, so a client does not retry at once."""
    estimate = busy.retry_after_s
    if estimate is None or not math.isfinite(estimate):
        return default
    return max(1, math.ceil(estimate))


def admit_at_once(gate: Gate) -> Token | None:
    """A slot of ``gate`` if one is admitted in this synchronous step, else ``None``.

    The only way a request may go unwatched: whatever is not admitted here can wait, and
    must be watched (:func:`wait_watching`) from before it does.
    """
    # Not ``await gate.acquire()`` after an "is it free?" look: the acquire yields *before*
    # it admits, so a burst arriving in one tick would all pass the look, none be watched,
    # and the ones that then queue would run for clients long gone (issue 26: 0 of 4
    # simultaneous leavers noticed). The unlocked hint only spares the refusal's cost and
    # its count in ``statistics().rejected`` in the common contended case; if another
    # thread took the slot since, that refusal is counted once and the request waits
    # watched. A rate budget has no cheap hint, so a rated gate always watches.
    if gate.rate is None and gate.waiting == 0 and gate.in_flight < gate.capacity:
        try:
            return gate.acquire_nowait()
        except Busy:
            pass
    return None


async def acquire_watching(
    gate: Gate, wait_s: float | None, receive: Receive, buffered: deque[Message]
) -> Token | None:
    """Wait for a slot of ``gate`` while watching ``receive`` for the client leaving.

    Returns the token, or ``None`` when an ``http.disconnect`` came first (see
    :func:`wait_watching`). A request admitted synchronously (a free slot, nobody queued,
    no rate budget) and ``wait_s=0`` are not watched: they never wait, so there is nothing
    to leave, and they cost no task. Every other request is watched from before it can
    wait.

    Raises:
        Busy: no slot within ``wait_s`` seconds.
    """
    if wait_s == 0:
        return await gate.acquire(timeout=0)
    token = admit_at_once(gate)
    if token is not None:
        return token
    return await wait_watching(gate, wait_s, receive, buffered)


async def wait_watching(
    gate: Gate, wait_s: float | None, receive: Receive, buffered: deque[Message]
) -> Token | None:
    """Queue for a slot of ``gate``, reading ``receive`` meanwhile to see the client leave.

    Returns the token, or ``None`` when an ``http.disconnect`` came first (the wait is
    abandoned, so the queue position goes to the next caller; a slot granted in the same
    instant is given back). ``http.request`` messages read meanwhile are appended to
    ``buffered``, in order, for the app to be given first (up to about 1 MiB, after which
    the watch stops). A ``receive`` cancelled when the slot comes must keep an unread
    message for the next call, as uvicorn's, hypercorn's and every queue-based server's do.

    Raises:
        Busy: no slot within ``wait_s`` seconds.
    """
    left = False
    token: Token | None = None
    busy: Busy | None = None
    async with anyio.create_task_group() as tg:

        async def watch() -> None:
            nonlocal left
            size = 0
            while size <= _MAX_BUFFERED:
                try:
                    message = await receive()
                except Exception:
                    return
                if message["type"] == "http.disconnect":
                    left = True
                    tg.cancel_scope.cancel()
                    return
                buffered.append(message)
                size += len(message.get("body", b""))

        tg.start_soon(watch)
        try:
            token = await gate.acquire(timeout=wait_s)
        except Busy as exc:
            busy = exc
        tg.cancel_scope.cancel()
    if busy is not None:
        raise busy
    if left and token is not None:
        token.release()  # granted in the same instant the client left
        return None
    return token
