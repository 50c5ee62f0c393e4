"""Clients that arrive together and hang up while queued are noticed (issue 26, item 4).

Before the fix, ``GateMiddleware`` and ``RouteGate`` watched a request for its client
leaving only when the gate looked busy at arrival. The checkpointing acquire yields before
it admits, so a burst arriving in one tick all saw a free gate, none was watched, and the
queued ones ran for clients long gone. Now whatever is not admitted synchronously is
watched from before it waits. Checked in process on every backend (tasks ordered by
``wait_all_tasks_blocked``), and through uvicorn with raw sockets that have sent their
requests before the server starts. On asyncio's own loop uvicorn then reads them all in one
tick (the defect: 0 of 19 noticed before the fix); under uvloop this test passed before
the fix too (its requests did not all meet a free gate), so there it checks the fix only.
"""

from __future__ import annotations

import contextlib
import socket
from typing import TYPE_CHECKING, Any

import anyio
import pytest

import anygate
from anygate.asgi import GateMiddleware
from tests.conftest import _BACKENDS
from tests.integrations.test_asgi_disconnects import _until

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from anyio.abc import SocketStream
    from starlette.requests import Request

pytest.importorskip("starlette")
fastapi = pytest.importorskip("fastapi")

from starlette.applications import Starlette  # noqa: E402 - after the importorskip
from starlette.responses import PlainTextResponse, Response  # noqa: E402
from starlette.routing import Route  # noqa: E402

from anygate.starlette import RouteGate  # noqa: E402

pytestmark = pytest.mark.anyio

CLIENTS = 5


class Work:
    """The app's side: how many requests it started, and the event that lets them finish."""

    def __init__(self) -> None:
        self.started = 0
        self.bodies: list[bytes] = []
        self.proceed = anyio.Event()

    async def raw_app(self, scope: Any, receive: Any, send: Any) -> None:
        """A raw ASGI app that reads the whole body, then waits for ``proceed``."""
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        self.started += 1
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.bodies.append(body)
        await self.proceed.wait()  # the model is generating
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    def starlette_app(self, route_gate: RouteGate) -> Starlette:
        """A Starlette app whose only route is gated by ``route_gate.route``."""

        @route_gate.route
        async def chat(request: Request) -> Response:
            self.started += 1
            await self.proceed.wait()
            return PlainTextResponse("ok")

        return Starlette(routes=[Route("/v1/chat", chat, methods=["GET", "POST"])])

    def fastapi_app(self, route_gate: RouteGate) -> Any:
        """A FastAPI app whose only route depends on ``route_gate``."""
        app = fastapi.FastAPI()

        @app.get("/v1/chat", dependencies=[fastapi.Depends(route_gate)])
        async def chat() -> dict[str, str]:
            self.started += 1
            await self.proceed.wait()
            return {"status": "ok"}

        return app


