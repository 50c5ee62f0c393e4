"""The candidate windows of a slope rule, and the phases the evidence leaves each.

Why. A provider's slope window and where its edges fall (its phase) are not published;
the client sees edges (a full window ended between the last send turned away and the
first through) and runs (sends a full window turned away one after another: no edge
between them). Each candidate window keeps the phases every edge and run allow, and reads
the full windows' counts at them: what :class:`~anygate._limits.slope.SlopeLimit` learns
its window, growth and floor from, and where it probes.

What. :class:`WindowFit`, one candidate window (:data:`WINDOWS`) with its phase bins
(:data:`BINS`) and remembered full windows; :func:`phase_ends` and :func:`span`, the phases
one allows and their stretch. Not thread-safe, no clock of its own.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, final

if TYPE_CHECKING:
    from .window import SentLog

__all__ = [
    "BINS",
    "MIN_PREVIOUS",
    "WINDOWS",
    "Edge",
    "WindowFit",
    "between",
    "phase_ends",
    "refit",
    "span",
]

#: The windows considered (seconds): round lengths a provider states a burst window in.
WINDOWS = (5.0, 10.0, 15.0, 20.0, 30.0, 60.0)

#: A growth read off counts this small says little: the window before must have held at
#: least this many of ours, and the full one this many more, for their ratio to count (a
#: shared pool's confirmed 429 at a steady rate read 128/127 and held the fleet to 1.016x).
MIN_PREVIOUS = 5
#: A window's phase (where its edges fall) in this many bins: 0.2 s for 10 s.
BINS = 50
#: Full windows remembered per candidate window: the growth is the least any of them showed
#: (older ones say less about a provider whose growth drifts).
_EPISODES = 3

_Counts = list[tuple[int, int] | None]  # per phase bin: (full window, the one before)
#: An edge: ``(after, at, the run turned away before after or None)``.
Edge = tuple[float, float, tuple[float, float] | None]


@final
class WindowFit:
    """One candidate window: the phases every edge allows, and the full windows' counts."""

    __slots__ = ("episodes", "phases", "window_s")

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.phases = [True] * BINS
        self.episodes: list[_Counts] = []

    @property
    def fits(self) -> bool:
        return any(self.phases)

    def edge_after(self, index: int, after: float) -> float:
        """Bin ``index``'s first edge after ``after``: its phase is the end of its span."""
        window = self.window_s
        phase = (index + 1) * window / BINS
        edge = phase + window * math.ceil((after - phase) / window)
        return edge if edge > after else edge + window

    def edges(self, after: float) -> list[float | None]:
        """Per phase bin still allowed, its first edge after ``after`` (else ``None``)."""
        return [self.edge_after(i, after) if ok else None for i, ok in enumerate(self.phases)]

    def refuted(self, index: int, run: tuple[float, float] | None) -> bool:
        """Whether every phase in bin ``index`` puts an edge in ``run``, ``(since,
        until]``: sends that were all turned away (none to refute: ``None``)."""
        if run is None:
            return False
        since, until = run
        window = self.window_s
        end = self.edge_after(index, since)
        return (end - window / BINS > since and end <= until) or end + window <= until

    def allowed(self, run: tuple[float, float] | None) -> list[int]:
        """The phase bins every edge seen and ``run`` (see :meth:`refuted`) allow."""
        return [i for i, ok in enumerate(self.phases) if ok and not self.refuted(i, run)]

    def next_probe(self, edges: list[float], now: float) -> float:
        """When to probe for this window's next edge after ``now``, ``edges`` the next
        edge of each phase still allowed: the latest once they are pinned to a tenth of a
        window, else a tenth of a window on (or the first allowed edge, if later)."""
        tenth = self.window_s / 10
        if max(edges) - min(edges) <= tenth:
            return max(edges)
        return max(now + tenth, min(edges))

    def _fitting(
        self, index: int, after: float, at: float, run: tuple[float, float] | None
    ) -> float | None:
        """Bin ``index``'s edge in ``(after, at]`` (``None``: it has none there, or
        ``run`` refutes it). An interval shorter than a bin may hold no bin's end: the bin
        holding ``at`` fits then, with ``at`` as its edge."""
        if self.refuted(index, run):
            return None
        edge = self.edge_after(index, after)
        if edge > at + 1e-9 and not (
            edge - self.window_s / BINS < at and at - after < self.window_s / BINS
        ):
            return None
        return min(edge, at)

    def allows(self, after: float, at: float, run: tuple[float, float] | None) -> bool:
        """Whether a phase still allowed puts an edge in ``(after, at]`` outside ``run``."""
        return any(
            ok and self._fitting(i, after, at, run) is not None for i, ok in enumerate(self.phases)
        )

    def constrain(self, after: float, at: float, run: tuple[float, float] | None) -> None:
        """Keep the phases an edge in ``(after, at]`` and ``run`` allow (no counts: an
        edge older than the log, replayed by :meth:`.SlopeLimit.edge`)."""
        self.phases = [
            ok and self._fitting(i, after, at, run) is not None for i, ok in enumerate(self.phases)
        ]

    def add(
        self, log: SentLog, after: float, at: float, run: tuple[float, float] | None = None
    ) -> None:
        window = self.window_s
        counts: _Counts = []
        for index in range(BINS):
            edge = self._fitting(index, after, at, run)
            if edge is None:
                counts.append(None)
            else:
                full = log.count(edge - window, edge, refused=True)
                counts.append((full, log.count(edge - 2 * window, edge - window, refused=True)))
        self.phases = [ok and c is not None for ok, c in zip(self.phases, counts, strict=True)]
        self.episodes.append(counts)
        del self.episodes[:-_EPISODES]

    def quiet(self) -> bool:
        """Whether the latest full window read at an allowed phase followed a quiet one
        (it may have held the floor, whatever the growth)."""
        latest = self.episodes[-1] if self.episodes else []
        return any(
            ok and pair and pair[1] < MIN_PREVIOUS and pair[0] > 0
            for ok, pair in zip(self.phases, latest, strict=True)
        )

    def estimate(self, floor: int = 0) -> tuple[float | None, int | None]:
        """``(growth, floor)`` from the remembered windows; ``None`` where unknown.

        ``floor``: the floor known already. A full window that held no more than it (by
        :data:`MIN_PREVIOUS`) shows the floor, not the growth: the rule is ``max(floor,
        growth x previous)``. Read as growth, reject latency 1 s read 1.4 off a window
        that held the floor (56 of ours after 28-35, the provider's 2 and 60; seed 1,
        1.08x the oracle)."""
        growth = math.inf
        least = floor + MIN_PREVIOUS if floor else 0
        for counts in self.episodes:
            pairs = [p for ok, p in zip(self.phases, counts, strict=True) if ok and p]
            if pairs and all(previous >= MIN_PREVIOUS for _, previous in pairs):
                ratios = [f / p for f, p in pairs if f - p >= MIN_PREVIOUS and f > least]
                if ratios:
                    growth = min(growth, *ratios)
        # The floor: the latest full window after a quiet one, read at the phases still
        # allowed now. Read only when it was the latest, at every phase its one edge
        # allowed, it was the least count of them: the first window's 60 read 56, the
        # edge's span (1.06 s) cutting its first sends off, and each minute's ramp after
        # a quiet stretch then started 7 % short (morning peak with 96 slots, seed 5).
        # The next edges pin the phase; the window is read again there.
        for counts in reversed(self.episodes):
            quiet = [
                pair[0]
                for ok, pair in zip(self.phases, counts, strict=True)
                if ok and pair and pair[1] < MIN_PREVIOUS and pair[0] > 0
            ]
            if quiet:
                return (None if growth == math.inf else growth), min(quiet)
        return (None if growth == math.inf else growth), None


