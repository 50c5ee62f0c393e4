"""Log levels: a storm must not flood the stderr of an application with no logging set up.

Python's last-resort handler prints WARNING and above when nothing is configured, so
anything that happens once per *attempt* stays below WARNING; a call failing for good and
the breaker opening are WARNING; only a broken hook (a bug) is ERROR.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

import anygate
from anygate import BreakerConfig, CallFailed, CircuitOpen, Policy
from tests.policy_helpers import Script, quota, transient

pytestmark = pytest.mark.anyio


def _records(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "anygate"]


async def test_retries_log_at_info_and_giving_up_at_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two scheduled retries are INFO lines; the final failure is one WARNING line."""
    policy = Policy(circuit_breaker=None)
    with caplog.at_level(logging.DEBUG, logger="anygate"), anygate.set_testing(True):
        with pytest.raises(CallFailed):
            await policy.call(Script(transient(), transient(), transient()))
    records = _records(caplog)
    retries = [m for level, m in records if "retrying in" in m]
    assert [level for level, m in records if "retrying in" in m] == [logging.INFO] * 2
    assert all("attempt" in m for m in retries)
    gave_up = [(level, m) for level, m in records if "giving up" in m]
    assert [level for level, _ in gave_up] == [logging.WARNING]
    assert not [m for level, m in records if level >= logging.ERROR]


async def test_a_storm_writes_nothing_at_warning_until_calls_fail(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Fifty calls that each retry twice and then succeed log nothing at WARNING or above."""
    policy = Policy(circuit_breaker=None)
    with caplog.at_level(logging.WARNING, logger="anygate"), anygate.set_testing(True):
        for _ in range(50):
            assert await policy.call(Script(transient(), transient())) == "ok"
    assert _records(caplog) == []


async def test_the_breaker_opening_is_a_warning_and_closing_is_info(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Opening is WARNING (calls are being refused); half-open and closed are INFO."""
    clock = [0.0]
    policy = Policy(
        circuit_breaker=BreakerConfig(when_open="fail", failure_threshold=1, recovery_timeout_sec=10),
        clock=lambda: clock[0],
    )
    with caplog.at_level(logging.DEBUG, logger="anygate"), anygate.set_testing(True):
        with pytest.raises(CallFailed):
            await policy.call(Script(transient(), transient(), transient()))
        with pytest.raises(CircuitOpen):
            await policy.call(Script())
        clock[0] = 11.0
        assert await policy.call(Script()) == "ok"
    circuit = [(level, m) for level, m in _records(caplog) if m.startswith("circuit")]
    assert [level for level, _ in circuit] == [logging.WARNING, logging.INFO, logging.INFO]
    assert "opened" in circuit[0][1]
    assert "half-open" in circuit[1][1]
    assert "closed" in circuit[2][1]


async def test_log_lines_at_every_level_stay_redacted(caplog: pytest.LogCaptureFixture) -> None:
    """The INFO retry line and the WARNING give-up line both carry the redacted detail."""
    leaky = anygate.ResponseError(
        503, body={"error": {"message": "upstream said Authorization: Bearer tok-SECRET-9"}}
    )
    fatal = anygate.ResponseError(
        400, body={"error": {"message": "Incorrect API key provided: sk-SECRETSECRET9"}}
    )
    policy = Policy(circuit_breaker=None)
    with caplog.at_level(logging.DEBUG, logger="anygate"), anygate.set_testing(True):
        with pytest.raises(CallFailed):
            await policy.call(Script(leaky, fatal))
    records: list[Any] = _records(caplog)
    levels = {level for level, _ in records}
    assert {logging.INFO, logging.WARNING} <= levels
    for _, message in records:
        assert "tok-SECRET-9" not in message
        assert "sk-SECRETSECRET9" not in message
    assert sum("[REDACTED]" in m for _, m in records) >= 2


async def test_non_retriable_failures_log_one_warning_and_no_retry(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A quota error is not retried: no INFO retry line, one WARNING give-up line."""
    with caplog.at_level(logging.DEBUG, logger="anygate"):
        with pytest.raises(CallFailed):
            await Policy(circuit_breaker=None).call(Script(quota()))
    records = _records(caplog)
    assert not [m for _, m in records if "retrying in" in m]
    assert [level for level, m in records if "giving up" in m] == [logging.WARNING]
