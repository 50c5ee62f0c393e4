"""Token-limited providers: buckets with continuous refill, sizes, headers and wording.

The provider's token rules one at a time on a virtual clock (reject latency 0, constant
service times, so every number is exact), the headers it sends read back by the library's
own parser, and the workload's token sizes drawn without moving anything else.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import replace
from typing import Any

import anyio
import pytest

import anygate
from anygate import ConfigError, sim
from anygate.sim._answers import go_duration, rfc3339
from anygate.sim._buckets import Bucket
from anygate.sim._policy_strategy import published_facts
from anygate.sim._provider import ProviderError, ProviderModel, ProviderResponse
from anygate.sim._scenarios import scenario_mapping
from anygate.sim._spec import Lognormal, Outage, ProviderSpec, TokenLimits
from anygate.sim._workload import build_workload
from tests.conftest import mock_clock

pytest.importorskip("trio")
pytest.importorskip("yaml")

_INSTANT = Lognormal(median_s=0.0)
_clocked = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", [mock_clock()])]


def _provider(**kwargs: Any) -> ProviderModel:
    spec = ProviderSpec(reject_latency=_INSTANT, retry_after="auto", **kwargs)
    return ProviderModel(spec, random.Random(0), epoch=anyio.current_time())


async def _send(
    provider: ProviderModel, prompt: int, max_tokens: int, completion: int = 1, service: float = 0.0
) -> ProviderResponse | ProviderError:
    try:
        return await provider.serve(service, prompt, max_tokens, completion)
    except ProviderError as exc:
        return exc


def test_bucket_refills_continuously_and_never_past_its_capacity() -> None:
    """60 per minute = 1 per second: drained at 0, 0.5 back at 0.5 s, a cost of 3 waits
    2.5 s more, and after ten minutes it holds its capacity (60), not more."""
    bucket = Bucket("tpm", "tokens", 60, 60.0)
    assert bucket.wait(60, 0.0) == 0.0
    bucket.take(60, 0.0)
    assert bucket.level(0.5) == pytest.approx(0.5)
    assert bucket.wait(3, 0.5) == pytest.approx(2.5)
    assert bucket.reset_s(0.5) == pytest.approx(59.5)
    assert bucket.level(600.0) == 60.0
    assert bucket.wait(61, 600.0) == float("inf")
    # A quantized bucket (capacity_s 1) holds one second's refill.
    assert Bucket("tpm", "tokens", 6000, 1.0).capacity == 100.0


@pytest.mark.parametrize("anyio_backend", [mock_clock()])
@pytest.mark.anyio
async def test_tpm_charges_prompt_plus_max_tokens_and_retry_after_is_the_refill_time(
    anyio_backend: Any,
) -> None:
    """TPM 6,000 (100 tokens/s): two requests of 1,000 + 2,000 take the whole bucket; the
    third (100 + 200) is turned away with kind tpm and Retry-After 3 s (300 tokens at
    100/s); sent 3 s later it is admitted."""
    provider = _provider(slots=10, tokens=TokenLimits(tpm=6000))
    start = anyio.current_time()
    assert isinstance(await _send(provider, 1000, 2000), ProviderResponse)
    assert isinstance(await _send(provider, 1000, 2000), ProviderResponse)
    error = await _send(provider, 100, 200)
    assert isinstance(error, ProviderError)
    assert (error.kind, error.status_code, error.code) == ("tpm", 429, "rate_limit_exceeded")
    assert error.retry_after == pytest.approx(3.0)
    assert error.response.headers["retry-after"] == "3"
    assert "on tokens per min (TPM): Limit 6000, Used 6000, Requested 300." in error.message
    assert anygate.classify(error).reason == "transient"
    await anyio.sleep_until(start + 3.0)
    assert isinstance(await _send(provider, 100, 200), ProviderResponse)


@pytest.mark.parametrize("anyio_backend", [mock_clock()])
@pytest.mark.anyio
async def test_output_tokens_are_settled_to_the_completion_at_the_end(anyio_backend: Any) -> None:
    """OTPM 600 (10/s): a request with max_tokens 600 takes the bucket at admission; while
    it is served a second is turned away (kind otpm); when it ends with a completion of 100
    tokens, 500 come back and a request of max_tokens 500 is admitted at once."""
    provider = _provider(slots=10, tokens=TokenLimits(otpm=600, itpm=10_000))
    start = anyio.current_time()
    async with anyio.create_task_group() as tg:
        tg.start_soon(_send, provider, 10, 600, 100, 10.0)
        await anyio.wait_all_tasks_blocked()
        second = await _send(provider, 10, 100)
        assert isinstance(second, ProviderError)
        assert second.kind == "otpm"
    assert anyio.current_time() - start == pytest.approx(10.0)
    # 10 s of refill (100) plus the 500 settled: 600, the capacity.
    assert isinstance(await _send(provider, 10, 600), ProviderResponse)


@pytest.mark.parametrize("anyio_backend", [mock_clock()])
@pytest.mark.anyio
async def test_charge_rejected_spends_a_request_on_a_token_rejection(anyio_backend: Any) -> None:
    """With charge_rejected, a request turned away by the token bucket still uses one of
    the 3 requests per minute; without, it does not."""
    for charged, expected in ((True, "rpm"), (False, "ok")):
        limits = TokenLimits(rpm=3, tpm=600, charge_rejected=charged)
        provider = _provider(slots=10, tokens=limits)
        assert isinstance(await _send(provider, 500, 100), ProviderResponse)
        assert isinstance(await _send(provider, 500, 100), ProviderError)  # tpm
        # The third request is small enough for what has refilled meanwhile? No: make the
        # token bucket irrelevant by asking for nothing.
        third = await _send(provider, 0, 0)
        assert isinstance(third, ProviderResponse) or third.kind == expected
        outcome = "ok" if isinstance(third, ProviderResponse) else third.kind
        fourth = await _send(provider, 0, 0)
        kind = "ok" if isinstance(fourth, ProviderResponse) else fourth.kind
        assert [outcome, kind] == (["ok", "rpm"] if charged else ["ok", "ok"]), charged


@pytest.mark.parametrize("anyio_backend", [mock_clock()])
@pytest.mark.anyio
async def test_openai_headers_round_trip_through_the_library_parser(anyio_backend: Any) -> None:
    """On a success and on a 429 the x-ratelimit-* headers say the limits, what remains
    and the time to full refill, and anygate.parse_limit_headers reads them back."""
    provider = _provider(slots=10, tokens=TokenLimits(rpm=600, tpm=60_000), headers="openai")
    ok = await _send(provider, 1000, 500)
    assert isinstance(ok, ProviderResponse)
    assert ok.headers["x-ratelimit-remaining-requests"] == "599"
    assert ok.headers["x-ratelimit-remaining-tokens"] == "58500"
    assert ok.headers["x-ratelimit-reset-requests"] == "100ms"
    assert ok.headers["x-ratelimit-reset-tokens"] == "1.5s"
    report = anygate.parse_limit_headers(ok.headers)
    assert report.source == "openai"
    assert report.requests == anygate.ReportedLimit(
        limit=600, remaining=599, reset_s=0.1, window_s=60.0
    )
    assert report.tokens == anygate.ReportedLimit(
        limit=60_000, remaining=58_500, reset_s=1.5, window_s=60.0
    )
    error = await _send(provider, 59_000, 1000)
    assert isinstance(error, ProviderError)
    again = anygate.parse_limit_headers(error.response.headers)
    assert again.tokens is not None
    assert again.tokens.remaining == 58_500
    assert error.response.headers["retry-after-ms"] == "1500"
    verdict = anygate.classify(error)
    assert verdict.retry_after == pytest.approx(1.5)


@pytest.mark.parametrize("anyio_backend", [mock_clock()])
@pytest.mark.anyio
async def test_anthropic_headers_round_trip_and_529_overloaded(anyio_backend: Any) -> None:
    """anthropic-ratelimit-* with RFC 3339 resets (relative to the Date header) and token
    counts rounded to the thousand read back as the limits; an outage is 529
    overloaded_error, which anygate classifies as busy."""
    limits = TokenLimits(rpm=50, itpm=30_000, otpm=8_000)
    provider = _provider(
        slots=10, tokens=limits, headers="anthropic", outages=(Outage(start_s=10, end_s=20),)
    )
    start = anyio.current_time()
    ok = await _send(provider, 2_400, 1_000, 200)
    assert isinstance(ok, ProviderResponse)
    headers = ok.headers
    assert headers["anthropic-ratelimit-input-tokens-remaining"] == "28000"  # 27,600
    assert headers["anthropic-ratelimit-output-tokens-remaining"] == "7000"
    assert headers["anthropic-ratelimit-tokens-remaining"] == "7000"  # the tighter
    assert headers["anthropic-ratelimit-requests-reset"] == "2026-01-01T00:00:02Z"  # 1.2 s
    report = anygate.parse_limit_headers(headers)
    assert report.source == "anthropic"
    assert report.requests is not None
    assert (report.requests.limit, report.requests.remaining) == (50, 49)
    assert report.requests.reset_s == 2.0  # whole seconds: the date is to the second
    assert report.input_tokens is not None
    assert report.input_tokens.limit == 30_000
    assert report.output_tokens is not None
    assert report.output_tokens.limit == 8_000
    await anyio.sleep_until(start + 10.0)
    down = await _send(provider, 10, 10)
    assert isinstance(down, ProviderError)
    assert (down.status_code, down.code) == (529, "overloaded_error")
    assert down.body == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "Overloaded"},
    }
    assert anygate.classify(down).reason == "busy"


@pytest.mark.parametrize("anyio_backend", [mock_clock()])
@pytest.mark.anyio
async def test_plain_429_names_no_limit(anyio_backend: Any) -> None:
    """With plain_429 a token, a request and a concurrency 429 all read 'Too Many Requests'
    with no code; anygate can then only call them transient."""
    limits = TokenLimits(rpm=60, tpm=1000)
    provider = _provider(slots=1, tokens=limits, plain_429=True)
    errors = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(_send, provider, 10, 10, 1, 5.0)
        await anyio.wait_all_tasks_blocked()
        errors.append(await _send(provider, 10, 10))  # concurrency
        errors.append(await _send(provider, 900, 100))  # tpm
    for error in errors:
        assert isinstance(error, ProviderError)
        assert (error.status_code, error.code, error.message) == (429, "", "Too Many Requests")
        assert error.body == {"error": {"message": "Too Many Requests"}}
        assert anygate.classify(error).reason == "transient"
    assert {e.kind for e in errors if isinstance(e, ProviderError)} == {"concurrency", "tpm"}


def test_go_duration_and_rfc3339_formats() -> None:
    """Go's Duration.String() forms OpenAI sends, rounded up to the millisecond; RFC 3339
    rounded up to the second from the simulator's epoch."""
    assert [go_duration(x) for x in (0, 0.0121, 1, 1.5, 59.9999, 360, 83.5, 3725)] == [
        "0s",
        "13ms",
        "1s",
        "1.5s",
        "1m0s",
        "6m0s",
        "1m23.5s",
        "1h2m5s",
    ]
    assert rfc3339(61.2) == "2026-01-01T00:01:02Z"


