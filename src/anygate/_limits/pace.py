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

The first send beyond the pace is a test. Learnt from a 429 alone, the lesson came after
the herd that taught it: the outage scenario with its RPM enforced per second let 33
held attempts go at the slope window's edge after the outage, 12 of them were turned
away at one instant (seed 1; 1.9 % of the run's calls with a 429 over seeds 1-5). So
while a send beyond the pace is out and unanswered, the others beyond it wait, holding
their slots (:meth:`SendPace.wait`). Its answer alone says little: where a send of its
second was turned away by another limit (the slots), the provider counted one fewer,
and a send one beyond the pace fits (seed 1 again: 33 sent against 32 slots). So the test
is the burst it ends, the sends of the second up to it (:class:`_Test`): the provider
took more than the pace if it accepted more of them (a success status and headers, or
the success) than went within the pace, and then no send is tested again
(:attr:`SendPace.taken`). A 429 for the test's requests makes the pace hold (as above).
All answered otherwise, the test told nothing, and the next send beyond the pace is one.
Its grace is ``PROBE_GRACE_S``: a 429 comes back in tens of milliseconds, a call's
answer may take a minute where nothing reports its start; unanswered by then, the test
was taken unless a send of its burst was turned away. The cost at a provider that counts
its minute is one answer's wait, once.

A minute at once. Where the gate's rate is the provider's *published* per-minute limit
(a policy with ``rate_is_ceiling=False``) and requests are its only per-minute budget
(token budgets pace each second; a request minute spent at once ran ahead of them), its
request budget holds a minute's refill,
full at the start (:meth:`anygate.Gate._requests_by_minute`): the provider takes its
minute whole, the first one included, where a second's burst paced the first minute at
1/60 of it a second. A bucket of a minute admits up to two minutes' worth in one (full,
and refilled meanwhile), so the pace then also holds every trailing minute of sends to
the rate (:meth:`SendPace.by_minute`, the request log's sliding count). The test above
still guards a provider that counts a second. Why it pays: the morning peak with 96
slots and a real 2,400 behind the published 1,200 took 1.17x the oracle, its first
minute at the published pace (the published probe steps only once a minute bound);
spent at once, the minute binds within half of it (see ``docs/policy.md`` for the cells).

Not for: tokens. A token budget synced to a provider's bucket admits beyond its burst on
purpose (its credit, :mod:`anygate._gate.budget_sync`); a second's pace on sends would
undo that. Not thread-safe, no clock: the owner passes times and holds its lock.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from typing import TYPE_CHECKING, final

from .._config.limit_values import OVER_LIMIT_POLL_S, PROBE_GRACE_S
from .._gate.rate_math import EPSILON, admission_time, level_tat

if TYPE_CHECKING:
    from .._gate.rate import Rate
    from .window import SentLog

__all__ = ["SendPace"]

#: How long a send beyond the pace is remembered: a 429's answer comes within seconds
#: (the reject latency, at most 1 s in the simulator's scenarios); the minute covers the
#: slowest answer a per-minute window would still count.
_MEMORY_S = 60.0
#: At most this many remembered (a bounded memory: a fleet far beyond its pace for a
#: minute keeps the latest, which are the ones its 429s answer).
_KEPT = 4096


@final
class _Test:
    """A send beyond the pace and the sends of the second before it (the burst it ends),
    waiting for their answers (see the module docstring)."""

    __slots__ = ("accepted", "refused", "unanswered", "until", "within")

    def __init__(self, caller: object | None, until: float, burst: list[object | None]) -> None:
        self.until = until  # the end of its grace
        self.within = len(burst)  # sends within the pace (the test itself is beyond)
        # The burst's sends whose answer is still to come, the test's included.
        self.unanswered = {c for c in [*burst, caller] if c is not None}
        self.accepted = 0  # of the burst, sends the provider took
        self.refused = 0  # of the burst, sends turned away (any kind) or failed

    def answered(self, caller: object, *, taken: bool) -> bool | None:
        """Count ``caller``'s answer if it was one of the burst's: ``True`` once the
        provider took more than the pace, ``False`` once every answer came and it did
        not, ``None``: not yet."""
        if caller not in self.unanswered:
            return None
        self.unanswered.discard(caller)
        if taken:
            self.accepted += 1
        else:
            self.refused += 1
        if self.accepted > self.within:
            return True
        return None if self.unanswered else False


@final
class SendPace:
    """The gate's request rate over send instants (see the module docstring)."""

    __slots__ = (
        "_beyond",
        "_interval",
        "_minute",
        "_recent",
        "_tat",
        "_tau",
        "_test",
        "holds",
        "rate",
        "taken",
    )

    def __init__(self) -> None:
        self.rate: Rate | None = None  # the gate's rate this pace was last set from
        self._interval = 0.0  # seconds per request; 0: no pacing
        self._tau = 0.0  # the burst, in seconds of refill
        self._tat = -math.inf  # theoretical arrival time: full from the start
        # Whether sends are held to the pace: a 429 showed a window of a second.
        self.holds = False
        # Send times of the last minute that went beyond the pace (while not holding).
        self._beyond: deque[float] = deque()
        # Whether the provider took more than the pace (a test): no send is tested again.
        self.taken = False
        # Sends within the pace over the last burst (time, caller), until a test decides:
        # the burst a send beyond the pace ends.
        self._recent: deque[tuple[float, object | None]] = deque()
        self._test: _Test | None = None  # the test out, if any
        # The sends of the trailing minute, held to the rate: a minute at once (by_minute).
        self._minute: SentLog | None = None

    def by_minute(self, log: SentLog | None) -> None:
        """Hold every trailing minute of sends (``log``'s, a minute long) to the gate's
        rate: its request budget holds a minute (see the module docstring); ``None``:
        not any more."""
        self._minute = log

    @property
    def minute(self) -> bool:
        """Whether every trailing minute of sends is held to the rate (:meth:`by_minute`)."""
        return self._minute is not None

    @property
    def testing(self) -> bool:
        """Whether a test is out: :meth:`wait` holds sends beyond the pace until its
        answers (see the module docstring)."""
        return self._test is not None

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
        paced here, see the module docstring). Not holding, a send beyond the pace waits
        while a test is out, asking again every ``OVER_LIMIT_POLL_S``."""
        interval = self._interval
        if not interval:
            return 0.0
        minute = self._minute
        if minute is not None and (free := minute.free_at(at, 60.0 / interval)) is not None:
            return max(free - at, EPSILON)
        wait = admission_time(self._tat, at, 1.0, interval, self._tau) - at
        if wait <= EPSILON:
            return 0.0
        if self.holds:
            return wait
        test = self._test
        if test is None or at >= test.until:
            return 0.0  # beyond, and no test out: it is the test (or its grace ended)
        return min(wait, test.until - at, OVER_LIMIT_POLL_S)

    def sent(self, at: float, cost: float, caller: object | None) -> None:
        """A send went at ``at``: one request spent (beyond the pace, unless it holds: the
        test, if none is out)."""
        interval = self._interval
        if not interval:
            return
        tat = self._tat
        self._tat = (tat if tat > at else at) + interval  # charge(tat, at, 1, interval)
        if self.holds:
            return
        test = self._test
        if test is not None and at >= test.until:
            # Unanswered through its grace: taken, unless a send of its burst was refused.
            self._end(taken=test.refused == 0)
        # Beyond the pace: admission_time(tat, at, 1, interval, tau) - at > EPSILON, as
        # wait() asks, spelled out (a call per send costs more than the arithmetic).
        if tat - self._tau + min(interval, self._tau) - at <= EPSILON:
            if not self.taken:
                recent = self._recent
                while recent and (recent[0][0] < at - self._tau or len(recent) >= _KEPT):
                    recent.popleft()
                recent.append((at, caller))
            return
        beyond = self._beyond
        while beyond and (beyond[0] < at - _MEMORY_S or len(beyond) >= _KEPT):
            beyond.popleft()
        beyond.append(at)
        if not self.taken and self._test is None:
            burst = [c for sent, c in self._recent if sent >= at - self._tau]
            self._test = _Test(caller, at + PROBE_GRACE_S, burst)
            self._recent.clear()

    def answered(self, caller: object, *, taken: bool) -> None:
        """``caller``'s send was answered: accepted (``taken``), or turned away (a 429 of
        any kind) or failed. Counted if it was one of a test's burst."""
        test = self._test
        if test is not None and (decided := test.answered(caller, taken=taken)) is not None:
            self._end(taken=decided)

    def _end(self, *, taken: bool) -> None:
        self._test = None
        if taken:
            self.taken = True
            self._recent.clear()

    def rejected(self, at: float) -> None:
        """A 429 for the requests turned away the send of ``at``: if it went beyond the
        pace, the provider counts requests over a second, and the pace holds from now."""
        if self.holds or not self._beyond:
            return
        i = bisect.bisect_left(self._beyond, at - EPSILON)
        if i < len(self._beyond) and self._beyond[i] <= at + EPSILON:
            self.holds = True
            self._beyond.clear()
            self._recent.clear()
            self._test = None
