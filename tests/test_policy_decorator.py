"""``@policy.retry``: the decorator form of Policy.call / call_sync (issue 10, item 2).

One small contract run over every entry point a user calls directly (``call``,
``call_sync``, the decorator on an async and on a blocking function), so the decorator
cannot drift from the calls it wraps; then what only the decorator does.
"""

from __future__ import annotations

import functools
import inspect
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
import pytest

import anygate
from anygate import CallFailed, Policy, RetryConfig, RetryScheduled
from tests.policy_helpers import Script, SyncScript, quota, transient

if TYPE_CHECKING:
    from collections.abc import Callable

pytestmark = pytest.mark.anyio

INSTANT = RetryConfig(base_delay_ms=0, cap_delay_ms=0)


async def _via_call(policy: Policy, fn: Any, *args: Any, **kwargs: Any) -> Any:
    return await policy.call(fn, *args, **kwargs)


async def _via_call_sync(policy: Policy, fn: Any, *args: Any, **kwargs: Any) -> Any:
    # From a worker thread: call_sync refuses a thread that runs an event loop.
    return await anyio.to_thread.run_sync(functools.partial(policy.call_sync, fn, *args, **kwargs))


async def _via_decorator(policy: Policy, fn: Any, *args: Any, **kwargs: Any) -> Any:
    return await policy.retry(fn)(*args, **kwargs)


async def _via_sync_decorator(policy: Policy, fn: Any, *args: Any, **kwargs: Any) -> Any:
    return await anyio.to_thread.run_sync(functools.partial(policy.retry(fn), *args, **kwargs))


# (entry point, whether it drives an async provider function)
ENTRY_POINTS = [
    pytest.param(_via_call, True, id="call"),
    pytest.param(_via_call_sync, False, id="call_sync"),
    pytest.param(_via_decorator, True, id="retry-async"),
    pytest.param(_via_sync_decorator, False, id="retry-sync"),
]


def _script(is_async: bool, *errors: BaseException) -> Script | SyncScript:
    return Script(*errors) if is_async else SyncScript(*errors)


@pytest.mark.parametrize(("enter", "is_async"), ENTRY_POINTS)
async def test_retries_transient_failures_then_returns(
    enter: Callable[..., Any], is_async: bool
) -> None:
    """Two 503s are retried (with events) and the third attempt's result comes back; the
    arguments reach the function unchanged and no slot is left taken."""
    events: list[Any] = []
    policy = Policy(retry=INSTANT, hooks=[events.append])
    script = _script(is_async, transient(), transient())
    assert await enter(policy, script, 1, key="v") == "ok"
    assert script.calls == 3
    assert [e.attempt for e in events if isinstance(e, RetryScheduled)] == [1, 2]
    assert policy.gate.in_flight == 0


@pytest.mark.parametrize(("enter", "is_async"), ENTRY_POINTS)
async def test_a_non_retriable_failure_is_call_failed_at_once(
    enter: Callable[..., Any], is_async: bool
) -> None:
    """A billing error is not retried: CallFailed with the provider's error as cause."""
    policy = Policy(retry=INSTANT)
    error = quota()
    script = _script(is_async, error)
    with pytest.raises(CallFailed) as info:
        await enter(policy, script)
    assert info.value.__cause__ is error
    assert script.calls == 1
    assert policy.gate.in_flight == 0


@pytest.mark.parametrize(("enter", "is_async"), ENTRY_POINTS)
async def test_an_open_breaker_refuses_before_calling(
    enter: Callable[..., Any], is_async: bool
) -> None:
    """After the breaker opens, every entry point refuses with CircuitOpen, calling nothing."""
    policy = Policy(
        retry=RetryConfig(max_attempts=1, throttle_attempts=1),
        circuit_breaker=anygate.BreakerConfig(
            failure_threshold=1, recovery_timeout_sec=3600, when_open="fail"
        ),
    )
    with pytest.raises(CallFailed):
        await enter(policy, _script(is_async, transient()))
    script = _script(is_async)
    with pytest.raises(anygate.CircuitOpen):
        await enter(policy, script)
    assert script.calls == 0


async def test_the_decorated_async_function_keeps_its_identity() -> None:
    """functools.wraps: name, docstring and signature survive; the result is async."""
    policy = Policy(retry=INSTANT)

    async def complete(prompt: str, *, temperature: float = 0.0) -> str:
        """Ask the model."""
        return f"{prompt}@{temperature}"

    guarded = policy.retry(complete)
    assert inspect.iscoroutinefunction(guarded)
    assert (guarded.__name__, guarded.__doc__) == ("complete", "Ask the model.")
    assert inspect.signature(guarded) == inspect.signature(complete)
    assert await guarded("hi", temperature=0.5) == "hi@0.5"


def test_the_decorated_blocking_function_stays_blocking() -> None:
    """A plain function becomes a plain function running call_sync."""
    policy = Policy(retry=INSTANT)
    script = SyncScript(transient())

    @policy.retry
    def complete(prompt: str) -> object:
        return script(prompt)

    assert not inspect.iscoroutinefunction(complete)
    assert complete("hi") == "ok"
    assert script.calls == 2


async def test_a_callable_with_an_async_call_method_is_async() -> None:
    """An instance whose ``__call__`` is ``async def`` (like Script) gets the async wrapper."""
    policy = Policy(retry=INSTANT)
    guarded = policy.retry(Script(transient()))
    assert inspect.iscoroutinefunction(guarded)
    assert await guarded() == "ok"


async def test_a_deadline_keyword_goes_to_the_function() -> None:
    """``deadline=`` of a decorated call is the function's own argument, not the policy's."""
    policy = Policy(retry=INSTANT)
    seen: list[object] = []

    @policy.retry
    async def fetch(*, deadline: str) -> str:
        seen.append(deadline)
        return "done"

    assert await fetch(deadline="tomorrow") == "done"
    assert seen == ["tomorrow"]


def test_a_deadline_keyword_goes_to_the_blocking_function() -> None:
    """The same for the blocking wrapper."""
    policy = Policy(retry=INSTANT)

    @policy.retry
    def fetch(*, deadline: str) -> str:
        return deadline

    assert fetch(deadline="tomorrow") == "tomorrow"


def test_decorating_a_non_callable_is_a_type_error() -> None:
    """The message names the decorator and what it got."""
    policy = Policy()
    with pytest.raises(
        TypeError, match=r"policy.retry\(\) decorates a function \(got 3 of type int\)"
    ):
        policy.retry(3)  # type: ignore[call-overload]
