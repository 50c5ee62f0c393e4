"""OpenTelemetry metrics and spans for anygate, built only on its public API.

Everything comes from two public sources: the events a policy delivers to its hooks
(:class:`~anygate.SlotAdmitted`, :class:`~anygate.RetryScheduled`, :class:`~anygate.GaveUp`,
...) and the ``statistics()`` snapshots of gates, breakers and adaptive limits, read by
observable instruments when the SDK collects. Nothing here reaches into anygate's internals,
so this module could live outside the package.

Attributes carry names and enums only (gate, policy and breaker names, reasons, kinds):
never a message, a URL, a header or a prompt, so no secret can end up in a metric backend.
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any, TypeVar, final

from opentelemetry import metrics, trace

from .. import (
    BreakerState,
    BreakerStateChanged,
    CircuitBreaker,
    Gate,
    GaveUp,
    LimitChanged,
    Policy,
    RetryScheduled,
    SlotAdmitted,
)
from .._validation import check_flag

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable

    from .. import AdaptiveLimit, Event, Verdict

__all__ = ["Telemetry", "throttle_kind"]

T = TypeVar("T")

GATE = "anygate.gate.name"
POLICY = "anygate.policy.name"
BREAKER = "anygate.breaker.name"
REASON = "anygate.reason"
KIND = "anygate.throttle.kind"
WHY = "anygate.give_up.why"
STATE = "anygate.breaker.state"

# Slot waits range from microseconds (uncontended) to minutes (a queue behind a slow model).
_WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_STATES = (BreakerState.CLOSED, BreakerState.HALF_OPEN, BreakerState.OPEN)


def throttle_kind(verdict: Verdict) -> str | None:
    """Which kind of provider throttle a failure was, or ``None`` if it was none.

    ``"burst"``: the request rate rose too steeply (``limit_burst_rate``); ``"overload"``:
    the provider is overloaded (529, ``overloaded_error``, "try again later"); ``"concurrency"``:
    a retriable 429 whose code names concurrent requests; ``"rate"``: any other retriable
    429 (requests or tokens per minute). A quota 429 (billing) is not a throttle.
    """
    reason = verdict.reason.value
    if reason == "burst_rate":
        return "burst"
    if reason == "busy":
        return "overload"
    if reason == "transient" and verdict.status == 429:  # not quota: that is billing
        code = (verdict.code or "").lower()
        return "concurrency" if "concurren" in code else "rate"
    return None


@final
class Telemetry:
    """OpenTelemetry instruments for anygate: pass it as a policy hook and observe gates.

    ::

        telemetry = anygate.otel.Telemetry()           # the global meter/tracer providers
        policy = anygate.Policy(name="llm", hooks=[telemetry])
        telemetry.observe(policy)                      # gauges for its gate, breaker, limit

    As a hook (it is callable) it records, per event: ``anygate.attempts`` (each admitted
    attempt), ``anygate.gate.wait.duration`` (histogram, s), ``anygate.retries`` and
    ``anygate.give_ups`` by ``anygate.reason``, ``anygate.throttles`` by
    ``anygate.throttle.kind`` and ``anygate.breaker.transitions``. For every object given to
    :meth:`observe` it reports, when the SDK collects: ``anygate.gate.in_flight``,
    ``anygate.gate.waiting``, ``anygate.gate.capacity`` (gauges),
    ``anygate.gate.admitted`` and ``anygate.gate.refusals`` (counters),
    ``anygate.breaker.state`` (1 for the current state, 0 for the others) and
    ``anygate.adaptive.limit``. Observed gates and limits are held weakly.

    With ``spans=True``, :meth:`call` runs a policy call inside a span (a child of the
    caller's current span; the SDK's HTTP spans nest inside it) and every hook event adds
    a span event (``anygate.attempt``, ``anygate.retry``, ``anygate.give_up``) to the
    current span.

    Args:
        meter_provider: where instruments come from; default the global provider.
        tracer_provider: where :meth:`call`'s spans come from; default the global one.
        spans: add span events from hooks (and let :meth:`call` make spans).

    Raises:
        TypeError: ``spans`` is not a bool.
    """

    __slots__ = (
        "__weakref__",
        "_attempts",
        "_breakers",
        "_gates",
        "_give_ups",
        "_limits",
        "_lock",
        "_retries",
        "_spans",
        "_throttles",
        "_tracer",
        "_transitions",
        "_wait",
    )

    def __init__(
        self,
        *,
        meter_provider: metrics.MeterProvider | None = None,
        tracer_provider: trace.TracerProvider | None = None,
        spans: bool = False,
    ) -> None:
        check_flag("spans", spans)
        from .. import __version__

        meter = metrics.get_meter("anygate", __version__, meter_provider=meter_provider)
        self._tracer = trace.get_tracer("anygate", __version__, tracer_provider=tracer_provider)
        self._spans = spans
        self._lock = threading.Lock()
        self._gates: weakref.WeakSet[Gate] = weakref.WeakSet()
        # Breakers take no weak references; they are few and usually process-wide anyway.
        self._breakers: dict[int, CircuitBreaker] = {}
        self._limits: weakref.WeakSet[AdaptiveLimit] = weakref.WeakSet()
        self._attempts = meter.create_counter(
            "anygate.attempts", unit="{attempt}", description="Attempts admitted by a gate"
        )
        self._wait = meter.create_histogram(
            "anygate.gate.wait.duration",
            unit="s",
            description="Time an attempt waited for its gate slot",
            explicit_bucket_boundaries_advisory=_WAIT_BUCKETS,
        )
        self._retries = meter.create_counter(
            "anygate.retries", unit="{retry}", description="Retries scheduled, by reason"
        )
        self._give_ups = meter.create_counter(
            "anygate.give_ups", unit="{call}", description="Calls that failed for good"
        )
        self._throttles = meter.create_counter(
            "anygate.throttles", unit="{throttle}", description="Provider throttles, by kind"
        )
        self._transitions = meter.create_counter(
            "anygate.breaker.transitions", unit="{transition}", description="Breaker moves"
        )
        meter.create_observable_gauge(
            "anygate.gate.in_flight",
            [self._observe_gates("in_flight")],
            unit="{slot}",
            description="Slots in use",
        )
        meter.create_observable_gauge(
            "anygate.gate.waiting",
            [self._observe_gates("waiting")],
            unit="{caller}",
            description="Callers queued for a slot",
        )
        meter.create_observable_gauge(
            "anygate.gate.capacity",
            [self._observe_capacity],
            unit="{slot}",
            description="Current capacity (finite gates only)",
        )
        meter.create_observable_counter(
            "anygate.gate.admitted",
            [self._observe_gates("admitted")],
            unit="{slot}",
            description="Slots granted since the gate was created",
        )
        meter.create_observable_counter(
            "anygate.gate.refusals",
            [self._observe_refusals],
            unit="{request}",
            description="Acquires refused: full (timeout 0) or timed out",
        )
        meter.create_observable_gauge(
            "anygate.breaker.state",
            [self._observe_breakers],
            unit="1",
            description="1 for the breaker's current state, 0 for the others",
        )
        meter.create_observable_gauge(
            "anygate.adaptive.limit",
            [self._observe_limits],
            unit="{slot}",
            description="The adaptive concurrency limit a policy's gate applies",
        )

    def __repr__(self) -> str:
        return f"<anygate.otel.Telemetry spans={self._spans}>"

    # ------------------------------------------------------------------ observing

    def observe(self, target: Gate | CircuitBreaker | Policy) -> None:
        """Report ``target``'s state from now on: a gate, a breaker, or a policy (its gate,
        breaker and adaptive limit). Observing twice is harmless.

        Raises:
            TypeError: ``target`` is none of those.
        """
        given: object = target
        with self._lock:
            if isinstance(given, Policy):
                self._limits.add(given.adaptive_limit)
                self._gates.add(given.gate)
                if given.breaker is not None:
                    self._breakers[id(given.breaker)] = given.breaker
            elif isinstance(given, Gate):
                self._gates.add(given)
            elif isinstance(given, CircuitBreaker):
                self._breakers[id(given)] = given
            else:
                msg = f"observe() takes a Gate, CircuitBreaker or Policy (got {target!r})"
                raise TypeError(msg)

    def _snapshot(self, items: Iterable[Any]) -> list[Any]:
        with self._lock:
            return list(items)

    def _observe_gates(self, field: str) -> Callable[[metrics.CallbackOptions], Iterable[Any]]:
        def callback(options: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
            for gate in self._snapshot(self._gates):
                stats = gate.statistics()
                yield metrics.Observation(getattr(stats, field), {GATE: stats.name})

        return callback

    def _observe_capacity(self, options: metrics.CallbackOptions) -> Iterable[Any]:
        for gate in self._snapshot(self._gates):
            stats = gate.statistics()
            if stats.capacity != float("inf"):  # an unlimited gate has no number to plot
                yield metrics.Observation(stats.capacity, {GATE: stats.name})

    def _observe_refusals(self, options: metrics.CallbackOptions) -> Iterable[Any]:
        for gate in self._snapshot(self._gates):
            stats = gate.statistics()
            yield metrics.Observation(stats.rejected, {GATE: stats.name, REASON: "full"})
            yield metrics.Observation(stats.timed_out, {GATE: stats.name, REASON: "timeout"})

    def _observe_breakers(self, options: metrics.CallbackOptions) -> Iterable[Any]:
        for breaker in self._snapshot(self._breakers.values()):
            current = breaker.state
            for state in _STATES:
                yield metrics.Observation(
                    int(state is current), {BREAKER: breaker.name, STATE: str(state)}
                )

    def _observe_limits(self, options: metrics.CallbackOptions) -> Iterable[Any]:
        for limit in self._snapshot(self._limits):
            stats = limit.statistics()
            if stats.enabled and stats.limit != float("inf"):
                yield metrics.Observation(stats.limit, {GATE: stats.gate})

    # ------------------------------------------------------------------ the hook

    def __call__(self, event: Event) -> None:
        """The policy hook: record ``event`` (and add a span event when ``spans=True``)."""
        if isinstance(event, SlotAdmitted):
            attrs = {GATE: event.gate, POLICY: event.policy}
            self._attempts.add(1, attrs)
            self._wait.record(event.waited_s, attrs)
            self._span_event("anygate.attempt", {"anygate.attempt": event.attempt, **attrs})
        elif isinstance(event, RetryScheduled):
            self._retries.add(1, {POLICY: event.policy, REASON: event.reason.value})
            self._throttle(event.policy, event.verdict)
            self._span_event(
                "anygate.retry",
                {
                    "anygate.attempt": event.attempt,
                    REASON: event.reason.value,
                    "anygate.retry.delay": event.wait_ms / 1000,
                },
            )
        elif isinstance(event, GaveUp):
            attrs = {POLICY: event.policy, REASON: event.reason.value, WHY: event.why}
            self._give_ups.add(1, attrs)
            self._throttle(event.policy, event.verdict)
            self._span_event("anygate.give_up", {"anygate.attempt": event.attempts, **attrs})
        elif isinstance(event, BreakerStateChanged):
            self._transitions.add(1, {BREAKER: event.breaker, STATE: event.new})
        elif isinstance(event, LimitChanged):
            self._span_event(
                "anygate.limit_changed",
                {GATE: event.gate, "anygate.limit": event.new, REASON: event.reason},
            )

    def _throttle(self, policy: str, verdict: Verdict) -> None:
        kind = throttle_kind(verdict)
        if kind is not None:
            self._throttles.add(1, {POLICY: policy, KIND: kind})

    def _span_event(self, name: str, attributes: dict[str, Any]) -> None:
        if self._spans:
            span = trace.get_current_span()
            if span.is_recording():
                span.add_event(name, attributes)

    # ------------------------------------------------------------------ spans

    async def call(
        self, policy: Policy, fn: Callable[..., Awaitable[T]], /, *args: Any, **kwargs: Any
    ) -> T:
        """``await policy.call(fn, *args, **kwargs)`` inside a span ``anygate <policy>``.

        The span is a child of the caller's current span and becomes the current span for
        ``fn``, so the HTTP client's and SDK's own spans nest inside it instead of beside it.
        Attempt, retry and give-up events land on it (with ``spans=True``). An exception
        sets the span's status to error and is re-raised unchanged.
        """
        with self._tracer.start_as_current_span(
            f"anygate {policy.name}",
            kind=trace.SpanKind.INTERNAL,
            attributes={POLICY: policy.name, GATE: policy.gate.name},
        ):
            return await policy.call(fn, *args, **kwargs)

    def call_sync(self, policy: Policy, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """The blocking twin of :meth:`call`, around :meth:`anygate.Policy.call_sync`."""
        with self._tracer.start_as_current_span(
            f"anygate {policy.name}",
            kind=trace.SpanKind.INTERNAL,
            attributes={POLICY: policy.name, GATE: policy.gate.name},
        ):
            return policy.call_sync(fn, *args, **kwargs)
