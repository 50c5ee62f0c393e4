"""Policy.call: one slot per attempt, jitter, Retry-After, budgets, deadlines, timeouts."""

from __future__ import annotations

import math
import random
import re
from typing import Any

import anyio
import pytest

import anygate
from anygate import CallFailed, Gate, GaveUp, Policy, Reason, RetryConfig, RetryScheduled
from tests.conftest import mock_clock
from tests.policy_helpers import Script, StreamChunkTimeoutError, burst, quota, transient

pytestmark = pytest.mark.anyio
virtual_time = pytest.mark.parametrize("anyio_backend", [mock_clock()])


def retries(events: list[Any]) -> list[RetryScheduled]:
    return [e for e in events if isinstance(e, RetryScheduled)]


async def test_success_passes_arguments_and_holds_exactly_one_slot() -> None:
    """fn gets args and kwargs unchanged and runs holding one slot, released afterwards."""
    policy = Policy(max_concurrent_calls=2)

    async def fn(a: int, *, b: int) -> tuple[int, int, int]:
        return a, b, policy.gate.in_flight

    assert await policy.call(fn, 1, b=2) == (1, 2, 1)
    assert policy.gate.in_flight == 0


@virtual_time
async def test_retries_sleep_exactly_the_scheduled_delays() -> None:
    """Two transient failures, then success; virtual time equals the announced waits."""
    events: list[Any] = []
    script = Script(transient(), transient())
    policy = Policy(rng=random.Random(3), hooks=[events.append])
    start = anyio.current_time()
    assert await policy.call(script) == "ok"
    waits = [e.wait_ms for e in retries(events)]
    assert len(waits) == 2
    assert 1000 <= waits[0] <= 3000
    assert anyio.current_time() - start == pytest.approx(sum(waits) / 1000, abs=1e-3)
    assert script.calls == 3


@virtual_time
async def test_a_call_in_backoff_lets_another_caller_take_its_only_slot() -> None:
    """Ported: backoff sleeps hold no slot. With capacity 1, B runs and finishes while A
    sleeps between its attempts."""
    order: list[str] = []
    a_sleeping = anyio.Event()
    policy = Policy(
        max_concurrent_calls=1,
        retry=RetryConfig(base_delay_ms=5000, cap_delay_ms=5000),
        hooks=[lambda e: a_sleeping.set() if isinstance(e, RetryScheduled) else None],
    )
    a_errors = [transient()]

    async def a() -> str:
        order.append("A")
        if a_errors:
            raise a_errors.pop()
        return "a"

    async def b() -> str:
        order.append(f"B with {policy.gate.in_flight} in flight")
        return "b"

    async with anyio.create_task_group() as tg:
        tg.start_soon(policy.call, a)
        await a_sleeping.wait()
        assert policy.gate.in_flight == 0
        assert await policy.call(b) == "b"
    assert order == ["A", "B with 1 in flight", "A"]


@virtual_time
async def test_a_burst_retry_announces_the_gates_pause_not_a_zero_sleep() -> None:
    """With adaptive concurrency on, a burst throttle pauses the gate (5 s by default) and
    the call sleeps nothing of its own: the event and its message say the pause."""
    events: list[Any] = []
    script = Script(burst())
    policy = Policy(
        name="announces-pause",
        gate_name="announces-pause",  # its own gate: the adaptive limit is the gate's
        hooks=[events.append],
        circuit_breaker=False,
        clock=anyio.current_time,
    )
    start = anyio.current_time()
    assert await policy.call(script) == "ok"
    (retry,) = retries(events)
    assert retry.wait_ms == 5000
    assert retry.message.endswith("Retrying in 5s.")
    assert anyio.current_time() - start >= 5.0  # the pause it announced held it back


