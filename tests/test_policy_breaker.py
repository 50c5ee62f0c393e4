"""Policy with its breaker, events, redaction and the shared gate/breaker per name."""

from __future__ import annotations

import logging
import math
import threading
from typing import Any

import anyio
import pytest

import anygate
from anygate import (
    BreakerConfig,
    BreakerStateChanged,
    CallFailed,
    CircuitOpen,
    Policy,
    ResponseError,
    RetryConfig,
    SlotAdmitted,
    SlotWaiting,
)
from tests.conftest import mock_clock
from tests.policy_helpers import FakeClock, Script, SyncScript, burst, quota, transient

pytestmark = pytest.mark.anyio
virtual_time = pytest.mark.parametrize("anyio_backend", [mock_clock()])


def tripping_policy(clock: FakeClock, **kwargs: Any) -> Policy:
    """Threshold 1, recovery 60 s, fail fast, a manual clock, instant retries, 2 throttles."""
    return Policy(
        circuit_breaker=BreakerConfig(
            when_open="fail", failure_threshold=1, recovery_timeout_sec=60
        ),
        retry=RetryConfig(base_delay_ms=0, cap_delay_ms=0, throttle_attempts=2),
        # The manual clock never moves on its own: no burst pause to sit out.
        adaptive_concurrency=False,
        clock=clock,
        **kwargs,
    )


async def test_burst_rate_exhaustion_does_not_trip_the_breaker() -> None:
    """Ported: a slope throttle is not "provider down"; transient exhaustion is."""
    clock = FakeClock()
    policy = tripping_policy(clock)
    assert policy.breaker is not None
    with pytest.raises(CallFailed):
        await policy.call(Script(burst(), burst()))
    assert policy.breaker.state == "closed"
    with pytest.raises(CallFailed):
        await policy.call(Script(transient(), transient(), transient()))
    assert policy.breaker.state == "open"


async def test_non_retriable_failures_are_neutral() -> None:
    """quota/auth/generic failures never trip the breaker."""
    policy = tripping_policy(FakeClock())
    for _ in range(3):
        with pytest.raises(CallFailed):
            await policy.call(Script(quota()))
    assert policy.breaker is not None
    assert policy.breaker.state == "closed"


async def test_open_breaker_fails_fast_without_calling_fn() -> None:
    """CircuitOpen comes before any slot or attempt."""
    clock = FakeClock()
    policy = tripping_policy(clock)
    with pytest.raises(CallFailed):
        await policy.call(Script(*[transient() for _ in range(3)]))
    script = Script()
    clock.now += 10
    with pytest.raises(CircuitOpen) as info:
        await policy.call(script)
    assert script.calls == 0
    assert info.value.retry_after == 50


async def test_a_probe_consumed_by_a_non_retriable_error_does_not_wedge_the_breaker() -> None:
    """Ported: the half-open probe fails with quota (neutral); the next caller probes and
    closes the breaker."""
    clock = FakeClock()
    policy = tripping_policy(clock)
    with pytest.raises(CallFailed):
        await policy.call(Script(*[transient() for _ in range(3)]))
    clock.now += 60
    with pytest.raises(CallFailed):
        await policy.call(Script(quota()))
    assert policy.breaker is not None
    assert policy.breaker.state == "half_open"
    assert await policy.call(Script()) == "ok"
    assert policy.breaker.state == "closed"


async def test_half_open_lets_exactly_one_probe_through_without_serialising() -> None:
    """While the probe is in flight every other caller fails fast (not queued behind it)."""
    clock = FakeClock()
    events: list[Any] = []
    policy = tripping_policy(clock, hooks=[events.append])
    with pytest.raises(CallFailed):
        await policy.call(Script(*[transient() for _ in range(3)]))
    clock.now += 60
    release = anyio.Event()
    probing = anyio.Event()

    async def slow_probe() -> str:
        probing.set()
        await release.wait()
        return "recovered"

    async with anyio.create_task_group() as tg:
        tg.start_soon(policy.call, slow_probe)
        await probing.wait()
        for _ in range(3):
            with pytest.raises(CircuitOpen):
                await policy.call(Script())
        release.set()
    assert policy.breaker is not None
    assert policy.breaker.state == "closed"
    changes = [(e.old, e.new) for e in events if isinstance(e, BreakerStateChanged)]
    assert changes == [("closed", "open"), ("open", "half_open"), ("half_open", "closed")]


