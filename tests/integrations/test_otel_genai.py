"""anygate.otel end to end: the real SDKs through a gated transport, read back in memory.

The OpenAI SDK (on httpx2 and on httpx) and the Anthropic SDK call the fake provider on
127.0.0.1 through ``GatedTransport(policy=...)``; the policy's hooks hold a ``Telemetry``.
What the transport reads from the answers (model, usage, server) must reach the GenAI
attributes of the span, ``gen_ai.client.token.usage`` and
``gen_ai.client.operation.duration``, for plain and streamed answers, and a give-up must
say ``error.type``. No SDK is mocked.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import anyio
import pytest

import anygate
from tests.integrations.fakeprovider import FakeProvider, serve
from tests.integrations.sdks import SDKS, Sdk

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from anygate.otel import Telemetry

pytestmark = pytest.mark.anyio

FAST = anygate.RetryConfig(
    base_delay_ms=1, burst_base_delay_ms=2, cap_delay_ms=4, reason_budgets={"burst_rate": 2}
)


@pytest.fixture(params=SDKS)
def sdk(request: pytest.FixtureRequest) -> Sdk:
    """Run the requesting test with each SDK / HTTP library pair."""
    value: Sdk = request.param
    return value


class Readers:
    """A Telemetry whose metrics and spans are read back in memory."""

    def __init__(self) -> None:
        self.metrics = InMemoryMetricReader()
        self.spans = InMemorySpanExporter()
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.telemetry = Telemetry(
            meter_provider=MeterProvider(metric_readers=[self.metrics]),
            tracer_provider=tracer_provider,
        )

    def points(self, name: str) -> list[tuple[dict[str, Any], Any]]:
        data = self.metrics.get_metrics_data()
        assert data is not None
        return [
            (dict(point.attributes or {}), point)
            for resource in data.resource_metrics
            for scope in resource.scope_metrics
            for metric in scope.metrics
            if metric.name == name
            for point in metric.data.data_points
        ]


def _policy(readers: Readers) -> anygate.Policy:
    return anygate.Policy(
        name="llm",
        gate=anygate.Gate(2, name="llm"),
        retry=FAST,
        adaptive_concurrency=anygate.AdaptiveConfig(pause_ms=10),
        hooks=[readers.telemetry],
    )


def _expected(sdk: Sdk, url: str) -> dict[str, Any]:
    parts = urlsplit(url)
    return {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": sdk.name,
        "gen_ai.request.model": "m",
        "gen_ai.response.model": "m",  # the fake provider answers with the requested model
        "server.address": "127.0.0.1",
        "server.port": parts.port,
    }


@pytest.mark.parametrize("stream", [False, True], ids=["complete", "stream"])
async def test_usage_model_and_server_reach_span_and_metrics(sdk: Sdk, stream: bool) -> None:
    """One SDK call inside ``telemetry.span(policy)``: the span carries the GenAI request and
    response model, the server and the usage the answer reported (1 input, 4 output tokens
    in the fake provider's answers); the token histogram has one point per token type and
    the duration one point, all with those attributes and no ``error.type``."""
    readers = Readers()
    policy = _policy(readers)
    provider = FakeProvider()
    # OpenAI streams report usage only when asked; Anthropic's always do.
    extra = {"stream_options": {"include_usage": True}} if stream and sdk.name == "openai" else {}
    async with serve(provider) as url:
        client = sdk.client(url, sdk.gated(policy=policy))
        with readers.telemetry.span(policy):
            if stream:
                assert await sdk.stream(client, **extra) == "Hello world"
            else:
                assert await sdk.complete(client) == "Hello world"
        await client.close()
    expected = _expected(sdk, url)
    (span,) = readers.spans.get_finished_spans()
    attrs = dict(span.attributes or {})
    assert {k: attrs.get(k) for k in expected} == expected
    assert (attrs["gen_ai.usage.input_tokens"], attrs["gen_ai.usage.output_tokens"]) == (1, 4)
    assert "error.type" not in attrs
    tokens = {
        a["gen_ai.token.type"]: (a, p) for a, p in readers.points("gen_ai.client.token.usage")
    }
    assert sorted(tokens) == ["input", "output"]
    assert (tokens["input"][1].count, tokens["input"][1].sum) == (1, 1)
    assert (tokens["output"][1].count, tokens["output"][1].sum) == (1, 4)
    for labels, _ in tokens.values():
        assert {k: labels.get(k) for k in expected} == expected
    ((labels, duration),) = readers.points("gen_ai.client.operation.duration")
    assert duration.count == 1
    assert {k: labels.get(k) for k in expected} == expected
    assert "error.type" not in labels
    # Names, numbers and host names only: no path, no header value, no prompt text.
    for value in [*attrs.values(), *labels.values()]:
        assert "/v1" not in str(value)
        assert value != "hi"
        assert "sk-" not in str(value)


async def test_a_give_up_says_error_type(sdk: Sdk) -> None:
    """Burst-rate budget spent: the SDK raises its RateLimitError; the span and the
    duration say ``error.type`` = ``burst_rate`` (the give-up's reason, not the SDK's class),
    the give-up counter too, and no token usage is recorded (the answers were errors)."""
    readers = Readers()
    policy = _policy(readers)
    provider = FakeProvider()
    provider.script("burst", "burst")
    async with serve(provider) as url:
        client = sdk.client(url, sdk.gated(policy=policy))
        with pytest.raises(sdk.errors.RateLimitError), readers.telemetry.span(policy):
            await sdk.complete(client)
        await client.close()
    (span,) = readers.spans.get_finished_spans()
    assert (span.attributes or {})["error.type"] == "burst_rate"
    ((labels, _),) = readers.points("gen_ai.client.operation.duration")
    assert labels["error.type"] == "burst_rate"
    ((give_up, _),) = readers.points("anygate.give_ups")
    assert give_up["error.type"] == "burst_rate"
    assert readers.points("gen_ai.client.token.usage") == []


async def test_the_blocking_sdk_in_a_thread_is_labelled_too() -> None:
    """The sync OpenAI client on ``SyncGatedTransport`` in a worker thread, inside
    ``telemetry.span(policy)`` there (no event loop in that thread: the span falls back to
    the monotonic clock): the same span attributes and token points."""
    sdk = Sdk("openai", "httpx2")
    readers = Readers()
    policy = _policy(readers)
    provider = FakeProvider()

    def call(client: Any) -> str:
        with readers.telemetry.span(policy):
            return sdk.text_of(sdk.create(client))

    async with serve(provider) as url:
        client = sdk.client(url, sdk.gated(policy=policy, sync=True), sync=True)
        assert await anyio.to_thread.run_sync(call, client) == "Hello world"
        client.close()
    (span,) = readers.spans.get_finished_spans()
    attrs = dict(span.attributes or {})
    expected = _expected(sdk, url)
    assert {k: attrs.get(k) for k in expected} == expected
    assert (attrs["gen_ai.usage.input_tokens"], attrs["gen_ai.usage.output_tokens"]) == (1, 4)
    sums = {a["gen_ai.token.type"]: p.sum for a, p in readers.points("gen_ai.client.token.usage")}
    assert sums == {"input": 1, "output": 4}
    ((_, duration),) = readers.points("gen_ai.client.operation.duration")
    assert duration.count == 1