_TOKENS = {"prompt": {"median": 1000, "sigma": 0.5}, "max_tokens": 500}
_FLEET: dict[str, Any] = {
    "agents": 6,
    "calls_per_agent": 3,
    "think": {"median_s": 1.0, "sigma": 0.5},
    "fanout": {"after_call": 1, "subagents": 2, "calls": 2},
}


def test_token_sizes_move_nothing_else_in_the_workload() -> None:
    """Adding fleet.tokens draws sizes from their own stream: starts, service and think
    times are those of the same fleet without tokens, so existing results stay put."""
    plain = sim.load_scenario({"fleet": _FLEET})
    sized = sim.load_scenario({"fleet": {**_FLEET, "tokens": _TOKENS}})
    a = build_workload(plain.fleet, plain.provider, seed=3)
    b = build_workload(sized.fleet, sized.provider, seed=3)
    assert [a_.start_s for a_ in a.agents] == [b_.start_s for b_ in b.agents]
    assert [(c.service_s, c.think_s) for c in a.calls] == [
        (c.service_s, c.think_s) for c in b.calls
    ]
    assert all(c.prompt_tokens == 0 for c in a.calls)
    assert all(c.prompt_tokens > 0 and c.max_tokens == 500 for c in b.calls)
    assert all(1 <= c.completion_tokens <= 500 for c in b.calls)


