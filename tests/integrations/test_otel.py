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

from anygate.otel import Telemetry, error_type, throttle_kind
from tests.conftest import mock_clock

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
    # A local server's full queue: a concurrency answer, as the policy steers by it (it
    # was "overload" here while the policy's own events said concurrency).
    full = "server busy, please try again.  maximum pending requests exceeded"
    queue = Verdict(reason.BUSY, True, status=503, detail=full)
    assert throttle_kind(queue) == anygate.throttle_kind(queue) == "concurrency"
    # Busy in words, no Retry-After: the breaker's to the policy, an overload on a dashboard.
    busy = Verdict(reason.BUSY, True, status=503, detail="overloaded")
    assert anygate.throttle_kind(busy) is None
    assert throttle_kind(busy) == "overload"
    asked = Verdict(reason.BUSY, True, status=503, retry_after=2.0)
    assert throttle_kind(asked) == anygate.throttle_kind(asked) == "overload"
    assert anygate.throttle_kind(Verdict(reason.QUOTA, False, status=429)) is None


def test_arguments_are_checked() -> None:
    """Bad arguments name the parameter and the value."""
    with pytest.raises(TypeError, match=r"spans must be a bool \(got 1 of type int\)"):
        Telemetry(spans=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"observe\(\) takes a Gate, CircuitBreaker, Policy"):
        Telemetry().observe("llm")  # type: ignore[arg-type]
    assert Telemetry.__module__ == "anygate.otel"


# --------------------------------------------------------------------------- GenAI conventions


def _spans() -> tuple[InMemorySpanExporter, TracerProvider]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter, provider


def _usage(**fields: Any) -> anygate.UsageReported:
    given: dict[str, Any] = {
        "policy": "chat",
        "gate": "chat",
        "input_tokens": 12,
        "output_tokens": 30,
        "request_model": "gpt-4o",
        "response_model": "gpt-4o-2024-08-06",
        "server_address": "api.openai.com",
        "server_port": 443,
        "operation": "chat",
        "provider": "openai",
    }
    return anygate.UsageReported(**(given | fields))


async def test_failures_carry_error_type_beside_the_reason() -> None:
    """Retries and give-ups carry the standard ``error.type`` (the verdict's reason) next to
    ``anygate.reason``, which stays for existing dashboards."""
    reader, provider = _reader()
    telemetry = Telemetry(meter_provider=provider)
    policy = Policy(name="chat", circuit_breaker=None, hooks=[telemetry])
    with anygate.set_testing(True), pytest.raises(CallFailed):
        await policy.call(Script(burst(), quota()))
    points = _points(reader)
    ((retry, _),) = points["anygate.retries"]
    assert (retry["error.type"], retry["anygate.reason"]) == ("burst_rate", "burst_rate")
    ((give_up, _),) = points["anygate.give_ups"]
    assert (give_up["error.type"], give_up["anygate.reason"]) == ("quota", "quota")


async def test_usage_events_feed_the_token_usage_histogram() -> None:
    """A ``UsageReported`` records ``gen_ai.client.token.usage`` once per token type, with the
    GenAI and server attributes; a count the answer did not report is not recorded."""
    reader, provider = _reader()
    telemetry = Telemetry(meter_provider=provider)
    telemetry(_usage())
    telemetry(_usage(input_tokens=5, output_tokens=None, response_model=None))
    by_type: dict[str, list[tuple[dict[str, Any], Any]]] = {}
    for attrs, point in _points(reader)["gen_ai.client.token.usage"]:
        by_type.setdefault(attrs["gen_ai.token.type"], []).append((attrs, point))
    assert sorted((p.count, p.sum) for _, p in by_type["input"]) == [(1, 5), (1, 12)]
    ((attrs, point),) = by_type["output"]
    assert (point.count, point.sum) == (1, 30)
    assert attrs == {
        "anygate.policy.name": "chat",
        "anygate.gate.name": "chat",
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "gpt-4o",
        "gen_ai.response.model": "gpt-4o-2024-08-06",
        "server.address": "api.openai.com",
        "server.port": 443,
        "gen_ai.token.type": "output",
    }
    unlabelled = [a for a, _ in by_type["input"] if "gen_ai.response.model" not in a]
    assert len(unlabelled) == 1  # an unknown attribute is left out, never sent as ""


@pytest.mark.parametrize("anyio_backend", [mock_clock()])
async def test_call_spans_carry_usage_and_the_duration_is_exact(anyio_backend: Any) -> None:
    """Inside ``Telemetry.call`` the answers' usage (summed) and model land on the call's
    span, and ``gen_ai.client.operation.duration`` records the call's virtual duration,
    backoff included, with the same attributes."""
    reader, meter_provider = _reader()
    exporter, tracer_provider = _spans()
    telemetry = Telemetry(meter_provider=meter_provider, tracer_provider=tracer_provider)
    policy = Policy(name="chat", circuit_breaker=None, hooks=[telemetry])

    async def answer() -> str:
        await anyio.sleep(7)
        telemetry(_usage())  # what a gated transport reports as the body ends
        telemetry(_usage(input_tokens=3, output_tokens=4))
        return "ok"

    assert await telemetry.call(policy, answer) == "ok"
    (span,) = exporter.get_finished_spans()
    attrs = dict(span.attributes or {})
    assert (attrs["gen_ai.usage.input_tokens"], attrs["gen_ai.usage.output_tokens"]) == (15, 34)
    assert attrs["gen_ai.request.model"] == "gpt-4o"
    assert (attrs["server.address"], attrs["server.port"]) == ("api.openai.com", 443)
    assert "error.type" not in attrs
    ((labels, point),) = _points(reader)["gen_ai.client.operation.duration"]
    assert (point.count, point.sum) == (1, 7)
    assert labels["gen_ai.operation.name"] == "chat"
    assert labels["anygate.policy.name"] == "chat"
    assert "error.type" not in labels


