"""Rate pacing: after a per-minute 429 that says nothing of what it counted, the gate's
*rate* goes down and grows back. (A burst 429 learns the slope: ``test_limits_slope.py``.)

The pacer's arithmetic, and the adaptive limit driving a real gate on a manual clock, so
every number is exact; one policy test shows the wiring through real calls on trio's
MockClock. The pause and the concurrency cut without pacing are in ``test_adaptive.py``.
"""

from __future__ import annotations

import contextlib
import math
import random
from typing import Any

import anyio
import pytest

import anygate
from anygate import AdaptiveConfig, AdaptiveLimit, ConfigError, Gate, Policy, Rate, RetryConfig
from anygate._config.limit_values import (
    PROBE_RESERVE_S,
    LimitChange,
    check_grace,
    grown_rate,
    paced_rate,
    probe_grace,
)
from tests.conftest import mock_clock
from tests.policy_helpers import FakeClock, burst

# --------------------------------------------------------------------------- arithmetic


def test_paced_rate_is_beta_times_the_measured_rate_with_a_floor() -> None:
    """0.7 x 6/s = 4.2/s; a gate that admitted almost nothing still gets 0.5/s."""
    assert paced_rate(6.0, beta=0.7) == pytest.approx(4.2)
    assert paced_rate(0.1, beta=0.7) == 0.5


def test_grown_rate_doubles_per_window_but_not_past_twice_the_measured_rate() -> None:
    """start x 2^(t/10): 4.2 -> 8.4 after one window; twice the measured rate caps it;
    it never drops below where it started."""
    grow = {"growth": 2.0, "window_s": 10.0}
    assert grown_rate(4.2, 10.0, measured_per_s=None, **grow) == pytest.approx(8.4)
    assert grown_rate(4.2, 5.0, measured_per_s=None, **grow) == pytest.approx(4.2 * 2**0.5)
    assert grown_rate(4.2, 20.0, measured_per_s=3.0, **grow) == pytest.approx(6.0)
    assert grown_rate(4.2, 20.0, measured_per_s=1.0, **grow) == pytest.approx(4.2)


def test_probe_grace_covers_the_slowest_rejection_within_the_pause() -> None:
    """1 s by default, twice the slowest burst 429 a probe got, never beyond the pause."""
    assert probe_grace(0.0, pause_s=5.0) == 1.0
    assert probe_grace(1.5, pause_s=5.0) == 3.0
    assert probe_grace(4.0, pause_s=5.0) == 5.0


def test_check_grace_is_twice_the_throttles_answer_time_within_the_pause() -> None:
    """2 x 0.1 s; at least 20 ms; never beyond the pause; 1 s when the time is unknown."""
    assert check_grace(0.1, pause_s=5.0) == pytest.approx(0.2)
    assert check_grace(0.001, pause_s=5.0) == 0.02
    assert check_grace(4.0, pause_s=5.0) == 5.0
    assert check_grace(None, pause_s=5.0) == 1.0


# --------------------------------------------------------------------------- on a gate


def _paced(
    capacity: float = 32, rate: Rate | None = None, **kwargs: Any
) -> tuple[AdaptiveLimit, Gate, FakeClock]:
    clock = FakeClock()
    gate = Gate(capacity, name="llm", rate=rate, clock=clock)
    kwargs.setdefault("pace_burst_rate", True)
    limit = AdaptiveLimit(gate, clock=clock, **kwargs)
    return limit, gate, clock


def _admit(limit: AdaptiveLimit, gate: Gate, clock: FakeClock, per_s: int, seconds: int) -> None:
    """``per_s`` admissions (released at once, each a success) per second for ``seconds``,
    as far as the gate's rate admits them."""
    for _ in range(seconds):
        for _ in range(per_s):
            try:
                token = gate.acquire_nowait()
            except anygate.Busy:
                break
            token.release()
            limit.on_success(saturated=False)
        clock.now += 1.0


