"""Type-level tests of anygate's public API: checked by mypy and pyright, never executed.

Every public call is made once with ``assert_type`` on its result, so a signature that drifts
(a return type widening to ``Any``, a parameter renamed or losing its type) fails the typing
session. Lines that *must* be rejected carry ``# type: ignore[code]``: mypy's
``warn_unused_ignores`` (strict) and pyright's ``reportUnnecessaryTypeIgnoreComment`` turn an
ignore that is no longer needed into an error, so these are real negative tests.

pytest does not collect this file (its name does not start with ``test_``).
"""

# pyright: strict, reportUnnecessaryTypeIgnoreComment=error

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from typing_extensions import assert_type

import anygate
from anygate import (
    AdaptiveConfig,
    AdaptiveLimit,
    AdaptiveStatistics,
    AnygateError,
    BreakerConfig,
    BreakerState,
    BreakerStateChanged,
    BreakerStatistics,
    Busy,
    CallFailed,
    CircuitBreaker,
    CircuitOpen,
    ConfigError,
    Event,
    Gate,
    GateStatistics,
    GaveUp,
    Hook,
    LimitChanged,
    Permit,
    Policy,
    PolicyConfig,
    QueuedCaller,
    Rate,
    RateStatistics,
    Reason,
    ResponseError,
    RetryConfig,
    RetryScheduled,
    Rule,
    SlotAdmitted,
    SlotHolder,
    SlotWaiting,
    Token,
    UsageReported,
    Verdict,
    classify,
    classify_response,
    is_testing,
    load_config,
    redact,
    set_testing,
    shared_breaker,
    shared_gate,
)

# ---------------------------------------------------------------- constructing gates

gate = Gate(capacity=8, name="llm")
assert_type(gate, Gate)
assert_type(Gate(), Gate)
assert_type(Gate(3), Gate)
assert_type(Gate(math.inf), Gate)
assert_type(Gate(capacity=0.0, name=None), Gate)
assert_type(anygate.Gate(2, name="module-path"), Gate)

Gate(capacity="8")  # type: ignore[arg-type]
Gate(8, "llm")  # type: ignore[call-arg]  # name is keyword-only

# ---------------------------------------------------------------- introspection

assert_type(gate.name, str)
assert_type(gate.capacity, float)
assert_type(gate.in_flight, int)
assert_type(gate.waiting, int)
gate.capacity = 3
gate.capacity = 2.0
gate.capacity = math.inf
gate.capacity = "3"  # type: ignore[assignment]
gate.in_flight = 1  # type: ignore[misc]  # read-only property
assert_type(repr(gate), str)

stats = gate.statistics()
assert_type(stats, GateStatistics)
assert_type(stats.name, str)
assert_type(stats.capacity, float)
assert_type(stats.in_flight, int)
assert_type(stats.waiting, int)
assert_type(stats.admitted, int)
assert_type(stats.rejected, int)
assert_type(stats.timed_out, int)
assert_type(stats.cancelled, int)
assert_type(stats.leaked, int)
assert_type(stats.available, float)
stats.in_flight = 0  # type: ignore[misc]  # frozen dataclass

assert_type(gate.available, float)
assert_type(gate.fast_acquire, bool)
assert_type(Gate(2, fast_acquire=True), Gate)
Gate(2, fast_acquire="yes")  # type: ignore[arg-type]
assert_type(anygate.shared_gate("fast", fast_acquire=True), Gate)
holder = gate.holders()[0]
assert_type(holder, SlotHolder)
assert_type(holder.acquired_at, str)
assert_type(holder.age_s, float)
assert_type(holder.tokens, int)
assert_type(holder.token, Token)
queued = gate.waiters()[0]
assert_type(queued, QueuedCaller)
assert_type(queued.age_s, float)
assert_type(queued.runtime, str)
assert_type(queued.priority, int)
assert_type(queued.tokens, int)

# ---------------------------------------------------------------- rates

rate = Rate(requests_per_minute=1200, tokens_per_minute=400_000, ramp=2.0, window_s=10.0)
assert_type(rate.requests_per_minute, "float | None")
assert_type(rate.floor, int)
Rate(1200)  # type: ignore[call-arg]  # keyword-only
rated = Gate(32, name="rated", rate=rate, clock=time.monotonic)
assert_type(rated.rate, Rate | None)
rated.rate = Rate(requests_per_minute=600)
assert_type(Rate.per(30, requests=100, tokens=50_000), Rate)
assert_type(Rate(input_tokens_per_minute=30_000, output_tokens_per_minute=8_000).split, bool)
rated.rate = None
rated.rate = 600  # type: ignore[assignment]
Gate(rate=rate, clock=5)  # type: ignore[arg-type]
rate_view = rated.statistics().rate
assert_type(rate_view, RateStatistics | None)
if rate_view is not None:
    assert_type(rate_view.next_admission_s, float)
    assert_type(rate_view.admitted_this_window, int)