def test_growing_chains_carry_their_conversation() -> None:
    """With grow, each later call of a chain sends the previous prompt and completion plus
    a new draw; a subagent starts its own conversation, and its lead's goes on after it."""
    sized = sim.load_scenario(
        {"fleet": {**_FLEET, "tokens": {**_TOKENS, "prompt": 1000, "grow": True}}}
    )
    workload = build_workload(sized.fleet, sized.provider, seed=3)
    agent = workload.agents[0]
    lead = [s for s in agent.steps if not hasattr(s, "chains")]
    (fan,) = [s for s in agent.steps if hasattr(s, "chains")]
    for before, after in itertools.pairwise(lead):
        assert after.prompt_tokens == before.prompt_tokens + before.completion_tokens + 1000
    for chain in fan.chains:
        assert chain[0].prompt_tokens == 1000
        assert chain[1].prompt_tokens == 1000 + chain[0].completion_tokens + 1000


def test_a_call_no_bucket_can_admit_is_refused_up_front() -> None:
    """A call costing more than a bucket holds would be retried forever: the scenario is
    refused, naming the bucket; token limits without call sizes are refused too."""
    scenario = sim.load_scenario(
        {"provider": {"tokens": {"tpm": 1000}}, "fleet": {**_FLEET, "tokens": _TOKENS}}
    )
    with pytest.raises(ConfigError, match=r"provider\.tokens\.tpm holds at most 1000"):
        sim.simulate(scenario)
    with pytest.raises(ConfigError, match=r"fleet\.tokens must be set"):
        sim.load_scenario({"provider": {"tokens": {"tpm": 1000}}})
    with pytest.raises(ConfigError, match=r"provider\.headers must be"):
        sim.load_scenario({"provider": {"headers": "azure"}})


