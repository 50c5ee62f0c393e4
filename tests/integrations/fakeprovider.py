"""A fake LLM provider for integration tests: a raw ASGI app served by hypercorn on 127.0.0.1.

It speaks enough of the OpenAI chat-completions and Anthropic messages APIs for the real SDKs
to parse its answers, streamed (SSE) and not, and can be told to fail the way real providers
do. It runs in the test's own event loop (hypercorn has asyncio and trio workers), so the
tests can hold a stream open with an in-process event instead of sleeping.

How a request is answered, first match wins:

1. the ``x-fake`` request header (SDK calls pass it with ``extra_headers``);
2. the next entry of :meth:`FakeProvider.script`;
3. ``"ok"``.

Behaviours: ``ok``; ``burst`` (429 ``limit_burst_rate``); ``retry_after`` (429 with
``Retry-After: 0``); ``retry_after_ms`` (429 with ``retry-after-ms: 1``);
``retry_after_long`` (429 with ``Retry-After: 60``); ``tpm_words`` (429 in OpenAI's words:
"on tokens per min (TPM): Limit 30000, Used 29937, Requested 385", ``retry-after-ms: 1``);
``itpm_words`` (429 in Anthropic's: "of 30,000 input tokens per minute"); ``overloaded``
(503); ``queue_full`` (503, Ollama's "maximum pending requests exceeded"); ``quota`` (429 ``insufficient_quota``); ``unauthorized`` (401); ``hang_headers``
(answers only after :meth:`FakeProvider.unhang`); ``hang_stream`` (sends the headers and the
first chunk of the body, then waits for :meth:`FakeProvider.unhang`). A client that goes away ends any of them.
A request with an ``x-fake-wait: <key>`` header waits for :meth:`FakeProvider.release` of
that key before it is answered at all.

Rate-limit headers (:meth:`FakeProvider.limits`): every response, errors included, then
reports a request and a token limit the way the provider family does (OpenAI's
``x-ratelimit-*`` with Go-duration resets on OpenAI paths, Anthropic's
``anthropic-ratelimit-*`` with RFC 3339 resets on ``/messages``), remaining counting down
by one request and :data:`USAGE_TOKENS` tokens per request. Answers report usage as the
real APIs do: OpenAI streams only with ``stream_options.include_usage``.

This is not a model of a provider's timing; :mod:`anygate.sim` is.
"""

from __future__ import annotations

import json
import socket
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from datetime import datetime, timedelta, timezone
from typing import Any

import anyio

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

CHUNKS = ("Hel", "lo", " wor", "ld")
#: Tokens every answer reports in its usage (1 in, 4 out).
USAGE_TOKENS = 5

# status, extra headers, OpenAI-style body; Anthropic requests get the same in their shape.
_ERRORS: dict[str, tuple[int, list[tuple[bytes, bytes]], dict[str, Any]]] = {
    "burst": (
        429,
        [],
        {
            "message": "Request rate increased too quickly. To ensure system stability, "
            "please adjust your client logic to scale requests more smoothly over time.",
            "type": "limit_burst_rate",
            "code": "limit_burst_rate",
        },
    ),
    "retry_after": (
        429,
        [(b"retry-after", b"0")],
        {"message": "Rate limit reached", "type": "rate_limit_error", "code": "rate_limit"},
    ),
    "retry_after_ms": (
        429,
        [(b"retry-after-ms", b"1")],
        {"message": "Rate limit reached", "type": "rate_limit_error", "code": "rate_limit"},
    ),
    "retry_after_long": (
        429,
        [(b"retry-after", b"60")],
        {"message": "Rate limit reached", "type": "rate_limit_error", "code": "rate_limit"},
    ),
    "tpm_words": (
        429,
        [(b"retry-after-ms", b"1")],
        {
            "message": "Rate limit reached for m in organization org-test on tokens per min "
            "(TPM): Limit 30000, Used 29937, Requested 385. Please try again in 1ms. Visit "
            "https://platform.openai.com/account/rate-limits to learn more.",
            "type": "tokens",
            "code": "rate_limit_exceeded",
        },
    ),
    "itpm_words": (
        429,
        [(b"retry-after-ms", b"1")],
        {
            "message": "This request would exceed the rate limit for your organization "
            "(org-test) of 30,000 input tokens per minute. For details, refer to: "
            "https://docs.claude.com/en/api/rate-limits.",
            "type": "rate_limit_error",
            "code": "rate_limit_error",
        },
    ),
    "overloaded": (
        503,
        [],
        {"message": "Overloaded", "type": "overloaded_error", "code": "overloaded"},
    ),
    "queue_full": (
        503,
        [],
        {
            "message": "server busy, please try again.  maximum pending requests exceeded",
            "type": "api_error",
            "code": None,
        },
    ),
    "quota": (
        429,
        [],
        {
            "message": "You exceeded your current quota, please check your plan and billing details.",
            "type": "insufficient_quota",
            "code": "insufficient_quota",
        },
    ),
    "unauthorized": (
        401,
        [],
        {
            "message": "Incorrect API key provided",
            "type": "authentication_error",
            "code": "invalid_api_key",
        },
    ),
}
BEHAVIOURS = frozenset({"ok", "hang_headers", "hang_stream", *_ERRORS})
#: The error behaviours: status, extra headers, OpenAI-style error document.
ERRORS = _ERRORS


