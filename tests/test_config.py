"""Configuration: YAML/mapping loading, strict validation, every key wired end to end."""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import anyio
import pytest

import anygate
from anygate import (
    AdaptiveConfig,
    BreakerConfig,
    CallFailed,
    ConfigError,
    LimitChanged,
    Policy,
    PolicyConfig,
    Reason,
    RetryConfig,
    RetryScheduled,
    load_config,
)
from tests.conftest import mock_clock
from tests.policy_helpers import Script, StreamChunkTimeoutError, burst, transient

EXAMPLE = Path(__file__).resolve().parent.parent / "config.example.yaml"


def test_defaults_are_the_documented_numbers() -> None:
    """An empty config gives the documented defaults."""
    config = load_config({})
    retry = config.retry
    assert (retry.max_attempts, retry.base_delay_ms, retry.cap_delay_ms) == (3, 1000, 8000)
    assert (retry.burst_base_delay_ms, retry.retry_after_max_s) == (5000, 120)
    assert dict(retry.reason_budgets) == {}
    assert retry.throttle_attempts == 12
    assert dict(retry.exception_budgets) == {"StreamChunkTimeoutError": 2}
    assert (config.busy_wait_s, config.max_concurrent_calls, config.name) == (None, None, "llm")
    assert config.circuit_breaker.enabled
    assert config.circuit_breaker.when_open == "wait"
    assert config == PolicyConfig()


def test_the_example_file_documents_every_key_and_loads() -> None:
    """config.example.yaml names every key there is, and its values are the defaults."""
    yaml = pytest.importorskip("yaml")
    raw = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    effective = load_config(EXAMPLE).to_mapping()
    for section, keys in effective.items():
        assert set(raw[section]) == set(keys), section
    policy = Policy.from_config(EXAMPLE)
    assert policy.max_concurrent_calls == 0
    assert policy.breaker is not None
    assert (policy.breaker.failure_threshold, policy.breaker.recovery_timeout) == (5, 5)
    assert policy.config.retry == RetryConfig()


@pytest.mark.parametrize("text", ["", "\n", "# nothing here\n"])
def test_an_empty_yaml_file_is_refused_by_every_loader(tmp_path: Path, text: str) -> None:
    """A file with nothing in it is refused by ``load_config`` and ``Policy.from_config``,
    as ``check-config`` refuses it (issue 28: it used to load as every default); the
    message says how to ask for the defaults."""
    pytest.importorskip("yaml")
    path = tmp_path / "empty.yaml"
    path.write_text(text, encoding="utf-8")
    for load in (load_config, Policy.from_config):
        with pytest.raises(ConfigError, match=r"is empty .*'llm_call: \{\}'") as info:
            load(path)
        assert info.value.path == ""
    path.write_text("llm_call: {}\n", encoding="utf-8")
    assert load_config(path) == PolicyConfig()


@pytest.mark.parametrize(
    ("text", "line", "key", "first"),
    [
        ("llm_call:\n  busy_wait_s: 5\nllm_call:\n  retry_max_attempts: 2\n", 3, "llm_call", 1),
        ("llm_call:\n  busy_wait_s: 5\n  busy_wait_s: 6\n", 3, "busy_wait_s", 2),
        ("circuit_breaker: {enabled: true, enabled: false}\n", 1, "enabled", 1),
    ],
    ids=["section", "key", "flow-mapping"],
)
def test_duplicate_keys_are_refused_by_every_loader(
    tmp_path: Path, text: str, line: int, key: str, first: int
) -> None:
    """A key given twice is refused with the file, both lines and the key by
    ``load_config`` and ``Policy.from_config`` (issue 28: a second ``llm_call:`` silently
    dropped the first)."""
    pytest.importorskip("yaml")
    path = tmp_path / "dup.yaml"
    path.write_text(text, encoding="utf-8")
    expected = f"{path}:{line}: duplicate key {key!r} (first at line {first})"
    for load in (load_config, Policy.from_config):
        with pytest.raises(ConfigError, match=re.escape(expected)):
            load(path)