@virtual_time
async def test_burst_rate_reports_its_effective_budget_in_events() -> None:
    """Ported: a burst-rate budget of 2 allows 2 attempts, and events say 1/2 (not the
    throttle budget of 12)."""
    events: list[Any] = []
    script = Script(burst(), burst(), burst())
    two = RetryConfig(reason_budgets={"burst_rate": 2})
    policy = Policy(hooks=[events.append], retry=two, adaptive_concurrency=False)
    with pytest.raises(CallFailed) as info:
        await policy.call(script)
    assert script.calls == 2
    assert info.value.attempts == 2
    (retry,) = retries(events)
    assert (retry.attempt, retry.max_attempts, retry.reason) == (1, 2, Reason.BURST_RATE)
    assert 5000 <= retry.wait_ms <= 8000
    seconds = max(1, round(retry.wait_ms / 1000))
    assert retry.message == (
        f"LLM request retry 1/2: provider is throttling request burst rate. Retrying in {seconds}s."
    )
    gave_up = [e for e in events if isinstance(e, GaveUp)]
    assert [(g.attempts, g.max_attempts, g.why) for g in gave_up] == [(2, 2, "budget")]
    assert "rate increased too quickly" in info.value.user_message


@virtual_time
async def test_concurrent_burst_failures_get_distinct_delays() -> None:
    """Ported: a fleet failing together does not retry in lockstep."""
    events: list[Any] = []
    # Without adaptive concurrency (which times burst retries with its pause), the per-call
    # jitter spreads them.
    policy = Policy(rng=random.Random(2024), hooks=[events.append], adaptive_concurrency=False)
    async with anyio.create_task_group() as tg:
        for _ in range(20):
            tg.start_soon(policy.call, Script(burst()))
    waits = [e.wait_ms for e in retries(events)]
    assert len(waits) == 20
    assert len(set(waits)) == 20
    assert all(5000 <= w <= 8000 for w in waits)
    assert max(waits) - min(waits) > 1500


@virtual_time
async def test_retry_after_is_honoured_without_jitter() -> None:
    """Ported: a Retry-After is slept exactly, and the random source is not consulted."""

    class NoJitter:
        def uniform(self, a: float, b: float) -> float:
            raise AssertionError("jitter must not be drawn when Retry-After is given")

    events: list[Any] = []
    policy = Policy(rng=NoJitter(), hooks=[events.append])
    start = anyio.current_time()
    assert await policy.call(Script(transient(retry_after="2.5"))) == "ok"
    assert anyio.current_time() - start == pytest.approx(2.5)
    (retry,) = retries(events)
    assert (retry.wait_ms, retry.from_retry_after) == (2500, True)


@virtual_time
async def test_retry_after_above_the_ceiling_gives_up_at_once() -> None:
    """A Retry-After beyond retry_after_max_s fails now instead of retrying early."""
    events: list[Any] = []
    script = Script(transient(retry_after="121"))
    policy = Policy(hooks=[events.append])
    start = anyio.current_time()
    with pytest.raises(CallFailed) as info:
        await policy.call(script)
    assert anyio.current_time() == start
    assert (script.calls, info.value.attempts) == (1, 1)
    assert [e.why for e in events if isinstance(e, GaveUp)] == ["retry_after_ceiling"]
    assert info.value.verdict.retry_after == 121


@virtual_time
async def test_retry_after_longer_than_the_time_left_gives_up_now() -> None:
    """No oversleeping: a Retry-After ending past the deadline fails immediately."""
    script = Script(transient(retry_after="30"))
    start = anyio.current_time()
    with pytest.raises(CallFailed) as info:
        await Policy().call(script, deadline=10)
    assert anyio.current_time() == start
    assert isinstance(info.value.__cause__, anygate.ResponseError)
    assert "(deadline)" in str(info.value)


@virtual_time
async def test_a_jittered_sleep_past_the_deadline_is_not_attempted() -> None:
    """The call fails with the last verdict instead of sleeping into the deadline."""
    script = Script(transient())
    policy = Policy(retry=RetryConfig(base_delay_ms=5000, cap_delay_ms=5000))
    start = anyio.current_time()
    with pytest.raises(CallFailed) as info:
        await policy.call(script, deadline=4.9)
    assert anyio.current_time() == start
    assert info.value.verdict.reason is Reason.TRANSIENT
    assert info.value.verdict.status == 503