class FakeProvider:
    """The ASGI app plus what it observed; one instance per test.

    Attributes:
        requests: requests answered or in progress so far.
        active: requests in progress now (counted until the last byte is handed to the server,
            or the client disconnects).
        max_active: the most requests ever in progress at once.
        seen: the behaviour chosen for each request, in arrival order.
        retry_counts: the ``x-stainless-retry-count`` header of each request (SDK retries).
    """

    def __init__(self) -> None:
        self.requests = 0
        self.active = 0
        self.max_active = 0
        self.seen: list[str] = []
        self.retry_counts: list[str | None] = []
        self._script: deque[str] = deque()
        self._changed = anyio.Event()
        self._unhang = anyio.Event()
        self._holding = False
        self._waits: dict[str, anyio.Event] = {}
        self._limits: tuple[int, int, float] | None = None

    # ------------------------------------------------------------------ test controls

    def limits(self, *, requests: int, tokens: int, reset_s: float = 1.0) -> None:
        """Report these per-minute limits on every response from now on (see the module doc).

        Remaining counts down from the limit by one request (and :data:`USAGE_TOKENS`
        tokens) per request answered so far, floored at 0; the reset is ``reset_s``.
        """
        self._limits = (requests, tokens, reset_s)

    def _limit_headers(self, anthropic: bool) -> list[tuple[bytes, bytes]]:
        if self._limits is None:
            return []
        requests, tokens, reset_s = self._limits
        left = {
            "requests": (requests, max(0, requests - self.requests)),
            "tokens": (tokens, max(0, tokens - USAGE_TOKENS * self.requests)),
        }
        out: list[tuple[bytes, bytes]] = []
        if anthropic:
            reset = (datetime.now(timezone.utc) + timedelta(seconds=reset_s)).isoformat()
            for kind, (limit, remaining) in left.items():
                prefix = f"anthropic-ratelimit-{kind}-"
                out += [
                    (f"{prefix}limit".encode(), str(limit).encode()),
                    (f"{prefix}remaining".encode(), str(remaining).encode()),
                    (f"{prefix}reset".encode(), reset.replace("+00:00", "Z").encode()),
                ]
        else:
            for kind, (limit, remaining) in left.items():
                out += [
                    (f"x-ratelimit-limit-{kind}".encode(), str(limit).encode()),
                    (f"x-ratelimit-remaining-{kind}".encode(), str(remaining).encode()),
                    (f"x-ratelimit-reset-{kind}".encode(), f"{reset_s:g}s".encode()),
                ]
        return out

    def script(self, *behaviours: str) -> None:
        """Answer the next requests with these behaviours, in order (then ``ok`` again)."""
        unknown = set(behaviours) - BEHAVIOURS
        if unknown:
            msg = f"unknown behaviours {sorted(unknown)}; known: {sorted(BEHAVIOURS)}"
            raise ValueError(msg)
        self._script.extend(behaviours)

    def hold(self) -> None:
        """Hold every successful response mid-body (after its first chunk) until :meth:`unhang`.

        Held requests stay counted in :attr:`active`, so a burst piles up at the server as
        far as the client lets it, and any excess over a gate's capacity would show.
        """
        self._holding = True

    def release(self, key: str) -> None:
        """Let requests carrying ``x-fake-wait: <key>`` answer (now and from now on)."""
        self._wait_event(key).set()

    def _wait_event(self, key: str) -> anyio.Event:
        if key not in self._waits:
            self._waits[key] = anyio.Event()
        return self._waits[key]

    def unhang(self) -> None:
        """Let every hung request (and every later one) finish."""
        self._unhang.set()

    async def wait_until(self, predicate: Callable[[FakeProvider], bool]) -> None:
        """Wait until ``predicate(self)`` holds; re-checked whenever a counter changes."""
        while not predicate(self):
            await self._changed.wait()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    # ------------------------------------------------------------------ ASGI

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        body = await _read_body(receive)
        payload = json.loads(body) if body else {}
        headers = dict(scope["headers"])
        behaviour = headers.get(b"x-fake", b"").decode() or (
            self._script.popleft() if self._script else "ok"
        )
        self.requests += 1
        self.seen.append(behaviour)
        retry = headers.get(b"x-stainless-retry-count")
        self.retry_counts.append(retry.decode() if retry is not None else None)
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        self._notify()
        counted = [True]

        def count_out() -> None:
            if counted[0]:
                counted[0] = False
                self.active -= 1
                self._notify()

        try:
            async with anyio.create_task_group() as tg:
                # A disconnect ends the request early, as it would on a real server.
                tg.start_soon(_cancel_on_disconnect, receive, tg.cancel_scope)
                wait = headers.get(b"x-fake-wait")
                if wait is not None:
                    await self._wait_event(wait.decode()).wait()
                await self._answer(scope["path"], payload, behaviour, _Sender(send, count_out))
                tg.cancel_scope.cancel()
        finally:
            count_out()

    async def _answer(
        self, path: str, payload: dict[str, Any], behaviour: str, send: _Sender
    ) -> None:
        anthropic = path.endswith("/messages")
        limits = self._limit_headers(anthropic)
        if behaviour == "hang_headers":
            await self._unhang.wait()
        if behaviour in _ERRORS:
            status, extra, error = _ERRORS[behaviour]
            extra = [*extra, *limits]
            if anthropic:
                doc: dict[str, Any] = {
                    "type": "error",
                    "error": {"type": error["type"], "message": error["message"]},
                }
            else:
                doc = {"error": error}
            await self._respond(send, status, "application/json", [json.dumps(doc).encode()], extra)
            return
        if payload.get("stream"):
            content_type, chunks = (
                "text/event-stream",
                (_anthropic_events(payload) if anthropic else _openai_events(payload)),
            )
        else:
            doc = _anthropic_message(payload) if anthropic else _openai_completion(payload)
            body = json.dumps(doc).encode()
            content_type, chunks = "application/json", [body[:20], body[20:]]
        await send(_start(200, content_type, limits))
        await send({"type": "http.response.body", "body": chunks[0], "more_body": True})
        # Held responses stop mid-body: a client that gave its slot back once the headers
        # arrived, rather than when the body was done, would show up as excess concurrency.
        if self._holding or behaviour == "hang_stream":
            await self._unhang.wait()
        await self._finish(send, chunks[1:])

    async def _respond(
        self,
        send: _Sender,
        status: int,
        content_type: str,
        chunks: list[bytes],
        extra: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        await send(_start(status, content_type, extra))
        await self._finish(send, chunks)

    async def _finish(self, send: _Sender, chunks: list[bytes]) -> None:
        for chunk in chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        # Count the request out *before* the last byte leaves: once the client has the whole
        # response it may start the next request, which must not meet this one still counted.
        send.count_out()
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class _Sender:
    """The ASGI ``send`` of one request, plus how to count that request out (once)."""

    def __init__(self, send: Send, count_out: Callable[[], None]) -> None:
        self._send = send
        self.count_out = count_out

    async def __call__(self, message: Message) -> None:
        await self._send(message)


# ---------------------------------------------------------------------- ASGI helpers


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _read_body(receive: Receive) -> bytes:
    body = b""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return body
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


async def _cancel_on_disconnect(receive: Receive, scope: anyio.CancelScope) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()


def _start(
    status: int, content_type: str, extra: list[tuple[bytes, bytes]] | None = None
) -> Message:
    headers = [(b"content-type", content_type.encode()), *(extra or [])]
    return {"type": "http.response.start", "status": status, "headers": headers}


def _sse(data: dict[str, Any] | str, event: str | None = None) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {text}\n\n".encode()


def _openai_completion(payload: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 0,
        "model": payload.get("model", "fake"),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "".join(CHUNKS)},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 4, "total_tokens": 5},
    }


