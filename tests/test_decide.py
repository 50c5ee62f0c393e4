"""The decisions after a failed attempt (``anygate._policy.decide``), as plain functions.

No loop, clock or gate: each rule is one call with its inputs written out. The loop's own
tests (test_policy_loop, test_policy_throttles) show the same rules end to end.
"""

from __future__ import annotations

import math
import random

import pytest

import anygate
from anygate import Reason, RetryConfig, Verdict
from anygate._policy.decide import Judgement, Retry, Tally, decide, judge
from anygate._policy.run import FAILURE, NEUTRAL, Stop
from anygate._policy.testing_switch import TestingState

OFF = TestingState()
FRESH = Tally(0, 0, None)


class _Fixed:
    """A random source that always draws the window's low end (the base delay)."""

    def uniform(self, a: float, b: float) -> float:
        return a


def _decide(
    judgement: Judgement,
    *,
    retry: RetryConfig | None = None,
    tally: Tally = FRESH,
    probe: bool = False,
    queued: bool = False,
    pause_left_s: float = 0.0,
    now: float = 0.0,
    deadline: float = math.inf,
    testing: TestingState = OFF,
    exc: BaseException | None = None,
) -> Retry | Stop:
    return decide(
        retry or RetryConfig(),
        judgement,
        exc or RuntimeError("boom"),
        tally,
        probe=probe,
        queued=queued,
        pause_left_s=pause_left_s,
        rng=_Fixed(),
        now=now,
        deadline=deadline,
        testing=testing,
    )


def _transient() -> Judgement:
    return Judgement(Verdict(Reason.TRANSIENT, retriable=True, status=502), None, FAILURE)


def _rate_429(retry_after: float | None = None) -> Judgement:
    verdict = Verdict(Reason.TRANSIENT, retriable=True, status=429, retry_after=retry_after)
    return Judgement(verdict, "rate", NEUTRAL)


def _burst() -> Judgement:
    verdict = Verdict(Reason.BURST_RATE, retriable=True, status=429, code="limit_burst_rate")
    return Judgement(verdict, "burst", NEUTRAL)


def test_judge_tells_the_breaker_of_failures_not_of_throttles_or_refusals() -> None:
    throttled = anygate.ResponseError(429, body={"error": {"code": "rate_limit_exceeded"}})
    down = anygate.ResponseError(502)
    refused = anygate.ResponseError(400)
    assert (judge(throttled, (), None).kind, judge(throttled, (), None).outcome) == (
        "rate",
        NEUTRAL,
    )
    assert (judge(down, (), None).kind, judge(down, (), None).outcome) == (None, FAILURE)
    assert judge(refused, (), None).verdict.retriable is False
    assert judge(refused, (), None).outcome == NEUTRAL


def test_a_failure_is_retried_after_the_jittered_delay_and_counted() -> None:
    decision = _decide(_transient())
    assert isinstance(decision, Retry)
    assert decision.wait_s == pytest.approx(1.0)  # base_delay_ms, drawn at the window's low end
    assert (decision.tally.failures, decision.tally.throttles) == (1, 0)
    assert decision.tally.prev_ms == pytest.approx(1000.0)
    assert (decision.used, decision.max_attempts) == (1, 3)


def test_the_last_attempt_of_the_budget_gives_up() -> None:
    decision = _decide(_transient(), tally=Tally(2, 0, 1000.0))
    assert isinstance(decision, Stop)
    assert (decision.why, decision.max_attempts) == ("budget", 3)


def test_throttles_count_against_their_own_budget() -> None:
    decision = _decide(_rate_429(), tally=Tally(2, 0, None))  # two failures already
    assert isinstance(decision, Retry)
    assert (decision.tally.failures, decision.tally.throttles) == (2, 1)
    assert decision.max_attempts == RetryConfig().throttle_attempts


