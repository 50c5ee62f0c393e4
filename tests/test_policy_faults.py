"""A hook raising a BaseException strands nothing: not the probe, not the attempt's slot.

Regression tests for issue 9, faults 2 and 3. Events are emitted right after the breaker
permit or the gate token is taken; before the fix a ``KeyboardInterrupt`` from a hook there
(or a Ctrl-C that trio delivers inside the hook, which is the same thing to the code
around it) left the breaker half-open forever or the gate full until garbage collection.

The decision (documented in ``docs/guarantees.md``): an ``Exception`` from a hook is
logged and dropped; any other ``BaseException`` propagates after the call has cleaned up.
"""

from __future__ import annotations

import contextlib
import random
import threading
from typing import Any

import pytest

import anygate
from anygate import (
    BreakerConfig,
    BreakerStateChanged,
    CallFailed,
    GaveUp,
    LimitChanged,
    Policy,
    RetryConfig,
    RetryScheduled,
    SlotAdmitted,
)
from tests.policy_helpers import FakeClock, Script, SyncScript, burst, transient

pytestmark = pytest.mark.anyio


class RaiseOn:
    """A hook raising ``exc`` on the first event matching ``kind`` (and ``new`` state)."""

    def __init__(self, kind: type, exc: type[BaseException], new: str | None = None) -> None:
        self.kind, self.exc, self.new = kind, exc, new
        self.armed = True

    def __call__(self, event: Any) -> None:
        if not self.armed or not isinstance(event, self.kind):
            return
        if self.new is not None and event.new != self.new:
            return
        self.armed = False
        raise self.exc


def tripped_policy(clock: FakeClock, **kwargs: Any) -> Policy:
    """A policy whose breaker (threshold 1, 60 s) is open, with the recovery time passed."""
    policy = Policy(
        circuit_breaker=BreakerConfig(when_open="fail", failure_threshold=1, recovery_timeout_sec=60),
        retry=RetryConfig(max_attempts=1, throttle_attempts=1),
        clock=clock,
        **kwargs,
    )
    breaker = policy.breaker
    assert breaker is not None
    breaker.acquire().failure()
    clock.now += 60
    return policy


@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit])
async def test_a_hook_raising_on_half_open_does_not_wedge_the_breaker(
    anyio_backend: Any, exc: type[BaseException]
) -> None:
    """The probe's admission event raises: the probe is handed back and the next caller
    probes (before the fix every later call got CircuitOpen, forever)."""
    clock = FakeClock()
    hook = RaiseOn(BreakerStateChanged, exc, new="half_open")
    policy = tripped_policy(clock, hooks=[hook])
    script = Script()
    with pytest.raises(exc):
        await policy.call(script)
    assert script.calls == 0
    assert policy.breaker is not None
    assert policy.breaker.would_admit()
    assert await policy.call(script) == "ok"
    assert policy.breaker.state == "closed"


def test_a_hook_raising_on_half_open_does_not_wedge_the_breaker_sync() -> None:
    """The same through call_sync."""
    clock = FakeClock()
    policy = tripped_policy(clock, hooks=[RaiseOn(BreakerStateChanged, KeyboardInterrupt)])
    with pytest.raises(KeyboardInterrupt):
        policy.call_sync(SyncScript())
    assert policy.call_sync(SyncScript()) == "ok"
    assert policy.breaker is not None
    assert policy.breaker.state == "closed"


async def test_a_hook_raising_on_slot_admitted_gives_the_slot_back(anyio_backend: Any) -> None:
    """SlotAdmitted raises KeyboardInterrupt: the slot is free at once, while the
    exception (and its traceback, which references the token) is still alive."""
    hook = RaiseOn(SlotAdmitted, KeyboardInterrupt)
    policy = Policy(max_concurrent_calls=1, busy_wait_s=0, hooks=[hook])
    with pytest.raises(KeyboardInterrupt) as info:
        await policy.call(Script())
    assert info.value.__traceback__ is not None
    assert policy.gate.in_flight == 0
    assert await policy.call(Script()) == "ok"


