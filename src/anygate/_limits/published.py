"""Probing a published request rate upward: a published limit is a starting point.

Why. A policy whose rate is the provider's *published* limits (``rate_is_ceiling=False``)
paced the gate's requests to them for good where no rate-limit headers say more: a
provider that allows a tier more (2,400 requests a minute behind a published 1,200, 96
slots) took 1.54x the oracle's makespan in ``anygate simulate`` at the published pace
(the capped peers 2.1x). Headers, where the provider sends them, replace the published
rate (:mod:`anygate._limits.learn`); without them, only trying more says whether more is
allowed.

What. :class:`PublishedProbe` steps the gate's requests per minute up by ``GROWTH`` each
time the rate (published, or last stepped) has bound for a whole minute: the requests
the provider accepted from this gate in the trailing minute reached ``BIND`` of it. Its
per-minute count is then full at that rate, so a published rate that is the real one
answers the step with a 429 at its first sends; the probe then ends, the rate goes back
to the last one that drew none, and the request estimate (:mod:`.requests`) holds sends
to what the provider counted and probes above it at its own slower rate. Stepped
sooner (after 10 s of binding), the step came while the provider's minute was still
filling: sends bunched into the first part of each minute, and at 96 slots with the
published 1,200 the real one, seeds 1-5 went 1.009x -> 1.031x the oracle (now 1.007x);
the cost of the minute is the tier above's first minute at the published rate (1.54x ->
1.19x; 1.02x stepping sooner). A rate set by anyone else (the header learner, the user)
ends the probe too.

Not for: tokens (a token budget without headers is left at its published rate: tried,
a provider's token bucket starts full, a minute at twice the published rate passed on
that surplus and was kept as good, and tier-1 without headers got 12 % of calls a 429), a rate
that is a ceiling (``rate_is_ceiling=True``, the default), or a gate whose requests are
not paced. Not thread-safe: the caller holds the adaptive limit's lock.
"""

from __future__ import annotations

import math
from typing import final

__all__ = ["BIND", "GROWTH", "PublishedProbe"]

#: A step multiplies the rate by this: the real limit is found within ``log2(real /
#: published)`` minutes of binding (a tier above: one).
GROWTH = 2.0
#: The rate binds when the trailing minute accepted this share of it: a gate paced at
#: ``r`` admits at most ``r`` and a burst a minute, and demand below it leaves slack.
BIND = 0.95
#: While the rate does not bind, whether it does is asked again this often (successes
#: call in at every answer; this bounds the work to one look a second).
_RECHECK_S = 1.0


@final
class PublishedProbe:
    """The upward probe of one gate's published request rate (see the module docstring)."""

    __slots__ = ("_good", "_set", "ended", "next_at")

    def __init__(self, rate: float) -> None:
        self._set = rate  # the rate this probe last set (or found)
        self._good = rate  # the last rate that drew no 429
        self.ended = False
        self.next_at = -math.inf  # when to look next (at the first success: at once)

    def step(self, now: float, accepted: int, rate: float | None, rejected: bool) -> float | None:
        """The gate's next requests per minute, or ``None`` to leave it.

        Args:
            now: the time of the look (a success's answer).
            accepted: requests the provider accepted in the minute before ``now``.
            rate: the gate's requests per minute now.
            rejected: whether a per-minute 429 has taught the request estimate.
        """
        if self.ended:
            return None
        if rate is None or rate != self._set:
            self.ended = True  # another hand set the rate: it is theirs now
            return None
        if rejected:
            self.ended = True
            return self._good if self._good != rate else None
        if accepted < BIND * rate:
            self.next_at = now + _RECHECK_S
            return None
        self._good = rate
        self._set = rate * GROWTH
        self.next_at = now + _RECHECK_S
        return self._set