def _confirmed(limit: AdaptiveLimit) -> LimitChange | None:
    """A burst throttle the provider means: with pacing (and a pause to make) the first is
    only checked, one probe goes at once, and the probe's own 429 confirms it. What the
    confirmed throttle changed (or the throttle's change, when it was not checked)."""
    checks = limit.statistics().checked_throttles
    change = limit.on_throttle(limit.generation, None)
    if limit.statistics().checked_throttles == checks:
        return change
    assert change is None
    assert limit.pass_pause() == (0.0, True)  # the check's probe goes at once
    return limit.on_throttle(limit.generation, None, probe=True)


def test_a_first_burst_throttle_is_only_checked() -> None:
    """One 429 could be anyone's: nothing is paced, cut or paused; the next attempt goes at
    once as the probe, and the others wait twice the throttle's answer time (0.1 s) for
    it to be turned away, then go."""
    limit, gate, clock = _paced()
    _admit(limit, gate, clock, per_s=6, seconds=10)
    assert limit.on_throttle(limit.generation, None, admitted_at=clock.now - 0.1) is None
    assert (gate.rate, gate.capacity, limit.pause_left()) == (None, 32, 0.0)
    stats = limit.statistics()
    assert (stats.checked_throttles, stats.throttles, stats.pacing_episodes) == (1, 0, 0)
    assert limit.pass_pause() == (0.0, True)
    wait, probe = limit.pass_pause()
    assert (wait, probe) == (pytest.approx(0.2), False)
    clock.now += 0.2
    assert limit.pass_pause() == (0.0, False)  # not turned away in time: it was noise
    assert (gate.rate, limit.statistics().throttles) == (None, 0)


def test_the_checks_probe_is_kept_for_the_throttled_call() -> None:
    """Issue 26: the check's probe is the throttled call's own retry, even when another
    caller asks first (a throttle answered in zero time comes back before the next caller
    is admitted); the others wait for it. Once that call has not asked for 20 ms
    (``PROBE_RESERVE_S``: it gave up), the first to ask probes instead."""
    limit, gate, clock = _paced()
    _admit(limit, gate, clock, per_s=6, seconds=10)
    owner, fresh, other = object(), object(), object()
    limit.on_throttle(limit.generation, None, admitted_at=clock.now, caller=owner)
    wait, probe = limit.pass_pause(fresh)
    assert (wait, probe) == (pytest.approx(PROBE_RESERVE_S), False)
    assert limit.pass_pause(owner) == (0.0, True)
    limit.on_success(saturated=False, probe=True)
    assert limit.pass_pause(fresh) == (0.0, False)  # it was noise: everyone goes

    limit.on_throttle(limit.generation, None, admitted_at=clock.now, caller=owner)
    assert limit.pass_pause(fresh)[1] is False
    clock.now += PROBE_RESERVE_S
    assert limit.pass_pause(other) == (0.0, True)  # the throttled call never came back
    assert limit.pass_pause(owner)[1] is False
    limit.on_success(saturated=False, probe=True)

    limit.on_throttle(limit.generation, None, admitted_at=clock.now, caller=owner)
    limit.disown(owner)  # its call ended (out of attempts): no need to wait for it
    assert limit.pass_pause(fresh) == (0.0, True)


def test_the_checks_probe_succeeding_ends_the_check() -> None:
    """The probe's call succeeded: everyone goes, nothing changed."""
    limit, gate, clock = _paced()
    _admit(limit, gate, clock, per_s=6, seconds=10)
    limit.on_throttle(limit.generation, None, admitted_at=clock.now - 0.1)
    assert limit.pass_pause() == (0.0, True)
    limit.on_success(saturated=False, probe=True)
    assert limit.pass_pause() == (0.0, False)
    assert gate.rate is None


