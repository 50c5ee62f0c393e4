"""Policy.call_sync: the same policy from plain threads, sharing gate, breaker and events."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anyio
import pytest

import anygate
from anygate import (
    AdaptiveConfig,
    BreakerConfig,
    CallFailed,
    CircuitOpen,
    Policy,
    RetryConfig,
    RetryScheduled,
)
from tests.policy_helpers import FakeClock, Script, SyncScript, burst, quota, transient

# Sleeps in these tests are zero (testing switch or 0 ms bases): no wall-clock timing.
INSTANT = RetryConfig(base_delay_ms=0, cap_delay_ms=0)


def test_retries_then_succeeds_and_reports_events() -> None:
    """Transient failures are retried on the calling thread; events carry the budget."""
    events: list[Any] = []
    script = SyncScript(transient(), transient())
    policy = Policy(retry=INSTANT, hooks=[events.append])
    assert policy.call_sync(script, 1, key="v") == "ok"
    assert script.calls == 3
    assert [(e.attempt, e.max_attempts) for e in events if isinstance(e, RetryScheduled)] == [
        (1, 3),
        (2, 3),
    ]
    assert policy.gate.in_flight == 0


def test_burst_rate_budget_and_breaker_neutrality_on_the_sync_path() -> None:
    """Ported (sync): a throttle budget of 2 and its exhaustion does not trip the
    breaker; transient exhaustion does."""
    policy = Policy(
        retry=RetryConfig(base_delay_ms=0, cap_delay_ms=0, throttle_attempts=2),
        circuit_breaker=BreakerConfig(when_open="fail", failure_threshold=1),
        adaptive_concurrency=AdaptiveConfig(
            pause_ms=1
        ),  # the burst pause is real time on this path
    )
    script = SyncScript(burst(), burst(), burst())
    with pytest.raises(CallFailed) as info:
        policy.call_sync(script)
    assert (script.calls, info.value.attempts) == (2, 2)
    assert policy.breaker is not None
    assert policy.breaker.state == "closed"
    with pytest.raises(CallFailed):
        policy.call_sync(SyncScript(transient(), transient(), transient()))
    assert policy.breaker.state == "open"
    with pytest.raises(CircuitOpen):
        policy.call_sync(SyncScript())


def test_non_retriable_fails_once_with_the_cause() -> None:
    """quota on the sync path: one attempt, the provider error as __cause__."""
    error = quota()
    with pytest.raises(CallFailed) as info:
        Policy().call_sync(SyncScript(error))
    assert info.value.__cause__ is error
    assert info.value.attempts == 1


def test_many_threads_never_exceed_the_cap() -> None:
    """40 threads through a cap of 3: at most 3 attempts run at once, all succeed."""
    policy = Policy(max_concurrent_calls=3, retry=INSTANT)
    lock = threading.Lock()
    running = 0
    peak = 0
    barrier = threading.Barrier(3, timeout=10)

    def work(i: int) -> int:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        try:
            if i < 3:
                barrier.wait()  # the first three overlap for sure
            return i
        finally:
            with lock:
                running -= 1

    with ThreadPoolExecutor(max_workers=12) as pool:
        results = list(pool.map(lambda i: policy.call_sync(work, i), range(40)))
    assert results == list(range(40))
    assert peak == 3
    assert policy.gate.in_flight == 0


def test_a_thread_in_backoff_lets_another_thread_take_the_only_slot() -> None:
    """Ported (threads): the slot is released before the backoff. The retry hook of thread A
    holds A in its backoff until thread B has run through the only slot."""
    b_done = threading.Event()
    seen: list[int] = []

    def hold_a_until_b_ran(event: Any) -> None:
        if isinstance(event, RetryScheduled):
            assert b_done.wait(10), "B never got the slot A should have released"

    policy = Policy(max_concurrent_calls=1, retry=INSTANT, hooks=[hold_a_until_b_ran])
    a_failed = threading.Event()
    a_calls = 0

    def a() -> str:
        nonlocal a_calls
        a_calls += 1
        if a_calls == 1:
            a_failed.set()
            raise transient()
        return "ok"

    def b() -> str:
        seen.append(policy.gate.in_flight)
        return "b"

    def run_b() -> None:
        assert a_failed.wait(10)
        plain = Policy(gate=policy.gate, circuit_breaker=None)
        assert plain.call_sync(b) == "b"
        b_done.set()

    thread = threading.Thread(target=run_b)
    thread.start()
    assert policy.call_sync(a) == "ok"
    thread.join(10)
    assert seen == [1]
    assert a_calls == 2


def test_call_and_call_sync_share_one_breaker() -> None:
    """A breaker opened by the sync path fails async calls fast, and vice versa."""
    clock = FakeClock()
    policy = Policy(
        retry=INSTANT,
        circuit_breaker=BreakerConfig(when_open="fail", failure_threshold=1),
        clock=clock,
    )
    with pytest.raises(CallFailed):
        policy.call_sync(SyncScript(transient(), transient(), transient()))

    async def main() -> None:
        with pytest.raises(CircuitOpen):
            await policy.call(Script())
        clock.now += 60
        assert await policy.call(Script()) == "ok"

    anyio.run(main)
    assert policy.call_sync(SyncScript()) == "ok"


def test_deadline_bounds_the_wait_for_a_slot() -> None:
    """With the gate full, deadline= turns into a bounded wait that ends in Busy."""
    policy = Policy(max_concurrent_calls=1)
    held = policy.gate.acquire_nowait()
    script = SyncScript()
    with pytest.raises(anygate.Busy):
        policy.call_sync(script, deadline=0.01)
    assert script.calls == 0
    held.release()


def test_retry_after_past_the_deadline_gives_up_now() -> None:
    """A Retry-After longer than the time left fails at once on the sync path too."""
    script = SyncScript(transient(retry_after="60"))
    with pytest.raises(CallFailed) as info:
        Policy().call_sync(script, deadline=30)
    assert script.calls == 1
    assert "(deadline)" in str(info.value)


def test_testing_switch_applies_to_the_sync_path() -> None:
    """set_testing zeroes even a long Retry-After and caps attempts."""
    script = SyncScript(*[transient(retry_after="100") for _ in range(5)])
    with anygate.set_testing(True, attempts=3), pytest.raises(CallFailed):
        Policy().call_sync(script)
    assert script.calls == 3


def test_control_flow_exceptions_propagate_unchanged() -> None:
    """Declared control-flow exceptions are not wrapped on the sync path either."""

    class Interrupt(Exception):
        pass

    signal = Interrupt()
    with pytest.raises(Interrupt) as info:
        Policy(control_flow=[Interrupt]).call_sync(SyncScript(signal))
    assert info.value is signal


def test_an_async_function_is_refused_without_a_never_awaited_warning() -> None:
    """call_sync(async_fn) is a TypeError; the coroutine is closed, not leaked."""

    async def fn() -> None:
        return None

    policy = Policy(max_concurrent_calls=1)
    with pytest.raises(TypeError, match=r"await policy\.call"):
        policy.call_sync(fn)
    assert policy.gate.in_flight == 0


def test_call_sync_refuses_to_block_an_event_loop() -> None:
    """From inside a running loop, call_sync raises instead of freezing the loop."""

    async def main() -> None:
        with pytest.raises(RuntimeError, match="would block the loop"):
            Policy().call_sync(SyncScript())

    anyio.run(main)


def test_a_window_hold_past_the_deadline_fails_the_call_as_a_pause_does() -> None:
    """A retry held by the per-minute estimate (a confirmed RPM 429: the minute holds its
    3 accepted sends) past the deadline ends the call with CallFailed "deadline" and the
    last error, as a burst pause past the deadline does, not with a bare Busy."""
    rpm = anygate.ResponseError(
        429,
        body={
            "error": {
                "code": "rate_limit_exceeded",
                "message": "Rate limit reached on "
                "requests per min (RPM): Limit 3, Used 3, Requested 1.",
            }
        },
    )
    # Short backoffs: the retries must reach the hold, not give up on their own sleep.
    policy = Policy(name="sync-window-hold", retry=RetryConfig(base_delay_ms=1, cap_delay_ms=2))
    for _ in range(3):
        assert policy.call_sync(SyncScript()) == "ok"
    # The first holds nothing; the second holds sends at 3, the provider's own number
    # ("Limit 3, Used 3") where our count agrees: no check goes above it, and the window
    # frees a minute after its sends, past the deadline.
    script = SyncScript(rpm, rpm, rpm, rpm)
    with pytest.raises(CallFailed) as info:
        policy.call_sync(script, deadline=5.0)
    assert script.calls == 2
    assert "(deadline)" in str(info.value)
    assert policy.gate.rate is None  # a request limit in words is the estimate's to count


def test_a_retry_the_rate_admits_past_the_deadline_fails_the_call() -> None:
    """A gate paced at 3 requests a minute: the first attempt spends its budget, and its
    retry's admission lies 20 s away, past the deadline. The call fails as "deadline"
    with the 503, as ``await policy.call`` does, not with the gate's bare Busy."""
    down = anygate.ResponseError(503, body={"error": {"message": "Service Unavailable"}})
    now = [1000.0]
    gate = anygate.Gate(
        name="sync-rate-hold",
        rate=anygate.Rate(requests_per_minute=3, burst_s=20),
        clock=lambda: now[0],
    )
    now[0] += 60  # the budget full: one request (20 s of 3 a minute)
    policy = Policy(
        name="sync-rate-hold",
        gate=gate,
        retry=RetryConfig(base_delay_ms=1, cap_delay_ms=2),
        adaptive_concurrency=False,
    )
    script = SyncScript(down)
    with pytest.raises(CallFailed) as info:
        policy.call_sync(script, deadline=5.0)
    assert script.calls == 1
    assert "(deadline)" in str(info.value)
    assert info.value.__cause__ is down
    # A first attempt the rate refuses is the gate's Busy, as before.
    with pytest.raises(anygate.Busy):
        policy.call_sync(SyncScript(), deadline=5.0)
