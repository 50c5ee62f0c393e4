"""The header sync surface of a gate's budgets: :class:`BudgetSync`, a base of ``Budgets``.

Why apart. ``budgets`` keeps what every admission runs (the inline fast path, ``when``,
``take``, ``settle``); this module keeps what only header learning (``_limits.learn``)
reaches, through the ledger's ``_hold_until`` / ``_budget_mark`` / ``_lower_budgets``: a
provider said it is drained until a time (:meth:`BudgetSync.hold_until`), what was charged
when a request went out (:meth:`BudgetSync.mark`), and what the provider said was left then
(:meth:`BudgetSync.lower_since`), with the token bucket's spare, its held refunds, the
first bucket's lift and the sliding window's copy. The fields a sync sets are declared in
this base's ``__slots__``, the others in ``Budgets``'; the methods here read and set them
under the gate's lock, as every ``Budgets`` method does.

Invariants kept here: a sync never raises the request budget, nor the total-token budget
but through the lift, the held refunds (up to what the report leaves) or the window copy;
the split budgets are set by ``split.Bucket.sync``; a report is a lower bound on the
provider's level (no refill since it is credited).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .rate import BudgetMark
from .rate_math import level_tat
from .window import TokenWindow

if TYPE_CHECKING:
    from .rate import Rate
    from .split import Bucket

__all__ = ["MINUTE_S", "BudgetSync"]

#: Seconds of refill a request budget holds by the minute (:meth:`BudgetSync.by_minute`):
#: a provider's published per-minute request limit takes its whole minute at once.
MINUTE_S = 60.0


class BudgetSync:
    """The header sync surface of ``budgets.Budgets``; see the module docstring."""

    # The fields a sync sets live here; Budgets' own __slots__ hold the rest.
    __slots__ = (
        "_req_step",
        "req_minute",
        "req_ready",
        "req_tat",
        "req_tau",
        "tok_credit",
        "tok_pending",
        "tok_spare",
        "tok_tat",
        "tok_window",
    )

    # Budgets' fields this surface reads and sets.
    rate: Rate
    started: bool
    req_interval: float
    req_tau: float
    req_tat: float
    req_ready: float
    req_spent: float
    _req_step: float
    tok_interval: float
    tok_tau: float
    tok_tat: float
    tok_spent: float
    tok_back: float
    tok_credit: float
    tok_largest: int
    tok_spare: bool
    tok_pending: float
    tok_window: TokenWindow | None
    inp: Bucket | None
    outp: Bucket | None
    split: bool

    def _update_ready(self) -> None:
        # The earliest time the next request conforms (admission_time with cost 1).
        if self.req_interval:
            self._req_step = min(self.req_interval, self.req_tau) - self.req_tau
            self.req_ready = self.req_tat + self._req_step
        else:
            self.req_ready = -math.inf

    def requests_left(self, now: float) -> float | None:
        """Request units in the budget now (negative in debt), or ``None`` if unlimited."""
        if not self.req_interval:
            return None
        return (self.req_tau - max(0.0, self.req_tat - now)) / self.req_interval

    def by_minute(self, now: float, on: bool = True) -> None:
        """Let the request budget hold a minute's refill from ``now`` on (over every rate
        change too), full if it admitted nothing yet: what a provider's published
        per-minute limit takes at once; otherwise the level it has stays (``on=False``:
        back to the rate's ``burst_s``, the level capped to it)."""
        self.req_minute = on
        if not self.started or not self.req_interval:
            return  # the start (or a request rate) applies it
        interval, tau = self.req_interval, MINUTE_S if on else self.rate.burst_s
        level = math.inf if on and not self.req_spent else self.requests_left(now)
        self.req_tau = tau
        self.req_tat = level_tat(level, now, interval, tau)
        self._update_ready()

    def _tok_level(self, now: float) -> float:
        # The GCRA part of the token level, without the credit (at most ``tok_tau``).
        return (self.tok_tau - max(0.0, self.tok_tat - now)) / self.tok_interval

    def _widen(self, tokens: int) -> float:
        """Token units a cost of ``tokens`` adds to the spare (0 but for a new largest).

        A budget synced to a provider's bucket is kept the largest cost beyond the burst
        below the provider's level (``lower_since``): a full budget admits any cost, into
        debt, so the provider must hold the rest. A cost above every one before would go
        on a spare sized for the old largest, into a bucket that may not hold it (after
        the answers' headers were learned when they arrive, as the transports do, the
        budget rode the drained bucket closer: tier-1 0 -> 0.33 % of calls with a 429,
        80 agents 1.5 %, each 429 a new largest). So it waits until the budget has been
        full for that many more units (``when``): the provider's bucket, kept the old
        spare above ours, went on filling meanwhile and holds it. Its admission leaves
        the budget its cost below the burst, the new spare, as the next sync would.
        """
        if not self.tok_spare:
            return 0.0
        # What the budget holds at most: the burst and the first bucket's credit.
        held = self.tok_tau / self.tok_interval + self.tok_credit
        return max(0.0, tokens - max(self.tok_largest, held))

    def hold_until(self, at: float) -> None:
        """Spend every budget until ``at``: no admission before it, then refill as usual.

        For a provider that said its own budget is drained until ``at``. The request
        budget is left with one unit at ``at`` and the token budget with none (a call
        stating tokens then waits for their refill), exactly as if admissions had
        drained them; a budget already owing past ``at`` keeps its debt. Deferred to
        the first slow-path step if the budgets have not started.
        """
        if self.req_interval:
            tat = at + self.req_tau - min(self.req_interval, self.req_tau)
            if tat > self.req_tat:
                self.req_tat = tat
                self._update_ready()
        if self.tok_window is not None:
            self.tok_window.hold = max(self.tok_window.hold, at)
        if self.tok_interval:
            self.tok_credit = 0.0
            tat = at + self.tok_tau
            if tat > self.tok_tat:
                self.tok_tat = tat
        for bucket in (self.inp, self.outp):
            if bucket is not None:
                bucket.hold(at)

    def mark(self, now: float) -> BudgetMark:
        """What has been charged so far, stamped ``now``: the reference of :meth:`lower_since`."""
        if not self.split:
            return BudgetMark(now, self.req_spent, self.tok_spent, self.tok_back)
        return BudgetMark(
            now,
            self.req_spent,
            self.tok_spent,
            self.tok_back,
            0.0 if self.inp is None else self.inp.spent - self.inp.back,
            0.0 if self.outp is None else self.outp.spent - self.outp.back,
        )

    def lower_since(
        self,
        now: float,
        mark: BudgetMark,
        requests: float | None,
        tokens: float | None,
        input_tokens: float | None = None,
        output_tokens: float | None = None,
        *,
        lift: float | None = None,
        spare: bool = False,
        window: bool = False,
    ) -> bool:
        """Lower each budget to what a provider said was left at ``mark``, less our spending since.

        For a provider's ``remaining`` header (``_limits.learn``): ``requests`` / ``tokens``
        units were left in its bucket when the reported request was sent (``mark`` taken
        right after that request was charged here). Everything this gate charged since
        (``spent - mark``) is assumed to be counted against that bucket by now, and no
        refill since is credited, so ``left - spent_since`` is a lower bound on the
        provider's level: a budget above it is brought down to it, possibly into debt
        (the provider refills slower than we pace, e.g. another client spends from it).
        The crediting of no refill is the conservative choice: a report ``d`` seconds old
        understates the level by ``d`` seconds of the provider's net refill (callers drop
        reports older than one already applied, see ``RateLearner``). Never raises a
        level of the request or total-token budget but through ``lift`` (the input- and
        output-token budgets are set to the provider's count either way:
        ``split.Bucket.sync``); ``None`` (or a budget the gate does not have) changes
        nothing. Returns ``True`` if a budget changed.

        ``lift``: the provider's first bucket, lent once (``ShareMeter.lift``, ``_limits.share``): the
        token level may rise to ``lift - spent_since``, the part above the burst held as
        a credit (``tok_credit``) that admissions draw on once the burst is spent, never
        refilled, and lowered by every later report as the level is. ``spare``: the
        token bucket is a bucket, not a sliding window: the level is kept the largest
        admission's tokens beyond the burst below the provider's (see below). ``window``:
        the provider's reports show a sliding token window: the token budget becomes a
        copy of it from now on (``window.TokenWindow``, which :meth:`_sync_window` makes
        and syncs), and a sync may then raise the level (the rest of the window).
        """
        changed = False
        if requests is not None and self.req_interval:
            level = requests - (self.req_spent - mark.requests)
            tat = now + self.req_tau - level * self.req_interval
            if tat > self.req_tat:
                self.req_tat = tat
                self._update_ready()
                changed = True
        if tokens is not None and self.tok_interval and (window or self.tok_window):
            changed |= self._sync_window(now, mark, tokens)
        elif tokens is not None and self.tok_interval:
            since = self.tok_spent - mark.tokens
            level = tokens - since
            self.tok_spare = spare
            if self.tok_pending:
                # Refunds held since the last report count now, up to what this one says.
                self.tok_tat -= self.tok_pending * self.tok_interval
                self.tok_pending = 0.0
                changed = True
            if spare:
                # A cost above the burst goes through on a full budget, into debt
                # (``admission_time`` caps it at ``tau``): the provider's bucket must hold
                # the rest. Without this, riding a drained bucket after the lift, calls
                # got 429s (TOKEN_TUNING seeds 1-3: hidden TPM 150,000 1.7 % worst seed,
                # ~15,000-token prompts 1.0 % median); nothing changed where the bucket
                # never drains (every TOKEN_TUNING cell without the lift).
                level -= max(0.0, self.tok_largest - self.tok_tau / self.tok_interval)
            gcra = self._tok_level(now)
            credit = self.tok_credit
            if lift is not None:
                credit = max(credit, lift - since - max(gcra, 0.0))
            credit = max(0.0, min(credit, level - gcra))
            if credit != self.tok_credit:
                self.tok_credit = credit
                changed = True
            tat = now + self.tok_tau - level * self.tok_interval
            if tat > self.tok_tat:
                self.tok_tat = tat
                changed = True
        # The split budgets count net charges (settle refunds subtracted): their marks
        # hold ``spent - back`` (see ``mark``). They are set, not only lowered (see
        # ``split.Bucket.sync``).
        if input_tokens is not None and self.inp is not None:
            since = self.inp.spent - self.inp.back - mark.input_tokens
            changed |= self.inp.sync(now, input_tokens, since)
        if output_tokens is not None and self.outp is not None:
            since = self.outp.spent - self.outp.back - mark.output_tokens
            changed |= self.outp.sync(now, output_tokens, since)
        return changed

    def _sync_window(self, now: float, mark: BudgetMark, tokens: float) -> bool:
        # The token budget is the provider's sliding window (see window.py). Made at the
        # first such report: what we charged before it is in the report's count (a
        # phantom expiring a window after ``mark``), what we charged since is counted
        # from now; both the latest they can expire. A level above the GCRA's is
        # possible (the rest of the window): the caller wakes the queue.
        made = self.tok_window is None
        if self.tok_window is None:
            window = self.tok_window = TokenWindow(60.0 / self.tok_interval)
            self.tok_credit = 0.0
            window.add(now, self.tok_spent, self.tok_spent - mark.tokens)
        return self.tok_window.sync(now, mark.at, mark.tokens, tokens) or made
