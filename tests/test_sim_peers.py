"""The built-in peers retry exactly as their sources do (numbers worked out by hand).

Each pure delay function is checked against values computed by hand from the formula in
the peer's source, with the random draws pinned; then each client's whole retry loop runs
against an always-rejecting ``send`` on trio's virtual clock, and the instants of its
requests must be exactly the hand-computed sums of those delays.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from anygate.sim import CallLost, Published, Request, StrategyContext
from anygate.sim._peer_delays import (
    cookbook_wait,
    litellm_retry_delay,
    openai_retry_delay,
    openai_should_retry,
    stamina_backoff,
)
from anygate.sim._peers import PEERS, Cookbook, LiteLLM, Sdk, Stamina
from anygate.sim._provider import ProviderError, ProviderResponse
from tests.conftest import mock_clock

pytest.importorskip("trio")


class Pinned:
    """A stand-in for ``random.Random`` that returns the given ``random()`` values in turn.

    ``uniform(a, b)`` is ``a + (b - a) * random()``, exactly as CPython's.
    """

    def __init__(self, *values: float) -> None:
        self.values = list(values)
        self.drawn = 0

    def random(self) -> float:
        self.drawn += 1
        return self.values.pop(0)

    def uniform(self, a: float, b: float) -> float:
        return a + (b - a) * self.random()


# ---------------------------------------------------------------------- pure formulas


def test_openai_delay_is_half_second_doubling_capped_at_8_with_quarter_jitter() -> None:
    """min(0.5 * 2**n, 8) * (1 - 0.25 U): 0.5*(1-0.1)=0.45; 1.0; 8*(1-0.25)=6.0 at n=5."""
    assert openai_retry_delay(0, {}, Pinned(0.4)) == pytest.approx(0.45)
    assert openai_retry_delay(1, {}, Pinned(0.0)) == pytest.approx(1.0)
    assert openai_retry_delay(5, {}, Pinned(1.0)) == pytest.approx(6.0)


def test_openai_honours_retry_after_up_to_two_minutes_and_draws_nothing() -> None:
    """Retry-After in (0, 120] is used as is (ms header first); no jitter is drawn then."""
    rng = Pinned()
    assert openai_retry_delay(0, {"retry-after-ms": "2500", "retry-after": "9"}, rng) == 2.5
    assert openai_retry_delay(1, {"retry-after": "120"}, rng) == 120.0
    assert rng.drawn == 0
    # Above 120 s the header is ignored for the delay, and the SDK does not retry at all.
    assert openai_retry_delay(0, {"retry-after": "121"}, Pinned(0.0)) == 0.5
    assert not openai_should_retry(429, {"retry-after": "121"})


def test_openai_should_retry_statuses_and_header() -> None:
    """408/409/429/>=500 retry, 400/404 do not; x-should-retry overrides both ways."""
    assert all(openai_should_retry(s, {}) for s in (408, 409, 429, 500, 503))
    assert not any(openai_should_retry(s, {}) for s in (400, 401, 404, 422))
    assert not openai_should_retry(503, {"x-should-retry": "false"})
    assert openai_should_retry(400, {"x-should-retry": "true"})


def test_tenacity_wait_random_exponential_min_1_max_60() -> None:
    """uniform(1, max(1, min(2**(n-1), 60))): 1 after attempt 1; 1+3*0.5=2.5 after 3;
    after 8 the window is capped: 1 + 59 * 0.5 = 30.5."""
    assert cookbook_wait(1, Pinned(0.9)) == 1.0
    assert cookbook_wait(2, Pinned(0.25)) == pytest.approx(1.25)
    assert cookbook_wait(3, Pinned(0.5)) == pytest.approx(2.5)
    assert cookbook_wait(5, Pinned(1.0)) == pytest.approx(16.0)
    assert cookbook_wait(8, Pinned(0.5)) == pytest.approx(30.5)


def test_stamina_backoff_defaults() -> None:
    """min(5, 0.1 * 2**(n-1) + U(0, 1)): 0.6, 0.7, 0.9 for U=0.5; n=6: 3.7; n=7: capped 5."""
    assert stamina_backoff(1, Pinned(0.5)) == pytest.approx(0.6)
    assert stamina_backoff(2, Pinned(0.5)) == pytest.approx(0.7)
    assert stamina_backoff(3, Pinned(0.5)) == pytest.approx(0.9)
    assert stamina_backoff(6, Pinned(0.5)) == pytest.approx(3.7)
    assert stamina_backoff(7, Pinned(0.5)) == 5.0


def test_litellm_delay_and_its_integer_retry_after() -> None:
    """0.5*2**n (max 8) + 0.75 U: 0.5+0.3, 1+0.3, 8+0.75; int Retry-After <= 60 plus
    jitter; a fractional header fails int() and falls back to the backoff."""
    assert litellm_retry_delay(0, {}, Pinned(0.4)) == pytest.approx(0.8)
    assert litellm_retry_delay(1, {}, Pinned(0.4)) == pytest.approx(1.3)
    assert litellm_retry_delay(6, {}, Pinned(1.0)) == pytest.approx(8.75)
    assert litellm_retry_delay(0, {"retry-after": "3"}, Pinned(0.0)) == 3.0
    assert litellm_retry_delay(0, {"retry-after": "61"}, Pinned(0.0)) == 0.5
    assert litellm_retry_delay(0, {"retry-after": "2.500"}, Pinned(0.0)) == 0.5


def test_each_peer_reads_the_retry_after_the_provider_sends() -> None:
    """The provider's Retry-After of 2.5 s goes out as ``retry-after-ms: 2500`` and
    ``retry-after: 3``, as real providers send it. openai-python reads the milliseconds
    first (2.5 s); LiteLLM's int() parse reads the integer seconds (3 s plus its jitter).
    Issue 29: the old "2.500" failed int(), so LiteLLM never honoured Retry-After."""
    headers = ProviderError("rpm", 2.5).response.headers
    assert openai_retry_delay(0, headers, Pinned()) == 2.5
    assert litellm_retry_delay(0, headers, Pinned(0.0)) == 3.0
    assert litellm_retry_delay(2, headers, Pinned(1.0)) == 3.75
    # Below a second the header says 1 (never 0, which LiteLLM would not honour).
    small = ProviderError("rpm", 0.2).response.headers
    assert (small["retry-after"], small["retry-after-ms"]) == ("1", "200")
    assert openai_retry_delay(0, small, Pinned()) == pytest.approx(0.2)
    assert litellm_retry_delay(0, small, Pinned(0.0)) == 1.0


# ---------------------------------------------------------------------- loops on a clock


def _context() -> StrategyContext:
    return StrategyContext(name="t", published=Published(), seed=1)


async def _instants(client: Any) -> list[float]:
    """Run one call against a provider that rejects everything at once; request times."""
    start = anyio.current_time()
    times: list[float] = []

    async def send() -> None:
        times.append(anyio.current_time() - start)
        raise ProviderError("burst")

    with pytest.raises(CallLost) as info:
        await client.call(send)
    assert info.value.cause == "gave_up"
    return times


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", [mock_clock()])
async def test_sdk_sends_three_requests_at_the_formula_instants(anyio_backend: Any) -> None:
    """max_retries=2: requests at 0, 0.45 (U=0.4) and 0.45 + 1*(1-0.25*0.8) = 1.25."""
    client = Sdk(_context())
    client._rng = Pinned(0.4, 0.8)  # type: ignore[assignment]
    assert await _instants(client) == pytest.approx([0.0, 0.45, 1.25])


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", [mock_clock()])
async def test_cookbook_runs_six_sdk_calls_with_tenacity_waits(anyio_backend: Any) -> None:
    """Six tenacity attempts x three SDK requests; SDK U=0 gives 0.5 and 1.0 s inside each
    attempt (1.5 s per attempt), tenacity U=0.5 waits 1, 1.5, 2.5, 4.5, 8.5 between them."""
    client = Cookbook(_context())
    client._sdk_rng = Pinned(*[0.0] * 12)  # type: ignore[assignment]
    client._rng = Pinned(*[0.5] * 6)  # type: ignore[assignment]
    times = await _instants(client)
    expected, t = [], 0.0
    for wait in (1.0, 1.5, 2.5, 4.5, 8.5, None):
        expected += [t, t + 0.5, t + 1.5]
        t += 1.5 + (wait or 0.0)
    assert times == pytest.approx(expected)
    assert len(times) == 18


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", [mock_clock()])
async def test_stamina_stops_at_ten_attempts(anyio_backend: Any) -> None:
    """SDK U=0 (1.5 s per attempt) and stamina U=0: waits 0.1, 0.2, 0.4, 0.8, 1.6, 3.2,
    5, 5, 5 s; the tenth attempt starts at 35.8 s (< 45 s), so 10 attempts stop it."""
    client = Stamina(_context())
    client._sdk_rng = Pinned(*[0.0] * 20)  # type: ignore[assignment]
    client._rng = Pinned(*[0.0] * 10)  # type: ignore[assignment]
    times = await _instants(client)
    starts = times[::3]
    assert len(times) == 30
    assert starts[-1] == pytest.approx(9 * 1.5 + 0.1 + 0.2 + 0.4 + 0.8 + 1.6 + 3.2 + 15)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", [mock_clock()])
async def test_stamina_stops_after_45_seconds(anyio_backend: Any) -> None:
    """Rejections that take 10 s each make one SDK call last 10+0.5+10+1+10 = 31.5 s (U=0).
    The first attempt ends at 31.5 s (< 45: wait 0.1 s), the second ends at 63.1 s (>= 45
    since the first start): stamina stops after 2 attempts, 6 requests."""
    client = Stamina(_context())
    client._sdk_rng = Pinned(*[0.0] * 4)  # type: ignore[assignment]
    client._rng = Pinned(0.0, 0.0)  # type: ignore[assignment]
    start = anyio.current_time()
    times: list[float] = []

    async def slow_reject() -> None:
        times.append(anyio.current_time() - start)
        await anyio.sleep(10)
        raise ProviderError("burst")

    with pytest.raises(CallLost):
        await client.call(slow_reject)
    assert times == pytest.approx([0.0, 10.5, 21.5, 31.6, 42.1, 53.1])
    assert anyio.current_time() - start == pytest.approx(63.1)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", [mock_clock()])
async def test_litellm_router_retries_twice_and_sleeps_after_the_last(anyio_backend: Any) -> None:
    """Requests at 0, 0.8 (0.5 + 0.75*0.4) and 0.8 + 1.3; then one more sleep of 2.3 s
    (exponent 2) before the error surfaces, as the Router's loop does."""
    client = LiteLLM(_context())
    client._rng = Pinned(0.4, 0.4, 0.4)  # type: ignore[assignment]
    start = anyio.current_time()
    assert await _instants(client) == pytest.approx([0.0, 0.8, 2.1])
    assert anyio.current_time() - start == pytest.approx(2.1 + 2.3)


