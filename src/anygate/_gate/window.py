"""A sliding token window: the gate's token budget where the provider counts one.

Azure OpenAI does not refill a bucket: each request's estimate (prompt + ``max_tokens``)
counts against the deployment's TPM quota from its admission until a minute later
(learn.microsoft.com, Azure OpenAI "Quotas and limits"; stuartleeks/aoai-simulated-api's
``SlidingWindow``), so capacity comes back in the lumps it was spent in. A GCRA budget
paces such a window at best at its limit's rate, one window behind a client that spends
the window whenever it is free (issue 30: the Azure-rule cells paced at ~83 % of the
limit, 1.19x-1.21x the oracle). :class:`TokenWindow` keeps the gate's own charges with
their expiry and admits whatever fits the window, as the provider does.

What others on the key spend (and any charge the provider counted that the gate did
not) is learned from the ``remaining`` header: :meth:`TokenWindow.sync` adds it as a
*phantom* entry expiring a window after the report's request was sent (the latest it
can). Nothing is given back on a settle: the provider keeps the estimate it charged at
admission. Not thread-safe and not public: ``Budgets`` owns one under the gate's lock,
once a provider's reports show a sliding window (``RateLearner``).
"""

from __future__ import annotations

import bisect
import math

__all__ = ["TokenWindow"]

# Float slack when comparing a window's use with its capacity (as split.Bucket's).
_SLACK = 1e-6


class TokenWindow:
    """At most ``capacity`` tokens charged in any ``window_s`` seconds.

    Entries are ``(expiry, seq, tokens)``, sorted by expiry; ``seq`` is the gate's
    ``tok_spent`` after the charge, so a :class:`~anygate._gate.rate.BudgetMark` (which
    holds ``tok_spent``) tells which entries a report had counted even when many were
    admitted at the same instant. Expired entries are kept one more window, as the
    history a late report is synced against.
    """

    __slots__ = ("_entries", "_live", "_used", "capacity", "hold", "window_s")

    def __init__(self, capacity: float, window_s: float = 60.0) -> None:
        self.capacity = capacity
        self.window_s = window_s
        self.hold = -math.inf  # no admission before this (a provider's drained report)
        self._entries: list[tuple[float, float, float]] = []
        self._live = 0  # index of the first unexpired entry
        self._used = 0.0  # tokens of the unexpired entries

    def __repr__(self) -> str:
        return f"<TokenWindow {self._used:g}/{self.capacity:g} per {self.window_s:g}s>"

    def _purge(self, now: float) -> None:
        entries, live = self._entries, self._live
        while live < len(entries) and entries[live][0] <= now:
            self._used -= entries[live][2]
            live += 1
        if live == len(entries):
            self._used = 0.0  # no float residue once the window is empty
        # Drop history older than a window (no report that old is synced).
        old = bisect.bisect_right(entries, (now - self.window_s, math.inf, math.inf), 0, live)
        if old:
            del entries[:old]
            live -= old
        self._live = live

    def left(self, now: float) -> float:
        """Tokens the window still admits at ``now`` (negative when over)."""
        self._purge(now)
        return self.capacity - self._used

    def at(self, now: float, tokens: float) -> float:
        """The earliest time ``>= now`` at which ``tokens`` fit the window.

        A cost above the capacity waits for an empty window (as a GCRA budget lets a cost
        above its burst through on a full budget).
        """
        self._purge(now)
        start = max(now, self.hold)
        excess = self._used + min(tokens, self.capacity) - self.capacity
        if excess <= _SLACK:
            return start
        entries = self._entries
        for i in range(self._live, len(entries)):
            excess -= entries[i][2]
            if excess <= _SLACK:
                return max(start, entries[i][0])
        return max(start, entries[-1][0])  # only float residue is left

    def add(self, at: float, seq: float, tokens: float) -> None:
        """Charge ``tokens`` admitted at ``at`` (``seq``: the gate's ``tok_spent`` after it)."""
        if tokens <= 0:
            return
        self._purge(at)
        entry = (at + self.window_s, seq, tokens)
        entries = self._entries
        if not entries or entries[-1] <= entry:
            entries.append(entry)
        else:
            bisect.insort(entries, entry, lo=self._live)
        self._used += tokens

    def give_back(self, tokens: float) -> None:
        """Remove ``tokens`` of the newest charges (an admission given back whole)."""
        entries = self._entries
        while tokens > 0 and len(entries) > self._live:
            expiry, seq, units = entries[-1]
            taken = min(units, tokens)
            tokens -= taken
            self._used -= taken
            if taken < units:
                entries[-1] = (expiry, seq, units - taken)
            else:
                entries.pop()

    def sync(self, now: float, sent_at: float, seq: float, remaining: float) -> bool:
        """The provider had ``remaining`` left when the request of mark ``(sent_at, seq)``
        was counted: charge what it counted beyond our own entries; ``True`` if any.

        Our entries it counted are those charged by then (``seq`` or less) and unexpired
        at ``sent_at``; the rest of ``capacity - remaining`` was spent by others (or
        counted there and not here) and becomes a phantom entry expiring at
        ``sent_at + window_s``, the latest it can. Only ever lowers the level.
        """
        self._purge(now)
        if sent_at + self.window_s <= now:
            return False  # all of it has expired by now
        counted = sum(
            units
            for expiry, entry_seq, units in self._entries
            if entry_seq <= seq and expiry > sent_at
        )
        other = self.capacity - counted - remaining
        if other <= _SLACK:
            return False
        entry = (sent_at + self.window_s, seq, other)
        bisect.insort(self._entries, entry, lo=self._live)
        self._used += other
        return True
