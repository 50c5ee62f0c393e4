"""Adaptive concurrency: a gate's admission limit follows what the provider says.

Why. A concurrency cap bounds how many calls run at once, not how fast new ones start, and
a cap above the provider's real slots turns into concurrency 429s. Backing off only the
throttled call does not slow the fleet down: its slot goes straight to the next queued
call, which is throttled too, because a 429 comes back in milliseconds.

What. One :class:`AdaptiveLimit` per gate answers throttles for everyone using the gate.
It is the provider model's owner, not its arithmetic: each limit is a small class in
:mod:`anygate._limits` (the slots in :mod:`~anygate._limits.concurrency`, the windows a send
is held to behind one interface in :mod:`~anygate._limits.sends`, a queueing server's
latency in :mod:`~anygate._limits.latency`); this class feeds them each outcome under one
lock, keeps the pause, the generations and the checks, and writes the result to the gate.

1. **concurrency 429** (:meth:`~AdaptiveLimit.on_concurrency`, ``exact``): the limit
   becomes the calls in flight minus one; an **overload answer** (529, 503 with
   Retry-After) multiplies it by ``decrease_factor``. Then the limit *holds* (30 s,
   doubling when a probe upward finds the same limit, up to 10 min) before it may grow.
2. **burst-rate 429** (:meth:`~AdaptiveLimit.on_throttle`): a **pause** of ``pause_s`` (or
   Retry-After) during which admitted attempts wait holding their slots, ended by **one
   probe** (:meth:`~AdaptiveLimit.pass_pause`) whose success lets everyone go; the first
   throttle of an episode also cuts the limit by ``decrease_factor`` (an uncapped gate
   takes its calls in flight as its limit instead). With ``pace_burst_rate`` (the
   default) nothing is cut: the slope rule is learned from this gate's own counts at the
   end of each full window (:mod:`anygate._limits.slope`: growth, floor, window) and sends
   are held to it (:meth:`~AdaptiveLimit.reserve_send`); the pause lasts a tenth of a
   window (the next probe) or until the predicted edge. A per-minute 429 holds sends to
   the count the window held instead (:meth:`~AdaptiveLimit.on_rate`). With pacing, a
   first burst throttle is only *checked* before any of that: one probe goes at once, and only
   its own 429 confirms the throttle (one 429 could be a shared pool's).
3. **additive increase**: each success admitted on a full gate raises the limit by
   ``1 / limit``, back up to the configured maximum (none without a cap). An uncapped
   gate's herd limit (its calls in flight at a slope throttle) is no lesson about the
   slots: once the slope rule is learned, a success raises it to ``HERD_GROWTH`` (1.1)
   times the most calls in service that got through, until a concurrency 429 teaches
   the slots.
4. **latency** (``latency=True``, off by default): each success's latency and calls in
   flight feed :mod:`anygate._limits.latency`, whose estimate of a queueing server's
   slots is a second ceiling on the gate (:meth:`~AdaptiveLimit.on_success`).

Only the first throttle of an episode counts. An attempt admitted before the latest
change was sent under the old limit, so its 429 is old news: every attempt records the
*generation* it was admitted in, and a throttle from an older generation is ignored (TCP
likewise halves its window once per round trip, not once per lost packet).

One lock: the rules share the limit, the generation and the pause, so one lock guards
them, and a throttle changes them in one step. The pause and its probe are their own state
machine (:mod:`anygate._policy.burst_pause`), run under this lock; each estimate is pure
arithmetic in :mod:`anygate._limits`. The values and arithmetic live in
:mod:`anygate._config.limit_values`; the per-gate lookup in :mod:`anygate._policy.sharing`.
It never delays a call while the provider is happy.

Thread-safe: one ``threading.Lock`` per instance, held for a few assignments and the
gate's capacity setter (the gate's lock nests inside ours, never the reverse). The clock
is injectable, so the simulator and tests run it on virtual time.
"""

from __future__ import annotations

import math
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Literal, final