async def test_control_flow_exceptions_propagate_and_release_the_probe() -> None:
    """Declared control-flow exceptions pass through unchanged and are neutral."""

    class GraphBubbleUp(Exception):
        pass

    clock = FakeClock()
    policy = tripping_policy(clock, control_flow=["GraphBubbleUp"])
    with pytest.raises(CallFailed):
        await policy.call(Script(*[transient() for _ in range(3)]))
    clock.now += 60
    signal = GraphBubbleUp("interrupt")
    with pytest.raises(GraphBubbleUp) as info:
        await policy.call(Script(signal))
    assert info.value is signal
    assert await policy.call(Script()) == "ok"


async def test_cancellation_releases_the_probe() -> None:
    """A cancelled probe is neutral: the next caller may probe."""
    clock = FakeClock()
    policy = tripping_policy(clock)
    with pytest.raises(CallFailed):
        await policy.call(Script(*[transient() for _ in range(3)]))
    clock.now += 60

    async def hang() -> None:
        await anyio.sleep_forever()

    with anyio.move_on_after(0.01):
        await policy.call(hang)
    assert await policy.call(Script()) == "ok"


async def test_retries_stop_when_the_breaker_opens_meanwhile() -> None:
    """An ordinary call does not keep retrying into a breaker other calls opened."""
    clock = FakeClock()
    events: list[Any] = []
    policy = tripping_policy(clock, hooks=[events.append])
    assert policy.breaker is not None
    other = policy.breaker.acquire()

    async def fails_and_opens() -> None:
        other.failure()  # another call gives up meanwhile and opens the breaker
        raise transient()

    with pytest.raises(CallFailed):
        await policy.call(fails_and_opens)
    assert [e.why for e in events if isinstance(e, anygate.GaveUp)] == ["circuit_open"]


async def test_policies_with_the_same_name_share_the_breaker() -> None:
    """The breaker is process-wide per name."""
    clock = FakeClock()
    first = tripping_policy(clock)
    second = tripping_policy(clock)
    assert first.breaker is second.breaker
    with pytest.raises(CallFailed):
        await first.call(Script(*[transient() for _ in range(3)]))
    with pytest.raises(CircuitOpen):
        await second.call(Script())


def test_conflicting_shared_settings_raise_unless_reconfigured() -> None:
    """A second policy may not silently resize the shared gate or retune the breaker."""
    first = Policy(max_concurrent_calls=4)
    with pytest.raises(anygate.ConfigError, match="already has capacity 4"):
        Policy(max_concurrent_calls=2)
    assert Policy().gate is first.gate
    assert Policy(max_concurrent_calls=4).gate is first.gate
    resized = Policy(max_concurrent_calls=2, reconfigure=True)
    assert resized.gate is first.gate
    assert first.gate.capacity == 2
    with pytest.raises(anygate.ConfigError, match="failure_threshold=5"):
        Policy(circuit_breaker=BreakerConfig(when_open="fail", failure_threshold=2))
    Policy(circuit_breaker=BreakerConfig(when_open="fail", failure_threshold=2), reconfigure=True)
    assert first.breaker is not None
    assert first.breaker.failure_threshold == 2
    assert Policy(gate_name="other", max_concurrent_calls=2).gate is not first.gate


@virtual_time
async def test_raising_max_concurrent_calls_admits_queued_attempts_at_once() -> None:
    """The live resize: queued attempts start as soon as capacity grows."""
    policy = Policy(max_concurrent_calls=1)
    held = policy.gate.acquire_nowait()
    done = anyio.Event()

    async def record() -> None:
        done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(policy.call, record)
        await anyio.wait_all_tasks_blocked()
        assert policy.gate.waiting == 1
        policy.max_concurrent_calls = 2
        await done.wait()
    assert policy.max_concurrent_calls == 2
    policy.max_concurrent_calls = 0
    assert policy.gate.capacity == float("inf")
    held.release()