@pytest.mark.parametrize(
    ("written", "value"),
    [("1e3", 1000.0), ("1.5E3", 1500.0), ("2.5e-1", 0.25), ("+1e+2", 100.0), ("1000", 1000)],
)
def test_exponent_numbers_are_numbers_as_in_yaml_1_2(
    tmp_path: Path, written: str, value: float
) -> None:
    """``1e3`` is a number (YAML 1.2) wherever a number is expected; YAML 1.1, which
    PyYAML follows, read it as the string '1e3', refused as "of type str" (issue 28)."""
    pytest.importorskip("yaml")
    path = tmp_path / "exp.yaml"
    path.write_text(
        f"llm_call:\n  busy_wait_s: {written}\n  requests_per_minute: {written}\n"
        f"circuit_breaker:\n  recovery_timeout_sec: {written}\n",
        encoding="utf-8",
    )
    config = load_config(path)
    assert config.busy_wait_s == value
    assert config.rate is not None
    assert config.rate.requests_per_minute == value
    assert config.circuit_breaker.recovery_timeout_sec == value


def test_the_yaml_1_2_numbers_do_not_leak_into_yaml_safe_load() -> None:
    """The config reader's resolver is its own: PyYAML's ``safe_load`` (other code in the
    same process) still reads ``1e3`` as YAML 1.1 does."""
    yaml = pytest.importorskip("yaml")
    load_config({"llm_call": {}})
    from anygate._yaml import parse_yaml

    assert parse_yaml("x: 1e3\n", "t") == {"x": 1000.0}
    assert yaml.safe_load("x: 1e3\n") == {"x": "1e3"}


FULL = {
    "llm_call": {
        "name": "chat",
        "gate_name": "shared-llm",
        "max_concurrent_calls": 2,
        "busy_wait_s": 7,
        "attempt_timeout_s": 30,
        "provider": "dashscope",
        "retry_max_attempts": 4,
        "retry_base_delay_ms": 200,
        "retry_cap_delay_ms": 400,
        "burst_retry_base_delay_ms": 300,
        "retry_after_max_s": 10,
        "reason_budgets": {"burst_rate": 3, "busy": 2},
        "exception_budgets": {"StreamChunkTimeoutError": 1},
        "control_flow_exceptions": ["GraphBubbleUp"],
        "rules": [{"contains": "model is loading", "reason": "busy"}],
        "adaptive_concurrency": {
            "enabled": True,
            "min_concurrent_calls": 1,
            "decrease_factor": 0.5,
            "pause_ms": 250,
        },
    },
    "circuit_breaker": {
        "enabled": True,
        "name": "chat-breaker",
        "failure_threshold": 5,
        "recovery_timeout_sec": 15,
        "when_open": "fail",
    },
}


