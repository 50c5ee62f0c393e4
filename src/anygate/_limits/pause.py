"""The burst-rate pause and its probe: after a slope throttle, everyone waits, one tries.

Why. A burst-rate 429 says the provider's current window is spent; every attempt sent
into it gets the same answer a reject latency later. So the gate stops admitted attempts
for ``pause_s`` (or the provider's Retry-After), and when the pause is over lets **one**
attempt go first, the *probe*: its success ends the pause for everyone, another burst 429
starts a new pause, anything else (an error, a cancellation) hands the probe role on. A
pause that ended with everyone at once would send the whole queue into a window that may
still be spent.

While the slope rule is known (:mod:`anygate._limits.slope`) the probe need not be waited
for to the end: a probe not turned away within its grace (from when it went) has likely
got past the provider's rate check (a throttle comes back in a reject latency, a success
may take the whole generation time), and the learned slope decides how fast the others
go. Its send is the spent window's edge (:attr:`BurstPause.edge`) only once it is accepted
or succeeds: one turned away after its grace went inside the full window.

With pacing, a first burst throttle is only *checked* (:meth:`BurstPause.check`): a pause
of no length whose probe goes at once, the others waiting its grace (twice the throttle's
own answer time). One 429 could be anyone's: a provider's shared pool turns a share of
requests away whatever this client does, and a gate that paused (and cut its rate) at
every such throttle crawled (measured: 2.97x the oracle's makespan with 5 % of arrivals
turned away at random). A spent window turns the probe away too, within its grace; that
confirms the throttle, and the pause and the cut follow. Its cost where the window is
spent: one more call with a 429, and a reject latency. A check whose probe got through
was noise (``BurstPause._noisy``): until a throttle is confirmed again (two slope
windows after the noise), a check needs its probe turned away twice, which took the shared pool's 1.16x to 1.02x and left the
storm benchmark's tuning set as it was. Or the window ended between the throttle and the
probe: the probe's send is still handed on as an edge (:attr:`BurstPause.edge`, marked a
check's), and the owner takes it only after a run of sends turned away (see
:meth:`anygate._limits.burst.BurstAnswer._learn_edge`).

The probe is the throttled call's own retry, for a check and (issue 30) for a pause:
the turned-away probe asks again, with a slot a held caller hands it (:mod:`.handoff`),
so a spent window costs one call its 429s, not one fresh call per probe. Before, each
pause's probe was the first attempt to ask; a 30 s burst window's first minute turned 12
calls away with 19 probes (seed 3), and 1.04 % of the run's calls got a 429. A call past
half its throttle budget hands the role on (:meth:`disown`), so it is never spent on the
others.

What. One :class:`BurstPause` per :class:`~anygate._limits.adaptive.AdaptiveLimit`: the
pause's state and its transitions. Every method except :attr:`pausing` (a flag read
without the lock on the hot path) and :meth:`wait` runs under the adaptive limit's lock,
which also guards the limit and the generation a throttle changes at the same moment.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, final

from .._config.limit_values import PROBE_RESERVE_S, probe_grace
from .._gate.latch import Latch
from .handoff import SlotHandoff

if TYPE_CHECKING:
    from .._gate.token import Token

__all__ = ["YIELD", "BurstPause"]

#: :meth:`BurstPause.passing`'s wait for "hand your slot to the call the probe is kept
#: for, then queue again ahead of fresh calls" (:mod:`.handoff`; a wait is never < 0).
YIELD = -1.0


@final
class BurstPause:
    """The pause state of one adaptive limit (see the module docstring); not public.

    Not thread-safe on its own: the owner calls every method under its lock, except the
    unlocked :attr:`pausing` read and :meth:`wait`.
    """

    __slots__ = (
        "_check_grace",
        "_handoff",
        "_herd",
        "_late",
        "_noise_seen",
        "_noisy",
        "_owner",
        "_owner_until",
        "_paused_since",
        "_probe_caller",
        "_probe_out",
        "_probe_sent",
        "_reject_s",
        "_resume",
        "_strikes",
        "_until",
        "edge",
        "pausing",
        "release",
    )

    def __init__(self, name: str) -> None:
        #: Whether a pause lasts or its probe is out; read without the lock on the hot path
        #: (a stale ``True`` is checked again under the lock, a stale ``False`` lets one
        #: attempt through that was admitted as the pause began).
        self.pausing = False
        self._until = -math.inf
        self._probe_out = False
        self._probe_sent = -math.inf
        self._probe_caller: object | None = None  # who holds the probe (passing's caller)
        # A pause (or check) ended by its probe's grace: (the probe's caller, its send,
        # whether it was a check) until the probe is accepted (then its send is the edge,
        # see probe_succeeded).
        self._late: tuple[object | None, float, bool] | None = None
        self._reject_s = 0.0  # the slowest burst 429 a probe got (pacing's probe grace)
        self._resume = Latch(name)  # shut while a pause lasts
        # A check (not a pause): its probe's grace; None for a pause.
        self._check_grace: float | None = None
        self._strikes = 0  # the current check's probes turned away so far
        # A check ended without its probe turned away (a 429 that was noise) since the last
        # confirmed throttle: the next check needs two probes turned away, not one.
        self._noisy = False
        # When a check's probe last got through (noise, or an edge it crossed).
        self._noise_seen = -math.inf
        # When the current pause (or check) began: a new one counts its herd afresh.
        self._paused_since: float | None = None
        # The call whose throttle started this check (its Run), and until when the probe is
        # kept for it. Why (issue 26): a throttle answered in zero time comes back
        # before the next caller is even admitted, so "the first to ask" was a *fresh*
        # call; a provider (or a fake) that turns away each call's first attempt then
        # confirmed every check and failed every pause's probe, one caller per pause_s (40
        # callers took minutes). Re-sending the rejected call itself asks the provider the
        # question that was asked (and costs no other call a 429); only it can tell a
        # spent window from a turned-away request.
        self._owner: object | None = None
        self._owner_until = -math.inf
        # The owner's retry, with no slot, waits for one a held caller hands over.
        self._handoff = SlotHandoff(f"{name} (probe's slot)")
        #: The send time of the probe that ended the last pause or check (it got past the
        #: provider's rate check, so a spent window had ended by then) and whether it was a
        #: check's, until the owner takes it (:meth:`take_edge`).
        self.edge: tuple[float, bool] | None = None
        # Burst 429s since the pause (or check) began, and, once a pause that turned more
        # than one away ended on its probe's answer, ``(when, the probe's round trip,
        # those 429s)`` until the owner takes it: its release (anygate._limits.release).
        self._herd = 0
        self.release: tuple[float, float, int, bool] | None = None

    def left(self, now: float) -> float:
        """Seconds of pause left (0 while only the probe is out, or with no pause)."""
        return max(0.0, self._until - now) if self.pausing else 0.0

    def lasts(self, now: float) -> bool:
        """Whether the pause itself (not only its probe) is on at ``now``."""
        return self.pausing and now < self._until

    @property
    def checking(self) -> bool:
        """Whether a first throttle's check is on (its probe out or about to go)."""
        return self.pausing and self._check_grace is not None

    def probe_due(self, now: float) -> bool:
        """Whether a check's probe may go at ``now`` and has not gone yet."""
        return self.checking and not self._probe_out and now >= self._until

    def keep(self, now: float) -> float:
        """A check's probe waits (for the provider's slots to free): keep it for its
        owner meanwhile; the seconds the others wait before asking again."""
        if self._owner is not None:
            self._owner_until = max(self._owner_until, now + PROBE_RESERVE_S)
        return self._check_grace or PROBE_RESERVE_S

    def not_noise(self) -> None:
        """The check that just ended was another limit's 429, not noise."""
        self._noisy = False

    def confirms(self, *, inside: bool = False) -> bool:
        """The check's probe was turned away: whether that confirms the throttle (one
        probe, or two after noise, ``_noisy``, or with the probe sent well ``inside``
        the learned slope); ``False``: check once more.

        ``inside``: a probe turned away with its window's count well inside what the
        learned slope allows is as likely a shared pool's as the window's. Confirmed by
        one, a 5 % pool's second random 429 (one check in twenty) paused the fleet 5 s
        with the slots idle (the shared-pool cell, seeds 6-10: 1.027x the oracle, 1.041x
        at seed 7, where the pool's 429s never come two in a row for a full window)."""
        self._strikes += 1
        return self._strikes >= (2 if self._noisy or inside else 1)

    def passing(
        self,
        now: float,
        *,
        pause_s: float,
        paced: bool,
        caller: object | None = None,
        can_yield: bool = False,
    ) -> tuple[float, bool]:
        """An attempt about to call the provider: ``(seconds to wait, is the probe)``.

        ``(0, False)``: go. While the pause lasts: wait until it ends. When it has ended,
        the probe ``(0, True)`` is the call whose throttle started the check or pause
        (``caller`` is its Run) until it has not asked for ``PROBE_RESERVE_S``, else the
        first attempt to ask. While that call waits for a slot (:meth:`await_hand`), the
        first other caller to ask that ``can_yield`` gets ``(YIELD, False)``: it hands its
        slot over (:meth:`hand`). The others wait for the probe's outcome (at most
        ``pause_s`` before asking again),
        or, with the rate ``paced`` or during a check, only until the probe's grace is
        over, which ends the pause.
        """
        if self._until == -math.inf:  # ended meanwhile (the flag was read unlocked)
            return 0.0, False
        left = self._until - now
        if left > 0:
            return left, False
        if not self._probe_out:
            owner = self._owner
            if owner is not None and caller is not owner:
                if can_yield and self._handoff.promise():
                    self._owner_until = now + PROBE_RESERVE_S
                    return YIELD, False
                if now < self._owner_until:
                    return min(max(self._owner_until - now, 1e-3), PROBE_RESERVE_S), False
            self._handoff.drop()
            self._owner = None
            self._probe_out = True
            self._probe_sent = now
            self._probe_caller = caller
            return 0.0, True
        grace = self._check_grace
        if grace is None and paced:
            grace = probe_grace(self._reject_s, pause_s=pause_s)
        if grace is None:  # not paced: wait for the probe's outcome
            return max(pause_s, 1e-3), False
        if now - self._probe_sent >= grace:
            self._cleared()
            # The edge once the probe is accepted.
            self._late = (self._probe_caller, self._probe_sent, self._check_grace is not None)
            self._mark_release(now, unanswered=self._check_grace is not None)
            self.end(now)
            return 0.0, False
        return max(self._probe_sent + grace - now, 1e-3), False

    async def wait(self, seconds: float) -> None:
        """Wait ``seconds`` or until the pause ends, whichever comes first (no lock)."""
        await self._resume.wait(seconds)

    def start(
        self,
        now: float,
        seconds: float,
        *,
        probe: bool,
        owner: object | None = None,
        memory_s: float = 0.0,
    ) -> None:
        """A burst throttle: a new pause of ``seconds`` (none for 0); ``probe``: it was the
        probe that was turned away, so how long that took widens the next probe's grace.
        Its probe is kept for ``owner`` (the throttled call's retry) until
        ``PROBE_RESERVE_S`` after it ends, then goes to the first to ask.

        A probe turned away says no noise: one will do next time, unless a check's probe
        got through within ``memory_s`` (the owner passes two slope windows). The pool
        that turned that check's throttle away is still there: confirmed by one, a 5 %
        pool's 429 on a check's probe (one in twenty) right after the first edge paused
        the peak x10 5 s, and the edge that pause found refit the window to 60 s, then to
        10 s with a growth of 1.17 read off the wrong windows (seed 2: 1.112x the oracle;
        1.003x with two)."""
        self._reserve(owner, now + max(0.0, seconds))
        if probe:
            self._reject_s = max(self._reject_s, now - self._probe_sent)
        self._probe_out = False
        checked, self._check_grace = self._check_grace is not None, None
        if checked or probe:
            self._noisy = now - self._noise_seen <= memory_s
            self._strikes = 0
        if seconds > 0:
            self._until = now + seconds
            self._shut(now)
        elif checked:  # confirmed, but the provider asks for no pause
            self.end(now)

    def check(self, now: float, grace: float, owner: object | None = None) -> None:
        """A first burst throttle (or its check's probe turned away, which did not confirm
        it yet): the probe goes at once (``owner``'s retry, the throttled call's), the
        others wait up to ``grace`` for it to be turned away (which confirms the throttle:
        :meth:`start` follows)."""
        self._reserve(owner, now)
        if self._check_grace is None:
            self._strikes = 0
        self._probe_out = False
        self._check_grace = grace
        self._until = now
        self._shut(now)

    def await_hand(self, caller: object, now: float) -> float | None:
        """``caller``, with no slot, is about to queue for one: if the probe is kept for
        it, the seconds to wait for a held caller to hand it one (until the probe is due,
        and ``PROBE_RESERVE_S`` more); ``None``: it is not (queue as usual)."""
        if caller is not self._owner:
            return None
        self._handoff.ask()
        self._wake()
        opens = max(self._until, now)
        self._owner_until = max(self._owner_until, opens + PROBE_RESERVE_S)
        return opens - now + PROBE_RESERVE_S

    def hand(self, token: Token) -> bool:
        """A caller told to ``YIELD`` hands ``token`` to the owner; ``False``: it no
        longer waits, the caller keeps its slot."""
        return self._handoff.hand(token)

    def take_hand(self, caller: object) -> Token | None:
        """``caller`` stops waiting for a slot: the one handed to it (``None``: queue)."""
        return self._handoff.take() if caller is self._owner else None

    async def wait_hand(self, seconds: float) -> None:
        """Wait ``seconds`` or until a slot is handed to the owner (no lock)."""
        await self._handoff.wait(seconds)

    def wait_hand_sync(self, seconds: float) -> None:
        """The blocking twin of :meth:`wait_hand`."""
        self._handoff.wait_sync(seconds)

    @property
    def slots_returned(self) -> int:
        """Slots handed to the probe's owner and released unused (:mod:`.handoff`)."""
        return self._handoff.returned

    @property
    def owner(self) -> object | None:
        """The call the next probe is kept for (read without the lock by ``disown``)."""
        return self._owner

    def disown(self, caller: object) -> None:
        """``caller`` ended: the probe kept for it goes to the first to ask."""
        if self._owner is caller:
            self._owner = None
            self._handoff.drop()

    def _reserve(self, owner: object | None, opens: float) -> None:
        self._handoff.drop()
        self._owner = owner
        self._owner_until = opens + PROBE_RESERVE_S if owner is not None else -math.inf

    def turned_away(self) -> None:
        """A burst 429 while the pause (or check) is on (the one starting it counts too)."""
        self._herd += 1

    def _shut(self, now: float) -> None:
        if self._paused_since is None:
            self._paused_since = now
            self._herd = 1
        self.pausing = True
        self._resume.shut()

    def _wake(self) -> None:
        """The callers the pause holds ask again now: the owner waits for a slot one of
        them hands over once the probe is due (:meth:`passing`). Those waiting for the
        last probe's outcome sleep up to ``pause_s``: holding every slot, they kept the
        next probe's retry from one (reject latency 1 s, seed 2: the probe due at 11.75 s
        went at 14.77 s, no send in between)."""
        self._resume.open()
        self._resume.shut()

    def probe_succeeded(self, now: float, caller: object | None = None) -> None:
        """The probe's call (``caller``'s) succeeded: the pause is over for everyone. The
        probe of a pause its grace ended (:meth:`passing`) ends none begun since, and its
        send is the edge of that one's."""
        late = self._late
        if late is not None and late[0] is caller:
            self._late = None
            self.edge = late[1:]
            if late[2]:  # a check's
                self._noise_seen = now
            return
        if self.pausing and self._probe_out:
            if self._check_grace is not None:
                self._noise_seen = now
            self._cleared()
            self._mark_edge()
            self._mark_release(now)
            self.end(now)

    def _mark_edge(self) -> None:
        self.edge = (self._probe_sent, self._check_grace is not None)

    def _mark_release(self, now: float, *, unanswered: bool = False) -> None:
        if self._herd > 1:  # more than the one 429 that started it: a herd was held
            self.release = (now, now - self._probe_sent, self._herd, unanswered)

    def take_release(self) -> tuple[float, float, int, bool] | None:
        """The release :attr:`release` holds, once (``None``: no new one)."""
        release, self.release = self.release, None
        return release

    def take_edge(self) -> tuple[float, bool] | None:
        """The edge :attr:`edge` holds, once (``None``: no new one)."""
        edge, self.edge = self.edge, None
        return edge

    def _cleared(self) -> None:
        if self._check_grace is not None:  # a check whose probe got through: noise
            self._noisy = True

    def probe_ended(self) -> None:
        """The probe ended without an answer about the rate: the next to ask probes (a
        probe its pause's grace ended says nothing of an edge either)."""
        self._probe_out = False
        self._late = None

    def went(self, caller: object, at: float) -> None:
        """``caller``'s attempt went to the provider at ``at``: if it is the probe, that is
        its send (the edge it finds, its grace's start). Given the role, it may still be
        held by the slope (:mod:`.sends`): taken from then, a probe held 2.6 s to a window's
        edge read as an edge 0.2 s before the provider's, and the herd aligned to it went
        into the full window (the peak x10 with a 5 s window, seed 3: 486 calls turned
        away at 29.8 s)."""
        if self._probe_out and caller is self._probe_caller:
            self._probe_sent = at
        late = self._late
        if late is not None and late[0] is caller:  # it went after its grace ended
            self._late = (caller, at, late[2])

    def turned(self, caller: object | None) -> None:
        """``caller``'s attempt, a probe, was turned away: if its pause's grace ended it,
        its send was no edge (:meth:`probe_succeeded`)."""
        late = self._late
        if late is not None and late[0] is caller:
            self._late = None

    def end(self, now: float) -> None:
        """End the pause (and any probe) at ``now`` and let every waiter go."""
        self._paused_since = None
        self.pausing = False
        self._probe_out = False
        self._check_grace = None
        self._until = -math.inf
        self._owner = None
        self._handoff.drop()
        self._resume.open()
