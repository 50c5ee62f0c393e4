"""Burst-rate pacing: after a slope throttle, the gate's *rate* goes down and ramps back.

Why. A slope throttle (``limit_burst_rate``) says the request rate rose too steeply, not
that too many calls run at once: the provider compares each window's admissions with the
previous window's. A long pause or a deep concurrency cut empties the next window, and an
empty window shrinks the one after it, so the client ramps up again from almost nothing
(measured on ``bench_storm.py``: 60, 32, 64, 80, 106 admissions per 10 s window after one
throttle, where the oracle ran 60, 120, 140). Pacing keeps the windows full instead: it
caps the admission *rate* just below what the provider accepted, then lets it grow by a
bounded factor per window (AWS SDK's adaptive retry mode: a cut by ``beta``, growth
bounded by twice the measured send rate).

What. One :class:`BurstPacer` per adaptive limit, run under the limit's lock:

* it samples the gate's admission counter (at most every ``PACE_SAMPLE_S``) on successes
  and throttles, and measures the admission rate over the last ``PACE_WINDOW_S``;
* on a burst throttle it sets the gate's ``requests_per_minute`` to
  ``PACE_BETA x`` that rate (:func:`~anygate._config.limit_values.paced_rate`), never above the
  rate the gate had (a user's or a learned one);
* another throttle within ``PACE_WINDOW_S`` of that cut is old news (the cut has not shown
  in the provider's window yet) and changes nothing; a later one cuts again;
* the paced rate grows with the time since the throttle
  (:func:`~anygate._config.limit_values.grown_rate`): ``x PACE_GROWTH`` per window, never above
  ``PACE_GROWTH x`` the measured rate, checked on successes and whenever an attempt
  starts (failures and an open breaker's waiters must not freeze it);
* pacing ends, and the gate's own rate comes back exactly, once the paced rate reaches the
  gate's own request rate or stops binding (the growth bound by the measured rate caught
  up with it: the callers, not the pacer, set the pace).

Someone else setting ``gate.rate`` meanwhile (the user, header learning) is adopted as the
rate to come back to; the pacer keeps the lower of the two while it lasts. It is not a
rate limiter of its own and never raises a rate above what was there.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import weakref
from collections import deque
from typing import TYPE_CHECKING, final

from .._config.limit_values import (
    PACE_BETA,
    PACE_GROWTH,
    PACE_SAMPLE_S,
    PACE_WINDOW_S,
    grown_rate,
    paced_rate,
)
from .._gate.rate import Rate

if TYPE_CHECKING:
    from .._gate.gate import Gate

__all__ = ["BurstPacer", "own_rate"]

# A measurement over less than this says little about a rate (one admission over 10 ms
# would read as 100 per second).
_MIN_SPAN_S = 1.0
# "Caught up": twice the measured rate is within this factor of the paced one, so the pacer
# no longer holds anyone back.
_CAUGHT_UP = 1.0


@final
class BurstPacer:
    """The pacing state of one adaptive limit; every method runs under the limit's lock.

    Not thread-safe on its own and not public (see the module docstring).
    """

    __slots__ = (
        "_base",
        "_pacing",
        "_samples",
        "_set",
        "_start_per_s",
        "_started",
        "episodes",
    )

    def __init__(self) -> None:
        # (clock, gate admissions) pairs, oldest first, PACE_SAMPLE_S apart at least.
        self._samples: deque[tuple[float, int]] = deque()
        self._pacing = False
        self._base: Rate | None = None  # the gate's rate to come back to
        self._set: Rate | None = None  # the rate we last set on the gate
        self._start_per_s = 0.0
        self._started = 0.0  # when the current episode's cut was made
        self.episodes = 0

    @property
    def active(self) -> bool:
        """Whether the pacer holds the gate's request rate down."""
        return self._pacing

    @property
    def base(self) -> Rate | None:
        """The gate's rate to come back to (meaningful while :attr:`active`)."""
        return self._base

    @property
    def paced_per_minute(self) -> float | None:
        """The paced request rate now on the gate, or ``None`` when not pacing."""
        if not self._pacing or self._set is None:
            return None
        return self._set.requests_per_minute

    def sample(self, now: float, admitted: int) -> None:
        """Record the gate's admission counter (cheap: at most one entry per sample)."""
        samples = self._samples
        if samples and now - samples[-1][0] < PACE_SAMPLE_S:
            return
        samples.append((now, admitted))
        horizon = now - PACE_WINDOW_S - PACE_SAMPLE_S
        while len(samples) > 2 and samples[1][0] <= horizon:
            samples.popleft()

    def measured(self, now: float, admitted: int) -> float | None:
        """Admissions per second over (about) the last window; ``None``: too little history."""
        for at, count in self._samples:
            if at >= now - PACE_WINDOW_S - PACE_SAMPLE_S:
                span = now - at
                if span < _MIN_SPAN_S:
                    return None
                return max(0.0, admitted - count) / span
        return None

    def throttled(self, gate: Gate, now: float, admitted: int) -> bool:
        """A burst throttle: pace the gate to ``PACE_BETA x`` the measured rate.

        Returns whether pacing is on now (``False``: too little history to measure).
        """
        self.sample(now, admitted)
        self._adopt(gate)
        current = self.paced_per_minute
        if current is not None and now - self._started < PACE_WINDOW_S:
            # Throttled again within a window of the last cut: old news. The cut has not
            # shown in the provider's window (nor in our measurement) yet. Answering every
            # throttle of a provider that throttles at random (a shared pool, a fault mix)
            # compounded to the floor in a second and stalled every caller; undoing only
            # the growth since still decayed the rate by 0.7x a window, without end.
            return True
        rate = self.measured(now, admitted)
        if not rate:  # nothing admitted lately: a rate of 0 is no measurement
            return False
        start = paced_rate(rate, beta=PACE_BETA)
        if current is not None:
            # Throttled again while pacing: the rate that was just too much is the bound.
            start = min(start, PACE_BETA * current / 60.0)
        self.episodes += 1
        self._start_per_s = start
        self._started = now
        self._pacing = True
        self._apply(gate, start * 60.0)
        with _pacing_lock:
            _pacing[gate] = self._base
        return True

    def grow(self, gate: Gate, now: float, admitted: int) -> bool:
        """A success while pacing: grow the paced rate; ``True`` when pacing just ended."""
        if not self._pacing:
            return False
        self.sample(now, admitted)
        changed = self._adopt(gate)
        measured = self.measured(now, admitted)
        elapsed = now - self._started
        target = grown_rate(
            self._start_per_s,
            elapsed,
            growth=PACE_GROWTH,
            window_s=PACE_WINDOW_S,
            measured_per_s=measured,
        )
        # The growth bound by the measured rate caught up: the callers set the pace now.
        caught_up = (
            measured is not None
            and elapsed >= PACE_WINDOW_S
            and PACE_GROWTH * measured <= target * _CAUGHT_UP
        )
        if target * 60.0 >= self._base_per_minute() or caught_up:
            self.end(gate)
            return True
        current = self.paced_per_minute
        if changed or current is None or target * 60.0 > current * 1.01:  # no churn for 1 %
            self._apply(gate, target * 60.0)
        return False

    def end(self, gate: Gate | None) -> None:
        """Stop pacing: give the gate its own rate back (as adopted), if ours is on it."""
        if not self._pacing:
            return
        if gate is not None:
            if gate.rate == self._set:
                gate.rate = self._base
            with _pacing_lock:
                _pacing.pop(gate, None)
        self._pacing = False
        self._set = self._base = None

    # ------------------------------------------------------------------ internals

    def _base_per_minute(self) -> float:
        base = self._base
        if base is None or base.requests_per_minute is None:
            return math.inf
        return base.requests_per_minute

    def _adopt(self, gate: Gate) -> bool:
        """Take the gate's rate as the one to come back to, unless it is ours; ``True``
        if someone else (the user, header learning) set it since we did."""
        current = gate.rate
        if not self._pacing:
            self._base = current
            return False
        if current == self._set:
            return False
        self._base = current
        with _pacing_lock:
            _pacing[gate] = current
        return True

    def _apply(self, gate: Gate, per_minute: float) -> None:
        per_minute = min(per_minute, self._base_per_minute())
        base = self._base
        if base is None:
            rate = Rate(requests_per_minute=per_minute)
        else:
            rate = dataclasses.replace(base, requests_per_minute=per_minute)
        if rate != gate.rate:
            gate.rate = rate
        self._set = rate


# Gates being paced -> the rate pacing will give back (for own_rate).
_pacing: weakref.WeakKeyDictionary[Gate, Rate | None] = weakref.WeakKeyDictionary()
_pacing_lock = threading.Lock()


def own_rate(gate: Gate) -> Rate | None:
    """The gate's rate as its owner set it: while burst pacing holds it down, the rate
    pacing will give back, else ``gate.rate``. Header learning takes this as its ceiling
    (a learner made while paced must not mistake the paced rate for the user's)."""
    with _pacing_lock:
        if gate in _pacing:
            return _pacing[gate]
    return gate.rate