@virtual_time
async def test_slot_events_report_the_wait() -> None:
    """SlotWaiting when the gate is full, then SlotAdmitted with the exact wait."""
    events: list[Any] = []
    policy = Policy(max_concurrent_calls=1, hooks=[events.append])
    held = policy.gate.acquire_nowait()
    async with anyio.create_task_group() as tg:
        tg.start_soon(policy.call, Script())
        await anyio.sleep(2)
        held.release()
    waiting = [e for e in events if isinstance(e, SlotWaiting)]
    admitted = [e for e in events if isinstance(e, SlotAdmitted)]
    assert [(e.attempt, e.in_flight, e.capacity) for e in waiting] == [(1, 1, 1)]
    assert [(e.attempt, e.waited_s) for e in admitted] == [(1, pytest.approx(2.0))]


async def test_a_raising_hook_is_logged_and_never_breaks_the_call(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A broken hook is logged under 'anygate'; later hooks and the call go on."""
    seen: list[Any] = []

    def broken(event: Any) -> None:
        raise RuntimeError("dashboard down")

    policy = Policy(hooks=[broken, seen.append])
    with caplog.at_level(logging.ERROR, logger="anygate"), anygate.set_testing(True):
        assert await policy.call(Script(transient())) == "ok"
    assert seen
    assert "dashboard down" in caplog.text
    assert "hook" in caplog.text


async def test_secrets_never_reach_messages_events_or_logs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Keys and bearer tokens echoed by a provider are redacted everywhere we write text."""
    events: list[Any] = []
    leaky = ResponseError(
        503, body={"error": {"message": "bad header Authorization: Bearer tok-SECRET-1"}}
    )
    fatal = ResponseError(
        400, body={"error": {"message": "Incorrect API key provided: sk-SECRETSECRET"}}
    )
    policy = Policy(hooks=[events.append])
    with caplog.at_level(logging.DEBUG, logger="anygate"), anygate.set_testing(True):
        with pytest.raises(CallFailed) as info:
            await policy.call(Script(leaky, fatal))
    texts = [str(info.value), info.value.user_message, caplog.text]
    for event in events:
        texts += [str(getattr(event, "message", "")), repr(event)]
    for text in texts:
        assert "tok-SECRET-1" not in text
        assert "sk-SECRETSECRET" not in text
    assert "[REDACTED]" in caplog.text


@virtual_time
async def test_cancellation_during_a_backoff_sleep_is_neutral() -> None:
    """A call cancelled while sleeping between attempts adds nothing to the one failed
    attempt the breaker heard."""
    scope = anyio.CancelScope()
    policy = Policy(
        circuit_breaker=BreakerConfig(when_open="fail", failure_threshold=2),
        retry=RetryConfig(base_delay_ms=5000, cap_delay_ms=5000),
        hooks=[lambda e: scope.cancel() if isinstance(e, anygate.RetryScheduled) else None],
    )
    with scope:
        await policy.call(Script(transient()))
    assert scope.cancelled_caught
    assert policy.breaker is not None
    assert policy.breaker.statistics().failures == 1
    assert policy.breaker.state == "closed"


@virtual_time
async def test_busy_on_a_later_slot_wait_is_neutral() -> None:
    """No slot for the retry is local congestion, not the provider failing: Busy, and the
    breaker heard only the failed attempt."""
    holder: list[anygate.Token] = []
    policy = Policy(
        circuit_breaker=BreakerConfig(when_open="fail", failure_threshold=2),
        max_concurrent_calls=1,
        busy_wait_s=2,
        retry=RetryConfig(base_delay_ms=1000, cap_delay_ms=1000),
        hooks=[
            lambda e: (
                holder.append(policy.gate.acquire_nowait())
                if isinstance(e, anygate.RetryScheduled)
                else None
            )
        ],
    )
    with pytest.raises(anygate.Busy):
        await policy.call(Script(transient()))
    assert policy.breaker is not None
    assert policy.breaker.state == "closed"
    holder[0].release()


async def test_the_half_open_probe_goes_ahead_of_the_gate_queue() -> None:
    """The probe decides for every caller held by the breaker, so it is admitted ahead of
    callers already queued on the gate (issue 30: behind a token-paced backlog it kept the
    breaker half-open for minutes and callers were lost as circuit_open)."""
    clock = FakeClock()
    policy = tripping_policy(clock, max_concurrent_calls=1)
    with pytest.raises(CallFailed):
        await policy.call(Script(*[transient() for _ in range(3)]))
    clock.now += 60
    gate = policy.gate
    holder = gate.acquire_nowait()
    order: list[str] = []

    async def queued() -> None:
        async with gate.acquire():
            order.append("queued")

    async def probe() -> str:
        order.append("probe")
        return "ok"

    async with anyio.create_task_group() as tg:
        tg.start_soon(queued)
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(policy.call, probe)
        await anyio.wait_all_tasks_blocked()
        assert gate.waiting == 2
        holder.release()
    assert order == ["probe", "queued"]
    assert policy.breaker is not None
    assert policy.breaker.state == "closed"


def test_the_half_open_probe_goes_ahead_of_the_gate_queue_on_the_blocking_path() -> None:
    """call_sync's probe, too: a thread queued on the gate first is admitted after it."""
    clock = FakeClock()
    policy = tripping_policy(clock, max_concurrent_calls=1)
    with pytest.raises(CallFailed):
        policy.call_sync(SyncScript(*[transient() for _ in range(3)]))
    clock.now += 60
    gate = policy.gate
    holder = gate.acquire_nowait()
    order: list[str] = []
    queued_waiting = threading.Event()

    def queued() -> None:
        with gate.acquire_sync():
            order.append("queued")

    def probe() -> str:
        order.append("probe")
        return "ok"

    first = threading.Thread(target=queued)
    first.start()
    while gate.waiting < 1:  # a thread's queueing has no event to wait on
        queued_waiting.wait(0.001)
    second = threading.Thread(target=policy.call_sync, args=(probe,))
    second.start()
    while gate.waiting < 2:
        queued_waiting.wait(0.001)
    holder.release()
    first.join(10)
    second.join(10)
    assert order == ["probe", "queued"]
    assert policy.breaker is not None
    assert policy.breaker.state == "closed"


# ---------------------------------------------------------------- a caller alone in an outage


class Outage:
    """An async provider call that answers, fails with 503s from ``down`` until ``up``
    (AnyIO's clock, relative to the outage's creation), then answers again."""

    def __init__(self, down: float, up: float) -> None:
        start = anyio.current_time()
        self.down, self.up = start + down, start + up
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.down <= anyio.current_time() < self.up:
            raise transient()
        return "ok"


def waiting_policy(**breaker: Any) -> tuple[Policy, list[Any]]:
    """The default wait-mode breaker on AnyIO's clock, quick retries, and its events."""
    events: list[Any] = []
    policy = Policy(
        circuit_breaker=BreakerConfig(**breaker),
        retry=RetryConfig(base_delay_ms=100, cap_delay_ms=1000),
        clock=anyio.current_time,
        hooks=[events.append],
    )
    return policy, events


@virtual_time
async def test_a_caller_alone_in_an_outage_waits_for_the_breaker_instead_of_giving_up() -> None:
    """Its 3 attempts fail before the 5 failures that open the breaker: the breaker opens
    on them, the call waits for its probes (its own, not counted) and goes on at recovery."""
    policy, events = waiting_policy()
    outage = Outage(down=1.0, up=41.0)
    assert await policy.call(outage) == "ok"  # the provider has answered once
    await anyio.sleep(1.0)
    started = anyio.current_time()
    assert await policy.call(outage) == "ok"
    assert anyio.current_time() - started >= 40.0 - 1.0  # the outage, less its first second
    opened = [e for e in events if isinstance(e, BreakerStateChanged) and e.new == "open"]
    assert opened[0].failures == 3  # the call's own three, not the threshold's five
    assert policy.breaker is not None
    assert policy.breaker.state == "closed"
    gave_up = [e for e in events if isinstance(e, anygate.GaveUp)]
    assert gave_up == []
    # 3 attempts, one probe every 5 s until the provider is back, the last one through.
    assert outage.calls == 1 + 3 + 8


@virtual_time
async def test_a_provider_that_never_answered_fails_the_caller_at_once() -> None:
    """A wrong address or a broken deployment is no outage: the budget ends the call."""
    policy, _ = waiting_policy()
    outage = Outage(down=0.0, up=math.inf)
    started = anyio.current_time()
    with pytest.raises(CallFailed, match="budget"):
        await policy.call(outage)
    assert anyio.current_time() - started < 5.0  # no breaker wait
    assert outage.calls == 3
    assert policy.breaker is not None
    assert policy.breaker.state == "closed"


@virtual_time
async def test_a_deferred_give_up_is_bounded_by_the_breakers_max_wait() -> None:
    policy, events = waiting_policy(max_wait_sec=30)
    outage = Outage(down=1.0, up=math.inf)
    assert await policy.call(outage) == "ok"
    await anyio.sleep(1.0)
    started = anyio.current_time()
    with pytest.raises(CallFailed, match="circuit_open"):
        await policy.call(outage)
    assert 30.0 <= anyio.current_time() - started < 35.0
    (gave_up,) = [e for e in events if isinstance(e, anygate.GaveUp)]
    assert gave_up.why == "circuit_open"


@virtual_time
async def test_a_fail_mode_breaker_never_defers_a_give_up() -> None:
    policy, _ = waiting_policy(when_open="fail")
    outage = Outage(down=1.0, up=math.inf)
    assert await policy.call(outage) == "ok"
    await anyio.sleep(1.0)
    with pytest.raises(CallFailed, match="budget"):
        await policy.call(outage)
    assert outage.calls == 1 + 3
    assert policy.breaker is not None
    assert policy.breaker.state == "closed"  # 3 of its 5 failures


@virtual_time
async def test_the_testing_switch_never_defers_a_give_up() -> None:
    policy, _ = waiting_policy()
    outage = Outage(down=1.0, up=math.inf)
    assert await policy.call(outage) == "ok"
    await anyio.sleep(1.0)
    with anygate.set_testing(True), pytest.raises(CallFailed, match="budget"):
        await policy.call(outage)


async def test_a_deferred_give_up_tries_once_more_when_the_breaker_closes() -> None:
    """On every backend, a real clock and a 10 ms recovery: the call out of attempts waits
    and probes (a failed probe is not counted) until a probe gets through."""
    events: list[Any] = []
    policy = Policy(
        circuit_breaker=BreakerConfig(recovery_timeout_sec=0.01),
        retry=RetryConfig(base_delay_ms=0, cap_delay_ms=0),
        hooks=[events.append],
    )
    assert await policy.call(Script()) == "ok"
    script = Script(*[transient() for _ in range(4)])
    assert await policy.call(script) == "ok"
    assert script.calls == 5  # 3 attempts, a failed probe, the probe that closed it
    opened = [e for e in events if isinstance(e, BreakerStateChanged) and e.new == "open"]
    assert len(opened) == 2


def test_a_blocking_caller_alone_in_an_outage_waits_for_the_breaker() -> None:
    events: list[Any] = []
    policy = Policy(
        circuit_breaker=BreakerConfig(recovery_timeout_sec=0.01),
        retry=RetryConfig(base_delay_ms=0, cap_delay_ms=0),
        hooks=[events.append],
    )
    assert policy.call_sync(SyncScript()) == "ok"
    script = SyncScript(*[transient() for _ in range(5)])
    assert policy.call_sync(script) == "ok"
    assert script.calls == 6
    never = SyncScript(*[transient() for _ in range(3)])
    # The testing switch keeps the budget: 3 attempts and the call fails.
    with anygate.set_testing(True), pytest.raises(CallFailed):
        policy.call_sync(never)
    assert never.calls == 3
