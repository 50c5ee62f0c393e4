"""Fleet rate permits: the local gate's rate budget, fed from a GCRA on Redis time.

With a fleet :class:`anygate.Rate`, the budget that decides whether the local gate may
admit is not a local GCRA but a pool of *permits* the agent obtained from Redis: each
permit is one admission the fleet's GCRA (in the Lua script, on Redis ``TIME``) already
charged, with the tokens it covers. The local gate's ledger calls this object exactly as it
calls :class:`anygate._gate.budgets.Budgets` (``try_take``, ``when``, ``take``, ``refund``,
``statistics``), under the gate's lock; the agent refills it under the same lock.

Why a pool and not a share of the rate per process: a per-process share must be re-divided
whenever processes come and go, and a process that lowers its share after another raised
its own briefly doubles the fleet rate. Permits are charged on one clock, in one place, so
the fleet bound is the GCRA's own (plus the time a permit takes to reach its caller).

The agent asks only for permits that callers waiting now can use (one per waiting caller
with a free local slot, in queue order, with its stated tokens), and gives back every
permit still unused at its next call, so permits never age in a process.

Not thread-safe on its own: every method runs under the local gate's lock.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .._gate.rate import RateStatistics

if TYPE_CHECKING:
    from .._gate.budgets import Budgets
    from .._gate.rate import Rate

__all__ = ["FleetBudgets"]

#: Seconds a head waiter without a permit looks again by itself while a request to Redis
#: is on its way (the permit's arrival wakes it at once anyway). A lower bound of the
#: admission time, so a caller with a short timeout is not refused for a permit that comes
#: within a round trip.
POLL_S = 0.002
#: How far away "never, while Redis is down" is (finite: an estimate, not a hang).
_FAR_S = 1e9


class FleetBudgets:
    """The permit pool of one process's local gate (see the module docstring)."""

    __slots__ = (
        "adjust",
        "down",
        "fallback",
        "max_tokens",
        "next_at",
        "permits",
        "rate",
        "tokens",
        "wanted",
    )

    #: No split input/output budgets (``FleetGate`` refuses a rate with them).
    split = False

    def __init__(self, rate: Rate) -> None:
        self.rate = rate
        tpm = rate.tokens_per_minute
        self.max_tokens = math.inf if tpm is None else tpm
        self.permits = 0  # admissions the fleet GCRA charged for us, not yet used
        self.tokens = 0  # the tokens those permits cover (surplus usable by any of them)
        self.adjust = 0  # settled tokens to give back (> 0) or charge (< 0) fleet-wide
        self.next_at = -math.inf  # local clock: when Redis said the next permit conforms
        self.wanted = False  # a caller found the pool short since the agent last looked
        self.down = False  # Redis unreachable and the gate fails closed: no permits
        # Redis unreachable and the gate fails open: a local GCRA at a share of the rate.
        self.fallback: Budgets | None = None

    # ------------------------------------------------------------------ the ledger's side

    def _covers(self, ahead: int, tokens: int) -> bool:
        if self.permits < ahead + 1:
            return False
        return self.rate.tokens_per_minute is None or self.tokens >= tokens

    def try_take(self, now: float, tokens: int) -> bool:
        """Use one permit now if the pool has one covering ``tokens`` (the fast path)."""
        fallback = self.fallback
        if fallback is not None:
            return fallback.try_take(now, tokens)
        if self._covers(0, tokens):
            self.take(now, tokens)
            return True
        self.wanted = True
        return False

    def when(self, now: float, tokens: int, ahead: int = 0, ahead_tokens: int = 0) -> float:
        """A lower bound of the admission time of a caller behind ``ahead`` others.

        ``now`` when the pool covers it; else the time Redis gave for the next permit (or
        a round trip from now while a request is on its way), plus one request interval
        per caller ahead that the pool does not cover.
        """
        fallback = self.fallback
        if fallback is not None:
            return fallback.when(now, tokens, ahead, ahead_tokens)
        if self._covers(ahead, ahead_tokens + tokens):
            return now
        self.wanted = True
        if self.down:
            return now + _FAR_S
        at = max(now + POLL_S, self.next_at)
        rpm = self.rate.requests_per_minute
        short = ahead + 1 - self.permits
        if rpm is not None and short > 1:
            at += (short - 1) * 60.0 / rpm
        return at

    def take(self, at: float, tokens: int) -> None:
        """Use one permit (``when`` said the pool covers it)."""
        fallback = self.fallback
        if fallback is not None:
            fallback.take(at, tokens)
            return
        self.permits -= 1
        if self.rate.tokens_per_minute is not None:
            self.tokens -= tokens

    def settle(self, delta: int, now: float | None) -> None:
        """A token settle reaches the fleet's budget at the agent's next call."""
        del now  # the fleet's budget runs on Redis time
        self.refund(0, -delta)

    def refund(self, requests: int, tokens: int) -> None:
        """A granted caller never ran (its permit goes back to the pool), or a settle.

        ``requests == 0`` is :meth:`anygate.Token.settle`: ``tokens > 0`` gives tokens
        back, ``< 0`` charges more; both reach the fleet's GCRA at the agent's next call.
        """
        fallback = self.fallback
        if fallback is not None:
            fallback.refund(requests, tokens)
            return
        if requests:
            self.permits += requests
            self.tokens += tokens
        elif tokens and self.rate.tokens_per_minute is not None:
            self.adjust += tokens
            self.wanted = True

    def statistics(self, now: float) -> RateStatistics:
        """The rate view: the pool here (not the fleet's budget) and the next admission."""
        fallback = self.fallback
        if fallback is not None:
            return fallback.statistics(now)
        return RateStatistics(
            rate=self.rate,
            requests_available=float(self.permits),
            tokens_available=None if self.rate.tokens_per_minute is None else float(self.tokens),
            next_admission_s=0.0 if self.permits else max(0.0, self.next_at - now),
            # Admissions are counted fleet-wide on Redis, not per process.
            admitted_this_window=0,
            admitted_previous_window=0,
        )

    # ------------------------------------------------------------------ the agent's side

    def withdraw(self) -> tuple[int, int, int]:
        """Empty the pool for a call to Redis: ``(permits, tokens, adjust)`` to give back."""
        out = (self.permits, self.tokens, self.adjust)
        self.permits = self.tokens = self.adjust = 0
        self.wanted = False
        return out

    def deposit(self, permits: int, tokens: int, next_at: float) -> None:
        """Permits Redis granted; ``next_at``: when the next one conforms (local clock)."""
        self.permits += permits
        self.tokens += tokens
        self.next_at = next_at
