"""OpenTelemetry metrics and spans for anygate, built only on its public API.

Everything comes from two public sources: the events a policy delivers to its hooks
(:class:`~anygate.SlotAdmitted`, :class:`~anygate.RetryScheduled`, :class:`~anygate.GaveUp`,
...) and the snapshots of gates, breakers, adaptive limits and rate learners
(``statistics()``, ``state``, ``limits``), read by observable instruments when the SDK
collects (``_otel_observe``). Nothing here reaches into anygate's internals,
so this module could live outside the package.

Where the OpenTelemetry GenAI semantic conventions name a thing anygate knows, the standard
attribute or instrument is reported beside anygate's own: ``error.type`` on failures,
``gen_ai.*`` and ``server.*`` from the :class:`~anygate.UsageReported` events of the gated
transports, ``gen_ai.client.token.usage`` and ``gen_ai.client.operation.duration``.

Attributes carry names, enums and numbers only (gate, policy and breaker names, reasons,
kinds, model names, host names): never a message, a URL path, a header value or a prompt,
so no secret can end up in a metric backend.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, TypeVar, final

import anyio
from opentelemetry import metrics, trace

from .. import (
    BreakerStateChanged,
    GaveUp,
    LimitChanged,
    Reason,
    RetryScheduled,
    SlotAdmitted,
    UsageReported,
    Verdict,
)
from .. import (
    throttle_kind as policy_throttle_kind,
)
from .._validation import check_flag
from ._otel_observe import Observed

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator

    from .. import AdaptiveLimit, CircuitBreaker, Event, Gate, Policy, RateLearner

__all__ = ["Telemetry", "error_type", "throttle_kind"]

T = TypeVar("T")

GATE = "anygate.gate.name"
POLICY = "anygate.policy.name"
BREAKER = "anygate.breaker.name"
REASON = "anygate.reason"
KIND = "anygate.throttle.kind"
WHY = "anygate.give_up.why"
STATE = "anygate.breaker.state"
# OpenTelemetry semantic conventions (general and GenAI), spelled out rather than imported
# from opentelemetry-semantic-conventions: that package is not a dependency of the API.
ERROR_TYPE = "error.type"
OPERATION = "gen_ai.operation.name"
PROVIDER = "gen_ai.provider.name"
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
TOKEN_TYPE = "gen_ai.token.type"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"

# Slot waits range from microseconds (uncontended) to minutes (a queue behind a slow model).
_WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
# The bucket boundaries the GenAI conventions advise for these two histograms.
_TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304,
                  16777216, 67108864)  # fmt: skip
_DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24,
                     20.48, 40.96, 81.92)  # fmt: skip


def error_type(failure: BaseException | Verdict) -> str:
    """The ``error.type`` of a failure: low-cardinality, as the conventions ask.

    A classified failure (a :class:`~anygate.Verdict`, or an exception carrying one, as
    :class:`~anygate.CallFailed` does) is named by its reason (``"burst_rate"``,
    ``"quota"``...): what an operator groups by. Any other exception by its class's
    fully qualified name, the conventions' fallback: ``"TimeoutError"``,
    ``"anygate.CircuitOpen"``, ``"openai._exceptions.APIConnectionError"`` (a class keeps
    the module it says it is from).
    """
    verdict = failure if isinstance(failure, Verdict) else getattr(failure, "verdict", None)
    if isinstance(verdict, Verdict):
        return verdict.reason.value
    cls = type(failure)
    module = cls.__module__
    if module == "builtins":
        return cls.__qualname__
    return f"{module}.{cls.__qualname__}"


def genai_attributes(event: UsageReported) -> dict[str, Any]:
    """The GenAI and server attributes an answer's :class:`~anygate.UsageReported` carries
    (those it knows; an unknown one is left out, never sent empty)."""
    pairs = (
        (OPERATION, event.operation),
        (PROVIDER, event.provider),
        (REQUEST_MODEL, event.request_model),
        (RESPONSE_MODEL, event.response_model),
        (SERVER_ADDRESS, event.server_address),
        (SERVER_PORT, event.server_port),
    )
    return {key: value for key, value in pairs if value is not None}


@final
class _CallRecord:
    """What happened inside one :meth:`Telemetry.call` or :meth:`Telemetry.span`, for its
    span and duration: the answers' attributes and usage, and a give-up's reason."""

    __slots__ = ("attributes", "failure", "input_tokens", "output_tokens")

    def __init__(self) -> None:
        self.attributes: dict[str, Any] = {}
        self.input_tokens: int | None = None
        self.output_tokens: int | None = None
        #: The reason of a give-up inside the call: a better error.type than the class of
        #: whatever the SDK raises for it (``openai.RateLimitError`` says less than
        #: ``burst_rate``).
        self.failure: str | None = None

    def add(self, event: UsageReported) -> None:
        self.attributes.update(genai_attributes(event))
        # Summed: a call whose function makes several requests used all of their tokens.
        if event.input_tokens is not None:
            self.input_tokens = (self.input_tokens or 0) + event.input_tokens
        if event.output_tokens is not None:
            self.output_tokens = (self.output_tokens or 0) + event.output_tokens


def _clock() -> Callable[[], float]:
    """The running event loop's clock (virtual under trio's MockClock), else the monotonic."""
    try:
        anyio.current_time()
    except Exception:  # no async library running here: a thread or plain code
        return time.monotonic
    return anyio.current_time


# The call in progress in this task or thread. A context variable, not an attribute of the
# span: the transport reports from whatever task reads the body, which is the caller's own
# (or a child that copied its context), and a span may be the user's, which we never label.
_current_call: ContextVar[_CallRecord | None] = ContextVar("anygate_otel_call", default=None)


def throttle_kind(verdict: Verdict) -> str | None:
    """Which kind of provider throttle a failure was, or ``None`` if it was none.

    The policy's own reading (:func:`anygate.throttle_kind`: ``"burst"``,
    ``"concurrency"``, ``"overload"``, ``"rate"``), and ``"overload"`` for what it leaves
    to the breaker but the provider worded as being busy (a 503 "overloaded" without
    ``Retry-After``, "try again later"). A local server's full queue (Ollama's "maximum
    pending requests exceeded") is ``"concurrency"``, as the policy steers by it. A quota
    429 (billing) is not a throttle.
    """
    kind = policy_throttle_kind(verdict)
    if kind is None and verdict.retriable and verdict.reason is Reason.BUSY:
        return "overload"
    return kind


@final
class Telemetry:
    """OpenTelemetry instruments for anygate: pass it as a policy hook and observe gates.

    ::

        telemetry = anygate.otel.Telemetry()           # the global meter/tracer providers
        policy = anygate.Policy(name="llm", hooks=[telemetry])
        telemetry.observe(policy)                      # gauges for its gate, breaker, limit

    As a hook (it is callable) it records, per event: ``anygate.attempts`` (each admitted
    attempt), ``anygate.gate.wait.duration`` (histogram, s), ``anygate.retries`` and
    ``anygate.give_ups`` by ``anygate.reason`` and ``error.type``, ``anygate.throttles``
    by ``anygate.throttle.kind``, ``anygate.breaker.transitions``, and from the
    :class:`~anygate.UsageReported` of a gated transport built with the policy
    ``gen_ai.client.token.usage`` (histogram, ``{token}``, by ``gen_ai.token.type``, with
    the model, provider and server attributes). For every object given to :meth:`observe`
    it reports, when the SDK collects: the gate's ``anygate.gate.*`` gauges and counters,
    its rate view (``anygate.rate.*``), ``anygate.breaker.state``, the adaptive limit's
    ``anygate.adaptive.*`` and a rate learner's ``anygate.learned.*``.

    With ``spans=True``, :meth:`call` runs a policy call inside a span (a child of the
    caller's current span; the SDK's HTTP spans nest inside it) and every hook event adds
    a span event (``anygate.attempt``, ``anygate.retry``, ``anygate.give_up``) to the
    current span. :meth:`call` (and :meth:`span`, for a policy that runs inside a gated
    transport) also records ``gen_ai.client.operation.duration`` per call, and labels its
    span with what the call's answers reported (``gen_ai.request.model``,
    ``gen_ai.usage.input_tokens``, ``server.address``...) and, on failure, ``error.type``.

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
        "_duration",
        "_give_ups",
        "_observed",
        "_retries",
        "_spans",
        "_throttles",
        "_tokens",
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
        self._tokens = meter.create_histogram(
            "gen_ai.client.token.usage",
            unit="{token}",
            description="Number of input and output tokens used",
            explicit_bucket_boundaries_advisory=_TOKEN_BUCKETS,
        )
        self._duration = meter.create_histogram(
            "gen_ai.client.operation.duration",
            unit="s",
            description="GenAI operation duration",
            explicit_bucket_boundaries_advisory=_DURATION_BUCKETS,
        )
        self._observed = Observed(meter)

    def __repr__(self) -> str:
        return f"<anygate.otel.Telemetry spans={self._spans}>"

    def observe(self, target: Gate | CircuitBreaker | Policy | AdaptiveLimit | RateLearner) -> None:
        """Report ``target``'s state from now on: a gate, a breaker, a policy (its gate,
        breaker and adaptive limit), an adaptive limit, or a rate learner (what it learned
        from rate-limit headers, and its gate). Observing twice is harmless.

        Raises:
            TypeError: ``target`` is none of those.
        """
        self._observed.add(target)

    # ------------------------------------------------------------------ the hook

    def __call__(self, event: Event) -> None:
        """The policy hook: record ``event`` (and add a span event when ``spans=True``)."""
        if isinstance(event, SlotAdmitted):
            attrs = {GATE: event.gate, POLICY: event.policy}
            self._attempts.add(1, attrs)
            self._wait.record(event.waited_s, attrs)
            self._span_event("anygate.attempt", {"anygate.attempt": event.attempt, **attrs})
        elif isinstance(event, RetryScheduled):
            reason = event.reason.value
            self._retries.add(1, {POLICY: event.policy, REASON: reason, ERROR_TYPE: reason})
            self._throttle(event.policy, event.verdict)
            self._span_event(
                "anygate.retry",
                {
                    "anygate.attempt": event.attempt,
                    REASON: reason,
                    ERROR_TYPE: reason,
                    "anygate.retry.delay": event.wait_ms / 1000,
                },
            )
        elif isinstance(event, GaveUp):
            reason = event.reason.value
            attrs = {POLICY: event.policy, REASON: reason, WHY: event.why, ERROR_TYPE: reason}
            self._give_ups.add(1, attrs)
            record = _current_call.get()
            if record is not None:
                record.failure = reason
            self._throttle(event.policy, event.verdict)
            self._span_event("anygate.give_up", {"anygate.attempt": event.attempts, **attrs})
        elif isinstance(event, BreakerStateChanged):
            self._transitions.add(1, {BREAKER: event.breaker, STATE: event.new})
        elif isinstance(event, LimitChanged):
            self._span_event(
                "anygate.limit_changed",
                {GATE: event.gate, "anygate.limit": event.new, REASON: event.reason},
            )
        elif isinstance(event, UsageReported):
            self._usage(event)

    def _usage(self, event: UsageReported) -> None:
        attrs = {POLICY: event.policy, GATE: event.gate, **genai_attributes(event)}
        if event.input_tokens is not None:
            self._tokens.record(event.input_tokens, {**attrs, TOKEN_TYPE: "input"})
        if event.output_tokens is not None:
            self._tokens.record(event.output_tokens, {**attrs, TOKEN_TYPE: "output"})
        record = _current_call.get()
        if record is not None:
            record.add(event)

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
        Attempt, retry and give-up events land on it (with ``spans=True``). The call's
        duration, retries and backoff included, is recorded in
        ``gen_ai.client.operation.duration`` (by the event loop's clock). An exception sets
        the span's status to error and ``error.type`` (see :func:`error_type`), and is
        re-raised unchanged.
        """
        with self._measured(policy, anyio.current_time):
            return await policy.call(fn, *args, **kwargs)

    def call_sync(self, policy: Policy, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """The blocking twin of :meth:`call`, around :meth:`anygate.Policy.call_sync`."""
        with self._measured(policy, time.monotonic):
            return policy.call_sync(fn, *args, **kwargs)

    @contextmanager
    def span(self, policy: Policy) -> Iterator[None]:
        """The span and duration of :meth:`call`, around a block that runs ``policy``
        some other way: through a gated transport built with it, typically::

            client = openai.AsyncOpenAI(http_client=httpx2.AsyncClient(
                transport=anygate.httpx2.GatedTransport(policy=policy)))
            with telemetry.span(policy):
                await client.chat.completions.create(model="gpt-4o", messages=...)

        (:meth:`call` there would run the policy twice, once around the transport's own
        run.) A plain ``with``, usable in async and blocking code; the duration is by the
        event loop's clock inside one, else by :func:`time.monotonic`. An answer is
        reported when its body ends: read a stream inside the block, or its usage counts in
        ``gen_ai.client.token.usage`` but not on the span.
        """
        with self._measured(policy, _clock()):
            yield

    @contextmanager
    def _measured(self, policy: Policy, clock: Callable[[], float]) -> Iterator[None]:
        base = {POLICY: policy.name, GATE: policy.gate.name}
        record = _CallRecord()
        reset = _current_call.set(record)
        error: str | None = None
        start = clock()
        try:
            with self._tracer.start_as_current_span(
                f"anygate {policy.name}", kind=trace.SpanKind.INTERNAL, attributes=base
            ) as span:
                try:
                    yield
                except BaseException as exc:
                    error = record.failure or error_type(exc)
                    span.set_attribute(ERROR_TYPE, error)
                    raise
                finally:
                    span.set_attributes(record.attributes)
                    if record.input_tokens is not None:
                        span.set_attribute(INPUT_TOKENS, record.input_tokens)
                    if record.output_tokens is not None:
                        span.set_attribute(OUTPUT_TOKENS, record.output_tokens)
        finally:
            _current_call.reset(reset)
            attrs = {**base, **record.attributes}
            if error is not None:
                attrs[ERROR_TYPE] = error
            self._duration.record(max(0.0, clock() - start), attrs)
