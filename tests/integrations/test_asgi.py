"""GateMiddleware in a real ASGI server (hypercorn; uvicorn on asyncio), driven over HTTP.

The app is a Starlette app (plus one raw ASGI app) behind the middleware, served on
127.0.0.1 in the test's event loop and called with a real httpx client. Whether a slot came
back is checked by taking it: with capacity 1, ``gate.acquire()`` succeeds only once the
request's slot has been returned.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import anyio
import pytest

import anygate
from anygate.asgi import GateMiddleware
from tests.conftest import _BACKENDS
from tests.integrations.fakeprovider import serve

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

httpx = pytest.importorskip("httpx")
starlette = pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from starlette.applications import Starlette  # noqa: E402 - after the importorskip
from starlette.background import BackgroundTask  # noqa: E402
from starlette.responses import PlainTextResponse, StreamingResponse  # noqa: E402
from starlette.routing import Route  # noqa: E402


def _servers() -> list[Any]:
    """Every backend with hypercorn, and the asyncio ones with uvicorn (it has no trio)."""
    combos = []
    for backend in _BACKENDS:
        (value,) = backend.values
        combos.append(pytest.param(value, "hypercorn", id=f"{backend.id}-hypercorn"))
        if (value if isinstance(value, str) else value[0]) == "asyncio":
            combos.append(pytest.param(value, "uvicorn", id=f"{backend.id}-uvicorn"))
    return combos


pytestmark = pytest.mark.anyio
# Replaces the plain backend parametrization: (backend, server) pairs.
on_servers = pytest.mark.parametrize(("anyio_backend", "server"), _servers())


class Controls:
    """What the test app reports, and how the test steers it."""

    def __init__(self) -> None:
        self.proceed = anyio.Event()
        self.entered = 0  # gated requests that reached the middleware
        self.finished = 0  # requests whose whole app call (middleware included) returned
        self.stream_cleaned_up = False
        self.background_done = False
        self._changed = anyio.Event()

    def notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def wait_until(self, predicate: Any) -> None:
        while not predicate(self):
            await self._changed.wait()


def _starlette(controls: Controls) -> Starlette:
    async def stream(request: Any) -> StreamingResponse:
        async def body() -> AsyncIterator[bytes]:
            try:
                yield b"first\n"
                await controls.proceed.wait()
                yield b"second\n"
            finally:
                controls.stream_cleaned_up = True
                controls.notify()

        return StreamingResponse(body(), media_type="text/plain")

    async def boom(request: Any) -> PlainTextResponse:
        msg = "the app failed"
        raise RuntimeError(msg)

    async def after(request: Any) -> PlainTextResponse:
        async def later() -> None:
            await controls.proceed.wait()
            controls.background_done = True

        return PlainTextResponse("sent", background=BackgroundTask(later))

    async def health(request: Any) -> PlainTextResponse:
        return PlainTextResponse("ok")

    return Starlette(
        routes=[
            Route("/v1/chat/stream", stream),
            Route("/v1/chat/boom", boom),
            Route("/v1/chat/after", after),
            Route("/health", health),
        ]
    )


def _outer(app: Any, controls: Controls) -> Any:
    """Count gated requests going in and whole calls coming out (around the middleware)."""

    async def outer(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1/chat"):
            await app(scope, receive, send)
            return
        controls.entered += 1
        controls.notify()
        try:
            await app(scope, receive, send)
        finally:
            controls.finished += 1
            controls.notify()

    return outer


def _stack(controls: Controls, gate: anygate.Gate, inner: Any = None, **kwargs: Any) -> Any:
    app = _starlette(controls) if inner is None else inner
    middleware = GateMiddleware(app, gate=gate, paths=["/v1/chat"], **kwargs)
    return _outer(middleware, controls)


async def _slot_comes_back(gate: anygate.Gate) -> None:
    """Prove the (only) slot is free by taking and returning it; bounded, never a sleep."""
    with anyio.fail_after(10):
        token = await gate.acquire()
    token.release()


@on_servers
async def test_full_gate_answers_429_with_retry_after(server: str) -> None:
    """No slot and ``timeout=0``: 429, ``Retry-After``, a JSON error; other paths unaffected."""
    controls = Controls()
    gate = anygate.Gate(1, name="chat")
    async with serve(_stack(controls, gate, timeout=0, retry_after=2.5), server=server) as url:
        async with httpx.AsyncClient(base_url=url) as client:
            async with client.stream("GET", "/v1/chat/stream") as first:
                lines = first.aiter_lines()
                assert await anext(lines) == "first"
                assert gate.in_flight == 1
                busy = await client.get("/v1/chat/stream")
                assert busy.status_code == 429
                assert busy.headers["retry-after"] == "3"
                error = busy.json()["error"]
                assert (error["type"], error["code"], error["retry_after"]) == (
                    "busy",
                    "gate_busy",
                    3,
                )
                assert "'chat' is busy" in error["message"]
                assert (await client.get("/health")).text == "ok"  # not a gated path
                controls.proceed.set()
                assert [line async for line in lines] == ["second"]
        await _slot_comes_back(gate)
    assert gate.statistics().rejected == 1


@on_servers
async def test_rate_busy_sends_the_gate_estimate_as_retry_after(server: str) -> None:
    """When the rate budget refuses (6 a minute: after one admission the next is about
    10 s away, beyond the 1 s wait), Retry-After is the gate's own estimate rounded up,
    not the configured default of 1, in the header and in the JSON body alike."""
    controls = Controls()
    controls.proceed.set()  # the first request's background task ends at once
    gate = anygate.Gate(8, name="chat", rate=anygate.Rate(requests_per_minute=6))
    async with serve(_stack(controls, gate, timeout=1, retry_after=1), server=server) as url:
        async with httpx.AsyncClient(base_url=url) as client:
            assert (await client.get("/v1/chat/after")).text == "sent"
            busy = await client.get("/v1/chat/after")
    assert busy.status_code == 429
    seconds = int(busy.headers["retry-after"])
    assert 5 <= seconds <= 10
    assert busy.json()["error"]["retry_after"] == seconds
    assert gate.in_flight == 0


@on_servers
async def test_queued_request_gets_the_slot_in_turn(server: str) -> None:
    """With a timeout, a second request waits in the gate's queue and runs when the first ends."""
    controls = Controls()
    gate = anygate.Gate(1, name="chat")
    async with serve(_stack(controls, gate, timeout=None), server=server) as url:
        async with httpx.AsyncClient(base_url=url) as client:
            replies: list[int] = []

            async def second() -> None:
                replies.append((await client.get("/v1/chat/after")).status_code)

            async with client.stream("GET", "/v1/chat/stream") as first:
                lines = first.aiter_lines()
                assert await anext(lines) == "first"
                async with anyio.create_task_group() as tg:
                    tg.start_soon(second)
                    await controls.wait_until(lambda c: c.entered == 2)
                    assert (gate.in_flight, gate.waiting) == (1, 1)
                    controls.proceed.set()
                assert [line async for line in lines] == ["second"]
            assert replies == [200]
        await controls.wait_until(lambda c: c.finished == 2)
    assert gate.in_flight == 0
    assert gate.statistics().admitted == 2


