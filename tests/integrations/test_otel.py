"""anygate.otel: the metrics and spans a dashboard gets, read back through the SDK in memory.

Real policy calls (scripted provider errors, instant retries) feed a ``Telemetry`` hook;
an ``InMemoryMetricReader`` collects what the OpenTelemetry SDK would export, and an
``InMemorySpanExporter`` what a tracer would send.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

import anygate
from anygate import BreakerConfig, CallFailed, Policy, ResponseError, Verdict
from tests.policy_helpers import Script, burst, quota, transient

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)

from anygate.otel import Telemetry, throttle_kind

pytestmark = pytest.mark.anyio


def _reader() -> tuple[InMemoryMetricReader, MeterProvider]:
    reader = InMemoryMetricReader()
    return reader, MeterProvider(metric_readers=[reader])


def _points(reader: InMemoryMetricReader) -> dict[str, list[tuple[dict[str, Any], Any]]]:
    """Metric name -> [(attributes, value or histogram point)] from one collection."""
    data = reader.get_metrics_data()
    out: dict[str, list[tuple[dict[str, Any], Any]]] = {}
    assert data is not None
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    value = getattr(point, "value", point)
                    out.setdefault(metric.name, []).append((dict(point.attributes), value))
    return out


def _value(points: dict[str, list[Any]], name: str, **attrs: Any) -> Any:
    wanted = {f"anygate.{k.replace('_', '.')}": v for k, v in attrs.items()}
    matches = [v for a, v in points.get(name, []) if wanted.items() <= a.items()]
    assert len(matches) == 1, (name, attrs, points.get(name))
    return matches[0]


async def test_attempts_retries_give_ups_and_throttles_are_counted() -> None:
    """One call retried after a 503 and a burst throttle, one quota give-up: every counter
    has the right value and attributes, and no attribute carries a message or key."""
    reader, provider = _reader()
    telemetry = Telemetry(meter_provider=provider)
    policy = Policy(name="chat", circuit_breaker=None, hooks=[telemetry])
    with anygate.set_testing(True):
        assert await policy.call(Script(burst(), transient())) == "ok"
        with pytest.raises(CallFailed):
            await policy.call(Script(quota()))
    points = _points(reader)
    assert _value(points, "anygate.attempts", policy_name="chat") == 4
    assert _value(points, "anygate.retries", reason="transient") == 1
    assert _value(points, "anygate.retries", reason="burst_rate") == 1
    assert _value(points, "anygate.give_ups", reason="quota") == 1
    assert points["anygate.give_ups"][0][0]["anygate.give_up.why"] == "not_retriable"
    assert _value(points, "anygate.throttles", throttle_kind="burst") == 1
    assert {a["anygate.throttle.kind"] for a, _ in points["anygate.throttles"]} == {"burst"}
    wait = _value(points, "anygate.gate.wait.duration", gate_name="chat")
    assert wait.count == 4
    allowed = {
        "anygate.gate.name",
        "anygate.policy.name",
        "anygate.reason",
        "anygate.throttle.kind",
        "anygate.give_up.why",
        "error.type",
    }
    for series in points.values():
        for attrs, _ in series:
            assert set(attrs) <= allowed, attrs


async def test_gauges_read_the_gate_breaker_and_limit_live() -> None:
    """Observable gauges report in-flight, waiting, capacity, refusals, breaker state and
    the adaptive limit at collection time."""
    reader, provider = _reader()
    telemetry = Telemetry(meter_provider=provider)
    policy = Policy(
        name="llm",
        max_concurrent_calls=2,
        circuit_breaker=BreakerConfig(when_open="fail", failure_threshold=1),
        adaptive_concurrency=True,
        hooks=[telemetry],
    )
    telemetry.observe(policy)
    gate = policy.gate
    first = gate.acquire_nowait()
    second = gate.acquire_nowait()
    with pytest.raises(anygate.Busy):
        gate.acquire_nowait()

    async def queue() -> None:
        await gate.acquire()

    async with anyio.create_task_group() as tg:
        tg.start_soon(queue)
        await anyio.wait_all_tasks_blocked()
        points = _points(reader)
        tg.cancel_scope.cancel()
    first.release()
    second.release()
    assert _value(points, "anygate.gate.in_flight", gate_name="llm") == 2
    assert _value(points, "anygate.gate.waiting", gate_name="llm") == 1
    assert _value(points, "anygate.gate.capacity", gate_name="llm") == 2
    assert _value(points, "anygate.gate.refusals", reason="full") == 1
    assert _value(points, "anygate.adaptive.limit", gate_name="llm") == 2
    assert _value(points, "anygate.breaker.state", breaker_state="closed") == 1
    assert _value(points, "anygate.breaker.state", breaker_state="open") == 0
    with anygate.set_testing(True), pytest.raises(CallFailed):
        await policy.call(Script(quota(), transient(), transient(), transient()))
    with anygate.set_testing(True), pytest.raises(CallFailed):
        await policy.call(Script(transient(), transient(), transient()))
    points = _points(reader)
    assert _value(points, "anygate.breaker.state", breaker_state="open") == 1
    assert _value(points, "anygate.breaker.transitions", breaker_state="open") == 1


async def test_spans_nest_in_the_callers_trace_with_attempt_events() -> None:
    """``Telemetry.call`` makes one span per call, a child of the caller's span; the inner
    work's spans are its children; attempt and retry events are on it."""
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    _, meter_provider = _reader()
    telemetry = Telemetry(
        meter_provider=meter_provider, tracer_provider=tracer_provider, spans=True
    )
    policy = Policy(name="chat", circuit_breaker=None, hooks=[telemetry])
    tracer = tracer_provider.get_tracer("app")
    script = Script(transient())

    async def provider_call() -> object:
        with tracer.start_as_current_span("POST /v1/chat/completions"):
            return await script()

    with anygate.set_testing(True), tracer.start_as_current_span("handle request") as outer:
        assert await telemetry.call(policy, provider_call) == "ok"
    spans = {span.name: span for span in exporter.get_finished_spans()}
    ours = spans["anygate chat"]
    assert ours.parent is not None
    assert ours.parent.span_id == outer.get_span_context().span_id
    http = spans["POST /v1/chat/completions"]
    assert http.parent is not None
    assert http.parent.span_id == ours.context.span_id
    assert [event.name for event in ours.events] == [
        "anygate.attempt",
        "anygate.retry",
        "anygate.attempt",
    ]
    assert ours.events[1].attributes is not None
    assert ours.events[1].attributes["anygate.reason"] == "transient"


def test_throttle_kinds() -> None:
    """Burst, overload, concurrency and rate throttles are told apart; others are none."""
    reason = anygate.Reason
    assert throttle_kind(Verdict(reason.BURST_RATE, True, status=429)) == "burst"
    assert throttle_kind(Verdict(reason.BUSY, True, status=529)) == "overload"
    assert throttle_kind(Verdict(reason.TRANSIENT, True, status=429)) == "rate"
    concurrent = Verdict(reason.TRANSIENT, True, status=429, code="concurrency_limit_exceeded")
    assert throttle_kind(concurrent) == "concurrency"
    assert throttle_kind(Verdict(reason.TRANSIENT, True, status=503)) is None
    assert throttle_kind(anygate.classify(ResponseError(500))) is None
    assert throttle_kind(anygate.classify(quota())) is None  # billing, not a throttle


def test_arguments_are_checked() -> None:
    """Bad arguments name the parameter and the value."""
    with pytest.raises(TypeError, match=r"spans must be a bool \(got 1 of type int\)"):
        Telemetry(spans=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"observe\(\) takes a Gate, CircuitBreaker, Policy"):
        Telemetry().observe("llm")  # type: ignore[arg-type]
    assert Telemetry.__module__ == "anygate.otel"
