"""The provider's concurrency limit (its slots), from concurrency 429s and what got through.

Why. A concurrency 429 says the provider's slots were all taken by this client's other
calls: the calls at the provider then, less the rejected one, bound the slots from above.
A success bounds them from below: that many were in service at once and the provider took
them all. Between the two the limit must probe upward now and then (a raised limit is
found again) and hold in between (each probe costs a 429): AIMD with a hold, as TCP's
congestion window grows once per round trip and not once per acknowledged segment.

What. One :class:`ConcurrencyLimit` per adaptive limit: the limit (a float between the
floor and the configured maximum), the last lesson and its hold, and the most calls in
service that got through (:attr:`most_passed`, what a plain 429 at a new high is told
apart by, :mod:`.attribute`).

* :meth:`cut`: a concurrency 429 makes the limit the calls in flight less one; an overload
  answer (529, 503 with Retry-After) multiplies it by ``decrease_factor``. Then the limit
  holds ``DEFAULT_HOLD_S`` (30 s) before it may grow, doubling each time a probe finds the
  same limit again, up to ``DEFAULT_MAX_HOLD_S`` (10 min).
* :meth:`burst_cut` (with the slope not learned, ``pace_burst_rate`` off): a burst 429
  multiplies it by ``decrease_factor``; :meth:`take_herd`: an uncapped gate takes its
  calls in flight at a first slope throttle as its limit (the *herd's*; not a handful,
  :mod:`.burst`).
* :meth:`grow`: a saturated success raises the limit by ``1 / limit`` (about a slot per
  limit's worth of successes); a herd limit by one (doubling per round trip) up to
  ``HERD_GROWTH`` (1.1) times :attr:`most_passed` (or one above it): once the slope is
  learned, and with none learned, once no burst throttle came for a slope window.
* :meth:`over`: whether the others at the provider already fill the limit (a slot got
  just before a cut waits for one of them to leave instead of being the next 429).

The arithmetic is :mod:`anygate._config.limit_values`' (pure, with its evidence). Not
thread-safe, no clock of its own, no gate: the owner (:class:`anygate.AdaptiveLimit`)
passes times, holds a lock and writes :meth:`capacity` to the gate.
"""

from __future__ import annotations

import math
from collections import deque
from typing import final

from .._config.limit_values import (
    DEFAULT_HOLD_S,
    DEFAULT_MAX_HOLD_S,
    HERD_GROWTH,
    capacity_for,
    lowered_limit,
    raised_limit,
)

__all__ = ["ConcurrencyLimit"]

#: How long a 429's (send, answer) times are kept to correct :attr:`most_passed`: a
#: minute, far longer than any answer takes.
_REJECTIONS_S = 60.0


