"""Sends held to a per-minute token limit's estimate: the token twin of :mod:`.requests`.

Why. A tokens-per-minute 429 says the provider's token counter for the window was full
when the rejected request arrived: the tokens it had counted plus the request's own did
not fit. The client knows what it sent in that window and what each send cost (the tokens
the gate charged at admission, ``acquire(tokens=)``: prompt plus ``max_tokens``, which is
what OpenAI and Azure count at admission). The tokens the provider accepted from this
client in the minute up to the rejected send bound the limit, as the request count does
for a requests-per-minute 429 (:mod:`.window`): it lies between that count and the count
plus the rejected send's tokens. The answer this replaces paced
the request rate to 0.7x the measured admission rate, growing, while the gate's token
budget refilled continuously and Azure's sliding 60 s token window gave back in lumps a
window later (Azure at 120,000 TPM, seeds 1-5: 1.199x the oracle, 1.17 % of calls with a
429; docs/simulate.md "Token cells").

What.

* :class:`TokenLog` keeps send times with their token costs, and those turned away: the
  tokens accepted in a trailing window, and when a full window has room for a send of a
  given cost (:meth:`TokenLog.free_at`).
* :class:`TokenLimit` holds sends to the estimate (a :class:`.WindowLimit` on tokens): a
  send goes only while the trailing minute's accepted tokens plus its own fit under it.
  After a confirmed rejection the estimate holds a minute, then grows back by one
  request's tokens (the rejected one's) per minute, as the request estimate grows by one
  request; each probe that finds the same limit again doubles that period (up to 10
  minutes): a raised limit is found again within minutes, and a limit that stands costs a
  429 per probe, ever rarer. A first rejection holds tentatively: the rejected call's own
  retry goes past the hold, and passing above what the rejection allows disproves it;
  otherwise it stands (it does not lapse after a window as the request one does).

Not a model of a token *bucket* (OpenAI's refills continuously): read on one with others
spending, the count at each 429 falls only a few thousand tokens at a time (the gate's
budget, synced to the reported ``remaining``, is what paces a bucket:
:mod:`anygate._limits.learn`). Not thread-safe: the caller passes times and holds a lock.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from typing import final

from .window import WindowLimit, finite_estimate

__all__ = ["TokenLimit", "TokenLog"]

#: A per-minute token limit's window: OpenAI's and Azure's TPM are counted per minute.
WINDOW_S = 60.0
#: The log compacts at most once per this many sends (amortises the list slicing).
_SLACK = 256
#: Added to a computed free time, as in :mod:`.window` (float rounding at the edge).
_SLACK_S = 1e-6
#: After a confirmed rejection the estimate holds for this many seconds, then grows by one
#: request's tokens per as many; each probe upward that finds the same limit again (a
#: rejection within one request's tokens of the last) doubles the period, up to
#: ``_MAX_GROWTH_S`` (the concurrency hold's 30 s -> 10 min doubling, DESIGN.md "upward
#: probes: the gap doubling after each failure"). At one request a minute for good, a
#: limit that stands cost one 429 a minute: 5 of 120 calls on the test provider holding
#: 20,000 tokens (tests/test_limits_tokens.py).
_GROWTH_S = 60.0
_MAX_GROWTH_S = 600.0


@final
class TokenLog:
    """Send times with their token costs, and the sends turned away, in a trailing window."""

    __slots__ = ("_cum", "_rej_cost", "_rej_time", "_rej_total", "_sent", "window_s")

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self._sent: list[float] = []  # nondecreasing send times
        # _cum[i] is the tokens of every send before _sent[i] (ever): one entry more than
        # _sent, so the tokens of _sent[a:b] are _cum[b] - _cum[a].
        self._cum: list[float] = [0.0]
        # Sends turned away, sorted by send time (their answers arrive out of send order).
        self._rej_time: list[float] = []
        self._rej_cost: list[float] = []
        self._rej_total = 0.0  # the tokens of every send turned away (ever)

    def sent(self, at: float, cost: float) -> None:
        """A request costing ``cost`` tokens went out at ``at``."""
        sent = self._sent
        if sent and at < sent[-1]:  # a clock read out of order across threads: keep order
            at = sent[-1]
        sent.append(at)
        self._cum.append(self._cum[-1] + cost)
        if len(sent) % _SLACK == 0 and sent[0] < at - 2 * self.window_s:
            self._compact(at)

    def rejected(self, at: float, cost: float) -> None:
        """The request sent at ``at`` costing ``cost`` was turned away: not counted."""
        index = bisect_right(self._rej_time, at)
        self._rej_time.insert(index, at)
        self._rej_cost.insert(index, cost)
        self._rej_total += cost

    def _turned(self, lo: int, hi: int) -> float:
        return sum(self._rej_cost[lo:hi])

    @property
    def accepted(self) -> float:
        """Tokens of every send so far not (yet) known turned away: the provider's
        total from this client, as it counts it (a published token rate's probe,
        :mod:`.published`, bounds the limit from below with differences of it)."""
        return self._cum[-1] - self._rej_total

    def held(self, at: float, span: float | None = None) -> float:
        """Tokens sent in ``(at - window_s, at]`` (or the ``span`` seconds up to ``at``)
        and not (yet) known turned away: the provider's sliding window at ``at`` as this
        client counts it.

        Sends at ``at`` itself count: under a virtual clock a release wave sends several
        at one instant, and counted without them (``[at - window_s, at)``, as
        :meth:`.SentLog.accepted` does) a 429 read a window short of a send, the retry of
        the rejected call then passed above that count and "disproved" it: a test
        provider holding 20,000 tokens saw 10 rejections in a row at 19,000.
        """
        lo = at - (self.window_s if span is None else span)
        sent, cum, times = self._sent, self._cum, self._rej_time
        start = bisect_right(sent, lo)
        end = bisect_right(sent, at, start)
        turned = self._turned(bisect_right(times, lo), bisect_right(times, at))
        return max(0.0, cum[end] - cum[start] - turned)

    def free_at(self, now: float, limit: float, cost: float) -> float | None:
        """When the window ending then has room for ``cost`` more tokens under ``limit``,
        if no more are sent: ``None`` if it has at ``now``.

        The window is ``(now - window_s, now]``. With ``excess`` = its tokens + ``cost`` -
        ``limit``, room comes ``window_s`` after the send that brings the tokens leaving
        it to ``excess``. A send larger than the limit waits for an empty window (of ours).
        """
        if limit == math.inf:
            return None
        sent, cum, times, costs = self._sent, self._cum, self._rej_time, self._rej_cost
        lo = now - self.window_s
        start = bisect_right(sent, lo)
        end = len(sent)
        first = bisect_right(times, lo)
        total = cum[end] - cum[start] - sum(costs[first:])
        excess = min(total + cost - limit, total)
        if excess <= 0:
            return None
        # The smallest i with accepted(sent[start:i]) >= excess (nondecreasing in i).
        low, high = start + 1, end
        while low < high:
            mid = (low + high) // 2
            turned = sum(costs[first : bisect_right(times, sent[mid - 1], first)])
            if cum[mid] - cum[start] - turned >= excess:
                high = mid
            else:
                low = mid + 1
        return sent[low - 1] + self.window_s + _SLACK_S

    def _compact(self, now: float) -> None:
        # As SentLog: no window asked about reaches two windows back.
        horizon = now - 2 * self.window_s
        cut = bisect_left(self._sent, horizon)
        self._sent = self._sent[cut:]
        self._cum = self._cum[cut:]
        keep = bisect_left(self._rej_time, horizon)
        self._rej_time = self._rej_time[keep:]
        self._rej_cost = self._rej_cost[keep:]


@final
class TokenLimit:
    """Sends' tokens and the token limit's estimate. No ceiling of its own: the gate's
    token budget (published or learned) already bounds what is sent."""

    __slots__ = ("_growth_s", "_limit", "_log", "_probe")

    def __init__(self) -> None:
        self._log = TokenLog(WINDOW_S)
        self._growth_s = _GROWTH_S  # one request's tokens per this long
        self._limit: WindowLimit | None = None  # made at the first rejection
        # The caller whose rejection is not confirmed yet: its retry goes past the hold
        # (as in RequestLimit: confirm a rejection by re-sending the rejected call).
        self._probe: object | None = None

    @property
    def limit(self) -> WindowLimit | None:
        """The estimate, once a tokens-per-minute rejection made one."""
        return self._limit

    def estimate(self, now: float) -> float | None:
        """The token limit sends are held to now, or ``None``."""
        return finite_estimate(self._limit, now)

    def held(self, at: float, span: float | None = None) -> float:
        """Tokens the provider accepted in the minute (or ``span`` seconds) up to ``at``,
        as this client counts them (:meth:`TokenLog.held`)."""
        return self._log.held(at, span)

    @property
    def accepted(self) -> float:
        """Tokens the provider accepted from this client so far (:attr:`TokenLog.accepted`)."""
        return self._log.accepted

    def wait(self, at: float, cost: float, caller: object | None = None) -> float:
        """Seconds until a send of ``cost`` tokens at ``at`` fits the estimated window
        (``0.0``: it fits now; nothing is counted, see :meth:`sent`)."""
        limit = self._limit
        if limit is None or cost <= 0:
            return 0.0
        estimate = limit.estimate(at)
        if caller is not None and caller is self._probe and not limit.confirmed:
            return 0.0  # the check: sent at the count that was turned away
        free = self._log.free_at(at, estimate, cost)
        return 0.0 if free is None else free - at

    def sent(self, at: float, cost: float, caller: object | None = None) -> None:
        """The send :meth:`wait` let go went out."""
        if cost > 0:
            self._log.sent(at, cost)
        if caller is not None and caller is self._probe:
            self._probe = None

    def passed(self, at: float, cost: float) -> None:
        """The attempt sent at ``at`` costing ``cost`` succeeded."""
        if self._limit is not None and cost > 0:
            self._limit.passed(max(0.0, self._log.held(at) - cost), cost)

    def turned_away(self, at: float, cost: float) -> None:
        """The attempt sent at ``at`` was throttled otherwise (its tokens were not counted)."""
        if cost > 0:
            self._log.rejected(at, cost)

    def rejected(self, at: float, cost: float, now: float, caller: object | None = None) -> bool:
        """A tokens-per-minute 429 for ``caller``'s attempt of ``cost`` tokens sent at
        ``at``; whether the estimate went down."""
        log = self._log
        log.rejected(at, cost)
        held = log.held(at)  # the rejected send itself is turned away: not in it
        limit = self._limit
        if limit is None:
            # Not disproved within a window, a rejection stands: the rejected call's retry
            # goes at a window that has moved on, so a real limit rarely says it twice,
            # and lapsing, the estimate let the window refill to a 429 every minute or two
            # (Azure at 120,000 TPM, seed 1: 7 of them, each lapsed).
            limit = self._limit = WindowLimit(WINDOW_S, math.inf)
        # The window held ``held`` and the send's ``cost`` did not fit: the limit lies in
        # ``[held, held + cost - 1]`` (a request's cost is 1: exactly ``count``), and in
        # ``[low, ...]`` from the passes. Held to the lowest value both allow. Taking a
        # rejection at ``held < low`` for noise, as a request count is, took 6 of 7 on
        # Azure at 120,000 TPM (seed 1) for noise: smaller sends fail at smaller counts.
        top = held + cost - 1
        count = 0.0 if held <= 0 else top if top < limit.low else max(held, limit.low)
        if limit.confirmed and limit.high != math.inf and abs(count - limit.high) <= cost:
            self._growth_s = min(2 * self._growth_s, _MAX_GROWTH_S)  # the same limit again
        elif count > 0:
            self._growth_s = _GROWTH_S
        # Grow back by one request's tokens per _growth_s (the module docstring).
        limit.growth = max(1.0, cost) * WINDOW_S / self._growth_s
        changed = limit.rejected(count, now, top)
        if limit.confirmed:
            # Growth starts a period later: the estimate sits at the largest window that
            # passed (``low``), within a request of the limit, so growing at once probed
            # past it within a minute (Azure at 120,000 TPM, seeds 1-3, with the gate at
            # the whole limit: 1.67 % -> 0.67 % of calls with a 429, 1.063x -> 1.062x).
            limit.estimated_at = now + self._growth_s
        if not limit.confirmed:
            self._probe = caller
        return changed
