"""GatedTransport with plain httpx / httpx2 clients: when the slot is taken and given back.

Every async test runs on asyncio, asyncio+uvloop and trio, and with both HTTP libraries,
against the fake provider (hypercorn on 127.0.0.1, in the test's own event loop).
"""

from __future__ import annotations

import gc
import math
import socket
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import pytest

import anygate
from tests.conftest import mock_clock
from tests.integrations.conftest import Arrivals
from tests.integrations.fakeprovider import FakeProvider, serve

if TYPE_CHECKING:
    from tests.integrations.conftest import Flavour

pytestmark = pytest.mark.anyio

SRC = Path(__file__).resolve().parents[2] / "src" / "anygate"


def _client(flavour: Flavour, gate: anygate.Gate, **kwargs: Any) -> Any:
    return flavour.lib.AsyncClient(transport=flavour.gated.GatedTransport(gate=gate, **kwargs))


async def test_streamed_response_holds_its_slot_until_closed(flavour: Flavour) -> None:
    """The slot outlives handle_async_request and returns on aclose(); a second close is a no-op."""
    provider = FakeProvider()
    gate = anygate.Gate(1, name="llm")
    async with serve(provider) as url, _client(flavour, gate) as client:
        request = client.build_request("POST", f"{url}/v1/chat/completions", json={"stream": True})
        response = await client.send(request, stream=True)
        assert gate.in_flight == 1
        async for _ in response.aiter_raw():
            break
        assert gate.in_flight == 1
        await response.aclose()
        assert gate.in_flight == 0
        await response.aclose()
        stats = gate.statistics()
        assert (stats.in_flight, stats.admitted, stats.leaked) == (0, 1, 0)


async def test_another_task_closes_the_response_and_admits_the_next_caller(
    flavour: Flavour,
) -> None:
    """A response handed to another task is closed there; the queued caller gets the slot."""
    provider = FakeProvider()
    gate = anygate.Gate(1, name="llm")
    url_path = "/v1/chat/completions"
    arrivals = Arrivals(flavour.gated.GatedTransport(gate=gate))
    async with serve(provider) as url, flavour.lib.AsyncClient(transport=arrivals) as client:
        opened: list[Any] = []
        second_done = anyio.Event()

        async def opener() -> None:
            request = client.build_request("POST", url + url_path, json={"stream": True})
            opened.append(await client.send(request, stream=True))

        async def closer() -> None:
            (response,) = opened
            await arrivals.wait_entered(2)
            assert gate.waiting == 1  # the second caller queued behind our open stream
            await response.aclose()

        async def second() -> None:
            reply = await client.post(url + url_path, json={})
            assert reply.status_code == 200
            second_done.set()

        async with anyio.create_task_group() as tg:
            await tg.start(_run_and_signal, opener)  # the stream is open and its task is over
            tg.start_soon(second)
            tg.start_soon(closer)
        assert second_done.is_set()
        assert gate.in_flight == 0
        assert gate.statistics().admitted == 2


async def _run_and_signal(fn: Any, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
    await fn()
    task_status.started()


async def test_slot_returns_when_the_body_ends_even_before_close(flavour: Flavour) -> None:
    """Iterating the transport's stream to its end frees the slot; closing after is harmless."""
    provider = FakeProvider()
    gate = anygate.Gate(1, name="llm")
    async with serve(provider) as url:
        transport = flavour.gated.GatedTransport(gate=gate)
        request = flavour.lib.Request("POST", f"{url}/v1/chat/completions", json={"stream": True})
        response = await transport.handle_async_request(request)
        assert gate.in_flight == 1
        chunks = [chunk async for chunk in response.stream]
        assert b"[DONE]" in b"".join(chunks)
        assert gate.in_flight == 0
        await response.stream.aclose()
        await transport.aclose()
        assert gate.statistics().admitted == 1


async def test_dropped_unread_response_is_reclaimed_with_a_warning(flavour: Flavour) -> None:
    """An unclosed response that is garbage-collected gives its slot back exactly once, loudly."""
    provider = FakeProvider()
    gate = anygate.Gate(1, name="llm")
    async with serve(provider) as url, _client(flavour, gate) as client:
        request = client.build_request(
            "POST", f"{url}/v1/chat/completions?key=secret", json={"stream": True}
        )
        held = [await client.send(request, stream=True)]
        del request
        assert gate.in_flight == 1
        with pytest.warns(ResourceWarning) as record:
            _drop(held)
        assert gate.in_flight == 0
        assert gate.statistics().leaked == 1
        messages = [str(w.message) for w in record]
        ours = [m for m in messages if "unclosed" in m]
        assert len(ours) == 1
        assert f"POST {url}/v1/chat/completions" in ours[0]
        assert "secret" not in ours[0]  # the query (where some APIs put keys) is dropped
        # The slot is usable again: a fresh request goes through at once.
        reply = await client.post(f"{url}/v1/chat/completions", json={})
        assert reply.status_code == 200
        assert gate.in_flight == 0


def _drop(held: list[Any]) -> None:
    """Drop the only references to some objects and collect them."""
    held.clear()
    gc.collect()


async def test_cancelled_while_queued_for_a_slot(flavour: Flavour) -> None:
    """A request cancelled in the gate's queue leaves no trace: nothing sent, nothing held."""
    provider = FakeProvider()
    gate = anygate.Gate(1, name="llm")
    arrivals = Arrivals(flavour.gated.GatedTransport(gate=gate))
    async with serve(provider) as url, flavour.lib.AsyncClient(transport=arrivals) as client:
        holder = await gate.acquire()
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: client.post(f"{url}/v1/chat/completions", json={}))
                await arrivals.wait_entered(1)
                assert gate.waiting == 1
                scope.cancel()
        assert (gate.waiting, gate.in_flight) == (0, 1)
        holder.release()
        assert gate.in_flight == 0
        assert provider.requests == 0


