"""A slope limit (how fast the request rate may grow), inferred from the client's own counts.

Why. A burst-rate 429 (``limit_burst_rate``) says the provider's counter for its current
window was full: that window may hold at most ``max(floor, growth x previous window)``
requests. The client knows its own sends, so once it knows where the full window ended (the
first send that got through after the rejections: the hold's probe) it can read both counts
off its log: the full window's count is the allowance, and that over the previous window's
is the growth. The reflex this replaces paced the *rate* at 0.7x what was measured over the
last 10 s, growing 2x per 10 s whatever the provider allowed, and cut the concurrency limit
when it had nothing measured (issue 30).

What.

* Edges. An edge lies in ``(last send turned away, first send through]``, and in no
  run of sends that were all turned away (a window with room lets the next send through:
  while the gate holds everyone, that send is the probe). Edges fall on
  ``phase + k x window``; neither is published. Each candidate window (:data:`WINDOWS`)
  keeps the phases (in :data:`BINS` bins) that every edge and every such run allow: a
  wrong window soon allows none, and a window shorter than a run allows no phase at all.
  The window used is :data:`WINDOW_S` while it fits, else the shortest longer one that
  fits, else the longest shorter one. When none fits every edge, the latest edges are
  replayed against the list and the whole-second windows between the last two
  (:func:`.refit`). Without the runs a 30 s window's edges (30, 60,
  90 s) fit 10 s for ever: it was paced as one, its growth never learned, and each hold
  probed a 10 s edge that was not one (morning peak, burst window 30 s: 33 calls with a
  429, 23 of them in its first window).
* Growth and floor (:meth:`SlopeLimit.edge`), read at every phase still allowed: the least
  ratio any remembered full window shows, from windows whose every allowed phase had a busy
  window before; where a phase had a quiet one before, the full window may have held the
  floor, and the floor is the least such count. No growth is taken while a longer window
  that fits read a floor: the ramp's start, read across it, looks like growth.
* Holding. :meth:`SlopeLimit.wait` holds a send until the current window, with it, holds
  no more than ``max(floor, growth x the window before)``: the provider's own windows once
  the edges seen pin their phase (to a tenth of a window; to half of one in a recovery,
  two windows after a quiet stretch that followed sends of ours), each count erring
  toward holding back (:mod:`.slope_allowance`); else trailing windows (while the rate
  grows, the window before a trailing one holds no more than the aligned one's, so the
  bound errs low, never high; but it anchors on the first send after a quiet stretch, and
  after an outage that is the breaker's late probe). Before a growth is known, only the
  floor holds, and only after a quiet stretch: the provider's window after a quiet one
  may hold the floor whatever the growth. :meth:`SlopeLimit.hold` says how long a full
  window holds everyone: to the first probe the window used or a longer one that fits
  asks for (the run turned away so far counts): its latest phase once a window's phases
  are pinned, else a tenth of that window on, so that edges are found that closely.
* Noise. A 429 while the current window is well inside the allowance (:meth:`inside`) did
  not come from a full window of ours: a shared pool's, until it repeats.

Measured on ``bench_storm.py`` (seeds 1-3, see the changelog for the table). Not thread-
safe, no clock of its own: the caller passes times and holds a lock.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right, insort
from typing import TYPE_CHECKING, final

from .slope_allowance import allowance
from .slope_fit import WINDOWS, Edge, WindowFit, phase_ends, refit, span

if TYPE_CHECKING:
    from collections.abc import Iterable

    from .window import SentLog

__all__ = ["WINDOWS", "WINDOW_S", "SlopeLimit"]

#: The window assumed while it fits the edges seen: 10 s, ``Rate.window_s``'s (the slope
#: window providers use is not published).
WINDOW_S = 10.0
#: A rejection with the trailing window below this share of the allowance is noise until
#: it repeats within a window.
_INSIDE = 0.9

#: Windows in a row with a send held and no burst 429 before a learned rule is forgotten
#: (:meth:`SlopeLimit._held_too_long`).
_PATIENCE = 6

#: Edges remembered for a refit (:func:`.refit`): a few windows' worth.
_EDGES = 4

#: Burst rejections remembered (the oldest half dropped past this): runs are asked about
#: within two windows of now, and a provider turns away far fewer in that span.
_TURNED_KEPT = 4096


def _precision(delay: float) -> float:
    """The step ``delay`` was stated in: 1 s, 0.1 s, 0.01 s or 1 ms (else 0)."""
    for digits in range(4):
        if round(delay, digits) == delay:
            return 10.0**-digits
    return 0.0


@final
class SlopeLimit:
    """The window, growth and floor learned from full windows; holds sends to them."""

    __slots__ = (
        "_edges",
        "_fits",
        "_held_last",
        "_held_since",
        "_log",
        "_noise_edge_at",
        "_phases",
        "_said",
        "_span",
        "_suspect_edge",
        "_turned",
        "floor",
        "growth",
        "window_s",
    )

    def __init__(self, log: SentLog) -> None:
        self._log = log  # the sends, shared with the request estimate
        self.window_s = WINDOW_S
        self.growth: float | None = None  # the allowed growth per window, once learned
        self.floor = 0  # the least a full window after a quiet one held (0: not seen)
        self._fits = {window: WindowFit(window) for window in WINDOWS}
        # The latest edges, (after, at, the run turned away before after or None).
        self._edges: list[Edge] = []
        self._span: tuple[float, float] | None = None  # the edges' span (slope_allowance)
        self._phases: tuple[float, ...] = ()  # ... and the phases in it (slope_allowance)
        # Send times a burst 429 turned away, sorted (a send refused by another limit, or
        # by the slots, says nothing of this window's edges), within the log's horizon.
        self._turned: list[float] = []
        self._noise_edge_at = -math.inf  # the last edge ignored as noise (see edge)
        self._said: tuple[float, float] | None = None  # see said_full
        # An edge against the window used, until a second says the same (see edge).
        self._suspect_edge: Edge | None = None
        # The stretch of windows each with a send held (see _held_too_long).
        self._held_since = -math.inf
        self._held_last = -math.inf

    def turned(self, at: float) -> None:
        """A burst 429 turned away the send made at ``at``."""
        turned = self._turned
        insort(turned, at)
        if len(turned) > _TURNED_KEPT:
            del turned[: len(turned) // 2]

    def said_full(self, at: float, retry_after: float) -> None:
        """A burst 429 for the send made at ``at`` said ``Retry-After: retry_after``: the
        provider's window stays full until then, so none of its edges lies in between.
        Sends held through it leave no run turned away to say so, and a 30 s window (with
        Retry-After on) kept fitting 10 s: the fleet went at 10 s's edge at 40 s, and 26
        sends were turned away at once (seed 1; 1.25 % of calls with a 429). A delay is
        a count rounded up at its own precision: a whole number of seconds (RFC 9110's
        delay-seconds) by up to a second, milliseconds (``retry-after-ms``) by up to one.
        Taken as exact, a 10 s window's edge at 20.0 s, said as 2.685 s from 17.31516 s,
        was refuted by 0.16 ms, and every window fit was restarted (Retry-After on, every
        seed)."""
        until = at + retry_after - _precision(retry_after)
        if until > at:
            self._said = (at, until)

    @property
    def last_turned(self) -> float:
        """The latest send a burst 429 turned away (``-inf``: none)."""
        turned = self._turned
        return turned[-1] if turned else -math.inf

    def turned_before(self, at: float) -> float:
        """The latest send before ``at`` a burst 429 turned away (``-inf``: none)."""
        turned = self._turned
        index = bisect_left(turned, at)
        return turned[index - 1] if index else -math.inf

    @property
    def known(self) -> bool:
        """Whether a growth was learned (sends are held to it)."""
        return self.growth is not None

    def edge(self, after: float, at: float) -> bool:
        """The provider's full window ended in ``(after, at]`` (the last send turned away
        went at ``after``, the first to get through after it at ``at``): learn from the
        counts; whether the estimate changed."""
        before = (self.window_s, self.growth, self.floor)
        repeated = False
        if self.growth is not None and self.inside(after) and not self._explained(after, at):
            # The last send turned away went well inside the learned allowance: no full
            # window of ours turned it away, but a shared pool's noise, confirmed by a
            # second 429. Its "edge" and its counts (a steady rate's, about 1.05) would
            # teach a growth the provider never set, and the aligned windows would hold
            # the fleet to it (shared pool 3 %: 1.014x the oracle; ignored, 1.009x). A
            # second within two windows is taken: the provider may have lowered its rule.
            repeated = at - self._noise_edge_at <= 2 * self.window_s
            self._noise_edge_at = at
            if not repeated:
                return False
        run = self._run(after)
        said = self._said
        if said is not None and said[0] <= after and said[1] <= at:
            # The provider's word joins the run: no edge from its 429's send until then.
            run = said if run is None else (min(run[0], said[0]), max(run[1], said[1]))
        used = self._fits.get(self.window_s)
        if (
            not repeated
            and self.growth is not None
            and used is not None
            and len(used.episodes) >= 2
            and not used.allows(after, at, None)
            and not self._explained(after, at)
        ):
            # Outside every edge of a window two full ones or more fit, whose growth is
            # learned: noise (a shared pool's 429, then its check's probe turned away too)
            # until the next edge within two windows says the same (one inside the
            # allowance repeated already; a run of ours turned away across an edge the
            # window predicts is taken at once). Taken at once, the peak x10 with a 5 %
            # pool read an edge in (21.7, 26.8] as an 8 s window 6 s after its 10 s
            # window's second edge, and the herd the new window let go was turned away.
            suspect, self._suspect_edge = self._suspect_edge, (after, at, run)
            if suspect is None or at - suspect[1] > 2 * self.window_s:
                return False
            self._suspect_edge = None
            self._add(*suspect)
        else:
            self._suspect_edge = None
        # A lone 429 (the send before it got through) that ends a window once a growth is
        # known says where the edge is, not what the window held: a shared pool's 429 at
        # 90-100 % of the allowance holds the fleet to the edge too, and read as full the
        # window showed a lower growth each time (the least ratio is kept): the peak x10
        # with a 5 % pool read 2.0, 1.87, 1.69, ... 1.00 in ten windows (3.1x the oracle).
        # A full window turns away every send after it filled: a run.
        self._add(after, at, run, counts=repeated or self.growth is None or run is not None)
        fits = self._fits.values()
        if not any(fit.fits for fit in fits):  # no window fits every edge
            self._fits = refit(self._log, self._edges)
            fits = self._fits.values()
        chosen = self._choose(fit for fit in fits if fit.fits)
        if chosen is None:  # not reached: every bin meets an interval of a window or more
            return False
        growth, floor = chosen.estimate(self.floor)
        if any(fit.fits and fit.window_s > chosen.window_s and fit.quiet() for fit in fits):
            # A longer window that fits as well read a full window after a quiet one: the
            # growth of the one used may be the ramp's start read across that window. A
            # 15 s window's first edge, read as 10 s, showed a growth of 1.23 where its
            # window had held the floor, and the fleet crawled at it for a minute (burst
            # window 15 s, seed 5: 1.25x the oracle).
            growth = None
        if chosen.window_s != self.window_s:
            self.window_s = chosen.window_s
            self.growth = growth
        elif growth is not None:
            self.growth = growth
        if floor is not None:
            self.floor = floor
        used = self._fits[self.window_s]
        self._span, self._phases = span(used), phase_ends(used)
        return (self.window_s, self.growth, self.floor) != before

    def _explained(self, after: float, at: float) -> bool:
        """Whether another window that fits as many full windows as the one used, and is
        no divisor or multiple of it, puts an edge in ``(after, at]``: then it is no noise
        but the one used is wrong. A 45 s window fit as well as 44 s (the whole seconds
        between two edges read 5 s apart), and an edge at 180 s the 44 s one put none at
        was taken for noise: the fleet went at 44 s edges into the provider's full
        windows (seed 5: 1.8 % of calls with a 429). A divisor puts an edge wherever the
        window does and more: a shared pool's 429 found a 5 s one's (see :meth:`edge`)."""
        used = self._fits.get(self.window_s)  # as in edge: the one used is one that fits
        window, read = self.window_s, 0 if used is None else len(used.episodes)
        return any(
            fit.fits
            and max(window, fit.window_s) % min(window, fit.window_s) > 0
            and len(fit.episodes) >= read
            and fit.allows(after, at, None)
            for fit in self._fits.values()
        )

    def _add(
        self, after: float, at: float, run: tuple[float, float] | None, *, counts: bool = True
    ) -> None:
        """Remember the edge in ``(after, at]`` and read it into every window's fit (its
        phases only, not ``counts``)."""
        edges = self._edges
        edges.append((after, at, run))
        del edges[:-_EDGES]
        for fit in self._fits.values():
            if counts:
                fit.add(self._log, after, at, run)
            else:
                fit.constrain(after, at, run)

    def repeated(self, at: float | None) -> bool:
        """Whether the send at ``at``, turned away by a burst 429, ends a run of two or
        more of ours all turned away: the one sent before it was too. A shared pool's
        random 429s come alone (the sends between them get through, or are still out); a
        full window turns away every send after it (``None``: unknown, no run)."""
        if at is None:
            return False
        since = self._log.run_since(at, self._turned)
        if since is None:
            return False
        turned = self._turned
        return since < at or bisect_right(turned, at) - bisect_left(turned, at) >= 2

    def crossed(self, after: float, at: float) -> bool:
        """Whether a check's probe sent at ``at`` that got through, after the send at
        ``after`` was turned away, crossed a window's edge: only while the growth is not
        known (then a check is how a full window is found), after a run of two or more of
        ours turned away (:meth:`repeated`; a shared pool's 429s come alone), and where a
        window that fits the edges seen puts one (a shared pool's runs of two fall
        anywhere: at 8 % of sends, one read as an edge 1 s after the first made every
        window refit, and the growth read off the wrong windows held the fleet to 1.10,
        seed 4: 1.25x the oracle)."""
        if self.growth is not None or not self.repeated(after):
            return False
        run = self._run(after)
        return any(fit.episodes and fit.allows(after, at, run) for fit in self._fits.values())

    def mostly_turned(self, lo: float, hi: float) -> bool:
        """Whether burst 429s turned away two or more of our sends in ``(lo, hi)``, and at
        least half of them (those still out count as not turned away)."""
        turned = self._turned
        count = bisect_left(turned, hi) - bisect_right(turned, lo)
        return count >= 2 and 2 * count >= self._log.sends(lo, hi)

    def _run(self, until: float) -> tuple[float, float] | None:
        """``(since, until]``: the run of our sends up to ``until`` that were all turned
        away (``None``: the send at ``until`` was not)."""
        since = self._log.run_since(until, self._turned)
        return None if since is None or since >= until else (since, until)

    @staticmethod
    def _choose(fitting: Iterable[WindowFit]) -> WindowFit | None:
        """The window to use of those that fit: :data:`WINDOW_S`, else the shortest
        longer one, else the longest shorter one (a longer window held to a full one's
        edge holds a window too long; a divisor of the true one fits only while no run
        turned away outlasted it, and overstates the growth per window).

        Of whole-second windows that fit two full windows or more (refit's,
        :func:`.refit`), the longest short of twice the shortest (a multiple of it is the
        divisor case). Neighbours fit alike until an edge tells them apart, and the
        shorter's edges come first: held to 44 s for the provider's 45, the fleet's herd
        went at 176 s into a window full until 180 s (seed 5: 50 calls with a 429); held
        a second too long, a window loses a second of its sends."""
        longer: WindowFit | None = None
        shorter: WindowFit | None = None
        unlisted: list[WindowFit] = []
        for fit in fitting:
            window = fit.window_s
            if window == WINDOW_S:
                return fit
            if window > WINDOW_S and (longer is None or window < longer.window_s):
                longer = fit
            if window < WINDOW_S and (shorter is None or window > shorter.window_s):
                shorter = fit
            if window not in WINDOWS and len(fit.episodes) >= 2:
                unlisted.append(fit)
        if longer is not None and longer in unlisted:
            shortest = longer.window_s
            longer = max(
                (fit for fit in unlisted if shortest <= fit.window_s < 2 * shortest),
                key=lambda fit: fit.window_s,
            )
        return longer or shorter

    def predicted(self, now: float) -> float | None:
        """Seconds until the latest edge after ``now`` the phases seen allow, when they pin
        it to within a tenth of a window; ``None`` when they do not (yet)."""
        fit = self._fits.get(self.window_s)
        if fit is None:  # not reached: the window used is one that fits
            return None
        edges = [edge for edge in fit.edges(now) if edge is not None]
        if edges and max(edges) - min(edges) <= self.window_s / 10:
            return max(edges) - now
        return None

    def hold(self, now: float, turned: float | None = None) -> float:
        """Seconds to hold sends after a full window turned a send away at ``now`` (the
        latest turned away went at ``turned``): until the first probe
        (:meth:`WindowFit.next_probe`) any window that fits asks for (a shorter one than
        the window used once an edge was read at it), the run turned away so far refuting
        phases; a tenth of a window when none fits. The
        longer ones are probed too: held to the edge of the window used, a probe that got
        through there told nothing of an edge before it, and a 15 s window taken for 10 s
        kept a growth read off the wrong windows (morning peak, burst window 15 s, seed 5:
        1.16x the oracle); probed at 15 s's edge too, the window used lost its phase at
        once. So are the shorter ones: a 5 s window's first edge fits 10 s as well, and
        held to 10 s's edge (capped at ``pause_s``) the peak x10 spent the provider's
        next window idle (seed 3: 1.049x the oracle; 1.009x). Not before an edge was read
        at them: every window fits then, and a tenth of 5 s would double the probes."""
        run = None if turned is None else self._run(turned)
        best = math.inf
        for window, fit in self._fits.items():
            if not fit.fits or (window < self.window_s and not fit.episodes):
                continue
            edges = [fit.edge_after(i, now) for i in fit.allowed(run)]
            if edges:
                best = min(best, fit.next_probe(edges, now))
        return self.window_s / 10 if best == math.inf else best - now

    def _allowance(self, at: float) -> tuple[int, float, float | None]:
        """The current window's count at ``at``, what the learned slope allows it and when
        the next window surely begins (:func:`.slope_allowance.allowance`)."""
        return allowance(
            self._log,
            at,
            window=self.window_s,
            growth=self.growth,
            floor=self.floor,
            span=self._span,
            phases=self._phases,
        )

    def _held_too_long(self, at: float) -> bool:
        """Whether the rule has held sends in every window for :data:`_PATIENCE` windows
        with no burst 429 meanwhile: then it is forgotten (no growth, no floor) and sends
        go until the provider turns one away, which teaches the rule again.

        A rule learned wrong can hold for ever: a shared pool's 429s taught the peak x10
        a 5 s window, growth 1.12 and floor 3 (the provider's: 10 s, 2 and 60), and held
        to ``max(3, 1.12 x the window before)`` its sends never grew past 40 a minute
        (seed 3: 2,080 calls unfinished after an hour). A rule the provider keeps lets
        the sends it holds grow ``growth ** 6`` in six windows (11x at 1.5): a ramp
        held that long with no 429 is nearly over, or its rule is not the provider's."""
        window = self.window_s
        if at - self._held_last > 2 * window or (
            math.floor(at / window) > math.floor(self._held_last / window) + 1
        ):
            self._held_since = at  # a window (of ours) with nothing held: a new stretch
        self._held_last = at
        if at - self._held_since < _PATIENCE * window or at - self.last_turned < (
            _PATIENCE * window
        ):
            return False
        self.growth = None
        self.floor = 0
        self._held_since = at
        return True

    def inside(self, at: float) -> bool:
        """Whether a send at ``at`` went with the current window well inside the learned
        allowance (below :data:`_INSIDE` of it): a 429 for it did not come from a full
        window of ours."""
        if self.growth is None:
            return False
        current, allowed, _ = self._allowance(at)
        return current + 1 <= _INSIDE * allowed

    def wait(self, at: float, cost: float = 1.0, caller: object | None = None) -> float:
        """Seconds until one more send at ``at`` keeps the current window within the
        learned slope (:meth:`_allowance`): ``0.0`` to send now (a request counts one,
        whatever its ``cost``)."""
        if self.growth is None and not self.floor:
            return 0.0
        current, allowed, edge = self._allowance(at + 1e-9)
        if current + 1 <= allowed:
            return 0.0
        if self._held_too_long(at):
            return 0.0
        if edge is not None:  # ask again once the next window has surely begun
            return max(edge - at, 1e-3)
        # The window changes when its oldest send leaves it (and joins the one before):
        # ask again then.
        oldest = self._log.first_after(at - self.window_s)
        if oldest is None:
            return 0.0
        return max(oldest + self.window_s - at, 1e-3)
