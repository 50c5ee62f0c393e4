"""The simulated provider enforces each of its rules, one at a time, on a virtual clock.

Every test switches on a single rule (concurrency, RPM, burst slope, outage) with the
others off, so a failure points at that rule. Reject latency is zero and service times are
constants, so the assertions are exact.
"""

from __future__ import annotations

import random
from typing import Any

import anyio
import pytest

import anygate
from anygate.sim._provider import ProviderError, ProviderModel
from anygate.sim._spec import BurstRule, Lognormal, Outage, ProviderSpec, SharedPool
from tests.conftest import mock_clock

pytest.importorskip("trio")

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", [mock_clock()])]

_INSTANT = Lognormal(median_s=0.0)


def _provider(**kwargs: Any) -> ProviderModel:
    spec = ProviderSpec(reject_latency=_INSTANT, **kwargs)
    return ProviderModel(spec, random.Random(0), epoch=anyio.current_time())


async def _outcome(provider: ProviderModel, service_s: float = 1.0) -> str:
    """Serve one request; return ``"ok"`` or the rejection kind."""
    try:
        await provider.serve(service_s)
    except ProviderError as exc:
        return exc.kind
    return "ok"


async def _burst_of(provider: ProviderModel, count: int, service_s: float = 1.0) -> list[str]:
    """Send ``count`` requests at the same virtual instant, in order; their outcomes."""
    outcomes: list[str] = [""] * count

    async def one(i: int) -> None:
        outcomes[i] = await _outcome(provider, service_s)

    async with anyio.create_task_group() as tg:
        for i in range(count):
            tg.start_soon(one, i)
            await anyio.wait_all_tasks_blocked()  # arrival order = index order
    return outcomes


async def test_concurrency_rejects_beyond_slots(anyio_backend: Any) -> None:
    """With on_full=reject, requests beyond the free slots get 429 'concurrency' at once."""
    provider = _provider(slots=2)
    assert await _burst_of(provider, 3) == ["ok", "ok", "concurrency"]
    assert provider.trace.max_in_service == 2
    # Once the first two are done, slots are free again.
    assert await _burst_of(provider, 2) == ["ok", "ok"]


async def test_concurrency_queue_serves_fifo_and_bounds_the_queue(anyio_backend: Any) -> None:
    """With on_full=queue, excess requests wait in order; beyond max_queue they get 503."""
    provider = _provider(slots=1, on_full="queue", max_queue=2)
    start = anyio.current_time()
    finished: list[tuple[int, float]] = []

    async def one(i: int) -> None:
        outcome = await _outcome(provider, 1.0)
        finished.append((i, anyio.current_time() - start) if outcome == "ok" else (i, -1.0))

    async with anyio.create_task_group() as tg:
        for i in range(4):
            tg.start_soon(one, i)
            await anyio.wait_all_tasks_blocked()
    assert sorted(finished) == [(0, 1.0), (1, 2.0), (2, 3.0), (3, -1.0)]
    assert provider.trace.counts["queue_full"] == 1
    assert provider.trace.max_in_service == 1


async def test_rpm_limits_a_sliding_minute(anyio_backend: Any) -> None:
    """At most ``rpm`` admissions per sliding 60 s; the next is 429 'rpm' until one expires."""
    provider = _provider(slots=100, rpm=3, retry_after="auto")
    start = anyio.current_time()
    assert await _burst_of(provider, 4) == ["ok", "ok", "ok", "rpm"]
    # A rejected request does not count: 59 s after the first admissions it is still full...
    await anyio.sleep_until(start + 59.0)
    with pytest.raises(ProviderError) as info:
        await provider.serve(1.0)
    assert info.value.kind == "rpm"
    assert info.value.status_code == 429
    # ... and Retry-After says exactly when the oldest admission leaves the window.
    assert info.value.retry_after == pytest.approx(1.0)
    assert info.value.response.headers["retry-after-ms"] == "1000"
    await anyio.sleep_until(start + 60.0)
    assert await _burst_of(provider, 4) == ["ok", "ok", "ok", "rpm"]


async def test_burst_slope_limits_growth_per_window(anyio_backend: Any) -> None:
    """Window k admits max(floor, growth * admitted in window k-1); excess is limit_burst_rate."""
    provider = _provider(slots=100, burst=BurstRule(window_s=10.0, growth=2.0, floor=2))
    start = anyio.current_time()
    assert await _burst_of(provider, 3, 0.1) == ["ok", "ok", "burst"]
    await anyio.sleep_until(start + 10.0)
    assert await _burst_of(provider, 5, 0.1) == ["ok"] * 4 + ["burst"]
    await anyio.sleep_until(start + 20.0)
    assert await _burst_of(provider, 9, 0.1) == ["ok"] * 8 + ["burst"]
    # A quiet window resets the allowance to the floor.
    await anyio.sleep_until(start + 40.0)
    assert await _burst_of(provider, 3, 0.1) == ["ok", "ok", "burst"]
    assert provider.trace.counts["burst"] == 4