def test_a_hook_raising_on_slot_admitted_gives_the_slot_back_sync() -> None:
    """The same through call_sync, on a plain thread."""
    hook = RaiseOn(SlotAdmitted, KeyboardInterrupt)
    policy = Policy(max_concurrent_calls=1, busy_wait_s=0, hooks=[hook])
    with pytest.raises(KeyboardInterrupt) as info:
        policy.call_sync(SyncScript())
    assert info.value.__traceback__ is not None
    assert policy.gate.in_flight == 0
    assert policy.call_sync(SyncScript()) == "ok"


@pytest.mark.parametrize("kind", [RetryScheduled, GaveUp, LimitChanged])
async def test_a_hook_raising_later_in_the_call_settles_everything(
    anyio_backend: Any, kind: type
) -> None:
    """KeyboardInterrupt from RetryScheduled, GaveUp or LimitChanged: no slot held, the
    probe settled as the attempt it was (a failed 503 reopens the breaker; a burst 429 is
    neutral and hands the probe on)."""
    clock = FakeClock()
    policy = Policy(
        max_concurrent_calls=1,
        circuit_breaker=BreakerConfig(when_open="fail", failure_threshold=1, recovery_timeout_sec=60),
        retry=RetryConfig(max_attempts=2, base_delay_ms=0, cap_delay_ms=0),
        adaptive_concurrency=anygate.AdaptiveConfig(pause_ms=0),
        clock=clock,
        hooks=[RaiseOn(kind, KeyboardInterrupt)],
    )
    assert policy.breaker is not None
    policy.breaker.acquire().failure()
    clock.now += 60
    errors = (burst(), burst()) if kind is LimitChanged else (transient(), transient())
    with pytest.raises(KeyboardInterrupt):
        await policy.call(Script(*errors))
    assert policy.gate.in_flight == 0
    expected = "half_open" if kind is LimitChanged else "open"
    assert policy.breaker.state == expected
    clock.now += 60
    assert await policy.call(Script()) == "ok"


async def test_a_hook_raising_on_the_closing_event_leaves_the_breaker_closed(
    anyio_backend: Any,
) -> None:
    """The probe's success is recorded before any hook hears of it."""
    clock = FakeClock()
    policy = tripped_policy(clock, hooks=[RaiseOn(BreakerStateChanged, SystemExit, new="closed")])
    with pytest.raises(SystemExit):
        await policy.call(Script())
    assert policy.breaker is not None
    assert policy.breaker.state == "closed"
    assert policy.gate.in_flight == 0


async def test_an_ordinary_hook_exception_is_still_contained(anyio_backend: Any) -> None:
    """The other half of the decision: an Exception from a hook never breaks the call."""
    clock = FakeClock()
    policy = tripped_policy(clock, hooks=[RaiseOn(BreakerStateChanged, RuntimeError)])
    assert await policy.call(Script()) == "ok"
    assert policy.breaker is not None
    assert policy.breaker.state == "closed"


def test_hooks_raising_in_many_threads_leave_gate_and_breaker_consistent() -> None:
    """8 threads, hooks raising KeyboardInterrupt at random events, a flaky provider:
    afterwards the gate is empty and the breaker admits a probe once recovered."""
    clock = FakeClock()
    rng = random.Random(4)
    lock = threading.Lock()

    def hook(event: Any) -> None:
        with lock:
            draw = rng.random()
        if draw < 0.15:
            raise KeyboardInterrupt

    policy = Policy(
        max_concurrent_calls=2,
        busy_wait_s=None,
        circuit_breaker=BreakerConfig(when_open="fail", failure_threshold=2, recovery_timeout_sec=1),
        retry=RetryConfig(max_attempts=2, base_delay_ms=0, cap_delay_ms=0),
        adaptive_concurrency=False,
        clock=clock,
        hooks=[hook],
    )

    def provider() -> str:
        with lock:
            draw = rng.random()
            clock.now += 0.3
        if draw < 0.6:
            raise transient()
        return "ok"

    def worker() -> None:
        for _ in range(200):
            with contextlib.suppress(KeyboardInterrupt, CallFailed, anygate.CircuitOpen):
                policy.call_sync(provider)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert policy.gate.statistics().in_flight == 0
    clock.now += 10
    assert policy.breaker is not None
    assert policy.breaker.would_admit()