def test_random_burst_throttles_do_not_stall_the_gate() -> None:
    """A provider that turns 5 % of attempts away at random (a shared pool), callers asking
    20 times a second for 2 minutes, the default 5 s pause: most of the asks go. Pausing
    (and cutting) at every throttle let 13 % go; checking first, 69 %; asking twice once a
    check has shown noise, 94 %."""
    limit, gate, clock = _paced(capacity=1000)
    rng = random.Random(3)
    admitted = 0
    for _ in range(12_000):  # 10 ms steps
        clock.now += 0.01
        if rng.random() >= 0.2:
            continue
        wait, probe = limit.pass_pause()
        if wait > 0:
            continue  # a caller that would wait: counted as not sent
        try:
            gate.acquire_nowait().release()
        except anygate.Busy:
            continue
        admitted += 1
        generation, sent = limit.generation, clock.now
        if rng.random() < 0.05:
            limit.on_throttle(generation, None, probe=probe, admitted_at=sent)
        else:
            limit.on_success(saturated=False, probe=probe)
    assert admitted >= 0.8 * 20 * 120, admitted
    assert limit.statistics().checked_throttles > 50


def test_a_gate_on_another_clock_is_not_paced() -> None:
    """The gate's budgets refill on its own clock: a limit on another one (a virtual clock
    next to a gate on real time) cannot pace it, so a throttle falls back to the cut."""
    clock = FakeClock()
    gate = Gate(32, name="llm")  # time.monotonic
    limit = AdaptiveLimit(gate, clock=clock, decrease_factor=0.5, pace_burst_rate=True)
    _admit(limit, gate, clock, per_s=6, seconds=10)
    change = limit.on_throttle(limit.generation, None)
    assert change is not None
    assert (change.new, change.paced_per_minute, gate.rate) == (16, None, None)
    assert limit.on_rate() is None


def test_pacing_off_cuts_the_limit_and_leaves_the_rate_alone() -> None:
    """pace_burst_rate=False: the old answer, a cut by decrease_factor, no rate."""
    limit, gate, clock = _paced(pace_burst_rate=False, decrease_factor=0.5)
    _admit(limit, gate, clock, per_s=6, seconds=10)
    change = limit.on_throttle(limit.generation, None)
    assert change is not None
    assert (change.new, change.paced_per_minute) == (16, None)
    assert gate.rate is None


def _admit_paced(
    limit: AdaptiveLimit, gate: Gate, clock: FakeClock, *, seconds: int, per_s: int = 0
) -> None:
    """Admit as many as the gate's rate allows (or ``per_s``) each second, as successes;
    the callers keep up with any pace."""
    for _ in range(seconds):
        admitted = 0
        while not per_s or admitted < per_s:
            try:
                token = gate.acquire_nowait()
            except anygate.Busy:
                break
            token.release()
            admitted += 1
            limit.on_success(saturated=False)
            if admitted > 1000:
                break
        clock.now += 1.0


def _throttled_once() -> tuple[AdaptiveLimit, Gate, FakeClock, float]:
    """A paced limit with no pause after 10 s at 6/s and one per-minute 429 that says
    nothing of what it counted, and the paced requests per minute it set."""
    limit, gate, clock = _paced(pause_s=0)
    _admit(limit, gate, clock, per_s=6, seconds=10)
    limit.on_rate(limit.generation)
    assert gate.rate is not None
    first = gate.rate.requests_per_minute
    assert first is not None
    return limit, gate, clock, first


def test_random_throttles_do_not_wear_the_paced_rate_down() -> None:
    """A provider that throttles 10 % of attempts whatever the rate (a shared pool, a
    fault mix), callers wanting 50/s for 5 minutes: the paced rate finds a level and keeps
    it. Cutting on every throttle took it to the 0.5/s floor within a second; undoing the
    growth on a throttle within the window left it near 2/s after 5 minutes."""
    limit, gate, clock = _paced(capacity=1000, pause_s=0)
    rng = random.Random(7)
    low = math.inf
    for step in range(30_000):  # 10 ms steps
        clock.now += 0.01
        if rng.random() < 0.5:
            assert limit.pass_pause() == (0.0, False)
            try:
                gate.acquire_nowait().release()
            except anygate.Busy:
                continue
            if rng.random() < 0.1:
                limit.on_throttle(limit.generation, None)
            else:
                limit.on_success(saturated=False)
        if step >= 6_000 and gate.rate is not None:  # after the first minute
            per_s = gate.rate.requests_per_minute
            assert per_s is not None
            low = min(low, per_s / 60.0)
    assert low >= 5.0, low


