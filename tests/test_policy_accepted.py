"""An attempt the provider has accepted (status and headers in, the body still to come)
releases the breaker's and the burst pause's waiters at that moment (issue 30 item 4).

Timing tests run on trio's MockClock, so "released at acceptance, while the probe still
streams" is an exact instant; the blocking form runs on threads, ordered with events.
"""

from __future__ import annotations

import threading
from typing import Any

import anyio
import pytest

from anygate import (
    Attempt,
    BreakerStateChanged,
    CallFailed,
    CircuitBreaker,
    Policy,
    RetryConfig,
)
from tests.conftest import mock_clock
from tests.policy_helpers import FakeClock, burst, transient

pytestmark = pytest.mark.anyio
virtual_time = pytest.mark.parametrize("anyio_backend", [mock_clock()])


def open_breaker(clock: Any, *, threshold: int = 1, recovery: float = 10.0) -> CircuitBreaker:
    """A breaker opened by ``threshold`` failures, on ``clock``."""
    breaker = CircuitBreaker("probe", failure_threshold=threshold, recovery_timeout=recovery)
    breaker._clock = clock  # the test's clock (the constructor's default is time.monotonic)
    for _ in range(threshold):
        breaker.acquire().failure()
    assert breaker.state == "open"
    return breaker


def breaker_policy(breaker: CircuitBreaker, **kwargs: Any) -> Policy:
    """Waits for the breaker (the default); no adaptive pause; one attempt per call unless
    ``retry`` says otherwise."""
    kwargs.setdefault("retry", RetryConfig(max_attempts=1))
    return Policy(breaker=breaker, adaptive_concurrency=False, **kwargs)


# ---------------------------------------------------------------- the breaker itself


def test_an_accepted_probe_closes_the_breaker_and_its_outcome_still_counts() -> None:
    """Acceptance closes a half-open breaker at once; the probe's later failure (a stream
    that broke) counts once towards the threshold and does not reopen it."""
    clock = FakeClock()
    breaker = open_breaker(clock, threshold=2)
    clock.now = 10.0
    probe = breaker.acquire()
    assert probe.probe
    assert breaker.state == "half_open"
    change = probe.accepted()
    assert isinstance(change, BreakerStateChanged)
    assert (change.old, change.new) == ("half_open", "closed")
    assert breaker.state == "closed"
    assert not probe.done  # the outcome is still to come
    probe.failure()
    stats = breaker.statistics()
    assert (stats.state, stats.failures, stats.opened) == ("closed", 1, 1)


def test_accepted_is_idempotent_and_a_no_op_once_the_outcome_is_in() -> None:
    """Acceptance on a closed breaker changes nothing; a second acceptance counts once; one
    after the outcome (a failed probe) does not close the reopened breaker."""
    clock = FakeClock()
    breaker = CircuitBreaker("probe", failure_threshold=1, recovery_timeout=10.0)
    breaker._clock = clock
    assert breaker.acquire().accepted() is None  # closed: nothing waits
    breaker.acquire().failure()
    clock.now = 10.0
    probe = breaker.acquire()
    probe.failure()  # the probe failed: open again
    assert probe.accepted() is None
    assert breaker.state == "open"
    clock.now = 20.0
    probe = breaker.acquire()
    assert probe.accepted() is not None
    assert probe.accepted() is None
    probe.success()
    assert breaker.statistics().failures == 0


def test_a_call_sent_before_the_opening_is_no_news_when_accepted() -> None:
    """A permit taken before the breaker opened (its request was sent to the provider that
    then fell over) does not close the breaker by being accepted late."""
    clock = FakeClock()
    breaker = CircuitBreaker("probe", failure_threshold=1, recovery_timeout=10.0)
    breaker._clock = clock
    old = breaker.acquire()
    breaker.acquire().failure()
    assert old.accepted() is None
    assert breaker.state == "open"