async def _lifespan(receive: Any, send: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


class Client:
    """An in-process client: sends its body, then hangs up when ``hang_up`` is set."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = list(chunks)
        self.hang_up = anyio.Event()
        self.sent: list[Any] = []

    async def receive(self) -> dict[str, Any]:
        if self.chunks:
            body = self.chunks.pop(0)
            return {"type": "http.request", "body": body, "more_body": bool(self.chunks)}
        await self.hang_up.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Any) -> None:
        self.sent.append(message)


def _scope(method: str = "GET") -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": "/v1/chat",
        "raw_path": b"/v1/chat",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"test")],
        "client": ("127.0.0.1", 1234),
        "server": ("127.0.0.1", 80),
    }


def _middleware(work: Work, gate: anygate.Gate, timeout: float | None) -> Any:
    return GateMiddleware(work.raw_app, gate=gate, timeout=timeout)


def _route_gate(work: Work, gate: anygate.Gate, timeout: float | None) -> Any:
    return work.starlette_app(RouteGate(gate, timeout=timeout))


in_process_apps = pytest.mark.parametrize(
    "make_app",
    [pytest.param(_middleware, id="middleware"), pytest.param(_route_gate, id="routegate")],
)


@in_process_apps
@pytest.mark.parametrize("wait_s", [None, 30.0])
async def test_simultaneous_arrivals_that_hang_up_in_the_queue_never_run(
    make_app: Callable[[Work, anygate.Gate, float | None], Any], wait_s: float | None
) -> None:
    """Five requests arrive in one tick at a gate of one; all five clients hang up while
    one runs and four wait: the four leave the queue at once and never run (before the fix
    none was watched: they stayed queued and, with ``timeout=None``, all ran for nobody)."""
    gate = anygate.Gate(1, name="chat")
    work = Work()
    app = make_app(work, gate, wait_s)
    clients = [Client([b""]) for _ in range(CLIENTS)]
    async with anyio.create_task_group() as tg:
        for client in clients:
            tg.start_soon(app, _scope(), client.receive, client.send)
        await anyio.wait_all_tasks_blocked()
        assert (gate.in_flight, gate.waiting, work.started) == (1, CLIENTS - 1, 1)
        for client in clients:
            client.hang_up.set()
        await anyio.wait_all_tasks_blocked()
        assert gate.waiting == 0
        work.proceed.set()
    stats = gate.statistics()
    assert (work.started, stats.admitted, stats.cancelled, stats.timed_out) == (1, 1, 4, 0)
    assert stats.in_flight == 0


async def test_watched_bodies_reach_the_app_whole_and_in_order() -> None:
    """Requests arriving together each send their body in three chunks; the queued ones are
    watched (their chunks read and buffered meanwhile), and the app still gets every
    request's body whole, each from its own client, in order."""
    gate = anygate.Gate(1, name="chat")
    work = Work()
    work.proceed.set()
    app = GateMiddleware(work.raw_app, gate=gate, timeout=None)
    payloads = [[f"{i}a".encode(), f"{i}b".encode(), f"{i}c".encode()] for i in range(3)]
    clients = [Client(chunks) for chunks in payloads]
    async with anyio.create_task_group() as tg:
        for client in clients:
            tg.start_soon(app, _scope("POST"), client.receive, client.send)
    assert sorted(work.bodies) == [b"".join(chunks) for chunks in payloads]
    assert all(client.chunks == [] for client in clients)
    assert all(
        client.sent[-1] == {"type": "http.response.body", "body": b"ok"} for client in clients
    )
    assert gate.statistics().admitted == 3


async def test_uncontended_request_is_admitted_without_reading_the_client() -> None:
    """A request admitted at once is not watched: nothing reads its ``receive`` before the
    app does, and no body is buffered for it."""
    gate = anygate.Gate(2, name="chat")
    work = Work()
    work.proceed.set()
    client = Client([b"one", b"two"])
    await GateMiddleware(work.raw_app, gate=gate, timeout=None)(
        _scope("POST"), client.receive, client.send
    )
    assert work.bodies == [b"onetwo"]
    assert (gate.statistics().admitted, gate.statistics().rejected) == (1, 0)


# --- through uvicorn: raw sockets whose requests the server reads in one tick ---------------


_ASYNCIO_BACKENDS = [
    b
    for b in _BACKENDS
    if (b.values[0] if isinstance(b.values[0], str) else b.values[0][0]) == "asyncio"
]
on_uvicorn = pytest.mark.parametrize("anyio_backend", _ASYNCIO_BACKENDS)
SOCKET_CLIENTS = 20


@contextlib.asynccontextmanager
async def _uvicorn_after_requests(app: Any, clients: int) -> AsyncIterator[list[SocketStream]]:
    """Connect ``clients`` raw sockets and send each a GET, *then* start uvicorn on the
    listening socket: the kernel holds the connections and their bytes until uvicorn
    accepts, so it reads every request in the same tick (the burst of issue 26)."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    streams: list[SocketStream] = []
    server = uvicorn.Server(
        uvicorn.Config(app, lifespan="on", log_level="warning", access_log=False)
    )
    stopped = anyio.Event()

    async def run() -> None:
        try:
            await server.serve(sockets=[sock])
        finally:
            sock.close()
            stopped.set()

    try:
        for _ in range(clients):
            stream = await anyio.connect_tcp("127.0.0.1", port)
            streams.append(stream)
            await stream.send(b"GET /v1/chat HTTP/1.1\r\nHost: test\r\n\r\n")
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            try:
                yield streams
            finally:
                server.should_exit = True
                with anyio.CancelScope(shield=True), anyio.move_on_after(15):
                    await stopped.wait()
    finally:
        sock.close()
        for stream in streams:
            await stream.aclose()


def _fastapi_route_gate(work: Work, gate: anygate.Gate) -> Any:
    return work.fastapi_app(RouteGate(gate, timeout=None))


@on_uvicorn
@pytest.mark.parametrize(
    "make_app",
    [
        pytest.param(lambda work, gate: GateMiddleware(work.raw_app, gate=gate), id="middleware"),
        pytest.param(_fastapi_route_gate, id="fastapi-routegate"),
    ],
)
async def test_uvicorn_burst_of_clients_hanging_up_in_the_queue(
    make_app: Callable[[Work, anygate.Gate], Any],
) -> None:
    """Twenty raw-socket clients whose requests uvicorn reads in one tick, at a gate of one;
    all hang up while one runs and nineteen wait: the nineteen leave the queue and never
    run (before the fix, on asyncio's loop, none was watched and none left: 0 of 19)."""
    gate = anygate.Gate(1, name="chat")
    work = Work()
    async with _uvicorn_after_requests(make_app(work, gate), SOCKET_CLIENTS) as streams:
        await _until(lambda: work.started == 1 and gate.waiting == SOCKET_CLIENTS - 1)
        for stream in streams:
            await stream.aclose()
        await _until(lambda: gate.waiting == 0)
        work.proceed.set()
        await _until(lambda: gate.in_flight == 0)
    stats = gate.statistics()
    assert (work.started, stats.admitted, stats.cancelled) == (1, 1, SOCKET_CLIENTS - 1)


async def test_routegate_client_gone_while_its_body_is_read_before_queueing() -> None:
    """At a full gate, ``RouteGate`` reads the body before it queues; a client already gone
    by then gets the queued leaver's 499 and the endpoint never runs (before, Starlette's
    ``ClientDisconnect`` escaped the gate as a server error)."""
    gate = anygate.Gate(1, name="chat")
    held = await gate.acquire()
    work = Work()
    client = Client([])
    client.hang_up.set()
    await work.starlette_app(RouteGate(gate, timeout=None))(
        _scope("POST"), client.receive, client.send
    )
    held.release()
    assert client.sent[0]["status"] == 499
    assert (work.started, gate.statistics().admitted, gate.in_flight) == (0, 1, 0)