def _openai_events(payload: dict[str, Any]) -> list[bytes]:
    model = payload.get("model", "fake")

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return _sse(
            {
                "id": "chatcmpl-fake",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
        )

    usage = []
    options = payload.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage"):
        # The final chunk of the real API: no choices, the whole call's usage.
        usage = [
            _sse(
                {
                    "id": "chatcmpl-fake",
                    "object": "chat.completion.chunk",
                    "created": 0,
                    "model": model,
                    "choices": [],
                    "usage": _openai_completion(payload)["usage"],
                }
            )
        ]
    return [
        chunk({"role": "assistant", "content": ""}),
        *(chunk({"content": text}) for text in CHUNKS),
        chunk({}, "stop"),
        *usage,
        _sse("[DONE]"),
    ]


def _anthropic_message(payload: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": payload.get("model", "fake"),
        "content": [{"type": "text", "text": "".join(CHUNKS)}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": 4},
    }


def _anthropic_events(payload: dict[str, Any]) -> list[bytes]:
    start = _anthropic_message(payload) | {"content": [], "stop_reason": None}
    return [
        _sse({"type": "message_start", "message": start}, "message_start"),
        _sse(
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
            "content_block_start",
        ),
        *(
            _sse(
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": text},
                },
                "content_block_delta",
            )
            for text in CHUNKS
        ),
        _sse({"type": "content_block_stop", "index": 0}, "content_block_stop"),
        _sse(
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": 4},
            },
            "message_delta",
        ),
        _sse({"type": "message_stop"}, "message_stop"),
    ]