def test_the_oracle_knows_the_buckets() -> None:
    """On a TPM-bound fleet the oracle is never turned away, loses nothing, and ends within
    10 % of the token-bucket bound (30 agents: the chains' think times leave
    some refill unused); tokens per second are reported beside the makespan."""
    scenario = sim.load_scenario("openai-tier1-tpm")
    fleet = replace(scenario.fleet, agents=30)
    scenario = replace(scenario, fleet=fleet)
    only = sim.resolve_strategies(scenario, only=["oracle"])
    result = sim.simulate(scenario, strategies=only)
    (oracle,) = result.strategies
    assert oracle.failed == 0
    assert oracle.count_429 == 0
    assert result.bound.binding == "tokens"
    assert result.bound.seconds <= oracle.makespan_s <= 1.10 * result.bound.seconds
    workload = build_workload(scenario.fleet, scenario.provider, seed=scenario.seed)
    served = sum(c.prompt_tokens + c.completion_tokens for c in workload.calls)
    assert oracle.tokens_per_s == pytest.approx(served / oracle.makespan_s)


def test_background_load_slows_the_refill_and_shows_only_in_the_headers() -> None:
    """Another service spending half the refill: the bucket refills at half the rate, the
    headers still report the full limit, and the oracle's makespan on a token-bound fleet
    grows accordingly (the bound follows)."""
    half = Bucket("tpm", "tokens", 60, 60.0, 0.5)
    half.take(60, 0.0)
    assert half.level(10.0) == pytest.approx(5.0)
    assert half.limit == 60
    base: dict[str, Any] = {
        "provider": {"slots": 50, "tokens": {"tpm": 60_000}, "latency": 1.0},
        "fleet": {"agents": 20, "calls_per_agent": 5, "tokens": _TOKENS},
    }
    busy = {**base, "provider": {**base["provider"], "tokens": {"tpm": 60_000, "background": 0.5}}}
    only = ["oracle"]
    quiet = sim.simulate(
        sim.load_scenario(base),
        strategies=sim.resolve_strategies(sim.load_scenario(base), only=only),
    )
    loaded = sim.simulate(
        sim.load_scenario(busy),
        strategies=sim.resolve_strategies(sim.load_scenario(busy), only=only),
    )
    assert quiet.strategies[0].failed == loaded.strategies[0].failed == 0
    assert loaded.strategies[0].count_429 == 0
    assert loaded.bound.seconds > 1.5 * quiet.bound.seconds
    assert loaded.strategies[0].makespan_s > 1.5 * quiet.strategies[0].makespan_s
    # Tight here: the buckets bind from start to end (float slack aside).
    assert loaded.strategies[0].makespan_s >= loaded.bound.seconds - 1e-6


def test_the_builtin_strategy_paces_published_itpm_and_otpm() -> None:
    """Published ITPM / OTPM become the gate's input- and output-token budgets (issue 30):
    on an Anthropic-like provider with 2,000-token prompts against 50,000 ITPM the
    built-in strategy loses nothing and no call sees an input- or output-token 429
    (before, with only requests paced, 8 % of calls did)."""
    base, _ = scenario_mapping("openai-tier1-tpm")
    limits = {"rpm": 80, "itpm": 50000, "otpm": 12000}
    data = {
        **base,
        "seed": 1,
        "provider": {**base["provider"], "tokens": limits, "headers": "anthropic"},
        "published": limits,
        "fleet": {**base["fleet"], "agents": 40},
    }
    spec = next(s for s in sim.resolve_strategies(sim.load_scenario(data)) if s.name == "anygate")
    facts = published_facts(spec, sim.Published(**limits))
    assert facts["input_tokens_per_minute"] == 50000
    assert facts["output_tokens_per_minute"] == 12000
    assert "tokens_per_minute" not in facts
    scenario = sim.load_scenario(data)
    result = sim.simulate(scenario, strategies=sim.resolve_strategies(scenario, only=["anygate"]))
    (anygate_run,) = result.strategies
    assert anygate_run.failed == 0, (anygate_run.responses, anygate_run.lost)
    assert anygate_run.count_429 <= 2
