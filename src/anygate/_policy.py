"""The guarded call: breaker -> deadline scope -> one slot per attempt -> classify -> backoff.

Data flows one way: the policy takes a breaker permit (synchronously, before any await),
then for each attempt takes one gate token, runs ``fn`` while holding it, releases it,
classifies a failure and sleeps *without* a slot before the next attempt. The gate knows
nothing of retries; the policy knows nothing of waiter internals.

Timing on the async path uses AnyIO only (``anyio.sleep``, ``anyio.current_time``, cancel
scopes), so trio's ``MockClock`` drives it in tests and the simulator; the sync path uses
``time.sleep`` and ``time.monotonic``.
"""

from __future__ import annotations

import inspect
import logging
import math
import random
import time
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar, final

import anyio

from . import _waiters
from ._backoff import Uniform, decorrelated_jitter
from ._breaker import CircuitBreaker, Permit
from ._classify import Reason, Rule, RuleLike, Verdict, classify
from ._config import BreakerConfig, PolicyConfig, RetryConfig, load_config
from ._errors import Busy, CallFailed, ConfigError
from ._events import (
    GaveUp,
    Hook,
    RetryScheduled,
    SlotAdmitted,
    SlotWaiting,
    emit,
    retry_message,
    user_message,
)
from ._gate import Gate
from ._redact import redact
from ._registry import breakers, gates
from ._testing import TestingState, testing_state

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping, Sequence

__all__ = ["Policy"]

T = TypeVar("T")
logger = logging.getLogger("anygate")

_SUCCESS, _FAILURE, _NEUTRAL = "success", "failure", "neutral"


class _NotAwaitable(TypeError):
    """``call()`` was handed a function that does not return an awaitable."""


class _Stop:
    """Internal: the decision to give up, and why (a value, not an exception, so it never
    shows up in the ``__context__`` of the CallFailed raised next)."""

    __slots__ = ("max_attempts", "why")

    def __init__(self, why: str, max_attempts: int) -> None:
        self.why = why
        self.max_attempts = max_attempts


class _Run:
    """Per-call state, owned by one task or thread."""

    __slots__ = ("attempt", "exc", "outcome", "phase", "prev_ms", "slot_started", "verdict")

    def __init__(self) -> None:
        self.attempt = 0
        self.prev_ms: float | None = None
        self.verdict: Verdict | None = None
        self.exc: BaseException | None = None
        self.outcome = _NEUTRAL
        self.phase = "slot"
        self.slot_started = 0.0


def _check_deadline(deadline: object) -> float | None:
    if deadline is None:
        return None
    if isinstance(deadline, bool) or not isinstance(deadline, (int, float)):
        msg = f"deadline must be seconds >= 0 or None (got {deadline!r} of type {type(deadline).__name__})"
        raise TypeError(msg)
    if math.isnan(deadline) or deadline < 0:
        msg = f"deadline must be >= 0 seconds or None (got {deadline!r})"
        raise ValueError(msg)
    return None if math.isinf(deadline) else float(deadline)


