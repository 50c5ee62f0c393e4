"""The real OpenAI and Anthropic SDKs on one process's ``fleet.gate`` teach the whole
fleet the provider's limits (the fake provider on 127.0.0.1 reports them the way each
provider family does; two fleet gates of one name act as two processes, see
``test_fleet``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

import anygate
from tests.integrations.fakeprovider import FakeProvider, serve
from tests.integrations.sdks import SDKS, Sdk

from .test_fleet import eventually, make

if TYPE_CHECKING:
    from collections.abc import Callable

    from anygate.fleet import FleetGate

    from .redis_proc import RedisProc

pytestmark = [
    pytest.mark.anyio,
    # As for every SDK test (tests/integrations/conftest.py): trio warns about the SDKs'
    # own async generators left unexhausted when they stop reading at "[DONE]".
    pytest.mark.filterwarnings(
        r"ignore:Async generator '(openai|anthropic|httpx2?|httpcore2?)\.:ResourceWarning"
    ),
]
__all__ = ["make"]  # the fixture, shared with test_fleet


@pytest.mark.parametrize("sdk", SDKS)
async def test_an_sdks_answers_in_one_process_pace_every_process(
    sdk: Sdk, redis_server: RedisProc, gate_name: str, make: Callable[..., FleetGate]
) -> None:
    """Two answered calls with limit headers through a gated transport on one process's
    ``fleet.gate``: both processes then pace at 90 % of both limits (the fleet's rate was
    ten times them, the learner's ceiling)."""
    provider = FakeProvider()
    provider.limits(requests=600, tokens=100_000)
    rate = anygate.Rate(requests_per_minute=6_000, tokens_per_minute=1_000_000)
    first, second = (make(gate_name, redis_server.url, capacity=4, rate=rate) for _ in range(2))
    (await second.acquire(timeout=5)).release()  # its agent runs (from its first use)
    async with serve(provider) as url:
        client = sdk.client(url, sdk.gated(first.gate))
        assert await sdk.complete(client) == "Hello world"
        assert await sdk.stream(client) == "Hello world"
        await client.close()
    learned = anygate.Rate(requests_per_minute=540, tokens_per_minute=90_000)
    await eventually(lambda: first.rate == learned and second.rate == learned)
    assert anygate.RateLearner.of(first.gate).limits.source == sdk.name
