"""Adaptive concurrency wired into the policy: pauses, cuts and recovery through real calls.

Timing tests run on trio's MockClock with ``clock=anyio.current_time``, so pauses are exact;
the rest run on every backend. The controller's own arithmetic is in ``test_adaptive.py``.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import anyio
import pytest

import anygate
from anygate import AdaptiveConfig, Busy, CallFailed, ConfigError, LimitChanged, Policy, RetryConfig
from anygate._config.limit_values import LimitChange
from tests.conftest import mock_clock
from tests.policy_helpers import FakeClock, Script, SyncScript, burst, transient

pytestmark = pytest.mark.anyio
virtual_time = pytest.mark.parametrize("anyio_backend", [mock_clock()])

# Burst-rate retries far apart, so pauses and retries are easy to tell apart in time.
SLOW_RETRY = RetryConfig(
    burst_base_delay_ms=20000, cap_delay_ms=20000, max_attempts=2, throttle_attempts=2
)


def limit_events(events: list[Any]) -> list[LimitChanged]:
    return [e for e in events if isinstance(e, LimitChanged)]


class Provider:
    """Records when each call reached the provider; answers from a script of errors."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.starts: list[float] = []

    async def __call__(self, service_s: float = 0.0) -> str:
        self.starts.append(anyio.current_time())
        if self.errors:
            raise self.errors.pop(0)
        await anyio.sleep(service_s)
        return "ok"


@virtual_time
async def test_a_throttle_pauses_other_calls_and_lowers_the_gate() -> None:
    """Cap 4: one burst 429 -> capacity 3 and a 5 s pause; a call admitted meanwhile waits
    exactly until the pause ends before reaching the provider."""
    events: list[Any] = []
    policy = Policy(
        max_concurrent_calls=4, retry=SLOW_RETRY, hooks=[events.append], clock=anyio.current_time
    )
    provider = Provider(burst())
    start = anyio.current_time()
    async with anyio.create_task_group() as tg:
        tg.start_soon(policy.call, provider)
        await anyio.wait_all_tasks_blocked()
        (cut,) = limit_events(events)
        assert (cut.old, cut.new, cut.max_concurrent_calls, cut.reason) == (4, 3, 4, "burst_rate")
        assert (cut.policy, cut.gate, cut.pause_s) == ("llm", "llm", 5.0)
        assert policy.gate.capacity == 3
        assert policy.max_concurrent_calls == 4  # the configured maximum is unchanged
        await anyio.sleep(1)
        assert await policy.call(provider) == "ok"
    assert provider.starts[1] - start == 5.0  # admitted at 1 s, sent when the pause ended
    assert provider.starts[2] - start >= 5.0  # the throttled call's retry: after the pause


@virtual_time
async def test_when_the_pause_ends_at_most_the_lowered_limit_goes_at_once() -> None:
    """Eight calls queued during the pause: one probe goes at its end, the rest after its
    success as slots free up (and as successes grow the limit back), in FIFO order."""
    policy = Policy(
        max_concurrent_calls=4,
        retry=RetryConfig(max_attempts=1, throttle_attempts=1),
        clock=anyio.current_time,
    )
    with pytest.raises(CallFailed):
        await policy.call(Provider(burst()))  # gives up at once; the pause and the cut stay
    sent: list[tuple[int, float]] = []
    start = anyio.current_time()

    async def provider(n: int) -> None:
        sent.append((n, anyio.current_time() - start))
        await anyio.sleep(2.0)

    async with anyio.create_task_group() as tg:
        for n in range(8):
            tg.start_soon(policy.call, provider, n)
            await anyio.wait_all_tasks_blocked()
    # FIFO: no caller reaches the provider at an earlier time than one queued before it
    # (callers resuming at the same instant may arrive in either order).
    when = dict(sent)
    assert sorted(when) == list(range(8))
    # One probe at the end of the pause (whichever caller asks first); the rest go when it
    # succeeds, two at a time, in FIFO order.
    times = sorted(when.values())
    assert times[:3] == [5.0, 7.0, 7.0]
    rest = [when[n] for n in range(8) if when[n] > 5.0]
    assert rest == sorted(rest)
    assert policy.gate.capacity == 4  # eight successes: 3.2 -> 4 and the cap


