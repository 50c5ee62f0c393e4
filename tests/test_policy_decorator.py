"""``@policy.retry``: the decorator form of Policy.call / call_sync (issue 10, item 2).

What only the decorator does. The behaviours it shares with every other entry point (retry,
give up, breaker, deadline, slots, cancellation) are one contract in
``tests/integrations/test_entry_contract.py``, so the decorator cannot drift from the calls
it wraps.
"""

from __future__ import annotations

import inspect

import pytest

from anygate import Policy, RetryConfig
from tests.policy_helpers import Script, SyncScript, transient

pytestmark = pytest.mark.anyio

INSTANT = RetryConfig(base_delay_ms=0, cap_delay_ms=0)


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