async def test_burst_rejection_is_classified_as_burst_rate(anyio_backend: Any) -> None:
    """anygate.classify recognises the simulated 429 as burst_rate, the others as transient/busy."""
    provider = _provider(slots=1, burst=BurstRule(window_s=10.0, growth=2.0, floor=1))
    errors: dict[str, ProviderError] = {}

    async def collect() -> None:
        try:
            await provider.serve(1.0)
        except ProviderError as exc:
            errors[exc.kind] = exc

    async with anyio.create_task_group() as tg:
        tg.start_soon(collect)
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(collect)
    verdict = anygate.classify(errors["burst"])
    assert verdict.reason == "burst_rate"
    assert verdict.retriable
    assert verdict.status == 429
    for kind in ("rpm", "concurrency", "overloaded", "queue_full"):
        other = anygate.classify(ProviderError(kind))
        assert other.reason in ("transient", "busy"), kind
        assert other.retriable, kind


async def test_outage_answers_503_then_recovers(anyio_backend: Any) -> None:
    """Inside an outage window every new request gets 503 'overloaded'; afterwards it is served."""
    provider = _provider(slots=4, outages=(Outage(start_s=5.0, end_s=8.0),))
    start = anyio.current_time()
    assert await _outcome(provider) == "ok"
    await anyio.sleep_until(start + 5.0)
    with pytest.raises(ProviderError) as info:
        await provider.serve(1.0)
    assert (info.value.kind, info.value.status_code) == ("overloaded", 503)
    await anyio.sleep_until(start + 8.0)
    assert await _outcome(provider) == "ok"


async def test_fixed_retry_after_is_sent_on_429s(anyio_backend: Any) -> None:
    """A numeric retry_after is sent in milliseconds and in whole seconds rounded up, as
    real providers do; without one there is none."""
    provider = _provider(slots=1, retry_after=2.5)
    outcomes = await _burst_of(provider, 2)
    assert outcomes == ["ok", "concurrency"]
    exc = ProviderError("concurrency", 2.5)
    assert exc.response.headers == {"retry-after-ms": "2500", "retry-after": "3"}
    assert ProviderError("burst").response.headers == {}


async def test_service_time_and_trace(anyio_backend: Any) -> None:
    """An admitted request holds its slot for exactly its service time; the trace records it."""
    provider = _provider(slots=1)
    start = anyio.current_time()
    await provider.serve(2.5)
    assert anyio.current_time() - start == pytest.approx(2.5)
    assert provider.trace.in_service == [(0.0, 0), (0.0, 1), (pytest.approx(2.5), 0)]
    assert provider.trace.counts["ok"] == 1


async def test_count_rejected_arrivals_raise_the_next_window(anyio_backend: Any) -> None:
    """Floor 2, growth 1, 10 s windows, 5 arrivals in window 0: 2 admitted, 3 throttled.
    Counting admissions, window 1 allows max(2, 1 * 2) = 2; counting arrivals, 5."""
    for count_rejected, allowed in ((False, 2), (True, 5)):
        rule = BurstRule(window_s=10, growth=1.0, floor=2, count_rejected=count_rejected)
        provider = _provider(slots=100, burst=rule)
        first = [await _outcome(provider, 0.01) for _ in range(5)]
        assert first == ["ok", "ok", "burst", "burst", "burst"]
        await anyio.sleep(10.0)
        second = [await _outcome(provider, 0.01) for _ in range(6)]
        assert second.count("ok") == allowed, count_rejected


async def test_a_shared_pool_turns_a_random_share_away_counting_toward_nothing(
    anyio_backend: Any,
) -> None:
    """10 % of 2,000 arrivals, one at a time, get the pool's answer (its kind, no
    Retry-After, marked for the oracle); the others are served, and the burst rule (floor
    2,000 per window) counts only those admitted."""
    rule = BurstRule(window_s=1000.0, growth=2.0, floor=2000)
    pool = SharedPool(probability=0.1, kind="rpm")
    spec = ProviderSpec(reject_latency=_INSTANT, slots=10, burst=rule, shared_pool=pool)
    provider = ProviderModel(
        spec, random.Random(0), epoch=anyio.current_time(), pool_rng=random.Random(5)
    )
    errors: list[ProviderError] = []
    for _ in range(2000):
        error = await _error_of(provider)
        if error is not None:
            errors.append(error)
    assert {(e.kind, e.status_code, e.retry_after) for e in errors} == {("rpm", 429, None)}
    assert all(provider.turned_away_at_random(e) for e in errors)
    turned_away = len(errors)
    assert 160 <= turned_away <= 240  # 200 expected
    assert provider.trace.counts["rpm"] == turned_away
    assert provider.trace.counts["ok"] == 2000 - turned_away
    assert provider.trace.counts["burst"] == 0  # 2,000 arrivals, but fewer admitted
    # A rejection by a rule is no random one.
    outage = _provider(outages=(Outage(start_s=0.0, end_s=10.0),))
    with pytest.raises(ProviderError) as info:
        await outage.serve(1.0)
    assert not outage.turned_away_at_random(info.value)