@final
class ConcurrencyLimit:
    """The slots' estimate; see the module docstring.

    Args:
        maximum: the configured maximum (``inf``: no cap); the limit starts there.
        floor: the least the limit goes to (>= 1; a maximum below it wins).
        factor: the multiplier on an overload answer or a burst cut (0 < factor < 1).
    """

    __slots__ = (
        "_exact",
        "_hold_s",
        "_learned",
        "_rejections",
        "_tentative",
        "_throttled_at",
        "factor",
        "floor",
        "held_until",
        "herd",
        "limit",
        "maximum",
        "most_passed",
    )

    def __init__(self, maximum: float, *, floor: int, factor: float) -> None:
        self.maximum = maximum
        self.limit = maximum  # a float between the floor and the maximum
        self.floor = floor
        self.factor = factor
        # The last limit a concurrency 429 taught, the current hold (no growth until
        # held_until) and how long the next one lasts.
        self._learned = math.inf
        self._exact = False  # whether it came from a concurrency 429 (its count exact)
        self._hold_s = DEFAULT_HOLD_S
        self.held_until = -math.inf
        # The limit is the herd's (in flight at a slope throttle), not a concurrency lesson.
        self.herd = False
        # The most calls at the provider at the send of one that got through, and the
        # recent 429s' (send, answer, place in the send order) that correct that count.
        self.most_passed = 0
        self._rejections: deque[tuple[float, float, int | None]] = deque()
        # A tentative lesson's (limit taught, limit before it), until a pass above it
        # refutes it or a second lesson there confirms it (see cut).
        self._tentative: tuple[float, float] | None = None
        self._throttled_at = -math.inf  # the last confirmed burst throttle (see grow)

    # ------------------------------------------------------------------ reading

    @property
    def floor_now(self) -> int:
        """The floor in force: a maximum below the configured floor wins (the floor never
        raises the cap)."""
        return int(min(self.floor, self.maximum))

    @property
    def active(self) -> bool:
        """Capped, or uncapped with a limit learned from throttles."""
        return self.maximum >= 1 and self.limit < math.inf

    def capacity(self) -> float:
        """The gate capacity the limit means (the limit clamped to the floor and the
        maximum first); the maximum while nothing is learned."""
        if not self.active:
            return self.maximum
        floor = self.floor_now
        self.limit = max(min(self.limit, self.maximum), floor)
        return capacity_for(self.limit, floor=floor)

    def over(self, others: int) -> bool:
        """Whether ``others`` calls at the provider already fill the limit the throttles
        taught (an attempt holding a slot got before a cut then waits)."""
        if math.isinf(self.limit):
            return False
        return others >= capacity_for(self.limit, floor=self.floor_now)

    # ------------------------------------------------------------------ lessons

    def cut(self, in_flight: int, now: float, *, exact: bool, tentative: bool = False) -> bool:
        """A concurrency 429 (``exact``) or an overload answer with ``in_flight`` calls at
        the provider, the rejected one included; whether the limit went down.

        ``exact``: the others held every slot, the limit becomes ``in_flight - 1``.
        Otherwise ``min(limit, in_flight) x factor``, and a lone call teaches nothing.

        ``tentative``: the 429 did not say it was the slots' (a plain one the counts
        attribute to them, :mod:`.attribute`). The first such lesson at a level holds
        nothing: the limit grows back at once, and a pass above it (:meth:`passed`)
        undoes it; a second there confirms it, as does one where a confirmed lesson
        was (a regrowth's probe of the slots). A shared pool's random 429 lands at a new
        high as readily as anywhere: taken for the slots, the first (8 calls out, a
        ramp's) held a 32-slot provider to 8, and each regrowth's 429 held it longer
        (plain 429s with a 3 % shared pool, seed 2: 2.9x the oracle). The slots turn
        every call above them away, so their lesson is confirmed at its first regrowth:
        one 429 more."""
        floor = self.floor_now
        if exact:
            target = float(max(floor, in_flight - 1))
        else:
            if in_flight <= 1:
                return False
            target = max(float(floor), min(self.limit, in_flight) * self.factor)
        if target >= self.limit:
            return False
        pending, self._tentative = self._tentative, None
        # Where the last lesson was (a regrowth's probe turned away there), or a level of
        # its own: above it too, once the limit grew past it (calls got through there).
        # Taken for the last lesson's probe, a shared pool's bare 429 at each new top
        # doubled the hold: 30 s, 60 s, 120 s, 240 s at 24-28 of 32 slots (plain 429s
        # and a 5 % pool, seed 1: 1.36x the lower bound; 1.15x with this alone).
        # Not once more got through at once than it allowed: that lesson is refuted, and
        # one at a new level below the top is a first one there (a 10 % pool's bare 429
        # at 9, after 8 had got through at once, was taken for the probe of a lesson of
        # 7 and doubled the hold; plain 429s, seed 4: 4.15x -> 3.73x the lower bound).
        again = abs(target - self._learned) <= 1 and self.most_passed <= self._learned
        if tentative and not again and (pending is None or target < pending[0] - 1):
            self._tentative = (target, pending[1] if pending is not None else self.limit)
            self.herd = False
            self.held_until = now
            self.limit = target
            return True
        # A probe that lands where the last lesson did confirms it: hold longer (a
        # tentative one's confirmation holds as a first lesson does).
        if pending is None and again and now < self.held_until + 4 * self._hold_s:
            self._hold_s = min(self._hold_s * 2, DEFAULT_MAX_HOLD_S)
        else:
            self._hold_s = DEFAULT_HOLD_S
        self._learned, self._exact = target, exact
        self.herd = False
        self.held_until = now + self._hold_s
        self.limit = target
        return True

    def tighten(self, in_flight: int) -> bool:
        """A concurrency 429 for an attempt sent before the latest lesson, with
        ``in_flight`` at the provider (itself included): the same overshoot's, whose 429s
        come back in any order. Its bound, if lower, replaces the lesson's (tentative or
        not, the hold kept); whether the limit went down. Not below :attr:`most_passed`
        (a confirmed lesson's): the count is the least of the send's and now's
        (``Retrier._in_flight``), and now comes after the lesson cut what went out (reject
        latency 1 s, seed 1: 34 tightened to 28 for 32 slots, 31 seen through)."""
        target = max(float(self.floor_now), in_flight - 1.0)
        if target >= self.limit or (self._tentative is None and target < self.most_passed):
            return False
        pending = self._tentative
        if pending is not None:
            self._tentative = (target, pending[1])
        else:
            self._learned = target
        self.limit = target
        return True

    def holding(self, now: float) -> bool:
        """Whether a cut's hold is on (below the maximum): no growth, and a throttle of an
        unknown generation is taken for one the cut already answered."""
        return now < self.held_until and self.limit < self.maximum

    def burst_cut(self) -> None:
        """A burst 429 with nothing else to answer it: ``limit x factor``, a lesson (a
        herd's limit cut so no longer slow-starts, :meth:`grow`)."""
        self.limit = lowered_limit(self.limit, factor=self.factor, floor=self.floor_now)
        self.herd = False

    def take_herd(self, in_flight: int) -> None:
        """An uncapped gate's first slope throttle with ``in_flight`` calls out: that is
        its limit (without one the pause's end would release every queued call at once),
        the herd's, no lesson about the slots."""
        self.limit = float(max(self.floor_now, in_flight))
        self.herd = True

    def grow(self, now: float, *, slope_known: bool, window_s: float) -> None:
        """A success admitted on a full gate: ``+ 1 / limit`` (nothing during a hold). A
        herd limit is no lesson about the slots: with the slope known (it holds the rate),
        or without once no burst throttle came for a slope window (``window_s``), it grows
        by one per success (doubling each round trip, TCP's slow start) up to
        ``HERD_GROWTH`` x :attr:`most_passed` (or one above it)."""
        if now < self.held_until:
            return
        if not self.herd:
            self.limit = raised_limit(self.limit, ceiling=self.maximum)
        elif slope_known:
            # The slope rule holds the rate: up to a tenth above the most in service that
            # got through, one per success. At once, the herd met 96 slots with up to a
            # tenth of them beyond in flight (the morning peak with 96 slots, seeds 1-5:
            # 1.021x -> 1.012x the oracle by one; x10, seeds 1-2, 0.14 -> 0.05 % of
            # calls with a 429).
            self.limit = min(
                self.maximum,
                max(
                    raised_limit(self.limit, ceiling=self.maximum),
                    min(self.limit + 1.0, HERD_GROWTH * self.most_passed),
                ),
            )
        elif now - self._throttled_at >= window_s:
            # Nothing holds the rate, nothing said the slots were full, and no burst
            # throttle came for a window (a ramp that outgrew the rule would have met an
            # edge): grown by 1 / limit, a herd of 4 taken at a shared pool's 429 0.9 s in
            # was 101 of 320 slots four minutes later (the morning peak x10, 5 % pool:
            # 2.5x the oracle), and a 5 s window taken for 10 s held the peak x10 at
            # about 55 calls for 20 s (1.088x; waiting two windows, 1.045x at one).
            # Within a window of a throttle, on a ramp whose slope is not learned yet,
            # doubling overshot 96 slots by ten calls. Past the most seen through, no
            # more than a tenth above it (or one): a 429 comes back a reject latency
            # after its send, each success meanwhile raised the limit by one, and at
            # 0.6 s the peak's herd went from 31 (32 slots) to 41 before the first came
            # back (seed 1: nine calls turned away; two now).
            most = self.most_passed
            cap = max(self.limit, HERD_GROWTH * most, most + 1.0) if most else math.inf
            self.limit = min(self.maximum, self.limit + 1.0, cap)
        else:
            self.limit = raised_limit(self.limit, ceiling=self.maximum)

    def throttled(self, now: float) -> None:
        """A burst throttle was confirmed at ``now`` (see :meth:`grow`)."""
        self._throttled_at = now

    def rejected(self, at: float, now: float, order: int | None = None) -> None:
        """An attempt sent at ``at`` (``order``-th, if known) got a 429 (any kind) at
        ``now``: at the provider until then, but not in service (see :meth:`passed`)."""
        rejections = self._rejections
        rejections.append((at, now, order))
        while rejections and rejections[0][1] < now - _REJECTIONS_S:
            rejections.popleft()

    def _answer_times(self, now: float) -> list[float]:
        """How long each 429 answered in the minute before ``now`` took to come back."""
        since = now - _REJECTIONS_S
        return [answered - sent for sent, answered, _ in self._rejections if answered >= since]

    def slowest_answer(self, now: float) -> float:
        """The longest a 429 of the last minute took to come back (0: none)."""
        return max(self._answer_times(now), default=0.0)

    def typical_answer(self, now: float) -> float:
        """The median time a 429 of the last minute took to come back (0: none)."""
        times = sorted(self._answer_times(now))
        return times[len(times) // 2] if times else 0.0

    def passed(self, at: float, sending: int, order: int | None = None) -> None:
        """The attempt sent at ``at`` (``order``-th, if known) with ``sending`` calls at
        the provider (itself included) succeeded. The most in service at once is
        ``sending`` less the calls sent before it that were turned away after it went
        (their 429 was still on its way): counted with those, a 24-slot provider read 27
        (the morning peak with plain 429s). With the send order known, "before" is by
        it: a batch sent at one instant is not all before each of its members."""
        pending = sum(
            1
            for sent, answered, place in self._rejections
            if sent <= at <= answered and (order is None or place is None or place < order)
        )
        self.most_passed = max(self.most_passed, sending - pending)
        tentative = self._tentative
        if tentative is not None and self.most_passed > tentative[0]:
            # More got through at once than a tentative lesson allowed: it was noise.
            self._tentative = None
            self.limit = max(self.limit, tentative[1])
            self.held_until = -math.inf
        elif self._exact and self.most_passed > self._learned and self.held_until > at:
            # More got through at once than a held lesson allowed (a call sent before
            # its 429, heard at its end): the slots hold more. The hold ends and the
            # next lesson is a first one. A shared pool's bare 429 at a regrowth's
            # first sends comes back long before the passes sent beside it end, and
            # each such 429 held the slots' limit where the pool had put it (plain 429s
            # and a 10 % pool, seeds 1 and 5: 1.55x and 1.47x the lower bound -> 1.29x
            # and 1.20x).
            self._learned, self._hold_s = self.most_passed, DEFAULT_HOLD_S
            self.limit = max(self.limit, float(self.most_passed))
            self.held_until = -math.inf

    # ------------------------------------------------------------------ configuring

    def resize(self, maximum: float) -> None:
        """A new maximum: a limit down after a throttle stays down (capped at it), one at
        the old maximum follows to the new one."""
        reduced = self.limit < self.maximum
        self.maximum = maximum
        self.limit = min(self.limit, maximum) if reduced else maximum

    def reset(self, maximum: float) -> None:
        """Start over at ``maximum`` (the gate was resized from outside, or turned off)."""
        self.maximum = self.limit = maximum
