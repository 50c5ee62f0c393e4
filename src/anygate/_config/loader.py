"""YAML / mapping -> a validated :class:`anygate.PolicyConfig`.

The YAML shape generalises deer-flow's ``llm_call`` and ``circuit_breaker`` sections; every
key is optional. Validation is strict: an unknown key, a wrong type, a negative or
non-finite number raises :class:`anygate.ConfigError` naming the dotted key path, the value
and what is allowed, so a typo never silently falls back to a default. Files are read by
``anygate._yaml``, the one reader every entry point shares (safe loading only, duplicate keys
and empty files refused, ``1e3`` a number as in YAML 1.2).
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping, Sequence
from typing import Any

from .._classify.classify import Reason, Rule
from .._errors import ConfigError
from .._gate.rate import Rate
from .._validation import FILE as _FILE
from .._validation import show
from .._yaml import read_yaml_file
from .config import AdaptiveConfig, BreakerConfig, RetryConfig
from .policy_config import PolicyConfig, check_floor, check_provider

__all__ = ["load_config"]


_LLM_KEYS = (
    "name",
    "gate_name",
    "provider",
    "max_concurrent_calls",
    "busy_wait_s",
    "attempt_timeout_s",
    "retry_max_attempts",
    "retry_base_delay_ms",
    "retry_cap_delay_ms",
    "burst_retry_base_delay_ms",
    "retry_after_max_s",
    "reason_budgets",
    "exception_budgets",
    "retry_throttle_attempts",
    "control_flow_exceptions",
    "rules",
    "adaptive_concurrency",
    "requests_per_minute",
    "tokens_per_minute",
    "input_tokens_per_minute",
    "output_tokens_per_minute",
    "ramp",
    "ramp_window_s",
    "rate_is_ceiling",
    "concurrency_is_ceiling",
    "reraise",
)
_BREAKER_KEYS = (
    "enabled",
    "name",
    "failure_threshold",
    "recovery_timeout_sec",
    "when_open",
    "max_wait_sec",
)
_SECTIONS = ("llm_call", "circuit_breaker")
_RULE_KEYS = ("reason", "retriable", "contains", "status", "code", "exception")
_ADAPTIVE_KEYS = (
    "enabled",
    "min_concurrent_calls",
    "decrease_factor",
    "pause_ms",
    "pace_burst_rate",
    "latency",
)


def _reject_unknown(path: str, mapping: Mapping[Any, Any], known: Sequence[str]) -> None:
    for key in mapping:
        if key in known:
            continue
        where = f"{path}.{key}" if path else str(key)
        hint = ""
        if isinstance(key, str):
            close = difflib.get_close_matches(key, known, n=1)
            if close:
                hint = f"; did you mean {close[0]!r}?"
        allowed = ", ".join(known)
        msg = f"unknown key {where!r} (allowed{' in ' + path if path else ''}: {allowed}){hint}"
        raise ConfigError(msg, path=where, value=mapping[key])


def _str_list(path: str, value: object, item_type: type, what: str) -> list[Any]:
    items = [value] if isinstance(value, item_type) else value
    if isinstance(items, (str, bytes)) or not isinstance(items, Sequence):
        raise _FILE.bad_type(path, value, f"{what} or a list of them")
    for i, item in enumerate(items):
        if isinstance(item, bool) or not isinstance(item, item_type):
            raise _FILE.bad_type(f"{path}[{i}]", item, what)
    return list(items)


def _load_rule(path: str, raw: object) -> Rule:
    entry = _FILE.mapping(path, raw)
    _reject_unknown(path, entry, _RULE_KEYS)
    if "reason" not in entry:
        msg = f"{path}.reason is required (one of {', '.join(r.value for r in Reason)})"
        raise ConfigError(msg, path=f"{path}.reason", value=None)
    reason = _FILE.reason_key(f"{path}.reason", entry["reason"])
    retriable = entry.get("retriable")
    if retriable is not None:
        _FILE.boolean(f"{path}.retriable", retriable)
    kwargs: dict[str, Any] = {}
    if "contains" in entry:
        kwargs["contains"] = _str_list(f"{path}.contains", entry["contains"], str, "a string")
    if "status" in entry:
        kwargs["status"] = _str_list(f"{path}.status", entry["status"], int, "an HTTP status")
    if "code" in entry:
        kwargs["code"] = _str_list(f"{path}.code", entry["code"], str, "a string")
    if "exception" in entry:
        names = _str_list(f"{path}.exception", entry["exception"], str, "a class name")
        kwargs["exception"] = [_FILE.class_name(f"{path}.exception", n) for n in names]
    if not kwargs:
        msg = f"{path} needs at least one of contains, status, code or exception"
        raise ConfigError(msg, path=path, value=raw)
    return Rule(reason=reason, retriable=retriable, **kwargs)


def _load_adaptive(path: str, raw: object, cap: int | None) -> AdaptiveConfig:
    """``adaptive_concurrency``: a mapping, or ``true``/``false`` for ``enabled`` alone."""
    if raw is None:
        return AdaptiveConfig()
    if isinstance(raw, bool):
        return AdaptiveConfig(enabled=raw)
    if not isinstance(raw, Mapping):
        raise _FILE.bad_type(path, raw, "a mapping, true or false")
    _reject_unknown(path, raw, _ADAPTIVE_KEYS)
    kwargs: dict[str, Any] = {}
    if raw.get("enabled") is not None:  # null: unstated, like the other keys here
        kwargs["enabled"] = _FILE.boolean(f"{path}.enabled", raw["enabled"])
    if "min_concurrent_calls" in raw:
        kwargs["min_concurrent_calls"] = _FILE.integer(
            f"{path}.min_concurrent_calls", raw["min_concurrent_calls"], minimum=1, none=True
        )
    if "decrease_factor" in raw:
        kwargs["decrease_factor"] = _FILE.fraction(
            f"{path}.decrease_factor", raw["decrease_factor"], none=True
        )
    if "pause_ms" in raw:
        kwargs["pause_ms"] = _FILE.number(f"{path}.pause_ms", raw["pause_ms"], none=True)
    if raw.get("pace_burst_rate") is not None:
        kwargs["pace_burst_rate"] = _FILE.boolean(f"{path}.pace_burst_rate", raw["pace_burst_rate"])
    if raw.get("latency") is not None:
        kwargs["latency"] = _FILE.boolean(f"{path}.latency", raw["latency"])
    check_floor(
        f"{path}.min_concurrent_calls",
        kwargs.get("min_concurrent_calls"),
        "llm_call.max_concurrent_calls",
        cap,
    )
    return AdaptiveConfig(**kwargs)


def _load_rate(llm: Mapping[Any, Any]) -> Rate | None:
    """``requests_per_minute``, ``tokens_per_minute``, ``input_tokens_per_minute``,
    ``output_tokens_per_minute``, ``ramp``, ``ramp_window_s`` -> Rate."""
    limits: dict[str, float | None] = {}
    for key in (
        "requests_per_minute",
        "tokens_per_minute",
        "input_tokens_per_minute",
        "output_tokens_per_minute",
    ):
        if key in llm:
            limits[key] = _FILE.number(f"llm_call.{key}", llm[key], strict=True, none=True)
    ramp = None
    if "ramp" in llm:
        ramp = _FILE.number("llm_call.ramp", llm["ramp"], minimum=1, strict=True, none=True)
    window = None
    if "ramp_window_s" in llm:
        window = _FILE.number(
            "llm_call.ramp_window_s", llm["ramp_window_s"], strict=True, none=True
        )
    if not any(v is not None for v in limits.values()) and ramp is None:
        if window is not None:
            msg = "llm_call.ramp_window_s needs llm_call.ramp (got ramp_window_s alone)"
            raise ConfigError(msg, path="llm_call.ramp_window_s", value=window)
        return None
    try:
        return Rate(
            requests_per_minute=limits.get("requests_per_minute"),
            tokens_per_minute=limits.get("tokens_per_minute"),
            input_tokens_per_minute=limits.get("input_tokens_per_minute"),
            output_tokens_per_minute=limits.get("output_tokens_per_minute"),
            ramp=ramp,
            window_s=10.0 if window is None else window,
        )
    except ValueError as exc:  # a bound only Rate states (huge rates, windows)
        text = str(exc)
        name = text.split(" ", 1)[0]
        key = "ramp_window_s" if name == "window_s" else name
        path = f"llm_call.{key}"
        raise ConfigError(path + text[len(name) :], path=path, value=llm.get(key)) from None


def _read_source(source: str | os.PathLike[str] | Mapping[str, Any]) -> tuple[object, str]:
    if isinstance(source, Mapping):
        return source, "<mapping>"
    given: object = source
    if not isinstance(given, (str, os.PathLike)):
        msg = f"config source must be a path or a mapping (got {source!r} of type {type(source).__name__})"
        raise TypeError(msg)
    path = os.fspath(source)
    try:
        data = read_yaml_file(path)
    except ImportError as exc:
        raise ConfigError(str(exc), path="", value=path) from exc
    if data is None:
        # Refused, as check-config does: a file that states nothing is more likely the
        # wrong file (or one truncated by a failed write) than a wish for every default.
        msg = (
            f"config file {path!r} is empty (a policy config has llm_call: and/or "
            "circuit_breaker: sections; for every default write 'llm_call: {}')"
        )
        raise ConfigError(msg, path="", value=None)
    return data, path


def load_config(source: str | os.PathLike[str] | Mapping[str, Any]) -> PolicyConfig:
    """Read and validate a policy configuration.

    Args:
        source: a YAML file path (safe loading only; needs the ``yaml`` extra) or a
            mapping of the same shape: top-level ``llm_call`` and ``circuit_breaker``
            sections, every key optional (``{}`` gives the defaults). A file is read as
            ``anygate check-config`` reads it: YAML 1.2 numbers (``1e3`` is 1000.0).

    Raises:
        ConfigError: unreadable, empty or invalid YAML file, a key given twice in one
            mapping, unknown key, wrong type, or a value out of range; the message names
            the key path (``llm_call.busy_wait_s``) or the file and line, the value and
            what is allowed.
        TypeError: ``source`` is neither a path nor a mapping.
    """
    data, origin = _read_source(source)
    if not isinstance(data, Mapping):
        msg = (
            f"config {origin} must be a mapping with sections {', '.join(_SECTIONS)} "
            f"(got {type(data).__name__})"
        )
        raise ConfigError(msg, path="", value=data)
    _reject_unknown("", data, _SECTIONS)
    llm = _FILE.mapping("llm_call", data.get("llm_call") or {})
    raw_breaker = data.get("circuit_breaker")
    # `circuit_breaker: false` turns it off, as `adaptive_concurrency: false` does (it used
    # to be read as an empty section, which left the breaker on).
    if isinstance(raw_breaker, bool):
        raw_breaker = {"enabled": raw_breaker}
    elif raw_breaker is not None and not isinstance(raw_breaker, Mapping):
        raise _FILE.bad_type("circuit_breaker", raw_breaker, "a mapping, true or false")
    brk = _FILE.mapping("circuit_breaker", raw_breaker or {})
    _reject_unknown("llm_call", llm, _LLM_KEYS)
    _reject_unknown("circuit_breaker", brk, _BREAKER_KEYS)

    def p(key: str) -> str:
        return f"llm_call.{key}"

    policy: dict[str, Any] = {}
    retry: dict[str, Any] = {}
    breaker: dict[str, Any] = {}
    if "name" in llm:
        policy["name"] = _FILE.name(p("name"), llm["name"])
    if "gate_name" in llm:
        policy["gate_name"] = _FILE.name(p("gate_name"), llm["gate_name"], none=True)
    if "provider" in llm:
        policy["provider"] = check_provider(_FILE, p("provider"), llm["provider"])
    if "reraise" in llm:
        policy["reraise"] = _FILE.boolean(p("reraise"), llm["reraise"])
    if "rate_is_ceiling" in llm:
        policy["rate_is_ceiling"] = _FILE.boolean(p("rate_is_ceiling"), llm["rate_is_ceiling"])
    if "concurrency_is_ceiling" in llm:
        policy["concurrency_is_ceiling"] = _FILE.boolean(
            p("concurrency_is_ceiling"), llm["concurrency_is_ceiling"]
        )
    if "max_concurrent_calls" in llm:
        policy["max_concurrent_calls"] = _FILE.integer(
            p("max_concurrent_calls"), llm["max_concurrent_calls"], minimum=0, none=True
        )
    if "busy_wait_s" in llm:
        policy["busy_wait_s"] = _FILE.number(p("busy_wait_s"), llm["busy_wait_s"], none=True)
    if "attempt_timeout_s" in llm:
        policy["attempt_timeout_s"] = _FILE.number(
            p("attempt_timeout_s"), llm["attempt_timeout_s"], strict=True, none=True
        )
    if "retry_max_attempts" in llm:
        retry["max_attempts"] = _FILE.integer(
            p("retry_max_attempts"), llm["retry_max_attempts"], minimum=1
        )
    if "retry_throttle_attempts" in llm:
        retry["throttle_attempts"] = _FILE.integer(
            p("retry_throttle_attempts"), llm["retry_throttle_attempts"], minimum=1
        )
    for key, target in (
        ("retry_base_delay_ms", "base_delay_ms"),
        ("retry_cap_delay_ms", "cap_delay_ms"),
        ("burst_retry_base_delay_ms", "burst_base_delay_ms"),
        ("retry_after_max_s", "retry_after_max_s"),
    ):
        if key in llm:
            retry[target] = _FILE.number(p(key), llm[key])
    if "reason_budgets" in llm:
        retry["reason_budgets"] = _FILE.budgets(
            p("reason_budgets"), llm["reason_budgets"], key_check=_FILE.reason_key
        )
    if "exception_budgets" in llm:
        retry["exception_budgets"] = _FILE.budgets(
            p("exception_budgets"), llm["exception_budgets"], key_check=_FILE.class_name
        )
    if "control_flow_exceptions" in llm:
        policy["control_flow"] = _FILE.names(
            p("control_flow_exceptions"), llm["control_flow_exceptions"]
        )
    if "rules" in llm:
        raw_rules = llm["rules"]
        if isinstance(raw_rules, (str, bytes)) or not isinstance(raw_rules, Sequence):
            raise _FILE.bad_type(p("rules"), raw_rules, "a list of rule mappings")
        policy["rules"] = tuple(
            _load_rule(f"{p('rules')}[{i}]", r) for i, r in enumerate(raw_rules)
        )

    rate = _load_rate(llm)
    if rate is not None:
        policy["rate"] = rate

    policy["adaptive_concurrency"] = _load_adaptive(
        p("adaptive_concurrency"),
        llm.get("adaptive_concurrency"),
        policy.get("max_concurrent_calls"),
    )

    if "enabled" in brk:
        breaker["enabled"] = _FILE.boolean("circuit_breaker.enabled", brk["enabled"])
    if "name" in brk:
        breaker["name"] = _FILE.name("circuit_breaker.name", brk["name"], none=True)
    if "failure_threshold" in brk:
        breaker["failure_threshold"] = _FILE.integer(
            "circuit_breaker.failure_threshold", brk["failure_threshold"], minimum=1
        )
    if "recovery_timeout_sec" in brk:
        breaker["recovery_timeout_sec"] = _FILE.number(
            "circuit_breaker.recovery_timeout_sec", brk["recovery_timeout_sec"]
        )
    if "when_open" in brk:
        when_open = brk["when_open"]
        if when_open not in ("wait", "fail"):
            msg = f"circuit_breaker.when_open must be 'wait' or 'fail' (got {show(when_open)})"
            raise ConfigError(msg, path="circuit_breaker.when_open", value=when_open)
        breaker["when_open"] = when_open
    if "max_wait_sec" in brk:
        breaker["max_wait_sec"] = _FILE.number(
            "circuit_breaker.max_wait_sec", brk["max_wait_sec"], strict=True
        )
    return PolicyConfig(
        retry=RetryConfig(**retry), circuit_breaker=BreakerConfig(**breaker), **policy
    )