def test_a_failed_probe_uses_none_of_the_calls_attempts_and_does_not_sleep() -> None:
    decision = _decide(_transient(), tally=Tally(2, 0, None), probe=True)
    assert isinstance(decision, Retry)
    assert decision.tally.failures == 2
    assert decision.wait_s == 0.0  # the next attempt waits for the next probe instead


def test_retry_after_is_the_wait_and_past_the_ceiling_gives_up() -> None:
    decision = _decide(_rate_429(retry_after=7.0))
    assert isinstance(decision, Retry)
    assert (decision.wait_s, decision.from_header) == (7.0, True)
    ceiling = _decide(_rate_429(retry_after=121.0))
    assert isinstance(ceiling, Stop)
    assert ceiling.why == "retry_after_ceiling"


def test_a_queued_burst_throttle_sleeps_nothing_and_expects_the_pause() -> None:
    decision = _decide(_burst(), queued=True, pause_left_s=4.5)
    assert isinstance(decision, Retry)
    assert decision.wait_s == 0.0
    assert decision.expected_ms == pytest.approx(4500.0)
    assert decision.tally.prev_ms is None  # no jitter was drawn


def test_an_unqueued_burst_throttle_backs_off_from_the_burst_base() -> None:
    decision = _decide(_burst())
    assert isinstance(decision, Retry)
    assert decision.wait_s == pytest.approx(RetryConfig().burst_base_delay_ms / 1000.0)


def test_a_wait_reaching_the_deadline_gives_up_now() -> None:
    decision = _decide(_transient(), now=10.0, deadline=11.0)
    assert isinstance(decision, Stop)
    assert decision.why == "deadline"
    assert isinstance(_decide(_transient(), now=10.0, deadline=11.5), Retry)


def test_not_retriable_stops_with_the_budget_it_would_have_had() -> None:
    verdict = Verdict(Reason.AUTH, retriable=False, status=401)
    decision = _decide(Judgement(verdict, None, NEUTRAL))
    assert isinstance(decision, Stop)
    assert (decision.why, decision.max_attempts) == ("not_retriable", 3)


def test_budgets_per_reason_per_exception_and_testing_only_tighten() -> None:
    retry = RetryConfig(
        max_attempts=5,
        reason_budgets={"transient": 4},
        exception_budgets={"TimeoutError": 2},
    )
    assert _stop_after(retry, RuntimeError("x")) == 4
    assert _stop_after(retry, TimeoutError("x")) == 2
    capped = TestingState(enabled=True, attempts=1)
    decision = _decide(_transient(), retry=retry, testing=capped)
    assert isinstance(decision, Stop)
    assert decision.max_attempts == 1


def test_the_testing_switch_never_sleeps() -> None:
    decision = _decide(_rate_429(retry_after=30.0), testing=TestingState(enabled=True))
    assert isinstance(decision, Retry)
    assert decision.wait_s == 0.0


def test_decide_changes_none_of_its_inputs() -> None:
    tally = Tally(1, 1, 500.0)
    rng = random.Random(7)
    state = rng.getstate()
    decision = decide(
        RetryConfig(),
        _rate_429(retry_after=2.0),  # a wait from the header draws nothing
        RuntimeError("x"),
        tally,
        probe=False,
        queued=False,
        pause_left_s=0.0,
        rng=rng,
        now=0.0,
        deadline=math.inf,
        testing=OFF,
    )
    assert isinstance(decision, Retry)
    assert decision.tally is not tally
    assert (tally.failures, tally.throttles, tally.prev_ms) == (1, 1, 500.0)
    assert rng.getstate() == state


def _stop_after(retry: RetryConfig, exc: BaseException) -> int:
    """The attempt count at which ``exc`` (a transient failure) gives up under ``retry``."""
    tally = FRESH
    for attempt in range(1, 100):
        decision = _decide(_transient(), retry=retry, tally=tally, exc=exc)
        if isinstance(decision, Stop):
            return attempt
        tally = decision.tally
    raise AssertionError("never gave up")