async def _error_of(provider: ProviderModel) -> ProviderError | None:
    """Serve one instant request; the provider's error, if it turned it away."""
    try:
        await provider.serve(0.0)
    except ProviderError as exc:
        return exc
    return None


async def test_admission_wait_after_an_outage_never_idles_an_allowed_window(
    anyio_backend: Any,
) -> None:
    """The oracle's view agrees with the rules after a quiet window: 2 admitted in window 0
    (floor 2), then an outage until 30 s. At 30 s (window 3, window 2 empty) the floor
    allows 2 again, so admission_wait says 0 and the request is served; issue 29's oracle
    read window 0's count before the roll and waited until 40 s."""
    rule = BurstRule(window_s=10.0, growth=2.0, floor=2)
    provider = _provider(slots=10, burst=rule, outages=(Outage(start_s=5.0, end_s=30.0),))
    start = anyio.current_time()
    assert await _burst_of(provider, 2, 0.1) == ["ok", "ok"]
    assert provider.admission_wait() == pytest.approx(10.0 - 0.1)
    # A microsecond past: the provider reads (start + 30) - start, which is 30 less an ulp
    # at some absolute times, and the tests of this module share one MockClock.
    await anyio.sleep_until(start + 30.0 + 1e-6)
    assert provider.admission_wait() == 0.0
    assert await _burst_of(provider, 3, 0.1) == ["ok", "ok", "burst"]
    assert provider.admission_wait() == pytest.approx(10.0 - 0.1)


async def test_an_answer_starts_a_first_byte_time_after_its_slot(anyio_backend: Any) -> None:
    """``on_headers`` hears status 200 and the answer's headers a reject-latency draw after
    the slot was taken (0.25 s here), while the request itself still ends at its service
    time; a rejection never calls it."""
    spec = ProviderSpec(reject_latency=Lognormal(median_s=0.25), slots=1, headers="openai", rpm=100)
    provider = ProviderModel(spec, random.Random(0), epoch=anyio.current_time())
    start = anyio.current_time()
    heard: list[tuple[float, int, dict[str, str]]] = []

    def on_headers(status: int, headers: dict[str, str]) -> None:
        heard.append((anyio.current_time() - start, status, headers))

    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: provider.serve(2.0, on_headers=on_headers))
        await anyio.wait_all_tasks_blocked()
        with pytest.raises(ProviderError):  # the slot is taken: no answer starts
            await provider.serve(1.0, on_headers=on_headers)
    # approx: a difference of clock readings is exact only from 0, and the clock may have
    # jumped before ``start`` was read (this failed under -n 2, on unchanged code).
    assert anyio.current_time() - start == pytest.approx(2.0)
    ((when, status, headers),) = heard
    assert (when, status) == (pytest.approx(0.25), 200)
    assert headers["x-ratelimit-limit-requests"] == "100"


async def test_the_first_byte_draws_touch_no_other_stream(anyio_backend: Any) -> None:
    """Times to first byte come from their own stream: the reject latencies a provider
    draws are the same whether or not a client asks when its answers start, so strategies
    that do not ask see exactly what they saw before the option existed."""

    async def latencies(ask: bool) -> list[float]:
        spec = ProviderSpec(reject_latency=Lognormal(median_s=0.1, sigma=0.5), slots=1)
        provider = ProviderModel(spec, random.Random(7), epoch=anyio.current_time())
        seen: list[float] = []
        for _ in range(3):
            async with anyio.create_task_group() as tg:
                tg.start_soon(
                    lambda: provider.serve(1.0, on_headers=(lambda s, h: None) if ask else None)
                )
                await anyio.wait_all_tasks_blocked()
                started = anyio.current_time()
                with pytest.raises(ProviderError):
                    await provider.serve(1.0)
                seen.append(anyio.current_time() - started)
        return seen

    # Equal draws; measured as differences of absolute virtual times, so up to float noise.
    assert await latencies(ask=True) == pytest.approx(await latencies(ask=False), abs=1e-9)
