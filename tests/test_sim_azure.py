"""Azure OpenAI's rule in the simulated provider (``provider.tokens.rule: azure``).

A TPM quota per deployment, RPM = 6 per 1,000 TPM evaluated over a sliding 10 s (or 1 s),
tokens (prompt + ``max_tokens`` at admission) over a sliding 60 s, as
stuartleeks/aoai-simulated-api evaluates them: the windows' arithmetic, the provider's
answers on a virtual clock, the scenario keys' errors, and an oracle that is never turned
away.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import anyio
import pytest

from anygate import ConfigError, sim
from anygate.sim._buckets import AzureWindows, make_buckets
from anygate.sim._provider import ProviderError, ProviderModel, ProviderResponse
from anygate.sim._scenarios import scenario_mapping
from anygate.sim._spec import Lognormal, ProviderSpec, TokenLimits
from tests.conftest import mock_clock

pytest.importorskip("trio")
pytest.importorskip("yaml")

_INSTANT = Lognormal(median_s=0.0)


def test_azure_windows_slide_rather_than_refill() -> None:
    """10,000 TPM: RPM 60, so 10 requests in any 10 s (ceil(TPM / 1000), as
    aoai-simulated-api computes it); an 11th at 5 s waits until the first leaves the window
    at 10 s. Tokens: 6,000 at 0 s leave room for 4,000 until 60 s (a refilled bucket would
    have 4,166 after 1 s and all of it back gradually); nothing is settled back."""
    windows = make_buckets(TokenLimits(tpm=10_000, rule="azure"))
    assert isinstance(windows, AzureWindows)
    requests, tokens = windows.all
    assert (requests.kind, requests.limit, requests.capacity) == ("rpm", 60, 10)
    assert (tokens.kind, tokens.limit, tokens.capacity) == ("tpm", 10_000, 10_000)
    for _ in range(10):
        assert windows.short(0, 0, 0.0) is None
        windows.take(0, 0, 0.0)
    assert windows.short(0, 0, 5.0) == (requests, 5.0)
    assert windows.short(0, 0, 10.0) is None

    windows = make_buckets(TokenLimits(tpm=10_000, rule="azure"))
    tokens = windows.by_kind["tpm"]
    windows.take(2000, 4000, 0.0)
    windows.settle(4000, 10, 1.0)  # the estimate stays charged
    assert windows.short(1000, 3000, 1.0) is None  # 4,000 fit
    assert windows.short(1000, 3001, 1.0) == (tokens, 59.0)  # one more waits for 60 s
    assert tokens.level(1.0) == 4000
    assert tokens.reset_s(1.0) == 59.0


def test_azure_interval_of_one_second_is_rpm_over_60() -> None:
    """interval_s 1: RPM / 60 per sliding second (Azure's "1 or 10 seconds"); 200,000 TPM
    is 1,200 RPM, 20 a second."""
    windows = make_buckets(TokenLimits(tpm=200_000, rule="azure", interval_s=1.0))
    requests = windows.by_kind["rpm"]
    assert (requests.limit, requests.capacity) == (1200, 20)
    for _ in range(20):
        windows.take(0, 0, 0.0)
    assert windows.short(0, 0, 0.5) == (requests, 0.5)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", [mock_clock()])
async def test_azure_provider_answers_429_with_the_window_retry_after(anyio_backend: Any) -> None:
    """The provider on Azure's rule: a second request of 1,000 + 1,000 against 3,000 TPM
    is turned away (kind tpm) with Retry-After the 60 s until the first leaves the window;
    a rejection is not recorded, so at 60 s the request is admitted."""
    spec = ProviderSpec(
        slots=10,
        reject_latency=_INSTANT,
        retry_after="auto",
        tokens=TokenLimits(tpm=3000, rule="azure"),
    )
    provider = ProviderModel(spec, random.Random(0), epoch=anyio.current_time())
    start = anyio.current_time()
    assert isinstance(await provider.serve(0.0, 1000, 1000, 10), ProviderResponse)
    with pytest.raises(ProviderError) as info:
        await provider.serve(0.0, 1000, 1000, 10)
    assert info.value.kind == "tpm"
    assert info.value.retry_after == pytest.approx(60.0)
    await anyio.sleep_until(start + 60.0)
    assert isinstance(await provider.serve(0.0, 1000, 1000, 10), ProviderResponse)


@pytest.mark.parametrize(
    ("tokens", "message"),
    [
        ({"rule": "gcp", "tpm": 1000}, r"provider\.tokens\.rule must be 'buckets' or 'azure'"),
        ({"rule": "azure"}, r"provider\.tokens\.tpm must be set with rule: azure"),
        (
            {"rule": "azure", "tpm": 1000, "rpm": 6},
            r"provider\.tokens\.rpm must be left out with rule: azure .*RPM is 6 per 1,000",
        ),
        (
            {"rule": "azure", "tpm": 1000, "background": 0.2},
            r"provider\.tokens\.background must be left out with rule: azure",
        ),
        ({"rule": "azure", "tpm": 1000, "interval_s": 5}, r"interval_s must be 1 or 10"),
        ({"tpm": 1000, "interval_s": 1}, r"interval_s must be left out without rule: azure"),
    ],
)
def test_azure_keys_are_validated(tokens: dict[str, Any], message: str) -> None:
    """Each wrong combination names its key and what it must be."""
    fleet = {"tokens": {"prompt": 100, "max_tokens": 100}}
    with pytest.raises(ConfigError, match=message):
        sim.load_scenario({"provider": {"tokens": tokens}, "fleet": fleet})


def test_the_oracle_knows_azures_windows() -> None:
    """On openai-tier1-tpm under Azure's rule (200,000 TPM, so 1,200 RPM and 200 requests
    per 10 s) the oracle is never turned away, loses nothing, and the lower bound (a
    bucket of each window's capacity) stays below its makespan."""
    raw, _ = scenario_mapping("openai-tier1-tpm")
    provider = {**raw["provider"], "tokens": {"rule": "azure", "tpm": 200_000}}
    scenario = sim.load_scenario({**raw, "provider": provider})
    scenario = replace(scenario, fleet=replace(scenario.fleet, agents=30))
    assert scenario.provider.tokens is not None
    assert scenario.provider.tokens.rule == "azure"
    only = sim.resolve_strategies(scenario, only=["oracle"])
    result = sim.simulate(scenario, strategies=only)
    (oracle,) = result.strategies
    assert oracle.failed == 0
    assert oracle.count_429 == 0
    assert result.bound.binding == "tokens"
    assert result.bound.seconds <= oracle.makespan_s
