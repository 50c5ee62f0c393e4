"""What a shared rate bucket leaves this client, measured from its reports over time.

Why. A provider's ``remaining`` header counts everyone on the key, the gate's own charges
only this client's: two reports some seconds apart, with our charges between them, say how
fast the bucket refills beyond what we spent (the limit less what others spend). Read once
early, it says whether the bucket's first minute is ours to spend; read when the bucket
runs low, it says the share of the limit the gate may pace at.

What. One :class:`ShareMeter` per :class:`~anygate._limits.learn.RateLearner`, run under
its lock:

* :meth:`ShareMeter.lift`: the provider's bucket starts full (a minute of its limit), the
  gate's token budget empty. Once, early, the level to raise the gate's token budget to:
  only if two reports at least ``_LIFT_SPAN_S`` apart show the bucket refilling at
  ``_LIFT_REFILL`` of its limit or more beyond our charges (nobody else spends from it),
  and only before the gate has charged a whole limit. A report showing the bucket full
  again after a lull (:meth:`ShareMeter.refilled`) arms it once more.
* :meth:`ShareMeter.measure`: two reports of a bucket below ``_LOW`` of its limit, falling
  under our pace, measure the rate it refills for us (:attr:`ShareMeter.available`); the
  learner paces the gate at the lower of that and its limit less the headroom.

Pure arithmetic over reports and marks: no lock, no clock, no gate.
"""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING, final

if TYPE_CHECKING:
    from .._classify.headers import ReportedLimit
    from .._gate.rate import BudgetMark

__all__ = ["ShareMeter", "same"]

# Two limits this close are the same limit (providers round token limits to 1000).
_SAME = 0.01
# Measuring the rate a shared bucket leaves us (ShareMeter.measure):
# Snapshots count only below a quarter of the limit: a bucket that went full between two
# of them lost refill and the measure would understate what is left to us, and from a
# quarter, refilling at the limit's rate, a bucket needs 45 s without our charges to be
# full. The pace then holds the bucket about there: a cushion of 15 s of the limit for a
# big request and the answers' lag, and what the run leaves unspent. At a half (the first
# choice) the cushion cost 1.02-1.06x the oracle on tier-1 with 20-70 % background load
# (variations outside the reporting set, seeds 1-5); at a quarter 1.01-1.03x, no 429.
_LOW = 0.25
# The shortest span measured: ~10 answers at tier-1 token rates (one every ~1.5 s), so one
# report's rounding does not set the pace; the longest: one window, the span in which a
# per-minute bucket can refill entirely.
_SPAN_S = 10.0
_AGE_S = 60.0
# The least pace a measure may set, as a share of the limit: others spending everything
# still leaves the gate a trickle to notice a change with (the syncs hold it meanwhile).
_MIN_SHARE = 0.05
# Lifting the token budget to the provider's first bucket (ShareMeter.lift, issue 30).
# The refill is measured over at least this span of report send times: ~3 answers at
# tier-1 rates, and exact to ~1 % there (seeds 1-3: 199,999 / 192,390 / 199,996 a minute
# with nobody else spending, 160,000 at 20 % background, 90,000 at 55 %); longer, the lift
# comes later (TOKEN_TUNING seeds 1-3, tier-1 1.011x the oracle at 5 s, 1.019x at 10 s;
# 3 s gave a worst seed of 1.025x).
_LIFT_SPAN_S = 5.0
# ... and lifts only at this share of the limit or more: the bucket is nobody else's.
# Lifted at the first report whoever else spends, the gate drains the bucket before the
# share measure can see it fall, then paces at the limit into a bucket refilled slower
# (TOKEN_TUNING seeds 1-3: background 20 % 0 -> 2.2 % of calls with a 429, 55 % 0 ->
# 12.5 %). A bucket full part of the span loses refill and reads low: it is measured
# again, from the same snapshot, at each report (ShareMeter.lift).
_LIFT_REFILL = 0.9


def same(a: float, b: float) -> bool:
    """Whether two limits (or paces) are the same, within ``_SAME`` of the larger."""
    return abs(a - b) <= _SAME * max(a, b)


