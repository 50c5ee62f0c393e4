"""The windows a send is held to, behind one interface (issue 30 item 6).

Why. Five limits hold an attempt back after it got its slot and before it goes to the
provider: the slope rule (how fast the request rate may grow, :mod:`.slope`), the waves a
throttled herd is released in (:mod:`.release`), the per-minute token and request
estimates (:mod:`.tokens`, :mod:`.requests`), and, once a 429 showed the provider counts a
second, the gate's request rate over send instants (:mod:`.pace`). Each answers the same
two questions about a send at ``at`` costing ``cost`` tokens: how long it must wait, and
(once every limit lets it go) that it went. As Netflix concurrency-limits keeps Vegas, Gradient2 and AIMD behind
its ``Limit``, the owner asks them in turn through :class:`SendLimit` and knows none of
their rules; each keeps its own arithmetic and evidence.

What. :class:`Sends`: the five, with the request log the slope reads, and the answers the
policy feeds them (a pass, a send turned away, a per-minute 429 of either unit, a full
window's edge). :meth:`Sends.wait` asks every limit and counts nothing;
:meth:`Sends.sent` records the send in every one once none holds it.

Not thread-safe, no clock of its own: the caller passes times and holds a lock.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, final

from .pace import SendPace
from .published import BIND
from .requests import WINDOW_S, RequestLimit
from .slope import SlopeLimit
from .slope_fit import MIN_PREVIOUS, WINDOWS
from .tokens import TokenLimit

if TYPE_CHECKING:
    from .release import Release

__all__ = ["SendLimit", "Sends"]


class SendLimit(Protocol):
    """A limit a send is held to: how long one more must wait, and that one went."""

    def wait(self, at: float, cost: float, caller: object | None) -> float:
        """Seconds until a send at ``at`` costing ``cost`` tokens (``caller``'s attempt)
        fits this limit; ``0.0``: it fits now. Counts nothing."""
        ...

    def sent(self, at: float, cost: float, caller: object | None) -> None:
        """The send every limit let go went out."""
        ...


@final
class Sends:
    """The slope, a release, the token and the request limit, and the send pace; see the
    module docstring."""

    __slots__ = ("pace", "release", "requests", "slope", "tokens")

    def __init__(self) -> None:
        self.requests = RequestLimit()
        self.tokens = TokenLimit()
        self.slope = SlopeLimit(self.requests.log)
        self.requests.slope = self.slope  # its window: how long a threshold's test waits
        # The release after a pause that turned a herd away (issue 26), while it lasts.
        self.release: Release | None = None
        # The gate's request rate over send instants, asked last (:mod:`.pace`).
        self.pace = SendPace()

    def wait(self, at: float, cost: float, caller: object | None, held: int) -> float:
        """Seconds until a send at ``at`` costing ``cost`` fits every limit, asked in
        order (the first that holds it answers); ``held``: attempts held back now, a
        release's end (:meth:`.Release.over`)."""
        wait = self.slope.wait(at, cost, caller)
        if wait > 0:
            return wait
        release = self.release
        if release is not None:
            if release.over(at, held):
                self.release = None
            elif (wait := release.wait(at, cost, caller)) > 0:
                return wait
        for limit in (self.tokens, self.requests):
            wait = limit.wait(at, cost, caller)
            if wait > 0:
                return wait
        pace = self.pace
        return pace.wait(at, cost, caller) if pace.holds or pace.testing or pace.minute else 0.0

    def sent(self, at: float, cost: float, caller: object | None) -> None:
        """The send :meth:`wait` let go went out."""
        if self.release is not None:
            self.release.sent(at, cost, caller)
        self.tokens.sent(at, cost, caller)
        self.requests.sent(at, cost, caller)
        self.pace.sent(at, cost, caller)

    def passed(self, at: float, cost: float, *, requests: bool = True) -> None:
        """The attempt sent at ``at`` costing ``cost`` succeeded: a lower bound for the
        per-minute estimates (no work before their first rejection); ``requests=False``:
        the request estimate heard it already (:meth:`.SendPath.accepted`)."""
        if requests and self.requests.listening:
            self.requests.passed(at)
        if cost and self.tokens.limit is not None:
            self.tokens.passed(at, cost)

    def turned_away(self, at: float, cost: float, *, refused: bool = False) -> None:
        """The attempt sent at ``at`` was throttled (not by a per-minute limit): the
        provider counted it in no window; ``refused``: the slots turned it away, and the
        request window may have counted it (:meth:`.SentLog.refused`)."""
        self.requests.turned_away(at, refused=refused)
        if cost:
            self.tokens.turned_away(at, cost)

    def rejected(
        self,
        unit: str,
        at: float,
        cost: float,
        now: float,
        caller: object,
        paced: float | None = None,
        *,
        stated: bool = True,
        quoted: float | None = None,
    ) -> None:
        """A per-minute 429 that counted ``unit`` (``"requests"`` or ``"tokens"``) for
        ``caller``'s attempt sent at ``at`` costing ``cost``, with requests ``paced`` at
        that many a minute: that estimate learns from its window; the other only hears
        that the send filled no window. ``stated=False``: the 429 did not name ``unit``
        (its count did); ``quoted``: the request limit it quoted, its window full."""
        if unit == "tokens" and cost:
            self.tokens.rejected(at, cost, now, caller)
            self.requests.turned_away(at)
        else:
            self.requests.rejected(at, now, caller, paced, stated=stated, quoted=quoted)
            # The minute held the paced rate (as a published rate binds): a per-minute
            # limit explains the 429, whatever the second held.
            full = paced is not None and self.requests_in_minute(at) >= BIND * paced
            if not full:
                self.pace.rejected(at)
            if cost:
                self.tokens.turned_away(at, cost)

    def edge(self, after: float, at: float) -> None:
        """A full slope window ended in ``(after, at]`` (:meth:`.SlopeLimit.edge`)."""
        self.slope.edge(after, at)

    def requests_in_minute(self, at: float) -> int:
        """Requests the provider accepted in the minute before ``at``."""
        return self.requests.log.count(at - WINDOW_S, at)

    def steep(self, at: float) -> bool:
        """Whether a slope rule, not yet learned, could have turned a send at ``at`` away:
        the trailing slope window held more than the one before it."""
        return not self.slope.known and self.rising(at)

    def rising(self, at: float) -> bool:
        """Whether the trailing window of the slope rule's length (:attr:`.SlopeLimit.window_s`,
        learned or not) held more of ours at ``at`` than the one before it."""
        log, window = self.requests.log, self.slope.window_s
        return log.count(at - window, at) > log.count(at - 2 * window, at - window)

    def sloped(self, at: float) -> bool:
        """Whether a slope rule could have turned a send at ``at`` away. Once learned,
        unless the send went well inside its allowance (:meth:`.SlopeLimit.inside`).
        Before: the trailing window held more than the one before it (:meth:`rising`),
        or over some window a provider may count in (:data:`.slope_fit.WINDOWS` shorter
        than the minute) the one before the trailing one held fewer than
        :data:`.slope_fit.MIN_PREVIOUS` of ours: a window after a quiet one may hold the
        rule's floor whatever its growth (a 30 s window's floor of 60 looked like 60
        requests a minute from the first window on)."""
        slope = self.slope
        if slope.known:
            return not slope.inside(at)
        if self.rising(at):
            return True
        log = self.requests.log
        return any(
            log.count(at - 2 * window, at - window) < MIN_PREVIOUS
            for window in WINDOWS
            if window < WINDOW_S
        )
