"""What an SDK caller sees when a gated transport refuses a request (issue 10, item 5).

A refusal (no slot in time: :class:`anygate.Busy`; the breaker open:
:class:`anygate.CircuitOpen`) leaves the transport as its HTTP library's own error, so the
real OpenAI and Anthropic SDKs raise their usual ``APITimeoutError`` / ``APIConnectionError``
with the anygate error as ``__cause__``, and a plain client's caller can still catch the
anygate class. Real SDKs against the fake provider over real HTTP, on every backend.
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest

import anygate
from tests.integrations.fakeprovider import FakeProvider, serve
from tests.integrations.sdks import SDKS, Sdk

pytestmark = pytest.mark.anyio

FAST = anygate.RetryConfig(max_attempts=1, base_delay_ms=1, cap_delay_ms=2)
OPENS_AT_ONCE = anygate.BreakerConfig(
    failure_threshold=1, recovery_timeout_sec=3600, when_open="fail"
)


@pytest.fixture(params=SDKS)
def sdk(request: pytest.FixtureRequest) -> Sdk:
    """Run the requesting test with each SDK / HTTP library pair."""
    value: Sdk = request.param
    return value


def _flavour(sdk: Sdk) -> Any:
    return importlib.import_module(f"anygate.{sdk.library}")


async def test_busy_is_the_sdks_timeout_error(sdk: Sdk) -> None:
    """A full gate with ``timeout=0``: the SDK raises APITimeoutError caused by anygate.Busy
    (the transport's TransportBusy, also its library's PoolTimeout); nothing is sent."""
    provider = FakeProvider()
    gate = anygate.Gate(1, name="llm")
    held = await gate.acquire()
    async with serve(provider) as url:
        client = sdk.client(url, sdk.gated(gate, timeout=0))
        with pytest.raises(sdk.errors.APITimeoutError) as info:
            await sdk.complete(client)
        await client.close()
    held.release()
    cause = info.value.__cause__
    assert isinstance(cause, _flavour(sdk).TransportBusy), repr(cause)
    assert isinstance(cause, anygate.Busy)
    assert isinstance(cause, importlib.import_module(sdk.library).PoolTimeout)
    assert (cause.gate, cause.in_flight, cause.waited) == ("llm", 1, 0)
    assert isinstance(cause.__cause__, anygate.Busy)  # the gate's own error, chained
    assert "'llm' is busy" in str(cause)
    assert provider.requests == 0
    assert gate.in_flight == 0


async def test_an_open_breaker_is_the_sdks_connection_error(sdk: Sdk) -> None:
    """Once the breaker is open the SDK raises APIConnectionError (not its timeout subclass)
    caused by anygate.CircuitOpen, with its attributes, before anything is sent."""
    provider = FakeProvider()
    provider.script("overloaded")
    policy = anygate.Policy(
        name="llm", gate=anygate.Gate(2, name="llm"), retry=FAST, circuit_breaker=OPENS_AT_ONCE
    )
    async with serve(provider) as url:
        client = sdk.client(url, sdk.gated(policy=policy))
        with pytest.raises(sdk.errors.InternalServerError):
            await sdk.complete(client)
        with pytest.raises(sdk.errors.APIConnectionError) as info:
            await sdk.complete(client)
        await client.close()
    assert not isinstance(info.value, sdk.errors.APITimeoutError)
    cause = info.value.__cause__
    assert isinstance(cause, _flavour(sdk).TransportCircuitOpen), repr(cause)
    assert isinstance(cause, anygate.CircuitOpen)
    assert isinstance(cause, importlib.import_module(sdk.library).TransportError)
    assert cause.name == "llm"
    assert cause.retry_after > 0
    assert provider.requests == 1
    assert policy.gate.in_flight == 0


@pytest.mark.parametrize("library", ["httpx", "httpx2"])
def test_a_plain_sync_client_still_raises_the_anygate_error(library: str) -> None:
    """Without an SDK, ``except anygate.Busy`` around a blocking client keeps working, and
    the error is the library's too (``except httpx.TransportError`` catches it)."""
    lib = importlib.import_module(library)
    flavour = importlib.import_module(f"anygate.{library}")
    gate = anygate.Gate(0, name="closed")
    transport = flavour.SyncGatedTransport(lib.MockTransport(lib.Response), gate=gate, timeout=0)
    with lib.Client(transport=transport) as client:
        with pytest.raises(anygate.Busy) as info:
            client.get("https://llm.example/")
    assert isinstance(info.value, lib.TransportError)
    assert info.value.request.url == "https://llm.example/"


async def test_a_full_queues_503_through_an_sdk_is_a_concurrency_lesson(sdk: Sdk) -> None:
    """Ollama's 503 beyond its queue bound, raised by the real SDK as its server error: the
    policy reads a concurrency answer (the gate holds the calls in flight less one, here
    its floor), not a failure: the breaker, opening at the first failure, stays closed,
    and the retry goes through."""
    provider = FakeProvider()
    provider.script("queue_full")
    policy = anygate.Policy(
        name="local",
        gate_name="local-gate",
        retry=anygate.RetryConfig(base_delay_ms=1, cap_delay_ms=2),
        circuit_breaker=OPENS_AT_ONCE,
    )
    async with serve(provider) as url:
        client = sdk.client(url, None)
        assert await policy.call(sdk.complete, client) == "Hello world"
        await client.close()
    assert provider.seen == ["queue_full", "ok"]
    assert policy.breaker is not None
    assert policy.breaker.statistics().opened == 0
    stats = policy.adaptive_limit.statistics()
    assert stats.throttles == 1
    assert policy.gate.capacity == 1