def test_accepted_from_another_thread_releases_a_thread_waiting_for_the_breaker() -> None:
    """The acceptance may come from whichever thread reads the response; a thread waiting
    for the breaker (parked in ``wait_sync`` or about to be) goes when it lands, long
    before the 60 s it would wait otherwise."""
    clock = FakeClock()
    breaker = open_breaker(clock)
    clock.now = 10.0
    probe = breaker.acquire()
    waiting = threading.Event()
    went = threading.Event()

    def waiter() -> None:
        waiting.set()
        breaker.wait_sync(60.0)  # real seconds: only the acceptance ends it in time
        went.set()

    thread = threading.Thread(target=waiter)
    thread.start()
    assert waiting.wait(10)
    acceptor = threading.Thread(target=probe.accepted)
    acceptor.start()
    acceptor.join(10)
    assert went.wait(10)
    thread.join(10)
    assert breaker.state == "closed"


# ---------------------------------------------------------------- through the policy


class Stream:
    """A provider call whose headers come after ``head_s`` and whose body ends when
    ``done`` is set (or breaks, with ``broken``)."""

    def __init__(self, head_s: float = 0.5) -> None:
        self.head_s = head_s
        self.done = anyio.Event()
        self.streaming = anyio.Event()
        self.sent = anyio.Event()
        self.broken = False

    async def __call__(self, attempt: Attempt) -> str:
        async with await attempt.acquire():
            self.sent.set()
            await anyio.sleep(self.head_s)
            attempt.accepted()  # status 200 and headers are in
            self.streaming.set()
            await self.done.wait()
            if self.broken:
                self.broken = False
                raise transient()  # the stream broke: a failed attempt
            return "body"


@virtual_time
async def test_waiters_go_when_the_probe_is_accepted_not_when_it_ends() -> None:
    """Open breaker; its probe's headers arrive 0.5 s after it is sent: a caller waiting
    for the breaker is served at that instant while the probe's body still streams (before:
    it waited for the probe's whole generation)."""
    breaker = open_breaker(anyio.current_time)
    policy = breaker_policy(breaker)
    start = anyio.current_time()
    stream = Stream(head_s=0.5)
    served: list[float] = []

    async def other() -> None:
        served.append(anyio.current_time() - start)

    async with anyio.create_task_group() as tg:
        tg.start_soon(policy.run, stream)
        await stream.sent.wait()  # the probe is out
        tg.start_soon(policy.call, other)  # arrives while the probe is out: waits
        await stream.streaming.wait()
        await anyio.wait_all_tasks_blocked()
        assert served == [10.5]
        assert breaker.state == "closed"
        assert not stream.done.is_set()
        stream.done.set()
    assert breaker.statistics().failures == 0


@virtual_time
async def test_a_stream_that_breaks_after_acceptance_is_a_failure_that_loses_nothing() -> None:
    """The accepted probe's stream breaks: that attempt failed (retried, counted once
    towards the threshold of 2) but the breaker stays closed, and the caller released at
    acceptance is served."""
    breaker = open_breaker(anyio.current_time, threshold=2)
    policy = breaker_policy(
        breaker, retry=RetryConfig(max_attempts=2, base_delay_ms=0, cap_delay_ms=0)
    )
    stream = Stream()
    stream.broken = True
    served = anyio.Event()

    async def other() -> None:
        served.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(policy.run, stream)
        await stream.sent.wait()  # the probe is out
        tg.start_soon(policy.call, other)
        await stream.streaming.wait()
        await served.wait()
        stream.done.set()  # breaks: the first attempt fails
        await anyio.wait_all_tasks_blocked()
        stats = breaker.statistics()
        assert (stats.state, stats.failures, stats.opened) == ("closed", 1, 1)
        stream.done = anyio.Event()
        stream.streaming = anyio.Event()
        await stream.streaming.wait()  # the retry streams
        stream.done.set()
    assert breaker.statistics().failures == 0


@virtual_time
async def test_an_accepted_probe_that_fails_uses_the_calls_own_budget() -> None:
    """A failed probe costs its call nothing (it was the breaker's question); an accepted
    one has had its answer, so its later failure is the call's own: with one attempt, the
    call gives up instead of going round again for free."""
    breaker = open_breaker(anyio.current_time, threshold=2)
    policy = breaker_policy(breaker)  # max_attempts=1
    stream = Stream()
    stream.broken = True
    stream.done.set()
    with pytest.raises(CallFailed):
        await policy.run(stream)
    assert breaker.statistics().failures == 1


