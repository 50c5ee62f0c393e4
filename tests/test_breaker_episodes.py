"""Probe permits are bound to their half-open episode; a reference model checks the breaker.

Regression tests for issue 9, fault 1: a probe carried no identity for its episode, so a
stale probe's report could let a second probe out while another ran, or open a closed
breaker on a single failure.
"""

from __future__ import annotations

import random
from typing import Any

import anyio
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from anygate import (
    BreakerConfig,
    BreakerState,
    CallFailed,
    CircuitBreaker,
    CircuitOpen,
    Policy,
    RetryConfig,
)
from anygate._policy.permit import Permit
from tests.conftest import mock_clock
from tests.policy_helpers import FakeClock, quota, transient


def half_open_with_probe(breaker: CircuitBreaker, clock: FakeClock) -> Permit:
    """Trip ``breaker``, let the recovery pass, and return the episode's probe."""
    for _ in range(breaker.failure_threshold):
        breaker.acquire().failure()
    clock.now += breaker.recovery_timeout
    probe = breaker.acquire()
    assert probe.probe
    return probe


@pytest.mark.parametrize("outcome", ["neutral", "failure"])
def test_a_stale_probe_cannot_let_a_second_probe_out(outcome: str) -> None:
    """P1 probes; the breaker is closed (an operator's reset); it reopens and half-opens with
    probe P2; P1's late report leaves P2 the only probe (every other caller fails fast)."""
    clock = FakeClock()
    breaker = CircuitBreaker("b", failure_threshold=1, recovery_timeout=10, clock=clock)
    p1 = half_open_with_probe(breaker, clock)
    breaker.reset()  # P1's episode is over
    assert breaker.state is BreakerState.CLOSED
    p2 = half_open_with_probe(breaker, clock)
    getattr(p1, outcome)()
    assert breaker.state is BreakerState.HALF_OPEN
    with pytest.raises(CircuitOpen):
        breaker.acquire()
    assert not breaker.would_admit()
    p2.success()
    assert breaker.state is BreakerState.CLOSED


def test_a_stale_probe_failure_counts_as_one_failure_not_a_trip() -> None:
    """After the breaker closed, a stale probe's failure respects the threshold."""
    clock = FakeClock()
    breaker = CircuitBreaker("b", failure_threshold=3, recovery_timeout=10, clock=clock)
    p1 = half_open_with_probe(breaker, clock)
    breaker.reset()
    p1.failure()
    assert breaker.state is BreakerState.CLOSED
    assert breaker.statistics().failures == 1
    breaker.acquire().failure()
    assert breaker.state is BreakerState.CLOSED
    breaker.acquire().failure()
    assert breaker.state is BreakerState.OPEN


def test_the_current_probe_still_decides_its_episode() -> None:
    """A neutral current probe hands the role on within the episode; its failure reopens."""
    clock = FakeClock()
    breaker = CircuitBreaker("b", failure_threshold=1, recovery_timeout=10, clock=clock)
    probe = half_open_with_probe(breaker, clock)
    probe.neutral()
    second = breaker.acquire()
    assert second.probe
    second.failure()
    assert breaker.state is BreakerState.OPEN
    assert breaker.statistics().opened == 2


# ----------------------------------------------------------------- reference model


