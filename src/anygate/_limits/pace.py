"""Sends at the gate's request rate: a hold that ends must not release a second's burst twice.

Why. The gate's request budget (:class:`anygate.Rate`) promises that in any ``d`` seconds
it *admits* at most ``rate x d / 60`` requests plus one second's worth (``burst_s``): what
a provider that enforces its RPM per second tolerates (OpenAI: "60,000 requests a minute
may be enforced as 1,000 a second"; Alibaba). But an admitted attempt may then wait,
holding its slot, for a window the provider counts (:mod:`.sends`: the slope rule, a
release, the per-minute estimates), and when that window frees, every attempt it held
goes at the same instant. With the published 1,200 a minute enforced per second (a bucket
of 20 refilled at 20 a second), the morning peak's holds at the slope window's edge sent
24-31 at one instant, the provider turned 5-13 away, their retries went into the empty
bucket again: 1.2 % of calls got a 429 (seed 1; 0.3-1.2 % over seeds 1-5), where the same
run at a per-minute RPM drew 0.2 %.

What. :class:`SendPace`, a :class:`~anygate._limits.sends.SendLimit` asked after the
others: the gate's request rate and burst as a GCRA (virtual scheduling, the gate's own
arithmetic, :mod:`anygate._gate.rate_math`) over the instants attempts are *sent*. It
starts full (the gate's budget already paced the admissions; this only spreads the ones
a hold let go together) and follows the gate's rate as it changes (a probe's step, the
header learner, the user), keeping what it has spent. No rate, no pacing.

It holds sends only once the provider showed it counts requests over a second: a 429 for
the requests (:meth:`SendPace.rejected`) of a send that went beyond the pace (more than a
second's burst and the refill since, at the gate's rate) while the minute before it held
less than the rate it was paced at (``BIND`` of it, :mod:`.published`: a full minute
explains the 429 whatever the second held). Paced from the start, the sends a hold let
go together at a provider that counts its minute as a whole waited for nothing: the
morning peak with 96 slots went 1.013x -> 1.036x the oracle (seeds 1-5), where the
provider would have taken them at once; held on any such 429, 1.028x (the minute's 429s
at 1,200 came for sends beyond the pace too). Once on it stays on: the pace costs a
provider that counts its minute whole little, and nothing else tells the two apart.

Not for: tokens. A token budget synced to a provider's bucket admits beyond its burst on
purpose (its credit, :mod:`anygate._gate.budget_sync`); a second's pace on sends would
undo that. Not thread-safe, no clock: the owner passes times and holds its lock.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from typing import TYPE_CHECKING, final

from .._gate.rate_math import EPSILON, admission_time, level_tat

if TYPE_CHECKING:
    from .._gate.rate import Rate

__all__ = ["SendPace"]

#: How long a send beyond the pace is remembered: a 429's answer comes within seconds
#: (the reject latency, at most 1 s in the simulator's scenarios); the minute covers the
#: slowest answer a per-minute window would still count.
_MEMORY_S = 60.0
#: At most this many remembered (a bounded memory: a fleet far beyond its pace for a
#: minute keeps the latest, which are the ones its 429s answer).
_KEPT = 4096


@final
class SendPace:
    """The gate's request rate over send instants (see the module docstring)."""

    __slots__ = ("_beyond", "_interval", "_tat", "_tau", "holds", "rate")

    def __init__(self) -> None:
        self.rate: Rate | None = None  # the gate's rate this pace was last set from
        self._interval = 0.0  # seconds per request; 0: no pacing
        self._tau = 0.0  # the burst, in seconds of refill
        self._tat = -math.inf  # theoretical arrival time: full from the start
        # Whether sends are held to the pace: a 429 showed a window of a second.
        self.holds = False
        # Send times of the last minute that went beyond the pace (while not holding).
        self._beyond: deque[float] = deque()

    def follow(self, rate: Rate | None, at: float) -> None:
        """Pace at the gate's ``rate`` (its ``requests_per_minute`` and ``burst_s``) from
        ``at`` on; its level carries over, in requests."""
        if rate is self.rate:
            return
        self.rate = rate
        rpm = None if rate is None else rate.requests_per_minute
        if rate is None or rpm is None:
            self._interval = 0.0
            self._tat = -math.inf
            return
        interval, tau = 60.0 / rpm, rate.burst_s
        if self._interval:
            # Keep the level in requests, as the gate's budget does over a change.
            level = (self._tau - max(0.0, self._tat - at)) / self._interval
            self._tat = level_tat(level, at, interval, tau)
        self._interval, self._tau = interval, tau

    def wait(self, at: float, cost: float, caller: object | None) -> float:
        """Seconds until one more send at ``at`` fits the pace (``cost`` is tokens: not
        paced here, see the module docstring)."""
        interval = self._interval
        if not (interval and self.holds):
            return 0.0
        wait = admission_time(self._tat, at, 1.0, interval, self._tau) - at
        return wait if wait > EPSILON else 0.0

    def sent(self, at: float, cost: float, caller: object | None) -> None:
        """A send went at ``at``: one request spent (beyond the pace, unless it holds)."""
        interval = self._interval
        if not interval:
            return
        tat = self._tat
        # Beyond the pace: admission_time(tat, at, 1, interval, tau) > at, spelled out (a
        # call per send costs more than the arithmetic).
        if not self.holds and tat - self._tau + min(interval, self._tau) > at:
            beyond = self._beyond
            while beyond and (beyond[0] < at - _MEMORY_S or len(beyond) >= _KEPT):
                beyond.popleft()
            beyond.append(at)
        self._tat = (tat if tat > at else at) + interval  # charge(tat, at, 1, interval)

    def rejected(self, at: float) -> None:
        """A 429 for the requests turned away the send of ``at``: if it went beyond the
        pace, the provider counts requests over a second, and the pace holds from now."""
        if self.holds or not self._beyond:
            return
        i = bisect.bisect_left(self._beyond, at - EPSILON)
        if i < len(self._beyond) and self._beyond[i] <= at + EPSILON:
            self.holds = True
            self._beyond.clear()
