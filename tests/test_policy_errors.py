"""Which errors a policy wraps: the provider's, never the caller's own bugs (issue 28).

A ``KeyError`` raised by the code around a provider call propagates unchanged from every
entry form (stamina and tenacity leave it alone too); a provider failure gives
``CallFailed``, or with ``reraise`` the provider's own exception carrying the
``CallFailed`` (``CallFailed.of``) and a note.
"""

from __future__ import annotations

from typing import Any

import pytest

import anygate
from anygate import BreakerConfig, CallFailed, ConfigError, GaveUp, Policy, ResponseError, Rule
from anygate import RetryConfig as Retry

from .policy_helpers import transient

FAST = Retry(max_attempts=2, base_delay_ms=1, cap_delay_ms=1)


def _policy(events: list[Any], **kwargs: Any) -> Policy:
    """A policy of its own; its breaker opens on one counted failure and then refuses."""
    kwargs.setdefault("retry", FAST)
    kwargs.setdefault(
        "circuit_breaker",
        BreakerConfig(failure_threshold=1, recovery_timeout_sec=3600, when_open="fail"),
    )
    return Policy(
        name=f"errors-{id(events)}", max_concurrent_calls=2, hooks=[events.append], **kwargs
    )


class OwnBug(Exception):
    """An exception of the caller's own code: no status, no code, no SDK module."""


class SdkError(Exception):
    """Shaped like an SDK's own generic error (``openai.OpenAIError``): no status."""


SdkError.__module__ = "openai._exceptions"


async def test_a_callers_own_error_propagates_unchanged_from_every_async_form(
    anyio_backend: Any,
) -> None:
    """KeyError from ``call``, ``@retry``, ``run`` and the block form: the same object,
    asked once, no GaveUp, the breaker untouched, the gate empty."""
    events: list[Any] = []
    policy = _policy(events)
    bug = KeyError("missing")
    asked = 0

    async def fn() -> None:
        nonlocal asked
        asked += 1
        raise bug

    with pytest.raises(KeyError) as info:
        await policy.call(fn)
    assert info.value is bug

    with pytest.raises(KeyError):
        await policy.retry(fn)()

    async def step(attempt: anygate.Attempt) -> None:
        await fn()

    with pytest.raises(KeyError):
        await policy.run(step, reraise=False)

    async def blocks() -> None:
        async for attempt in policy.attempts():
            async with attempt:
                await fn()

    with pytest.raises(KeyError):
        await blocks()

    assert asked == 4
    assert not [e for e in events if isinstance(e, GaveUp)]
    assert policy.breaker is not None
    assert policy.breaker.state == "closed"
    assert policy.gate.in_flight == 0


def test_a_callers_own_error_propagates_unchanged_from_call_sync() -> None:
    """The blocking form too: ZeroDivisionError, not CallFailed, and nothing counted."""
    events: list[Any] = []
    policy = _policy(events)
    with pytest.raises(ZeroDivisionError):
        policy.call_sync(lambda: 1 / 0)
    assert not [e for e in events if isinstance(e, GaveUp)]
    assert policy.gate.in_flight == 0


@pytest.mark.parametrize(
    ("error", "why"),
    [
        (ResponseError(400, body={"error": {"message": "bad request"}}), "a status"),
        (SdkError("the SDK could not parse the answer"), "an SDK's module"),
        (TimeoutError("read timed out"), "retriable"),
    ],
)
def test_provider_failures_are_still_wrapped(error: Exception, why: str) -> None:
    """A failure with a status, from an SDK's module, or retriable: CallFailed with the
    provider's exception as the cause."""
    events: list[Any] = []
    policy = _policy(events)

    def fn() -> None:
        raise error

    with pytest.raises(CallFailed) as info:
        policy.call_sync(fn)
    assert info.value.__cause__ is error, why
    assert [type(e) for e in events if isinstance(e, GaveUp)] == [GaveUp]