async def _to_next_minute() -> float:
    """Sleep to the next whole virtual minute (LiteLLM's counters are per UTC minute)."""
    await anyio.sleep(60.0 - anyio.current_time() % 60.0)
    return anyio.current_time()


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", [mock_clock()])
async def test_litellm_limits_rejects_over_the_minutes_rpm_at_once(anyio_backend: Any) -> None:
    """rpm=2 (the published RPM): the third first attempt of a calendar minute never reaches
    the provider and the call is lost at once (num_retries=0: no sleep); the next minute
    counts afresh."""
    context = StrategyContext(name="t", published=Published(rpm=2), seed=1)
    client = PEERS["litellm+limits"](context)  # type: ignore[operator]
    start = await _to_next_minute()
    sent: list[float] = []

    async def ok() -> ProviderResponse:
        sent.append(anyio.current_time() - start)
        return ProviderResponse({}, 0, 0)

    await client.call(ok)
    await anyio.sleep(30)
    await client.call(ok)
    await anyio.sleep(29)
    with pytest.raises(CallLost) as info:
        await client.call(ok)
    assert info.value.cause == "model_rate_limit"
    assert anyio.current_time() - start == 59  # lost without waiting
    await anyio.sleep(1)  # a new minute, not 60 s after the first request
    await client.call(ok)
    assert sent == [0, 30, 60]
    assert "enforce_model_rate_limits" in client.summary


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", [mock_clock()])
async def test_litellm_limits_counts_tokens_at_success_and_never_checks_a_requests_size(
    anyio_backend: Any,
) -> None:
    """tpm=1000: a 1,500-token call goes (the check reads only the minute's count, 0);
    once its usage is logged every attempt of that minute is rejected (1500 >= 1000)."""
    context = StrategyContext(name="t", published=Published(tpm=1000), seed=1)
    client = PEERS["litellm+limits"](context)  # type: ignore[operator]
    await _to_next_minute()
    calls = 0

    async def big() -> ProviderResponse:
        nonlocal calls
        calls += 1
        return ProviderResponse({}, 1400, 100)

    await client.call(Request(big, prompt_tokens=1400, max_tokens=200))
    with pytest.raises(CallLost):
        await client.call(big)
    assert calls == 1
    await _to_next_minute()
    await client.call(big)
    assert calls == 2


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", [mock_clock()])
async def test_litellm_limits_rejected_retries_count_and_sleep_like_failures(
    anyio_backend: Any,
) -> None:
    """rpm=2: the provider rejects the first attempt (a 429 with no header), the first
    retry passes the check (count 2) and fails at the provider, the second is rejected by
    the check (count 3) and costs a sleep like any failure: requests at 0 and 0.8 only,
    the error after 0.8 + 1.3 + 2.3 s."""
    context = StrategyContext(name="t", published=Published(rpm=2), seed=1)
    client = PEERS["litellm+limits"](context)  # type: ignore[operator]
    client._rng = Pinned(0.4, 0.4, 0.4)
    start = await _to_next_minute()
    times: list[float] = []

    async def reject() -> None:
        times.append(anyio.current_time() - start)
        raise ProviderError("burst")

    with pytest.raises(CallLost) as info:
        await client.call(reject)
    assert info.value.cause == "gave_up"
    assert times == pytest.approx([0.0, 0.8])
    assert anyio.current_time() - start == pytest.approx(0.8 + 1.3 + 2.3)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", [mock_clock()])
