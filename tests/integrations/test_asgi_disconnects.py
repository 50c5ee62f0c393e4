"""Clients that hang up at each point of a gated request, through a real server (issue 15).

Raw TCP sockets on 127.0.0.1 play the client, so a disconnect happens exactly where the
test puts it: while queued, mid-stream with the body generator awaiting its model, and
mid-stream with the generator stopped at a ``yield`` (a slow client). The invariant checked
everywhere: the app's work for a request (up to and including its generator's ``finally``)
happens while that request holds its slot, and a request whose client left in the queue
never runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio
import pytest

import anygate
from anygate.asgi import GateMiddleware
from tests.integrations.fakeprovider import serve
from tests.integrations.test_asgi import _lifespan, _servers

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from anyio.abc import SocketStream

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from starlette.applications import Starlette
from starlette.responses import StreamingResponse
from starlette.routing import Route

import anygate.starlette

pytestmark = pytest.mark.anyio
on_servers = pytest.mark.parametrize(("anyio_backend", "server"), _servers())


class Work:
    """What the streaming route did, and the gate's state at its clean-up."""

    def __init__(self, gate: anygate.Gate) -> None:
        self.gate = gate
        self.proceed = anyio.Event()
        self.started = 0
        self.in_flight_at_cleanup: list[int] = []
        self.cleaned_up = anyio.Event()


def _app(work: Work, response_class: type[StreamingResponse] = StreamingResponse) -> Starlette:
    async def stream(request: Any) -> StreamingResponse:
        work.started += 1

        async def body() -> AsyncIterator[bytes]:
            try:
                yield b"first\n"
                await work.proceed.wait()  # the model is still generating
                yield b"second\n"
                yield b"third\n"
            finally:
                work.in_flight_at_cleanup.append(work.gate.in_flight)
                work.cleaned_up.set()

        return response_class(body(), media_type="text/plain")

    return Starlette(routes=[Route("/v1/chat", stream)])


def _stalling_send(app: Any, stalled: anyio.Event) -> Any:
    """Between the middleware and the app: the second body chunk never gets out (a client
    that stopped reading, so the server's flow control holds ``send``), until cancelled."""

    async def wrapper(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        chunks = 0

        async def slow_send(message: Any) -> None:
            nonlocal chunks
            if message["type"] == "http.response.body" and message.get("body"):
                chunks += 1
                if chunks == 2:
                    stalled.set()
                    await anyio.sleep_forever()
            await send(message)

        await app(scope, receive, slow_send)

    return wrapper


async def _connect(url: str, path: str) -> SocketStream:
    """Open a raw connection and send a GET for ``path``."""
    port = int(url.rsplit(":", 1)[1])
    stream = await anyio.connect_tcp("127.0.0.1", port)
    await stream.send(f"GET {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode())
    return stream


async def _read_until(stream: SocketStream, marker: bytes) -> bytes:
    data = b""
    with anyio.fail_after(10):
        while marker not in data:
            data += await stream.receive()
    return data


async def _until(predicate: Callable[[], bool]) -> None:
    """Poll a gate counter, bounded. The gate has no event for "a waiter queued or left",
    and the server runs in this loop, so a short poll is the only way to observe it."""
    with anyio.fail_after(10):
        while not predicate():
            await anyio.sleep(0.001)


@on_servers
async def test_client_leaving_the_queue_is_never_run(server: str) -> None:
    """A client that hangs up while queued leaves the queue at once, and its handler never
    runs when the slot frees up (before issue 15 it stayed queued and ran for nobody)."""
    gate = anygate.Gate(1, name="chat")
    work = Work(gate)
    app = GateMiddleware(_app(work), gate=gate, timeout=None)
    async with serve(app, server=server) as url:
        first = await _connect(url, "/v1/chat")
        await _read_until(first, b"first")
        second = await _connect(url, "/v1/chat")
        await _until(lambda: gate.waiting == 1)
        await second.aclose()  # hangs up in the queue
        await _until(lambda: gate.waiting == 0)
        work.proceed.set()
        assert b"third" in await _read_until(first, b"third")
        await first.aclose()
        await _until(lambda: gate.in_flight == 0)
    stats = gate.statistics()
    assert (work.started, stats.admitted, stats.cancelled) == (1, 1, 1)


@on_servers
async def test_queued_request_body_reaches_the_app(server: str) -> None:
    """Watching a queued client reads its body; the app still gets every byte, in order."""
    gate = anygate.Gate(1, name="chat")
    held = await gate.acquire()
    received: list[bytes] = []

    async def echo(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        received.append(body)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})

    payload = b"x" * 200_000
    async with serve(GateMiddleware(echo, gate=gate, timeout=None), server=server) as url:
        port = int(url.rsplit(":", 1)[1])
        client = await anyio.connect_tcp("127.0.0.1", port)
        head = f"POST /v1/chat HTTP/1.1\r\nHost: t\r\nContent-Length: {len(payload)}\r\n\r\n"
        await client.send(head.encode() + payload)
        await _until(lambda: gate.waiting == 1)
        held.release()
        await _until(lambda: received != [])
        await client.aclose()
    assert received == [payload]


@on_servers
async def test_disconnect_mid_stream_cleans_up_with_the_slot_held(server: str) -> None:
    """The client hangs up while the generator awaits its model: Starlette cancels it, and
    its ``finally`` runs while the request still holds the slot (before issue 15 the slot
    was released on ``http.disconnect``, first, so the clean-up ran with the slot gone)."""
    gate = anygate.Gate(1, name="chat")
    work = Work(gate)
    async with serve(GateMiddleware(_app(work), gate=gate), server=server) as url:
        client = await _connect(url, "/v1/chat")
        await _read_until(client, b"first")
        await client.aclose()
        with anyio.fail_after(10):
            await work.cleaned_up.wait()
        await _until(lambda: gate.in_flight == 0)
    assert work.in_flight_at_cleanup == [1]


@on_servers
async def test_generator_stopped_at_a_yield_is_closed_with_the_slot_held(server: str) -> None:
    """A slow client hangs up while ``send`` is stuck: Starlette leaves the generator at its
    ``yield`` for the garbage collector; anygate's ``StreamingResponse`` closes it before
    the app returns, so its ``finally`` still runs under the slot."""
    gate = anygate.Gate(1, name="chat")
    work = Work(gate)
    work.proceed.set()  # the model answers at once; the client is what is slow
    stalled = anyio.Event()
    inner = _stalling_send(_app(work, anygate.starlette.StreamingResponse), stalled)
    async with serve(GateMiddleware(inner, gate=gate), server=server) as url:
        client = await _connect(url, "/v1/chat")
        await _read_until(client, b"first")
        with anyio.fail_after(10):
            await stalled.wait()
        await client.aclose()
        with anyio.fail_after(10):
            await work.cleaned_up.wait()
        await _until(lambda: gate.in_flight == 0)
    assert work.in_flight_at_cleanup == [1]