async def test_cancelled_while_waiting_for_headers(flavour: Flavour) -> None:
    """Cancelling the caller while the provider has not answered returns the slot."""
    provider = FakeProvider()
    gate = anygate.Gate(1, name="llm")
    async with serve(provider) as url, _client(flavour, gate) as client:
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                lambda: client.post(
                    f"{url}/v1/chat/completions", json={}, headers={"x-fake": "hang_headers"}
                )
            )
            await provider.wait_until(lambda p: p.active == 1)
            assert gate.in_flight == 1
            tg.cancel_scope.cancel()
        assert gate.in_flight == 0
        await provider.wait_until(lambda p: p.active == 0)  # the server saw the disconnect


async def test_cancelled_while_reading_a_stream(flavour: Flavour) -> None:
    """A reader cancelled between chunks gives the slot back at once, before any close."""
    provider = FakeProvider()
    gate = anygate.Gate(1, name="llm")
    async with serve(provider) as url, _client(flavour, gate) as client:
        request = client.build_request(
            "POST",
            f"{url}/v1/chat/completions",
            json={"stream": True},
            headers={"x-fake": "hang_stream"},
        )
        response = await client.send(request, stream=True)
        try:
            first_chunk = anyio.Event()
            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as tg:

                    async def read() -> None:
                        async for _ in response.aiter_raw():
                            first_chunk.set()  # then on to the next, which never comes

                    tg.start_soon(read)
                    await first_chunk.wait()
                    assert gate.in_flight == 1
                    scope.cancel()
            assert gate.in_flight == 0
        finally:
            await response.aclose()
        assert gate.statistics().admitted == 1


async def test_connection_error_returns_the_slot(flavour: Flavour) -> None:
    """A request that cannot connect raises the library's ConnectError and frees its slot."""
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    gate = anygate.Gate(1, name="llm")
    async with _client(flavour, gate) as client:
        with pytest.raises(flavour.lib.ConnectError):
            await client.get(f"http://127.0.0.1:{port}/")
    assert gate.in_flight == 0


@pytest.mark.parametrize("anyio_backend", [mock_clock()])
async def test_busy_when_no_slot_within_timeout(flavour: Flavour) -> None:
    """With ``timeout`` set, a full gate raises anygate.Busy after exactly that long."""
    gate = anygate.Gate(0, name="paused")
    async with _client(flavour, gate, timeout=5) as client:
        start = anyio.current_time()
        with pytest.raises(anygate.Busy, match="'paused' is busy"):
            await client.get("http://127.0.0.1:9/never-sent")
        assert anyio.current_time() - start == 5
    assert gate.in_flight == 0


async def test_sync_twin_in_worker_threads(flavour: Flavour) -> None:
    """SyncGatedTransport serves blocking clients in threads: close twice, drop, read to end."""
    provider = FakeProvider()
    gate = anygate.Gate(1, name="llm")

    def work(url: str) -> None:
        transport = flavour.gated.SyncGatedTransport(gate=gate)
        with flavour.lib.Client(transport=transport) as client:
            assert client.post(f"{url}/v1/chat/completions", json={}).status_code == 200
            assert gate.in_flight == 0
            with client.stream("POST", f"{url}/v1/chat/completions", json={"stream": True}) as r:
                chunks = r.iter_raw()
                assert next(chunks)
                assert gate.in_flight == 1
                r.close()
                assert gate.in_flight == 0
            held = [client.send(client.build_request("GET", f"{url}/x"), stream=True)]
            assert gate.in_flight == 1
            with pytest.warns(ResourceWarning) as record:
                _drop(held)
            assert sum("unclosed" in str(w.message) for w in record) == 1
            assert gate.in_flight == 0

    async with serve(provider) as url:
        await anyio.to_thread.run_sync(work, url)
    assert gate.statistics().leaked == 1