async def test_capped_peer_holds_its_permit_through_the_backoff(anyio_backend: Any) -> None:
    """sdk+cap with a published concurrency of 1: a second call starts only after the
    first has used all its retries (1.25 s with the draws above), not during its sleeps."""
    context = StrategyContext(name="t", published=Published(concurrency=1), seed=1)
    client = PEERS["sdk+cap"](context)  # type: ignore[operator]
    client._inner._rng = Pinned(0.4, 0.8, 0.4, 0.8)
    starts: list[float] = []

    async def one() -> None:
        async def send() -> None:
            starts.append(anyio.current_time())
            raise ProviderError("burst")

        with pytest.raises(CallLost):
            await client.call(send)

    begin = anyio.current_time()
    async with anyio.create_task_group() as tg:
        tg.start_soon(one)
        tg.start_soon(one)
    assert [t - begin for t in starts] == pytest.approx([0, 0.45, 1.25, 1.25, 1.7, 2.5])
    assert "semaphore cap 1" in client.summary


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", [mock_clock()])
async def test_cookbook_parallel_spends_half_the_published_budget_refilled_continuously(
    anyio_backend: Any,
) -> None:
    """api_request_parallel_processor at 50 % of 4 RPM: 2 requests at once (the budget
    starts full), then one every 30 s; with 1,200 TPM (600 at 50 %), a 500-token request
    after a 500-token one waits until 500 are there again (400 to refill at 10 a second:
    40 s)."""
    context = StrategyContext(name="t", published=Published(rpm=4), seed=1)
    client = PEERS["cookbook-parallel"](context)  # type: ignore[operator]
    start = anyio.current_time()
    times: list[float] = []

    async def ok() -> None:
        times.append(anyio.current_time() - start)

    for _ in range(4):
        await client.call(ok)
    assert times == [0.0, 0.0, pytest.approx(30.0), pytest.approx(60.0)]
    context = StrategyContext(name="t", published=Published(rpm=6000, tpm=1200), seed=1)
    client = PEERS["cookbook-parallel"](context)  # type: ignore[operator]
    times.clear()
    start = anyio.current_time()
    for _ in range(2):
        await client.call(Request(ok, prompt_tokens=400, max_tokens=100))
    assert times == [0.0, pytest.approx(40.0)]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", [mock_clock()])
