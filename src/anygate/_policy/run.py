"""One call's state across its attempts, and the breaker outcomes it reports.

The attempt loop (:mod:`anygate._policy.attempts`, :mod:`anygate._policy.blocks`) owns a :class:`Run` per call and
the :class:`~anygate._policy.retrying.Retrier` writes its decisions into it; :class:`Stop` is the
decision to give up. Kept apart from the decisions themselves so that the state a call
carries is readable in one place.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .._events.events import emit
from .._gate.waiters import ki_protected
from .._validation import FLOAT_MAX, check_number

if TYPE_CHECKING:
    from .._classify.classify import Verdict
    from .._events.events import BreakerStateChanged
    from .._limits.adaptive import AdaptiveLimit
    from .attempts import Attempts
    from .breaker import CircuitBreaker
    from .permit import Permit

__all__ = [
    "FAILURE",
    "NEUTRAL",
    "NOT_PROVIDER",
    "SUCCESS",
    "Run",
    "Stop",
    "accept",
    "check_deadline",
    "hand_on_probe",
    "report_outcome",
    "take_permit",
]

SUCCESS, FAILURE, NEUTRAL = "success", "failure", "neutral"
#: The ``why`` of a :class:`Stop` for an error that is not the provider's (the caller's own
#: bug): it propagates unchanged, with no ``GaveUp`` event (nothing was given up on).
NOT_PROVIDER = "not_provider"


class Stop:
    """The decision to give up, and why (a value, not an exception, so it never shows up in
    the ``__context__`` of the CallFailed raised next)."""

    __slots__ = ("max_attempts", "why")

    why: str
    max_attempts: int

    def __init__(self, why: str, max_attempts: int) -> None:
        self.why = why
        self.max_attempts = max_attempts


class Run:
    """Per-call state, owned by one task or thread."""

    __slots__ = (
        "admitted_at",
        "attempt",
        "breaker_waited",
        "burst_probe",
        "exc",
        "failures",
        "generation",
        "in_flight",
        "outcome",
        "permit",
        "phase",
        "prev_ms",
        "reraise",
        "saturated",
        "sending",
        "slot_started",
        "throttles",
        "tokens",
        "verdict",
    )

    attempt: int
    admitted_at: float | None
    breaker_waited: float
    failures: int
    throttles: int
    tokens: int | None
    in_flight: int
    saturated: bool
    sending: int
    burst_probe: bool
    generation: int | None
    prev_ms: float | None
    verdict: Verdict | None
    exc: BaseException | None
    outcome: str
    permit: Permit | None
    phase: str
    slot_started: float
    reraise: bool

    def __init__(self) -> None:
        self.attempt = 0
        # Failed attempts by budget: provider failures (max_attempts; a failed breaker
        # probe does not count) and throttles (throttle_attempts).
        self.failures = 0
        self.throttles = 0
        # The gate's calls in flight when this attempt was admitted (itself included), and
        # whether the gate was full then (only then is a success evidence for more).
        self.in_flight = 0
        self.saturated = False
        # The gate's calls at the provider when this attempt was sent (itself included):
        # in flight, less those held back (AdaptiveLimit.sending).
        self.sending = 0
        # This attempt is the probe that ends a burst-rate pause (see AdaptiveLimit).
        self.burst_probe = False
        # The adaptive limit's generation when the current attempt was admitted; None when
        # the caller does not track it (a throttle during a pause is then old news).
        self.generation = None
        # When the current attempt was admitted, on the adaptive limit's clock (how long
        # a throttle took to come back sets a check's grace); None before the first.
        self.admitted_at = None
        # The tokens the gate charged the current attempt (acquire(tokens=)), or None.
        self.tokens = None
        # Seconds spent waiting for an open breaker so far (bounded by max_wait_sec).
        self.breaker_waited = 0.0
        self.prev_ms = None
        self.verdict = None
        self.exc = None
        self.outcome = NEUTRAL  # what the breaker hears if the call ends now
        # The breaker permit, stored here by Retrier.admit inside KI-protected code so the
        # caller's finally (Retrier.settle) sees it whatever interrupts the call afterwards.
        self.permit = None
        self.phase = "slot"  # "breaker", "slot", "attempt" or "sleep": what a deadline cut
        self.slot_started = 0.0
        # Giving up raises the last provider exception instead of CallFailed (reraise=).
        self.reraise = False


@ki_protected
def take_permit(breaker: CircuitBreaker, run: Run) -> None:
    # Protected: between acquire() returning and the store, a Ctrl-C under trio would
    # otherwise leave a claimed probe that nobody reports.
    run.permit = breaker._admit(log=False)  # the policy logs through its hooks


def hand_on_probe(run: Run, adaptive: AdaptiveLimit | None) -> None:
    """If ``run``'s attempt was a burst pause's (or check's) probe and will not report its
    outcome, hand the role on: the next attempt to ask becomes the probe (a role kept by
    an attempt that is gone would never come back, and the pause would last for ever)."""
    if run.burst_probe:
        run.burst_probe = False
        if adaptive is not None:
            adaptive.probe_ended()
    if adaptive is not None:
        adaptive.unhold(run)


def accept(run: Run, number: int, permit: Permit | None, loop: Attempts) -> None:
    """The provider accepted ``run``'s attempt ``number`` (``permit`` is the one it was
    admitted with): a success *now* for the breaker (its probe closes it, see
    :meth:`~anygate._policy.permit.Permit.accepted`) and for a burst pause's probe (the
    pause ends, see :meth:`~anygate._limits.adaptive.AdaptiveLimit.probe_accepted`).
    The attempt's outcome is still reported when it ends. Idempotent and thread-safe:
    each of the two takes its own lock and counts once."""
    change = None if permit is None else permit.accepted()
    at = run.admitted_at
    if at is not None and run.attempt == number:
        loop.adaptive.accepted(at, run)  # past the request window: its estimate's pass now
    # Unlocked reads: probe_accepted checks the role again under its lock. The number:
    # a late call for an attempt that has ended must not end a pause its retry probes.
    if run.burst_probe and run.attempt == number:
        loop.adaptive.probe_accepted(run)
    if change is not None and loop.hooks:
        emit(loop.hooks, change)


@ki_protected
def report_outcome(permit: Permit, outcome: str) -> BreakerStateChanged | None:
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