async def test_sync_twin_refuses_an_event_loop_thread(flavour: Flavour) -> None:
    """A blocking client used on the loop's own thread fails clearly instead of freezing it."""
    transport = flavour.gated.SyncGatedTransport(gate=anygate.Gate(1))
    with flavour.lib.Client(transport=transport) as client:
        with pytest.raises(RuntimeError, match="would block the loop"):
            client.get("http://127.0.0.1:9/")


def test_arguments_are_checked(flavour: Flavour) -> None:
    """Bad arguments fail at construction, naming the parameter and the value."""
    gated, lib = flavour.gated, flavour.lib
    gate = anygate.Gate(1)
    with pytest.raises(TypeError, match=r"gate must be an anygate\.Gate"):
        gated.GatedTransport(gate="llm")
    with pytest.raises(ValueError, match=r"timeout must be >= 0 seconds or None \(got -1\)"):
        gated.GatedTransport(gate=gate, timeout=-1)
    with pytest.raises(ValueError, match="got nan"):
        gated.GatedTransport(gate=gate, timeout=math.nan)
    with pytest.raises(TypeError, match="timeout must be a number"):
        gated.GatedTransport(gate=gate, timeout="5")
    with pytest.raises(TypeError, match="handle_async_request"):
        gated.GatedTransport(lib.HTTPTransport(), gate=gate)
    with pytest.raises(TypeError, match="handle_request"):
        gated.SyncGatedTransport(lib.AsyncHTTPTransport(), gate=gate)
    other = "httpx" if flavour.name == "httpx2" else "httpx2"
    other_lib = pytest.importorskip(other)
    with pytest.raises(TypeError, match=rf"use anygate\.{other}\.GatedTransport"):
        gated.GatedTransport(other_lib.AsyncHTTPTransport(), gate=gate)
    with pytest.raises(TypeError, match=rf"use anygate\.{other}\.SyncGatedTransport"):
        gated.SyncGatedTransport(other_lib.HTTPTransport(), gate=gate)


def test_properties_and_repr(flavour: Flavour) -> None:
    """The transports expose their gate and inner transport and say what they are."""
    gate = anygate.Gate(2, name="llm")
    inner = flavour.lib.AsyncHTTPTransport()
    transport = flavour.gated.GatedTransport(inner, gate=gate)
    assert transport.gate is gate
    assert transport.inner is inner
    assert repr(transport) == (
        f"<anygate.{flavour.name}.GatedTransport gate='llm' inner=AsyncHTTPTransport>"
    )
    sync = flavour.gated.SyncGatedTransport(gate=gate)
    assert isinstance(sync.inner, flavour.lib.HTTPTransport)
    assert (
        repr(sync) == f"<anygate.{flavour.name}.SyncGatedTransport gate='llm' inner=HTTPTransport>"
    )


def test_import_anygate_does_not_import_http_libraries() -> None:
    """`import anygate` stays light: httpx and httpx2 load only with their integration."""
    code = "import sys, anygate; print(sorted(m for m in ('httpx', 'httpx2') if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout
    assert out.strip() == "[]"


async def test_a_response_read_in_advance_frees_its_slot_at_once(flavour: Flavour) -> None:
    """Transports that hand back a response already in memory (MockTransport, caches) free
    the slot before the client sees it: nobody would ever close that stream."""
    lib = flavour.lib
    gate = anygate.Gate(1, name="llm")
    inner = lib.MockTransport(lambda request: lib.Response(200, json={"ok": True}))
    async with lib.AsyncClient(transport=flavour.gated.GatedTransport(inner, gate=gate)) as client:
        for _ in range(3):  # capacity 1: a held slot would block the second request forever
            response = await client.get("https://llm.example/")
            assert response.json() == {"ok": True}
            assert gate.in_flight == 0
    assert gate.statistics().admitted == 3


def test_sync_response_read_in_advance_frees_its_slot_at_once(flavour: Flavour) -> None:
    """The same for the blocking twin."""
    lib = flavour.lib
    gate = anygate.Gate(1, name="llm")
    inner = lib.MockTransport(lambda request: lib.Response(204))
    with lib.Client(transport=flavour.gated.SyncGatedTransport(inner, gate=gate)) as client:
        for _ in range(3):
            assert client.get("https://llm.example/").status_code == 204
            assert gate.in_flight == 0