@virtual_time
async def test_the_block_form_releases_waiters_at_acceptance() -> None:
    """``AttemptBlock.accepted()`` does what ``Attempt.accepted()`` does."""
    breaker = open_breaker(anyio.current_time)
    policy = breaker_policy(breaker)
    start = anyio.current_time()
    done = anyio.Event()
    sent = anyio.Event()
    served: list[float] = []

    async def probe() -> None:
        async for attempt in policy.attempts():
            async with attempt:
                sent.set()
                await anyio.sleep(0.25)
                attempt.accepted()
                await done.wait()

    async def other() -> None:
        served.append(anyio.current_time() - start)

    async with anyio.create_task_group() as tg:
        tg.start_soon(probe)
        await sent.wait()
        tg.start_soon(policy.call, other)
        await anyio.sleep(0.5)  # from 10 s: past the acceptance at 10.25 s
        assert served == [10.25]
        done.set()


def test_the_blocking_form_releases_waiters_at_acceptance() -> None:
    """``run_sync``: a thread waiting for the breaker goes when the probe's step (in another
    thread) says its answer was accepted, while that step is still reading."""
    clock = FakeClock()
    breaker = open_breaker(clock)
    policy = breaker_policy(breaker)
    clock.now = 10.0
    probing = threading.Event()
    finish = threading.Event()
    served = threading.Event()
    accepted = threading.Event()

    def step(attempt: Attempt) -> str:
        with attempt.acquire_sync():
            probing.set()
            assert accepted.wait(10)
            attempt.accepted()
            assert finish.wait(10)  # the body is still being read
            return "body"

    results: list[object] = []
    probe = threading.Thread(target=lambda: results.append(policy.run_sync(step)))
    probe.start()
    assert probing.wait(10)

    def waiter() -> None:
        # The probe is out: this waits in wait_sync for up to the recovery time (10 real
        # seconds here, on the fake clock's schedule), unless the acceptance ends it.
        policy.call_sync(served.set)

    other = threading.Thread(target=waiter)
    other.start()
    # The waiter has been turned away once (it is parked, not admitted).
    for _ in range(1000):
        if breaker.statistics().rejected:
            break
        threading.Event().wait(0.01)
    assert breaker.statistics().rejected == 1
    assert not served.is_set()
    accepted.set()
    assert served.wait(5)  # well before the recovery time: the acceptance let it go
    assert probe.is_alive()
    finish.set()
    probe.join(10)
    other.join(10)
    assert results == ["body"]
    assert breaker.state == "closed"


@virtual_time
async def test_the_slots_hear_of_accepted_calls_before_their_bodies_end() -> None:
    """Three calls sent at once, their headers in 0.5, 0.6 and 0.7 s later (in the order
    they went): the most in service is 3 then, while every body still streams (before:
    0 until the first call ended). It is the lower bound the herd's limit grows from."""
    policy = Policy(clock=anyio.current_time)
    streams = [Stream(head_s=0.5 + 0.1 * i) for i in range(3)]
    async with anyio.create_task_group() as tg:
        for stream in streams:
            tg.start_soon(policy.run, stream)
            await stream.sent.wait()
        for stream in streams:
            await stream.streaming.wait()
        assert policy.adaptive_limit.statistics().most_in_service == 3
        assert not any(stream.done.is_set() for stream in streams)
        for stream in streams:
            stream.done.set()


# ---------------------------------------------------------------- the burst pause's probe


@virtual_time
async def test_a_burst_pause_ends_when_its_probe_is_accepted() -> None:
    """After a burst 429 the gate pauses 5 s; its probe's headers come 0.5 s after it is
    sent: the callers queued behind it go then, not when its 2 s generation ends."""
    policy = Policy(
        max_concurrent_calls=4,
        retry=RetryConfig(max_attempts=1, throttle_attempts=1),
        clock=anyio.current_time,
    )

    async def throttled() -> None:
        raise burst()

    with pytest.raises(CallFailed):
        await policy.call(throttled)  # the pause stays
    start = anyio.current_time()
    sent: list[float] = []

    async def step(attempt: Attempt) -> None:
        async with await attempt.acquire():
            sent.append(anyio.current_time() - start)
            await anyio.sleep(0.5)
            attempt.accepted()
            await anyio.sleep(1.5)

    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(policy.run, step)
            await anyio.wait_all_tasks_blocked()
    # The probe at the pause's end (5 s), the others at its acceptance (5.5 s, before:
    # 7 s, its end).
    assert sorted(sent) == [5.0, 5.5, 5.5]
