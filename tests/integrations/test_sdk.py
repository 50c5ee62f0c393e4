"""The real OpenAI and Anthropic SDKs through GatedTransport, against the fake provider.

No SDK is mocked: each test builds ``openai.AsyncOpenAI`` / ``anthropic.AsyncAnthropic`` with
``http_client=<httpx2 or httpx client>(transport=GatedTransport(...))`` and talks HTTP to
hypercorn on 127.0.0.1. Runs on asyncio, asyncio+uvloop and trio. Without a policy, the
SDK's own retries run and each attempt takes its own slot (see test_policy_transport.py
for the composition with an anygate Policy).
"""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
import pytest

import anygate
from tests.integrations.conftest import Arrivals
from tests.integrations.fakeprovider import FakeProvider, serve
from tests.integrations.sdks import MESSAGES, SDKS, Sdk

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

pytestmark = pytest.mark.anyio


@pytest.fixture(params=SDKS)
def sdk(request: pytest.FixtureRequest) -> Sdk:
    """Run the requesting test with each SDK / HTTP library pair."""
    value: Sdk = request.param
    return value


async def test_burst_never_exceeds_capacity(sdk: Sdk) -> None:
    """60 concurrent SDK calls (half streamed) meet the provider at most 4 at a time.

    The provider holds every response mid-body until told otherwise, so without the gate
    (or with a slot given back when the headers arrive rather than when the body is done)
    more would pile up there. The test waits until every call has entered the transport and
    4 responses have started, checks the other 56 are queued in the gate, then lets them run.
    """
    provider = FakeProvider()
    provider.hold()
    gate = anygate.Gate(4, name="llm")
    arrivals = Arrivals(sdk.gated(gate))
    results: list[str] = []

    async with serve(provider) as url:
        client = sdk.client(url, arrivals)

        async def call(i: int) -> None:
            results.append(await (sdk.stream(client) if i % 2 else sdk.complete(client)))

        async with anyio.create_task_group() as tg:
            for i in range(60):
                tg.start_soon(call, i)
            await arrivals.wait_entered(60)
            await arrivals.wait_answered(4)
            assert (gate.in_flight, gate.waiting, provider.active) == (4, 56, 4)
            provider.unhang()
        await client.close()

    assert results == ["Hello world"] * 60
    assert (provider.requests, provider.max_active) == (60, 4)
    assert gate.in_flight == 0
    assert gate.statistics().admitted == 60


async def test_closing_a_stream_early_returns_the_slot(sdk: Sdk) -> None:
    """Closing the SDK stream mid-way (the provider still streaming) frees the slot at once."""
    provider = FakeProvider()
    gate = anygate.Gate(1, name="llm")
    async with serve(provider) as url:
        client = sdk.client(url, sdk.gated(gate))
        stream = await sdk.create(client, stream=True, extra_headers={"x-fake": "hang_stream"})
        async for _ in stream:
            break
        assert gate.in_flight == 1
        await stream.close()
        assert gate.in_flight == 0
        await provider.wait_until(lambda p: p.active == 0)  # the provider saw us hang up
        assert await sdk.complete(client) == "Hello world"  # and the slot is usable
        await client.close()
    assert gate.in_flight == 0


async def test_anthropic_stream_helper_exited_early() -> None:
    """Leaving ``messages.stream(...)`` after the first text delta returns the slot."""
    provider = FakeProvider()
    gate = anygate.Gate(1, name="llm")
    sdk = Sdk("anthropic", "httpx2")
    async with serve(provider) as url:
        client = sdk.client(url, sdk.gated(gate))
        async with client.messages.stream(
            model="m", max_tokens=8, messages=MESSAGES, extra_headers={"x-fake": "hang_stream"}
        ) as stream:
            async for event in stream:
                if event.type == "message_start":
                    assert gate.in_flight == 1
                    break
        assert gate.in_flight == 0
        await client.close()


async def test_unread_stream_dropped_is_reclaimed(sdk: Sdk) -> None:
    """An SDK stream created and dropped without reading returns its slot, with a warning."""
    provider = FakeProvider()
    gate = anygate.Gate(1, name="llm")
    async with serve(provider) as url:
        client = sdk.client(url, sdk.gated(gate))
        held = [await sdk.create(client, stream=True)]
        assert gate.in_flight == 1
        with pytest.warns(ResourceWarning) as record:
            _drop(held)
        assert any("unclosed" in str(w.message) for w in record)
        assert gate.in_flight == 0
        assert gate.statistics().leaked == 1
        await client.close()


def _drop(held: list[Any]) -> None:
    held.clear()
    gc.collect()