def between(first: tuple[float, float], second: tuple[float, float]) -> list[float]:
    """The whole-second windows (within :data:`WINDOWS`' range) that put a whole number
    of windows between an edge in ``first`` and one in ``second`` (``(after, at]`` each):
    the candidates two edges no window of :data:`WINDOWS` fits suggest."""
    low, high = second[0] - first[1], second[1] - first[0]
    shortest, longest = WINDOWS[0], WINDOWS[-1]
    found: set[float] = set()
    for k in range(1, math.floor(high / shortest) + 1):
        start = max(math.ceil(low / k), math.ceil(shortest))
        found.update(float(w) for w in range(start, math.floor(min(high / k, longest)) + 1))
    return sorted(found)


def phase_ends(fit: WindowFit) -> tuple[float, ...]:
    """The phases ``fit`` allows, each as its bin's end: every edge lies in ``(end - bin,
    end] + k x window`` for one of them."""
    width = fit.window_s / BINS
    return tuple((i + 1) * width for i, ok in enumerate(fit.phases) if ok)


def span(fit: WindowFit) -> tuple[float, float] | None:
    """``(first, last)``: every edge ``fit``'s phases allow lies in ``(first - bin, last]
    + k x window`` (``None``: no phase allowed)."""
    window = fit.window_s
    ends = phase_ends(fit)
    if not ends:
        return None
    # The allowed bins form one run on the circle of phases: it starts after the widest gap
    # between neighbours (a run across the window's end wraps).
    count = len(ends)
    gaps = [(ends[(j + 1) % count] - ends[j]) % window for j in range(count)]
    widest = max(range(count), key=gaps.__getitem__)
    first = ends[(widest + 1) % count]
    last = ends[widest] if count > 1 else first
    if last < first:
        last += window
    return first, last


def refit(log: SentLog, edges: list[Edge]) -> dict[float, WindowFit]:
    """No window fits every edge seen: the windows that fit the most recent ``edges``, of
    :data:`WINDOWS` and of the whole-second windows the last two edges suggest
    (:func:`between`), :data:`WINDOWS` first at a tie; if none fits two, :data:`WINDOWS`
    over from the latest edge alone (without its run: it may be what contradicted the
    rest).

    A 45 s window's first edge, after a run of over 30 s, fit only 60 s; its second fit
    none, and started over at 10 s, where no growth was read again for the rest of the run
    (window 45 s: 0.59 % of calls with a 429, seeds 1-5)."""
    after, at, run = edges[-1]
    windows = dict.fromkeys(WINDOWS, True)
    if len(edges) > 1:
        for window in between(edges[-2][:2], edges[-1][:2]):
            windows.setdefault(window, False)
    scored: list[tuple[tuple[int, bool], WindowFit]] = []
    for window, listed in windows.items():
        fit = WindowFit(window)
        fit.add(log, after, at, run)
        count = 1
        for older in reversed(edges[:-1]):
            phases = fit.phases
            fit.constrain(*older)
            if not fit.fits:
                fit.phases = phases
                break
            count += 1
        if fit.fits:
            scored.append(((count, listed), fit))
    top = max((score for score, _ in scored), default=(0, True))
    kept = {fit.window_s: fit for score, fit in scored if score == top}
    if top[0] < 2:
        kept = {window: WindowFit(window) for window in WINDOWS}
        for fit in kept.values():
            fit.add(log, after, at)
    return kept