def test_every_key_lands_in_the_policy() -> None:
    """Each key of a full config reaches the object that uses it."""
    policy = Policy.from_config(FULL)
    config = policy.config
    assert (policy.name, policy.gate.name, policy.gate.capacity) == ("chat", "shared-llm", 2)
    assert (config.busy_wait_s, config.attempt_timeout_s, config.provider) == (7, 30, "dashscope")
    assert config.retry == RetryConfig(
        max_attempts=4,
        base_delay_ms=200,
        cap_delay_ms=400,
        burst_base_delay_ms=300,
        retry_after_max_s=10,
        reason_budgets={"burst_rate": 3, "busy": 2},
        exception_budgets={"StreamChunkTimeoutError": 1},
    )
    assert config.control_flow == ("GraphBubbleUp",)
    assert config.rules == (anygate.Rule(contains="model is loading", reason="busy"),)
    assert policy.breaker is not None
    assert policy.breaker.name == "chat-breaker"
    assert (policy.breaker.failure_threshold, policy.breaker.recovery_timeout) == (5, 15)
    assert policy.config.circuit_breaker.when_open == "fail"
    assert policy.adaptive_limit.settings() == (True, 1, 0.5, 0.25)
    assert config.adaptive_concurrency == anygate.AdaptiveConfig(
        enabled=True, min_concurrent_calls=1, decrease_factor=0.5, pause_ms=250
    )
    assert config.to_mapping()["llm_call"]["retry_cap_delay_ms"] == 400
    assert load_config(config.to_mapping()).to_mapping() == config.to_mapping()


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", [mock_clock()])
async def test_every_key_changes_behaviour_end_to_end() -> None:
    """The config's numbers drive the calls: budgets, windows, ceiling, rules, control flow,
    provider hint, busy wait, the adaptive limit and the breaker."""
    events: list[Any] = []
    policy = Policy.from_config(
        FULL, hooks=[events.append], rng=random.Random(5), clock=anyio.current_time
    )

    # retry_max_attempts 4, transient window [200, 400] ms (base 200, cap 400)
    script = Script(*[transient() for _ in range(5)])
    with pytest.raises(CallFailed):
        await policy.call(script)
    assert script.calls == 4
    waits = [e.wait_ms for e in events if isinstance(e, RetryScheduled)]
    assert len(waits) == 3
    assert all(200 <= w <= 400 for w in waits)

    # failure_threshold 2 / recovery 15 s: a second exhausted call opens the breaker
    assert policy.breaker is not None
    policy.breaker.reset()
    events.clear()
    # reason_budgets: burst_rate 3, burst base 300 ms (window [300, 400])
    script = Script(*[burst() for _ in range(5)])
    with pytest.raises(CallFailed):
        await policy.call(script)
    assert script.calls == 3
    # No backoff of its own: with adaptive concurrency on, the gate's pause (250 ms, as
    # configured below) times the retry, and each event announces it.
    assert [e.wait_ms for e in events if isinstance(e, RetryScheduled)] == [250, 250]
    # adaptive_concurrency: 2 x 0.5 -> 1 slot, a 250 ms pause, floor 1 (each retry was
    # admitted after the previous cut, so each throttle counts; at the floor it lowers
    # nothing but pauses again)
    cuts = [(e.old, e.new, e.pause_s) for e in events if isinstance(e, LimitChanged)]
    assert cuts == [(2, 1, 0.25), (1, 1, 0.25), (1, 1, 0.25)]
    assert policy.gate.capacity == 1

    # exception_budgets: StreamChunkTimeoutError 1 -> no retry at all
    script = Script(StreamChunkTimeoutError(), StreamChunkTimeoutError())
    with pytest.raises(CallFailed):
        await policy.call(script)
    assert script.calls == 1

    # retry_after_max_s 10: a Retry-After of 11 s gives up at once
    script = Script(transient(retry_after="11"))
    with pytest.raises(CallFailed):
        await policy.call(script)
    assert script.calls == 1
    assert policy.breaker.statistics().failures == 2  # the stream timeout, the 503 + Retry-After

    policy.breaker.reset()
    # rules: "model is loading" is busy (retriable) -> retried and succeeds
    assert await policy.call(Script(anygate.ResponseError(400, body="model is loading"))) == "ok"
    # provider dashscope: 429 insufficient_quota is a transient window -> retried
    dashscope = anygate.ResponseError(429, body={"code": "insufficient_quota"})
    assert await policy.call(Script(dashscope)) == "ok"
    assert policy.gate.capacity == 2  # the successes grew the adaptive limit back

    # control_flow_exceptions: GraphBubbleUp passes through unchanged
    class GraphBubbleUp(Exception):
        pass

    with pytest.raises(GraphBubbleUp):
        await policy.call(Script(GraphBubbleUp()))

    # busy_wait_s 7 with max_concurrent_calls 2
    held = [policy.gate.acquire_nowait(), policy.gate.acquire_nowait()]
    start = anyio.current_time()
    with pytest.raises(anygate.Busy):
        await policy.call(Script())
    assert anyio.current_time() - start == pytest.approx(7)
    for token in held:
        token.release()


def test_breaker_can_be_disabled() -> None:
    """circuit_breaker.enabled: false means no breaker at all."""
    policy = Policy.from_config({"circuit_breaker": {"enabled": False}})
    assert policy.breaker is None