def _rate_confirmed(limit: AdaptiveLimit) -> float | None:
    """A per-minute 429 that says nothing of what it counted, repeated for the check's
    probe: the pacer answers it (a burst 429 learns the slope instead). The paced rate."""
    assert limit.on_rate(limit.generation) is None  # only checked
    assert limit.pass_pause() == (0.0, True)
    return limit.on_rate(limit.generation, probe=True)


def test_the_paced_rate_grows_and_the_users_rate_comes_back_exactly() -> None:
    """Under a user's 600/min: paced from 252/min, it grows at most 2x per 10 s, is never
    above 600, and once it reaches 600 the user's own Rate object is back."""
    user = Rate(requests_per_minute=600, tokens_per_minute=10**6, burst_s=2.0)
    limit, gate, clock = _paced(rate=user, pause_s=0)
    _admit_paced(limit, gate, clock, seconds=10, per_s=6)
    limit.on_rate(limit.generation)
    assert gate.rate is not None
    first = gate.rate.requests_per_minute
    assert first is not None
    assert first == pytest.approx(252, rel=0.05)  # the budget starts empty: 53 in 9 s
    # The other fields of the user's rate are kept while paced.
    assert (gate.rate.tokens_per_minute, gate.rate.burst_s) == (10**6, 2.0)
    seen = [first]
    for _ in range(40):
        _admit_paced(limit, gate, clock, seconds=1)
        rate = gate.rate
        assert rate is not None
        assert rate.requests_per_minute is not None
        seen.append(rate.requests_per_minute)
        if rate is user:
            break
    assert gate.rate is user
    assert max(seen) <= 600
    # Growth bounded by the window: at most doubling over any 10 samples (10 s).
    assert all(b <= a * 2.0 * 1.02 for a, b in zip(seen, seen[10:], strict=False))
    assert limit.statistics().paced_requests_per_minute is None


def test_pacing_ends_when_the_callers_no_longer_need_holding_back() -> None:
    """No rate of its own: after the throttle the callers slow to 1 a second; pacing ends
    (twice what they do is less than the paced rate) and the gate has no rate again."""
    limit, gate, clock = _paced(pause_s=0)
    _admit(limit, gate, clock, per_s=6, seconds=10)
    limit.on_rate(limit.generation)
    assert gate.rate is not None
    _admit(limit, gate, clock, per_s=1, seconds=25)
    assert gate.rate is None
    assert not limit.statistics().paced_requests_per_minute


def test_a_rate_set_while_pacing_is_kept_below_and_comes_back() -> None:
    """Header learning (or the user) sets 900/min while the pacer holds 252/min: the paced
    rate stays on the gate and 900/min comes back when pacing ends. A rate set *below* the
    paced one (120/min) applies as it is, and pacing, no longer binding, ends."""
    limit, gate, clock = _paced(pause_s=0)
    _admit(limit, gate, clock, per_s=6, seconds=10)
    limit.on_rate(limit.generation)
    higher = Rate(requests_per_minute=900)
    gate.rate = higher
    clock.now += 1.0
    limit.on_success(saturated=False)
    paced = gate.rate
    assert paced is not None
    assert paced.requests_per_minute is not None
    assert paced.requests_per_minute < 300
    limit.configure(pace_burst_rate=False)
    assert gate.rate is higher
    assert not limit.pace_burst_rate
    limit.configure(pace_burst_rate=True)
    _admit(limit, gate, clock, per_s=6, seconds=10)
    limit.on_rate(limit.generation)
    lower = Rate(requests_per_minute=120)
    gate.rate = lower
    clock.now += 1.0
    limit.on_success(saturated=False)
    assert gate.rate is lower  # never raised above what was set
    assert limit.statistics().paced_requests_per_minute is None