@pytest.mark.parametrize("anyio_backend", [mock_clock()])
async def test_a_failed_call_sets_error_type_on_span_and_duration(anyio_backend: Any) -> None:
    """A call that gives up after a 503 and its 1 s backoff: its span and duration say
    ``error.type`` = the give-up's reason; the duration includes the backoff."""
    reader, meter_provider = _reader()
    exporter, tracer_provider = _spans()
    telemetry = Telemetry(meter_provider=meter_provider, tracer_provider=tracer_provider)
    config = anygate.RetryConfig(max_attempts=2, base_delay_ms=1000, cap_delay_ms=1000)
    policy = Policy(name="chat", circuit_breaker=None, retry=config, hooks=[telemetry])
    with pytest.raises(CallFailed):
        await telemetry.call(policy, Script(transient(), transient()))
    (span,) = exporter.get_finished_spans()
    assert (span.attributes or {})["error.type"] == "transient"
    ((labels, point),) = _points(reader)["gen_ai.client.operation.duration"]
    assert labels["error.type"] == "transient"
    assert point.sum == 1


def test_error_type_names_the_reason_else_the_class() -> None:
    """``error_type``: a verdict's reason where there is one, else the exception's class."""
    assert error_type(anygate.classify(quota())) == "quota"
    failed = CallFailed("x", verdict=anygate.classify(quota()), attempts=1, user_message="x")
    assert error_type(failed) == "quota"
    assert error_type(TimeoutError("slow")) == "TimeoutError"
    assert error_type(anygate.CircuitOpen(name="llm", retry_after=3.0)) == "anygate.CircuitOpen"


@pytest.mark.parametrize("anyio_backend", [mock_clock()])
async def test_rate_and_learned_limits_are_observable(anyio_backend: Any) -> None:
    """The gate's rate view (budget, what is left, the next admission) and what a rate
    learner took from OpenAI headers are gauges; a gate without a Rate has no series."""
    reader, provider = _reader()
    telemetry = Telemetry(meter_provider=provider)
    rate = anygate.Rate(requests_per_minute=60)
    gate = anygate.Gate(4, name="paced", rate=rate, clock=anyio.current_time)
    telemetry.observe(gate)
    telemetry.observe(anygate.Gate(4, name="free"))
    learned_gate = anygate.Gate(4, name="learned", clock=anyio.current_time)
    learner = anygate.RateLearner(learned_gate, confirm=1, headroom=0.1)
    telemetry.observe(learner)
    headers = {
        "x-ratelimit-limit-requests": "600",
        "x-ratelimit-remaining-requests": "500",
        "x-ratelimit-reset-requests": "10s",
        "x-ratelimit-limit-tokens": "90000",
        "x-ratelimit-remaining-tokens": "80000",
        "x-ratelimit-reset-tokens": "6s",
    }
    assert learner.observe_headers(headers)
    points = _points(reader)
    assert _value(points, "anygate.rate.requests.limit", gate_name="paced") == 60
    # A budget starts empty (docs/rates.md): nothing available, the next admission in 1 s.
    assert _value(points, "anygate.rate.requests.available", gate_name="paced") == 0
    assert _value(points, "anygate.rate.next_admission", gate_name="paced") == 1
    await anyio.sleep(30)  # refills to the burst (1 request by default), not beyond
    assert _value(_points(reader), "anygate.rate.requests.available", gate_name="paced") == 1
    assert _value(points, "anygate.learned.requests.limit", gate_name="learned") == 600
    assert _value(points, "anygate.learned.tokens.limit", gate_name="learned") == 90000
    # The learner's gate is observed with it: what it set, after its 10 % headroom.
    assert _value(points, "anygate.rate.requests.limit", gate_name="learned") == 540
    assert _value(points, "anygate.rate.tokens.limit", gate_name="learned") == 81000
    assert not [a for a, _ in points["anygate.rate.requests.limit"] if "free" in a.values()]


@pytest.mark.parametrize("anyio_backend", [mock_clock()])
async def test_the_adaptive_limits_learning_is_observable(anyio_backend: Any) -> None:
    """After a burst throttle an observed ``AdaptiveLimit`` reports its lowered limit and
    the pause left (counting down on the clock); a limit that is not pacing has no
    paced-rate series."""
    reader, provider = _reader()
    telemetry = Telemetry(meter_provider=provider)
    gate = anygate.Gate(32, name="llm")
    limit = anygate.AdaptiveLimit(gate, clock=anyio.current_time, decrease_factor=0.5)
    telemetry.observe(limit)
    assert limit.on_throttle(limit.generation, None) is not None
    points = _points(reader)
    assert _value(points, "anygate.adaptive.limit", gate_name="llm") == 16
    assert _value(points, "anygate.adaptive.pause", gate_name="llm") == 5
    assert "anygate.adaptive.requests_per_minute_estimate" not in points
    await anyio.sleep(2)
    assert _value(_points(reader), "anygate.adaptive.pause", gate_name="llm") == 3