async def test_closed_by_another_task_while_being_read(flavour: Flavour) -> None:
    """Closing a response while another task is blocked reading it frees the slot at once;
    the closer sees no error, the reader sees the stream end or fail."""
    provider = FakeProvider()
    gate = anygate.Gate(1, name="llm")
    async with serve(provider) as url, _client(flavour, gate) as client:
        request = client.build_request(
            "POST",
            f"{url}/v1/chat/completions",
            json={"stream": True},
            headers={"x-fake": "hang_stream"},
        )
        response = await client.send(request, stream=True)
        first_chunk = anyio.Event()
        outcome: list[str] = []

        async def read() -> None:
            try:
                async for _ in response.aiter_raw():
                    first_chunk.set()
            except Exception as exc:  # the library's "stream closed" flavour of error
                outcome.append(type(exc).__name__)
            else:
                outcome.append("ended")

        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            await first_chunk.wait()
            await response.aclose()
            assert gate.in_flight == 0
        assert len(outcome) == 1
    assert gate.statistics().admitted == 1


class _Recorded:
    """An inner response body that records what was done to it: its iterator is a
    generator whose ``finally`` notes that it was closed, and ``aclose()`` / ``close()``
    count. Built on the flavour's own byte-stream classes."""

    def __init__(self, flavour: Flavour, chunks: list[bytes]) -> None:
        self.chunks = chunks
        self.iterator_finalised = 0
        self.closed = 0
        recorded = self

        class Stream(flavour.lib.AsyncByteStream, flavour.lib.SyncByteStream):  # type: ignore[name-defined,misc]
            async def __aiter__(self) -> Any:
                try:
                    for chunk in recorded.chunks:
                        yield chunk
                finally:
                    recorded.iterator_finalised += 1

            def __iter__(self) -> Any:
                try:
                    yield from recorded.chunks
                finally:
                    recorded.iterator_finalised += 1

            async def aclose(self) -> None:
                recorded.closed += 1

            def close(self) -> None:
                recorded.closed += 1

        self.stream = Stream()


class _Answer:
    """An inner transport answering every request with one ``_Recorded`` body (not read in
    advance, so the gated transport ties the slot to it)."""

    def __init__(self, flavour: Flavour, body: _Recorded) -> None:
        self._lib = flavour.lib
        self._body = body

    def _response(self) -> Any:
        return self._lib.Response(200, stream=self._body.stream)

    async def handle_async_request(self, request: Any) -> Any:
        return self._response()

    def handle_request(self, request: Any) -> Any:
        return self._response()


@pytest.mark.parametrize("read", ["to_the_end", "half"])
async def test_closing_a_body_closes_the_inner_stream_once(flavour: Flavour, read: str) -> None:
    """Read to its end or half-read, closing the gated body closes the inner stream exactly
    once and frees the slot; a half-read inner iterator is closed too (not left to the
    garbage collector), one read to its end has already finished."""
    body = _Recorded(flavour, [b"a", b"b", b"c"])
    gate = anygate.Gate(1, name="llm")
    transport = flavour.gated.GatedTransport(_Answer(flavour, body), gate=gate)
    response = await transport.handle_async_request(flavour.lib.Request("GET", "http://llm/"))
    stream = response.stream
    if read == "to_the_end":
        assert [chunk async for chunk in stream] == [b"a", b"b", b"c"]
        assert (gate.in_flight, body.iterator_finalised, body.closed) == (0, 1, 0)
    else:
        assert await stream.__aiter__().__anext__() == b"a"
        assert (gate.in_flight, body.iterator_finalised, body.closed) == (1, 0, 0)
    await stream.aclose()
    assert (gate.in_flight, body.iterator_finalised, body.closed) == (0, 1, 1)


@pytest.mark.parametrize("read", ["to_the_end", "half"])
def test_closing_a_sync_body_closes_the_inner_stream_once(flavour: Flavour, read: str) -> None:
    """The same for the blocking twin's body."""
    body = _Recorded(flavour, [b"a", b"b", b"c"])
    gate = anygate.Gate(1, name="llm")
    transport = flavour.gated.SyncGatedTransport(_Answer(flavour, body), gate=gate)
    response = transport.handle_request(flavour.lib.Request("GET", "http://llm/"))
    stream = response.stream
    if read == "to_the_end":
        assert list(stream) == [b"a", b"b", b"c"]
        assert (gate.in_flight, body.iterator_finalised, body.closed) == (0, 1, 0)
    else:
        assert next(iter(stream)) == b"a"
        assert (gate.in_flight, body.iterator_finalised, body.closed) == (1, 0, 0)
    stream.close()
    assert (gate.in_flight, body.iterator_finalised, body.closed) == (0, 1, 1)
