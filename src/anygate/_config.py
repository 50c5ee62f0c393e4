"""YAML / mapping -> validated, frozen configuration objects.

The YAML shape generalises deer-flow's ``llm_call`` and ``circuit_breaker`` sections; every
key is optional. Validation is strict: an unknown key, a wrong type, a negative or
non-finite number raises :class:`anygate.ConfigError` naming the dotted key path, the value
and what is allowed, so a typo never silently falls back to a default.

The same frozen objects (:class:`RetryConfig`, :class:`BreakerConfig`,
:class:`PolicyConfig`) are what the Python API takes; there, a value of the wrong *type*
raises ``TypeError`` (house rule for Python arguments) and a bad value ``ConfigError``.
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ._classify import Reason, Rule
from ._errors import ConfigError

__all__ = ["BreakerConfig", "PolicyConfig", "RetryConfig", "load_config"]


# --------------------------------------------------------------------------- checks


class _Check:
    """Validation helpers; ``typed`` picks TypeError (Python API) or ConfigError (files)."""

    def __init__(self, *, typed: bool) -> None:
        self.typed = typed

    def bad_type(self, path: str, value: object, allowed: str) -> Exception:
        msg = f"{path} must be {allowed} (got {value!r} of type {type(value).__name__})"
        if self.typed:
            return TypeError(msg)
        return ConfigError(msg, path=path, value=value)

    @staticmethod
    def bad_value(path: str, value: object, allowed: str) -> ConfigError:
        return ConfigError(f"{path} must be {allowed} (got {value!r})", path=path, value=value)

    def integer(self, path: str, value: object, *, minimum: int, none: bool = False) -> int | None:
        if value is None and none:
            return None
        allowed = f"an integer >= {minimum}" + (" or null" if none else "")
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.bad_type(path, value, allowed)
        if value < minimum:
            raise self.bad_value(path, value, allowed)
        return value

    def number(
        self,
        path: str,
        value: object,
        *,
        minimum: float = 0.0,
        strict: bool = False,
        none: bool = False,
    ) -> float | None:
        if value is None and none:
            return None
        bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
        allowed = f"a finite number {bound}" + (" or null" if none else "")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.bad_type(path, value, allowed)
        if math.isnan(value) or math.isinf(value):
            raise self.bad_value(path, value, allowed)
        if value < minimum or (strict and value == minimum):
            raise self.bad_value(path, value, allowed)
        return float(value)

    def name(self, path: str, value: object, *, none: bool = False) -> str | None:
        if value is None and none:
            return None
        allowed = "a non-empty string" + (" or null" if none else "")
        if not isinstance(value, str):
            raise self.bad_type(path, value, allowed)
        if not value.strip():
            raise self.bad_value(path, value, allowed)
        return value

    def boolean(self, path: str, value: object) -> bool:
        if not isinstance(value, bool):
            raise self.bad_type(path, value, "true or false")
        return value

    def mapping(self, path: str, value: object) -> Mapping[Any, Any]:
        if not isinstance(value, Mapping):
            raise self.bad_type(path, value, "a mapping")
        return value

    def budgets(
        self, path: str, value: object, *, key_check: Callable[[str, object], str]
    ) -> Mapping[str, int]:
        items = self.mapping(path, value)
        out: dict[str, int] = {}
        for key, budget in items.items():
            name = key_check(f"{path}.{key}", key)
            parsed = self.integer(f"{path}.{name}", budget, minimum=1)
            assert parsed is not None
            out[name] = parsed
        return MappingProxyType(out)

    def reason_key(self, path: str, key: object) -> str:
        allowed = ", ".join(r.value for r in Reason)
        if not isinstance(key, str):
            raise self.bad_type(path, key, f"a reason ({allowed})")
        try:
            return Reason(key).value
        except ValueError:
            raise self.bad_value(path, key, f"a reason: one of {allowed}") from None

    def class_name(self, path: str, key: object) -> str:
        if not isinstance(key, str):
            raise self.bad_type(path, key, "an exception class name")
        if not key.isidentifier():
            raise self.bad_value(path, key, "an exception class name such as 'ReadTimeout'")
        return key

    def names(self, path: str, value: object) -> tuple[str, ...]:
        if isinstance(value, str) or not isinstance(value, Sequence):
            raise self.bad_type(path, value, "a list of exception class names")
        return tuple(self.class_name(f"{path}[{i}]", v) for i, v in enumerate(value))


_PY = _Check(typed=True)


def _frozen_budgets(value: Mapping[str, int]) -> Mapping[str, int]:
    return MappingProxyType(dict(value))


# --------------------------------------------------------------------------- objects


@dataclass(frozen=True, kw_only=True)
class RetryConfig:
    """How failed attempts are retried. Immutable; compare and hash by value.

    Args:
        max_attempts: attempts in total, the first included (``1`` = never retry). YAML
            ``llm_call.retry_max_attempts``. Default 3.
        base_delay_ms: the smallest jittered delay. YAML ``retry_base_delay_ms``. 1000.
        cap_delay_ms: the largest jittered delay; a base above it counts as the cap. YAML
            ``retry_cap_delay_ms``. 8000.
        burst_base_delay_ms: the base for ``burst_rate`` failures (a slope throttle needs
            a longer pause). YAML ``burst_retry_base_delay_ms``. 5000.
        retry_after_max_s: the longest ``Retry-After`` obeyed; a longer one gives up at
            once instead of retrying early or oversleeping. YAML ``retry_after_max_s``. 120.
        reason_budgets: per-reason attempt budgets; they only tighten ``max_attempts``.
            YAML ``reason_budgets``. ``{"burst_rate": 2}``.
        exception_budgets: per-exception-class-name budgets, matched anywhere in the MRO;
            they only tighten. YAML ``exception_budgets``. ``{"StreamChunkTimeoutError": 2}``.

    Raises:
        TypeError: a value of the wrong type.
        ConfigError: a value out of range.
    """

    max_attempts: int = 3
    base_delay_ms: float = 1000.0
    cap_delay_ms: float = 8000.0
    burst_base_delay_ms: float = 5000.0
    retry_after_max_s: float = 120.0
    reason_budgets: Mapping[str, int] = field(
        default_factory=lambda: MappingProxyType({"burst_rate": 2})
    )
    exception_budgets: Mapping[str, int] = field(
        default_factory=lambda: MappingProxyType({"StreamChunkTimeoutError": 2})
    )

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "max_attempts", _PY.integer("max_attempts", self.max_attempts, minimum=1))
        for name in ("base_delay_ms", "cap_delay_ms", "burst_base_delay_ms", "retry_after_max_s"):
            set_(self, name, _PY.number(name, getattr(self, name)))
        set_(
            self,
            "reason_budgets",
            _PY.budgets("reason_budgets", self.reason_budgets, key_check=_PY.reason_key),
        )
        set_(
            self,
            "exception_budgets",
            _PY.budgets("exception_budgets", self.exception_budgets, key_check=_PY.class_name),
        )

    def __hash__(self) -> int:
        return hash(
            (
                self.max_attempts,
                self.base_delay_ms,
                self.cap_delay_ms,
                self.burst_base_delay_ms,
                self.retry_after_max_s,
                tuple(sorted(self.reason_budgets.items())),
                tuple(sorted(self.exception_budgets.items())),
            )
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RetryConfig):
            return NotImplemented
        return self._key() == other._key()

    def _key(self) -> tuple[object, ...]:
        return (
            self.max_attempts,
            self.base_delay_ms,
            self.cap_delay_ms,
            self.burst_base_delay_ms,
            self.retry_after_max_s,
            dict(self.reason_budgets),
            dict(self.exception_budgets),
        )

    def __repr__(self) -> str:
        return (
            f"RetryConfig(max_attempts={self.max_attempts}, base_delay_ms={self.base_delay_ms:g}, "
            f"cap_delay_ms={self.cap_delay_ms:g}, burst_base_delay_ms={self.burst_base_delay_ms:g}, "
            f"retry_after_max_s={self.retry_after_max_s:g}, "
            f"reason_budgets={dict(self.reason_budgets)!r}, "
            f"exception_budgets={dict(self.exception_budgets)!r})"
        )


@dataclass(frozen=True, kw_only=True)
class BreakerConfig:
    """Circuit breaker settings. Immutable; compare and hash by value.

    Args:
        failure_threshold: consecutive counted failures that open the breaker (>= 1).
            YAML ``circuit_breaker.failure_threshold``. ``None`` (the default, or the key
            absent): keep the shared breaker's value, 5 when this policy creates it.
        recovery_timeout_sec: seconds it stays open before one probe (>= 0). YAML
            ``circuit_breaker.recovery_timeout_sec``. ``None``: keep the shared breaker's
            value, 60 when this policy creates it.
        enabled: ``False`` turns the breaker off. YAML ``circuit_breaker.enabled``.
        name: the process-wide breaker's name; ``None`` uses the policy's name. YAML
            ``circuit_breaker.name``.

    Raises:
        TypeError: a value of the wrong type.
        ConfigError: a value out of range.
    """

    failure_threshold: int | None = None
    recovery_timeout_sec: float | None = None
    enabled: bool = True
    name: str | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(
            self,
            "failure_threshold",
            _PY.integer("failure_threshold", self.failure_threshold, minimum=1, none=True),
        )
        set_(
            self,
            "recovery_timeout_sec",
            _PY.number("recovery_timeout_sec", self.recovery_timeout_sec, none=True),
        )
        _PY.boolean("enabled", self.enabled)
        _PY.name("name", self.name, none=True)


@dataclass(frozen=True, kw_only=True)
class PolicyConfig:
    """A whole policy's settings, as loaded from YAML or a mapping by :func:`load_config`.

    Use :meth:`anygate.Policy.from_config` to build a policy from it, and
    :meth:`to_mapping` to print the effective values (every default filled in).

    Attributes:
        name: the policy's name (events, logs; the default gate and breaker name).
        gate_name: the process-wide gate's name; ``None`` uses ``name``.
        max_concurrent_calls: the gate's capacity; ``0`` = no cap; ``None`` (key absent)
            = use the shared gate as it is.
        busy_wait_s: how long one attempt may wait for a slot before ``Busy``; ``None`` =
            as long as it takes.
        attempt_timeout_s: per-attempt timeout (async calls only); ``None`` = none.
        provider: provider hint for classification (``"dashscope"``...), or ``None``.
        retry: the :class:`RetryConfig`.
        circuit_breaker: the :class:`BreakerConfig`.
        rules: classification rules tried before the built-in ones.
        control_flow: exception class names that are control flow, not failures: they
            propagate unchanged and leave the breaker alone.
    """

    name: str = "llm"
    gate_name: str | None = None
    max_concurrent_calls: int | None = None
    busy_wait_s: float | None = 60.0
    attempt_timeout_s: float | None = None
    provider: str | None = None
    retry: RetryConfig = field(default_factory=RetryConfig)
    circuit_breaker: BreakerConfig = field(default_factory=BreakerConfig)
    rules: tuple[Rule, ...] = ()
    control_flow: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _PY.name("name", self.name)
        _PY.name("gate_name", self.gate_name, none=True)
        _PY.name("provider", self.provider, none=True)
        _PY.integer("max_concurrent_calls", self.max_concurrent_calls, minimum=0, none=True)
        _PY.number("busy_wait_s", self.busy_wait_s, none=True)
        _PY.number("attempt_timeout_s", self.attempt_timeout_s, strict=True, none=True)
        if not isinstance(self.retry, RetryConfig):
            raise _PY.bad_type("retry", self.retry, "a RetryConfig")
        if not isinstance(self.circuit_breaker, BreakerConfig):
            raise _PY.bad_type("circuit_breaker", self.circuit_breaker, "a BreakerConfig")
        object.__setattr__(self, "rules", tuple(self.rules))
        for i, rule in enumerate(self.rules):
            if not isinstance(rule, Rule):
                raise _PY.bad_type(f"rules[{i}]", rule, "an anygate.Rule")
        object.__setattr__(self, "control_flow", _PY.names("control_flow", self.control_flow))

    def to_mapping(self) -> dict[str, dict[str, Any]]:
        """The effective settings in the YAML shape, every default filled in."""
        r, b = self.retry, self.circuit_breaker
        return {
            "llm_call": {
                "name": self.name,
                "gate_name": self.gate_name or self.name,
                "provider": self.provider,
                "max_concurrent_calls": self.max_concurrent_calls,
                "busy_wait_s": self.busy_wait_s,
                "attempt_timeout_s": self.attempt_timeout_s,
                "retry_max_attempts": r.max_attempts,
                "retry_base_delay_ms": r.base_delay_ms,
                "retry_cap_delay_ms": r.cap_delay_ms,
                "burst_retry_base_delay_ms": r.burst_base_delay_ms,
                "retry_after_max_s": r.retry_after_max_s,
                "reason_budgets": dict(r.reason_budgets),
                "exception_budgets": dict(r.exception_budgets),
                "control_flow_exceptions": list(self.control_flow),
                "rules": [_rule_to_mapping(rule) for rule in self.rules],
            },
            "circuit_breaker": {
                "enabled": b.enabled,
                "name": b.name or self.name,
                "failure_threshold": b.failure_threshold,
                "recovery_timeout_sec": b.recovery_timeout_sec,
                # None above means "the shared breaker's value" (5 and 60 when created).
            },
        }


def _rule_to_mapping(rule: Rule) -> dict[str, Any]:
    out: dict[str, Any] = {"reason": rule.reason.value}
    if rule.retriable is not None:
        out["retriable"] = rule.retriable
    for key in ("contains", "status", "code"):
        value = getattr(rule, key)
        if value:
            out[key] = list(value)
    if rule.exception:
        out["exception"] = [e if isinstance(e, str) else e.__name__ for e in rule.exception]
    return out


# --------------------------------------------------------------------------- loading

_FILE = _Check(typed=False)

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
    "control_flow_exceptions",
    "rules",
)
_BREAKER_KEYS = ("enabled", "name", "failure_threshold", "recovery_timeout_sec")
_SECTIONS = ("llm_call", "circuit_breaker")
_RULE_KEYS = ("reason", "retriable", "contains", "status", "code", "exception")


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


def _read_source(source: str | os.PathLike[str] | Mapping[str, Any]) -> tuple[object, str]:
    if isinstance(source, Mapping):
        return source, "<mapping>"
    given: object = source
    if not isinstance(given, (str, os.PathLike)):
        msg = f"config source must be a path or a mapping (got {source!r} of type {type(source).__name__})"
        raise TypeError(msg)
    path = os.fspath(source)
    try:
        import yaml
    except ImportError as exc:  # pragma: no cover - depends on the environment
        msg = "reading YAML needs PyYAML: pip install 'anygate[yaml]'"
        raise ConfigError(msg, path="", value=path) from exc
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        msg = f"cannot read config file {path!r}: {exc.strerror or exc}"
        raise ConfigError(msg, path="", value=path) from exc
    try:
        # safe_load only: a config file must never construct arbitrary Python objects.
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        msg = f"config file {path!r} is not valid YAML: {exc}"
        raise ConfigError(msg, path="", value=path) from exc
    return ({} if data is None else data), path


def load_config(source: str | os.PathLike[str] | Mapping[str, Any]) -> PolicyConfig:
    """Read and validate a policy configuration.

    Args:
        source: a YAML file path (read with ``yaml.safe_load``; needs the ``yaml`` extra)
            or a mapping of the same shape: top-level ``llm_call`` and ``circuit_breaker``
            sections, every key optional. An empty file gives the defaults.

    Raises:
        ConfigError: unreadable file, invalid YAML, unknown key, wrong type, or a value out
            of range; the message names the key path (``llm_call.busy_wait_s``), the value
            and what is allowed.
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
    brk = _FILE.mapping("circuit_breaker", data.get("circuit_breaker") or {})
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
        policy["provider"] = _FILE.name(p("provider"), llm["provider"], none=True)
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
    return PolicyConfig(
        retry=RetryConfig(**retry), circuit_breaker=BreakerConfig(**breaker), **policy
    )
