"""Sends held to a per-minute request limit's estimate (:mod:`.window`, :mod:`.threshold`).

One :class:`RequestLimit` per adaptive limit: it counts sends (:class:`.SentLog`), gives
each answer's count in the window to the threshold the answers contradict least
(:class:`.CountLimit`), lets one send at a time go above a threshold not yet confirmed
(the check), and otherwise lets an attempt go only while the provider's window, as this
client counts it, has room under the estimate. Every method runs under the caller's
lock; nothing here reads a clock or touches the gate.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, final

from .slope import WINDOW_S as SLOPE_WINDOW_S
from .threshold import CONFIRM, CountLimit
from .window import SentLog, finite_estimate, same_count

if TYPE_CHECKING:
    from .slope import SlopeLimit

__all__ = ["WINDOW_S", "RequestLimit"]

#: A per-minute limit's window: OpenAI, Anthropic and Azure count requests per minute.
WINDOW_S = 60.0
#: The estimate grows back by one request per this many seconds; each regrowth turned
#: away at the count it grew from (within the count's error: the limit held) doubles the
#: period, up to ``_MAX_GROWTH_S``; a rejection at another count starts again. The token
#: limit's rule (:mod:`.tokens`), from the concurrency hold's 30 s -> 10 min doubling
#: (DESIGN.md "upward probes: the gap doubling after each failure"). At one request a
#: minute for good, each minute's regrowth was a 429 (hidden RPM 600, morning-peak seeds
#: 2, 4 and 5: at about 114, 174 and 234 s).
_GROWTH_S = 60.0
_MAX_GROWTH_S = 600.0
#: A threshold's first check goes this long after it was set: sent at once, it
#: met the state its 429s met (the slots full, or a slope window's end) and was turned
#: away, and the next waited out a slope window (the outage scenario with plain 429s,
#: seed 9: sends above 166 a minute held 10 s, 1.18x the oracle). A second later a call
#: has left and a new slope window may have begun.
_FIRST_CHECK_S = 1.0
#: While a check of a threshold is out, a send held by it asks again this often: the
#: check's pass may lift it, and a send told to wait for the window to free (up to a
#: minute) slept through that (morning peak, plain 429s, seed 20: lifted at 23.7 s, the
#: held sends slept until 60 s, 1.21x the oracle). Half a second: a check is answered
#: within a round trip once its status arrives (``SendPath.accepted``).
_ASK_AGAIN_S = 0.5


@final
class RequestLimit:
    """Sends and the request limit's estimate. The estimate has no ceiling of its own:
    the gate's rate (the user's, published or learned) already bounds what is sent."""

    __slots__ = (
        "_check_at",
        "_checking",
        "_growth_s",
        "_limit",
        "_log",
        "_plain",
        "_told",
        "_turned_check_at",
        "slope",
    )

    def __init__(self) -> None:
        self._log = SentLog(WINDOW_S)
        self._limit: CountLimit | None = None  # made at the first rejection
        # The threshold the 429s no count explained fit (see unexplained), once one came.
        self._plain: CountLimit | None = None
        self._told = math.nan  # the send of the last 429 the plain threshold took for it
        self._growth_s = _GROWTH_S  # the regrowth's period (see _GROWTH_S)
        # When the last check went (a send above the threshold, CountLimit.support), and
        # whether its answer is still to come.
        self._check_at = math.nan
        self._checking = False
        # The send time of the last check turned away before it could test the
        # threshold (see _next_check).
        self._turned_check_at = -math.inf
        # The slope estimate beside it (its owner's, :class:`.Sends`): its window is how
        # long a check must wait to test a threshold (see slope_window_s).
        self.slope: SlopeLimit | None = None

    @property
    def slope_window_s(self) -> float:
        """A threshold is tested by a check sent at least this long after it was set,
        once the window (a slope rule's, or a sub-minute one) that may have turned its
        429s away is over: the slope estimate's window (10 s until edges say more)."""
        slope = self.slope
        return SLOPE_WINDOW_S if slope is None else slope.window_s

    @property
    def log(self) -> SentLog:
        """Every send, and those turned away (shared with the slope estimate)."""
        return self._log

    @property
    def limit(self) -> CountLimit | None:
        """The estimate, once a per-minute rejection made one."""
        return self._limit

    @property
    def listening(self) -> bool:
        """Whether a pass teaches anything: a rejection came (worded, or unexplained)."""
        return self._limit is not None or self._plain is not None

    @property
    def threshold(self) -> float | None:
        """The threshold the request limit's answers fit, or ``None``: none held."""
        limit = self._limit
        return None if limit is None or limit.high == math.inf else limit.high

    def count(self, at: float) -> int:
        """Ours in the provider's window at a send at ``at`` that is still counted there,
        itself left out: what :class:`.CountLimit` hears of an answer to it."""
        return max(0, self._log.held(at) - 1)

    def estimate(self, now: float) -> float | None:
        """The limit sends are held to now, or ``None``."""
        return finite_estimate(self._limit, now)

    def wait(self, at: float, cost: float = 1.0, caller: object | None = None) -> float:
        """Seconds until the estimated window has room for a send at ``at`` (``0.0``: now;
        nothing is counted, see :meth:`sent`; ``cost``, its tokens, plays no part).

        Before a first rejection every send goes. After it, a send goes only while the
        window holds fewer accepted sends than the estimate: a sliding window frees its
        slots at the pace they were taken (:meth:`.SentLog.free_at`), which a rate cannot
        mimic after a ramp. Measured on morning-peak with a hidden RPM of 600 (seeds 1-3):
        paced to the estimate as a rate, 1.047x the oracle; held at the gate's admission
        instead of here, a rate's burst overshot the window (5 % of calls with a 429).
        """
        limit = self._limit
        if limit is None or limit.high == math.inf:
            return 0.0
        free = self._log.free_at(at, limit.estimate(at))
        if free is None:
            return 0.0  # room
        check = self._next_check(limit, at)
        if check <= at:
            return 0.0  # the check of a threshold goes (CountLimit.support)
        return min(free, check) - at

    def _next_check(self, limit: CountLimit, at: float) -> float:
        """When a send above the threshold may go, as its check (``inf``: none while it
        holds): while it is not yet confirmed or not yet tested, and no check is out (one
        unanswered for a window is taken for lost). A check turned away before one slope
        window had passed since the threshold was set may have met the same full window
        or slots as its 429s did: the next goes once that window is over
        (:mod:`.threshold`)."""
        if (limit.support >= CONFIRM and limit.tested) or limit.agrees:
            return math.inf
        if self._checking and at - self._check_at <= WINDOW_S:
            # Its answer may lift the threshold: ask again soon, not when the window
            # frees (a sleeper is not woken).
            return min(self._check_at + WINDOW_S, at + _ASK_AGAIN_S)
        if not limit.tested:
            if self._turned_check_at >= limit.held_since:
                return max(at, limit.held_since + self.slope_window_s)
            return max(at, limit.held_since + _FIRST_CHECK_S)
        return at

    def sent(self, at: float, cost: float = 1.0, caller: object | None = None) -> None:
        """The send :meth:`wait` let go went out (the check, if it found the window full)."""
        limit = self._limit
        if (
            limit is not None
            and limit.high != math.inf
            and self._log.free_at(at, limit.estimate(at)) is not None
        ):
            self._checking, self._check_at = True, at
        self._log.sent(at)

    def passed(self, at: float) -> None:
        """The attempt sent at ``at`` succeeded (no work before a first rejection)."""
        if self._limit is None and self._plain is None:
            return
        # Counted as a rejection is (the sends of its own instant in, itself out): a pass
        # counted without them (SentLog.accepted) never contradicted the two random 429s
        # of a wave of sends, counted with them, and the hold stalled the morning peak's
        # ramp at the wave's top (5 % random 429s, seed 1).
        count = self.count(at)
        if self._plain is not None:
            self._plain.passed(at, count)
        if self._limit is not None:
            self._limit.passed(at, count)
            if at == self._check_at:
                self._checking = False  # answered: the next send may check again

    def unexplained(self, at: float, now: float) -> bool:
        """A 429 that said nothing of what it counted (no code, no wording, no headers),
        for the attempt sent at ``at``, which no count explained (:func:`.attribute`'s
        ``"burst"``): whether it is the request limit's after all, because the 429s so
        far that no count explained fit a threshold of the request count (as
        :class:`.CountLimit` fits worded ones), and this one is at or above it.

        Why. Attributed by how near each count is to its estimate, a plain 429 is the
        request limit's only near the published rate; behind a published 1,200 a minute,
        a real 600 turned sends away at 597 of ours in the minute, again and again, each
        taken for the slope rule's, which slowed everything and learned nothing (the
        morning peak with plain 429s, seeds 1-5: 1.058x the oracle, 2.02x worst, 7.4 %
        of calls with a 429). A slope rule's 429s come at a count the later passes go
        past; a request limit's repeat at a count nothing passes above.
        Call before the attempt is marked turned away (its send is still counted)."""
        limit = self._limit
        plain: CountLimit | None
        if limit is not None and not limit.stated:
            # Adopted: its threshold goes on from every answer it fitted. A fresh one
            # beside it, knowing none of the passes above its count a minute before,
            # took a slope window's end for the request limit, which held nothing: a
            # storm of 429s every one taken for the request limit's.
            plain = limit
        else:
            plain = self._plain
            if plain is None:
                plain = self._plain = CountLimit(WINDOW_S, stated=False)
        count = self.count(at)
        plain.rejected(at, count, now, stated=False)
        if count > 0 and not plain.noise and plain.high != math.inf:
            self._told = at
            return True
        return False

    def turned_away(self, at: float, *, refused: bool = False) -> None:
        """The attempt sent at ``at`` was throttled otherwise: by a rule (its send filled
        no window) or, ``refused``, by the slots (it may have, :meth:`.SentLog.refused`).
        The check's send turned away so says nothing of the request limit: the next send
        checks again (at the morning peak's 32 slots, a check refused by the slots left a
        threshold two random 429s set standing for a minute)."""
        if at == self._check_at:
            self._checking = False
        if refused:
            self._log.refused(at)
        else:
            self._log.rejected(at)

    def rejected(
        self,
        at: float,
        now: float,
        caller: object | None = None,
        paced: float | None = None,
        *,
        stated: bool = True,
        quoted: float | None = None,
    ) -> bool:
        """A requests-per-minute 429 for ``caller``'s attempt sent at ``at``, with sends
        ``paced`` at that many a minute (the gate's rate; ``None``: none); whether the
        estimate went down. ``stated=False``: the 429 did not say what it counted (its
        count did: :mod:`.threshold` on inferred thresholds). ``quoted``: the limit the
        429 quoted, a minute's, with its window full (:attr:`.CountLimit.agrees`)."""
        log = self._log
        log.rejected(at)
        check = at == self._check_at
        if check:
            self._checking = False
        count = log.held(at)  # the rejected send itself is turned away: not in it
        if log.held(at, refused=False) <= 0:
            # Only sends the slots refused, which may have filled no window: perhaps none
            # of ours, which teaches nothing (WindowLimit.rejected). Taken for a limit of
            # one, a concurrency 429 then a requests-per-minute 429 held the next send a
            # minute (tests/test_policy_throttles.py, on a real clock).
            count = 0
        limit, plain = self._limit, self._plain
        # unexplained() took this 429 for ours, and its threshold heard it already.
        told = at == self._told and (limit is None or not limit.stated)
        if limit is None and plain is not None and told:
            # The first 429 the plain 429s' threshold took for this limit's (unexplained):
            # that threshold is this limit's from now on, with every answer it fitted.
            limit = self._limit = plain
            self._plain = None
        elif limit is None:
            limit = self._limit = CountLimit(WINDOW_S, stated=stated)
        quoting = quoted is not None and same_count(count, quoted)
        if quoting:
            # The provider's number, at the count ours found: regrown only at the slowest
            # period (a raised limit would be quoted by its next 429, or its headers).
            limit.quoted = quoted
            self._growth_s = _MAX_GROWTH_S
        # A regrowth: the hold let one more through than the count it grew from.
        estimate = limit.estimate(now)
        grown = estimate != math.inf and math.floor(estimate) > limit.high
        high = limit.high
        if grown and same_count(count, high):
            self._growth_s = min(2 * self._growth_s, _MAX_GROWTH_S)
        elif count > 0 and not same_count(count, high) and not (quoting or limit.agrees):
            self._growth_s = _GROWTH_S
        limit.growth = WINDOW_S / self._growth_s
        limit.paced = math.inf if paced is None else paced
        # fitted already (told): held from now on
        lowered = True if told else limit.rejected(at, count, now, stated=stated)
        if check and count > 0 and not limit.tested:
            # A send above the threshold, on its own, turned away: once the slope window
            # its 429s may have met is over, it tests the threshold.
            if at >= limit.held_since + self.slope_window_s:
                limit.tested = True
            else:
                self._turned_check_at = at
        return lowered
