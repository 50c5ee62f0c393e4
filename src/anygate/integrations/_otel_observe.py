"""The observable instruments of :class:`anygate.otel.Telemetry`: state read when the SDK collects.

Gates, breakers, adaptive limits and rate learners handed to ``Telemetry.observe`` are
kept here and read through their public snapshots (``statistics()``, ``state``,
``limits``) only inside the SDK's collection callbacks, so observing costs nothing between
collections. Gates, limits and learners are held weakly: observing never keeps one alive (breakers and learners take no weak references; a
learner holds its own gate weakly).
"""

from __future__ import annotations

import math
import threading
import weakref
from typing import TYPE_CHECKING, Any, final

from opentelemetry import metrics

from .. import AdaptiveLimit, BreakerState, CircuitBreaker, Gate, Policy, RateLearner

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from .. import GateStatistics

__all__ = ["Observed"]

GATE = "anygate.gate.name"
BREAKER = "anygate.breaker.name"
REASON = "anygate.reason"
STATE = "anygate.breaker.state"

_STATES = (BreakerState.CLOSED, BreakerState.HALF_OPEN, BreakerState.OPEN)


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


@final
class Observed:
    """What one ``Telemetry`` observes, and the instruments that report it."""

    __slots__ = ("_breakers", "_gates", "_learners", "_limits", "_lock")

    def __init__(self, meter: metrics.Meter) -> None:
        self._lock = threading.Lock()
        self._gates: weakref.WeakSet[Gate] = weakref.WeakSet()
        # Breakers take no weak references; they are few and usually process-wide anyway.
        self._breakers: dict[int, CircuitBreaker] = {}
        self._limits: weakref.WeakSet[AdaptiveLimit] = weakref.WeakSet()
        # Learners take no weak references either; one holds its gate only weakly.
        self._learners: dict[int, RateLearner] = {}
        gauge = meter.create_observable_gauge
        gauge(
            "anygate.gate.in_flight",
            [self._gates_field("in_flight")],
            unit="{slot}",
            description="Slots in use",
        )
        gauge(
            "anygate.gate.waiting",
            [self._gates_field("waiting")],
            unit="{caller}",
            description="Callers queued for a slot",
        )
        gauge(
            "anygate.gate.capacity",
            [self._capacity],
            unit="{slot}",
            description="Current capacity (finite gates only)",
        )
        meter.create_observable_counter(
            "anygate.gate.admitted",
            [self._gates_field("admitted")],
            unit="{slot}",
            description="Slots granted since the gate was created",
        )
        meter.create_observable_counter(
            "anygate.gate.refusals",
            [self._refusals],
            unit="{request}",
            description="Acquires refused: full (timeout 0) or timed out",
        )
        gauge(
            "anygate.breaker.state",
            [self._breaker_states],
            unit="1",
            description="1 for the breaker's current state, 0 for the others",
        )
        gauge(
            "anygate.adaptive.limit",
            [self._adaptive("limit")],
            unit="{slot}",
            description="The adaptive concurrency limit a policy's gate applies",
        )
        gauge(
            "anygate.adaptive.requests_per_minute_estimate",
            [self._adaptive("requests_per_minute_estimate")],
            unit="{request}/min",
            description="The provider's per-minute request limit as the gate's counts put it",
        )
        gauge(
            "anygate.adaptive.pause",
            [self._adaptive("paused_for")],
            unit="s",
            description="Seconds left in the pause after a burst throttle",
        )
        # The gate's rate view: what it paces to now, configured, learned or paced.
        gauge(
            "anygate.rate.requests.limit",
            [self._rate("requests_per_minute")],
            unit="{request}/min",
            description="The gate's request budget per minute",
        )
        gauge(
            "anygate.rate.tokens.limit",
            [self._rate("tokens_per_minute")],
            unit="{token}/min",
            description="The gate's token budget per minute",
        )
        gauge(
            "anygate.rate.requests.available",
            [self._rate("requests_available")],
            unit="{request}",
            description="Requests the budget holds now (<0: in debt)",
        )
        gauge(
            "anygate.rate.tokens.available",
            [self._rate("tokens_available")],
            unit="{token}",
            description="Tokens the budget holds now (<0: in debt)",
        )
        gauge(
            "anygate.rate.next_admission",
            [self._rate("next_admission_s")],
            unit="s",
            description="Seconds until the budgets admit a request (0: now)",
        )
        # What rate-limit headers said, before the learner's headroom.
        gauge(
            "anygate.learned.requests.limit",
            [self._learned("requests_per_minute")],
            unit="{request}/min",
            description="Request limit learned from headers",
        )
        gauge(
            "anygate.learned.tokens.limit",
            [self._learned("tokens_per_minute")],
            unit="{token}/min",
            description="Token limit learned from headers",
        )

    def add(self, target: object) -> None:
        """Observe ``target`` from now on (see ``Telemetry.observe``)."""
        with self._lock:
            if isinstance(target, Policy):
                self._limits.add(target.adaptive_limit)
                self._gates.add(target.gate)
                if target.breaker is not None:
                    self._breakers[id(target.breaker)] = target.breaker
            elif isinstance(target, Gate):
                self._gates.add(target)
            elif isinstance(target, CircuitBreaker):
                self._breakers[id(target)] = target
            elif isinstance(target, AdaptiveLimit):
                self._limits.add(target)
            elif isinstance(target, RateLearner):
                self._learners[id(target)] = target
                self._gates.add(target.gate)
            else:
                msg = (
                    "observe() takes a Gate, CircuitBreaker, Policy, AdaptiveLimit or "
                    f"RateLearner (got {target!r})"
                )
                raise TypeError(msg)

    def _snapshot(self, items: Iterable[Any]) -> list[Any]:
        with self._lock:
            return list(items)

    def _gate_stats(self) -> list[GateStatistics]:
        return [gate.statistics() for gate in self._snapshot(self._gates)]

    def _gates_field(self, field: str) -> Callable[[metrics.CallbackOptions], Iterable[Any]]:
        def callback(options: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
            for stats in self._gate_stats():
                yield metrics.Observation(getattr(stats, field), {GATE: stats.name})

        return callback

    def _capacity(self, options: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
        for stats in self._gate_stats():
            if math.isfinite(stats.capacity):  # an unlimited gate has no number to plot
                yield metrics.Observation(stats.capacity, {GATE: stats.name})

    def _refusals(self, options: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
        for stats in self._gate_stats():
            yield metrics.Observation(stats.rejected, {GATE: stats.name, REASON: "full"})
            yield metrics.Observation(stats.timed_out, {GATE: stats.name, REASON: "timeout"})

    def _breaker_states(self, options: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
        for breaker in self._snapshot(self._breakers.values()):
            current = breaker.state
            for state in _STATES:
                yield metrics.Observation(
                    int(state is current), {BREAKER: breaker.name, STATE: str(state)}
                )

    def _adaptive(self, field: str) -> Callable[[metrics.CallbackOptions], Iterable[Any]]:
        def callback(options: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
            for limit in self._snapshot(self._limits):
                stats = limit.statistics()
                value = getattr(stats, field)
                # A disabled limit applies nothing; an infinite one (no cap) has no number.
                if stats.enabled and _finite(value):
                    yield metrics.Observation(value, {GATE: stats.gate})

        return callback

    def _rate(self, field: str) -> Callable[[metrics.CallbackOptions], Iterable[Any]]:
        def callback(options: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
            for stats in self._gate_stats():
                view = stats.rate
                if view is None:
                    continue  # no Rate: nothing paces the gate, no series at all
                value = getattr(view.rate if field.endswith("_minute") else view, field)
                if _finite(value):
                    yield metrics.Observation(value, {GATE: stats.name})

        return callback

    def _learned(self, field: str) -> Callable[[metrics.CallbackOptions], Iterable[Any]]:
        def callback(options: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
            for learner in self._snapshot(self._learners.values()):
                try:
                    gate = learner.gate.name
                except ReferenceError:  # the gate went away before its learner
                    continue
                value = getattr(learner.limits, field)
                if _finite(value):
                    yield metrics.Observation(value, {GATE: gate})

        return callback
