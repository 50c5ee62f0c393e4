"""GateMiddleware: admit an ASGI HTTP request only with a gate slot, else answer 429.

The slot is taken before the app runs and given back exactly once, by whichever comes
first: the last byte of the response was handed to the server, the server reported the
client gone (``http.disconnect`` from ``receive``, or ``send`` raising), or the app
returned or raised. The last of these always happens, so even a streaming body that never
started (lilbee's case: the client left before the generator's first iteration, so the
generator's ``finally`` never ran) cannot strand the slot. Pure ASGI 3; no framework import.
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any, final

from .._errors import Busy
from .._gate import Gate
from .._validation import FLOAT_MAX, MAX_SECONDS, check_number

__all__ = ["ASGIApp", "GateMiddleware"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def _check_seconds(name: str, value: object, *, allow_none: bool) -> float | None:
    # The shared number check: huge ints and absurd floats get an error naming `name`.
    seconds = check_number(
        name,
        value,
        none=allow_none,
        infinite=allow_none,
        maximum=FLOAT_MAX if allow_none else MAX_SECONDS,
    )
    return None if seconds is None or math.isinf(seconds) else seconds


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

    The slot is held until the response has been completely handed to the server, and no
    longer: work the app does after that (Starlette background tasks) runs without it. It
    comes back earlier if the client disconnects (as soon as the server tells the app) or
    the app raises, and always when the app returns, exactly once.

    Lifespan and websocket traffic, and HTTP paths outside ``paths``, pass straight
    through. This is not a rate limiter: it bounds how many requests run at once. A client
    that leaves while *queued* is noticed only once its request is admitted.

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
        try:
            token = await self._gate.acquire(timeout=self._timeout)
        except Busy as exc:
            await self._reject(send, exc)
            return
        release = token.release
        trailers = False

        async def gated_receive() -> Message:
            message = await receive()
            if message["type"] == "http.disconnect":
                release()  # the client is gone; nothing we send will reach it
            return message

        async def gated_send(message: Message) -> None:
            nonlocal trailers
            kind = message["type"]
            if kind == "http.response.start":
                trailers = bool(message.get("trailers", False))
            try:
                await send(message)
            except BaseException:
                release()  # the server could not deliver it: the client is gone
                raise
            if (
                (kind == "http.response.body" and not trailers and not message.get("more_body"))
                or (kind == "http.response.trailers" and not message.get("more_trailers"))
                or kind == "http.response.pathsend"
            ):
                release()  # the whole response is with the server

        try:
            await self._app(scope, gated_receive, gated_send)
        finally:
            release()  # returned or raised: the last chance, and it always comes

    async def _reject(self, send: Send, busy: Busy) -> None:
        body = json.dumps(
            {
                "error": {
                    "type": "busy",
                    "code": "gate_busy",
                    "message": str(busy),
                    "retry_after": self._retry_after,
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
                    (b"retry-after", str(self._retry_after).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body, "more_body": False})
