"""The adaptive limit's state, and the steps that write it to the gate.

Why. :class:`~anygate._limits.adaptive.AdaptiveLimit` is one object under one lock (a
throttle changes the limit, the generation and the pause in one step), but its concerns are
several: the state and its settings (here), the send path every attempt takes
(:mod:`.sending`), the burst answer with its pause and checks (:mod:`.burst`) and the public
reactions (:mod:`.adaptive`). Each is a class in that chain, adding methods over the one
set of slots declared here, as the gate's ledger is split (:mod:`anygate._gate.ledger`).

What. :class:`AdaptiveState`: every field, the constructor (its arguments are
:class:`~anygate._limits.adaptive.AdaptiveLimit`'s), and the locked internals: whether a
throttle is old news (its generation), adopting a resize made on the gate directly, and
writing the capacity the limits mean to the gate. Not for use on its own.
"""

from __future__ import annotations

import math
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, NamedTuple

from .._config.limit_values import (
    DEFAULT_DECREASE_FACTOR,
    DEFAULT_ENABLED,
    DEFAULT_LATENCY,
    DEFAULT_MIN_CONCURRENT_CALLS,
    DEFAULT_PACE_BURST_RATE,
    DEFAULT_PAUSE_MS,
    capacity_for,
)
from .._validation import check_flag, check_int, check_number, show
from .concurrency import ConcurrencyLimit
from .latency import LatencyLimit
from .pause import BurstPause
from .sends import Sends

if TYPE_CHECKING:
    from collections.abc import Callable

    from .._config.limit_values import LimitChange
    from .._gate.gate import Gate
    from .published import PublishedProbe, TokenProbe


__all__ = ["AdaptiveState", "HeldCeiling", "check_settings"]


class HeldCeiling(NamedTuple):
    """A published slot count's raise capped by a refusal that need not be the slots'
    (:meth:`anygate.AdaptiveLimit.on_refusal`): the cap, until when, and for how long."""

    ceiling: float
    until: float
    hold_s: float