def test_an_error_raised_from_a_provider_error_is_the_providers() -> None:
    """A wrapper of the caller's (``raise AppError from sdk_error``) is still a provider
    failure: the chain says where it came from."""
    policy = _policy([])

    def fn() -> None:
        try:
            raise ResponseError(401, body={"error": {"message": "bad key"}})
        except ResponseError as e:
            raise OwnBug("could not ask the model") from e

    with pytest.raises(CallFailed) as info:
        policy.call_sync(fn)
    assert info.value.verdict.reason == "auth"


def test_a_user_rule_makes_an_own_error_a_provider_failure() -> None:
    """A rule that matches says the user counts it as the provider's: it is wrapped (and,
    made retriable, retried)."""
    policy = _policy([], rules=[Rule(exception=OwnBug, reason="transient")], circuit_breaker=False)
    calls = 0

    def fn() -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise OwnBug("gateway hiccup")
        return "ok"

    assert policy.call_sync(fn) == "ok"
    strict = _policy([], rules=[Rule(exception="OwnBug", reason="generic")])
    with pytest.raises(CallFailed):
        strict.call_sync(lambda: (_ for _ in ()).throw(OwnBug("no")))


async def test_reraise_gives_the_provider_exception_with_the_call_failed_on_it(
    anyio_backend: Any,
) -> None:
    """``Policy(reraise=True)``: after the retries the provider's own exception, whose
    ``CallFailed.of`` has the attempts and verdict and whose notes say so; ``run`` and the
    block form take the policy's setting unless told otherwise."""
    events: list[Any] = []
    policy = _policy(events, reraise=True, circuit_breaker=False)
    assert policy.config.reraise is True
    errors = [transient(), transient()]

    async def fn() -> None:
        raise errors.pop(0)

    with pytest.raises(ResponseError) as info:
        await policy.call(fn)
    failure = CallFailed.of(info.value)
    assert failure is not None
    assert (failure.attempts, failure.verdict.reason, failure.verdict.status) == (
        2,
        "transient",
        503,
    )
    assert any("gave up" in n or "call failed after 2" in n for n in info.value.__notes__)
    assert [g.why for g in events if isinstance(g, GaveUp)] == ["budget"]

    async def step(attempt: anygate.Attempt) -> None:
        raise transient()

    with pytest.raises(CallFailed):
        await policy.run(step, reraise=False)
    with pytest.raises(ResponseError):
        await policy.run(step)
    assert CallFailed.of(KeyError("x")) is None
    assert policy.gate.in_flight == 0


def test_reraise_notes_once_for_nested_policies_and_tolerates_slotted_exceptions() -> None:
    """The same exception given up on twice gets one note; one that takes no attributes
    still propagates (note only, ``CallFailed.of`` is None)."""

    class Slotted(Exception):
        __slots__ = ()
        status_code = 503

    error = Slotted("down")
    inner = _policy([], reraise=True, circuit_breaker=False)

    def fn() -> None:
        raise error

    with pytest.raises(Slotted) as info:
        inner.call_sync(fn)
    notes = list(getattr(info.value, "__notes__", []))
    with pytest.raises(Slotted):
        inner.call_sync(fn)
    assert list(getattr(info.value, "__notes__", [])) == notes


def test_reraise_is_checked_and_read_from_yaml(tmp_path: Any) -> None:
    """``reraise`` must be a bool in Python and in YAML; the file's value reaches the
    policy."""
    with pytest.raises(TypeError, match=r"reraise.*'yes'"):
        Policy(name="bad-reraise", reraise="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"llm_call\.reraise"):
        anygate.load_config({"llm_call": {"reraise": "yes"}})
    config = anygate.load_config({"llm_call": {"name": "yaml-reraise", "reraise": True}})
    assert config.reraise is True
    assert config.to_mapping()["llm_call"]["reraise"] is True
    assert Policy.from_config(config).config.reraise is True