# ---------------------------------------------------------------------- serving


@asynccontextmanager
async def serve(app: ASGIApp, *, server: str = "hypercorn") -> AsyncIterator[str]:
    """Serve ``app`` on 127.0.0.1 (a free port) in this event loop; yields the base URL.

    ``server`` is ``"hypercorn"`` (asyncio and trio) or ``"uvicorn"`` (asyncio only). The
    listening socket is bound and listening before the server starts, so clients may
    connect at once (the kernel queues them until the first accept).

    Tests that run a server do not use ``anyio.wait_all_tasks_blocked``: uvicorn's 0.1 s
    housekeeping tick can phase-lock with anyio's 0.1 s polling on asyncio, and on Python
    3.10 hypercorn's ``taskgroup`` backport parks tasks on objects anyio cannot inspect.
    They wait on events instead.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    stopped = anyio.Event()
    if server == "uvicorn":
        import uvicorn

        userver = uvicorn.Server(
            uvicorn.Config(app, lifespan="on", log_level="warning", access_log=False)
        )

        async def run() -> None:
            try:
                await userver.serve(sockets=[sock])
            finally:
                sock.close()
                stopped.set()

        def stop() -> None:
            userver.should_exit = True

    else:
        from hypercorn.config import Config

        config = Config()
        config.bind = [f"fd://{sock.detach()}"]  # hypercorn owns the descriptor from here on
        config.accesslog = None
        config.errorlog = None
        # An upper bound, not a sleep: shutdown returns as soon as the connections are closed.
        config.graceful_timeout = 10
        shutdown = anyio.Event()
        if _running_trio():
            from hypercorn.trio import serve as hypercorn_serve
        else:
            from hypercorn.asyncio import serve as hypercorn_serve  # type: ignore[assignment]

        async def run() -> None:
            try:
                await hypercorn_serve(app, config, shutdown_trigger=shutdown.wait)  # type: ignore[arg-type]
            finally:
                stopped.set()

        stop = shutdown.set

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            # Shut down gracefully even when the test failed: a server cancelled while
            # closing its connections logs confusing errors on top of the real failure.
            stop()
            with anyio.CancelScope(shield=True), anyio.move_on_after(15):
                await stopped.wait()


def _running_trio() -> bool:
    try:
        import trio
    except ImportError:
        return False
    try:
        trio.lowlevel.current_task()
    except RuntimeError:
        return False
    return True
