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
from typing import final

from .threshold import CONFIRM, CountLimit
from .window import SentLog, finite_estimate, same_count

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


@final
class RequestLimit:
    """Sends and the request limit's estimate. The estimate has no ceiling of its own:
    the gate's rate (the user's, published or learned) already bounds what is sent."""

    __slots__ = ("_check_at", "_checking", "_growth_s", "_limit", "_log", "_plain", "_told")

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
        if free is None or self._check_due(limit, at):
            return 0.0  # room, or the check of a threshold goes (CountLimit.support)
        return free - at

    def _check_due(self, limit: CountLimit, at: float) -> bool:
        """Whether a send above the threshold goes now: it is not yet confirmed and no
        check is out (one unanswered for a window is taken for lost)."""
        if limit.support >= CONFIRM:
            return False
        return not self._checking or at - self._check_at > WINDOW_S

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
        plain = self._plain
        if plain is None:
            plain = self._plain = CountLimit(WINDOW_S)
        count = self.count(at)
        plain.rejected(at, count, now)
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
    ) -> bool:
        """A requests-per-minute 429 for ``caller``'s attempt sent at ``at``, with sends
        ``paced`` at that many a minute (the gate's rate; ``None``: none); whether the
        estimate went down."""
        log = self._log
        log.rejected(at)
        if at == self._check_at:
            self._checking = False
        count = log.held(at)  # the rejected send itself is turned away: not in it
        if log.held(at, refused=False) <= 0:
            # Only sends the slots refused, which may have filled no window: perhaps none
            # of ours, which teaches nothing (WindowLimit.rejected). Taken for a limit of
            # one, a concurrency 429 then a requests-per-minute 429 held the next send a
            # minute (tests/test_policy_throttles.py, on a real clock).
            count = 0
        limit, plain, adopted = self._limit, self._plain, False
        if limit is None and plain is not None and at == self._told:
            # The first 429 the plain 429s' threshold took for this limit's (unexplained):
            # that threshold is this limit's from now on, with every answer it fitted.
            limit = self._limit = plain
            self._plain, adopted = None, True
        elif limit is None:
            limit = self._limit = CountLimit(WINDOW_S)
        # A regrowth: the hold let one more through than the count it grew from.
        estimate = limit.estimate(now)
        grown = estimate != math.inf and math.floor(estimate) > limit.high
        high = limit.high
        if grown and same_count(count, high):
            self._growth_s = min(2 * self._growth_s, _MAX_GROWTH_S)
        elif count > 0 and not same_count(count, high):
            self._growth_s = _GROWTH_S
        limit.growth = WINDOW_S / self._growth_s
        limit.paced = math.inf if paced is None else paced
        if adopted:
            return True  # fitted already: held from now on
        return limit.rejected(at, count, now)
