"""CircuitBreaker: the state machine, the single probe, neutral outcomes, threads."""

from __future__ import annotations

import re
import threading

import pytest

import anygate
from anygate import BreakerState, CircuitBreaker, CircuitOpen


class FakeClock:
    """A manual monotonic clock."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def make(clock: FakeClock, threshold: int = 3, recovery: float = 60.0) -> CircuitBreaker:
    return CircuitBreaker(
        "llm", failure_threshold=threshold, recovery_timeout=recovery, clock=clock
    )


def trip(breaker: CircuitBreaker) -> None:
    for _ in range(breaker.failure_threshold):
        breaker.acquire().failure()


def test_opens_after_threshold_consecutive_failures(clock: FakeClock) -> None:
    """Closed -> open exactly at the threshold; the opening is reported as a state change."""
    breaker = make(clock)
    assert breaker.acquire().failure() is None
    assert breaker.acquire().failure() is None
    change = breaker.acquire().failure()
    assert change is not None
    assert (change.old, change.new, change.failures, change.retry_after) == (
        "closed",
        "open",
        3,
        60,
    )
    assert breaker.state is BreakerState.OPEN


def test_a_success_resets_the_count(clock: FakeClock) -> None:
    """Failures must be consecutive: a success in between starts over."""
    breaker = make(clock)
    breaker.acquire().failure()
    breaker.acquire().failure()
    breaker.acquire().success()
    breaker.acquire().failure()
    breaker.acquire().failure()
    assert breaker.state is BreakerState.CLOSED
    assert breaker.statistics().failures == 2


def test_a_call_admitted_before_the_failures_does_not_reset_the_count(
    clock: FakeClock,
) -> None:
    """Long calls in flight when the provider went down still succeed one by one: they
    say it answered when they were sent, not since. The count of failures among calls
    sent after them goes on to the threshold; a call admitted after the latest failure
    that succeeds does reset it."""
    breaker = make(clock)
    old = [breaker.acquire() for _ in range(3)]  # in flight before the outage
    breaker.acquire().failure()
    old[0].success()
    breaker.acquire().failure()
    old[1].accepted()  # an acceptance is a success for the breaker, and as old
    assert breaker.state is BreakerState.CLOSED
    assert breaker.acquire().failure() is not None  # the third failure in a row
    assert breaker.state is BreakerState.OPEN
    # After a reset, a streak starts afresh: a call admitted after its failure resets it.
    breaker.reset()
    breaker.acquire().failure()
    newer = breaker.acquire()
    breaker.acquire().failure()
    newer.success()  # admitted before the second failure: no reset
    assert breaker.statistics().failures == 2
    breaker.acquire().success()  # admitted after both
    assert breaker.statistics().failures == 0
    old[2].failure()  # a late failure of an old call counts as one
    assert breaker.statistics().failures == 1


def test_neutral_outcomes_neither_trip_nor_reset(clock: FakeClock) -> None:
    """Neutral reports leave the count exactly where it was."""
    breaker = make(clock)
    breaker.acquire().failure()
    breaker.acquire().failure()
    for _ in range(10):
        breaker.acquire().neutral()
    assert breaker.statistics().failures == 2
    breaker.acquire().failure()
    assert breaker.state is BreakerState.OPEN


def test_open_fails_fast_and_says_when_to_retry(clock: FakeClock) -> None:
    """While open, acquire raises CircuitOpen with the seconds left."""
    breaker = make(clock)
    trip(breaker)
    clock.now += 15
    with pytest.raises(CircuitOpen) as info:
        breaker.acquire()
    assert info.value.retry_after == pytest.approx(45)
    assert info.value.name == "llm"
    assert "retry in 45s" in str(info.value)
    assert breaker.statistics().rejected == 1


def test_half_open_admits_exactly_one_probe(clock: FakeClock) -> None:
    """After the recovery timeout one caller becomes the probe; the rest fail fast."""
    breaker = make(clock)
    trip(breaker)
    clock.now += 60
    probe = breaker.acquire()
    assert probe.probe
    assert [c.new for c in probe.changes] == ["half_open"]
    for _ in range(3):
        with pytest.raises(CircuitOpen) as info:
            breaker.acquire()
        assert info.value.retry_after == 0.0
    assert "probe" in str(info.value)
    probe.success()
    assert breaker.state is BreakerState.CLOSED
    assert not breaker.acquire().probe


def test_a_failed_probe_reopens_for_a_full_recovery_timeout(clock: FakeClock) -> None:
    """Probe failure -> open again, measured from the probe's failure."""
    breaker = make(clock)
    trip(breaker)
    clock.now += 60
    probe = breaker.acquire()
    clock.now += 5
    change = probe.failure()
    assert change is not None
    assert (change.old, change.new) == ("half_open", "open")
    clock.now += 59.9
    with pytest.raises(CircuitOpen):
        breaker.acquire()
    clock.now += 0.1
    assert breaker.acquire().probe
    assert breaker.statistics().opened == 2


def test_a_neutral_probe_hands_the_probe_role_on_and_never_wedges(clock: FakeClock) -> None:
    """Ported: a probe consumed by a non-retriable (neutral) error does not wedge the breaker;
    the next caller becomes the probe."""
    breaker = make(clock)
    trip(breaker)
    clock.now += 60
    first = breaker.acquire()
    assert first.neutral() is None
    assert breaker.state is BreakerState.HALF_OPEN
    second = breaker.acquire()
    assert second.probe
    second.success()
    assert breaker.state is BreakerState.CLOSED


