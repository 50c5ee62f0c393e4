"""anygate.starlette.RouteGate on FastAPI and Starlette routes, through a real server.

A dependency (FastAPI) or endpoint decorator (Starlette) holding a slot per request: 429 +
``Retry-After`` when busy, other routes untouched, a queued client that hangs up never runs
the endpoint, and a streaming route keeps its slot until its generator has been closed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio
import pytest

import anygate
from tests.integrations.fakeprovider import serve
from tests.integrations.test_asgi import _servers
from tests.integrations.test_asgi_disconnects import _connect, _read_until, _until

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from starlette.requests import Request

httpx = pytest.importorskip("httpx")
fastapi = pytest.importorskip("fastapi")

from starlette.applications import Starlette  # noqa: E402 - after the importorskip
from starlette.responses import PlainTextResponse, Response  # noqa: E402
from starlette.routing import Route  # noqa: E402

from anygate.starlette import RouteGate, StreamingResponse  # noqa: E402

pytestmark = pytest.mark.anyio
on_servers = pytest.mark.parametrize(("anyio_backend", "server"), _servers())


class Work:
    def __init__(self, gate: anygate.Gate) -> None:
        self.gate = gate
        self.proceed = anyio.Event()
        self.started = 0
        self.in_flight_at_cleanup: list[int] = []
        self.cleaned_up = anyio.Event()

    async def body(self) -> AsyncIterator[bytes]:
        try:
            yield b"first\n"
            await self.proceed.wait()
            yield b"second\n"
        finally:
            self.in_flight_at_cleanup.append(self.gate.in_flight)
            self.cleaned_up.set()


def _fastapi(work: Work, route_gate: RouteGate) -> Any:
    app = fastapi.FastAPI()

    @app.get("/v1/chat", dependencies=[fastapi.Depends(route_gate)])
    async def chat() -> StreamingResponse:
        work.started += 1
        return StreamingResponse(work.body(), media_type="text/plain")

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    return app


@on_servers
async def test_fastapi_dependency_answers_429_when_busy(server: str) -> None:
    """A full gate with ``timeout=0``: 429 with ``Retry-After`` from the dependency; the
    ungated route still answers; the streaming request keeps its slot until it ends."""
    gate = anygate.Gate(1, name="chat")
    work = Work(gate)
    app = _fastapi(work, RouteGate(gate, timeout=0, retry_after=2.5))
    async with serve(app, server=server) as url, httpx.AsyncClient(base_url=url) as client:
        async with client.stream("GET", "/v1/chat") as first:
            lines = first.aiter_lines()
            assert await anext(lines) == "first"
            busy = await client.get("/v1/chat")
            assert (await client.get("/health")).json() == {"status": "ok"}
            assert gate.in_flight == 1
            work.proceed.set()
            assert [line async for line in lines] == ["second"]
        await _until(lambda: gate.in_flight == 0)
    assert busy.status_code == 429
    assert busy.headers["retry-after"] == "3"
    assert "'chat' is busy" in busy.json()["detail"]
    assert (work.started, work.in_flight_at_cleanup) == (1, [1])


@on_servers
async def test_fastapi_queued_client_that_leaves_never_runs(server: str) -> None:
    """A client hanging up while its request waits in the dependency leaves the queue; the
    endpoint never runs."""
    gate = anygate.Gate(1, name="chat")
    work = Work(gate)
    app = _fastapi(work, RouteGate(gate, timeout=None))
    async with serve(app, server=server) as url:
        first = await _connect(url, "/v1/chat")
        await _read_until(first, b"first")
        second = await _connect(url, "/v1/chat")
        await _until(lambda: gate.waiting == 1)
        await second.aclose()
        await _until(lambda: gate.waiting == 0)
        work.proceed.set()
        await _read_until(first, b"second")
        await first.aclose()
        await _until(lambda: gate.in_flight == 0)
    assert work.started == 1
    assert gate.statistics().cancelled == 1


@on_servers
async def test_fastapi_disconnect_mid_stream_cleans_up_under_the_slot(server: str) -> None:
    """The client hangs up mid-stream: the generator's ``finally`` runs before the
    dependency gives the slot back."""
    gate = anygate.Gate(1, name="chat")
    work = Work(gate)
    async with serve(_fastapi(work, RouteGate(gate)), server=server) as url:
        client = await _connect(url, "/v1/chat")
        await _read_until(client, b"first")
        await client.aclose()
        with anyio.fail_after(10):
            await work.cleaned_up.wait()
        await _until(lambda: gate.in_flight == 0)
    assert work.in_flight_at_cleanup == [1]


@on_servers
async def test_starlette_decorator_holds_the_slot_through_the_response(server: str) -> None:
    """``@route_gate.route`` on a Starlette endpoint: the slot covers the streamed response,
    a second request meanwhile gets 429, and the slot comes back after the stream."""
    gate = anygate.Gate(1, name="chat")
    work = Work(gate)
    route_gate = RouteGate(gate, timeout=0)

    @route_gate.route
    async def chat(request: Request) -> Response:
        work.started += 1
        return StreamingResponse(work.body(), media_type="text/plain")

    async def health(request: Request) -> Response:
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/v1/chat", chat), Route("/health", health)])
    async with serve(app, server=server) as url, httpx.AsyncClient(base_url=url) as client:
        async with client.stream("GET", "/v1/chat") as first:
            lines = first.aiter_lines()
            assert await anext(lines) == "first"
            busy = await client.get("/v1/chat")
            assert (await client.get("/health")).text == "ok"
            work.proceed.set()
            assert [line async for line in lines] == ["second"]
        await _until(lambda: gate.in_flight == 0)
    assert (busy.status_code, busy.headers["retry-after"]) == (429, "1")
    assert (work.started, work.in_flight_at_cleanup) == (1, [1])


def test_route_gate_arguments_are_checked() -> None:
    """Bad arguments fail at construction, naming the parameter and the value."""
    gate = anygate.Gate(1, name="g")
    with pytest.raises(TypeError, match=r"gate must be an anygate\.Gate \(got 'g'"):
        RouteGate("g")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"timeout must be .*, not NaN \(got nan\)"):
        RouteGate(gate, timeout=float("nan"))
    with pytest.raises(TypeError, match="retry_after must be a number"):
        RouteGate(gate, retry_after="1")  # type: ignore[arg-type]
    route_gate = RouteGate(gate, timeout=3)
    assert route_gate.gate is gate
    assert repr(route_gate) == "<anygate.starlette.RouteGate gate='g' timeout=3.0>"
    assert RouteGate.__module__ == StreamingResponse.__module__ == "anygate.starlette"
