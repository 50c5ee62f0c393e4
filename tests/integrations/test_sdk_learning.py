"""The real OpenAI and Anthropic SDKs teach the gate their limits and settle their usage.

End to end: ``openai.AsyncOpenAI`` / ``anthropic.AsyncAnthropic`` on httpx2 or httpx with
``GatedTransport``, talking HTTP to the fake provider on 127.0.0.1, which reports its
limits the way each provider family does. The gate's token budget runs on a clock the test
holds still, so token levels are exact. asyncio, asyncio+uvloop and trio.
"""

from __future__ import annotations

from typing import Any

import pytest

import anygate
from tests.integrations.fakeprovider import USAGE_TOKENS, FakeProvider, serve
from tests.integrations.sdks import SDKS, Sdk

pytestmark = pytest.mark.anyio


@pytest.fixture(params=SDKS)
def sdk(request: pytest.FixtureRequest) -> Sdk:
    """Run the requesting test with each SDK / HTTP library pair."""
    value: Sdk = request.param
    return value


class Still:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _tokens_left(gate: anygate.Gate) -> float:
    rate = gate.statistics().rate
    assert rate is not None
    assert rate.tokens_available is not None
    return round(rate.tokens_available, 6)


async def test_sdk_calls_teach_the_gate_the_providers_limits(sdk: Sdk) -> None:
    """Two answered calls with limit headers: the gate paces at 90 % of both limits."""
    provider = FakeProvider()
    provider.limits(requests=600, tokens=100_000)
    gate = anygate.Gate(8, name="llm")
    async with serve(provider) as url:
        client = sdk.client(url, sdk.gated(gate))
        assert await sdk.complete(client) == "Hello world"
        assert gate.rate is None  # one report is not yet evidence
        assert await sdk.stream(client) == "Hello world"
        await client.close()
    assert gate.rate == anygate.Rate(requests_per_minute=540, tokens_per_minute=90_000)
    limits = anygate.RateLearner.of(gate).limits
    assert limits.source == sdk.name
    assert (limits.requests_per_minute, limits.tokens_per_minute) == (600, 100_000)


async def test_a_drained_provider_holds_the_gate(sdk: Sdk) -> None:
    """An answer reporting nothing left makes the gate refuse until the provider's reset."""
    provider = FakeProvider()
    provider.limits(requests=1, tokens=100_000, reset_s=30)
    clock = Still()
    gate = anygate.Gate(8, name="llm", clock=clock)
    async with serve(provider) as url:
        client = sdk.client(url, sdk.gated(gate))
        await sdk.complete(client)  # remaining 0 of 1: drained
        await client.close()
    assert gate.rate is not None
    assert gate.rate.requests_per_minute == pytest.approx(0.9)
    with pytest.raises(anygate.Busy) as caught:
        gate.acquire_nowait()
    # Anthropic's reset is a time of day (1 s resolution through the Date header).
    assert caught.value.retry_after_s == pytest.approx(30, abs=1.5)
    assert anygate.RateLearner.of(gate).limits.holds == 1


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_usage_replaces_the_estimate(sdk: Sdk, stream: bool) -> None:
    """A call is charged its estimate in flight and exactly its reported usage after."""
    provider = FakeProvider()
    clock = Still()
    full = 60_000
    gate = anygate.Gate(
        8,
        name="llm",
        rate=anygate.Rate(tokens_per_minute=full, burst_s=60),
        clock=clock,
    )
    clock.now += 60
    extra: dict[str, Any] = {}
    if stream and sdk.name == "openai":
        extra["stream_options"] = {"include_usage": True}
    async with serve(provider) as url:
        client = sdk.client(url, sdk.gated(gate))
        if stream:
            text = await sdk.stream(client, **extra)
        else:
            text = await sdk.complete(client, **extra)
        await client.close()
    assert text == "Hello world"
    assert _tokens_left(gate) == full - USAGE_TOKENS
    assert gate.in_flight == 0


async def test_openai_stream_without_usage_keeps_the_estimate() -> None:
    """Without ``include_usage`` an OpenAI stream never reports: the estimate stays charged."""
    sdk = Sdk("openai", "httpx2")
    provider = FakeProvider()
    clock = Still()
    gate = anygate.Gate(
        name="llm", rate=anygate.Rate(tokens_per_minute=60_000, burst_s=60), clock=clock
    )
    clock.now += 60
    async with serve(provider) as url:
        client = sdk.client(url, sdk.gated(gate))
        assert await sdk.stream(client) == "Hello world"
        await client.close()
    charged = 60_000 - _tokens_left(gate)
    assert charged == anygate.estimate_tokens(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    )
    assert charged != USAGE_TOKENS