busy = Busy(gate="g", capacity=1, in_flight=1, waited=0.0, retry_after_s=2.0)
assert_type(busy.retry_after_s, "float | None")

# ---------------------------------------------------------------- acquiring


async def take(acquisition: anygate.Acquisition) -> Token:
    async with acquisition as token:
        return token


async def acquire_async() -> None:
    acquisition = gate.acquire(timeout=1)
    assert_type(acquisition, anygate.Acquisition)
    assert_type(await take(gate.acquire()), Token)
    assert_type(await acquisition, Token)
    anygate.Acquisition()  # type: ignore[misc]  # a protocol: only a gate makes one
    token = await gate.acquire()
    assert_type(token, Token)
    assert_type(await gate.acquire(timeout=None), Token)
    assert_type(await gate.acquire(timeout=1), Token)
    assert_type(await gate.acquire(timeout=0.5), Token)
    async with gate.acquire(timeout=60) as held:
        assert_type(held, Token)
    async with token as same:
        assert_type(same, Token)
    assert_type(await gate.acquire(tokens=1500, priority=1), Token)
    async with gate.acquire(tokens=10) as weighted:
        weighted.settle(tokens=12)
        assert_type(weighted.tokens, int)
    async with gate.acquire(tokens=3000, output_tokens=1000) as split:
        split.settle(tokens=2400, output_tokens=400)
    assert_type(gate.acquire_nowait(tokens=10, output_tokens=5), Token)
    gate.acquire_sync(output_tokens="5")  # type: ignore[arg-type]
    await gate.acquire(tokens="many")  # type: ignore[arg-type]
    await gate.acquire(60)  # type: ignore[call-arg]  # timeout is keyword-only
    await gate.acquire(timeout="60")  # type: ignore[arg-type]


def acquire_blocking() -> None:
    token = gate.acquire_sync()
    assert_type(token, Token)
    assert_type(gate.acquire_sync(timeout=2.5), Token)
    with gate.acquire_sync(timeout=60) as held:
        assert_type(held, Token)
    with token as same:
        assert_type(same, Token)
    assert_type(gate.acquire_nowait(), Token)
    assert_type(gate.acquire_nowait(tokens=5, priority=2), Token)
    assert_type(gate.acquire_sync(timeout=1, tokens=5, priority=-1), Token)
    gate.acquire_nowait(timeout=1)  # type: ignore[call-arg]


# ---------------------------------------------------------------- tokens


def use_token(token: Token) -> None:
    assert_type(token.release(), None)
    assert_type(token.released, bool)
    assert_type(token.acquired_at, str)
    token.released = True  # type: ignore[misc]  # read-only property


# ---------------------------------------------------------------- final classes


class SubGate(Gate):  # type: ignore[misc]  # Gate is @final
    pass


class SubToken(Token):  # type: ignore[misc]  # Token is @final
    pass


# ---------------------------------------------------------------- process-wide gates

assert_type(shared_gate("llm"), Gate)
assert_type(shared_gate("llm", capacity=8), Gate)
assert_type(shared_gate("llm", capacity=None), Gate)
assert_type(anygate.shared_gate("llm", capacity=math.inf), Gate)
shared_gate("llm", 8)  # type: ignore[call-arg]  # capacity is keyword-only
shared_gate(name=1)  # type: ignore[arg-type]

# ---------------------------------------------------------------- errors


def handle_errors() -> None:
    try:
        gate.acquire_nowait()
    except Busy as busy:
        assert_type(busy, Busy)
        assert_type(busy.gate, str)
        assert_type(busy.capacity, float)
        assert_type(busy.in_flight, int)
        assert_type(busy.waited, float)
    except CircuitOpen as circuit:
        assert_type(circuit.name, str)
        assert_type(circuit.retry_after, float)
    except CallFailed as failed:
        assert_type(failed.verdict, Verdict)
        assert_type(failed.attempts, int)
        assert_type(failed.user_message, str)
        assert_type(CallFailed.of(failed), CallFailed | None)
    except ConfigError as config:
        assert_type(config.path, str)
        assert_type(config.value, object)


