"""Structured log fields: every ``anygate`` record carries its facts in ``extra`` (issue 15).

JSON log handlers and structlog's stdlib bridge read record attributes, not the message
text; these tests check the attributes a retry, a give-up and breaker moves set.
"""

from __future__ import annotations

import logging

import pytest

import anygate
from anygate import BreakerConfig, CallFailed, Policy
from tests.policy_helpers import Script, transient

pytestmark = pytest.mark.anyio


async def test_retry_and_give_up_records_have_fields(caplog: pytest.LogCaptureFixture) -> None:
    """A retried then failed call: the retry record has gate, policy, reason, attempt and
    delay; the give-up record has gate, policy, reason and attempt."""
    policy = Policy(name="chat", gate_name="llm", circuit_breaker=None)
    with caplog.at_level(logging.DEBUG, logger="anygate"), anygate.set_testing(True):
        with pytest.raises(CallFailed):
            await policy.call(Script(transient(), transient(), transient()))
    records = [r for r in caplog.records if r.name == "anygate"]
    retries = [r for r in records if "retrying in" in r.getMessage()]
    assert [(r.gate, r.policy, r.reason, r.attempt, r.delay_s) for r in retries] == [  # type: ignore[attr-defined]
        ("llm", "chat", "transient", 1, 0.0),
        ("llm", "chat", "transient", 2, 0.0),
    ]
    (gave_up,) = [r for r in records if "giving up" in r.getMessage()]
    assert (gave_up.gate, gave_up.policy, gave_up.reason, gave_up.attempt) == (  # type: ignore[attr-defined]
        "llm",
        "chat",
        "transient",
        3,
    )


async def test_breaker_records_have_fields(caplog: pytest.LogCaptureFixture) -> None:
    """The breaker opening names the breaker, the new state and the delay to the probe."""
    policy = Policy(
        name="chat",
        circuit_breaker=BreakerConfig(when_open="fail", failure_threshold=1, recovery_timeout_sec=10),
    )
    with caplog.at_level(logging.DEBUG, logger="anygate"), anygate.set_testing(True):
        with pytest.raises(CallFailed):
            await policy.call(Script(transient(), transient(), transient()))
    (opened,) = [r for r in caplog.records if "opened" in r.getMessage()]
    assert (opened.breaker, opened.state, opened.delay_s) == ("chat", "open", 10)  # type: ignore[attr-defined]
