"""The per-gate rate state: :class:`Budgets`, the GCRA budgets and the slope tick ring.

One gate's mutable rate state, charged by the ledger under the gate's lock: the request and
total-token budgets spelled out inline (the uncontended path, :meth:`Budgets.try_take`, is
the benchmark's), the split input/output budgets as ``split.Bucket`` objects, and the slope
bound's ring of per-tick counts; the header sync surface that policy learning reaches
through the ledger (``hold_until``, ``mark``, ``lower_since``) is its base,
``budget_sync.BudgetSync``. The formulas are the pure
functions of ``rate_math``; what a rate *is* (the validated :class:`anygate.Rate`) lives in
``rate``.

Not thread-safe on its own, not public and not a limiter by itself: the ledger owns one
per gate and runs every method under its lock (the fleet's ``FleetBudgets`` stands in for
it on a fleet gate).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .budget_sync import MINUTE_S, BudgetSync
from .gate_args import max_cost
from .rate import RateStatistics
from .rate_math import EPSILON, TICKS, admission_time, charge, level_tat, slope_allowance
from .split import Bucket

if TYPE_CHECKING:
    from .rate import Rate
    from .window import TokenWindow

__all__ = ["SPLIT_BURST_S", "Budgets"]

#: Seconds of refill the input- and output-token budgets hold: a minute. Anthropic's
#: buckets hold the whole per-minute limit ("continuously replenished up to your maximum
#: limit", its rate-limit documentation), and an output charge is ``max_tokens`` until
#: the answer settles it: held to ``burst_s`` (1 s), each call's reservation became a debt
#: refunded only when the call ended, pacing at OTPM / max_tokens (measured on the
#: Anthropic-like TOKEN_TUNING cell, issue 30: 1.152x the oracle with a 1 s input budget
#: and this one, 1.235x at 10 s, 1.607x at 1 s; 1.124x with both at 60 s). The budgets
#: still start empty, so this never exceeds the provider's own bucket.
SPLIT_BURST_S = 60.0


class Budgets(BudgetSync):
    """The mutable rate state of one gate; every method runs under the gate's lock.

    Not thread-safe on its own and not public: :class:`anygate.Gate` owns one per rate.
    """

    __slots__ = (
        "_allow",
        "_counts",
        "_current",
        "_epoch",
        "_floor",
        "_ramp",
        "_tick",
        "_tick_end",
        "_tick_index",
        "inp",
        "max_tokens",
        "outp",
        "rate",
        "req_interval",
        "req_spent",
        "split",
        "started",
        "tok_back",
        "tok_interval",
        "tok_keep",
        "tok_largest",
        "tok_spent",
        "tok_tau",
    )

    _allow: int
    _counts: list[int]
    _current: int
    _epoch: float
    _floor: int
    _ramp: float
    _tick: float
    _tick_end: float
    _tick_index: int
    req_spent: float
    tok_spent: float
    inp: Bucket | None
    outp: Bucket | None
    split: bool
    tok_back: float
    tok_credit: float
    tok_keep: bool
    tok_largest: int
    tok_spare: bool
    tok_pending: float
    tok_window: TokenWindow | None

    def __init__(self, rate: Rate, now: float | None, old: Budgets | None = None) -> None:
        """Budgets that start empty at ``now``; ``old``'s levels and history carry over.

        ``now=None`` (the clock cannot be read yet: a virtual clock outside its run) makes
        them start, empty, at the first slow-path step; the fast path refuses until then.
        """
        self.rate = rate
        self.started = now is not None
        # Units charged so far (admissions and settle charges, never refunds), carried over
        # a rate change: what ``lower_since`` subtracts for admissions after a mark.
        self.req_spent = 0.0 if old is None else old.req_spent
        self.tok_spent = 0.0 if old is None else old.tok_spent
        self.tok_back = 0.0 if old is None else old.tok_back
        if now is None:
            now = 0.0
        elif old is not None and not old.started:
            old = None
        # Tokens held beyond the burst, from a provider's full first bucket (``lower_since``
        # with ``lift``); in tokens, so a rate change keeps them.
        self.tok_credit = 0.0 if old is None else old.tok_credit
        self.tok_largest = 0 if old is None else old.tok_largest
        # Synced to a provider's token bucket, keeping the largest cost spare (see
        # ``lower_since``): a cost above every one before widens the spare before it goes.
        self.tok_spare = False if old is None else old.tok_spare
        # The provider keeps the estimate it charged at admission (a token 429 said so:
        # ``keep_estimates``): a settle refund gives nothing back; kept over a change.
        self.tok_keep = False if old is None else old.tok_keep
        # Settle refunds held until a provider's report says whether it gave them back
        # too (``settle``), on a budget synced to reports: in tokens, kept over a change.
        self.tok_pending = 0.0 if old is None else old.tok_pending
        # The provider's sliding token window, once its reports showed one (lower_since
        # with ``window``); it replaces the GCRA token budget and keeps its entries.
        self.tok_window = None if old is None else old.tok_window
        burst = rate.burst_s
        # The request budget holds a minute's refill (by_minute), over any rate change.
        self.req_minute = old is not None and old.req_minute
        self.req_interval = self.req_tau = self.req_tat = self._req_step = 0.0
        self.req_ready = -math.inf
        self.tok_interval = self.tok_tau = self.tok_tat = 0.0
        rpm, tpm = rate.requests_per_minute, rate.tokens_per_minute
        # The largest cost one admission may state (Gate.acquire's check).
        self.max_tokens = max_cost(rate)
        # The split budgets (ITPM / OTPM): objects, off the inline fast path; see split.py.
        itpm, otpm = rate.input_tokens_per_minute, rate.output_tokens_per_minute
        split_tau = max(burst, SPLIT_BURST_S)
        old_in = None if old is None else old.inp
        old_out = None if old is None else old.outp
        self.inp = None if itpm is None else Bucket(itpm, split_tau, now, old_in)
        self.outp = None if otpm is None else Bucket(otpm, split_tau, now, old_out)
        self.split = self.inp is not None or self.outp is not None
        if rpm is not None:
            self.req_interval = 60.0 / rpm
            self.req_tau = MINUTE_S if self.req_minute else burst
            level = old.requests_left(now) if old is not None else None
            self.req_tat = level_tat(level, now, self.req_interval, self.req_tau)
            self._update_ready()
        if tpm is not None:
            self.tok_interval = 60.0 / tpm
            self.tok_tau = burst
            # The credit carries over apart (``tok_credit``), not capped to the new burst.
            level = old._tok_level(now) if old is not None and old.tok_interval else None
            self.tok_tat = level_tat(level, now, self.tok_interval, self.tok_tau)
            if self.tok_window is not None:
                self.tok_window.capacity = tpm
        else:
            self.tok_window = None
        self._ramp = rate.ramp or 0.0
        self._floor = rate.floor
        self._tick = rate.window_s / TICKS
        self._current = 0
        if old is not None and old._tick == self._tick:
            # Keep the window history: a live change must not forget recent admissions.
            old._flush()
            self._epoch, self._counts = old._epoch, old._counts
            self._tick_index, self._tick_end = old._tick_index, old._tick_end
        else:
            # A new (or re-sized) window starts with an idle history: the floor applies.
            self._epoch = now
            self._counts = [0] * (2 * TICKS)
            self._tick_index = 0
            self._tick_end = now + self._tick
        self._allow = slope_allowance(self._counts, self._ramp, self._floor) if self._ramp else 0
        self._roll(now)
        if not self.started:
            self.req_ready = math.inf  # the fast path defers to when(), which starts us

    def _start(self, now: float) -> None:
        minute = self.req_minute
        self.__init__(self.rate, now)  # type: ignore[misc]  # re-run in place, once
        if minute:
            self.by_minute(now)

    # ------------------------------------------------------------------ views

    def tokens_left(self, now: float) -> float | None:
        """Token units in the budget now (negative in debt), or ``None`` if unlimited."""
        if not self.tok_interval:
            return None
        if self.tok_window is not None:
            return self.tok_window.left(now)
        return self._tok_level(now) + self.tok_credit

    def _draw_credit(self, now: float) -> None:
        # Pay the GCRA level's debt from the credit: the refill (at most ``tok_tau``) is
        # spent first, so none of it is lost to the cap while the credit lasts.
        debt = (self.tok_tat - now - self.tok_tau) / self.tok_interval
        if debt > 0:
            drawn = min(self.tok_credit, debt)
            self.tok_tat -= drawn * self.tok_interval
            self.tok_credit -= drawn

    def window_counts(self, now: float) -> tuple[int, int]:
        """Admissions in the current and the previous ``window_s`` (whole ticks)."""
        self._roll(now)  # flushes the current tick's count
        counts = self._counts
        return sum(counts[TICKS:]), sum(counts[:TICKS])

    # ------------------------------------------------------------------ admission

    def try_take(self, now: float, tokens: int) -> bool:
        """Pay for one admission now if every budget allows it: the uncontended path.

        :func:`admission_time`, :func:`charge` and :meth:`take` spelled out inline: this
        runs on every uncontended acquire, whose budget is a few hundred nanoseconds.
        Budgets with a split part go through :meth:`try_take_split` instead.
        """
        late = now + 1e-9  # EPSILON, as a constant
        if late < self.req_ready:
            return False
        # The slope first, so that the token budget is asked and charged in one place: a
        # tick's roll is due whatever the answer, and no budget is charged before all
        # three allow it. Without a ramp ``_allow`` is never read (``_slope_time`` runs
        # only with one, and a new ramp recounts it), so it is not kept up either.
        if late >= self._tick_end:
            self._roll(now)
        ramp = self._ramp
        if ramp and self._allow < 1:
            return False
        tok_interval = self.tok_interval
        if tok_interval:
            if (
                self.tok_credit
                or self.tok_window is not None
                or (self.tok_spare and tokens > self.tok_largest)
            ):
                # The general path draws the credit, charges the sliding window, or widens
                # the spare for a new largest.
                return self.try_take_split(now, tokens, 0)
            tat = self.tok_tat
            tau = self.tok_tau
            cost = tok_interval * tokens  # float first: no int.__mul__ tried and refused
            if late < tat - tau + (cost if cost < tau else tau):
                return False
            if tokens:
                if tat < now:
                    tat = now
                self.tok_tat = tat + cost
                self.tok_spent += tokens
                if tokens > self.tok_largest:
                    self.tok_largest = tokens
        interval = self.req_interval
        if interval:
            tat = self.req_tat
            if tat < now:
                tat = now
            tat += interval
            self.req_tat = tat
            self.req_ready = tat + self._req_step
            self.req_spent += 1.0  # a float add, not an int's conversion: same sum
        self._current += 1
        if ramp:
            self._allow -= 1
        return True

    def try_take_split(self, now: float, tokens: int, out: int) -> bool:
        """:meth:`try_take` for budgets with input/output parts (``out`` of ``tokens`` is
        output): the general :meth:`when` and :meth:`take`, off the inline fast path."""
        if not self.started:
            return False  # the slow path starts them (when())
        if self.when(now, tokens, out=out) > now + EPSILON:
            return False
        self.take(now, tokens, out)
        return True

    def _split_due(self, now: float, tokens: int, out: int, ahead_in: float = 0.0) -> float:
        """When the split budgets admit ``tokens`` (``out`` of them output) at the earliest."""
        at = now
        if self.inp is not None:
            at = max(at, self.inp.at(now, tokens - out, ahead_in))
        if self.outp is not None:
            at = max(at, self.outp.at(now, out))
        return at

    def _split_pay(self, at: float, tokens: int, out: int) -> None:
        if self.inp is not None:
            self.inp.pay(at, tokens - out)
        if self.outp is not None:
            self.outp.pay(at, out)

    def statistics(self, now: float) -> RateStatistics:
        """The rate view at ``now``."""
        if not self.started:
            self._start(now)
        current, previous = self.window_counts(now)
        return RateStatistics(
            rate=self.rate,
            requests_available=self.requests_left(now),
            tokens_available=self.tokens_left(now),
            next_admission_s=self.next_admission(now),
            admitted_this_window=current,
            admitted_previous_window=previous,
            input_tokens_available=None if self.inp is None else self.inp.left(now),
            output_tokens_available=None if self.outp is None else self.outp.left(now),
        )

    def when(
        self, now: float, tokens: int, ahead: int = 0, ahead_tokens: int = 0, out: int = 0
    ) -> float:
        """Earliest admission time of a request behind ``ahead`` others (a lower bound).

        Exact for the head (``ahead == 0``): the latest of every budget's GCRA time and
        the slope bound's next allowance. Behind others, only the budgets they must pay
        first are counted, so the estimate never exceeds the true time (the split budgets
        count none of the costs ahead: the queue keeps only their total).
        """
        if not self.started:
            self._start(now)
        at = now
        if self.req_interval:
            tat = max(self.req_tat, now) + ahead * self.req_interval
            at = max(at, admission_time(tat, now, 1, self.req_interval, self.req_tau))
        window = self.tok_window
        if window is not None:
            # Those ahead stay in the window until we go, so their tokens count with ours:
            # a lower bound while they fit it together (past it, ours alone is one).
            both = ahead_tokens + tokens
            at = max(at, window.at(now, both if both <= window.capacity else tokens))
        elif self.tok_interval:
            tat = max(self.tok_tat, now) + ahead_tokens * self.tok_interval
            widen = self._widen(tokens)
            if widen:
                # Full for ``widen`` more units of refill: the provider's bucket, kept the
                # old spare above ours, went on filling while ours was capped at ``tau``.
                at = max(at, self.tok_tat + (ahead_tokens + widen) * self.tok_interval)
            # The credit widens the budget: the level may reach ``tau`` plus the credit.
            tau = self.tok_tau + self.tok_credit * self.tok_interval
            at = max(at, admission_time(tat, now, tokens, self.tok_interval, tau))
        if self.split:
            at = max(at, self._split_due(now, tokens, out))
        if self._ramp and not ahead:
            at = max(at, self._slope_time(at))
        return at

    def take(self, at: float, tokens: int, out: int = 0) -> None:
        """Charge one admission at time ``at`` (``<= now``) to every budget."""
        if self.req_interval:
            self.req_tat = charge(self.req_tat, at, 1, self.req_interval)
            self._update_ready()
            self.req_spent += 1
        if self.tok_window is not None and tokens:
            self.tok_spent += tokens
            self.tok_window.add(at, self.tok_spent, tokens)
            if tokens > self.tok_largest:
                self.tok_largest = tokens
        elif self.tok_interval and tokens:
            self.tok_tat = charge(self.tok_tat, at, tokens, self.tok_interval)
            self.tok_spent += tokens
            if tokens > self.tok_largest:
                self.tok_largest = tokens
            if self.tok_credit:
                self._draw_credit(at)
        if self.split:
            self._split_pay(at, tokens, out)
        # Counted with or without a ramp: statistics report admissions per window.
        if at + EPSILON >= self._tick_end:
            self._roll(at)
        self._current += 1
        self._allow -= 1

    def next_admission(self, now: float) -> float:
        """Seconds until a request stating no tokens could be admitted (slots aside)."""
        return max(0.0, self.when(now, 0) - now)

    def settle(self, delta: int, now: float | None, in_delta: int = 0, out_delta: int = 0) -> None:
        """A token settle: charge ``delta`` more tokens (refund when negative).

        A charge is paid at ``now``, like one at admission (:func:`charge`): a tat in the
        past only means "full", and adding to it would lose the charge in the burst cap.
        Refunds stay relative (the level is capped anyway). ``in_delta`` / ``out_delta``
        are the input and output parts' changes, for the split budgets (``now`` may be
        ``None`` only when no part is charged more).
        """
        if self.inp is not None and in_delta:
            self.inp.settle(in_delta, now)
        if self.outp is not None and out_delta:
            self.outp.settle(out_delta, now)
        window = self.tok_window
        if window is not None:
            # A sliding window keeps the estimate it charged at admission (Azure): a
            # refund gives nothing back there, a further charge counts from now.
            if delta > 0 and now is not None:
                self.tok_spent += delta
                window.add(now, self.tok_spent, delta)
            elif delta < 0:
                self.tok_back -= delta
            return
        if delta > 0 and self.tok_interval:
            self.tok_spent += delta
            if now is not None and self.tok_tat < now:
                self.tok_tat = now
        elif delta < 0 and self.tok_interval:
            self.tok_back -= delta
            if self.tok_spare:
                # Synced to a provider's reports: the refund waits for the next one
                # (``lower_since``), which says whether the provider gave it back too.
                self.tok_pending -= delta
                return
            if self.tok_keep:
                return  # the provider keeps what it charged at admission
        if self.tok_interval and delta:
            self.tok_tat += delta * self.tok_interval
            if delta > 0 and now is not None and self.tok_credit:
                self._draw_credit(now)

    def refund(self, requests: int, tokens: int, out: int = 0) -> None:
        """Give budget back (negative values charge more); the slope counts stay.

        ``out`` is the output part of ``tokens``, for the split budgets (:meth:`settle`
        moves those itself: this is for an admission given back whole).
        """
        if self.split:
            if self.inp is not None:
                self.inp.refund(tokens - out)
            if self.outp is not None:
                self.outp.refund(out)
        if self.req_interval and requests:
            self.req_tat -= requests * self.req_interval
            self._update_ready()
        if self.tok_window is not None and tokens:
            self.tok_window.give_back(tokens)
        elif self.tok_interval and tokens:
            self.tok_tat -= tokens * self.tok_interval

    # ------------------------------------------------------------------ slope ticks

    def _index(self, t: float) -> int:
        return math.floor((t - self._epoch + EPSILON) / self._tick)

    def _flush(self) -> None:
        # The current tick's count lives in a plain int on the hot path (a list item
        # update costs more); it joins the ring whenever the ring is read.
        if self._current:
            self._counts[-1] += self._current
            self._current = 0

    def _roll(self, now: float) -> None:
        """Move the tick ring forward to the tick containing ``now``."""
        self._flush()
        index = self._index(now)
        steps = index - self._tick_index
        if steps > 0:
            counts = self._counts
            if steps >= len(counts):
                counts[:] = [0] * len(counts)
            else:
                del counts[:steps]
                counts.extend([0] * steps)
            self._tick_index = index
            if self._ramp:
                self._allow = slope_allowance(counts, self._ramp, self._floor)
        self._tick_end = self._epoch + (self._tick_index + 1) * self._tick

    def _slope_time(self, at: float) -> float:
        """Earliest time ``>= at`` with slope allowance for one more admission."""
        steps = self._index(at) - self._tick_index if at + EPSILON >= self._tick_end else 0
        if steps <= 0 and self._allow >= 1:
            return at
        self._flush()
        counts = self._counts
        size = len(counts)
        for extra in range(max(steps, 1), size + 1):
            # The ring as it will look ``extra`` ticks on, with no admissions meanwhile.
            view = counts[extra:] + [0] * extra
            if slope_allowance(view, self._ramp, self._floor) >= 1:
                return max(at, self._epoch + (self._tick_index + extra) * self._tick)
        return at  # not reached: an idle ring allows the floor (>= 1)