def test_a_learner_made_while_pacing_takes_the_users_rate_as_its_ceiling() -> None:
    """Header learning starts while the pacer holds 252/min under the user's 600/min: its
    ceiling is 600/min, not the paced rate, so pacing ending does not strand the gate."""
    user = Rate(requests_per_minute=600)
    limit, gate, clock = _paced(rate=user)
    _admit(limit, gate, clock, per_s=6, seconds=10)
    _rate_confirmed(limit)
    assert gate.rate is not user
    learner = anygate.RateLearner(gate)
    assert learner.ceiling is user


def test_turning_adaptive_off_gives_the_rate_back() -> None:
    """configure(enabled=False) ends pacing: the gate's own rate (none here) is back."""
    limit, gate, clock = _paced()
    _admit(limit, gate, clock, per_s=6, seconds=10)
    _rate_confirmed(limit)
    assert gate.rate is not None
    limit.configure(enabled=False)
    assert gate.rate is None
    assert limit.pause_left() == 0


def test_a_second_throttle_within_the_window_of_the_cut_is_old_news() -> None:
    """Throttled again 3 s after the cut: the cut has not shown in the provider's window
    yet, so nothing changes (the rate grown since stays, no second episode)."""
    limit, gate, clock, first = _throttled_once()
    _admit_paced(limit, gate, clock, seconds=3)
    assert gate.rate is not None
    grown = gate.rate.requests_per_minute
    assert grown is not None
    assert grown > first * 1.1
    for _ in range(20):
        limit.on_rate(limit.generation)
    assert gate.rate is not None
    assert gate.rate.requests_per_minute == grown
    assert limit.statistics().pacing_episodes == 1


def test_the_paced_rate_grows_on_attempts_without_successes() -> None:
    """Only failures after the cut: the rate still grows with time, checked whenever an
    attempt starts (before, it grew on successes only and a fault mix froze it)."""
    limit, gate, clock, first = _throttled_once()
    per_s = first / 60.0
    for _ in range(int(per_s * 5)):  # 5 s of attempts at the paced rate, none succeeding
        clock.now += 1.0 / per_s
        assert limit.pass_pause() == (0.0, False)
        with contextlib.suppress(anygate.Busy):
            gate.acquire_nowait().release()  # the attempt fails: no on_success
    assert gate.rate is not None
    grown = gate.rate.requests_per_minute
    assert grown is not None
    assert grown > first * 1.2


def test_without_pacing_the_others_wait_for_the_probes_outcome() -> None:
    """pace_burst_rate=False: no grace, the others ask again after a whole pause."""
    limit, gate, clock = _paced(pace_burst_rate=False)
    _admit(limit, gate, clock, per_s=6, seconds=10)
    limit.on_throttle(limit.generation, None)
    clock.now += 5.0
    assert limit.pass_pause() == (0.0, True)
    clock.now += 3.0
    assert limit.pass_pause() == (5.0, False)


def test_an_rpm_429_paces_without_a_pause_or_a_cut() -> None:
    """A per-minute 429 after 6 admissions a second: paced to about 252/min under the
    user's 600/min, no pause, 32 slots; a second one while pacing changes nothing."""
    user = Rate(requests_per_minute=600)
    limit, gate, clock = _paced(rate=user)
    _admit(limit, gate, clock, per_s=6, seconds=10)
    paced = limit.on_rate()
    assert paced is not None
    assert paced == pytest.approx(252, rel=0.05)
    assert gate.rate is not None
    assert gate.rate.requests_per_minute == paced
    assert (limit.pause_left(), gate.capacity, limit.generation) == (0, 32, 0)
    assert limit.on_rate() is None
    off, gate_off, clock_off = _paced(rate=user, pace_burst_rate=False)
    _admit(off, gate_off, clock_off, per_s=6, seconds=10)
    assert off.on_rate() is None
    assert gate_off.rate is user