@virtual_time
async def test_throttles_of_attempts_sent_before_the_cut_count_once() -> None:
    """Three attempts in flight all get a burst 429: one cut, not three."""
    events: list[Any] = []
    policy = Policy(
        max_concurrent_calls=10,
        retry=RetryConfig(max_attempts=1, throttle_attempts=1),
        hooks=[events.append],
        clock=anyio.current_time,
    )
    release = anyio.Event()

    async def throttled() -> None:
        await release.wait()
        raise burst()

    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(_expect_failure, policy, throttled)
        await anyio.wait_all_tasks_blocked()
        release.set()
    assert [(e.old, e.new) for e in limit_events(events)] == [(10, 8)]
    assert policy.adaptive_limit.statistics().stale_throttles == 2


async def _expect_failure(policy: Policy, fn: Any) -> None:
    with pytest.raises(CallFailed):
        await policy.call(fn)


@virtual_time
async def test_successes_grow_the_limit_back_to_the_maximum() -> None:
    """After a cut from 10 to 8, successful calls raise it 8 -> 9 -> 10, one event each."""
    events: list[Any] = []
    policy = Policy(
        max_concurrent_calls=10,
        retry=RetryConfig(max_attempts=1, throttle_attempts=1),
        hooks=[events.append],
        clock=anyio.current_time,
    )
    with pytest.raises(CallFailed):
        await policy.call(Script(burst()))
    events.clear()
    for _ in range(30):  # one call at a time: slots stand free, so no evidence for more
        assert await policy.call(Script()) == "ok"
    assert policy.gate.capacity == 8
    calls = 0
    while policy.gate.capacity < 10:
        calls += await _full_batch(policy)
    assert [(e.old, e.new, e.reason, e.pause_s) for e in limit_events(events)] == [
        (8, 9, "recovered", 0.0),
        (9, 10, "recovered", 0.0),
    ]
    assert calls >= 16  # about one slot per limit's worth of successes on a full gate


async def _full_batch(policy: Policy) -> int:
    """Fill the gate and queue one more call behind it, then let them all finish; the
    number of calls made (all admitted while the gate was full or had a waiter)."""
    release = anyio.Event()

    async def held() -> str:
        await release.wait()
        return "ok"

    n = int(policy.gate.capacity) + 1
    async with anyio.create_task_group() as tg:
        for _ in range(n):
            tg.start_soon(policy.call, held)
        await anyio.wait_all_tasks_blocked()
        release.set()
    return n


@virtual_time
async def test_retry_after_on_the_throttle_sets_the_pause() -> None:
    """A burst 429 with Retry-After: 2 pauses the gate for exactly 2 s."""
    events: list[Any] = []
    policy = Policy(max_concurrent_calls=4, hooks=[events.append], clock=anyio.current_time)
    throttle = anygate.ResponseError(
        429, headers={"retry-after": "2"}, body={"error": {"code": "limit_burst_rate"}}
    )
    provider = Provider(throttle)
    start = anyio.current_time()
    assert await policy.call(provider) == "ok"
    (cut,) = [e for e in limit_events(events) if e.reason == "burst_rate"]
    assert cut.pause_s == 2.0
    assert [t - start for t in provider.starts] == [0.0, 2.0]


@virtual_time
async def test_a_pause_longer_than_the_slot_wait_budget_is_busy() -> None:
    """busy_wait_s 1 and a 5 s pause: the next call fails fast with Busy and frees its slot."""
    policy = Policy(
        max_concurrent_calls=4,
        busy_wait_s=1,
        retry=RetryConfig(max_attempts=1, throttle_attempts=1),
        clock=anyio.current_time,
    )
    with pytest.raises(CallFailed):
        await policy.call(Script(burst()))
    start = anyio.current_time()
    with pytest.raises(Busy):
        await policy.call(Script())
    assert anyio.current_time() == start
    assert policy.gate.in_flight == 0