@final
class ShareMeter:
    """The measures of a shared bucket; see the module docstring."""

    __slots__ = (
        "_first",
        "_kept",
        "_lift_from",
        "_lift_mark",
        "_trails",
        "available",
        "lifted",
    )

    def __init__(self) -> None:
        # Snapshots (sent at, remaining, our spent) per kind, the
        # first time each kind was seen at or above _LOW, and the measured rate left to
        # us per minute (see measure).
        self._trails: dict[str, deque[tuple[float, float, float]]] = {}
        self._first: dict[str, float] = {}
        self.available: dict[str, float] = {}
        # The token budget's lift (see lift): done or given up, and the first snapshot
        # (sent at, remaining, our tokens charged) its refill is measured from.
        self.lifted = False
        self._lift_mark: tuple[float, float, float] | None = None
        # Our tokens charged when the lift was (re)armed (see refilled).
        self._lift_from = 0.0
        # Our token charges and refunds, each a sum of increments decayed over _AGE_S,
        # and the mark they were last fed from (see kept).
        self._kept: tuple[float, float, float, float, float] | None = None

    def measure(self, kind: str, dim: ReportedLimit, sent: BudgetMark, headroom: float) -> bool:
        """Measure the rate ``kind``'s bucket refills for us; ``True`` if the pace must change.

        Two snapshots ``(at, remaining, spent)`` with the bucket below ``_LOW`` of its
        limit at both: ``available = (remaining2 - remaining1 + spent2 - spent1) / span``,
        what refilled beyond our own charges (the limit's rate less what others spent),
        in the provider's units; times the share of our charges that stays charged here
        after settle refunds (:meth:`_keep`) it is in the gate's units. The span is the
        oldest snapshot of the last ``_AGE_S``, once at least ``_SPAN_S``, and only a
        bucket that fell by more than ``headroom x`` our charges over it is measured.
        A bucket at or above ``_LOW`` clears the measure: the pace goes back to the limit
        (and the bucket, drained again, is measured again).
        """
        if dim.remaining is None or dim.limit is None:
            return False
        kept = self._keep(sent) if kind == "tokens" else 1.0
        trail = self._trails.setdefault(kind, deque())
        if dim.remaining >= _LOW * dim.limit:
            self._first.setdefault(kind, sent.at)
            trail.clear()
            return self.available.pop(kind, None) is not None
        first = self._first.get(kind)
        if first is None or sent.at - first < _AGE_S:
            # Never seen near its limit: the remaining counts something else (Azure quotes
            # a 10 s window of RPM / 6 against the per-minute limit). Seen less than a
            # window ago: a sliding window gives nothing back until its first entries
            # expire, and measured sooner it would say "nothing left for us".
            return False
        spent = sent.tokens if kind == "tokens" else sent.requests
        trail.append((sent.at, dim.remaining, spent))
        while sent.at - trail[0][0] > _AGE_S:
            trail.popleft()
        at, remaining, before = trail[0]
        span = sent.at - at
        charged = spent - before
        if charged <= 0:
            # Nothing of ours charged to this budget (callers that state no tokens, or no
            # budget for the kind yet): a falling bucket could be us as well as others.
            return False
        if span < _SPAN_S or remaining - dim.remaining <= headroom * charged:
            # Only a bucket that fell by more than the headroom's share of what we
            # charged says the pace is too high: one holding level or rising leaves it
            # be (a sliding window gives back what we charged a window ago, so measured
            # while it holds level it reads our own past pace, and a gate held back by
            # the syncs would ratchet itself down: Azure cell 1.26x the oracle).
            return False
        per_minute = (dim.remaining - remaining + charged) * 60.0 / span
        # The gate paces what stays charged after settle refunds; the provider kept the
        # whole estimate (OpenAI reserves max_tokens): pace in the gate's units.
        per_minute *= kept
        floor = _MIN_SHARE * (dim.per_minute or dim.limit)
        per_minute = max(per_minute, floor)
        current = self.available.get(kind)
        if current is not None and same(current, per_minute):
            # A request the provider rejected was charged here and not there: rejections
            # inflate a measure. Measured in the provider's units instead of the gate's
            # (no kept/spent factor), the pace overdrew, rejections grew and the share
            # crept up with them (hidden TPM 100k, 40 % background: 60k to 100k/min,
            # 11 % of calls with a 429); in the gate's units they stay rare.
            return False
        self.available[kind] = per_minute
        return True

    def _keep(self, sent: BudgetMark) -> float:
        """The share of our token charges that stays charged after settle refunds: our
        refunds over our charges, each a sum of the marks' increments decayed over
        ``_AGE_S`` (fed by every measured report, wherever the bucket stands).

        A call's refund comes a generation after its charge. Taken over the measure's
        own span, which begins where the bucket fell below ``_LOW``, the refunds of the
        burst that drained it (charged before the span) were set against the span's
        charges alone: after a 60 s outage on tier-1 the 72 calls that spent the refilled
        bucket at once read a share of 0.6 where the calls keep 0.8, and the pace fell to
        123,000 of 200,000 TPM for a minute and a half (seeds 1-3, 1.028x the oracle;
        decayed, 1.012x). Decayed sums hold a constant rate's share exactly whatever the
        lag, and a burst's charge and its refunds seconds apart weigh about the same."""
        state = self._kept
        if state is None:
            self._kept = (sent.at, sent.tokens, sent.tokens_back, 0.0, 0.0)
            return 1.0
        at, tokens, back, s_tok, s_back = state
        if sent.at > at:
            decay = math.exp(-(sent.at - at) / _AGE_S)
            s_tok = s_tok * decay + (sent.tokens - tokens)
            s_back = s_back * decay + (sent.tokens_back - back)
            self._kept = (sent.at, sent.tokens, sent.tokens_back, s_tok, s_back)
        return max(0.0, 1.0 - s_back / s_tok) if s_tok > 0 else 1.0

    def refilled(self, dim: ReportedLimit | None, sent: BudgetMark) -> None:
        """A report after the lift (done or given up): one showing the bucket full again
        (``_LIFT_REFILL`` of its limit or more left) arms it once more. A lull (an
        outage, a gap in demand) refills the provider's bucket to a whole minute while
        the gate's budget holds a second: lent once only, the calls that waited out an
        outage went at the limit's pace into a full bucket (a project a tier above the
        published 200,000 TPM with a 60 s outage, seeds 1-3: 1.186x the oracle, which
        spends the bucket at once). The lift's own test still decides: two reports at
        least ``_LIFT_SPAN_S`` apart refilling at ``_LIFT_REFILL`` beyond our charges,
        so a bucket others spend from is not lent."""
        if not self.lifted or dim is None or dim.remaining is None or dim.limit is None:
            return
        if dim.remaining >= _LIFT_REFILL * dim.limit:
            self.lifted = False
            self._lift_mark = None
            self._lift_from = sent.tokens

    def lift(
        self,
        dim: ReportedLimit | None,
        sent: BudgetMark,
        headroom: float,
        paced_since: float = -math.inf,
    ) -> float | None:
        """The provider's level to lift the gate's token budget to (once), or ``None``.

        The first usable report is a snapshot ``(sent at, remaining, our charges)``; the
        first one at least ``_LIFT_SPAN_S`` later measures the refill beyond our own
        charges, ``(remaining2 - remaining1 + charged) / span``. At ``_LIFT_REFILL`` of
        the limit or more, it returns ``remaining`` less ``headroom`` of the limit
        (``Budgets.lower_since`` takes our charges since ``sent`` off it); below, nothing
        yet: each later report measures the span from the same snapshot again. A bucket
        full part of the span lost refill and read low (a fleet ramping up spends under
        the limit, and a full bucket shows only that: given up at the first reading,
        tier-1 with ``max_tokens`` 200, seeds 2-3, 1.154x the oracle, 1.015x measured
        on; the reporting cell's seed 2 1.028x -> 1.004x), while others spending beside
        us keep every span low (TOKEN_TUNING's background cells: no lift, no 429
        added). Given up once the gate has charged a whole limit (the first bucket is
        spent either way).

        ``paced_since``: when the gate's token pace last changed, on the clock of
        ``sent.at``. A snapshot taken before it is taken again: while the bucket is full,
        the measure reads our own charges, and a span that began at a lower pace reads
        low (a published 200,000 TPM raised by the headers to 400,000 one second in,
        seeds 1-5: read below the threshold, never lifted; 1.059x -> 1.010x the oracle).
        """
        if dim is None or dim.remaining is None or dim.limit is None or dim.drained:
            return None
        if sent.tokens - self._lift_from >= dim.limit:
            self.lifted = True
            return None
        if self._lift_mark is None or self._lift_mark[0] < paced_since:
            self._lift_mark = (sent.at, dim.remaining, sent.tokens)
            return None
        at, left, spent = self._lift_mark
        span = sent.at - at
        if span < _LIFT_SPAN_S:
            return None
        refill = (dim.remaining - left + sent.tokens - spent) * 60.0 / span
        if refill < _LIFT_REFILL * (dim.per_minute or dim.limit):
            return None
        self.lifted = True
        return dim.remaining - headroom * dim.limit