async def test_cancelled_caller_returns_the_slot(sdk: Sdk) -> None:
    """A caller cancelled before the headers, or between stream chunks, frees its slot."""
    provider = FakeProvider()
    gate = anygate.Gate(1, name="llm")
    async with serve(provider) as url:
        client = sdk.client(url, sdk.gated(gate))
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: sdk.complete(client, extra_headers={"x-fake": "hang_headers"}))
            await provider.wait_until(lambda p: p.active == 1)
            tg.cancel_scope.cancel()
        assert gate.in_flight == 0

        stream = await sdk.create(client, stream=True, extra_headers={"x-fake": "hang_stream"})
        first_event = anyio.Event()
        async with anyio.create_task_group() as tg:

            async def consume() -> None:
                async for _ in stream:
                    first_event.set()  # then on to the next, which never comes

            tg.start_soon(consume)
            await first_event.wait()
            assert gate.in_flight == 1
            tg.cancel_scope.cancel()
        assert gate.in_flight == 0
        await stream.close()
        await client.close()
    assert gate.statistics().admitted == 2


@pytest.mark.parametrize(
    ("behaviour", "error"),
    [
        ("unauthorized", "AuthenticationError"),
        ("overloaded", "InternalServerError"),
        ("burst", "RateLimitError"),
    ],
)
@pytest.mark.parametrize("streamed", [False, True], ids=["plain", "streamed"])
async def test_server_errors_return_the_slot(
    sdk: Sdk, behaviour: str, error: str, streamed: bool
) -> None:
    """Error statuses reach the caller as the SDK's own exceptions, and free the slot."""
    provider = FakeProvider()
    gate = anygate.Gate(1, name="llm")
    module = sdk.errors
    async with serve(provider) as url:
        client = sdk.client(url, sdk.gated(gate))
        call = sdk.stream if streamed else sdk.complete
        with pytest.raises(getattr(module, error)):
            await call(client, extra_headers={"x-fake": behaviour})
        assert gate.in_flight == 0
        await client.close()


async def test_sdk_retries_take_a_slot_per_attempt_and_none_while_waiting(sdk: Sdk) -> None:
    """Without a policy the SDK retries; its backoff holds no slot, so others go first.

    Capacity 1. Call A's first attempt is answered 429 (``retry-after-ms: 1``) only once B
    is queued. The SDK closes the failed response before its backoff sleep, so the slot goes
    to B at once, and A's retry queues behind B.
    """
    provider = FakeProvider()
    provider.script("retry_after_ms")
    gate = anygate.Gate(1, name="llm")
    arrivals = Arrivals(sdk.gated(gate))
    results: dict[str, str] = {}

    async def run(key: str, fn: Callable[[], Awaitable[str]]) -> None:
        results[key] = await fn()

    async with serve(provider) as url:
        client = sdk.client(url, arrivals, max_retries=2)
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                run, "a", lambda: sdk.complete(client, extra_headers={"x-fake-wait": "a"})
            )
            await provider.wait_until(lambda p: p.requests == 1)
            tg.start_soon(
                run, "b", lambda: sdk.complete(client, extra_headers={"x-fake": "hang_headers"})
            )
            await arrivals.wait_entered(2)
            assert gate.waiting == 1
            provider.release("a")
            await arrivals.wait_entered(3)  # A's retry is in the gate's queue...
            await provider.wait_until(lambda p: p.requests == 2)  # ...and B at the provider
            assert provider.seen == ["retry_after_ms", "hang_headers"]
            assert (gate.in_flight, gate.waiting) == (1, 1)
            provider.unhang()
        await client.close()

    assert results == {"a": "Hello world", "b": "Hello world"}
    assert provider.seen == ["retry_after_ms", "hang_headers", "ok"]
    assert provider.retry_counts == ["0", "0", "1"]
    assert gate.in_flight == 0


async def test_sync_clients_in_threads_share_the_gate(sdk: Sdk) -> None:
    """Blocking SDK clients in 6 threads, capacity 2: at most 2 at the provider at once."""
    provider = FakeProvider()
    provider.hold()
    gate = anygate.Gate(2, name="llm")
    results: list[str] = []

    async with serve(provider) as url:
        client = sdk.client(url, sdk.gated(gate, sync=True), sync=True)

        def call() -> None:
            results.append(sdk.text_of(sdk.create(client)))

        async with anyio.create_task_group() as tg:
            for _ in range(6):
                tg.start_soon(anyio.to_thread.run_sync, call)
            await provider.wait_until(lambda p: p.active == 2)
            # Threads cannot signal this loop cheaply; poll the gate with checkpoints, bounded.
            with anyio.fail_after(10):
                while gate.waiting < 4:
                    await anyio.lowlevel.checkpoint()
            assert (gate.in_flight, provider.active) == (2, 2)
            provider.unhang()
        client.close()

    assert results == ["Hello world"] * 6
    assert (provider.requests, provider.max_active) == (6, 2)
    assert gate.in_flight == 0