# The hierarchy: every error is an AnygateError; ConfigError is also a ValueError.
error_types: tuple[type[AnygateError], ...] = (
    Busy,
    CallFailed,
    CircuitOpen,
    ConfigError,
    ResponseError,
)
value_error: type[ValueError] = ConfigError
not_a_value_error: type[ValueError] = Busy  # type: ignore[assignment]

assert_type(Busy(gate="llm", capacity=8, in_flight=8, waited=1.5), Busy)
assert_type(CircuitOpen(name="openai", retry_after=30.0), CircuitOpen)
assert_type(ConfigError("bad", path="llm_call.busy_wait_s", value=-1), ConfigError)
assert_type(ConfigError("bad"), ConfigError)
Busy("llm", 8, 8, 1.5)  # type: ignore[call-arg]  # attributes are keyword-only

assert_type(anygate.__version__, str)

# ---------------------------------------------------------------- the call policy

policy = Policy(name="llm", max_concurrent_calls=8, busy_wait_s=60)
assert_type(policy, Policy)
assert_type(Policy(retry=RetryConfig(max_attempts=2), circuit_breaker=None), Policy)
assert_type(Policy.from_config({"llm_call": {"max_concurrent_calls": 4}}), Policy)
assert_type(policy.name, str)
assert_type(policy.config, PolicyConfig)
assert_type(policy.gate, Gate)
assert_type(policy.breaker, CircuitBreaker | None)
assert_type(policy.hooks, tuple[Hook, ...])
assert_type(policy.max_concurrent_calls, int)
assert_type(policy.adaptive_limit, AdaptiveLimit)
assert_type(policy.adaptive_limit.limit, float)
assert_type(policy.adaptive_limit.statistics(), AdaptiveStatistics)
assert_type(Policy(adaptive_concurrency=False), Policy)
assert_type(Policy(reraise=True), Policy)
assert_type(Policy(adaptive_concurrency=AdaptiveConfig(decrease_factor=0.5)), Policy)
Policy(adaptive_concurrency="on")  # type: ignore[arg-type]  # bool or AdaptiveConfig


async def ask(prompt: str, *, temperature: float = 0.0) -> str:
    return prompt


def ask_blocking(prompt: str) -> bytes:
    return prompt.encode()


async def call_through_policy() -> None:
    assert_type(await policy.call(ask, "hello"), str)
    assert_type(await policy.call(ask, "hello", temperature=0.5, deadline=30.0), str)
    assert_type(policy.call_sync(ask_blocking, "hello"), bytes)
    await policy.call(ask_blocking, "hello")  # type: ignore[call-overload]  # not awaitable
    await policy.call(ask, 1)  # type: ignore[call-overload]  # wrong argument type
    await policy.call(ask, "hello", temprature=0.5)  # type: ignore[call-arg]  # typo
    await policy.call(ask)  # type: ignore[call-overload]  # missing argument
    policy.call_sync(ask_blocking, b"hello")  # type: ignore[call-overload]
    assert_type(policy.call_sync(ask_blocking, "hello", deadline=5), bytes)


@policy.retry
async def ask_guarded(prompt: str, *, temperature: float = 0.0) -> str:
    return prompt


@policy.retry
def ask_guarded_blocking(prompt: str) -> bytes:
    return prompt.encode()


async def call_decorated() -> None:
    assert_type(await ask_guarded("hello", temperature=0.5), str)
    assert_type(ask_guarded_blocking("hello"), bytes)
    pending = policy.retry(ask)("hi")
    assert_type(await pending, str)
    await ask_guarded(1)  # type: ignore[arg-type]  # wrong argument type
    await ask_guarded("hello", temprature=0.5)  # type: ignore[call-arg]  # typo
    ask_guarded_blocking()  # type: ignore[call-arg]  # missing argument
    policy.retry("not a function")  # type: ignore[call-overload]


async def step(attempt: anygate.Attempt) -> str:
    assert_type(attempt.number, int)
    assert_type(attempt.previous, Verdict | None)
    async with await attempt.acquire(timeout=1.0) as token:
        assert_type(token, Token)
        assert_type(attempt.accepted(), None)
    return "ok"


def step_blocking(attempt: anygate.Attempt) -> bytes:
    with attempt.acquire_sync(policy.gate):
        return b"ok"