def test_a_first_rpm_429_of_a_known_attempt_is_checked_too() -> None:
    """With the attempt's generation, a per-minute 429 is checked like a burst one: nothing
    paced, one probe at once; the probe's own per-minute 429 confirms it (paced to about
    252/min, no pause); a 429 from before the check is old news."""
    limit, gate, clock = _paced(rate=Rate(requests_per_minute=600))
    _admit(limit, gate, clock, per_s=6, seconds=10)
    before = limit.generation
    assert limit.on_rate(before, admitted_at=clock.now - 0.1) is None
    assert (gate.rate, limit.statistics().checked_throttles) == (Rate(requests_per_minute=600), 1)
    assert limit.on_rate(before) is None  # admitted before the check
    assert limit.pass_pause() == (0.0, True)
    paced = limit.on_rate(limit.generation, probe=True)
    assert paced == pytest.approx(252, rel=0.05)
    assert (limit.pause_left(), limit.pass_pause()) == (0.0, (0.0, False))


# --------------------------------------------------------------------------- settings


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_pace_burst_rate_must_be_a_bool(value: object) -> None:
    """A non-bool is a TypeError naming the setting and the value."""
    gate = Gate(4)
    with pytest.raises(TypeError, match=r"pace_burst_rate must be a bool \(got"):
        AdaptiveLimit(gate, pace_burst_rate=value)  # type: ignore[arg-type]
    limit = AdaptiveLimit(gate)
    if value is not None:
        with pytest.raises(TypeError, match="pace_burst_rate must be a bool or None"):
            limit.configure(pace_burst_rate=value)  # type: ignore[arg-type]


def test_the_setting_loads_from_yaml_and_is_checked() -> None:
    """llm_call.adaptive_concurrency.pace_burst_rate: a bool; anything else names the key."""
    config = anygate.load_config({"llm_call": {"adaptive_concurrency": {"pace_burst_rate": False}}})
    assert config.adaptive_concurrency.pace_burst_rate is False
    assert config.to_mapping()["llm_call"]["adaptive_concurrency"]["pace_burst_rate"] is False
    with pytest.raises(ConfigError, match=r"llm_call\.adaptive_concurrency\.pace_burst_rate"):
        anygate.load_config({"llm_call": {"adaptive_concurrency": {"pace_burst_rate": "on"}}})
    with pytest.raises(TypeError, match="pace_burst_rate"):
        AdaptiveConfig(pace_burst_rate="on")  # type: ignore[arg-type]


def test_policies_on_one_gate_must_agree_about_pacing() -> None:
    """A second policy stating the other value fails unless reconfigure=True."""
    gate = Gate(4, name="pacing-agree")
    Policy(gate=gate, adaptive_concurrency=AdaptiveConfig(pace_burst_rate=True))
    with pytest.raises(ConfigError, match="pace_burst_rate"):
        Policy(gate=gate, adaptive_concurrency=AdaptiveConfig(pace_burst_rate=False))
    policy = Policy(
        gate=gate, adaptive_concurrency=AdaptiveConfig(pace_burst_rate=False), reconfigure=True
    )
    assert not policy.adaptive_limit.pace_burst_rate


# --------------------------------------------------------------------------- through a policy


def _plain_rate() -> anygate.ResponseError:
    return anygate.ResponseError(
        429, body={"error": {"code": "rate_limit_exceeded", "message": "Rate limit reached."}}
    )