@virtual_time
async def test_the_deadline_cuts_a_hung_attempt() -> None:
    """A hung attempt ends at the deadline with CallFailed; the breaker is not charged."""

    async def hang() -> None:
        await anyio.sleep(math.inf)

    policy = Policy(max_concurrent_calls=1)
    start = anyio.current_time()
    with pytest.raises(CallFailed) as info:
        await policy.call(hang, deadline=5)
    assert anyio.current_time() - start == pytest.approx(5)
    assert isinstance(info.value.__cause__, TimeoutError)
    assert info.value.verdict.reason is Reason.TRANSIENT
    assert policy.gate.in_flight == 0
    assert policy.breaker is not None
    assert policy.breaker.statistics().failures == 0


@virtual_time
async def test_the_deadline_while_waiting_for_a_slot_raises_busy() -> None:
    """If the deadline ends the wait for a slot, the caller gets Busy (HTTP 429 material)."""
    policy = Policy(max_concurrent_calls=1)
    held = policy.gate.acquire_nowait()
    script = Script()
    start = anyio.current_time()
    with pytest.raises(anygate.Busy) as info:
        await policy.call(script, deadline=3)
    assert anyio.current_time() - start == pytest.approx(3)
    assert info.value.waited == pytest.approx(3)
    assert script.calls == 0
    held.release()
    assert policy.gate.in_flight == 0


@virtual_time
async def test_busy_wait_s_bounds_each_wait_for_a_slot() -> None:
    """busy_wait_s maps to gate.acquire(timeout=...): Busy after exactly that long."""
    policy = Policy(max_concurrent_calls=1, busy_wait_s=7)
    held = policy.gate.acquire_nowait()
    start = anyio.current_time()
    with pytest.raises(anygate.Busy):
        await policy.call(Script())
    assert anyio.current_time() - start == pytest.approx(7)
    held.release()


@virtual_time
async def test_an_enclosing_scope_deadline_skips_a_retry_that_cannot_finish() -> None:
    """An enclosing cancel scope's deadline counts too: the retry that would sleep past it
    is not attempted, and the call fails cleanly before the scope fires."""
    script = Script(*[transient() for _ in range(5)])
    policy = Policy(retry=RetryConfig(max_attempts=10, base_delay_ms=3000, cap_delay_ms=3000))
    start = anyio.current_time()
    with anyio.move_on_after(4) as scope, pytest.raises(CallFailed) as info:
        await policy.call(script)
    assert not scope.cancelled_caught
    assert anyio.current_time() - start == pytest.approx(3)
    assert info.value.attempts == 2


@virtual_time
async def test_an_enclosing_cancel_scope_propagates_unchanged() -> None:
    """Cancellation from outside is never wrapped or retried; the slot comes back."""

    async def hang() -> None:
        await anyio.sleep(math.inf)

    policy = Policy(max_concurrent_calls=1)
    with anyio.move_on_after(2) as scope:
        await policy.call(hang)
    assert scope.cancelled_caught
    assert policy.gate.in_flight == 0


@virtual_time
async def test_attempt_timeout_turns_a_hang_into_a_transient_retry() -> None:
    """attempt_timeout_s cancels one attempt, which is retried like any transient error."""
    events: list[Any] = []
    calls = 0

    async def first_hangs() -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            await anyio.sleep(math.inf)
        return "ok"

    policy = Policy(
        attempt_timeout_s=2,
        retry=RetryConfig(base_delay_ms=1000, cap_delay_ms=1000),
        hooks=[events.append],
    )
    start = anyio.current_time()
    assert await policy.call(first_hangs) == "ok"
    assert anyio.current_time() - start == pytest.approx(3)
    (retry,) = retries(events)
    assert retry.reason is Reason.TRANSIENT
    assert "timed out after 2s" in retry.verdict.detail