@final
class Policy:
    """Guard provider calls: a shared concurrency cap, retries with jitter, a breaker.

    Each attempt holds one slot of a process-wide :class:`anygate.Gate` for exactly the
    duration of ``fn``; backoff sleeps hold none, so other callers use the slot meanwhile.
    Failures are classified (:func:`anygate.classify`); retriable ones are retried with
    decorrelated jitter or the provider's ``Retry-After`` within the attempt budgets; a
    circuit breaker shared per name fails calls fast while the provider is down.

    Policies with the same ``gate_name`` share one gate, and with the same breaker name one
    breaker, across every event loop and thread in the process.

    This is not a rate limiter (it bounds concurrency and reacts to throttling) and not an
    HTTP client: ``fn`` makes exactly one provider call per invocation.

    Args:
        name: the policy's name, used in events and logs and as the default gate and
            breaker name.
        max_concurrent_calls: the shared gate's capacity (``0`` = no cap). ``None``: use
            the shared gate as it is (created uncapped if absent).
        busy_wait_s: how long one attempt may wait for a slot before :class:`anygate.Busy`;
            ``None`` waits as long as it takes.
        attempt_timeout_s: cancel an attempt that runs longer and treat it as a
            ``transient`` failure (async calls only). ``None``: no per-attempt limit.
        gate_name: the shared gate's name; default ``name``.
        provider: classification hint where providers' wording collides.
        retry: a :class:`anygate.RetryConfig`.
        circuit_breaker: a :class:`anygate.BreakerConfig`, or ``None`` for no breaker.
        rules: classification rules tried before the built-in ones.
        control_flow: exception classes (or class names) that are control flow, not
            failures: they propagate unchanged and leave the breaker alone.
        hooks: callables receiving each event record (see :mod:`anygate` events).
        rng: the random source for jitter (``random.Random(seed)`` for reproducible runs).
        clock: the breaker's monotonic clock in seconds, used when this policy creates it.
        gate: use this gate as it is, instead of the shared one (``max_concurrent_calls``
            and ``gate_name`` are then ignored; the policy never resizes a gate it is handed).
        breaker: use this :class:`anygate.CircuitBreaker` instead of the shared one.
        reconfigure: if the shared gate or breaker already exists with other settings,
            apply this policy's settings to it live instead of raising ``ConfigError``.

    Raises:
        TypeError: an argument of the wrong type.
        ConfigError: a value out of range, or settings conflicting with the existing shared
            gate or breaker (without ``reconfigure=True``).
    """

    __slots__ = (
        "_breaker",
        "_busy_wait",
        "_config",
        "_control_names",
        "_control_types",
        "_gate",
        "_hooks",
        "_rng",
        "_rules",
    )

    def __init__(
        self,
        *,
        name: str = "llm",
        max_concurrent_calls: int | None = None,
        busy_wait_s: float | None = 60.0,
        attempt_timeout_s: float | None = None,
        gate_name: str | None = None,
        provider: str | None = None,
        retry: RetryConfig | None = None,
        circuit_breaker: BreakerConfig | None = BreakerConfig(),  # noqa: B008 - immutable
        rules: Sequence[RuleLike] = (),
        control_flow: Sequence[type[BaseException] | str] = (),
        hooks: Sequence[Hook] = (),
        rng: Uniform | None = None,
        clock: Callable[[], float] | None = None,
        gate: Gate | None = None,
        breaker: CircuitBreaker | None = None,
        reconfigure: bool = False,
    ) -> None:
        control_types: list[type[BaseException]] = []
        control_names: list[str] = []
        items: Sequence[object] = control_flow
        for item in items:
            if isinstance(item, type) and issubclass(item, BaseException):
                control_types.append(item)
            elif isinstance(item, str):
                control_names.append(item)
            else:
                msg = f"control_flow entries must be exception classes or names (got {item!r})"
                raise TypeError(msg)
        given: Sequence[object] = rules
        for rule in given:
            if not isinstance(rule, Rule) and not callable(rule):
                msg = f"rules entries must be anygate.Rule objects or callables (got {rule!r})"
                raise TypeError(msg)
        # PolicyConfig keeps the declarative rules; callables live beside it in _rules.
        declarative = tuple(r for r in rules if isinstance(r, Rule))
        self._config = PolicyConfig(
            name=name,
            gate_name=gate_name,
            max_concurrent_calls=max_concurrent_calls,
            busy_wait_s=busy_wait_s,
            attempt_timeout_s=attempt_timeout_s,
            provider=provider,
            retry=RetryConfig() if retry is None else retry,
            circuit_breaker=BreakerConfig(enabled=False)
            if circuit_breaker is None
            else circuit_breaker,
            rules=declarative,
            control_flow=tuple(control_names) + tuple(t.__name__ for t in control_types),
        )
        self._rules: tuple[RuleLike, ...] = tuple(rules)
        self._control_types = tuple(control_types)
        self._control_names = frozenset(control_names)
        hook_list: Sequence[object] = hooks
        for hook in hook_list:
            if not callable(hook):
                msg = f"hooks must be callables (got {hook!r})"
                raise TypeError(msg)
        self._hooks: tuple[Hook, ...] = tuple(hooks)
        if rng is not None and not callable(getattr(rng, "uniform", None)):
            msg = f"rng must have a uniform(a, b) method, like random.Random (got {rng!r})"
            raise TypeError(msg)
        self._rng: Uniform = random.Random() if rng is None else rng
        self._busy_wait = self._config.busy_wait_s
        self._gate = self._resolve_gate(gate, reconfigure)
        self._breaker = self._resolve_breaker(breaker, clock, reconfigure)

    @classmethod
    def from_config(
        cls, source: str | Any | Mapping[str, Any] | PolicyConfig, **overrides: Any
    ) -> Policy:
        """Build a policy from a YAML file, a mapping of the same shape, or a PolicyConfig.

        ``overrides`` are :class:`Policy` keyword arguments applied on top (``hooks``,
        ``rng``, ``clock``, ``gate``, ``breaker``, ``reconfigure``, or any setting).

        Raises:
            ConfigError: the configuration is invalid (the message names the key path).
        """
        config = source if isinstance(source, PolicyConfig) else load_config(source)
        kwargs: dict[str, Any] = {
            "name": config.name,
            "gate_name": config.gate_name,
            "max_concurrent_calls": config.max_concurrent_calls,
            "busy_wait_s": config.busy_wait_s,
            "attempt_timeout_s": config.attempt_timeout_s,
            "provider": config.provider,
            "retry": config.retry,
            "circuit_breaker": config.circuit_breaker if config.circuit_breaker.enabled else None,
            "rules": config.rules,
            "control_flow": config.control_flow,
        }
        kwargs.update(overrides)
        return cls(**kwargs)

    def _resolve_gate(self, gate: Gate | None, reconfigure: bool) -> Gate:
        given: object = gate
        if gate is not None:
            if not isinstance(given, Gate):
                msg = f"gate must be an anygate.Gate (got {gate!r})"
                raise TypeError(msg)
            return gate
        cfg = self._config
        gname = cfg.gate_name or cfg.name
        wanted = cfg.max_concurrent_calls
        cap = wanted if wanted else math.inf
        shared, created = gates.get_or_create(gname, lambda: Gate(cap, name=gname))
        if created or wanted is None or shared.capacity == cap:
            return shared
        if not reconfigure:
            have = 0 if math.isinf(shared.capacity) else int(shared.capacity)
            msg = (
                f"llm_call.max_concurrent_calls: the shared gate {gname!r} already has "
                f"capacity {have} (0 = no cap) and this policy asks for {wanted}. Pass "
                f"reconfigure=True to resize it live, set policy.max_concurrent_calls, or "
                f"use another gate_name"
            )
            raise ConfigError(msg, path="llm_call.max_concurrent_calls", value=wanted)
        logger.info("gate %r resized to %s by policy %r", gname, wanted or "no cap", cfg.name)
        shared.capacity = cap
        return shared

    def _resolve_breaker(
        self, breaker: CircuitBreaker | None, clock: Callable[[], float] | None, reconfigure: bool
    ) -> CircuitBreaker | None:
        given: object = breaker
        if breaker is not None:
            if not isinstance(given, CircuitBreaker):
                msg = f"breaker must be an anygate.CircuitBreaker (got {breaker!r})"
                raise TypeError(msg)
            return breaker
        bcfg = self._config.circuit_breaker
        if not bcfg.enabled:
            return None
        bname = bcfg.name or self._config.name
        shared, created = breakers.get_or_create(
            bname,
            lambda: CircuitBreaker(
                bname,
                failure_threshold=5 if bcfg.failure_threshold is None else bcfg.failure_threshold,
                recovery_timeout=(
                    60.0 if bcfg.recovery_timeout_sec is None else bcfg.recovery_timeout_sec
                ),
                clock=time.monotonic if clock is None else clock,
            ),
        )
        if created:
            return shared
        if clock is not None and shared.clock is not clock:
            msg = f"the shared breaker {bname!r} already uses clock {shared.clock!r}; pass breaker= to use another clock"
            raise ValueError(msg)
        # Only settings this policy states count; None means "whatever it has now".
        same = bcfg.failure_threshold in (None, shared.failure_threshold) and (
            bcfg.recovery_timeout_sec in (None, shared.recovery_timeout)
        )
        if not same:
            if not reconfigure:
                msg = (
                    f"circuit_breaker: the shared breaker {bname!r} already has "
                    f"failure_threshold={shared.failure_threshold}, recovery_timeout_sec="
                    f"{shared.recovery_timeout:g}; this policy asks for "
                    f"{bcfg.failure_threshold}, {bcfg.recovery_timeout_sec}. Pass "
                    f"reconfigure=True to apply them live, or use another circuit_breaker.name"
                )
                raise ConfigError(msg, path="circuit_breaker", value=bcfg)
            shared.configure(
                failure_threshold=bcfg.failure_threshold,
                recovery_timeout=bcfg.recovery_timeout_sec,
            )
        return shared

    # ------------------------------------------------------------------ introspection

    @property
    def name(self) -> str:
        """The policy's name."""
        return self._config.name

    @property
    def config(self) -> PolicyConfig:
        """The validated settings (``config.to_mapping()`` prints them in YAML shape)."""
        return self._config

    @property
    def gate(self) -> Gate:
        """The gate each attempt takes a slot from."""
        return self._gate

    @property
    def breaker(self) -> CircuitBreaker | None:
        """The circuit breaker, or ``None`` when disabled."""
        return self._breaker

    @property
    def hooks(self) -> tuple[Hook, ...]:
        """The event hooks, in call order."""
        return self._hooks

    @property
    def max_concurrent_calls(self) -> int:
        """The gate's current capacity, ``0`` meaning no cap. Settable at any time.

        Setting it resizes the (shared) gate live: raising it admits queued attempts at
        once; lowering it revokes nothing (attempts in flight finish) and admits no one
        until fewer than the new value are in flight. Calls sleeping between attempts hold
        no slot, so their next attempt simply queues under the new value.
        """
        cap = self._gate.capacity
        return 0 if math.isinf(cap) else int(cap)

    @max_concurrent_calls.setter
    def max_concurrent_calls(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            msg = f"max_concurrent_calls must be an int >= 0 (got {value!r} of type {type(value).__name__})"
            raise TypeError(msg)
        if value < 0:
            msg = f"max_concurrent_calls must be >= 0 (got {value!r})"
            raise ValueError(msg)
        self._gate.capacity = math.inf if value == 0 else value

    def __repr__(self) -> str:
        gate = self._gate
        cap = "inf" if math.isinf(gate.capacity) else int(gate.capacity)
        breaker = "off" if self._breaker is None else self._breaker.state.value
        return (
            f"<anygate.Policy {self.name!r} gate {gate.name!r} {gate.in_flight}/{cap}, "
            f"breaker {breaker}>"
        )

    # ------------------------------------------------------------------ shared steps

    def _admit(self) -> Permit | None:
        if self._breaker is None:
            return None
        permit = self._breaker.acquire()  # CircuitOpen propagates as is
        if self._hooks:
            for change in permit.changes:
                emit(self._hooks, change)
        return permit

    def _settle(self, permit: Permit | None, outcome: str) -> None:
        if permit is None:
            return
        report = {_SUCCESS: permit.success, _FAILURE: permit.failure}.get(outcome, permit.neutral)
        change = report()
        if change is not None and self._hooks:
            emit(self._hooks, change)

    def _is_control_flow(self, exc: BaseException) -> bool:
        if self._control_types and isinstance(exc, self._control_types):
            return True
        if self._control_names:
            return any(c.__name__ in self._control_names for c in type(exc).__mro__)
        return False

    def _budget(self, verdict: Verdict, exc: BaseException, testing: TestingState) -> int:
        retry = self._config.retry
        budget = retry.max_attempts
        per_reason = retry.reason_budgets.get(verdict.reason.value)
        if per_reason is not None:
            budget = min(budget, per_reason)
        if retry.exception_budgets:
            for cls in type(exc).__mro__:
                per_class = retry.exception_budgets.get(cls.__name__)
                if per_class is not None:
                    budget = min(budget, per_class)
        if testing.enabled and testing.attempts is not None:
            budget = min(budget, testing.attempts)
        return budget

    def _plan_retry(
        self,
        run: _Run,
        exc: Exception,
        permit: Permit | None,
        now: float,
        deadline: float,
        testing: TestingState,
    ) -> float | _Stop:
        """Classify ``exc``; return seconds to sleep before the next attempt, or a _Stop."""
        verdict = classify(exc, rules=self._rules, provider=self._config.provider)
        run.verdict, run.exc = verdict, exc
        budget = self._budget(verdict, exc, testing)
        if not verdict.retriable:
            return _Stop("not_retriable", budget)
        # From here on, giving up counts against the provider (burst-rate excepted).
        run.outcome = _NEUTRAL if verdict.reason is Reason.BURST_RATE else _FAILURE
        if run.attempt >= budget:
            return _Stop("budget", budget)
        if permit is not None and not permit.still_admitted():
            return _Stop("circuit_open", budget)
        retry = self._config.retry
        from_header = verdict.retry_after is not None
        if verdict.retry_after is not None:
            if verdict.retry_after > retry.retry_after_max_s:
                return _Stop("retry_after_ceiling", budget)
            wait_ms = verdict.retry_after * 1000.0
        else:
            base = (
                retry.burst_base_delay_ms
                if verdict.reason is Reason.BURST_RATE
                else retry.base_delay_ms
            )
            wait_ms = decorrelated_jitter(
                run.prev_ms, base_ms=base, cap_ms=retry.cap_delay_ms, rng=self._rng
            )
        run.prev_ms = wait_ms
        if testing.enabled:
            wait_ms = 0.0
        wait_s = wait_ms / 1000.0
        # A sleep that would end at or past the deadline leaves no time for the attempt.
        if now + wait_s >= deadline:
            return _Stop("deadline", budget)
        message = retry_message(run.attempt, budget, wait_ms, verdict.reason)
        logger.warning(
            "%s: attempt %d/%d failed (%s); retrying in %dms: %s",
            self.name,
            run.attempt,
            budget,
            verdict.reason.value,
            round(wait_ms),
            verdict.detail,
        )
        if self._hooks:
            emit(
                self._hooks,
                RetryScheduled(
                    policy=self.name,
                    attempt=run.attempt,
                    max_attempts=budget,
                    wait_ms=round(wait_ms),
                    reason=verdict.reason,
                    from_retry_after=from_header,
                    message=redact(message),
                    verdict=verdict,
                ),
            )
        return wait_s

    def _fail(
        self, run: _Run, why: str, max_attempts: int, cause: BaseException | None
    ) -> NoReturn:
        verdict = run.verdict
        assert verdict is not None
        text = user_message(verdict)
        logger.warning(
            "%s: giving up after %d attempt(s) (%s, %s): %s",
            self.name,
            run.attempt,
            why,
            verdict.reason.value,
            verdict.detail,
        )
        if self._hooks:
            emit(
                self._hooks,
                GaveUp(
                    policy=self.name,
                    attempts=run.attempt,
                    max_attempts=max_attempts,
                    reason=verdict.reason,
                    why=why,
                    message=text,
                    verdict=verdict,
                ),
            )
        message = redact(
            f"{self.name}: call failed after {run.attempt} attempt(s) ({why}): "
            f"{verdict.reason.value}: {verdict.detail}"
        )
        raise CallFailed(
            message, verdict=verdict, attempts=run.attempt, user_message=text
        ) from cause

    def _deadline_failure(self, run: _Run, seconds: float, waited: float) -> NoReturn:
        """Our own ``deadline=`` ran out; say what was going on at the time."""
        if run.phase == "slot" and run.verdict is None:
            gate = self._gate
            raise Busy(
                gate=gate.name, capacity=gate.capacity, in_flight=gate.in_flight, waited=waited
            )
        if run.verdict is None:
            # Cut off in the first attempt: no provider verdict. Neutral for the breaker,
            # since a tight caller deadline says nothing about the provider's health.
            run.verdict = Verdict(
                reason=Reason.TRANSIENT,
                retriable=True,
                detail=f"deadline of {seconds:g}s exceeded",
            )
            run.outcome = _NEUTRAL
            cause: BaseException = TimeoutError(f"deadline of {seconds:g}s exceeded")
        else:
            cause = run.exc if run.exc is not None else TimeoutError("deadline exceeded")
        self._fail(run, "deadline", self._config.retry.max_attempts, cause)

    # ------------------------------------------------------------------ async

    async def call(
        self,
        fn: Callable[..., Awaitable[T]],
        /,
        *args: Any,
        deadline: float | None = None,
        **kwargs: Any,
    ) -> T:
        """Run ``await fn(*args, **kwargs)`` under the policy and return its result.

        Args:
            fn: an async callable making exactly one provider call.
            deadline: seconds from now bounding the whole call (slot waits, attempts and
                sleeps). An enclosing AnyIO cancel scope bounds it too; the earlier wins.
            args, kwargs: passed to ``fn`` unchanged.

        Raises:
            CallFailed: the call failed for good; the provider's exception is the cause.
            CircuitOpen: the breaker is open; nothing was attempted.
            Busy: an attempt got no slot within ``busy_wait_s`` (or before ``deadline``).
            TypeError: ``fn`` did not return an awaitable.
            Cancellation and control-flow exceptions propagate unchanged.
        """
        seconds = _check_deadline(deadline)
        testing = testing_state()
        permit = self._admit()  # before the first await: claims the probe atomically
        run = _Run()
        try:
            start = anyio.current_time()
            scope = anyio.CancelScope(deadline=math.inf if seconds is None else start + seconds)
            with scope:
                return await self._attempts(run, permit, testing, fn, args, kwargs)
            # Only our deadline lands here: the scope swallowed its own cancellation.
            self._deadline_failure(run, seconds or 0.0, anyio.current_time() - run.slot_started)
        finally:
            self._settle(permit, run.outcome)

    async def _attempts(
        self,
        run: _Run,
        permit: Permit | None,
        testing: TestingState,
        fn: Callable[..., Awaitable[T]],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> T:
        gate, hooks = self._gate, self._hooks
        attempt_timeout = self._config.attempt_timeout_s
        while True:
            run.attempt += 1
            run.phase = "slot"
            run.slot_started = anyio.current_time()
            if hooks and (gate.waiting or gate.in_flight >= gate.capacity):
                emit(
                    hooks,
                    SlotWaiting(
                        self.name,
                        gate.name,
                        run.attempt,
                        gate.in_flight,
                        gate.waiting,
                        gate.capacity,
                    ),
                )
            token = await gate.acquire(timeout=self._busy_wait)
            if hooks:
                waited = anyio.current_time() - run.slot_started
                emit(hooks, SlotAdmitted(self.name, gate.name, run.attempt, waited))
            run.phase = "attempt"
            try:
                try:
                    if attempt_timeout is None:
                        result = await _invoke(fn, args, kwargs)
                    else:
                        with anyio.move_on_after(attempt_timeout) as attempt_scope:
                            result = await _invoke(fn, args, kwargs)
                        if attempt_scope.cancelled_caught:
                            msg = f"attempt {run.attempt} timed out after {attempt_timeout:g}s"
                            raise TimeoutError(msg)
                finally:
                    token.release()  # before classifying or sleeping: the slot is not ours
            except _NotAwaitable:
                raise
            except Exception as exc:
                if self._is_control_flow(exc):
                    run.outcome = _NEUTRAL
                    raise
                wait = self._plan_retry(
                    run,
                    exc,
                    permit,
                    anyio.current_time(),
                    anyio.current_effective_deadline(),
                    testing,
                )
                if isinstance(wait, _Stop):
                    self._fail(run, wait.why, wait.max_attempts, exc)
                run.phase = "sleep"
                await anyio.sleep(wait)
            else:
                run.outcome = _SUCCESS
                return result

    # ------------------------------------------------------------------ sync

    def call_sync(
        self, fn: Callable[..., T], /, *args: Any, deadline: float | None = None, **kwargs: Any
    ) -> T:
        """Run ``fn(*args, **kwargs)`` under the policy in this (non-async) thread.

        The same gate, breaker, budgets and events as :meth:`call`; waits block the thread
        (``Gate.acquire_sync``, ``time.sleep``). A running attempt cannot be interrupted
        from outside, so ``attempt_timeout_s`` does not apply here and ``deadline`` bounds
        slot waits and sleeps and is checked between attempts; give the client its own
        timeout.

        Raises:
            CallFailed, CircuitOpen, Busy: as for :meth:`call`.
            RuntimeError: called on a thread running an event loop (use ``await call``).
            TypeError: ``fn`` returned an awaitable (use :meth:`call`).
        """
        seconds = _check_deadline(deadline)
        running = _waiters.event_loop_running()
        if running is not None:
            msg = (
                f"Policy.call_sync() called on a thread running a {running} event loop; it "
                "would block the loop. Use `await policy.call(...)` instead"
            )
            raise RuntimeError(msg)
        testing = testing_state()
        permit = self._admit()
        run = _Run()
        try:
            return self._attempts_sync(run, permit, testing, seconds, fn, args, kwargs)
        finally:
            self._settle(permit, run.outcome)

    def _attempts_sync(
        self,
        run: _Run,
        permit: Permit | None,
        testing: TestingState,
        seconds: float | None,
        fn: Callable[..., T],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> T:
        gate, hooks = self._gate, self._hooks
        deadline = math.inf if seconds is None else time.monotonic() + seconds
        while True:
            run.attempt += 1
            run.phase = "slot"
            now = run.slot_started = time.monotonic()
            if now >= deadline and run.verdict is not None:
                self._fail(run, "deadline", self._config.retry.max_attempts, run.exc)
            timeout = self._busy_wait
            if deadline != math.inf:
                left = max(0.0, deadline - now)
                timeout = left if timeout is None else min(timeout, left)
            if hooks and (gate.waiting or gate.in_flight >= gate.capacity):
                emit(
                    hooks,
                    SlotWaiting(
                        self.name,
                        gate.name,
                        run.attempt,
                        gate.in_flight,
                        gate.waiting,
                        gate.capacity,
                    ),
                )
            token = gate.acquire_sync(timeout=timeout)
            if hooks:
                emit(hooks, SlotAdmitted(self.name, gate.name, run.attempt, time.monotonic() - now))
            run.phase = "attempt"
            try:
                try:
                    result = fn(*args, **kwargs)
                finally:
                    token.release()
                if inspect.isawaitable(result):
                    close = getattr(result, "close", None)
                    if close is not None:
                        close()  # avoid "coroutine was never awaited" noise
                    msg = f"Policy.call_sync() got an awaitable from {fn!r}; use `await policy.call(...)`"
                    raise _NotAwaitable(msg)
            except _NotAwaitable:
                raise
            except Exception as exc:
                if self._is_control_flow(exc):
                    run.outcome = _NEUTRAL
                    raise
                wait = self._plan_retry(run, exc, permit, time.monotonic(), deadline, testing)
                if isinstance(wait, _Stop):
                    self._fail(run, wait.why, wait.max_attempts, exc)
                run.phase = "sleep"
                if wait > 0:
                    time.sleep(wait)
            else:
                run.outcome = _SUCCESS
                return result


async def _invoke(
    fn: Callable[..., Awaitable[T]], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> T:
    awaitable: object = fn(*args, **kwargs)
    if not inspect.isawaitable(awaitable):
        msg = (
            f"Policy.call() needs fn to return an awaitable ({fn!r} returned "
            f"{type(awaitable).__name__}); use Policy.call_sync() for blocking functions"
        )
        raise _NotAwaitable(msg)
    result: T = await awaitable
    return result