async def test_cookbook_parallel_pauses_15_s_after_a_rate_limit_message_only(
    anyio_backend: Any,
) -> None:
    """Every attempt after an error whose message says "Rate limit" waits 15 s; 5 attempts
    in all. A plain 429 says nothing of a rate limit, so the script retries at once."""
    from anygate.sim._answers import answer

    async def instants(plain: bool) -> list[float]:
        context = StrategyContext(name="t", published=Published(rpm=6000), seed=1)
        client = PEERS["cookbook-parallel"](context)  # type: ignore[operator]
        start = anyio.current_time()
        times: list[float] = []

        async def reject() -> None:
            times.append(anyio.current_time() - start)
            raise ProviderError("rpm", said=answer("rpm", plain=plain))

        with pytest.raises(CallLost):
            await client.call(reject)
        return times

    assert await instants(plain=False) == [pytest.approx(t) for t in (0, 15, 30, 45, 60)]
    assert await instants(plain=True) == [0.0] * 5


def test_cookbook_parallel_budget_does_not_spin_on_float_dust() -> None:
    """After sleeping the computed time, float rounding can leave a shortfall far below
    what the clock can advance by; the budget counts that as enough (a 20-agent run of
    the TPM scenario spun forever at one instant before)."""
    from anygate.sim._processor import _Budget

    budget = _Budget(100_000.0)
    budget.refill(0.0)
    budget.available = 2_999.999_999_9
    assert budget.wait(3_000.0) == 0.0
    budget.available = 2_000.0
    assert budget.wait(3_000.0) == pytest.approx(0.6)