@virtual_time
async def test_a_deadline_inside_the_pause_is_busy_and_frees_the_slot() -> None:
    """deadline=2 during a 5 s pause: Busy after exactly 2 s, slot returned."""
    policy = Policy(
        max_concurrent_calls=4,
        retry=RetryConfig(max_attempts=1, throttle_attempts=1),
        clock=anyio.current_time,
    )
    with pytest.raises(CallFailed):
        await policy.call(Script(burst()))
    start = anyio.current_time()
    with pytest.raises(Busy):
        await policy.call(Script(), deadline=2)
    assert anyio.current_time() - start == 2.0
    assert policy.gate.in_flight == 0


@virtual_time
async def test_cancelled_during_the_pause_frees_the_slot() -> None:
    """Cancellation while sitting out a pause propagates and returns the slot."""
    policy = Policy(
        max_concurrent_calls=4,
        retry=RetryConfig(max_attempts=1, throttle_attempts=1),
        clock=anyio.current_time,
    )
    with pytest.raises(CallFailed):
        await policy.call(Script(burst()))
    with anyio.move_on_after(1) as scope:
        await policy.call(Script())
    assert scope.cancelled_caught
    assert policy.gate.in_flight == 0


@virtual_time
async def test_the_testing_switch_skips_the_pause_but_not_the_cut() -> None:
    """set_testing zeroes waits: no pause, yet the limit still drops."""
    events: list[Any] = []
    policy = Policy(max_concurrent_calls=4, hooks=[events.append], clock=anyio.current_time)
    provider = Provider(burst())
    with anygate.set_testing(True):
        start = anyio.current_time()
        assert await policy.call(provider) == "ok"
        assert anyio.current_time() == start
    assert next((e.old, e.new, e.pause_s) for e in limit_events(events)) == (4, 3, 5.0)


async def test_without_a_cap_a_throttle_with_a_handful_out_only_pauses() -> None:
    """No cap: the calls in flight at a throttle become the limit (the end of the pause is
    no herd, ``test_adaptive.py``), but not a handful (here 1): a full window that small
    says little, and the pause alone answers it; the call retries and succeeds."""
    events: list[Any] = []
    policy = Policy(hooks=[events.append], clock=FakeClock())
    with anygate.set_testing(True):
        assert await policy.call(Script(burst())) == "ok"
    (cut, *_) = limit_events(events)
    assert (cut.old, cut.new, cut.reason) == (math.inf, math.inf, "burst_rate")
    assert cut.pause_s > 0
    assert policy.gate.capacity == math.inf


async def test_turned_off_a_throttle_changes_nothing() -> None:
    """adaptive_concurrency=False: the cap stays, no event."""
    events: list[Any] = []
    policy = Policy(max_concurrent_calls=4, adaptive_concurrency=False, hooks=[events.append])
    with anygate.set_testing(True):
        assert await policy.call(Script(burst())) == "ok"
    assert limit_events(events) == []
    assert policy.gate.capacity == 4
    assert not policy.adaptive_limit.enabled


async def test_only_burst_rate_failures_lower_the_limit() -> None:
    """Transient 503s and RPM-style 429s are not a burst-rate signal."""
    policy = Policy(max_concurrent_calls=4, clock=FakeClock())
    rpm = anygate.ResponseError(429, body={"error": {"code": "rate_limit_exceeded"}})
    with anygate.set_testing(True):
        assert await policy.call(Script(transient(), rpm)) == "ok"
    assert policy.gate.capacity == 4


async def test_cut_and_recovery_on_every_backend() -> None:
    """No pause (pause_ms 0): a burst 429 lowers 4 -> 2, the retry succeeds, and successes
    on a full gate grow it back to 4, on asyncio, uvloop and trio alike."""
    events: list[Any] = []
    policy = Policy(
        max_concurrent_calls=4,
        # The cut answers a burst 429 only without burst pacing (it learns the slope).
        adaptive_concurrency=AdaptiveConfig(pause_ms=0, decrease_factor=0.5, pace_burst_rate=False),
        hooks=[events.append],
    )
    with anygate.set_testing(True):
        assert await policy.call(Script(burst())) == "ok"
        assert policy.gate.capacity == 2  # the cut to 2; the lone retry is no evidence
        for _ in range(6):  # batches of capacity + 1: 2 -> 2.5 -> 2.9 ... -> 4
            if policy.gate.capacity < 4:
                await _full_batch(policy)
    assert [(e.old, e.new) for e in limit_events(events)] == [(4, 2), (2, 3), (3, 4)]
    assert policy.gate.capacity == 4
    assert policy.gate.in_flight == 0