def _rpm() -> anygate.ResponseError:
    return anygate.ResponseError(
        429,
        body={
            "error": {
                "code": "rate_limit_exceeded",
                "message": "Rate limit reached for requests per minute (RPM).",
            }
        },
    )


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", [mock_clock()])
@pytest.mark.parametrize("callers", [2, 5, 40])
async def test_throttles_answered_in_zero_time_do_not_stall_the_gate(callers: int) -> None:
    """Issue 26: each caller's first attempt is turned away with a burst 429 in zero
    time (an in-process fake, a local proxy's own limiter), its second succeeds. Before,
    every check's probe was the next caller's *first* attempt, so each confirmed the
    throttle and paused the gate 5 s per caller (40 callers: 195 s of virtual time).
    Now the probe is the throttled call's own retry: all finish at once."""
    gate = Gate(math.inf, name=f"instant-{callers}", clock=anyio.current_time)
    policy = Policy(gate=gate, clock=anyio.current_time)
    start = anyio.current_time()
    finished: list[float] = []

    async def one() -> None:
        turned_away = False

        async def provider() -> str:
            nonlocal turned_away
            if not turned_away:
                turned_away = True
                raise burst()
            return "ok"

        assert await policy.call(provider) == "ok"
        finished.append(anyio.current_time() - start)

    with anyio.fail_after(3600):
        async with anyio.create_task_group() as tg:
            for _ in range(callers):
                tg.start_soon(one)
    assert len(finished) == callers
    # No pause: at most one reservation of the probe per caller, never a pause_s.
    assert max(finished) <= callers * PROBE_RESERVE_S
    assert policy.adaptive_limit.statistics().throttles == 0


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", [mock_clock()])
@pytest.mark.parametrize("throttle", [_plain_rate], ids=["rate"])
async def test_a_policy_paces_its_gate_after_a_throttle(throttle: Any) -> None:
    """20 calls a second for 10 s, then a per-minute 429 that does not say what it counted
    at 10 s that the provider repeats for the check's probe (a burst 429 learns the slope
    instead: ``test_limits_slope.py``): the gate is
    paced below its user rate of 1200/min, its 8 slots stay 8, the throttled calls succeed
    on their retries, and the user's rate comes back once the calls slow down. (A 429 that
    says it counted requests is estimated instead: the test after this one.)"""
    user = Rate(requests_per_minute=1200)
    gate = Gate(8, name="paced-policy", rate=user, clock=anyio.current_time)
    retry = RetryConfig(throttle_attempts=3)
    policy = Policy(
        gate=gate,
        retry=retry,
        clock=anyio.current_time,
        adaptive_concurrency=AdaptiveConfig(pace_burst_rate=True),
    )
    errors = [throttle(), throttle()]

    async def provider() -> str:
        if errors and anyio.current_time() - start >= 10.0:
            raise errors.pop()
        return "ok"

    start = anyio.current_time()
    async with anyio.create_task_group() as tg:
        for i in range(220):
            tg.start_soon(policy.call, provider)
            if i % 20 == 19:
                await anyio.sleep(1.0)
        await anyio.wait_all_tasks_blocked()
        assert not errors
        paced = gate.rate
        assert paced is not None
        assert paced.requests_per_minute is not None
        assert paced.requests_per_minute < 1200
        assert gate.capacity == 8
        tg.start_soon(policy.call, provider)
    for _ in range(40):  # one call a second: the callers set the pace again
        await policy.call(provider)
        await anyio.sleep(1.0)
    assert gate.rate is user
    assert math.isclose(policy.adaptive_limit.limit, 8)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", [mock_clock()])
async def test_a_policy_holds_sends_to_the_requests_per_minute_it_counted() -> None:
    """Issue 30: the provider accepts 100 requests in any 60 s although the gate may send
    1200/min. The 429s say "requests per min (RPM)"; the first holds sends to the count
    the window held (100) tentatively, the next within a minute confirms it, and from then
    on no window of the provider's sees more than 100 (so nothing more is rejected),
    while the estimate grows back by one request a minute to find a raised limit."""
    gate = Gate(
        8, name="rpm-estimate", rate=Rate(requests_per_minute=1200), clock=anyio.current_time
    )
    policy = Policy(gate=gate, retry=RetryConfig(throttle_attempts=10), clock=anyio.current_time)
    accepted: list[float] = []
    rejected = 0

    async def provider() -> str:
        nonlocal rejected
        now = anyio.current_time()
        if sum(1 for t in accepted if t > now - 60.0) >= 100:
            rejected += 1
            raise _rpm()
        accepted.append(now)
        await anyio.sleep(0.5)
        return "ok"

    async with anyio.create_task_group() as tg:
        for _ in range(300):
            tg.start_soon(policy.call, provider)
            await anyio.sleep(0.1)  # 600 a minute: six times the hidden limit
    assert len(accepted) == 300
    assert rejected <= 3  # the first word, its confirmation, and at most one in between
    estimate = policy.adaptive_limit.statistics().requests_per_minute_estimate
    assert estimate is not None
    assert 100 <= estimate < 110
    assert gate.rate == Rate(requests_per_minute=1200)  # the user's rate is left alone