from .._config.limit_values import (
    DEFAULT_DECREASE_FACTOR,
    DEFAULT_ENABLED,
    DEFAULT_LATENCY,
    DEFAULT_MIN_CONCURRENT_CALLS,
    DEFAULT_PACE_BURST_RATE,
    DEFAULT_PAUSE_MS,
    OVER_LIMIT_POLL_S,
    AdaptiveStatistics,
    LimitChange,
    capacity_for,
    check_grace,
)
from .._gate.gate_args import check_capacity
from .._gate.waiters import ki_protected
from .._limits.attribute import Attributed, attribute
from .._limits.concurrency import ConcurrencyLimit
from .._limits.latency import LatencyLimit
from .._limits.release import Release
from .._limits.sends import Sends
from .._validation import check_flag, check_int, check_number, show
from .burst_pause import BurstPause

if TYPE_CHECKING:
    from collections.abc import Callable

    from .._gate.gate import Gate
    from .run import Run

__all__ = ["AdaptiveLimit"]


@final
class AdaptiveLimit:
    """A gate's adaptive concurrency limit; see the module docstring for the rules.

    Created by the first :class:`anygate.Policy` that uses a gate and shared by every policy
    on that gate (read it from :attr:`anygate.Policy.adaptive_limit`). It owns the gate's
    capacity while it is active: resize through ``policy.max_concurrent_calls`` (a direct
    ``gate.capacity = n`` is noticed at the next throttle or success and adopted as the new
    maximum).

    Args:
        gate: the gate whose capacity it adapts (held weakly).
        enabled: ``False`` makes every method a no-op apart from resizing.
        min_concurrent_calls: the floor (>= 1).
        decrease_factor: the multiplier on a throttle (0 < factor < 1).
        pause_s: how long attempts wait after a throttle without a ``Retry-After``.
        pace_burst_rate: answer a burst throttle by learning the provider's slope rule
            and holding sends to it (:mod:`anygate._limits.slope`) instead of cutting the
            concurrency limit; the pause and its probe stay. Also holds sends to the
            per-minute estimates a per-minute 429 teaches (:meth:`on_rate`).
        latency: follow the concurrency a queueing server's latencies show
            (:mod:`anygate._limits.latency`; see :meth:`on_success`). Default off.
        clock: a monotonic clock in seconds (``anyio.current_time`` for virtual time).
    """

    __slots__ = (
        "__weakref__",
        "_applied",
        "_checks",
        "_clock",
        "_enabled",
        "_gate",
        "_generation",
        "_held",
        "_latency",
        "_latency_on",
        "_lock",
        "_name",
        "_noise_at",
        "_pace",
        "_pause",
        "_pause_s",
        "_sends",
        "_slots",
        "_stale",
        "_throttles",
        "_turned",
    )

    def __init__(
        self,
        gate: Gate,
        *,
        enabled: bool = DEFAULT_ENABLED,
        min_concurrent_calls: int = DEFAULT_MIN_CONCURRENT_CALLS,
        decrease_factor: float = DEFAULT_DECREASE_FACTOR,
        pause_s: float = DEFAULT_PAUSE_MS / 1000.0,
        pace_burst_rate: bool = DEFAULT_PACE_BURST_RATE,
        latency: bool = DEFAULT_LATENCY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        check_flag("pace_burst_rate", pace_burst_rate)
        check_flag("latency", latency)
        min_concurrent_calls, decrease_factor, pause_s = _check_settings(
            min_concurrent_calls, decrease_factor, pause_s
        )
        self._gate = weakref.ref(gate)
        self._name = gate.name
        self._lock = threading.Lock()
        self._clock = clock
        self._enabled = enabled
        self._pause_s = pause_s
        capacity = gate.capacity
        # The slots: the limit between the floor and the configured maximum, its holds.
        self._slots = ConcurrencyLimit(capacity, floor=min_concurrent_calls, factor=decrease_factor)
        self._applied = capacity  # what we last wrote to (or read from) the gate
        self._generation = 0
        self._throttles = 0
        self._checks = 0  # first throttles checked (see on_throttle)
        self._stale = 0
        # A burst-rate pause, ended by one probe (its own module).
        self._pause = BurstPause(f"adaptive {gate.name}")
        self._pace = pace_burst_rate
        # The windows a send is held to: slope, release, tokens and requests (issue 30).
        self._sends = Sends()
        self._turned = -math.inf  # the latest send a burst 429 turned away
        # Attempts holding a slot while held back (a pause, a window's hold): not at the
        # provider, so not in flight for its concurrency limit (see sending()).
        self._held: set[object] = set()
        self._noise_at = -math.inf  # the last burst 429 taken for noise (well inside)
        # The limit a queueing server's latencies show (issue 30 item 5), when on.
        self._latency_on = latency
        self._latency = LatencyLimit()

    # ------------------------------------------------------------------ reading

    @property
    def clock(self) -> Callable[[], float]:
        """The clock pauses are measured with."""
        return self._clock

    @property
    def enabled(self) -> bool:
        """Whether it reacts to throttles."""
        return self._enabled

    @property
    def limit(self) -> float:
        """The capacity it currently applies to the gate."""
        return self._applied

    @property
    def max_concurrent_calls(self) -> float:
        """The configured maximum (``inf`` = no cap)."""
        with self._lock:
            self._adopt_external_resize()
            return self._slots.maximum

    @property
    def generation(self) -> int:
        """Bumped at every decrease; attempts record it when admitted."""
        return self._generation

    @property
    def latency(self) -> bool:
        """Whether successes' latencies set the limit (:mod:`anygate._limits.latency`)."""
        return self._latency_on

    @property
    def pace_burst_rate(self) -> bool:
        """Whether a burst throttle teaches the slope rule sends are held to (instead of
        cutting the limit)."""
        return self._pace

    def settings(self) -> tuple[bool, int, float, float]:
        """``(enabled, min_concurrent_calls, decrease_factor, pause_s)``."""
        slots = self._slots
        return self._enabled, slots.floor, slots.factor, self._pause_s

    def pause_left(self) -> float:
        """Seconds until the current burst-rate pause ends (0: none, or over)."""
        if not self._pause.pausing:
            return 0.0
        with self._lock:
            return self._pause.left(self._clock())

    @ki_protected
    def pass_pause(self, caller: object | None = None) -> tuple[float, bool]:
        """An attempt about to call the provider: ``(seconds to wait, is the probe)``.

        ``(0, False)``: no pause, go. While a burst-rate pause lasts: wait until it ends.
        When it has ended, the probe ``(0, True)`` is, for a check, the throttled call
        (``caller``: the same object that was passed to :meth:`on_throttle`), else (or
        after ``PROBE_RESERVE_S``) the first attempt to ask; the others
        wait for its outcome (at most ``pause_s`` before asking again): a success ends
        the pause for everyone (:meth:`on_success` with ``probe=True``), another burst
        429 starts a new pause, anything else hands the probe on (:meth:`probe_ended`).
        """
        pause = self._pause
        if not pause.pausing:
            return 0.0, False
        with self._lock:
            answer = pause.passing(
                self._clock(), pause_s=self._pause_s, paced=self._paced(), caller=caller
            )
            self._learn_edge()
            if answer[0] > 0 and caller is not None:
                self._held.add(caller)
            return answer

    @ki_protected
    def disown(self, caller: object) -> None:
        """``caller``'s call has ended: a probe kept for its retry goes to the next to ask
        at once (a transport's 429 handed back, a call out of attempts), not after
        ``PROBE_RESERVE_S``. Cheap when it holds none (every call ends here)."""
        pause = self._pause
        if pause.owner is not caller:  # unlocked: a stale read only keeps the 20 ms wait
            return
        with self._lock:
            pause.disown(caller)

    async def wait_pause(self, seconds: float) -> None:
        """Wait ``seconds`` or until the pause ends, whichever comes first."""
        await self._pause.wait(seconds)

    @ki_protected
    def probe_accepted(self, run: Run) -> None:
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
            self._pause.probe_succeeded(self._clock())
            self._learn_edge()

    @ki_protected
    def probe_ended(self) -> None:
        """The probe ended without an answer about the rate (an error, a cancellation):
        the next attempt to ask becomes the probe."""
        with self._lock:
            self._pause.probe_ended()

    def statistics(self) -> AdaptiveStatistics:
        """A consistent snapshot."""
        with self._lock:
            now = self._clock()
            left = self._pause.left(now)
            sends, slots, slope = self._sends, self._slots, self._sends.slope
            return AdaptiveStatistics(
                gate=self._name,
                enabled=self._enabled,
                limit=self._applied,
                max_concurrent_calls=slots.maximum,
                min_concurrent_calls=slots.floor,
                decrease_factor=slots.factor,
                pause_s=self._pause_s,
                paused_for=left,
                throttles=self._throttles,
                stale_throttles=self._stale,
                pace_burst_rate=self._pace,
                checked_throttles=self._checks,
                requests_per_minute_estimate=sends.requests.estimate(now),
                tokens_per_minute_estimate=sends.tokens.estimate(now),
                slope_growth=slope.growth,
                slope_window_s=slope.window_s,
                slope_floor=slope.floor,
                latency=self._latency_on,
                latency_limit=self._latency.limit,
                no_load_latency_s=self._latency.no_load_latency,
                most_in_service=slots.most_passed,
            )

    def __repr__(self) -> str:
        if not self._enabled:
            return f"<anygate.AdaptiveLimit gate {self._name!r} off>"
        slots = self._slots
        if math.isinf(slots.maximum) and math.isinf(slots.limit):
            return f"<anygate.AdaptiveLimit gate {self._name!r} idle (no cap)>"
        text = f"<anygate.AdaptiveLimit gate {self._name!r} {self._applied:g}/{slots.maximum:g}"
        left = self.pause_left()
        if left > 0:
            text += f", paused {left:.3g}s"
        return text + ">"

    # ------------------------------------------------------------------ reacting

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
        it, and the pause and the cut follow (see :mod:`anygate._policy.burst_pause`).

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
            if self._pause.pausing:
                self._pause.turned_away()
            if admitted_at is not None and admitted_at > self._turned:
                self._turned = admitted_at
            if self._old_news(generation, self._pause.lasts(now)):
                return None
            old = self._applied
            burst = self._pause
            gate = self._pace_gate()
            if (
                not probe
                and not burst.pausing
                and admitted_at is not None
                and slope.inside(admitted_at)
            ):
                # Well inside the learned slope: noise (a shared pool's), until it repeats
                # within a window.
                repeated = now - self._noise_at <= slope.window_s
                self._noise_at = now
                if not repeated:
                    return None
            # A window known full (its edge predicted, its count at the learned slope)
            # needs no check: hold until its edge.
            known_edge = (
                gate is not None
                and admitted_at is not None
                and slope.known
                and slope.predicted(now) is not None
                and not slope.inside(admitted_at)
            )
            if (
                not probe
                and not burst.pausing
                and self._pause_s > 0
                and gate is not None
                and not known_edge
            ):
                # One throttle could be anyone's (a shared pool's): ask once more first.
                self._check(burst, now, admitted_at, caller)
                return None
            if probe and burst.checking and not burst.confirms():
                # After noise, a check needs its probe turned away twice: ask once more.
                self._check(burst, now, admitted_at, caller)
                return None
            # The pause's probe throttled again: the same episode, a new pause, but the
            # limit was cut already. A check's probe turned away confirms the throttle.
            continuing = probe and burst.pausing and not burst.checking
            # Paced: the slope learned at the pause's end (_learn_edge) holds sends to the
            # growth the provider allows; no rate cut, no concurrency cut.
            paced = gate is not None
            if not continuing and not paced and slots.active:
                slots.burst_cut()
            elif not continuing and math.isinf(slots.limit) and in_flight is not None:
                slots.take_herd(in_flight)
            self._generation += 1
            self._throttles += 1
            if retry_after is not None:
                pause = max(0.0, retry_after)
            elif paced:
                pause = min(self._pause_s, slope.hold(now))
            else:
                pause = self._pause_s
            # A probe turned away (after its grace ended the pause, too) tells how fast
            # the provider answers a probe: what the next probe's grace must cover.
            # Only a check keeps its probe for the throttled call: kept for a pause too, the
            # storm benchmark's outage cell rose from under 1.5 % to 2.4 % 429s.
            self._pause.start(now, pause, probe=probe)
            self._sends.release = None
            self._apply()
            return LimitChange(old, self._applied, slots.maximum, "burst_rate", pause)

    @ki_protected
    def on_rate(
        self,
        unit: Literal["requests", "tokens"],
        admitted_at: float,
        *,
        caller: object | None = None,
        tokens: int | None = None,
    ) -> None:
        """An RPM/TPM 429 for ``caller``'s attempt sent at ``admitted_at`` (charged
        ``tokens``): the provider's own per-minute budget is spent, and a gate paced to
        its published rate overshoots it by the budget's burst after a lull.

        ``unit="requests"`` holds the gate's sends to the limit's estimate: the count of
        this gate's requests the provider accepted in the minute before the rejected one
        was sent (:mod:`anygate._limits.requests`). ``unit="tokens"`` (with the attempt's
        charged ``tokens``; without them it counts as requests) holds sends to the tokens
        the provider accepted in that minute (:mod:`anygate._limits.tokens`). No check,
        no pause, no cut: the estimates tell noise apart by themselves. A 429 that does
        not say what it counted is attributed first (:meth:`attribute`).
        """
        if not self._enabled or self._pace_gate() is None:
            return
        with self._lock:
            self._sends.rejected(unit, admitted_at, tokens or 0, self._clock(), caller)

    def _check(
        self, burst: BurstPause, now: float, admitted_at: float | None, caller: object | None
    ) -> None:
        """Check a first throttle: one probe (``caller``'s retry) goes at once, the others
        wait its grace."""
        answered = None if admitted_at is None else max(0.0, now - admitted_at)
        self._generation += 1
        self._checks += 1
        self._sends.release = None
        burst.check(now, check_grace(answered, pause_s=self._pause_s), caller)

    @ki_protected
    def on_concurrency(
        self, generation: int | None, in_flight: int, *, exact: bool
    ) -> LimitChange | None:
        """The provider turned an attempt away for load: learn its concurrency.

        Args:
            generation: :attr:`generation` when the attempt was admitted (``None``: unknown,
                then the throttle counts unless a hold is on).
            in_flight: this gate's calls in flight when the attempt was admitted, itself
                included (the caller may lower it with what is still in flight now).
            exact: ``True`` for a concurrency 429 (the provider's slots were all taken by
                the others: the limit becomes ``in_flight - 1``); ``False`` for an overload
                answer (529, 503 with Retry-After: the limit becomes
                ``min(limit, in_flight) * decrease_factor``, and a lone call teaches
                nothing).

        One cut per generation, as for burst-rate throttles. After a cut the limit holds
        for a while before it grows again (each probe upward costs a throttle): 30 s,
        doubling each time a probe finds the same limit again, up to 10 minutes. Works
        without a configured cap: the learned limit becomes the gate's capacity.

        Returns:
            the change, or ``None`` when the throttle was ignored.
        """
        if not self._enabled:
            return None
        with self._lock:
            self._adopt_external_resize()
            slots = self._slots
            if slots.maximum < 1:
                return None
            now = self._clock()
            if self._old_news(generation, slots.holding(now)):
                return None
            old = self._applied
            if not slots.cut(in_flight, now, exact=exact):
                return None
            self._generation += 1
            self._throttles += 1
            self._apply()
            return LimitChange(old, self._applied, slots.maximum, "concurrency", 0.0)

    @ki_protected
    def reserve_send(
        self, at: float, caller: object | None = None, tokens: int | None = None
    ) -> float:
        """An attempt on the gate (charged ``tokens``) would be sent at ``at`` (this
        limit's clock): ``0.0`` and it is counted, or the seconds to wait, holding the
        slot, until the per-minute estimates' windows have room
        (:meth:`anygate._limits.sends.Sends.wait`), or until a call leaves when it got its
        slot just before a cut (:meth:`_over_limit`)."""
        if not (self._enabled and self._pace):
            if self._held:  # unlocked: a stale read is checked again under the lock
                self.unhold(caller)
            return 0.0
        with self._lock:
            cost = tokens or 0
            held = self._held
            wait = self._sends.wait(at, cost, caller, len(held))
            if wait <= 0 and caller is not None and self._over_limit(caller):
                wait = OVER_LIMIT_POLL_S
            if wait <= 0:
                self._sends.sent(at, cost, caller)
            if caller is not None:
                if wait > 0:
                    held.add(caller)
                else:
                    held.discard(caller)
            return wait

    def _over_limit(self, caller: object) -> bool:
        """Whether ``caller`` waits, holding its slot, because the others at the provider
        fill the limit the throttles taught (the latency ceiling has its own pace): it got
        its slot before a cut lowered it (a concurrency 429 while it was being admitted).
        Sent, it was the next 429: one more per probe upward (33 in flight against 32
        slots, twice per probe in the morning peak)."""
        gate = self._gate()
        if gate is None:
            return False
        held = self._held
        return self._slots.over(gate.in_flight - len(held) - (0 if caller in held else 1))

    def unhold(self, caller: object | None) -> None:
        """``caller``'s attempt left a hold without sending (cancelled, refused)."""
        if caller is not None and caller in self._held:
            with self._lock:
                self._held.discard(caller)

    def sending(self, in_flight: int) -> int:
        """Of the gate's ``in_flight`` slot holders, those not held back: at the provider
        (or about to be). A concurrency 429 is counted against these: counted with the
        held ones, an uncapped fleet of 2,400 behind 320 slots cut 423, 422, 421 ... one
        rejection each (the morning peak x10, with the herd limit lifted once the slope is
        known: an experiment, not the default)."""
        return max(0, in_flight - len(self._held))

    def turned_away(self, at: float, tokens: int | None = None) -> None:
        """The attempt sent at ``at`` (charged ``tokens``) was throttled: the provider did
        not count it."""
        if self._enabled and self._pace:
            with self._lock:
                self._sends.turned_away(at, tokens or 0)

    def rejected(self, at: float) -> None:
        """An attempt sent at ``at`` got a 429 now (any kind): it was at the provider
        until now, but not in service (see :meth:`passed`)."""
        if self._enabled:
            with self._lock:
                self._slots.rejected(at, self._clock())

    def passed(self, at: float, sending: int = 0, tokens: int | None = None) -> None:
        """The attempt sent at ``at`` with ``sending`` calls at the provider (itself
        included), charged ``tokens``, succeeded: a lower bound for the estimates
        (:meth:`anygate._limits.concurrency.ConcurrencyLimit.passed`,
        :meth:`anygate._limits.sends.Sends.passed`)."""
        if sending > self._slots.most_passed:  # unlocked: a stale read locks once more
            with self._lock:
                self._slots.passed(at, sending)
        sends = self._sends
        # Unlocked: no estimate (no per-minute 429 yet), no work.
        if sends.requests.limit is not None or (tokens and sends.tokens.limit is not None):
            with self._lock:
                sends.passed(at, tokens or 0)

    def attribute(
        self, at: float, sending: int, tokens: int | None = None, *, per_minute: bool = False
    ) -> Attributed:
        """The limit a 429 that does not say which (no wording, no headers) for the attempt
        sent at ``at`` with ``sending`` calls at the provider, charged ``tokens``, is taken
        for (:mod:`anygate._limits.attribute`); ``per_minute``: its code names a
        per-minute limit (requests or tokens only)."""
        gate = self._gate()
        rate = None if gate is None else gate.rate
        with self._lock:
            sends = self._sends
            estimate = sends.requests.estimate(at)
            if estimate is None and rate is not None:
                estimate = rate.requests_per_minute
            token_estimate = None
            if tokens:
                token_estimate = sends.tokens.estimate(at)
                if token_estimate is None and rate is not None:
                    token_estimate = rate.tokens_per_minute
            return attribute(
                sending=sending,
                most_passed=self._slots.most_passed,
                requests=sends.requests_in_minute(at),
                requests_estimate=estimate,
                tokens=sends.tokens.held(at) if tokens else 0.0,
                tokens_estimate=token_estimate,
                # Learned, the slope rule holds every send to its allowance: a new high
                # then is the slots' (taken for the slope's, the peak's herd limit grown
                # past 32 slots taught a 5 s window and growth 1.5 from their 429s: 1.045x).
                steep=sends.steep(at),
                per_minute=per_minute,
            )

    def on_success(
        self,
        *,
        saturated: bool = True,
        probe: bool = False,
        sent_at: float | None = None,
        in_flight: int = 0,
    ) -> LimitChange | None:
        """A successful call: grow the limit back by ``1 / limit``; a change if it crossed
        a whole slot.

        Args:
            saturated: whether the gate was full when the call was admitted. A success
                while slots stood free says nothing about a higher limit, so it does not
                grow it; neither does any success during a hold after a concurrency cut.
            probe: the call was a burst-rate pause's probe: its success ends the pause.
            sent_at: when the call's successful attempt was sent, on :attr:`clock`.
            in_flight: the gate's calls at the provider when it was sent, itself
                included. With :attr:`latency` on, these two feed the latency
                estimate, a second ceiling on the gate (:meth:`_on_latency`).
        """
        if probe:
            with self._lock:
                self._pause.probe_succeeded(self._clock())
                self._learn_edge()
        change = None
        if self._latency_on and self._enabled and sent_at is not None:
            change = self._on_latency(sent_at, in_flight)
        # Unlocked fast path: at the maximum (the usual case) there is nothing to do, and a
        # stale read only delays one increment.
        slots = self._slots
        if not self._enabled or slots.limit >= slots.maximum or not saturated:
            return change
        with self._lock:
            self._adopt_external_resize()
            if not slots.active or slots.limit >= slots.maximum:
                return change
            old = self._applied
            slots.grow(self._clock(), slope_known=self._sends.slope.known)
            self._apply()
            if self._applied == old:
                return change
            return LimitChange(old, self._applied, slots.maximum, "recovered", 0.0)

    def _on_latency(self, sent_at: float, in_flight: int) -> LimitChange | None:
        """Feed the latency estimate (:class:`LatencyLimit`) and apply it. It is a second
        ceiling, under the maximum and over the floor: the gate's capacity is the lesser of
        it and the limit the throttle rules keep (:meth:`_apply`), so latencies never
        raise the gate past what throttles taught, and throttles keep their answers. Not
        a new generation: latencies move the limit at every answer, and throttles of
        attempts sent before must still count."""
        with self._lock:
            self._adopt_external_resize()
            slots = self._slots
            if slots.maximum < 1:
                return None
            latency = self._latency
            latency.bound(ceiling=slots.maximum, floor=slots.floor_now)
            latency.observe(self._clock() - sent_at, in_flight)
            old = self._applied
            self._apply()
            if self._applied == old:
                return None
            return LimitChange(old, self._applied, slots.maximum, "latency", 0.0)

    def _paced(self) -> bool:
        # Something bounds the send rate: the pause's probe need not be waited for.
        return self._sends.slope.known

    def _learn_edge(self) -> None:
        """A pause just ended: a confirmed one's probe's send time is the spent window's
        end; one that turned a herd away releases it in waves (unless the slope, known,
        holds the sends)."""
        pause = self._pause
        edge = pause.take_edge()
        sends = self._sends
        if edge is not None and self._turned < edge:
            sends.edge(self._turned, edge)
        release = pause.take_release()
        # A herd: most of those it holds were turned away. A few 429s among many held (a
        # shared pool's noise) let everyone go, as before: paced by doubling waves after
        # each of its checks, the storm benchmark's shared-pool cell went 1.004 -> 1.014.
        if release is not None and not sends.slope.known:
            now, round_trip, turned = release
            if 2 * turned >= len(self._held):
                sends.release = Release(now, round_trip)

    def _pace_gate(self) -> Gate | None:
        """The gate, if pacing may set its rate: on, and the gate on our clock (its
        budgets refill on its own clock; paced from another, a virtual clock in a test
        next to a gate on real time, the rate would never refill)."""
        if not self._pace:
            return None
        gate = self._gate()
        if gate is None or gate._clock is not self._clock:
            return None
        return gate

    # ------------------------------------------------------------------ configuring

    @ki_protected
    def resize(self, maximum: float) -> None:
        """Set the configured maximum (``inf`` = no cap) and apply it to the gate.

        A limit that is down after a throttle stays down (capped at the new maximum) and
        grows back to the new maximum; a limit at the old maximum follows to the new one.

        Raises:
            TypeError, ValueError: ``maximum`` is not an int >= 0 (at most 2**53) or inf;
                nothing changes.
        """

        maximum = check_capacity(maximum)
        with self._lock:
            self._adopt_external_resize()
            self._slots.resize(maximum)
            self._apply(force=True)

    @ki_protected
    def configure(
        self,
        *,
        enabled: bool | None = None,
        min_concurrent_calls: int | None = None,
        decrease_factor: float | None = None,
        pause_s: float | None = None,
        pace_burst_rate: bool | None = None,
        latency: bool | None = None,
    ) -> None:
        """Change settings live; ``None`` keeps a setting. Turning it off restores the
        maximum at once, ends any pause and gives the gate its own rate back (as does
        turning pacing off).

        Raises:
            TypeError, ValueError: a bad setting; every one is checked before any applies.
        """
        checked = _check_settings(min_concurrent_calls, decrease_factor, pause_s, none=True)
        min_concurrent_calls, decrease_factor, pause_s = checked
        check_flag("enabled", enabled, none=True)
        check_flag("pace_burst_rate", pace_burst_rate, none=True)
        check_flag("latency", latency, none=True)
        with self._lock:
            self._adopt_external_resize()
            if min_concurrent_calls is not None:
                self._slots.floor = min_concurrent_calls
            if decrease_factor is not None:
                self._slots.factor = decrease_factor
            if pause_s is not None:
                self._pause_s = pause_s
            if enabled is not None:
                self._enabled = enabled
            if pace_burst_rate is not None:
                self._pace = pace_burst_rate
            if latency is not None and latency != self._latency_on:
                self._latency_on = latency
                self._latency = LatencyLimit()  # what it learned before is stale
            if not self._enabled:
                self._slots.reset(self._slots.maximum)
                self._pause.end(self._clock())
            self._apply(force=True)

    # ------------------------------------------------------------------ internals (locked)

    def _old_news(self, generation: int | None, unknown_is_stale: bool) -> bool:
        """Whether a throttle comes from an attempt admitted before the latest change (one
        cut per episode); counted. ``unknown_is_stale``: the answer without a generation."""
        stale = unknown_is_stale if generation is None else generation != self._generation
        if stale:
            self._stale += 1
        return stale

    def _adopt_external_resize(self) -> None:
        gate = self._gate()
        if gate is None:
            return
        capacity = gate.capacity
        if capacity != self._applied:
            # Someone resized the gate directly; their number is the new maximum.
            self._slots.reset(capacity)
            self._applied = capacity

    def _apply(self, *, force: bool = False) -> None:
        gate = self._gate()
        if gate is None:
            return
        slots = self._slots
        capacity = slots.capacity() if self._enabled else slots.maximum
        latency = self._latency.limit if self._latency_on and self._enabled else None
        if latency is not None and slots.maximum >= 1:
            # The latency estimate (issue 30 item 5), a second ceiling (_on_latency).
            capacity = min(capacity, capacity_for(latency, floor=slots.floor_now))
        if force or capacity != self._applied:
            gate.capacity = capacity
            self._applied = capacity


def _check_settings(
    floor: object, factor: object, pause_s: object, *, none: bool = False
) -> tuple[Any, Any, Any]:
    """Validate the adaptive settings through the shared number checks."""
    floor = check_int("min_concurrent_calls", floor, minimum=1, none=none)
    pause_s = check_number("pause_s", pause_s, none=none)
    if factor is not None or not none:
        if isinstance(factor, bool) or not isinstance(factor, (int, float)):
            msg = f"decrease_factor must be a number > 0 and < 1 (got {show(factor)})"
            raise TypeError(msg)
        if not 0 < factor < 1:  # exact for ints of any size; False for NaN
            msg = f"decrease_factor must be a number > 0 and < 1 (got {show(factor)})"
            raise ValueError(msg)
        factor = float(factor)
    return floor, factor, pause_s
