"""What the attempt loop does around each attempt: the breaker's permit, acting on a
failure's decision (:mod:`anygate._policy.decide`), reporting the outcome, giving up.

Shared by every form of the loop, which differ only in how they wait. Everything here is
synchronous and clock-agnostic: callers pass "now" and the deadline in their own time base
(AnyIO's clock, or ``time.monotonic``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NoReturn, final

from .._classify.classify import Reason, RuleLike, Verdict
from .._classify.limit_wording import full_window_limit
from .._classify.throttle import rate_unit
from .._errors import Busy, CallFailed, CircuitOpen
from .._events.events import (
    GaveUp,
    Hook,
    LimitChanged,
    RetryScheduled,
    emit,
    retry_message,
    user_message,
)
from .._redact import redact
from .decide import Judgement, Retry, Tally, decide, judge
from .run import (
    FAILURE,
    NEUTRAL,
    NOT_PROVIDER,
    SUCCESS,
    Run,
    Stop,
    check_deadline,
    hand_on_probe,
    report_outcome,
    take_permit,
)

if TYPE_CHECKING:
    from .._config.limit_values import LimitChange
    from .._config.policy_config import PolicyConfig
    from .._gate.gate import Gate
    from .._limits.adaptive import AdaptiveLimit
    from .backoff import Uniform
    from .breaker import CircuitBreaker
    from .testing_switch import TestingState

__all__ = ["FAILURE", "NEUTRAL", "SUCCESS", "Retrier", "Run", "Stop", "check_deadline"]


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
        """Take the breaker permit for the next attempt into ``run.permit``, then report
        the state changes.

        One permit per *attempt*: the breaker counts failed attempts, and an attempt made
        after the breaker opened (a retry, a caller that waited) asks it again. Call it
        inside the ``try`` whose ``finally`` calls :meth:`settle`: the permit is on
        ``run`` from the moment it exists, so a hook raising a ``BaseException`` here (or
        a Ctrl-C under trio) cannot strand a probe.

        Raises:
            CircuitOpen: the breaker is open; ``run.permit`` stays ``None``.
        """
        if breaker is None:
            return
        take_permit(breaker, run)  # CircuitOpen propagates as is
        permit = run.permit
        if self.hooks and permit is not None:
            for change in permit.changes:
                emit(self.hooks, change)

    def attempt_ended(self, run: Run) -> None:
        """Report a failed attempt's outcome (:meth:`failed` set it) on its permit, and hand
        on the burst pause's probe role if it had it (a burst 429 started a new pause)."""
        hand_on_probe(run, self.adaptive)
        permit = run.permit
        if permit is None:
            return
        run.permit = None
        change = report_outcome(permit, run.outcome)
        run.outcome = NEUTRAL
        if change is not None and self.hooks:
            emit(self.hooks, change)

    def settle(self, run: Run) -> None:
        """Report how the call ended: to the breaker and to the adaptive limit (a success
        on a full gate grows it); then tell the hooks. Every state change happens before
        any hook runs, so a hook raising a ``BaseException`` leaves nothing unsettled."""
        outcome = run.outcome
        change = None
        permit = run.permit
        if permit is not None:
            run.permit = None
            change = report_outcome(permit, outcome)
        grown = None
        probe, run.burst_probe = run.burst_probe, False
        if self.adaptive is not None:
            if outcome == SUCCESS:
                if run.admitted_at is not None:
                    self.adaptive.passed(run.admitted_at, run.sending, run.tokens, run)
                grown = self.adaptive.on_success(
                    saturated=run.saturated,
                    probe=probe,
                    sent_at=run.admitted_at,
                    in_flight=run.sending,
                    caller=run,
                )
            elif probe:
                self.adaptive.probe_ended()
            self.adaptive.disown(run)
        if grown is not None:
            self.report_change(grown)
        if change is not None and self.hooks:
            emit(self.hooks, change)

    def is_control_flow(self, exc: BaseException) -> bool:
        if self.control_types and isinstance(exc, self.control_types):
            return True
        if self.control_names:
            return any(c.__name__ in self.control_names for c in type(exc).__mro__)
        return False

    def failed(
        self,
        run: Run,
        exc: Exception,
        now: float,
        deadline: float,
        testing: TestingState,
    ) -> float | Stop:
        """Act on a failed attempt: judge it, let the gate learn from it, decide what next.

        The decisions are :func:`~anygate._policy.decide.judge` and
        :func:`~anygate._policy.decide.decide`; this writes them into ``run`` (what the
        breaker will hear, the budgets used), tells the adaptive limit (a throttle lowers
        the gate's limit or pauses it) and reports the scheduled retry. Returns seconds to
        sleep before the next attempt, or the :class:`Stop` to give up with.
        """
        judgement = judge(exc, self.rules, self.config.provider)
        run.verdict, run.exc, run.outcome = judgement.verdict, exc, judgement.outcome
        permit = run.permit
        queued = self.learn(run, judgement) if self.adaptive is not None else False
        pause_left_s = 0.0
        if queued and judgement.kind == "burst" and self.adaptive is not None:
            pause_left_s = self.adaptive.pause_left()
        tally = Tally(run.failures, run.throttles, run.prev_ms)
        decision = decide(
            self.config.retry,
            judgement,
            exc,
            tally,
            # An accepted probe has answered the breaker's question: a failure after that
            # (a stream that broke) is this call's own, with its budget and its backoff.
            probe=permit is not None and permit.probe and not permit._accepted,
            queued=queued,
            pause_left_s=pause_left_s,
            rng=self.rng,
            now=now,
            deadline=deadline,
            testing=testing,
        )
        if isinstance(decision, Stop):
            return decision
        tally = decision.tally
        run.failures, run.throttles, run.prev_ms = tally.failures, tally.throttles, tally.prev_ms
        if self.adaptive is not None and 2 * decision.used > decision.max_attempts:
            # A pause's probe is kept for the throttled call's retry; past half its budget
            # the call asks no more for the others (it kept all twelve 429s of a 30 s
            # window's first minute and gave up, and its agent's later calls never ran).
            self.adaptive.disown(run)
        if self.hooks:
            self._retry_scheduled(run, decision)
        return decision.wait_s

    def learn(self, run: Run, judgement: Judgement) -> bool:
        """Tell the adaptive limit what a throttle says; whether the next attempt now
        queues under the gate's lowered limit or pause (it then skips its own backoff).

        Whether or not this call retries, a burst throttle slows the whole gate down: it
        pauses, and the pause's probe decides when everyone goes again, this call too.
        """
        adaptive = self.adaptive
        assert adaptive is not None
        kind = judgement.kind
        if kind is not None and run.admitted_at is not None:
            adaptive.rejected(run.admitted_at, run)
        unit = rate_unit(judgement.verdict) if kind == "rate" else None
        # The answer itself names a window (the slope's, a minute's; OpenAI's code is
        # per-minute): it says nothing of the slots.
        windowed = kind == "burst" or (
            kind == "rate" and (unit is not None or bool(judgement.verdict.code))
        )
        tentative = False  # the slots' by our counts, not by the answer
        stated = True  # the answer named its unit
        if kind == "rate" and unit is None and run.admitted_at is not None:
            # A 429 that does not say what it counted: the limit our counts say was full
            # (issue 30). With a code (OpenAI's rate_limit_exceeded is per-minute) it is
            # requests or tokens; without one (no code, no wording) any limit.
            attributed = adaptive.attribute(
                run.admitted_at,
                run.sending or run.in_flight,
                run.tokens,
                per_minute=bool(judgement.verdict.code),
            )
            if attributed in ("requests", "tokens"):
                unit, stated = attributed, False
            else:
                kind = attributed
                tentative = True
        status = judgement.verdict.status
        throttled = kind is not None and kind != "rate"
        server_error = kind is None and status is not None and status >= 500
        if (throttled or server_error) and run.admitted_at is not None:
            # A throttled send filled no window; nor did one a server error answered (an
            # outage's 503s): counted, the outage's sends made the window before the
            # recovery look busy, the slope rule let the waiting herd go at twice that,
            # and the provider's window after a quiet one turned 39 of them away (morning
            # peak with an outage at 100-130 s, seed 1).
            adaptive.turned_away(
                run.admitted_at, run.tokens, refused=kind == "concurrency", caller=run
            )
        if windowed:
            # A window's 429 does not stop a published slot count's raise (the slope
            # rule's 429s during the ramp held a published 16 with 32 real slots at 16
            # for 30 s), but it shows a server that refuses.
            adaptive.on_refusal(run.sending or run.in_flight, window=True)
        elif kind is not None or (server_error and judgement.verdict.reason is Reason.BUSY):
            # A refusal that may be the slots' (a plain 429, an overload answer, a full
            # queue's "busy"): above a published slot count, the raise stops there (for
            # a hold, unless the answer says it is the slots': "busy" or a full queue's
            # words here, the others' lessons below).
            queue = kind == "concurrency" and status == 503  # a server that queues
            adaptive.on_refusal(run.sending or run.in_flight, slots=kind is None or queue)
        if kind == "burst":
            self.throttled(run, judgement.verdict)
            return adaptive.enabled
        if kind in ("concurrency", "overload"):
            return self.learn_concurrency(run, exact=kind == "concurrency", tentative=tentative)
        if unit is not None and run.admitted_at is not None:
            quoted = full_window_limit(run.exc) if unit == "requests" and stated else None
            adaptive.on_rate(
                unit, run.admitted_at, caller=run, tokens=run.tokens, stated=stated, quoted=quoted
            )
        return False

    def _retry_scheduled(self, run: Run, decision: Retry) -> None:
        verdict = run.verdict
        assert verdict is not None
        expected_ms = decision.expected_ms
        message = retry_message(decision.used, decision.max_attempts, expected_ms, verdict.reason)
        emit(
            self.hooks,
            RetryScheduled(
                policy=self.name,
                attempt=run.attempt,
                max_attempts=decision.max_attempts,
                wait_ms=round(expected_ms),
                reason=verdict.reason,
                from_retry_after=decision.from_header,
                message=redact(message),
                verdict=verdict,
                gate=self.gate.name,
                counted=decision.used,
                wait_s=expected_ms / 1000.0,
            ),
        )

    def _in_flight(self, run: Run) -> int:
        """The calls in flight when ``run``'s attempt was turned away, itself included.

        In flight now, counting this attempt again (its slot is already released), or at
        its admission, whichever is smaller: calls rejected together with this one drop
        out of the count within the reject latency.
        """
        adaptive = self.adaptive
        if adaptive is None or not run.sending:
            return min(run.in_flight, self.gate.in_flight + 1)
        # Counted at the provider: slot holders held back (a pause, a window's hold) are
        # not there (AdaptiveLimit.sending).
        return min(run.sending, adaptive.sending(self.gate.in_flight) + 1)

    def learn_concurrency(self, run: Run, *, exact: bool, tentative: bool = False) -> bool:
        """Tell the adaptive limit the provider turned an attempt away for load
        (``tentative``: by our counts, the answer did not say); whether the gate's limit
        is now below what the attempt was admitted under."""
        adaptive = self.adaptive
        assert adaptive is not None
        change = adaptive.on_concurrency(
            run.generation, self._in_flight(run), exact=exact, tentative=tentative
        )
        if change is not None:
            self.report_change(change)
        return adaptive.limit < run.in_flight

    def throttled(self, run: Run, verdict: Verdict) -> None:
        """Tell the adaptive limit about a burst-rate throttle; report what it did."""
        assert self.adaptive is not None
        retry_after = verdict.retry_after
        if retry_after is not None:
            retry_after = min(retry_after, self.config.retry.retry_after_max_s)
        change = self.adaptive.on_throttle(
            run.generation,
            retry_after,
            self._in_flight(run),
            probe=run.burst_probe,
            admitted_at=run.admitted_at,
            caller=run,
        )
        if change is not None:
            self.report_change(change)

    def report_change(self, change: LimitChange) -> None:
        """Report a change of the adaptive limit (a ``LimitChanged`` event)."""
        if self.hooks:
            emit(
                self.hooks,
                LimitChanged(
                    policy=self.name,
                    gate=self.gate.name,
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
    ) -> NoReturn:
        """Give up: report GaveUp, raise CallFailed (with ``run.reraise``: ``cause`` itself).

        The breaker has heard every attempt already (:meth:`attempt_ended`); giving up
        tells it nothing more, so the outcome left for :meth:`settle` is neutral.
        """
        verdict = run.verdict
        assert verdict is not None
        run.outcome = NEUTRAL
        if why == NOT_PROVIDER and cause is not None:
            # The caller's own error (a KeyError in their code): theirs, unchanged, as
            # stamina and tenacity leave it; the breaker heard it as neutral.
            raise cause
        text = user_message(verdict)
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
                    gate=self.gate.name,
                ),
            )
        message = redact(
            f"{self.name}: call failed after {run.attempt} attempt(s) ({why}): "
            f"{verdict.reason.value}: {verdict.detail}"
        )
        failure = CallFailed(message, verdict=verdict, attempts=run.attempt, user_message=text)
        if run.reraise and cause is not None:
            # The caller asked for the provider's own exception (an SDK's typed error, a
            # transport's last response), logged and reported as a CallFailed would be;
            # what the CallFailed would have said rides along (CallFailed.of, a note).
            failure._attach(cause)
            raise cause
        raise failure from cause

    def deadline_failure(
        self,
        run: Run,
        seconds: float,
        waited: float,
        breaker: CircuitBreaker | None = None,
    ) -> NoReturn:
        """Our own ``deadline=`` ran out; say what was going on at the time."""
        if run.phase == "breaker" and breaker is not None:
            if run.verdict is None:
                # Waited for the breaker all along: nothing was attempted.
                left = breaker.statistics().retry_after
                raise CircuitOpen(name=breaker.name, retry_after=left)
            last = run.exc if run.exc is not None else TimeoutError("deadline exceeded")
            self.fail(run, "circuit_open", self.config.retry.max_attempts, last)
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
            self.fail(run, "deadline", self.config.retry.max_attempts, cause)
        cause = run.exc if run.exc is not None else TimeoutError("deadline exceeded")
        self.fail(run, "deadline", self.config.retry.max_attempts, cause)
