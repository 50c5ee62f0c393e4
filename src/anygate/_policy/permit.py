"""A call's pass through a circuit breaker: report exactly one outcome, once.

:meth:`CircuitBreaker.acquire <anygate._policy.breaker.CircuitBreaker.acquire>` hands
each admitted call a :class:`Permit`; the call reports what happened on it (success,
failure, neutral, or early acceptance) and the breaker's state machine, in
:mod:`~anygate._policy.breaker`, decides under its lock what the report moves. The permit
itself decides nothing: it remembers what the breaker needs to judge a late report (the
half-open episode a probe was admitted in, how often the breaker had opened when it was
given) and the state changes it caused, and logs them for a breaker used directly.

Invariant kept here: a permit reports at most one outcome (``_done`` is set before the
breaker hears it, so a ``finally: permit.neutral()`` after ``success()`` is a no-op);
acceptance is the exception, counted under the breaker's lock (``_accepted``) because the
body of a streamed response may be read on another thread.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, final

from .._events.logging_hook import log_breaker_change
from .breaker_state import BreakerState

if TYPE_CHECKING:
    from .._events.events import BreakerStateChanged
    from .breaker import CircuitBreaker

__all__ = ["Permit"]

# State changes of a breaker used directly are logged here; a policy's permits are quiet,
# because the policy delivers their changes to its hooks and its LoggingHook logs them.
logger = logging.getLogger("anygate")


@final
class Permit:
    """One admitted call's pass through a :class:`CircuitBreaker`.

    Report exactly one outcome; later reports are ignored, so a ``finally: permit.neutral()``
    after an explicit ``success()`` or ``failure()`` is safe. Not thread-safe by itself: a
    permit belongs to the call that took it.

    Attributes:
        probe: this call is the half-open probe.
        changes: the state changes this permit caused (at admission and at its outcome).
    """

    __slots__ = (
        "_accepted",
        "_breaker",
        "_done",
        "_episode",
        "_log",
        "_probe",
        "_seq",
        "_spell",
        "changes",
    )

    def __init__(
        self,
        breaker: CircuitBreaker,
        *,
        probe: bool,
        change: BreakerStateChanged | None,
        episode: int = -1,
        spell: int = 0,
        log: bool = True,
        seq: int = 0,
    ) -> None:
        self._breaker = breaker
        self._log = log
        self._probe = probe
        # How many times the breaker had opened when this permit was given: a call sent
        # before the latest opening proves nothing about the provider since.
        self._spell = spell
        self._episode = episode  # the half-open episode a probe belongs to
        self._seq = seq  # its number among the breaker's admissions (see _record)
        self._done = False
        self._accepted = False  # accepted() has counted (set under the breaker's lock)
        self.changes: list[BreakerStateChanged] = []
        if change is not None:
            self.changes.append(change)
            if self._log:
                log_breaker_change(logger, change)

    @property
    def probe(self) -> bool:
        """Whether this call was admitted as the half-open probe (it may have gone stale
        since: see :class:`CircuitBreaker`)."""
        return self._probe

    @property
    def done(self) -> bool:
        """Whether an outcome has been recorded."""
        return self._done

    def _report(self, outcome: str) -> BreakerStateChanged | None:
        if self._done:
            return None
        self._done = True
        change = self._breaker._record(self, outcome)
        if change is not None:
            self.changes.append(change)
            if self._log:
                log_breaker_change(logger, change)
        return change

    def success(self) -> BreakerStateChanged | None:
        """The call succeeded: close the breaker and clear the failure count."""
        return self._report("success")

    def accepted(self) -> BreakerStateChanged | None:
        """The provider accepted the call (a success status and headers arrived, or the
        first streamed bytes) and it is still running: a success for the breaker now.

        The probe closes the breaker and everyone waiting goes, without waiting for the
        whole generation. The call's outcome is still to be reported when it ends
        (:meth:`success`, :meth:`failure`, :meth:`neutral`); a failure then counts once
        towards ``failure_threshold`` in the closed breaker (see :class:`CircuitBreaker`).

        Idempotent, a no-op once an outcome is recorded, and safe from any thread (unlike
        the outcome reports: the body of a streamed response may be read elsewhere).
        """
        change = self._breaker._record(self, "accepted")
        if change is not None:
            self.changes.append(change)
            if self._log:
                log_breaker_change(logger, change)
        return change

    def failure(self) -> BreakerStateChanged | None:
        """The provider failed (a retriable failure that exhausted its budget)."""
        return self._report("failure")

    def neutral(self) -> BreakerStateChanged | None:
        """Neither trip nor reset (cancellation, non-retriable or burst-rate outcomes)."""
        return self._report("neutral")

    def still_admitted(self) -> bool:
        """Whether a retry may go on: only while the breaker is not open.

        The running probe always may (only its own failure reopens a half-open breaker);
        a stale probe is an ordinary call here too.
        """
        return self._breaker._state is not BreakerState.OPEN

    def __repr__(self) -> str:
        kind = "probe" if self._probe else "call"
        state = "done" if self._done else "pending"
        return f"<anygate.Permit {kind} of {self._breaker.name!r}, {state}>"