@on_servers
async def test_slot_returns_when_the_response_is_sent_not_when_the_app_ends(server: str) -> None:
    """Background work after the response runs without the slot."""
    controls = Controls()
    gate = anygate.Gate(1, name="chat")
    async with serve(_stack(controls, gate), server=server) as url:
        async with httpx.AsyncClient(base_url=url) as client:
            assert (await client.get("/v1/chat/after")).text == "sent"
            await _slot_comes_back(gate)
            assert controls.finished == 0  # the app is still in its background task
            assert not controls.background_done
            controls.proceed.set()
            await controls.wait_until(lambda c: c.finished == 1)
    assert controls.background_done
    assert gate.in_flight == 0


@on_servers
async def test_client_disconnect_mid_stream_returns_the_slot(server: str) -> None:
    """A client that hangs up mid-stream frees the slot; the app's stream is cleaned up."""
    controls = Controls()
    gate = anygate.Gate(1, name="chat")
    async with serve(_stack(controls, gate), server=server) as url:
        async with httpx.AsyncClient(base_url=url) as client:
            async with client.stream("GET", "/v1/chat/stream") as response:
                lines = response.aiter_lines()
                assert await anext(lines) == "first"
            # Leaving the block half-read closed the connection.
            await _slot_comes_back(gate)
            await controls.wait_until(lambda c: c.finished == 1)
    assert controls.stream_cleaned_up
    assert gate.in_flight == 0
    assert gate.statistics().admitted == 2  # the request, and our probe


@on_servers
async def test_app_that_raises_returns_the_slot(server: str) -> None:
    """An exception in the app still frees the slot (the server answers 500)."""
    controls = Controls()
    gate = anygate.Gate(1, name="chat")
    async with serve(_stack(controls, gate), server=server) as url:
        async with httpx.AsyncClient(base_url=url) as client:
            assert (await client.get("/v1/chat/boom")).status_code == 500
            await _slot_comes_back(gate)
            assert (await client.get("/v1/chat/after")).status_code == 200
            controls.proceed.set()
            await controls.wait_until(lambda c: c.finished == 2)
    assert gate.in_flight == 0


