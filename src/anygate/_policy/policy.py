"""The guarded call: breaker -> deadline scope -> one slot per attempt -> classify -> backoff.

Data flows one way: the policy takes a breaker permit (synchronously, before any await),
then for each attempt takes one gate token (sitting out an adaptive pause, if the gate is
in one, while holding it), runs ``fn`` while holding it, releases it, classifies a failure
and sleeps *without* a slot before the next attempt. The gate knows nothing of retries;
the policy knows nothing of waiter internals.

Timing on the async path uses AnyIO only (``anyio.sleep``, ``anyio.current_time``, cancel
scopes), so trio's ``MockClock`` drives it in tests and the simulator; the sync path uses
``time.sleep`` and ``time.monotonic``.

The public class: its construction, settings and one-call forms (``call`` and
``call_sync`` with their ``ParamSpec`` overloads, the decorator), each a few lines over the
loop in :mod:`anygate._policy.attempts`. Not here: the forms for work that is more than one
function call (``run``, the block form, ``acquire``), which ``Policy`` inherits from
``policy_forms``; the argument checks (``policy_args``); the sharing of gates and breakers
(``sharing``).
"""

from __future__ import annotations

import math
import random
from typing import TYPE_CHECKING, Any, TypeVar, final, overload

import anyio

from .._config.config import AdaptiveConfig, BreakerConfig, RetryConfig
from .._config.loader import load_config
from .._config.policy_config import PolicyConfig
from .._events.logging_hook import LoggingHook
from .._validation import check_int
from . import decorate as _decorate
from .attempts import Attempts
from .blocks import monotonic_deadline, refuse_event_loop
from .policy_args import check_policy_args, policy_kwargs
from .policy_forms import PolicyForms
from .retrying import Retrier, Run, check_deadline
from .sharing import (
    apply_ceiling,
    reconcile_capacity,
    reconcile_rate,
    resolve_adaptive,
    resolve_breaker,
    resolve_gate,
)
from .testing_switch import testing_state

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence

    from typing_extensions import ParamSpec

    from .._classify.classify import RuleLike
    from .._events.events import Hook
    from .._gate.gate import Gate
    from .._gate.rate import Rate
    from .._limits.adaptive import AdaptiveLimit
    from .backoff import Uniform
    from .breaker import CircuitBreaker

__all__ = ["Policy"]

# One instance for every policy that keeps the default: it holds nothing but the logger.
_DEFAULT_LOGGING_HOOK = LoggingHook()

T = TypeVar("T")
if TYPE_CHECKING:
    # call/call_sync check the arguments against fn's signature (ParamSpec) when no
    # deadline is given. PEP 612 allows no keyword parameter between P.args and P.kwargs,
    # so a call with deadline= matches a second, unchecked overload (its result type is
    # still checked); @policy.retry is checked always. Runtime is the same either way.
    P = ParamSpec("P")