class AdaptiveState:
    """The fields and locked internals of :class:`~anygate._limits.adaptive.AdaptiveLimit`
    (see the module docstring); its arguments are documented there."""

    __slots__ = (
        "__weakref__",
        "_above",
        "_above_held",
        "_above_refuses",
        "_accepted",
        "_ahead",
        "_applied",
        "_below",
        "_burst_generation",
        "_check_at",
        "_check_sent",
        "_checks",
        "_clock",
        "_enabled",
        "_gate",
        "_generation",
        "_held",
        "_latency",
        "_latency_on",
        "_lesson_generation",
        "_lock",
        "_name",
        "_noise_at",
        "_out",
        "_pace",
        "_pause",
        "_pause_s",
        "_published",
        "_published_tokens",
        "_sends",
        "_sent",
        "_slots",
        "_stale",
        "_suspect",
        "_throttles",
        "_unreported",
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
        check_flag("enabled", enabled)
        check_flag("pace_burst_rate", pace_burst_rate)
        check_flag("latency", latency)
        if not callable(clock):  # typed callable, but from untyped code anything comes
            msg = f"clock must be a callable returning seconds (got {show(clock)})"  # type: ignore[unreachable]
            raise TypeError(msg)
        min_concurrent_calls, decrease_factor, pause_s = check_settings(
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
        self._lesson_generation = -1  # the generation a concurrency lesson ended
        # The generation the latest burst answer (a check or a pause) began: a burst
        # throttle of an attempt admitted since is news, whatever else changed (see
        # BurstAnswer.on_throttle).
        self._burst_generation = 0
        self._throttles = 0
        self._checks = 0  # first throttles checked (see on_throttle)
        self._stale = 0
        # A burst-rate pause, ended by one probe (its own module).
        self._pause = BurstPause(f"adaptive {gate.name}")
        self._pace = pace_burst_rate
        # The windows a send is held to: slope, release, tokens and requests (issue 30).
        self._sends = Sends()
        # The upward probe of a published request rate (``published_rate``), when on.
        self._published: PublishedProbe | None = None
        # ... and of a published token rate.
        self._published_tokens: TokenProbe | None = None
        # Attempts holding a slot while held back (a pause, a window's hold): not at the
        # provider, so not in flight for its concurrency limit (see sending()).
        self._held: set[object] = set()
        # Attempts sent and not yet answered, each with its place in the send order, the
        # count of such attempts at its send, itself included, and whether the provider
        # accepted it already (its answer started; see SendPath.passed and .accepted).
        self._out: dict[object, tuple[int, int, bool]] = {}
        self._sent = 0  # attempts sent so far: the send order
        # Calls whose burst 429 was taken for noise: their retry goes ahead (goes_ahead).
        self._ahead: set[object] = set()
        # Calls whose attempt the provider accepted before it ended, by that attempt's
        # send time: its pass went to the request estimate then (SendPath.accepted), so
        # not again when the attempt ends.
        self._accepted: dict[object, float] = {}
        # A plain 429 taken for the slope rule's at a new high of calls at the provider:
        # (its send time, those calls), until its throttle is checked (see burst.py).
        self._suspect: tuple[float, int] | None = None
        # The check of such a 429: its probe goes once fewer than this many calls are at
        # the provider (itself included); ``None``: no such check.
        self._below: int | None = None
        self._check_at = -math.inf  # when the current check began
        self._check_sent = -math.inf  # when the send it checks went (now if unknown)
        self._noise_at = -math.inf  # the last burst 429 well inside the slope (noise)
        # A change the limit made on its own, outside a throttle's call (such a check
        # whose probe got through), until the policy reports it (take_change).
        self._unreported: LimitChange | None = None
        # The limit a queueing server's latencies show (issue 30 item 5), when on.
        self._latency_on = latency
        self._latency = LatencyLimit()
        # A published slot count (``_probe_published_slots``): the most the latencies may
        # take the gate above its maximum, lowered to the calls in flight less one at each
        # refusal; ``None``: the maximum is a ceiling.
        self._above: float | None = None
        # A ceiling a refusal that need not be the slots' set: (ceiling, until, hold).
        self._above_held: HeldCeiling | None = None
        # A 429 came (a window's at any count; a concurrency or plain one above the
        # count): the server refuses what it cannot take, so its latencies no longer set
        # the raise (``_apply``).
        self._above_refuses = False

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
    def generation(self) -> int:
        """Bumped at every decrease; attempts record it when admitted."""
        return self._generation

    # ------------------------------------------------------------------ internals (locked)

    def _latency_fed(self) -> bool:
        # Successes feed the latency estimate: it is on, or it may raise a published
        # slot count (``_above``).
        return self._latency_on or self._above is not None

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

    def _paced(self) -> bool:
        # Something bounds the send rate: the pause's probe need not be waited for.
        return self._sends.slope.known

    def _old_news(
        self, generation: int | None, unknown_is_stale: bool, *, since: int | None = None
    ) -> bool:
        """Whether a throttle comes from an attempt admitted before the latest change (one
        cut per episode), or before generation ``since`` when given (the latest change
        of its own kind); counted. ``unknown_is_stale``: the answer without a
        generation."""
        if generation is None:
            stale = unknown_is_stale
        else:
            stale = generation != self._generation if since is None else generation < since
        if stale:
            self._stale += 1
        return stale

    def _burst_answer_began(self) -> None:
        """A check or a pause began: a new generation, and the burst one (a burst 429 of
        an attempt admitted before it is old news; one admitted before a slots' lesson
        since is not: that lesson holds nothing back from a spent window, and its retry
        went straight into it, reject latency 0.3 s, seed 5, eight sends after it)."""
        self._generation += 1
        self._burst_generation = self._generation

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
        latency = self._latency.limit if self._latency_fed() and self._enabled else None
        if (
            latency is None
            and self._above is not None
            and self._enabled
            and 1 <= slots.maximum <= slots.limit
        ):
            # A published slot count with nothing answered yet: one past it, as after
            # (below; the count is the known-good level). Waiting for the first answer
            # cost a local server with more slots than published one answer's time at
            # the count: published 1, seeds 1-20, real 2 / 4 / 16: 1.027x / 1.148x /
            # 1.368x the oracle -> 1.000x / 1.070x / 1.234x.
            capacity = max(capacity, min(slots.maximum + 1, self._above))
        if latency is not None and slots.maximum >= 1:
            shown = capacity_for(latency, floor=slots.floor_now)
            if self._latency_on:
                # The latency estimate (issue 30 item 5), a second ceiling (_on_latency).
                capacity = min(capacity, shown)
            above = self._above
            held = self._above_held
            if above is not None and held is not None and self._clock() < held.until:
                above = min(above, held.ceiling)  # a refusal's ceiling, while it holds
            # Rounded, not floored: the estimate errs either way by the answers' noise,
            # and floored, 4 slots read as 1.85 at 2 in flight held the gate at 2.
            nearest = capacity_for(latency + 0.5, floor=slots.floor_now)
            if self._above_refuses:
                # A server that answered a 429 refuses what it cannot take and queues
                # nothing: its latencies are its answers' lengths. Read as a queue, they
                # held a published 16 with 32 real slots at 16-25 for minutes (morning
                # peak, seeds 2 and 5: 1.29x and 1.36x the oracle). The raise goes one
                # past the most seen through (below), to the refusal's ceiling.
                nearest = math.inf
            # Only while no throttle holds the limit below the stated count: a provider
            # with 16 slots behind a published 32 taught 16, and the latencies, which
            # showed no queue (it refuses instead), took the gate back to 32: 58 % of
            # calls with a 429 and calls lost (morning peak, seeds 1-3).
            if above is not None and nearest > capacity and slots.limit >= slots.maximum:
                # A published slot count is a starting point: the latencies may show more
                # (``AdaptiveLimit._probe_published_slots``), up to the last refusal, and
                # one past the count until a call got through there (DESIGN.md, "one
                # request per round trip beyond the known-good level"): a hosted API's
                # latency says nothing of its slots, and a jump from 32 to the estimate's
                # 48 sent 16 calls into 429s (0.10 % -> 0.56 % of calls).
                if slots.most_passed <= slots.maximum:
                    nearest = min(nearest, slots.maximum + 1)
                elif self._above_refuses:
                    # A server that refuses (and any refused above the count: a hold,
                    # which may have ended): one past the most that got through at once,
                    # as past the count. Raised to the estimate at each hold's end, a
                    # published 16 with 32 plain slots sent ten calls past them each
                    # time (2.5 % of calls a 429).
                    known = (
                        slots.most_passed if held is None else max(held.ceiling, slots.most_passed)
                    )
                    nearest = min(nearest, known + 1)
                capacity = max(capacity, min(nearest, above))
        if force or capacity != self._applied:
            gate.capacity = capacity
            self._applied = capacity


def check_settings(
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
