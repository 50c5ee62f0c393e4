"""The decisions after a failed attempt, as values: no state is changed, nothing is emitted.

:func:`judge` says what a failure *is* (its verdict, which throttle, what the breaker hears);
:func:`decide` says what the call does next (retry after so long, or give up, and why). The
:class:`~anygate._policy.retrying.Retrier` acts on them: it tells the adaptive limit, writes
the call's :class:`~anygate._policy.run.Run`, and reports to the hooks. Kept apart so that
every rule about budgets and delays reads (and tests) as a function of its inputs.

The only thing :func:`decide` touches is the random source of the jittered delay.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, final

from .._classify.classify import Reason, RuleLike, Verdict, classify
from .._classify.origin import from_provider
from .._classify.throttle import throttle_kind
from .backoff import Uniform, decorrelated_jitter
from .run import FAILURE, NEUTRAL, NOT_PROVIDER, Stop

if TYPE_CHECKING:
    from .._config.config import RetryConfig
    from .testing_switch import TestingState

__all__ = ["Judgement", "Retry", "Tally", "budget", "decide", "judge"]


@final
class Judgement:
    """What one failed attempt says: the verdict, the kind of throttle (``"burst"``,
    ``"rate"``, ``"concurrency"``, ``"overload"``, or ``None`` for other failures), the
    outcome the breaker hears of it, and whether it is the provider's failure at all
    (:func:`~anygate._classify.origin.from_provider`; the caller's own bug is not)."""

    __slots__ = ("kind", "outcome", "provider", "verdict")

    def __init__(
        self, verdict: Verdict, kind: str | None, outcome: str, *, provider: bool = True
    ) -> None:
        self.verdict = verdict
        self.kind = kind
        self.outcome = outcome
        self.provider = provider


def judge(exc: BaseException, rules: tuple[RuleLike, ...], provider: str | None) -> Judgement:
    """Classify ``exc``. The breaker counts provider failures: errors and overload answers.
    A 429 says the provider is up and wants less; the gate's limits answer it, not the
    breaker, and a failure that is not retriable says nothing of the provider's health."""
    verdict = classify(exc, rules=rules, provider=provider)
    kind = throttle_kind(verdict)
    if not verdict.retriable:
        return Judgement(verdict, None, NEUTRAL, provider=from_provider(exc, verdict, rules))
    if kind in ("concurrency", "rate", "burst"):
        return Judgement(verdict, kind, NEUTRAL)
    return Judgement(verdict, kind, FAILURE)


@final
class Tally:
    """A call's failed attempts by budget, and its previous jittered delay."""

    __slots__ = ("failures", "prev_ms", "throttles")

    def __init__(self, failures: int, throttles: int, prev_ms: float | None) -> None:
        self.failures = failures
        self.throttles = throttles
        self.prev_ms = prev_ms


@final
class Retry:
    """The decision to try again: sleep ``wait_s`` (without a slot) first.

    ``expected_ms`` is what the caller will wait in all (after a burst throttle, the gate's
    pause, sat out at admission); ``used`` of ``max_attempts`` is the count the message
    shows; ``tally`` is the call's new :class:`Tally`.
    """

    __slots__ = ("expected_ms", "from_header", "max_attempts", "tally", "used", "wait_s")

    def __init__(
        self,
        wait_s: float,
        expected_ms: float,
        *,
        used: int,
        max_attempts: int,
        from_header: bool,
        tally: Tally,
    ) -> None:
        self.wait_s = wait_s
        self.expected_ms = expected_ms
        self.used = used
        self.max_attempts = max_attempts
        self.from_header = from_header
        self.tally = tally


def budget(
    retry: RetryConfig,
    verdict: Verdict,
    exc: BaseException,
    testing: TestingState,
    *,
    throttle: bool,
) -> int:
    """Attempts this failure may use: ``throttle_attempts`` for a throttle, else
    ``max_attempts``, tightened by the per-reason and per-exception budgets and the testing
    switch."""
    limit = retry.throttle_attempts if throttle else retry.max_attempts
    per_reason = retry.reason_budgets.get(verdict.reason.value)
    if per_reason is not None:
        limit = min(limit, per_reason)
    if retry.exception_budgets:
        for cls in type(exc).__mro__:
            per_class = retry.exception_budgets.get(cls.__name__)
            if per_class is not None:
                limit = min(limit, per_class)
    if testing.enabled and testing.attempts is not None:
        limit = min(limit, testing.attempts)
    return limit


def decide(
    retry: RetryConfig,
    judgement: Judgement,
    exc: BaseException,
    tally: Tally,
    *,
    probe: bool,
    queued: bool,
    pause_left_s: float,
    rng: Uniform,
    now: float,
    deadline: float,
    testing: TestingState,
) -> Retry | Stop:
    """Retry after how long, or give up and why.

    Args:
        probe: the attempt was the breaker's probe (a failed probe is the breaker's
            question: it does not use up the call's own attempts).
        queued: the gate's limits already answer the failure (its limit went down, or a
            burst pause started): the next attempt queues under them, with no own sleep.
        pause_left_s: the burst pause the next attempt sits out at admission.
        now, deadline: in one time base (AnyIO's clock, or ``time.monotonic``).
    """
    verdict = judgement.verdict
    limit = budget(retry, verdict, exc, testing, throttle=judgement.kind is not None)
    if not judgement.provider:
        return Stop(NOT_PROVIDER, limit)
    if not verdict.retriable:
        return Stop("not_retriable", limit)
    failures, throttles = tally.failures, tally.throttles
    if judgement.kind is not None:
        throttles += 1
        used = throttles
    else:
        if not probe:
            failures += 1
        used = failures
    if used >= limit:
        return Stop("budget", limit)
    prev_ms = tally.prev_ms
    if verdict.retry_after is not None:
        if verdict.retry_after > retry.retry_after_max_s:
            return Stop("retry_after_ceiling", limit)
        wait_ms = verdict.retry_after * 1000.0
    elif queued or (probe and judgement.outcome == FAILURE):
        # The limits already hold the next attempt back, or the breaker reopened (the next
        # attempt waits for the next probe): no own sleep.
        wait_ms = 0.0
    else:
        base = (
            retry.burst_base_delay_ms
            if verdict.reason is Reason.BURST_RATE
            else retry.base_delay_ms
        )
        wait_ms = decorrelated_jitter(prev_ms, base_ms=base, cap_ms=retry.cap_delay_ms, rng=rng)
        prev_ms = wait_ms
    if testing.enabled:
        wait_ms = 0.0
    wait_s = wait_ms / 1000.0
    # A sleep that would end at or past the deadline leaves no time for the attempt.
    if now + wait_s >= deadline:
        return Stop("deadline", limit)
    expected_ms = wait_ms
    if queued and judgement.kind == "burst" and not testing.enabled:
        expected_ms = max(wait_ms, pause_left_s * 1000.0)
    return Retry(
        wait_s,
        expected_ms,
        used=used,
        max_attempts=limit,
        from_header=verdict.retry_after is not None,
        tally=Tally(failures, throttles, prev_ms),
    )