@final
class Policy(PolicyForms):
    """Guard provider calls: a shared concurrency cap, retries with jitter, a breaker.

    Each attempt holds one slot of a process-wide :class:`anygate.Gate` for exactly the
    duration of ``fn``; backoff sleeps hold none, so other callers use the slot meanwhile.
    Failures are classified (:func:`anygate.classify`); retriable ones are retried with
    decorrelated jitter or the provider's ``Retry-After`` within the attempt budgets; a
    circuit breaker shared per name fails calls fast while the provider is down.

    Policies with the same ``gate_name`` share one gate, and with the same breaker name one
    breaker, across every event loop and thread in the process. When the provider throttles
    the request *burst rate*, the gate's admission limit adapts for everyone on it (see
    :class:`anygate.AdaptiveConfig`).

    This is not a rate limiter (it bounds concurrency and reacts to throttling) and not an
    HTTP client: ``fn`` makes exactly one provider call per invocation.

    Args:
        name: the policy's name, used in events and logs and as the default gate and
            breaker name.
        max_concurrent_calls: the shared gate's capacity (``0`` = no cap). ``None``: use
            the shared gate as it is (created uncapped if absent).
        busy_wait_s: how long one attempt may wait for a slot before :class:`anygate.Busy`;
            ``None`` (the default) waits as long as the call's ``deadline`` and enclosing
            cancel scopes allow.
        attempt_timeout_s: cancel an attempt that runs longer and treat it as a
            ``transient`` failure (async calls only). ``None``: no per-attempt limit.
        gate_name: the shared gate's name; default ``name``.
        provider: classification hint where providers' wording collides.
        retry: a :class:`anygate.RetryConfig`.
        circuit_breaker: a :class:`anygate.BreakerConfig`; ``False`` or ``None`` for no
            breaker, ``True`` for the defaults.
        adaptive_concurrency: a :class:`anygate.AdaptiveConfig`, or ``True``/``False`` to
            state only whether it is on; ``None`` keeps the gate's existing adaptive
            limit, or creates it with the defaults (on).
        rules: classification rules tried before the built-in ones.
        control_flow: exception classes (or class names) that are control flow, not
            failures: they propagate unchanged and leave the breaker alone.
        hooks: callables receiving each event record (see :mod:`anygate` events), after
            ``logging_hook``.
        logging_hook: the hook that writes the policy's log lines, first in call order:
            by default an :class:`anygate.LoggingHook` on the ``anygate`` logger; another
            ``LoggingHook`` (or any hook) to log elsewhere; ``None`` for no log lines
            from this policy's calls. It receives every event except the slot events.
        rate: the gate's :class:`anygate.Rate` (requests and tokens per minute, slope
            bound); ``None`` leaves the gate's rate as it is. A shared gate that exists
            with another rate raises ``ConfigError`` unless ``reconfigure=True``.
        rate_is_ceiling: ``True`` (the default): ``rate`` is a ceiling, and the limits the
            provider's rate-limit headers report (:class:`anygate.RateLearner`) only ever
            lower it. ``False``: ``rate`` is the provider's *published* limits, a starting
            point its headers replace, up as well as down (a tier upgrade is picked up).
            Sets the gate's learner's ceiling when the policy's ``rate`` is the gate's
            (a ``gate=`` handed in with another rate keeps its learner as it is).
        concurrency_is_ceiling: ``True`` (the default): ``max_concurrent_calls`` is a
            ceiling. ``False``: it is the server's *published* slot count, a starting
            point: successes' latencies may take the gate above it (a local server
            started with more slots than you were told), never above the calls in flight
            less one at a refusal (:attr:`anygate.AdaptiveLimit.probes_published_slots`).
        rng: the random source for jitter (``random.Random(seed)`` for reproducible runs).
        clock: the monotonic clock in seconds of the breaker and of the gate's adaptive
            limit, used when this policy creates them (``anyio.current_time`` for virtual
            time). Pauses are measured with it and slept with the caller's own sleep, so it
            must advance with real (or the loop's virtual) time.
        gate: use this gate instead of the shared one (``max_concurrent_calls`` and
            ``gate_name`` are then ignored; the policy never changes the capacity it was
            handed with, apart from the adaptive limit lowering it after burst-rate
            throttles and restoring it).
        breaker: use this :class:`anygate.CircuitBreaker` instead of the shared one.
        reconfigure: if the shared gate, its adaptive limit or the breaker already exists
            with other settings, apply this policy's settings to it live instead of raising
            ``ConfigError``.
        reraise: after giving up on a *provider* failure, raise the provider's own
            exception (the SDK's ``RateLimitError``, a transport's ``ResponseError``)
            instead of :class:`anygate.CallFailed`, with the ``CallFailed`` reachable
            through :meth:`anygate.CallFailed.of` and its message added as a note
            (tenacity's ``reraise=True``). :meth:`run` and the block forms take their own
            ``reraise=`` that overrides this. Errors that are not the provider's (a
            ``KeyError`` in the caller's code; see docs/policy.md) always propagate
            unchanged, with or without it.

    Raises:
        TypeError: an argument of the wrong type.
        ConfigError: a value out of range, or settings conflicting with the existing shared
            gate or breaker (without ``reconfigure=True``).
    """

    __slots__ = (
        "_adaptive",
        "_breaker",
        "_config",
        "_gate",
        "_hooks",
        "_logging_hook",
        "_loop",
        "_retrier",
    )

    def __init__(
        self,
        *,
        name: str = "llm",
        max_concurrent_calls: int | None = None,
        busy_wait_s: float | None = None,
        attempt_timeout_s: float | None = None,
        gate_name: str | None = None,
        provider: str | None = None,
        retry: RetryConfig | None = None,
        circuit_breaker: BreakerConfig | bool | None = BreakerConfig(),  # noqa: B008 - immutable
        adaptive_concurrency: AdaptiveConfig | bool | None = None,
        rules: Sequence[RuleLike] = (),
        control_flow: Sequence[type[BaseException] | str] = (),
        hooks: Sequence[Hook] = (),
        logging_hook: Hook | None = _DEFAULT_LOGGING_HOOK,
        rate: Rate | None = None,
        rate_is_ceiling: bool = True,
        concurrency_is_ceiling: bool = True,
        rng: Uniform | None = None,
        clock: Callable[[], float] | None = None,
        gate: Gate | None = None,
        breaker: CircuitBreaker | None = None,
        reconfigure: bool = False,
        reraise: bool = False,
    ) -> None:
        args = check_policy_args(
            name=name,
            max_concurrent_calls=max_concurrent_calls,
            busy_wait_s=busy_wait_s,
            attempt_timeout_s=attempt_timeout_s,
            gate_name=gate_name,
            provider=provider,
            retry=retry,
            circuit_breaker=circuit_breaker,
            adaptive_concurrency=adaptive_concurrency,
            rules=rules,
            control_flow=control_flow,
            hooks=hooks,
            logging_hook=logging_hook,
            rate=rate,
            rng=rng,
            reraise=reraise,
            rate_is_ceiling=rate_is_ceiling,
            concurrency_is_ceiling=concurrency_is_ceiling,
        )
        self._config = args.config
        self._hooks = args.hooks
        self._logging_hook = logging_hook
        # The retrier's events (retries, give-ups, breaker and limit moves: the rare path)
        # go to the logging hook too; the slot events, two per call on the happy path, go
        # only to the user's hooks: the logging hook writes nothing for them, and with no
        # user hooks the loop then skips the clock reads that time the slot wait.
        retrier_hooks = self._hooks if logging_hook is None else (logging_hook, *self._hooks)
        self._gate, existing = resolve_gate(self._config, gate)
        self._adaptive = resolve_adaptive(self._config, self._gate, clock, reconfigure)
        if existing:
            reconcile_capacity(self._config, self._gate, self._adaptive, reconfigure)
            reconcile_rate(self._config, self._gate, reconfigure)
        apply_ceiling(self._config, self._gate, self._adaptive)
        self._breaker = resolve_breaker(self._config, breaker, clock, reconfigure)
        self._retrier = Retrier(
            self._config,
            gate=self._gate,
            rules=args.rules,  # callables included; PolicyConfig keeps only Rule objects
            rng=random.Random() if rng is None else rng,
            hooks=retrier_hooks,
            control_types=args.control_types,
            control_names=args.control_names,
            adaptive=self._adaptive,
        )
        self._loop = Attempts(
            name=name,
            gate=self._gate,
            adaptive=self._adaptive,
            hooks=self._hooks,
            busy_wait=self._config.busy_wait_s,
            attempt_timeout=self._config.attempt_timeout_s,
            max_attempts=self._config.retry.max_attempts,
            retrier=self._retrier,
            breaker=self._breaker,
            wait_when_open=self._config.circuit_breaker.when_open == "wait",
            breaker_max_wait=self._config.circuit_breaker.max_wait_sec,
        )

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
        kwargs = policy_kwargs(config)
        kwargs.update(overrides)
        return cls(**kwargs)

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
    def adaptive_limit(self) -> AdaptiveLimit:
        """The gate's adaptive concurrency limit (shared by every policy on the gate)."""
        return self._adaptive

    @property
    def hooks(self) -> tuple[Hook, ...]:
        """The event hooks given as ``hooks``, in call order (after :attr:`logging_hook`)."""
        return self._hooks

    @property
    def logging_hook(self) -> Hook | None:
        """The hook that writes this policy's log lines (``None``: no log lines)."""
        return self._logging_hook

    @property
    def max_concurrent_calls(self) -> int:
        """The gate's configured capacity, ``0`` meaning no cap. Settable at any time.

        Setting it resizes the (shared) gate live: raising it admits queued attempts at
        once; lowering it revokes nothing (attempts in flight finish) and admits no one
        until fewer than the new value are in flight. Calls sleeping between attempts hold
        no slot, so their next attempt simply queues under the new value.

        After a burst-rate throttle the gate's momentary capacity
        (``policy.adaptive_limit.limit``) may be below this value; it grows back to it. A
        new value caps a lowered limit, which then grows back to the new value.
        """
        cap = self._adaptive.max_concurrent_calls
        return 0 if math.isinf(cap) else int(cap)

    @max_concurrent_calls.setter
    def max_concurrent_calls(self, value: int) -> None:
        # Validated in full before anything changes: a huge int used to half-update the
        # adaptive limit and then break this property and repr().
        checked = check_int("max_concurrent_calls", value, minimum=0)
        self._adaptive.resize(checked or math.inf)

    def __repr__(self) -> str:
        gate = self._gate
        cap = "inf" if math.isinf(gate.capacity) else int(gate.capacity)
        maximum = self._adaptive.max_concurrent_calls
        if maximum != gate.capacity:
            cap = f"{cap} (adaptive, max {'inf' if math.isinf(maximum) else int(maximum)})"
        breaker = "off" if self._breaker is None else self._breaker.state.value
        return (
            f"<anygate.Policy {self.name!r} gate {gate.name!r} {gate.in_flight}/{cap}, "
            f"breaker {breaker}>"
        )

    # The decorator form of call/call_sync: its body lives in _decorate (a thin client of
    # them); the overloads are spelled out here so that type checkers see a declared type.
    @overload
    def retry(
        self, fn: Callable[P, Coroutine[Any, Any, T]], /
    ) -> Callable[P, Coroutine[Any, Any, T]]: ...

    @overload
    def retry(self, fn: Callable[P, T], /) -> Callable[P, T]: ...

    def retry(self, fn: Callable[..., Any], /) -> Callable[..., Any]:
        """Decorate ``fn`` so that each call runs under this policy (``@policy.retry``).

        An ``async def`` function becomes one running ``await policy.call(fn, ...)``, any
        other function one running ``policy.call_sync(fn, ...)``; the signature, name and
        docstring are kept. A ``deadline`` keyword argument goes to ``fn`` itself.

        Raises:
            TypeError: ``fn`` is not callable.
        """
        return _decorate.retry(self, fn)

    # ------------------------------------------------------------------ async

    @overload
    async def call(
        self, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs
    ) -> T: ...

    # mypy flags the pair as overlapping (P.kwargs could hold a "deadline"), but a call
    # with deadline= does fail signature 1 and lands here: tests/typing/api.py pins both.
    @overload
    async def call(  # type: ignore[overload-cannot-match]
        self,
        fn: Callable[..., Awaitable[T]],
        /,
        *args: Any,
        deadline: float | None,
        **kwargs: Any,
    ) -> T: ...

    async def call(  # type: ignore[misc]  # the same false overlap as above
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
            CircuitOpen: nothing was attempted: the breaker is open and
                ``circuit_breaker.when_open`` is ``"fail"``, or (``"wait"``, the default)
                the deadline or ``circuit_breaker.max_wait_sec`` (600 s) passed while the
                call waited for it to close.
            Busy: an attempt got no slot within ``busy_wait_s`` (or before ``deadline``).
            TypeError: ``fn`` did not return an awaitable.
            Cancellation and control-flow exceptions propagate unchanged.
        """
        seconds = check_deadline(deadline)
        testing = testing_state()
        retrier = self._retrier
        run = Run()
        run.reraise = self._config.reraise
        try:
            # Each attempt takes its breaker permit inside this try, whose finally settles
            # it: nothing after a permit exists can strand it.
            if seconds is None:
                # No scope of our own: an enclosing one still bounds everything, and
                # skipping it keeps the uncontended call cheap (AnyIO clock reads cost).
                return await self._loop.call(run, testing, fn, args, kwargs, timed=False)
            with anyio.CancelScope(deadline=anyio.current_time() + seconds):
                return await self._loop.call(run, testing, fn, args, kwargs, timed=True)
            # Only our deadline lands here: the scope swallowed its own cancellation.
            retrier.deadline_failure(
                run, seconds, anyio.current_time() - run.slot_started, self._breaker
            )
        finally:
            retrier.settle(run)

    # ------------------------------------------------------------------ sync

    @overload
    def call_sync(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T: ...

    @overload
    def call_sync(  # type: ignore[overload-cannot-match]  # as for call
        self, fn: Callable[..., T], /, *args: Any, deadline: float | None, **kwargs: Any
    ) -> T: ...

    def call_sync(  # type: ignore[misc]  # as for call
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
        seconds = check_deadline(deadline)
        refuse_event_loop("call_sync", "call")
        testing = testing_state()
        retrier = self._retrier
        run = Run()
        run.reraise = self._config.reraise
        try:
            return self._loop.call_sync(run, testing, monotonic_deadline(seconds), fn, args, kwargs)
        finally:
            retrier.settle(run)
