"""The slope rule's allowance: what the provider's window holding a send may still take.

Why. Once a burst 429 taught the slope (:mod:`.slope`), a send is held until the window
holding it, with it, holds no more than ``max(floor, growth x the window before)``. Which
window that is, and how many of ours each holds, is the arithmetic here: the provider's
own windows once the edges seen pin their phase, each count erring toward holding back;
trailing windows otherwise; the floor alone after a quiet stretch before a growth is known.

What. :func:`allowance`, a pure function of the send log and what is learned (the window,
growth, floor and the edges' phase span); :class:`.slope.SlopeLimit` holds the state and
asks it. No clock, no lock.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .slope_fit import BINS, MIN_PREVIOUS

if TYPE_CHECKING:
    from .window import SentLog

__all__ = ["allowance"]

#: In a recovery the provider's own windows are counted once the edges seen put every one
#: within this share of a window. Any span under a window keeps the counts on the safe
#: side (the current window from its earliest start, the previous one from its latest); a
#: wider one only holds more back. Half a window: one edge found a tenth of a window
#: closely (the pause's probe interval) plus its bin is enough, where a tenth (what
#: :meth:`.slope.SlopeLimit.predicted` pins to) left the outage scenario's seed 3 on trailing
#: windows (1.040x the oracle and 9 calls with a 429; counted, 1.037x and 8).
_SPAN = 0.5


def allowance(
    log: SentLog,
    at: float,
    *,
    window: float,
    growth: float | None,
    floor: int,
    span: tuple[float, float] | None,
    phases: tuple[float, ...],
) -> tuple[int, float, float | None]:
    """``(the current window's count at at, what the learned slope allows it, when
    the next window surely begins)``; the allowance is ``inf`` when nothing learned
    bounds it, the next window ``None`` on trailing windows. ``span``: every edge the
    phases seen allow lies in ``(first - bin, last] + k x window`` (:func:`.slope_fit.span`);
    ``phases``: those phases, each its bin's end (:func:`.slope_fit.phase_ends`).

    The provider's own windows once the edges seen pin their phase (:func:`_aligned`).
    Trailing windows otherwise: while the rate grows they err low too, but by up to a
    window's sends, and a fleet that spends each window at its start saw its next
    window's allowance only once the last burst left the trailing one (burst window
    30 s, seed 3: 362 calls in 90-120 s where the oracle ran 433; aligned, 393).
    Before a growth is known only the floor holds, after a quiet window."""
    recovering = _recovering(log, at, window)
    if (growth is not None or recovering) and _pinned(window, span, recovering):
        return _aligned(log, at, window, phases, growth, floor)
    current = log.count(at - window, at)
    if growth is None:
        return current, (floor if _after_quiet(log, at, window, floor) else math.inf), None
    previous = log.count(at - 2 * window, at - window)
    return current, _rule(growth, previous, floor), None


def _rule(growth: float, previous: int, floor: int) -> float:
    """``max(floor, growth x previous)``; no bound after a window too quiet to read
    (fewer than :data:`MIN_PREVIOUS` of ours) while no floor is known: the provider's
    floor is then all it allows, unknown, not none. Held to ``growth x`` a handful,
    the last calls of a run waited out every window until the rule was forgotten
    (an 8 % shared pool, seed 3: the last call sent 82 s after the one before)."""
    if previous < MIN_PREVIOUS and not floor:
        return math.inf
    return max(floor, growth * previous)


def _after_quiet(log: SentLog, at: float, window: float, floor: int) -> bool:
    """Whether the trailing window at ``at`` follows a quiet stretch two windows long
    (no send of ours the provider counted) after sends of ours, with the floor known.

    Then the provider's window holding the stretch's first send followed a quiet one,
    whatever its phase, and may hold the floor and no more, for any growth: the rule
    is ``max(floor, growth x previous)``. Every window may hold the floor, so holding
    the trailing one to it never sends too many. That is the recovery from an outage
    or a lull, which the floor learned on the ramp predicts before any growth is
    known; nothing held it, and the first window after the outage turned the floor's
    excess away (the ``outage`` scenario, seeds 2 and 5: two burst 429s at 154 s, then
    the pause's probe's). Two windows: the provider's window before the one holding a
    send at ``q`` began as early as ``q - 2 x window``. None of ours in them, not a few
    (the floor's "quiet" when it is learned): with a few allowed the trailing window
    after the ramp's first full one, already past the floor, was held to it. A run's
    start is no recovery (:func:`_recovering`): its first full window is where the
    floor is learned, and a floor read off a handful of calls then held the next for
    a whole window (tests/test_config.py end to end: the held call's busy wait ran
    out). (The log keeps two minutes: a 60 s window's stretch may read quiet early,
    which only holds sends back.)"""
    if not floor:
        return False
    return _after_sends(log, at - 3 * window) and log.count(at - 3 * window, at - window) == 0


def _after_sends(log: SentLog, at: float) -> bool:
    """Whether the log holds a send of ours before ``at``."""
    start = log.first_after(-math.inf)
    return start is not None and start < at


def _recovering(log: SentLog, at: float, window: float) -> bool:
    """Whether a quiet stretch two windows long (none of ours counted) after sends of
    ours ended within the last two windows: a recovery, whose trailing windows anchor
    on its first send (a breaker's late probe). A run's start is none: its ramp keeps
    to trailing windows (counted in the provider's windows from its first edge, the
    15 s burst window of the tuning set, taken for 10 s until its second edge, went
    from 1.015x to 1.10x the oracle)."""
    return _after_sends(log, at - 4 * window) and (log.count(at - 4 * window, at - 2 * window) == 0)


def _pinned(window: float, span: tuple[float, float] | None, recovering: bool) -> bool:
    """Whether the edges seen pin the phase to a tenth of a window (what
    :meth:`.slope.SlopeLimit.predicted` pins to), or to :data:`_SPAN` of one in a recovery
    (``recovering``): then the provider's own windows are counted (:func:`_aligned`)."""
    if span is None:
        return False
    return span[1] - span[0] + window / BINS <= window * (_SPAN if recovering else 0.1)


def _aligned(
    log: SentLog,
    at: float,
    window: float,
    phases: tuple[float, ...],
    growth: float | None,
    floor: int,
) -> tuple[int, float, float | None]:
    """``(current, allowed, next edge)`` in the provider's own windows: of the phases the
    edges allow, the one whose window holding a send at ``at`` has the least room (a
    send must fit whichever it is), with the next edge that phase puts after it.

    Each phase's counts err toward holding back, by its bin alone: the current window
    from the bin's earliest start, with the sends the slots refused (a rate limiter in
    front of the model servers may have counted them: the simulated provider does, and
    a concurrency probe's refusal at the start of the outage scenario's second window
    after the outage was the window's one send too many, seeds 1, 3 and 4), the previous
    one from its latest start to the current one's earliest. Counted across the whole
    span at once (the current window from the earliest phase, the previous to it), a
    burst sent within the span counted in neither window where it mattered: the peak x10 with 960
    slots sent 204 of its calls in the second before an edge its span put within 0.8 s,
    where the previous window read 102 instead of 306, and the slope held the next
    minute to 51, 102, 204, ... calls a window (seed 1: 1.157x the oracle; 1.000x). A
    send ruled out by one phase's window waits for that phase's next edge; asked again
    then, another may rule it out until its own. Before a growth is known (a recovery)
    the floor alone holds, after a quiet window.

    Why not trailing windows alone: after an outage the breaker's probe got through up
    to its recovery interval after the outage's end, and a trailing window anchored
    there let the second window's herd go that much after the provider's edge (1.3-1.4
    s, outage scenario seeds 1-5)."""
    width = window / BINS
    tightest: tuple[int, float, float | None] = (0, math.inf, None)  # no phase: none
    for end in phases:
        start_hi = end + math.floor((at - end) / window) * window  # this phase's latest start
        start_lo = start_hi - width  # ... and earliest
        current = log.count(start_lo, at, refused=True)
        previous = log.count(start_hi - window, start_lo)
        if growth is None:
            allowed = floor if previous < MIN_PREVIOUS else math.inf
        else:
            allowed = _rule(growth, previous, floor)
        if end == phases[0] or allowed - current < tightest[1] - tightest[0]:
            tightest = (current, allowed, start_hi + window)
    return tightest