async def test_cancellation_inside_fn_is_never_retried() -> None:
    """fn cancelled mid-call: the cancellation propagates after exactly one attempt."""
    calls = 0

    async def cancelled() -> None:
        nonlocal calls
        calls += 1
        scope.cancel()
        await anyio.sleep(1)

    policy = Policy()
    with anyio.CancelScope() as scope:
        await policy.call(cancelled)
    assert scope.cancelled_caught
    assert calls == 1
    assert policy.gate.in_flight == 0


async def test_base_exceptions_propagate_unchanged_and_are_not_retried() -> None:
    """A BaseException that is not an Exception (KeyboardInterrupt-like) is never retried."""

    class Stop(BaseException):
        pass

    stop = Stop()
    script = Script(stop)
    with pytest.raises(Stop) as info:
        await Policy().call(script)
    assert info.value is stop
    assert script.calls == 1


async def test_a_non_retriable_failure_fails_at_once_with_the_cause() -> None:
    """quota: one attempt, CallFailed with verdict, cause and the quota wording."""
    error = quota()
    with pytest.raises(CallFailed) as info:
        await Policy().call(Script(error))
    failed = info.value
    assert (failed.attempts, failed.verdict.reason, failed.verdict.retriable) == (
        1,
        Reason.QUOTA,
        False,
    )
    assert failed.__cause__ is error
    assert "out of quota" in failed.user_message
    assert re.search(r"failed after 1 attempt\(s\) \(not_retriable\): quota", str(failed))


async def test_stream_chunk_timeouts_have_their_own_budget_of_two() -> None:
    """Per-exception-class budget: StreamChunkTimeoutError gets 2 attempts, not 3, and the
    user is told to ask for shorter output."""
    script = Script(*[StreamChunkTimeoutError("no chunk in 120s") for _ in range(3)])
    with anygate.set_testing(True), pytest.raises(CallFailed) as info:
        await Policy().call(script)
    assert (script.calls, info.value.attempts) == (2, 2)
    assert "shorter" in info.value.user_message


async def test_the_tightest_budget_wins() -> None:
    """retry_throttle_attempts caps throttles; per-reason budgets only tighten it."""
    generous = RetryConfig(throttle_attempts=2, reason_budgets={"burst_rate": 5})
    script = Script(*[burst() for _ in range(5)])
    with anygate.set_testing(True), pytest.raises(CallFailed):
        await Policy(retry=generous).call(script)
    assert script.calls == 2


@virtual_time
async def test_the_testing_switch_zeroes_backoff_and_caps_attempts() -> None:
    """set_testing(True, attempts=2): no virtual time passes, at most 2 attempts, and the old
    settings return on exit."""
    script = Script(*[transient(retry_after="30") for _ in range(5)])
    start = anyio.current_time()
    with anygate.set_testing(True, attempts=2):
        assert anygate.is_testing()
        with pytest.raises(CallFailed):
            await Policy().call(script)
    assert not anygate.is_testing()
    assert anyio.current_time() == start
    assert script.calls == 2


async def test_fn_must_return_an_awaitable() -> None:
    """A blocking function passed to call() is a TypeError, and the slot comes back."""
    policy = Policy(max_concurrent_calls=1)
    with pytest.raises(TypeError, match="call_sync"):
        await policy.call(lambda: "not awaitable")
    assert policy.gate.in_flight == 0


async def test_explicit_gate_is_used_as_is() -> None:
    """gate= overrides the shared lookup and is never resized."""
    gate = Gate(3, name="mine")
    policy = Policy(gate=gate, max_concurrent_calls=1)
    assert policy.gate is gate
    assert gate.capacity == 3


@pytest.mark.parametrize(
    ("deadline", "error"), [(-1, ValueError), (math.nan, ValueError), ("5", TypeError)]
)
async def test_bad_deadlines_are_rejected(deadline: Any, error: type[Exception]) -> None:
    """deadline must be seconds >= 0 or None; nothing is attempted otherwise."""
    script = Script()
    with pytest.raises(error, match="deadline"):
        await Policy().call(script, deadline=deadline)
    assert script.calls == 0