def test_call_sync_sits_out_the_pause_measured_by_the_policy_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The blocking path: after a throttle, the next call sleeps exactly the pause left on
    the policy's clock (time.sleep is recorded, and advances the clock), holding its slot."""
    clock = FakeClock()
    slept: list[tuple[float, int]] = []
    policy = Policy(
        max_concurrent_calls=4, retry=RetryConfig(max_attempts=1, throttle_attempts=1), clock=clock
    )

    def sleep(seconds: float) -> None:
        slept.append((seconds, policy.gate.in_flight))
        clock.now += seconds

    monkeypatch.setattr("anygate._policy.admission.time.sleep", sleep)
    with pytest.raises(CallFailed):
        policy.call_sync(SyncScript(burst()))
    assert policy.gate.capacity == 3
    clock.now = 1.0
    assert policy.call_sync(SyncScript()) == "ok"
    assert slept == [(4.0, 1)]
    assert policy.gate.in_flight == 0
    slept.clear()
    assert policy.call_sync(SyncScript()) == "ok"  # the pause is over
    assert slept == []


def test_call_sync_with_a_pause_past_its_deadline_is_busy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The sync path does not start a pause it cannot finish before ``deadline``."""
    clock = FakeClock()
    monkeypatch.setattr("anygate._policy.admission.time.sleep", lambda s: None)
    policy = Policy(
        max_concurrent_calls=4, retry=RetryConfig(max_attempts=1, throttle_attempts=1), clock=clock
    )
    with pytest.raises(CallFailed):
        policy.call_sync(SyncScript(burst()))
    with pytest.raises(Busy):
        policy.call_sync(SyncScript(), deadline=1)
    assert policy.gate.in_flight == 0


# --------------------------------------------------------------------------- sharing


async def test_policies_on_one_gate_share_the_limit() -> None:
    """A throttle seen by one policy lowers the gate for both; the event goes to the hooks
    of the policy whose call caused it (the cut: burst pacing off, so no check)."""
    a_events: list[Any] = []
    b_events: list[Any] = []
    a = Policy(
        name="a",
        gate_name="llm",
        max_concurrent_calls=10,
        adaptive_concurrency=AdaptiveConfig(pace_burst_rate=False),  # the cut, not the slope
        hooks=[a_events.append],
    )
    b = Policy(name="b", gate_name="llm", hooks=[b_events.append])
    assert a.gate is b.gate
    assert a.adaptive_limit is b.adaptive_limit
    with anygate.set_testing(True):
        assert await a.call(Script(burst())) == "ok"
    assert [e.policy for e in limit_events(a_events)] == ["a"]
    assert limit_events(b_events) == []
    assert b.gate.capacity == 8
    assert b.max_concurrent_calls == 10


async def test_a_policy_stating_other_settings_on_a_shared_gate_is_refused() -> None:
    """Two policies cannot disagree on how one gate answers a throttle, unless asked to
    reconfigure it; settings left unstated follow the gate's."""
    Policy(max_concurrent_calls=8, adaptive_concurrency=AdaptiveConfig(decrease_factor=0.5))
    with pytest.raises(ConfigError) as info:
        Policy(adaptive_concurrency=AdaptiveConfig(decrease_factor=0.8))
    assert info.value.path == "llm_call.adaptive_concurrency"
    assert "decrease_factor=0.5" in str(info.value)
    assert "decrease_factor=0.8" in str(info.value)
    with pytest.raises(ConfigError, match="enabled=True"):
        Policy(adaptive_concurrency=False)
    follower = Policy(adaptive_concurrency=AdaptiveConfig(min_concurrent_calls=1))
    assert follower.adaptive_limit.settings() == (True, 1, 0.5, 5.0)
    Policy(adaptive_concurrency=AdaptiveConfig(decrease_factor=0.8), reconfigure=True)
    assert follower.adaptive_limit.settings() == (True, 1, 0.8, 5.0)