@on_servers
async def test_disconnect_keeps_the_slot_until_the_app_ends(server: str) -> None:
    """A client that hangs up does not free the slot while the app still works for it:
    the slot bounds the app's work, and comes back when the app returns (issue 15)."""
    controls = Controls()
    gate = anygate.Gate(1, name="chat")
    saw_disconnect = anyio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        await receive()  # the request body
        assert (await receive())["type"] == "http.disconnect"
        saw_disconnect.set()
        await controls.proceed.wait()  # slow clean-up after the client left

    async with serve(_stack(controls, gate, inner=app), server=server) as url:
        async with httpx.AsyncClient(base_url=url) as client:
            async with anyio.create_task_group() as tg:
                tg.start_soon(client.get, "/v1/chat/x")
                await controls.wait_until(lambda c: c.entered == 1)
                tg.cancel_scope.cancel()  # the client gives up and hangs up
        with anyio.fail_after(10):
            await saw_disconnect.wait()
        assert (gate.in_flight, controls.finished) == (1, 0)
        controls.proceed.set()
        await controls.wait_until(lambda c: c.finished == 1)
        assert gate.in_flight == 0
        await _slot_comes_back(gate)


@on_servers
async def test_body_that_never_starts_returns_the_slot(server: str) -> None:
    """lilbee's case: the client leaves before the streaming body's first iteration, so the
    body (and any clean-up inside it) never runs; the slot still comes back, once, when the
    app returns."""
    controls = Controls()
    gate = anygate.Gate(1, name="chat")

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        await controls.proceed.wait()  # slow set-up; the response would stream after it
        # ...but the route sees no reason to start: it returns without sending a byte.

    async with serve(_stack(controls, gate, inner=app), server=server) as url:
        async with httpx.AsyncClient(base_url=url) as client:
            async with anyio.create_task_group() as tg:
                tg.start_soon(client.get, "/v1/chat/x")
                await controls.wait_until(lambda c: c.entered == 1)
                tg.cancel_scope.cancel()
        assert gate.in_flight == 1  # nothing has released it yet
        controls.proceed.set()
        await controls.wait_until(lambda c: c.finished == 1)
        assert gate.in_flight == 0
        await _slot_comes_back(gate)
    stats = gate.statistics()
    assert (stats.in_flight, stats.admitted) == (0, 2)


@on_servers
async def test_app_raising_before_any_response_returns_the_slot(server: str) -> None:
    """An app that fails before sending anything (the server answers 500) frees the slot."""
    controls = Controls()
    gate = anygate.Gate(1, name="chat")

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        msg = "failed before responding"
        raise RuntimeError(msg)

    async with serve(_stack(controls, gate, inner=app), server=server) as url:
        async with httpx.AsyncClient(base_url=url) as client:
            assert (await client.get("/v1/chat/x")).status_code == 500
        await controls.wait_until(lambda c: c.finished == 1)
        await _slot_comes_back(gate)
    assert gate.in_flight == 0


async def _lifespan(receive: Any, send: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


@on_servers
async def test_starlette_add_middleware_and_paths(server: str) -> None:
    """Installed the Starlette way; a paused gate (capacity 0) rejects gated paths at once,
    matching whole path segments only."""
    gate = anygate.Gate(0, name="paused")
    app = _starlette(Controls())
    app.add_middleware(GateMiddleware, gate=gate, timeout=0, paths=["/v1/chat"])
    async with serve(app, server=server) as url, httpx.AsyncClient(base_url=url) as client:
        rejected = await client.get("/v1/chat/stream")
        assert (await client.get("/v1/chatter")).status_code == 404  # not gated: no such route
        assert (await client.get("/health")).status_code == 200
    assert rejected.status_code == 429
    assert rejected.headers["content-type"] == "application/json"
    assert rejected.headers["retry-after"] == "1"
    assert json.loads(rejected.content)["error"]["code"] == "gate_busy"
    assert gate.statistics().rejected == 1


def test_arguments_are_checked() -> None:
    """Bad arguments fail at construction, naming the parameter and the value."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError

    gate = anygate.Gate(1)
    with pytest.raises(TypeError, match=r"gate must be an anygate\.Gate"):
        GateMiddleware(app, gate="chat")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="app must be an ASGI application"):
        GateMiddleware("app", gate=gate)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"timeout must be >= 0 seconds or None \(got -1\)"):
        GateMiddleware(app, gate=gate, timeout=-1)
    with pytest.raises(ValueError, match=r"retry_after must be <= 1e\+09 seconds \(got inf\)"):
        GateMiddleware(app, gate=gate, retry_after=float("inf"))
    with pytest.raises(TypeError, match="paths must be an iterable"):
        GateMiddleware(app, gate=gate, paths="/v1/chat")
    with pytest.raises(ValueError, match="paths entries must be str starting with '/'"):
        GateMiddleware(app, gate=gate, paths=["v1/chat"])
    middleware = GateMiddleware(app, gate=gate, timeout=5, paths=["/v1/chat/", "/a"])
    assert middleware.gate is gate
    assert repr(middleware) == (
        f"<anygate.asgi.GateMiddleware gate={gate.name!r} timeout=5.0 /v1/chat, /a>"
    )
    assert GateMiddleware.__module__ == "anygate.asgi"