BAD: list[tuple[Any, str, str]] = [
    ({"llm_calls": {}}, "llm_calls", "unknown key 'llm_calls'"),
    (
        {"llm_call": {"retry_max_attempt": 3}},
        "llm_call.retry_max_attempt",
        "did you mean 'retry_max_attempts'",
    ),
    ({"circuit_breaker": {"threshold": 5}}, "circuit_breaker.threshold", "unknown key"),
    ({"llm_call": [1, 2]}, "llm_call", "must be a mapping"),
    (
        {"llm_call": {"max_concurrent_calls": -1}},
        "llm_call.max_concurrent_calls",
        "an integer >= 0 or null (got -1)",
    ),
    ({"llm_call": {"max_concurrent_calls": 2.5}}, "llm_call.max_concurrent_calls", "of type float"),
    ({"llm_call": {"max_concurrent_calls": True}}, "llm_call.max_concurrent_calls", "of type bool"),
    ({"llm_call": {"max_concurrent_calls": "4"}}, "llm_call.max_concurrent_calls", "of type str"),
    ({"llm_call": {"busy_wait_s": -5}}, "llm_call.busy_wait_s", ">= 0 or null (got -5)"),
    ({"llm_call": {"busy_wait_s": "60s"}}, "llm_call.busy_wait_s", "a finite number"),
    ({"llm_call": {"attempt_timeout_s": 0}}, "llm_call.attempt_timeout_s", "> 0 or null (got 0)"),
    (
        {"llm_call": {"retry_max_attempts": 0}},
        "llm_call.retry_max_attempts",
        "an integer >= 1 (got 0)",
    ),
    ({"llm_call": {"retry_base_delay_ms": -1}}, "llm_call.retry_base_delay_ms", ">= 0 (got -1)"),
    (
        {"llm_call": {"retry_cap_delay_ms": float("nan")}},
        "llm_call.retry_cap_delay_ms",
        "(got nan)",
    ),
    (
        {"llm_call": {"burst_retry_base_delay_ms": float("inf")}},
        "llm_call.burst_retry_base_delay_ms",
        "(got inf)",
    ),
    ({"llm_call": {"retry_after_max_s": None}}, "llm_call.retry_after_max_s", "a finite number"),
    (
        {"llm_call": {"reason_budgets": {"slow": 2}}},
        "llm_call.reason_budgets.slow",
        "one of quota, auth",
    ),
    (
        {"llm_call": {"reason_budgets": {"burst_rate": 0}}},
        "llm_call.reason_budgets.burst_rate",
        ">= 1 (got 0)",
    ),
    ({"llm_call": {"reason_budgets": [2]}}, "llm_call.reason_budgets", "a mapping"),
    (
        {"llm_call": {"exception_budgets": {"Not A Name": 2}}},
        "llm_call.exception_budgets.Not A Name",
        "class name",
    ),
    (
        {"llm_call": {"control_flow_exceptions": "GraphBubbleUp"}},
        "llm_call.control_flow_exceptions",
        "a list",
    ),
    ({"llm_call": {"rules": [{"contains": "x"}]}}, "llm_call.rules[0].reason", "is required"),
    ({"llm_call": {"rules": [{"reason": "busy"}]}}, "llm_call.rules[0]", "at least one of"),
    (
        {"llm_call": {"rules": [{"reason": "nap", "status": 1}]}},
        "llm_call.rules[0].reason",
        "one of quota",
    ),
    (
        {"llm_call": {"rules": [{"reason": "busy", "statuss": 429}]}},
        "llm_call.rules[0].statuss",
        "did you mean 'status'",
    ),
    (
        {"llm_call": {"rules": [{"reason": "busy", "status": "429"}]}},
        "llm_call.rules[0].status",
        "an HTTP status",
    ),
    ({"llm_call": {"name": ""}}, "llm_call.name", "a non-empty string"),
    ({"circuit_breaker": {"enabled": "yes"}}, "circuit_breaker.enabled", "true or false"),
    (
        {"circuit_breaker": {"failure_threshold": 0}},
        "circuit_breaker.failure_threshold",
        ">= 1 (got 0)",
    ),
    (
        {"circuit_breaker": {"recovery_timeout_sec": -1}},
        "circuit_breaker.recovery_timeout_sec",
        ">= 0 (got -1)",
    ),
    (
        {"llm_call": {"adaptive_concurrency": "on"}},
        "llm_call.adaptive_concurrency",
        "a mapping, true or false (got 'on' of type str)",
    ),
    (
        {"llm_call": {"adaptive_concurrency": {"enabled": "yes"}}},
        "llm_call.adaptive_concurrency.enabled",
        "true or false (got 'yes' of type str)",
    ),
    (
        {"llm_call": {"adaptive_concurrency": {"decrease": 0.5}}},
        "llm_call.adaptive_concurrency.decrease",
        "did you mean 'decrease_factor'",
    ),
    (
        {"llm_call": {"adaptive_concurrency": {"min_concurrent_calls": 0}}},
        "llm_call.adaptive_concurrency.min_concurrent_calls",
        "an integer >= 1 or null (got 0)",
    ),
    (
        {"llm_call": {"adaptive_concurrency": {"min_concurrent_calls": 2.5}}},
        "llm_call.adaptive_concurrency.min_concurrent_calls",
        "of type float",
    ),
    (
        {
            "llm_call": {
                "max_concurrent_calls": 4,
                "adaptive_concurrency": {"min_concurrent_calls": 8},
            }
        },
        "llm_call.adaptive_concurrency.min_concurrent_calls",
        "must be <= llm_call.max_concurrent_calls (4) (got 8)",
    ),
    (
        {"llm_call": {"adaptive_concurrency": {"decrease_factor": 1}}},
        "llm_call.adaptive_concurrency.decrease_factor",
        "a number > 0 and < 1 or null (got 1)",
    ),
    (
        {"llm_call": {"adaptive_concurrency": {"decrease_factor": 0}}},
        "llm_call.adaptive_concurrency.decrease_factor",
        "(got 0)",
    ),
    (
        {"llm_call": {"adaptive_concurrency": {"decrease_factor": float("nan")}}},
        "llm_call.adaptive_concurrency.decrease_factor",
        "(got nan)",
    ),
    (
        {"llm_call": {"adaptive_concurrency": {"decrease_factor": "0.7"}}},
        "llm_call.adaptive_concurrency.decrease_factor",
        "of type str",
    ),
    (
        {"llm_call": {"adaptive_concurrency": {"pause_ms": -1}}},
        "llm_call.adaptive_concurrency.pause_ms",
        "a finite number >= 0 or null (got -1)",
    ),
    (
        {"llm_call": {"adaptive_concurrency": {"pause_ms": float("inf")}}},
        "llm_call.adaptive_concurrency.pause_ms",
        "(got inf)",
    ),
]


