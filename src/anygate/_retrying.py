"""What happens after an attempt fails: classify, budget, wait or give up.

Shared by :meth:`Policy.call` and :meth:`Policy.call_sync`, which differ only in how they
wait. Everything here is synchronous and clock-agnostic: callers pass "now" and the
deadline in their own time base (AnyIO's clock, or ``time.monotonic``).
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, NoReturn, final

from ._backoff import Uniform, decorrelated_jitter
from ._classify import Reason, RuleLike, Verdict, classify
from ._errors import Busy, CallFailed
from ._events import (
    GaveUp,
    Hook,
    LimitChanged,
    RetryScheduled,
    emit,
    retry_message,
    user_message,
)
from ._redact import redact
from ._validation import FLOAT_MAX, check_number
from ._waiters import ki_protected

if TYPE_CHECKING:
    from ._adaptive import AdaptiveLimit, LimitChange
    from ._breaker import CircuitBreaker, Permit
    from ._config import PolicyConfig
    from ._events import BreakerStateChanged
    from ._gate import Gate
    from ._testing import TestingState

__all__ = ["FAILURE", "NEUTRAL", "SUCCESS", "Retrier", "Run", "Stop", "check_deadline"]

logger = logging.getLogger("anygate")

SUCCESS, FAILURE, NEUTRAL = "success", "failure", "neutral"


class Stop:
    """The decision to give up, and why (a value, not an exception, so it never shows up in
    the ``__context__`` of the CallFailed raised next)."""

    __slots__ = ("max_attempts", "why")

    def __init__(self, why: str, max_attempts: int) -> None:
        self.why = why
        self.max_attempts = max_attempts


class Run:
    """Per-call state, owned by one task or thread."""

    __slots__ = (
        "attempt",
        "exc",
        "generation",
        "outcome",
        "permit",
        "phase",
        "prev_ms",
        "slot_started",
        "verdict",
    )

    def __init__(self) -> None:
        self.attempt = 0
        # The adaptive limit's generation when the current attempt was admitted; None when
        # the caller does not track it (a throttle during a pause is then old news).
        self.generation: int | None = None
        self.prev_ms: float | None = None
        self.verdict: Verdict | None = None
        self.exc: BaseException | None = None
        self.outcome = NEUTRAL  # what the breaker hears if the call ends now
        # The breaker permit, stored here by Retrier.admit inside KI-protected code so the
        # caller's finally (Retrier.settle) sees it whatever interrupts the call afterwards.
        self.permit: Permit | None = None
        self.phase = "slot"  # "slot", "attempt" or "sleep": what a deadline interrupted
        self.slot_started = 0.0


@ki_protected
def _take_permit(breaker: CircuitBreaker, run: Run) -> None:
    # Protected: between acquire() returning and the store, a Ctrl-C under trio would
    # otherwise leave a claimed probe that nobody reports.
    run.permit = breaker.acquire()


@ki_protected
def _report(permit: Permit, outcome: str) -> BreakerStateChanged | None:
    if outcome == SUCCESS:
        return permit.success()
    if outcome == FAILURE:
        return permit.failure()
    return permit.neutral()


def check_deadline(deadline: object) -> float | None:
    """Validate ``deadline=`` (seconds from now); ``None`` or infinity mean no deadline."""
    if deadline is None:
        return None
    seconds = check_number("deadline", deadline, none=True, infinite=True, maximum=FLOAT_MAX)
    return None if seconds == math.inf else seconds


@final
class Retrier:
    """One policy's failure handling: its settings, random source, rules and hooks."""

    __slots__ = (
        "adaptive",
        "config",
        "control_names",
        "control_types",
        "gate",
        "hooks",
        "name",
        "rng",
        "rules",
    )

    def __init__(
        self,
        config: PolicyConfig,
        *,
        gate: Gate,
        rules: tuple[RuleLike, ...],
        rng: Uniform,
        hooks: tuple[Hook, ...],
        control_types: tuple[type[BaseException], ...],
        control_names: frozenset[str],
        adaptive: AdaptiveLimit | None = None,
    ) -> None:
        self.adaptive = adaptive
        self.config = config
        self.name = config.name
        self.gate = gate
        self.rules = rules
        self.rng = rng
        self.hooks = hooks
        self.control_types = control_types
        self.control_names = control_names

    def admit(self, breaker: CircuitBreaker | None, run: Run) -> None:
        """Take the breaker permit into ``run.permit``, then report the state changes.

        Call it as the first thing inside the ``try`` whose ``finally`` calls
        :meth:`settle`: the permit is on ``run`` from the moment it exists, so a hook
        raising a ``BaseException`` here (or a Ctrl-C under trio) cannot strand a probe.

        Raises:
            CircuitOpen: the breaker is open; ``run.permit`` stays ``None``.
        """
        if breaker is None:
            return
        _take_permit(breaker, run)  # CircuitOpen propagates as is
        permit = run.permit
        if self.hooks and permit is not None:
            for change in permit.changes:
                emit(self.hooks, change)

    def settle(self, run: Run) -> None:
        """Report how the call ended: to the breaker and to the adaptive limit (a success
        grows it); then tell the hooks. Every state change happens before any hook runs,
        so a hook raising a ``BaseException`` leaves nothing unsettled."""
        outcome = run.outcome
        change = None
        permit = run.permit
        if permit is not None:
            change = _report(permit, outcome)
        grown = None
        if outcome == SUCCESS and self.adaptive is not None:
            grown = self.adaptive.on_success()
        if grown is not None:
            self._limit_changed(grown)
        if change is not None and self.hooks:
            emit(self.hooks, change)

    def is_control_flow(self, exc: BaseException) -> bool:
        if self.control_types and isinstance(exc, self.control_types):
            return True
        if self.control_names:
            return any(c.__name__ in self.control_names for c in type(exc).__mro__)
        return False

    def budget(self, verdict: Verdict, exc: BaseException, testing: TestingState) -> int:
        retry = self.config.retry
        budget = retry.max_attempts
        per_reason = retry.reason_budgets.get(verdict.reason.value)
        if per_reason is not None:
            budget = min(budget, per_reason)
        if retry.exception_budgets:
            for cls in type(exc).__mro__:
                per_class = retry.exception_budgets.get(cls.__name__)
                if per_class is not None:
                    budget = min(budget, per_class)
        if testing.enabled and testing.attempts is not None:
            budget = min(budget, testing.attempts)
        return budget

    def plan(
        self,
        run: Run,
        exc: Exception,
        permit: Permit | None,
        now: float,
        deadline: float,
        testing: TestingState,
    ) -> float | Stop:
        """Classify ``exc``; return seconds to sleep before the next attempt, or a Stop."""
        verdict = classify(exc, rules=self.rules, provider=self.config.provider)
        run.verdict, run.exc = verdict, exc
        if verdict.reason is Reason.BURST_RATE and self.adaptive is not None:
            # Whether or not this call retries, the whole gate slows down.
            self.throttled(run, verdict)
        budget = self.budget(verdict, exc, testing)
        if not verdict.retriable:
            return Stop("not_retriable", budget)
        if run.attempt >= budget:
            return Stop("budget", budget)
        if permit is not None and not permit.still_admitted():
            return Stop("circuit_open", budget)
        retry = self.config.retry
        from_header = verdict.retry_after is not None
        if verdict.retry_after is not None:
            if verdict.retry_after > retry.retry_after_max_s:
                return Stop("retry_after_ceiling", budget)
            wait_ms = verdict.retry_after * 1000.0
        else:
            base = (
                retry.burst_base_delay_ms
                if verdict.reason is Reason.BURST_RATE
                else retry.base_delay_ms
            )
            wait_ms = decorrelated_jitter(
                run.prev_ms, base_ms=base, cap_ms=retry.cap_delay_ms, rng=self.rng
            )
        run.prev_ms = wait_ms
        if testing.enabled:
            wait_ms = 0.0
        wait_s = wait_ms / 1000.0
        # A sleep that would end at or past the deadline leaves no time for the attempt.
        if now + wait_s >= deadline:
            return Stop("deadline", budget)
        message = retry_message(run.attempt, budget, wait_ms, verdict.reason)
        # INFO, not WARNING: a scheduled retry is the policy doing its job, and in a storm
        # there is one per failed attempt. Python prints WARNING and above to stderr when
        # the application configured no logging, which flooded users' terminals.
        logger.info(
            "%s: attempt %d/%d failed (%s); retrying in %dms: %s",
            self.name,
            run.attempt,
            budget,
            verdict.reason.value,
            round(wait_ms),
            verdict.detail,
            extra={
                "gate": self.gate.name,
                "policy": self.name,
                "reason": verdict.reason.value,
                "attempt": run.attempt,
                "delay_s": wait_s,
            },
        )
        if self.hooks:
            emit(
                self.hooks,
                RetryScheduled(
                    policy=self.name,
                    attempt=run.attempt,
                    max_attempts=budget,
                    wait_ms=round(wait_ms),
                    reason=verdict.reason,
                    from_retry_after=from_header,
                    message=redact(message),
                    verdict=verdict,
                ),
            )
        return wait_s

    def throttled(self, run: Run, verdict: Verdict) -> None:
        """Tell the adaptive limit about a burst-rate throttle; report what it did."""
        assert self.adaptive is not None
        retry_after = verdict.retry_after
        if retry_after is not None:
            retry_after = min(retry_after, self.config.retry.retry_after_max_s)
        change = self.adaptive.on_throttle(run.generation, retry_after)
        if change is not None:
            self._limit_changed(change)

    def _limit_changed(self, change: LimitChange) -> None:
        gate = self.gate.name
        if change.reason == "burst_rate":
            logger.info(
                "gate %r: provider throttled the request burst rate; new attempts wait "
                "%.3gs and the concurrency limit goes %g -> %g (max %g)",
                gate,
                change.pause_s,
                change.old,
                change.new,
                change.maximum,
                extra={"gate": gate, "policy": self.name, "reason": change.reason},
            )
        else:
            logger.debug(
                "gate %r: concurrency limit %g -> %g (max %g)",
                gate,
                change.old,
                change.new,
                change.maximum,
                extra={"gate": gate, "policy": self.name, "reason": change.reason},
            )
        if self.hooks:
            emit(
                self.hooks,
                LimitChanged(
                    policy=self.name,
                    gate=gate,
                    old=change.old,
                    new=change.new,
                    max_concurrent_calls=change.maximum,
                    reason=change.reason,
                    pause_s=change.pause_s,
                ),
            )

    def fail(
        self,
        run: Run,
        why: str,
        max_attempts: int,
        cause: BaseException | None,
        *,
        charge: bool = True,
    ) -> NoReturn:
        """Give up: report GaveUp, decide what the breaker hears, raise CallFailed.

        Only here does a call become a breaker *failure*: a retriable verdict other than
        burst-rate that could not be retried. Anything that ends a call earlier (cancellation
        during a backoff sleep, Busy on a later slot wait) leaves the outcome neutral.
        """
        verdict = run.verdict
        assert verdict is not None
        if charge and verdict.retriable and verdict.reason is not Reason.BURST_RATE:
            run.outcome = FAILURE
        text = user_message(verdict)
        # WARNING: the caller's call failed for good, which someone may need to act on
        # (and it is one line per failed call, not one per attempt).
        logger.warning(
            "%s: giving up after %d attempt(s) (%s, %s): %s",
            self.name,
            run.attempt,
            why,
            verdict.reason.value,
            verdict.detail,
            extra={
                "gate": self.gate.name,
                "policy": self.name,
                "reason": verdict.reason.value,
                "attempt": run.attempt,
            },
        )
        if self.hooks:
            emit(
                self.hooks,
                GaveUp(
                    policy=self.name,
                    attempts=run.attempt,
                    max_attempts=max_attempts,
                    reason=verdict.reason,
                    why=why,
                    message=text,
                    verdict=verdict,
                ),
            )
        message = redact(
            f"{self.name}: call failed after {run.attempt} attempt(s) ({why}): "
            f"{verdict.reason.value}: {verdict.detail}"
        )
        raise CallFailed(
            message, verdict=verdict, attempts=run.attempt, user_message=text
        ) from cause

    def deadline_failure(self, run: Run, seconds: float, waited: float) -> NoReturn:
        """Our own ``deadline=`` ran out; say what was going on at the time."""
        if run.phase == "slot" and run.verdict is None:
            gate = self.gate
            raise Busy(
                gate=gate.name, capacity=gate.capacity, in_flight=gate.in_flight, waited=waited
            )
        if run.verdict is None:
            # Cut off in the first attempt: no provider verdict. Neutral for the breaker,
            # since a tight caller deadline says nothing about the provider's health.
            run.verdict = Verdict(
                reason=Reason.TRANSIENT,
                retriable=True,
                detail=f"deadline of {seconds:g}s exceeded",
            )
            cause: BaseException = TimeoutError(f"deadline of {seconds:g}s exceeded")
            self.fail(run, "deadline", self.config.retry.max_attempts, cause, charge=False)
        cause = run.exc if run.exc is not None else TimeoutError("deadline exceeded")
        self.fail(run, "deadline", self.config.retry.max_attempts, cause)
