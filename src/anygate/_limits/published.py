"""Probing a published request or token rate upward: a published limit is a starting point.

Why. A policy whose rate is the provider's *published* limits (``rate_is_ceiling=False``)
paced the gate's requests to them for good where no rate-limit headers say more: a
provider that allows a tier more (2,400 requests a minute behind a published 1,200, 96
slots) took 1.54x the oracle's makespan in ``anygate simulate`` at the published pace
(the capped peers 2.1x). Headers, where the provider sends them, replace the published
rate (:mod:`anygate._limits.learn`); without them, only trying more says whether more is
allowed.

What. :class:`PublishedProbe` steps the gate's requests per minute up by ``GROWTH`` each
time the rate has bound: the published one for a whole minute (the requests the provider
accepted from this gate in the trailing minute reached ``BIND`` of it), a stepped one
that stood over the last ``BIND_S`` (see below). Its
per-minute count is then full at that rate, so a published rate that is the real one
answers the step with a 429 at its first sends; the probe then ends, the rate goes back
to the last one that drew none, and the request estimate (:mod:`.requests`) holds sends
to what the provider counted and probes above it at its own slower rate. Stepped
sooner (after 10 s of binding), the step came while the provider's minute was still
filling: sends bunched into the first part of each minute, and at 96 slots with the
published 1,200 the real one, seeds 1-5 went 1.009x -> 1.031x the oracle (now 1.007x);
the cost of the minute is the tier above's first minute at the published rate (1.54x ->
1.19x; 1.02x stepping sooner). Only the first step is that gamble: once a step stood,
the stepped rate steps again when it binds over the last ``BIND_S`` seconds (as the
token rate does), not after a whole minute at it; a 429 then still ends the probe at the
last rate that drew none. Waiting a minute at each, the morning peak x10 (320 slots,
12,000 real) behind a published 1,200 reached its slots after 185 s (1.327x the oracle,
seeds 1-3); stepping on, after 100 s (1.147x: the first minute's cost; docs/policy.md
has the other cells). A rate set by anyone else (the header learner, the user) ends the
probe too.

Tokens. :class:`TokenProbe` steps a published token rate the same way, but a token
bucket (OpenAI's refills continuously) starts full: a step to twice the real limit
passes on that surplus for a minute before the first 429, so passing says little (kept
as good, tier-1 without headers got 12 % of calls a 429). What the tokens accepted
*prove* stands instead: a bucket of ``c`` a minute accepts at most ``c`` plus ``c`` a
minute, and a sliding minute (Azure's) no more, so the tokens accepted since a step over
``1 +`` its minutes bound the limit from below, and equal it once a step has drained a
full bucket. The rate steps while it binds (over the last ``BIND_S``), a second step
only once the first is proven to have found more than the rate below it; the first 429
that may be the tokens' (one that says so, or one that says nothing) ends the probe at
the proven rate. A stated limit (headers, or a 429's words) ends it as well: the
provider's own number is the learner's (:mod:`anygate._limits.learn`). Without headers,
``openai-tier1-tpm`` with its project a tier above the published 200,000 TPM (400,000)
went 2.07x -> 1.015x the oracle (seeds 1-3), 300,000 (tuning) 1.47x -> 1.010x, and
1,000,000 6.9x -> 2.0x (a short run: each step's proof takes a minute); at the published
200,000, or a tier below, unchanged.

Not for: a rate that is a ceiling (``rate_is_ceiling=True``, the default), or a gate
whose requests are not paced. Not thread-safe: the caller holds the adaptive limit's lock.
"""

from __future__ import annotations

import math
from typing import final

__all__ = ["BIND", "BIND_S", "GROWTH", "PublishedProbe", "TokenProbe"]

#: A step multiplies the rate by this: the real limit is found within ``log2(real /
#: published)`` minutes of binding (a tier above: one).
GROWTH = 2.0
#: The rate binds when the trailing minute accepted this share of it: a gate paced at
#: ``r`` admits at most ``r`` and a burst a minute, and demand below it leaves slack.
BIND = 0.95
#: A per-minute limit's window, for the token probe's proof (OpenAI's and Azure's TPM).
WINDOW_S = 60.0
#: A token rate (and a stepped request rate) binds when the last this many seconds
#: accepted ``BIND`` of it. Not a whole minute as for the published request rate: the
#: step's proof holds whenever it comes (a bucket's start-up surplus is in it), and on
#: the token tuning cells without headers (hidden TPM
#: 150,000 and 300,000, plain 429s at 200,000 and 300,000; seeds 1-3) a minute took
#: 1.035x / 1.036x the oracle at 300,000, 20 s 1.014x / 1.017x, 10 s 1.010x / 1.009x,
#: 5 s 1.009x / 1.016x (the others within 0.005x throughout).
BIND_S = 10.0
#: While the rate does not bind, whether it does is asked again this often (successes
#: call in at every answer; this bounds the work to one look a second).
_RECHECK_S = 1.0


class _Probe:
    """What the request and token probes share: the rate each last set, and its end."""

    __slots__ = ("_set", "ended", "next_at")

    def __init__(self, rate: float) -> None:
        self._set = rate  # the rate this probe last set (or found)
        self.ended = False
        self.next_at = -math.inf  # when to look next (at the first success: at once)

    def _live(self, rate: float | None) -> float | None:
        """``rate`` if the probe goes on from it; ``None`` once it ended, or when another
        hand (the header learner, the user) set the rate since: it is theirs then."""
        if self.ended:
            return None
        if rate is None or rate != self._set:
            self.ended = True
            return None
        return rate


