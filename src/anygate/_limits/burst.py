"""The adaptive limit's answer to a burst-rate throttle: a check, a pause, one probe.

Why. A burst 429 says the provider's current window is spent, but one 429 could be
anyone's (a shared pool's): a first one is only *checked* (one probe goes at once, and only
its own 429 confirms it), a confirmed one pauses the gate, and the pause's probe decides
when everyone goes again. With the slope rule learned (:mod:`.slope`) the pause lasts to
the predicted edge or a tenth of a window; a pause that turned a herd away releases it in
waves (:mod:`.release`). The pause and its probe are a state machine of their own
(:mod:`.pause`), run under the adaptive limit's lock.

A *suspect* 429 is checked at a lower concurrency (issue 30). A plain 429 (no wording)
taken for the slope rule's at a new high of calls at the provider while the rate climbs
(:mod:`.attribute`, ``steep``) may be the slots' as well: during a ramp both limits turn
calls away there. Its check's probe (the throttled call's retry) waits, the others held
too, until fewer calls are at the provider than at the 429 (a call left; at most
``pause_s``). A spent window turns it away then as well; full slots do not. Got through,
the 429 was the slots': the limit becomes the count at the 429 less one, as for a
concurrency 429 (reported by the next admission, :meth:`~BurstAnswer.take_change`), and
no noise is counted. Waiting costs nothing either way: full slots and a spent window admit
nobody meanwhile. The check's grace covers twice the slowest 429 of the last minute: with
the usual twice-the-throttle's-own-answer, a probe turned away after its grace was taken
for the slots' (48 slots cut to 36 for 30 s; the tuning cell's 429s 0.38 -> 0.49 %).
Measured on the tuning set's plain-429 cells (the morning peak with every limit a bare
429, seeds 1-5): with 24 slots, 6-11 of the slots' 429s per run were taken for the slope
rule's, two of them paused the gate, its probe got through and the held calls went at once
into the real slope rule; 1.020x / 0.52 % -> 1.004x / 0.31 % (calls with a 429 per seed
15, 30, 11, 10, 17 -> 12, 15, 9, 8, 7). With 48 slots 1.008x / 0.38 % -> 1.007x / 0.45 %
(one more slope or per-minute 429 on three seeds, from shifted timing); latency 1.5 s and
every worded cell unchanged to the digit.

What. :class:`BurstAnswer`, the methods of :class:`~anygate._limits.adaptive.AdaptiveLimit`
for that answer: :meth:`~BurstAnswer.on_throttle` and the pause's side, asked by every
attempt (:meth:`~BurstAnswer.pass_pause`, :meth:`~BurstAnswer.wait_pause`,
:meth:`~BurstAnswer.probe_accepted`, :meth:`~BurstAnswer.probe_ended`,
:meth:`~anygate._limits.sending.SendPath.disown`), and :meth:`~BurstAnswer.take_change`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Protocol

from .._config.limit_values import (
    OVER_LIMIT_POLL_S,
    LimitChange,
    check_grace,
)
from .._gate.waiters import ki_protected
from .pause import YIELD
from .release import Release
from .sending import SendPath
from .slope_fit import MIN_PREVIOUS

if TYPE_CHECKING:
    from .._gate.token import Token
    from .pause import BurstPause

__all__ = ["BurstAnswer"]


class _Probe(Protocol):
    """A call that may hold a burst pause's probe (a policy's ``Run``)."""

    burst_probe: bool


class BurstAnswer(SendPath):
    """The burst answer of :class:`~anygate._limits.adaptive.AdaptiveLimit` (see the
    module docstring). Not for use on its own."""

    __slots__ = ()

    def pause_left(self) -> float:
        """Seconds until the current burst-rate pause ends (0: none, or over)."""
        if not self._pause.pausing:
            return 0.0
        with self._lock:
            return self._pause.left(self._clock())

    def paused_for(self, caller: _Probe) -> bool:
        """Whether a burst pause (or check) is on that ``caller``'s attempt, held in
        :meth:`reserve_send` meanwhile and not its probe, must pass again
        (:meth:`pass_pause`) before it goes. Unlocked: a stale ``False`` lets one attempt
        go that was held as the pause began, a stale ``True`` asks :meth:`pass_pause`.

        Without this an attempt held by the slope, a release's wave or a per-minute
        estimate went into the window the pause said was spent: a wave due at 8.94 s went
        in the pause begun at 8.22 s, 21 sends turned away at once (0.6 s, seed 1)."""
        return self._pause.pausing and not caller.burst_probe

    @ki_protected
    def pass_pause(
        self, caller: object | None = None, *, can_yield: bool = False
    ) -> tuple[float, bool]:
        """An attempt about to call the provider: ``(seconds to wait, is the probe)``.

        ``(0, False)``: no pause, go. While a burst-rate pause lasts: wait until it ends.
        When it has ended, the probe ``(0, True)`` is, for a check, the throttled call
        (``caller``: the same object that was passed to :meth:`on_throttle`), else (or
        after ``PROBE_RESERVE_S``) the first attempt to ask; the others
        wait for its outcome (at most ``pause_s`` before asking again): a success ends
        the pause for everyone (:meth:`on_success` with ``probe=True``), another burst
        429 starts a new pause, anything else hands the probe on (:meth:`probe_ended`).
        ``(YIELD, False)``: hand this slot to the probe's owner (:meth:`hand_slot`), if
        ``can_yield`` (it is a slot of this limit's gate).
        """
        pause = self._pause
        if not pause.pausing:
            return 0.0, False
        with self._lock:
            now = self._clock()
            wait = self._slots_wait(now, caller)
            if wait > 0:
                return wait, False
            checking = pause.checking
            answer = pause.passing(
                now,
                pause_s=self._pause_s,
                paced=self._paced(),
                caller=caller,
                can_yield=can_yield,
            )
            self._check_ended(checking, now)
            self._learn_edge()
            if caller is not None:
                if answer[0] > 0:
                    self._held.add(caller)
                elif answer[0] == YIELD:  # it gives its slot up: held no more
                    self._held.discard(caller)
            return answer

    @ki_protected
    def ask_for_slot(self, caller: object) -> float | None:
        """``caller`` has no slot and is about to queue for one: if the probe of a burst
        pause (or check) is kept for it, the seconds to wait for a held caller to hand
        it one (:meth:`slot_handed`); ``None``: it is not (unlocked: every admission
        asks)."""
        pause = self._pause
        if not pause.pausing or pause.owner is not caller:
            return None
        with self._lock:
            return pause.await_hand(caller, self._clock())

    async def slot_handed(self, caller: object, seconds: float) -> Token | None:
        """Wait up to ``seconds`` for the slot :meth:`ask_for_slot` asked for: it, or
        ``None`` (none was handed in time, or the probe is no longer kept: queue)."""
        await self._pause.wait_hand(seconds)
        return self._take_hand(caller)

    def slot_handed_sync(self, caller: object, seconds: float) -> Token | None:
        """The blocking twin of :meth:`slot_handed`."""
        self._pause.wait_hand_sync(seconds)
        return self._take_hand(caller)

    @ki_protected
    def _take_hand(self, caller: object) -> Token | None:
        with self._lock:
            return self._pause.take_hand(caller)

    @ki_protected
    def hand_slot(self, token: Token) -> bool:
        """A caller :meth:`pass_pause` told to ``YIELD`` hands ``token`` to the probe's
        owner; ``False``: it no longer waits, the caller keeps the slot."""
        with self._lock:
            return self._pause.hand(token)

    def owns_probe(self, caller: object) -> bool:
        """Whether the next probe of a burst pause (or check) is kept for ``caller`` (the
        throttled call): its retry then queues for a slot ahead of fresh calls. Unlocked:
        a stale answer only queues one attempt in the other class."""
        pause = self._pause
        return pause.pausing and pause.owner is caller

    def goes_ahead(self, caller: object) -> bool:
        """Whether ``caller``'s retry queues for a slot ahead of fresh calls, once: its
        burst 429 was taken for a shared pool's noise (no check, no pause). The provider
        would have served it; queued behind the fresh calls, the retry waited their turn,
        and the last agents finished that much later (a check's probe, the throttled
        call's retry, always went ahead). Unlocked when there is none (every admission
        asks)."""
        if not self._ahead:
            return False
        with self._lock:
            if caller not in self._ahead:
                return False
            self._ahead.discard(caller)
            return True

    async def wait_pause(self, seconds: float) -> None:
        """Wait ``seconds`` or until the pause ends, whichever comes first."""
        await self._pause.wait(seconds)

    @ki_protected
    def probe_accepted(self, run: _Probe) -> None:
        """``run``'s attempt, the burst pause's probe, was accepted by the provider (a
        success status and headers, or the first streamed bytes): it got past the rate
        check, so the pause is over for everyone now, not when its generation ends.

        The role is given up in the same locked step (``run.burst_probe`` cleared), so the
        attempt's final outcome touches no later pause: a pause that started after this
        one ended has its own probe, and this call's late success must not end it."""
        with self._lock:
            if not run.burst_probe:
                return
            run.burst_probe = False
            checking, now = self._pause.checking, self._clock()
            self._pause.probe_succeeded(now, run)
            self._check_ended(checking, now)
            self._learn_edge()

    @ki_protected
    def probe_ended(self) -> None:
        """The probe ended without an answer about the rate (an error, a cancellation):
        the next attempt to ask becomes the probe."""
        with self._lock:
            self._pause.probe_ended()

    @ki_protected
    def on_throttle(
        self,
        generation: int | None,
        retry_after: float | None,
        in_flight: int | None = None,
        *,
        probe: bool = False,
        admitted_at: float | None = None,
        caller: object | None = None,
    ) -> LimitChange | None:
        """A burst-rate throttle: pause and lower the limit, unless it is old news.

        With pacing, a first throttle (no pause on, not a probe's) is only checked: one
        probe goes at once and the others wait its grace; the probe turned away confirms
        it, and the pause and the cut follow (see :mod:`anygate._limits.pause`).

        Args:
            generation: :attr:`generation` when the throttled attempt was admitted;
                ``None`` if unknown (then throttles during a pause are ignored instead).
            retry_after: the provider's ``Retry-After`` in seconds; replaces ``pause_s``.
            probe: the attempt was the probe of a pause or a check.
            admitted_at: when the throttled attempt was admitted, on :attr:`clock` (its
                answer time sets a check's grace); ``None``: unknown.
            caller: the throttled call (any object it passes to :meth:`pass_pause` again):
                its retry is the check's probe.

        Returns:
            the change, or ``None`` when the throttle was ignored, only checked, or
            nothing is capped.
        """
        if not self._enabled:
            return None
        with self._lock:
            self._adopt_external_resize()
            slots, slope = self._slots, self._sends.slope
            if slots.maximum < 1:
                return None
            now = self._clock()
            suspect, self._suspect = self._suspect, None
            below = suspect[1] if suspect is not None and suspect[0] == admitted_at else None
            if probe:
                self._pause.turned(caller)
            if self._pause.pausing:
                self._pause.turned_away()
            if admitted_at is not None:
                slope.turned(admitted_at)
                if retry_after is not None:
                    slope.said_full(admitted_at, retry_after)
            # Old news: sent before the latest burst answer (a slots' lesson is none).
            if self._old_news(generation, self._pause.lasts(now), since=self._burst_generation):
                return None
            if not probe and self._pause.checking:
                # Only the check's probe answers it. Another attempt sent meanwhile (a
                # retry of a 429 taken for noise goes ahead of the hold) turned away by a
                # shared pool confirmed it: a 5 s pause with the slots idle, and the edge
                # its probe found read a growth the provider never set (the peak x10 with
                # a 5 % pool, seed 4, an experiment: 40.6 s, 58.4 s and 61.2 s).
                return None
            old = self._applied
            burst = self._pause
            gate = self._pace_gate()
            inside = admitted_at is not None and slope.inside(admitted_at)
            if probe and not burst.pausing and inside:
                # A check's probe turned away after its grace ended the check, sent well
                # inside the learned slope: a first throttle again, not a pause's. Taken
                # as one, a shared pool's late 429 paused the fleet 5 s with the slots
                # idle (shared pool 5 %, seed 7: 73.2 s and 133.7 s; 1.041x the oracle).
                probe = False
            lone = admitted_at is not None and not slope.repeated(admitted_at)
            if (
                not probe
                and not burst.pausing
                and lone
                and (inside or (slope.known and now - self._noise_at <= slope.window_s))
            ):
                # Well inside the learned slope, and the send before it got through (or
                # is still out): noise, a shared pool's; a full window turns away every
                # send after it. Before, a second such 429 within a window was checked:
                # at 5 % of arrivals nearly every one, each check holding the fleet its
                # grace (shared pool 8 %: 1.018x the oracle; 1.004x now). The provider
                # would have served the call: its retry goes ahead (goes_ahead).
                # Near the allowance too, while such noise came within a window: at the
                # peak x10's scale a 5 % pool's 429 lands in the last tenth of nearly
                # every window's allowance, and each held the fleet to the edge (the
                # held windows read ever lower growths, or with the lesson refused, the
                # holds alone: seed 2 1.45x the oracle). A full window's run says so.
                if inside:
                    self._noise_at = now
                if caller is not None:
                    self._ahead.add(caller)
                return None
            # A window known full (its edge predicted, its count at the learned slope)
            # needs no check: hold until its edge.
            known_edge = (
                gate is not None
                and admitted_at is not None
                and slope.known
                and slope.predicted(now) is not None
                and not inside
            )
            if (
                not probe
                and not burst.pausing
                and self._pause_s > 0
                and gate is not None
                and not known_edge
            ):
                # One throttle could be anyone's (a shared pool's): ask once more first.
                self._below = below
                self._check_at = now
                self._check_sent = now if admitted_at is None else admitted_at
                self._check(burst, now, admitted_at, caller)
                return None
            if probe and burst.checking and not burst.confirms(inside=inside):
                # After noise, or with the probe well inside the learned slope, a check
                # needs its probe turned away twice: ask once more.
                self._check(burst, now, admitted_at, caller)
                return None
            # The pause's probe throttled again: the same episode, a new pause, but the
            # limit was cut already. A check's probe turned away confirms the throttle.
            self._below = None
            continuing = probe and burst.pausing and not burst.checking
            # Paced: the slope learned at the pause's end (_learn_edge) holds sends to the
            # growth the provider allows; no rate cut, no concurrency cut.
            paced = gate is not None
            if not continuing and not paced and slots.active:
                slots.burst_cut()
            elif (
                not continuing
                and math.isinf(slots.limit)
                and in_flight is not None
                and in_flight >= MIN_PREVIOUS
            ):
                # Not a handful (says little, as of a growth): two pool 429s 0.1 s in held
                # the peak x10 to 4 calls a window, its ramp a window behind (1.043x).
                slots.take_herd(in_flight)
            slots.throttled(now)
            self._burst_answer_began()
            self._throttles += 1
            if retry_after is not None:
                pause = max(0.0, retry_after)
            elif paced:
                # Capped at pause_s even to a pinned edge: a window told from noise (a
                # shared pool's 429s, or the test soak's random ones) pins edges too, and
                # held to them uncapped the soak's fleet stood a minute with pause_s 1 ms.
                pause = min(self._pause_s, slope.hold(now, slope.last_turned))
            else:
                pause = self._pause_s
            # A probe turned away (after its grace ended the pause, too) tells how fast
            # the provider answers a probe: what the next probe's grace must cover. The
            # next probe is the throttled call's retry (queued ahead of fresh calls, see
            # owns_probe): the same question again, and no other call gets a 429 for it.
            self._pause.start(now, pause, probe=probe, owner=caller, memory_s=2 * slope.window_s)
            self._sends.release = None
            self._apply()
            return LimitChange(old, self._applied, slots.maximum, "burst_rate", pause)

    def _slots_wait(self, now: float, caller: object | None) -> float:
        """The seconds ``caller`` waits because the check of a suspect 429 (see the module
        docstring) waits for a slot to free: its probe goes only once fewer calls are at
        the provider than at that 429, at most ``pause_s`` after the check began (then it
        goes as it would have, and its answer is no evidence about the slots); 0: no
        such wait. The probe's owner asks again every ``OVER_LIMIT_POLL_S``, the others
        (held back) every grace."""
        below, pause = self._below, self._pause
        if below is None or not pause.probe_due(now) or not self._crowded(caller, below):
            return 0.0
        if now - self._check_at >= self._pause_s:
            self._below = None
            return 0.0
        wait = pause.keep(now)
        if caller is not None:
            self._held.add(caller)
            if caller is pause.owner:
                wait = OVER_LIMIT_POLL_S
        return wait

    def _crowded(self, caller: object | None, below: int) -> bool:
        """Whether a send by ``caller`` now would find at least ``below`` calls at the
        provider, itself included."""
        gate = self._gate()
        if gate is None:
            return False
        held = self._held
        others = gate.in_flight - len(held) - (0 if caller in held else 1)
        return others + 1 >= below

    def _check_ended(self, checking: bool, now: float) -> None:
        """A check ended without its probe turned away: if its probe went with fewer calls
        at the provider than the plain 429 it checks, that 429 was the slots'."""
        below = self._below
        if not checking or self._pause.pausing or below is None:
            return
        self._below = None
        self._pause.not_noise()
        old = self._applied
        if self._slots.cut(below, now, exact=True, tentative=True):
            self._generation += 1
            self._throttles += 1
            self._apply()
            self._unreported = LimitChange(
                old, self._applied, self._slots.maximum, "concurrency", 0.0
            )

    def take_change(self) -> LimitChange | None:
        """A change the limit made on its own since the last call (a check that found the
        slots full, :meth:`_check_ended`), once, for the policy to report; ``None``: none.
        Unlocked when there is none (every admission asks)."""
        if self._unreported is None:
            return None
        with self._lock:
            change, self._unreported = self._unreported, None
            return change

    def _check(
        self, burst: BurstPause, now: float, admitted_at: float | None, caller: object | None
    ) -> None:
        """Check a first throttle: ``caller``'s retry probes at once, the others wait
        (:func:`~anygate._config.limit_values.check_grace`)."""
        typical = self._slots.typical_answer(now)
        answered = None if admitted_at is None else max(0.0, now - admitted_at, typical)
        self._burst_answer_began()
        self._checks += 1
        self._sends.release = None
        grace = check_grace(answered, pause_s=self._pause_s)
        if self._below is not None:
            grace = max(grace, min(self._pause_s, 2.0 * self._slots.slowest_answer(now)))
        burst.check(now, grace, caller)

    def _learn_edge(self) -> None:
        """A pause just ended: a confirmed one's probe's send time is the spent window's
        end; one that turned a herd away releases it in waves (unless the slope, known,
        holds the sends).

        A check's probe that got through is an edge only after a run of two or more of
        ours turned away (:meth:`~anygate._limits.slope.SlopeLimit.repeated`): a full
        window turns away every send after it filled, a shared pool's 429s come alone.
        A 429 at a window's very end has its check's probe cross the edge; read as noise,
        the peak x10 with a 5 s window missed its second edge (probe at 10.001 s after a
        run of three), learned the window only at 17.7 s (as 15 s, growth 6.3) and held
        its herd to 48 calls meanwhile (seed 1: 1.046x the oracle; with the edge, 1.014x).
        """
        pause = self._pause
        edge = pause.take_edge()
        sends = self._sends
        if edge is not None:
            at, checked = edge
            # The latest send turned away before the probe's: a probe accepted after its
            # grace let the others go may come after sends of theirs turned away.
            slope = sends.slope
            turned = slope.turned_before(at)
            if turned > -math.inf and (not checked or slope.crossed(turned, at)):
                sends.edge(turned, at)
        release = pause.take_release()
        # A herd: most of those it holds were turned away. A few 429s among many held (a
        # shared pool's noise) let everyone go, as before: paced by doubling waves after
        # each of its checks, the storm benchmark's shared-pool cell went 1.004 -> 1.014.
        # Or a check's probe still unanswered at its grace's end, with most of the sends
        # since the throttle it checks turned away (a full window's sign; a pool turns
        # away a few): its own 429 may come later than its grace (twice the first 429's
        # answer time), and the herd let go at once went into the spent window (reject
        # latency 0.6 s, seed 1: 20 sends turned away at one instant).
        if release is not None and not sends.slope.known:
            now, round_trip, turned, unanswered = release
            if 2 * turned >= len(self._held) or (
                unanswered and sends.slope.mostly_turned(self._check_sent, now - round_trip)
            ):
                sends.release = Release(now, round_trip)
