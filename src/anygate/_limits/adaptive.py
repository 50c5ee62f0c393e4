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
machine (:mod:`anygate._limits.pause`), run under this lock; each estimate is pure
arithmetic in :mod:`anygate._limits`. The values and arithmetic live in
:mod:`anygate._config.limit_values`; the per-gate lookup in :mod:`anygate._policy.sharing`.
It never delays a call while the provider is happy.

Thread-safe: one ``threading.Lock`` per instance, held for a few assignments and the
gate's capacity setter (the gate's lock nests inside ours, never the reverse). The clock
is injectable, so the simulator and tests run it on virtual time.
"""

from __future__ import annotations

import math
from typing import final

from .._config.limit_values import (
    DEFAULT_HOLD_S,
    DEFAULT_MAX_HOLD_S,
    AdaptiveStatistics,
    LimitChange,
)
from .._gate.gate_args import check_capacity
from .._gate.waiters import ki_protected
from .._validation import check_flag
from .burst import BurstAnswer
from .latency import LatencyLimit
from .state import HeldCeiling, check_settings

__all__ = ["AdaptiveLimit"]


@final
class AdaptiveLimit(BurstAnswer):
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

    __slots__ = ()

    @property
    def max_concurrent_calls(self) -> float:
        """The configured maximum (``inf`` = no cap)."""
        with self._lock:
            self._adopt_external_resize()
            return self._slots.maximum

    @property
    def latency(self) -> bool:
        """Whether successes' latencies set the limit (:mod:`anygate._limits.latency`)."""
        return self._latency_on

    @property
    def pace_burst_rate(self) -> bool:
        """Whether a burst throttle teaches the slope rule sends are held to (instead of
        cutting the limit)."""
        return self._pace

    @property
    def probes_published_slots(self) -> bool:
        """Whether the gate's maximum is a *published* slot count that the answers'
        latencies may raise (a policy with ``concurrency_is_ceiling=False``)."""
        return self._above is not None

    def _probe_published_slots(self, on: bool) -> None:
        """Let successes' latencies raise the gate above its maximum (``on``): the
        maximum is the provider's published slot count, a starting point. A local model
        server started with more slots than the count the client was given (llama.cpp
        ``--parallel 4`` and a published 1) queues nothing at the published count: the
        latencies show the slots (:mod:`.latency`), and the gate goes up to
        ``max(1.5 x slots, slots + 1)`` of them. Never above the calls in flight less one
        at a refusal (a concurrency 429, an overload answer, a full queue's 503), so a
        hosted API whose latency says nothing of its slots pays one refusal, and never
        below what the throttle rules allow. Set by the policy that states the gate's
        maximum (``_policy.sharing.apply_ceiling``)."""
        with self._lock:
            if not on:
                self._above, self._above_held, self._above_refuses = None, None, False
            elif self._above is None:
                self._above = math.inf
            self._apply()

    def _refused_above(self, in_flight: int) -> bool:
        # A refusal with ``in_flight`` at the provider: a published slot count's latency
        # probe goes no higher than the calls in flight less one (never below the count).
        # Whether that lowered it.
        above = self._above
        if above is None:
            return False
        self._above = min(above, max(self._slots.maximum, in_flight - 1.0))
        return self._above < above

    @ki_protected
    def on_refusal(self, in_flight: int, *, slots: bool = False, window: bool = False) -> None:
        """A call sent with ``in_flight`` of this gate's calls at the provider (itself
        included) was refused: a 429 of any kind, an overload answer, a server's 503
        "busy" (its queue is full). Above a published slot count (a policy's
        ``concurrency_is_ceiling=False``), the latencies may raise the gate no higher than
        ``in_flight - 1``: from now on when the refusal is the slots' by its words
        (``slots``: a full queue's "busy"; a concurrency 429 or an overload answer say so
        through :meth:`on_concurrency`), else for a hold (:data:`DEFAULT_HOLD_S`, twice
        as long each time it is refused there again, up to :data:`DEFAULT_MAX_HOLD_S`).
        At or below the count, or with no more calls out than once got through together,
        it says nothing of the slots above. ``window``: the 429 names the slope's or a
        minute's window, which says nothing of the slots and holds nothing.

        Any 429 (``window`` too) shows a server that refuses what it cannot take, a
        hosted API: it queues nothing, its latencies are its answers' lengths, and from
        then on the raise goes one past the most calls seen through at once instead of
        to the latencies' estimate. Nothing else: the throttle rules and the retry
        answer the refusal.

        Measured (docs/policy.md, "A published slot count", has the history): a local
        server's "busy" 503s, unread, lost a call; held for good at any refusal, a
        published 16 with 32 real slots took 1.61x the oracle, held at a slope 429
        1.094x, and as above 1.005x."""
        if self._above is None or not self._enabled:
            return
        if in_flight <= self._slots.maximum and not window:
            return
        with self._lock:
            if window:
                if not self._above_refuses:
                    self._above_refuses = True
                    self._apply()
                return
            if in_flight <= self._slots.most_passed:
                # As many got through at once before: not the slots' (they did not
                # shrink, or their own 429s say so). A slope rule's plain 429 at 17 in
                # flight, after 29 had got through, held a published 16 with 32 real
                # slots at 16 for 30 s (plain 429s, seed 2); an outage's 503s at every
                # count, taken for a full queue's, held it at 16 for the rest of the run.
                return
            if slots:
                if self._refused_above(in_flight):
                    self._apply()
                return
            self._above_refuses = True  # a 429 or an overload answer, not a queue's "busy"
            now = self._clock()
            ceiling = max(self._slots.maximum, in_flight - 1.0)
            held = self._above_held
            if held is not None and ceiling >= held.ceiling and now < held.until:
                return  # the ceiling holds already
            hold = DEFAULT_HOLD_S
            if held is not None and abs(ceiling - held.ceiling) <= 1:
                hold = min(2 * held.hold_s, DEFAULT_MAX_HOLD_S)  # refused there again
            self._above_held = HeldCeiling(ceiling, now + hold, hold)
            self._apply()

    def settings(self) -> tuple[bool, int, float, float]:
        """``(enabled, min_concurrent_calls, decrease_factor, pause_s)``."""
        slots = self._slots
        return self._enabled, slots.floor, slots.factor, self._pause_s

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
                probe_slots_returned=self._pause.slots_returned,
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
    def on_concurrency(
        self, generation: int | None, in_flight: int, *, exact: bool, tentative: bool = False
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
            tentative: the 429 did not say it was the slots' (a plain one attributed to
                them): the first lesson at a level holds nothing and is undone by a pass
                above it; a second there confirms it
                (:meth:`anygate._limits.concurrency.ConcurrencyLimit.cut`).

        One cut per generation, as for burst-rate throttles; a concurrency 429 for an
        attempt admitted just before the latest lesson (nothing else changed since) only
        tightens it to its own count, if lower. After a cut the limit holds
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
            old = self._applied
            if not tentative and (exact or in_flight > 1) and self._refused_above(in_flight):
                self._above_refuses = self._above_refuses or exact
                self._apply()  # whether or not the throttle teaches the limit below
            if self._old_news(generation, slots.holding(now)):
                # One sent before the lesson, nothing changed since: the same overshoot's
                # 429s come back in any order, and the least count bounds the slots. Taken
                # from the first answer alone, the peak x10's (plain 429s) read 373 of 320
                # slots at 30 s, and its next window's release was turned away by the 53.
                if not (
                    exact
                    and generation == self._lesson_generation == self._generation - 1
                    and slots.tighten(in_flight)
                ):
                    return None
            elif slots.cut(in_flight, now, exact=exact, tentative=tentative):
                self._lesson_generation = self._generation
                self._generation += 1
                self._throttles += 1
            else:
                return None
            self._apply()
            return LimitChange(old, self._applied, slots.maximum, "concurrency", 0.0)

    def on_success(
        self,
        *,
        saturated: bool = True,
        probe: bool = False,
        sent_at: float | None = None,
        in_flight: int = 0,
        caller: object | None = None,
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
            caller: the call (the object it passed to :meth:`pass_pause`): a probe
                whose pause's grace ended ends no later pause.
        """
        if probe:
            with self._lock:
                checking, now = self._pause.checking, self._clock()
                self._pause.probe_succeeded(now, caller)
                self._check_ended(checking, now)
                self._learn_edge()
        change = None
        if self._latency_fed() and self._enabled and sent_at is not None:
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
            slope = self._sends.slope
            slots.grow(self._clock(), slope_known=slope.known, window_s=slope.window_s)
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
            ceiling = slots.maximum if self._above is None else math.inf
            floor: float = slots.floor_now
            if self._above is not None and not self._latency_on:
                # Raising a published count: the latencies never take the gate below it,
                # so a probe down below it would wait for a level the gate never sends
                # at (a published 16, the probe at 13: 90 s at 16 of 32 slots).
                floor = max(floor, slots.maximum)
            latency.bound(ceiling=ceiling, floor=floor)
            latency.observe(self._clock() - sent_at, in_flight)
            old = self._applied
            self._apply()
            if self._applied == old:
                return None
            return LimitChange(old, self._applied, slots.maximum, "latency", 0.0)

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
        checked = check_settings(min_concurrent_calls, decrease_factor, pause_s, none=True)
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