class BreakerModel(RuleBasedStateMachine):
    """The breaker against a plain reference model, permits reported in any order.

    Outstanding permits stand for concurrent callers; reporting them late, out of order,
    across episodes and after resets is exactly what stale reports are.
    """

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.permits: list[tuple[Permit, bool, int]] = []  # (permit, probe, episode)

    @initialize(threshold=st.integers(1, 4), recovery=st.sampled_from([0.0, 5.0, 30.0]))
    def setup(self, threshold: int, recovery: float) -> None:
        self.breaker = CircuitBreaker(
            "model", failure_threshold=threshold, recovery_timeout=recovery, clock=self.clock
        )
        self.threshold, self.recovery = threshold, recovery
        self.state = "closed"
        self.failures = 0
        self.opened = 0
        self.opened_until = 0.0
        self.episode = 0
        self.probe_owner: Permit | None = None
        self.done: set[int] = set()
        self.accepted: set[int] = set()  # permits whose acceptance has counted (or not)
        self.spell_of: dict[int, int] = {}  # permit -> openings before it was given
        self.seq_of: dict[int, int] = {}  # permit -> its number among the permits given
        self.given = 0
        self.streak_seq = -1  # the latest-given permit among the streak's failures

    def _open(self) -> None:
        self.state = "open"
        self.opened += 1
        self.opened_until = self.clock.now + self.recovery
        self.probe_owner = None

    @rule()
    def acquire(self) -> None:
        expect_probe = False
        if self.state == "open" and self.clock.now >= self.opened_until:
            self.state, self.episode = "half_open", self.episode + 1
        admitted = self.state == "closed" or (
            self.state == "half_open" and self.probe_owner is None
        )
        if self.state == "half_open":
            expect_probe = admitted
        if not admitted:
            with pytest.raises(CircuitOpen):
                self.breaker.acquire()
            return
        permit = self.breaker.acquire()
        assert permit.probe is expect_probe
        if expect_probe:
            self.probe_owner = permit
        self.permits.append((permit, expect_probe, self.episode))
        self.spell_of[id(permit)] = self.opened
        self.given += 1
        self.seq_of[id(permit)] = self.given

    def _older_than_the_streak(self, permit: Permit) -> bool:
        """Given before a failure of the current streak: its success is older news."""
        return bool(self.failures) and self.seq_of[id(permit)] < self.streak_seq

    def _count_failure(self, permit: Permit) -> None:
        self.failures += 1
        seq = self.seq_of[id(permit)]
        self.streak_seq = seq if self.failures == 1 else max(self.streak_seq, seq)

    @precondition(lambda self: any(id(p) not in self.done for p, _, _ in self.permits))
    @rule(data=st.data(), outcome=st.sampled_from(["success", "failure", "neutral"]))
    def report(self, data: st.DataObject, outcome: str) -> None:
        pending = [entry for entry in self.permits if id(entry[0]) not in self.done]
        permit, probe, episode = data.draw(st.sampled_from(pending))
        self.done.add(id(permit))
        current = probe and self.state == "half_open" and episode == self.episode
        assert current == (self.probe_owner is permit)
        if outcome == "success":
            # A success closes, unless it is an ordinary call sent before the latest opening
            # (it proves nothing about the provider since), or one given before a failure
            # of the current streak (older news than the failure).
            if (
                self.state == "closed" or probe or self.spell_of[id(permit)] == self.opened
            ) and not self._older_than_the_streak(permit):
                self.failures = 0
                self.state = "closed"
                self.probe_owner = None
        elif outcome == "failure":
            if current:
                self._open()
            elif self.state == "closed":
                self._count_failure(permit)
                if self.failures >= self.threshold:
                    self._open()
        elif current:
            self.probe_owner = None
        getattr(permit, outcome)()

    @precondition(lambda self: bool(self.permits))
    @rule(data=st.data())
    def accept(self, data: st.DataObject) -> None:
        """The provider accepted a call (issue 30 item 4): a success now, once, if it was
        sent since the latest opening; nothing once its outcome is in. Its outcome is
        still reported later (``report``)."""
        permit, _, _ = data.draw(st.sampled_from(self.permits))
        key = id(permit)
        fresh = key not in self.done and key not in self.accepted
        self.accepted.add(key)
        if (
            fresh
            and (self.state == "closed" or self.spell_of[key] == self.opened)
            and not self._older_than_the_streak(permit)
        ):
            self.failures = 0
            self.state = "closed"
            self.probe_owner = None
        permit.accepted()

    @precondition(lambda self: bool(self.done))
    @rule()
    def report_twice(self) -> None:
        """A second report on a settled permit changes nothing."""
        permit = next(p for p, _, _ in self.permits if id(p) in self.done)
        assert permit.failure() is None

    @rule()
    def trip(self) -> None:
        """Enough ordinary failures to open a closed breaker (a storm of callers)."""
        if self.state != "closed":
            return
        for _ in range(self.threshold - self.failures):
            self.acquire()
            permit = self.permits[-1][0]
            self.done.add(id(permit))
            self._count_failure(permit)
            permit.failure()
        self._open()

    @rule(seconds=st.sampled_from([1.0, 5.0, 30.0]))
    def advance(self, seconds: float) -> None:
        self.clock.now += seconds

    @rule()
    def reset(self) -> None:
        self.breaker.reset()
        self.state, self.failures, self.probe_owner = "closed", 0, None

    @invariant()
    def agrees_with_the_model(self) -> None:
        stats = self.breaker.statistics()
        assert (stats.state.value, stats.failures, stats.opened) == (
            self.state,
            self.failures,
            self.opened,
        )
        if self.state == "closed":
            assert self.failures < self.threshold
        if self.state == "half_open":
            # Never wedged, never two probes: a caller may probe iff no probe is out.
            assert self.breaker.would_admit() is (self.probe_owner is None)
        current = [
            p
            for p, probe, ep in self.permits
            if probe and id(p) not in self.done and ep == self.episode
        ]
        if self.state == "half_open":
            assert len(current) <= 1