async def test_a_gate_handed_to_two_policies_has_one_limit() -> None:
    """gate=: the limit belongs to the gate object, shared or not."""
    gate = anygate.Gate(6, name="private")
    a = Policy(name="a", gate=gate)
    b = Policy(name="b", gate=gate)
    assert a.adaptive_limit is b.adaptive_limit
    assert Policy(name="c", gate=anygate.Gate(6)).adaptive_limit is not a.adaptive_limit


async def test_building_a_policy_while_the_limit_is_lowered_is_not_a_conflict() -> None:
    """The configured maximum is compared, not the gate's momentary capacity."""
    first = Policy(max_concurrent_calls=10, clock=FakeClock())
    with anygate.set_testing(True):
        assert await first.call(Script(burst())) == "ok"
    assert first.gate.capacity == 8
    again = Policy(max_concurrent_calls=10)
    assert again.max_concurrent_calls == 10
    with pytest.raises(ConfigError, match="already has capacity 10"):
        Policy(max_concurrent_calls=12)


async def test_max_concurrent_calls_set_while_lowered_caps_the_limit() -> None:
    """A new maximum above a lowered limit leaves it lowered (it grows to the new value);
    one below it caps it at once; the repr shows both."""
    policy = Policy(max_concurrent_calls=10, clock=FakeClock())
    with anygate.set_testing(True):
        assert await policy.call(Script(burst())) == "ok"
    assert policy.gate.capacity == 8
    assert "8 (adaptive, max 10)" in repr(policy)
    policy.max_concurrent_calls = 20
    assert (policy.gate.capacity, policy.max_concurrent_calls) == (8, 20)
    policy.max_concurrent_calls = 5
    assert (policy.gate.capacity, policy.max_concurrent_calls) == (5, 5)
    policy.max_concurrent_calls = 0
    assert policy.gate.capacity == math.inf


async def test_the_cut_is_logged_at_info_and_recovery_at_debug(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One INFO line per cut naming the gate and the numbers; recovery steps are DEBUG."""
    policy = Policy(
        max_concurrent_calls=2,
        # The cut answers a burst 429 only without burst pacing (it learns the slope).
        adaptive_concurrency=AdaptiveConfig(pause_ms=0, decrease_factor=0.5, pace_burst_rate=False),
    )
    with caplog.at_level(logging.DEBUG, logger="anygate"), anygate.set_testing(True):
        assert await policy.call(Script(burst())) == "ok"
    lines = [
        (r.levelno, r.getMessage()) for r in caplog.records if "concurrency limit" in r.getMessage()
    ]
    assert lines[0][0] == logging.INFO
    assert "gate 'llm'" in lines[0][1]
    assert "2 -> 1 (max 2)" in lines[0][1]
    assert lines[1:] == [(logging.DEBUG, "gate 'llm': concurrency limit 1 -> 2 (max 2)")]


async def test_a_change_the_limit_made_on_its_own_is_reported_at_the_next_admission() -> None:
    """A check whose probe got through can teach the slots outside any throttle's call
    (``anygate._limits.burst``, a suspect plain 429): the next attempt admitted reports it
    as a LimitChanged event, once."""
    events: list[Any] = []
    policy = Policy(max_concurrent_calls=8, hooks=[events.append])
    policy.adaptive_limit._unreported = LimitChange(8, 7, 8, "concurrency", 0.0)
    assert await policy.call(Provider()) == "ok"
    assert await policy.call(Provider()) == "ok"
    (change,) = limit_events(events)
    assert (change.old, change.new, change.reason) == (8, 7, "concurrency")


def test_a_change_the_limit_made_on_its_own_is_reported_by_a_blocking_call_too() -> None:
    """The same from ``call_sync`` (its admission is the blocking twin)."""
    events: list[Any] = []
    policy = Policy(max_concurrent_calls=8, hooks=[events.append])
    policy.adaptive_limit._unreported = LimitChange(8, 7, 8, "concurrency", 0.0)
    assert policy.call_sync(lambda: "ok") == "ok"
    assert policy.call_sync(lambda: "ok") == "ok"
    (change,) = limit_events(events)
    assert (change.old, change.new, change.reason) == (8, 7, "concurrency")