def test_outcomes_are_recorded_once(clock: FakeClock) -> None:
    """A second report on the same permit is ignored (finally: neutral() is safe)."""
    breaker = make(clock, threshold=1)
    permit = breaker.acquire()
    permit.success()
    assert permit.done
    assert permit.failure() is None
    assert breaker.state is BreakerState.CLOSED


def test_a_late_failure_does_not_extend_the_open_period(clock: FakeClock) -> None:
    """A call admitted before the breaker opened, failing later, changes nothing."""
    breaker = make(clock, threshold=1)
    early = breaker.acquire()
    breaker.acquire().failure()
    clock.now += 30
    assert early.failure() is None
    assert breaker.statistics().retry_after == pytest.approx(30)


def test_a_late_failure_does_not_fail_the_running_probe(clock: FakeClock) -> None:
    """Only the probe's own outcome decides half-open; a stale failure is ignored."""
    breaker = make(clock, threshold=1)
    early = breaker.acquire()
    breaker.acquire().failure()
    clock.now += 60
    probe = breaker.acquire()
    early.failure()
    assert breaker.state is BreakerState.HALF_OPEN
    probe.success()
    assert breaker.state is BreakerState.CLOSED


def test_still_admitted_stops_retries_of_ordinary_calls_once_open(clock: FakeClock) -> None:
    """Retries of a normal call stop when the breaker opens; the probe's do not."""
    breaker = make(clock, threshold=1)
    ordinary = breaker.acquire()
    assert ordinary.still_admitted()
    breaker.acquire().failure()
    assert not ordinary.still_admitted()
    clock.now += 60
    assert breaker.acquire().still_admitted()


def test_threads_racing_in_half_open_get_exactly_one_probe(clock: FakeClock) -> None:
    """Many threads asking at the same instant: one probe, the others CircuitOpen."""
    breaker = make(clock, threshold=1)
    breaker.acquire().failure()
    clock.now += 60
    n = 16
    barrier = threading.Barrier(n)
    results: list[str] = []
    lock = threading.Lock()

    def ask() -> None:
        barrier.wait()
        try:
            breaker.acquire()
            outcome = "probe"
        except CircuitOpen:
            outcome = "rejected"
        with lock:
            results.append(outcome)

    threads = [threading.Thread(target=ask) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["probe"] + ["rejected"] * (n - 1)


def test_counts_from_many_threads_are_exact(clock: FakeClock) -> None:
    """Concurrent failures are counted without loss under the lock."""
    breaker = make(clock, threshold=10_000)

    def fail_many() -> None:
        for _ in range(500):
            breaker.acquire().failure()

    threads = [threading.Thread(target=fail_many) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert breaker.statistics().failures == 4000


def test_configure_live_and_reset(clock: FakeClock) -> None:
    """Settings change live; reset() closes an open breaker."""
    breaker = make(clock)
    breaker.configure(failure_threshold=1, recovery_timeout=5)
    breaker.acquire().failure()
    assert breaker.statistics().retry_after == 5
    change = breaker.reset()
    assert change is not None
    assert change.new == "closed"
    assert breaker.would_admit()


def test_introspection(clock: FakeClock) -> None:
    """statistics(), repr and the str-enum state are readable."""
    breaker = make(clock)
    breaker.acquire().failure()
    stats = breaker.statistics()
    assert (stats.state, stats.failures, stats.failure_threshold) == ("closed", 1, 3)
    assert repr(breaker) == "<anygate.CircuitBreaker 'llm' closed, 1/3 failures>"
    assert "probe" not in repr(breaker.acquire())


@pytest.mark.parametrize(
    ("kwargs", "error", "fragment"),
    [
        ({"failure_threshold": 0}, ValueError, "failure_threshold must be >= 1 (got 0)"),
        ({"failure_threshold": 2.5}, TypeError, "failure_threshold must be an integer"),
        ({"failure_threshold": True}, TypeError, "failure_threshold must be an integer"),
        ({"recovery_timeout": -1}, ValueError, "recovery_timeout must be a finite"),
        ({"recovery_timeout": float("nan")}, ValueError, "recovery_timeout must be a finite"),
        ({"recovery_timeout": "60"}, TypeError, "recovery_timeout must be a finite number"),
        ({"clock": 5}, TypeError, "clock must be a callable"),
    ],
)
def test_bad_settings_are_rejected(
    kwargs: dict[str, object], error: type[Exception], fragment: str
) -> None:
    """Bad breaker settings raise naming the parameter, the constraint and the value."""
    with pytest.raises(error, match=re.escape(fragment)):
        CircuitBreaker("x", **kwargs)  # type: ignore[arg-type]


def test_shared_breaker_is_one_per_name_and_refuses_silent_changes() -> None:
    """shared_breaker returns one instance per name; conflicting settings raise."""
    first = anygate.shared_breaker("svc", failure_threshold=2)
    assert anygate.shared_breaker("svc") is first
    assert anygate.shared_breaker("svc", failure_threshold=2) is first
    with pytest.raises(ValueError, match="failure_threshold 2 \\(got 3\\)"):
        anygate.shared_breaker("svc", failure_threshold=3)
    assert anygate.shared_breaker("other") is not first