@final
class PublishedProbe(_Probe):
    """The upward probe of one gate's published request rate (see the module docstring)."""

    __slots__ = ("_good", "_stepped_at")

    def __init__(self, rate: float) -> None:
        super().__init__(rate)
        self._good = rate  # the last rate that drew no 429
        self._stepped_at = -math.inf  # when the rate was last stepped

    @property
    def good(self) -> float:
        """The last rate that drew no 429 (the published one until a step stood)."""
        return self._good

    def step(
        self, now: float, accepted: int, rate: float | None, rejected: bool, recent: int = 0
    ) -> float | None:
        """The gate's next requests per minute, or ``None`` to leave it.

        Args:
            now: the time of the look (a success's answer).
            accepted: requests the provider accepted in the minute before ``now``.
            rate: the gate's requests per minute now.
            rejected: whether a per-minute 429 has taught the request estimate.
            recent: requests it accepted in the ``BIND_S`` seconds before ``now``: once a
                step stood, the stepped rate binds when these reach ``BIND`` of its
                ``BIND_S`` (see the module docstring).
        """
        rate = self._live(rate)
        if rate is None:
            return None
        if rejected:
            self.ended = True
            return self._good if self._good != rate else None
        # A step that stood binds again over BIND_S: the first is the only gamble. (A
        # step keeps the rate it left as the good one: stepped, the two differ.) Stood:
        # the whole of those BIND_S seconds at it. Counted from before the step, the
        # sends the rate below let go read as the step's: the peak x10 (12,000 a minute
        # published and real) sent 4,464 in the 10 s before its first step, at 79.4 s,
        # and a second later 24,000 had "stood"; the minute's 429 at 12,000 then read
        # as one for a second at a rate it was not paced at, and the pace held a second's
        # 400 from then on (with 960 slots, seed 2: 1.050x the oracle).
        stood = (
            rate != self._good
            and now - self._stepped_at >= BIND_S
            and recent >= BIND * rate * BIND_S / WINDOW_S
        )
        if accepted < BIND * rate and not stood:
            self.next_at = now + _RECHECK_S
            return None
        self._good = rate
        self._set = rate * GROWTH
        self._stepped_at = now
        self.next_at = now + _RECHECK_S
        return self._set


@final
class TokenProbe(_Probe):
    """The upward probe of one gate's published token rate (see the module docstring):
    a step stands only as far as the tokens accepted since prove it."""

    __slots__ = ("_good", "_steps")

    def __init__(self, rate: float) -> None:
        super().__init__(rate)
        self._good = rate  # the most the tokens accepted prove (or the published rate)
        # (time, tokens accepted by then) at each step: where each proof counts from.
        self._steps: list[tuple[float, float]] = []

    @property
    def stepped(self) -> bool:
        """Whether the probe set the rate above the published one, and is still on."""
        return not self.ended and bool(self._steps)

    def proven(self, now: float, accepted: float) -> float:
        """The most tokens a minute the provider is proven to allow: over each span since
        a step, the tokens it accepted from this client divided by ``1 +`` the span in
        minutes. A bucket of ``c`` a minute that refills continuously (OpenAI's) accepts
        at most ``c`` (full at the start) plus ``c`` a minute; a sliding minute
        (Azure's) no more either. So it never exceeds the real limit, and once a step
        drains a full bucket, it is the limit."""
        best = self._good
        for at, before in self._steps:
            span = now - at
            if span > 0:
                best = max(best, (accepted - before) / (1.0 + span / WINDOW_S))
        return best

    def step(
        self, now: float, recent: float, accepted: float, rate: float | None, rejected: bool
    ) -> float | None:
        """The gate's next tokens per minute, or ``None`` to leave it.

        Args:
            now: the time of the look (a success's answer, or a tokens 429).
            recent: tokens the provider accepted in the ``BIND_S`` seconds before ``now``.
            accepted: tokens it accepted from this client so far.
            rate: the gate's tokens per minute now.
            rejected: whether a tokens-per-minute 429 has taught the token estimate.
        """
        rate = self._live(rate)
        if rate is None:
            return None
        if rejected:
            # The step found the limit (a bucket runs dry a while after it: a full one of
            # ``c`` at ``2c`` in a minute): back to what the tokens prove, never above.
            self.ended = True
            back = min(rate, self.proven(now, accepted))
            return back if back != rate else None
        self.next_at = now + _RECHECK_S
        if recent < BIND * rate * BIND_S / WINDOW_S:
            return None
        if self._steps:
            # Stepped before: step again only once the last step is proven to have found
            # more than the rate below it, by ``1 - BIND`` (sends in flight count as
            # accepted until answered).
            at, before = self._steps[-1]
            below = rate / GROWTH
            if accepted - before < (2.0 - BIND) * below * (1.0 + (now - at) / WINDOW_S):
                return None
        self._good = self.proven(now, accepted)
        self._steps.append((now, accepted))
        self._set = rate * GROWTH
        return self._set