BreakerModel.TestCase.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)
TestBreakerModel = BreakerModel.TestCase
TestBreakerModel.__doc__ = (
    "Up to 9,000 steps (150 runs of up to 60): the breaker matches the reference model (episodes, probes, neutral "
    "outcomes, stale and repeated reports, acceptances, resets, recovery)."
)


# ----------------------------------------------------------------- through Policy


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", [mock_clock()])
async def test_many_callers_on_a_failing_provider_never_run_two_probes_of_one_episode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """500 tasks against a 95 %-failing provider (transient and non-retriable errors): at most one probe per half-open episode
    is ever out at once (the episode is told apart by the breaker's ``opened`` count)."""
    outstanding: dict[int, int] = {}
    worst = 0
    # A policy admits through _admit (acquire() minus the logging: its hooks log).
    real_admit = CircuitBreaker._admit
    real_report = Permit._report
    episode_of: dict[int, int] = {}

    def admit(self: CircuitBreaker, *, log: bool) -> Permit:
        nonlocal worst
        permit = real_admit(self, log=log)
        if permit.probe:
            episode = self.statistics().opened
            episode_of[id(permit)] = episode
            outstanding[episode] = outstanding.get(episode, 0) + 1
            worst = max(worst, outstanding[episode])
        return permit

    def report(self: Permit, outcome: str) -> Any:
        episode = episode_of.pop(id(self), None)
        if episode is not None:
            outstanding[episode] -= 1
        return real_report(self, outcome)

    monkeypatch.setattr(CircuitBreaker, "_admit", admit)
    monkeypatch.setattr(Permit, "_report", report)
    rng = random.Random(9)
    clock = anyio.current_time
    policy = Policy(
        name="episodes",
        max_concurrent_calls=50,
        busy_wait_s=None,
        circuit_breaker=BreakerConfig(
            when_open="fail", failure_threshold=3, recovery_timeout_sec=0.1
        ),
        retry=RetryConfig(max_attempts=2, base_delay_ms=10, cap_delay_ms=50),
        adaptive_concurrency=False,
        clock=clock,
        rng=rng,
    )

    async def provider() -> str:
        await anyio.sleep(rng.uniform(0.05, 1.0))
        draw = rng.random()
        if draw < 0.5:
            raise transient()  # retriable: counts towards the threshold
        if draw < 0.95:
            raise quota()  # not retriable: neutral for the breaker
        return "ok"

    async def caller() -> None:
        for _ in range(20):
            try:
                await policy.call(provider)
            except (CallFailed, CircuitOpen):  # noqa: PERF203 - the caller retries later
                await anyio.sleep(rng.uniform(0.05, 0.4))

    async with anyio.create_task_group() as tg:
        for _ in range(500):
            tg.start_soon(caller)
    assert policy.breaker is not None
    assert policy.breaker.statistics().opened > 3  # the scenario really cycled
    assert worst == 1
    assert policy.gate.statistics().in_flight == 0


def test_a_call_sent_before_the_breaker_opened_does_not_close_it() -> None:
    """A long call admitted while closed, succeeding during an outage that refuses new
    requests, proves nothing about the provider now: the breaker stays open."""
    clock = FakeClock()
    breaker = CircuitBreaker("b", failure_threshold=1, recovery_timeout=10, clock=clock)
    long_call = breaker.acquire()
    breaker.acquire().failure()
    assert breaker.state is BreakerState.OPEN
    long_call.success()
    assert breaker.state is BreakerState.OPEN
    clock.now += 10
    probe = breaker.acquire()
    assert probe.probe
    probe.success()
    assert breaker.state is BreakerState.CLOSED
