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

With split input/output budgets (``Rate(input_tokens_per_minute=...,
output_tokens_per_minute=...)``) each permit also covers its caller's input part
(``tokens - output_tokens``) and output part, kept in two more pools beside ``tokens``;
the ledger then calls the split signatures (``try_take_split``, ``when(out=)``, ``take``
/ ``refund`` with ``out``, ``settle`` with the parts' deltas) exactly as it calls those
of ``Budgets``. A settle's parts reach the fleet's split budgets at the agent's next
call, as a total-token settle does.

Not thread-safe on its own: every method runs under the local gate's lock.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, NamedTuple

from .._gate.gate_args import max_cost
from .._gate.rate import RateStatistics

if TYPE_CHECKING:
    from .._gate.budgets import Budgets
    from .._gate.rate import Rate

__all__ = ["FleetBudgets", "Returned", "rate_share"]

#: Seconds a head waiter without a permit looks again by itself while a request to Redis
#: is on its way (the permit's arrival wakes it at once anyway). A lower bound of the
#: admission time, so a caller with a short timeout is not refused for a permit that comes
#: within a round trip.
POLL_S = 0.002
#: How far away "never, while Redis is down" is (finite: an estimate, not a hang).
_FAR_S = 1e9


class Returned(NamedTuple):
    """What a call to Redis gives back: the pool, emptied, and the settles since the last.

    ``adjust`` / ``input_adjust`` / ``output_adjust``: settled tokens of the total, input
    and output budgets, ``> 0`` refunded, ``< 0`` charged.
    """

    permits: int = 0
    tokens: int = 0
    adjust: int = 0
    inputs: int = 0
    outputs: int = 0
    input_adjust: int = 0
    output_adjust: int = 0


def rate_share(rate: Rate, processes: int) -> Rate:
    """``rate`` with every per-minute budget divided by ``processes`` (at least 1): what
    one process paces to locally while Redis is unreachable in ``open`` mode."""
    n = max(processes, 1)

    def part(value: float | None) -> float | None:
        return None if value is None else value / n

    return dataclasses.replace(
        rate,
        requests_per_minute=part(rate.requests_per_minute),
        tokens_per_minute=part(rate.tokens_per_minute),
        input_tokens_per_minute=part(rate.input_tokens_per_minute),
        output_tokens_per_minute=part(rate.output_tokens_per_minute),
    )


class FleetBudgets:
    """The permit pool of one process's local gate (see the module docstring)."""

    __slots__ = (
        "adjust",
        "asked",
        "blocked",
        "down",
        "fallback",
        "input_adjust",
        "inputs",
        "max_tokens",
        "next_at",
        "output_adjust",
        "outputs",
        "permits",
        "rate",
        "retry",
        "split",
        "tokens",
        "wanted",
    )

    def __init__(self, rate: Rate) -> None:
        self.rate = rate
        self.max_tokens = max_cost(rate)  # as ``Budgets``
        #: Split input/output budgets: the ledger then passes each cost's output part.
        self.split = rate.split
        self.permits = 0  # admissions the fleet GCRA charged for us, not yet used
        self.tokens = 0  # the tokens those permits cover (surplus usable by any of them)
        self.inputs = 0  # their input parts (split budgets only; surplus as ``tokens``)
        self.outputs = 0  # their output parts (split budgets only)
        self.adjust = 0  # settled tokens to give back (> 0) or charge (< 0) fleet-wide
        self.input_adjust = 0  # the same for the input part (split budgets only)
        self.output_adjust = 0  # and for the output part
        self.next_at = -math.inf  # local clock: when Redis said the next permit conforms
        self.wanted = False  # a caller found the pool short since the agent last looked
        # Split budgets: the costs (total, output part) of the callers the agent last asked
        # permits for, the one Redis's ``next_at`` is for, and whether a head caller that
        # ``next_at`` does not bound waits (see ``when``).
        self.asked: list[tuple[int, int]] = []
        self.blocked: tuple[int, int] | None = None
        self.retry = False
        self.down = False  # Redis unreachable and the gate fails closed: no permits
        # Redis unreachable and the gate fails open: a local GCRA at a share of the rate.
        self.fallback: Budgets | None = None

    # ------------------------------------------------------------------ the ledger's side

    def _covers(self, ahead: int, tokens: int, out: int = 0) -> bool:
        """Does the pool cover ``ahead`` callers and one more, ``tokens`` in all?

        With split budgets, ``out`` is the output part of the one more: only the head's
        parts are known (the queue keeps totals), so behind others the parts are not
        checked (``when`` stays a lower bound).
        """
        if self.permits < ahead + 1:
            return False
        rate = self.rate
        if rate.tokens_per_minute is not None and self.tokens < tokens:
            return False
        if ahead or not self.split:
            return True
        if rate.input_tokens_per_minute is not None and self.inputs < tokens - out:
            return False
        return rate.output_tokens_per_minute is None or self.outputs >= out

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

    def try_take_split(self, now: float, tokens: int, out: int) -> bool:
        """:meth:`try_take` for split budgets: ``out`` of ``tokens`` is output."""
        fallback = self.fallback
        if fallback is not None:
            return fallback.try_take_split(now, tokens, out)
        if self._covers(0, tokens, out):
            self.take(now, tokens, out)
            return True
        self.wanted = True
        return False

    def when(
        self, now: float, tokens: int, ahead: int = 0, ahead_tokens: int = 0, out: int = 0
    ) -> float:
        """A lower bound of the admission time of a caller behind ``ahead`` others.

        ``now`` when the pool covers it; else the time Redis gave for the next permit (or
        a round trip from now while a request is on its way), plus one request interval
        per caller ahead that the pool does not cover. ``out``: the output part of
        ``tokens`` (split budgets).
        """
        fallback = self.fallback
        if fallback is not None:
            if self.split:
                return fallback.when(now, tokens, ahead, ahead_tokens, out)
            return fallback.when(now, tokens, ahead, ahead_tokens)
        if self._covers(ahead, ahead_tokens + tokens, out):
            return now
        self.wanted = True
        if self.down:
            return now + _FAR_S
        if not ahead and not self._bound(tokens, out):
            # The head is not the caller Redis timed (that one left): a cheaper part may
            # conform now, as on a local gate, so the agent asks at once.
            self.retry = True
            return now + POLL_S
        at = max(now + POLL_S, self.next_at)
        rpm = self.rate.requests_per_minute
        short = ahead + 1 - self.permits
        if rpm is not None and short > 1:
            at += (short - 1) * 60.0 / rpm
        return at

    def _bound(self, tokens: int, out: int) -> bool:
        """Does ``next_at`` bound a head caller of ``tokens`` (``out`` of them output)?

        Always without split budgets. With them, ``next_at`` is the admission time of the
        caller Redis stopped at (``blocked``); a GCRA's admission time grows with the
        cost, so it bounds a caller whose every part is at least as large. An all-input
        caller after one refused for the output budget is not bounded by it.
        """
        blocked = self.blocked
        if not self.split or blocked is None:
            return True
        total, part = blocked
        return tokens >= total and out >= part and tokens - out >= total - part

    def take(self, at: float, tokens: int, out: int = 0) -> None:
        """Use one permit (``when`` said the pool covers it); ``out``: the output part."""
        fallback = self.fallback
        if fallback is not None:
            if self.split:
                fallback.take(at, tokens, out)
            else:
                fallback.take(at, tokens)
            return
        self.permits -= 1
        rate = self.rate
        if rate.tokens_per_minute is not None:
            self.tokens -= tokens
        if rate.input_tokens_per_minute is not None:
            self.inputs -= tokens - out
        if rate.output_tokens_per_minute is not None:
            self.outputs -= out

    def settle(self, delta: int, now: float | None, in_delta: int = 0, out_delta: int = 0) -> None:
        """A token settle reaches the fleet's budgets at the agent's next call.

        ``delta`` more tokens in all (a refund when negative), ``in_delta`` / ``out_delta``
        of the input and output parts (split budgets), as ``Budgets.settle``.
        """
        fallback = self.fallback
        if fallback is not None:
            if self.split:
                fallback.settle(delta, now, in_delta, out_delta)
            else:
                fallback.settle(delta, now)
            return
        # The fleet's budgets run on Redis time: ``now`` is not needed.
        rate = self.rate
        if delta and rate.tokens_per_minute is not None:
            self.adjust -= delta
            self.wanted = True
        if in_delta and rate.input_tokens_per_minute is not None:
            self.input_adjust -= in_delta
            self.wanted = True
        if out_delta and rate.output_tokens_per_minute is not None:
            self.output_adjust -= out_delta
            self.wanted = True

    def refund(self, requests: int, tokens: int, out: int = 0) -> None:
        """A granted caller never ran: its permit goes back to the pool.

        ``requests == 0`` is a settle of the total (``tokens > 0`` gives tokens back,
        ``< 0`` charges more), reaching the fleet's budget at the agent's next call.
        ``out``: the output part of ``tokens`` (split budgets).
        """
        fallback = self.fallback
        if fallback is not None:
            if self.split:
                fallback.refund(requests, tokens, out)
            else:
                fallback.refund(requests, tokens)
            return
        if requests:
            self.permits += requests
            self.tokens += tokens
            self.inputs += tokens - out
            self.outputs += out
        elif tokens:
            self.settle(-tokens, None)

    def statistics(self, now: float) -> RateStatistics:
        """The rate view: the pool here (not the fleet's budget) and the next admission."""
        fallback = self.fallback
        if fallback is not None:
            return fallback.statistics(now)
        rate = self.rate
        return RateStatistics(
            rate=rate,
            requests_available=float(self.permits),
            tokens_available=None if rate.tokens_per_minute is None else float(self.tokens),
            next_admission_s=0.0 if self.permits else max(0.0, self.next_at - now),
            # Admissions are counted fleet-wide on Redis, not per process.
            admitted_this_window=0,
            admitted_previous_window=0,
            input_tokens_available=None
            if rate.input_tokens_per_minute is None
            else float(self.inputs),
            output_tokens_available=None
            if rate.output_tokens_per_minute is None
            else float(self.outputs),
        )

    # ------------------------------------------------------------------ the agent's side

    def settled(self) -> bool:
        """Whether settles wait to reach the fleet's budgets (total, input or output)."""
        return bool(self.adjust or self.input_adjust or self.output_adjust)

    def withdraw(self, asked: list[tuple[int, int]] | None = None) -> Returned:
        """Empty the pool for a call to Redis: what to give back (see :class:`Returned`).

        ``asked``: the costs (total, output part) the call asks permits for, in order.
        """
        self.asked = [] if asked is None else asked
        out = Returned(
            self.permits,
            self.tokens,
            self.adjust,
            self.inputs,
            self.outputs,
            self.input_adjust,
            self.output_adjust,
        )
        self.permits = self.tokens = self.adjust = 0
        self.inputs = self.outputs = self.input_adjust = self.output_adjust = 0
        self.wanted = False
        return out

    def deposit(
        self, permits: int, tokens: int, next_at: float, inputs: int = 0, outputs: int = 0
    ) -> None:
        """Permits Redis granted; ``next_at``: when the next one conforms (local clock);
        ``inputs`` / ``outputs``: their input and output parts (split budgets)."""
        self.permits += permits
        self.tokens += tokens
        self.inputs += inputs
        self.outputs += outputs
        self.next_at = next_at
        asked = self.asked
        waits = next_at != -math.inf and permits < len(asked)
        # Whom next_at is for. After a call a head ``next_at`` did not bound asked for (or
        # one that asked meanwhile), it bounds every head until the next call: one such
        # call per call, not one per poll (the overtaking bound can make the ledger's head
        # another caller than the first one asked for).
        self.blocked = asked[permits] if waits and not self.retry else None
        self.retry = False
