"""The release after a pause that turned many away: doubling waves, not one herd.

Why (issue 26). When a burst-rate pause (or its first throttle's check) ends, every attempt
held in it goes at once. If the pause turned a whole fleet away, that repeats the burst
that was refused: 40 calls each throttled once retried at two instants, the probe's and
everyone else's. Releasing a throttled fleet in lockstep is what retry jitter exists to
prevent; jitter only spreads the herd over an arbitrary interval, though, and says
nothing about what the provider takes.

What. :class:`Release` paces the attempts sent after such a pause as TCP's slow start
paces a connection's first round trips: the probe's success is one call the provider
took, so two go at once, and the allowance doubles every *round trip*: the time the probe
took from its send to the answer that ended the pause (its acceptance, or its grace passed
without a 429), which is what the provider's answers take now. An attempt over the
allowance waits, holding its slot, until the next doubling. The release is over once its
allowance covers everyone still held back: 40 held callers go in waves of 2, 2, 4, 8, 16
and the rest, five round trips instead of one instant.

It applies only when the pause turned more than one attempt away (a lone 429, a shared
pool's noise, ends as it did: everyone held goes at once), or a check's probe was still
unanswered at its grace's end with most sends since the throttle turned away, and the
slope rule is not yet known (:mod:`anygate._limits.slope` holds sends to the learned
allowance, a better answer).
A new throttle during the release ends it (its pause holds everyone).

Pure arithmetic on the caller's clock; the owner (:class:`anygate.AdaptiveLimit`) calls it
under its lock.
"""

from __future__ import annotations

import math
from typing import final

__all__ = ["Release"]

# Doublings before the allowance stops growing: 2 ** 31 attempts is no limit at all.
_MAX_DOUBLINGS = 30
# The shortest round trip a release paces by (an answer in zero time, an in-process
# fake's: every wave would otherwise fall on one instant).
_MIN_ROUND_TRIP_S = 1e-3


@final
class Release:
    """One release after a pause (see the module docstring); not thread-safe."""

    __slots__ = ("_round_trip", "_sent", "_start")

    def __init__(self, now: float, round_trip: float) -> None:
        self._start = now
        self._round_trip = max(round_trip, _MIN_ROUND_TRIP_S)
        self._sent = 0

    def _doublings(self, now: float) -> int:
        k = math.floor(max(0.0, now - self._start) / self._round_trip)
        if self._start + (k + 1) * self._round_trip <= now:  # the division rounded down
            k += 1
        return min(_MAX_DOUBLINGS, k)

    def allowance(self, now: float) -> int:
        """Attempts the release lets go from its start up to ``now``: 2, 4, 8, ..."""
        return 2 << self._doublings(now)

    def over(self, now: float, held: int) -> bool:
        """Whether the allowance covers the ``held`` attempts still waiting: the release
        has nothing left to pace."""
        return self.allowance(now) - self._sent >= held

    def wait(self, at: float, cost: float = 1.0, caller: object | None = None) -> float:
        """Seconds until the next doubling lets an attempt sent at ``at`` go (``0.0``: it
        may go now; counted by :meth:`sent`)."""
        k = self._doublings(at)
        if self._sent < 2 << k:
            return 0.0
        return max(self._start + (k + 1) * self._round_trip - at, _MIN_ROUND_TRIP_S)

    def sent(self, at: float, cost: float = 1.0, caller: object | None = None) -> None:
        """An attempt went: one of the allowance is taken."""
        self._sent += 1
