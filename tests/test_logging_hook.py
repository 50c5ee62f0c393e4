"""Logging is one hook (issue 10): installed by default, removable, replaceable.

The log lines themselves (levels, wording, ``extra`` fields) are pinned by
``test_policy_logging.py`` and ``test_log_fields.py``; these tests pin how the hook is
wired: who gets which events, and that a breaker used without a policy still logs.
"""

from __future__ import annotations

import logging

import pytest

import anygate
from anygate import (
    BreakerConfig,
    CallFailed,
    CircuitBreaker,
    Event,
    GaveUp,
    LoggingHook,
    Policy,
    RetryScheduled,
)
from tests.policy_helpers import Script, transient

pytestmark = pytest.mark.anyio


def _anygate_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("anygate")]


def test_the_default_policy_has_a_logging_hook_on_the_anygate_logger() -> None:
    """``Policy()`` logs through a LoggingHook on ``anygate``; ``hooks`` stays what was given."""
    policy = Policy(circuit_breaker=None, hooks=[print])
    assert isinstance(policy.logging_hook, LoggingHook)
    assert policy.logging_hook.logger is logging.getLogger("anygate")
    assert policy.hooks == (print,)
    assert repr(policy.logging_hook) == "LoggingHook(logger='anygate')"


async def test_logging_hook_none_silences_the_policy(caplog: pytest.LogCaptureFixture) -> None:
    """``logging_hook=None``: a call that retries, gives up and opens the breaker logs
    nothing, while the user's hooks still see every event."""
    events: list[Event] = []
    policy = Policy(
        name="quiet",
        circuit_breaker=BreakerConfig(when_open="fail", failure_threshold=1),
        logging_hook=None,
        hooks=[events.append],
    )
    with caplog.at_level(logging.DEBUG, logger="anygate"), anygate.set_testing(True):
        with pytest.raises(CallFailed):
            await policy.call(Script(transient(), transient(), transient()))
    assert _anygate_records(caplog) == []
    assert {type(e).__name__ for e in events} >= {"GaveUp", "BreakerStateChanged"}


async def test_a_logging_hook_on_another_logger_replaces_the_default(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The records go to the given logger, and only there (no second copy on ``anygate``)."""
    mine = logging.getLogger("myapp.llm")
    policy = Policy(circuit_breaker=None, logging_hook=LoggingHook(mine))
    with caplog.at_level(logging.DEBUG), anygate.set_testing(True):
        with pytest.raises(CallFailed):
            await policy.call(Script(transient(), transient(), transient()))
    names = {r.name for r in caplog.records if "retrying in" in r.getMessage()}
    assert names == {"myapp.llm"}
    assert [r.name for r in caplog.records if "giving up" in r.getMessage()] == ["myapp.llm"]


async def test_the_logging_hook_runs_first_and_sees_no_slot_events() -> None:
    """A plain callable as ``logging_hook`` receives the retrier's events before the
    user's hooks, and never the slot events (they stay off the uncontended path)."""
    order: list[tuple[str, str]] = []
    policy = Policy(
        circuit_breaker=None,
        max_concurrent_calls=1,
        logging_hook=lambda e: order.append(("log", type(e).__name__)),
        hooks=[lambda e: order.append(("user", type(e).__name__))],
    )
    with anygate.set_testing(True), pytest.raises(CallFailed):
        await policy.call(Script(transient(), transient(), transient()))
    logged = [name for who, name in order if who == "log"]
    assert logged == ["RetryScheduled", "RetryScheduled", "GaveUp"]
    assert ("user", "SlotAdmitted") in order
    first_retry = order.index(("log", "RetryScheduled"))
    assert order[first_retry + 1] == ("user", "RetryScheduled")


async def test_events_carry_what_the_log_line_needs() -> None:
    """RetryScheduled has the gate, the count within its budget and the exact wait;
    GaveUp has the gate."""
    events: list[Event] = []
    policy = Policy(name="p", gate_name="g", circuit_breaker=None, hooks=[events.append])
    with anygate.set_testing(True), pytest.raises(CallFailed):
        await policy.call(Script(transient(), transient(), transient()))
    retries = [e for e in events if isinstance(e, RetryScheduled)]
    assert [(e.gate, e.counted, e.attempt, e.wait_s) for e in retries] == [
        ("g", 1, 1, 0.0),
        ("g", 2, 2, 0.0),
    ]
    (gave_up,) = [e for e in events if isinstance(e, GaveUp)]
    assert gave_up.gate == "g"


def test_a_breaker_used_without_a_policy_still_logs(caplog: pytest.LogCaptureFixture) -> None:
    """No policy, no hooks: the breaker's own state changes are still logged, once each."""
    breaker = CircuitBreaker("direct", failure_threshold=1, recovery_timeout=5)
    with caplog.at_level(logging.DEBUG, logger="anygate"):
        breaker.acquire().failure()
    opened = [r for r in _anygate_records(caplog) if "opened" in r.getMessage()]
    assert [(r.levelno, r.breaker) for r in opened] == [(logging.WARNING, "direct")]  # type: ignore[attr-defined]


async def test_a_policy_logs_each_breaker_change_once(caplog: pytest.LogCaptureFixture) -> None:
    """Through a policy the change is logged by its hook only, not again by the breaker."""
    policy = Policy(
        name="once", circuit_breaker=BreakerConfig(when_open="fail", failure_threshold=1)
    )
    with caplog.at_level(logging.DEBUG, logger="anygate"), anygate.set_testing(True):
        with pytest.raises(CallFailed):
            await policy.call(Script(transient(), transient(), transient()))
    opened = [r for r in _anygate_records(caplog) if "opened" in r.getMessage()]
    assert len(opened) == 1


def test_logging_hook_refuses_what_is_not_a_logger() -> None:
    """``LoggingHook("name")`` is an easy slip: it names the argument."""
    with pytest.raises(TypeError, match=r"logger must be a logging\.Logger"):
        LoggingHook("myapp")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="logging_hook must be a callable"):
        Policy(logging_hook=3)  # type: ignore[arg-type]