@pytest.mark.parametrize(("config", "path", "fragment"), BAD, ids=[b[1] for b in BAD])
def test_bad_values_are_rejected_with_the_key_path(config: Any, path: str, fragment: str) -> None:
    """Ported and extended: each bad value raises ConfigError naming the key path, the
    value and what is allowed; nothing falls back to a default silently."""
    with pytest.raises(ConfigError) as info:
        load_config(config)
    assert info.value.path == path
    message = str(info.value)
    assert path in message
    assert fragment in message
    assert isinstance(info.value, ValueError)


def test_a_non_mapping_document_is_rejected(tmp_path: Path) -> None:
    """A YAML list at the top level is not a config."""
    pytest.importorskip("yaml")
    path = tmp_path / "list.yaml"
    path.write_text("- 1\n- 2\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config(path)


def test_yaml_is_loaded_safely(tmp_path: Path) -> None:
    """Python object tags are refused: the loader is yaml.safe_load."""
    pytest.importorskip("yaml")
    path = tmp_path / "evil.yaml"
    path.write_text("llm_call: !!python/object/apply:os.system ['true']\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(path)


def test_broken_or_missing_files_name_the_file(tmp_path: Path) -> None:
    """Syntax errors and missing files are ConfigErrors that name the path."""
    pytest.importorskip("yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("llm_call: {busy_wait_s: [\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=re.escape(str(broken))):
        load_config(broken)
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(TypeError, match="path or a mapping"):
        load_config(42)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("factory", "error", "fragment"),
    [
        (lambda: RetryConfig(max_attempts="3"), TypeError, "max_attempts must be an integer"),  # type: ignore[arg-type]
        (lambda: RetryConfig(max_attempts=0), ConfigError, "max_attempts must be an integer >= 1"),
        (lambda: RetryConfig(cap_delay_ms=-1), ConfigError, "cap_delay_ms must be a finite"),
        (lambda: RetryConfig(reason_budgets={"nope": 1}), ConfigError, "reason_budgets.nope"),
        (lambda: BreakerConfig(failure_threshold=0), ConfigError, "failure_threshold"),
        (lambda: BreakerConfig(enabled=1), TypeError, "enabled must be true or false"),  # type: ignore[arg-type]
        (lambda: Policy(busy_wait_s=-1), ConfigError, "busy_wait_s"),
        (lambda: Policy(max_concurrent_calls=1.5), TypeError, "max_concurrent_calls"),  # type: ignore[arg-type]
        (lambda: Policy(hooks=[3]), TypeError, "hooks must be callables"),  # type: ignore[list-item]
        (lambda: Policy(rng=object()), TypeError, "uniform"),  # type: ignore[arg-type]
        (lambda: Policy(control_flow=[3]), TypeError, "control_flow"),  # type: ignore[list-item]
        (lambda: Policy(rules=["busy"]), TypeError, "rules entries"),  # type: ignore[list-item]
        (
            lambda: AdaptiveConfig(decrease_factor=1.5),
            ConfigError,
            "decrease_factor must be a number > 0 and < 1 or null (got 1.5)",
        ),
        (
            lambda: AdaptiveConfig(min_concurrent_calls="2"),  # type: ignore[arg-type]
            TypeError,
            "min_concurrent_calls must be an integer >= 1 or null (got '2' of type str)",
        ),
        (lambda: AdaptiveConfig(enabled="yes"), TypeError, "enabled must be true or false"),  # type: ignore[arg-type]
        (lambda: AdaptiveConfig(pause_ms=-5), ConfigError, "pause_ms must be a finite number"),
        (
            lambda: Policy(
                max_concurrent_calls=2,
                adaptive_concurrency=AdaptiveConfig(min_concurrent_calls=3),
            ),
            ConfigError,
            "adaptive_concurrency.min_concurrent_calls must be <= max_concurrent_calls (2) (got 3)",
        ),
        (lambda: Policy(adaptive_concurrency="on"), TypeError, "adaptive_concurrency must be"),  # type: ignore[arg-type]
    ],
)
def test_the_python_api_validates_the_same_way(
    factory: Any, error: type[Exception], fragment: str
) -> None:
    """Keyword arguments: wrong types raise TypeError, bad values ConfigError (a ValueError)."""
    with pytest.raises(error, match=re.escape(fragment)):
        factory()


def test_config_objects_are_frozen_values() -> None:
    """Equal settings compare and hash equal; the objects cannot be changed."""
    a = RetryConfig(max_attempts=2, reason_budgets={"burst_rate": 2})
    b = RetryConfig(max_attempts=2, reason_budgets={"burst_rate": 2})
    assert a == b
    assert hash(a) == hash(b)
    assert {a, b} == {a}
    assert RetryConfig(max_attempts=5) != b
    with pytest.raises(AttributeError):
        a.max_attempts = 9  # type: ignore[misc]
    with pytest.raises(TypeError):
        a.reason_budgets["busy"] = 1  # type: ignore[index]
    assert "max_attempts=2" in repr(a)
    assert BreakerConfig(failure_threshold=3) == BreakerConfig(failure_threshold=3)
    assert Reason.BURST_RATE.value in a.reason_budgets