async def run_the_loop() -> None:
    assert_type(await policy.run(step), str)
    assert_type(await policy.run(step, deadline=5, reraise=True), str)
    assert_type(policy.run_sync(step_blocking), bytes)
    assert_type(await policy.acquire(), Token)
    assert_type(policy.acquire_sync(timeout=2), Token)
    async for attempt in policy.attempts(deadline=10):
        assert_type(attempt, anygate.AttemptBlock)
        async with attempt:
            assert_type(attempt.number, int)
            assert_type(attempt.accepted(), None)
    for block in policy.attempts_sync(reraise=True):
        with block:
            assert_type(block.previous, Verdict | None)


config = load_config({"llm_call": {"retry_max_attempts": 3}})
assert_type(config, PolicyConfig)
assert_type(config.retry, RetryConfig)
assert_type(config.circuit_breaker, BreakerConfig)
assert_type(config.max_concurrent_calls, int | None)
assert_type(config.rules, tuple[Rule, ...])
assert_type(config.to_mapping(), dict[str, dict[str, Any]])
assert_type(RetryConfig().max_attempts, int)
assert_type(RetryConfig().base_delay_ms, float)
assert_type(BreakerConfig(failure_threshold=5).recovery_timeout_sec, float | None)
assert_type(config.adaptive_concurrency, AdaptiveConfig)
assert_type(AdaptiveConfig().pause_ms, float | None)
assert_type(AdaptiveConfig().effective(), dict[str, Any])
assert_type(AdaptiveConfig(latency=True).latency, bool | None)
assert_type(policy.adaptive_limit.latency, bool)
assert_type(policy.adaptive_limit.statistics().latency_limit, float | None)
assert_type(policy.adaptive_limit.statistics().no_load_latency_s, float | None)

# ---------------------------------------------------------------- classification


def classify_failure(exc: Exception) -> None:
    verdict = classify(exc, provider="openai")
    assert_type(verdict, Verdict)
    assert_type(verdict.reason, Reason)
    assert_type(verdict.retriable, bool)
    assert_type(verdict.retry_after, float | None)
    assert_type(verdict.status, int | None)
    assert_type(verdict.code, str | None)
    assert_type(classify(exc, rules=[Rule(reason=Reason.QUOTA, contains="quota")]), Verdict)
    assert_type(classify_response(429, {"retry-after": "2"}, b"{}"), Verdict)
    assert_type(redact("Authorization: Bearer sk-123"), str)
    assert_type(ResponseError(503, body="overloaded").status_code, int)


assert_type(Reason("burst_rate"), Reason)
reason_is_str: str = Reason.QUOTA  # a str enum

# ---------------------------------------------------------------- circuit breakers

breaker = CircuitBreaker("openai", failure_threshold=5, recovery_timeout=60.0)
assert_type(breaker.state, BreakerState)
assert_type(breaker.statistics(), BreakerStatistics)
assert_type(breaker.would_admit(), bool)
assert_type(breaker.reset(), BreakerStateChanged | None)
assert_type(breaker.clock, Callable[[], float])
assert_type(shared_breaker("openai"), CircuitBreaker)
permit = breaker.acquire()
assert_type(permit, Permit)
assert_type(permit.probe, bool)
assert_type(permit.accepted(), BreakerStateChanged | None)
assert_type(permit.success(), BreakerStateChanged | None)
assert_type(permit.failure(), BreakerStateChanged | None)
assert_type(permit.neutral(), BreakerStateChanged | None)

# ---------------------------------------------------------------- events and hooks


def on_event(event: Event) -> None:
    if isinstance(event, RetryScheduled):
        assert_type(event.wait_ms, int)
        assert_type(event.reason, Reason)
    elif isinstance(event, GaveUp):
        assert_type(event.verdict, Verdict)
    elif isinstance(event, SlotWaiting):
        assert_type(event.waiting, int)
    elif isinstance(event, SlotAdmitted):
        assert_type(event.waited_s, float)
    elif isinstance(event, LimitChanged):
        assert_type(event.new, float)
        assert_type(event.pause_s, float)
    elif isinstance(event, UsageReported):
        assert_type(event.input_tokens, int | None)
        assert_type(event.response_model, str | None)
        assert_type(event.server_port, int | None)
    else:
        assert_type(event, BreakerStateChanged)


hook: Hook = on_event
assert_type(Policy(hooks=[on_event, print]), Policy)

# ---------------------------------------------------------------- testing mode

assert_type(is_testing(), bool)
with set_testing(True, attempts=2):
    pass
