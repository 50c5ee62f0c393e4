"""The whole policy's settings: :class:`PolicyConfig`, the sections it holds, and their print-out.

:func:`anygate.load_config` builds one from YAML or a mapping (``loader``);
:meth:`anygate.Policy.from_config` builds a policy from it; :meth:`PolicyConfig.to_mapping`
prints the effective values in the YAML shape. Its sections (:class:`RetryConfig`,
:class:`BreakerConfig`, :class:`AdaptiveConfig`) are in :mod:`~anygate._config.config`
and check their own fields; what is checked here is what spans them or belongs to no
section: the provider hint, the adaptive floor against the cap, the rules' and the
rate's types. The two cross-field checks (:func:`check_provider`, :func:`check_floor`)
are shared with the loader, so the Python API and a YAML file refuse the same values with
the same message (issue 28).

Split out of ``config`` as its own concern (the composition, not one section's fields).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .._classify.classify import Rule
from .._classify.facts import KNOWN_PROVIDERS
from .._errors import ConfigError
from .._gate.rate import Rate
from .._validation import PY as _PY
from .._validation import Check, show
from .config import AdaptiveConfig, BreakerConfig, RetryConfig

__all__ = ["PolicyConfig", "check_floor", "check_provider"]


def check_provider(check: Check, path: str, value: object) -> str | None:
    """``provider``: ``None`` or a provider classification tells apart (any case).

    Refused rather than ignored: an unknown hint changes nothing, so a typo such as
    ``openia`` would silently give up the hint the user meant (issue 28).

    Raises:
        TypeError (Python API) or ConfigError: not a string; ConfigError: empty, or not
            one of :data:`KNOWN_PROVIDERS` (the message lists them and suggests the
            closest).
    """
    name = check.name(path, value, none=True)
    if name is None or name.lower() in KNOWN_PROVIDERS:
        return name
    import difflib

    close = difflib.get_close_matches(name.lower(), KNOWN_PROVIDERS, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    msg = (
        f"{path} must be one of {', '.join(KNOWN_PROVIDERS)} or null, the providers whose "
        f"errors classification tells apart; for any other leave it null (got {show(value)})"
        f"{hint}"
    )
    raise ConfigError(msg, path=path, value=value)


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
        busy_wait_s: how long one attempt may wait for a slot before ``Busy``; ``None`` (the
            default) = as long as the call's deadline and enclosing cancel scopes allow.
        attempt_timeout_s: per-attempt timeout (async calls only); ``None`` = none.
        provider: provider hint for classification, one of ``"openai"``,
            ``"anthropic"``, ``"dashscope"``, ``"ark"`` (any case), or ``None`` (the
            default: told from the request's host where it can be).
        retry: the :class:`RetryConfig`.
        circuit_breaker: the :class:`BreakerConfig`.
        adaptive_concurrency: the :class:`AdaptiveConfig`.
        rules: classification rules tried before the built-in ones.
        control_flow: exception class names that are control flow, not failures: they
            propagate unchanged and leave the breaker alone.
        rate: the gate's :class:`anygate.Rate` (YAML ``requests_per_minute``,
            ``tokens_per_minute``, ``input_tokens_per_minute``, ``output_tokens_per_minute``,
            ``ramp``, ``ramp_window_s``); ``None`` = no rate limit
            (a shared gate keeps whatever rate it has).
        rate_is_ceiling: ``True`` (the default): ``rate`` is a ceiling, and what the
            provider's rate-limit headers teach only ever lowers it. ``False``: ``rate``
            states the provider's *published* limits, a starting point its headers replace
            up or down (a tier upgrade is picked up); see ``docs/learning.md``.
        concurrency_is_ceiling: ``True`` (the default): ``max_concurrent_calls`` is a
            ceiling. ``False``: it is the server's *published* slot count (a local
            server's ``--parallel``), a starting point: the gate starts one past it, and
            the answers' latencies (or, once the server answered a 429, the calls seen
            through) may take it higher, up to the last refusal; see ``docs/policy.md``.
        reraise: after giving up on a provider failure, raise the provider's own exception
            (an SDK's typed error) instead of :class:`anygate.CallFailed`; the
            ``CallFailed`` rides along (:meth:`anygate.CallFailed.of`, a note). Errors
            that are not the provider's (a ``KeyError`` in the caller's code) always
            propagate unchanged.
    """

    name: str = "llm"
    gate_name: str | None = None
    max_concurrent_calls: int | None = None
    busy_wait_s: float | None = None
    attempt_timeout_s: float | None = None
    provider: str | None = None
    retry: RetryConfig = field(default_factory=RetryConfig)
    circuit_breaker: BreakerConfig = field(default_factory=BreakerConfig)
    adaptive_concurrency: AdaptiveConfig = field(default_factory=AdaptiveConfig)
    rules: tuple[Rule, ...] = ()
    control_flow: tuple[str, ...] = ()
    rate: Rate | None = None
    rate_is_ceiling: bool = True
    concurrency_is_ceiling: bool = True
    reraise: bool = False

    def __post_init__(self) -> None:
        _PY.name("name", self.name)
        _PY.boolean("reraise", self.reraise)
        _PY.boolean("rate_is_ceiling", self.rate_is_ceiling)
        _PY.boolean("concurrency_is_ceiling", self.concurrency_is_ceiling)
        if self.rate is not None and not isinstance(self.rate, Rate):
            raise _PY.bad_type("rate", self.rate, "an anygate.Rate or None")
        _PY.name("gate_name", self.gate_name, none=True)
        check_provider(_PY, "provider", self.provider)
        _PY.integer("max_concurrent_calls", self.max_concurrent_calls, minimum=0, none=True)
        _PY.number("busy_wait_s", self.busy_wait_s, none=True)
        _PY.number("attempt_timeout_s", self.attempt_timeout_s, strict=True, none=True)
        if not isinstance(self.retry, RetryConfig):
            raise _PY.bad_type("retry", self.retry, "a RetryConfig")
        if not isinstance(self.circuit_breaker, BreakerConfig):
            raise _PY.bad_type("circuit_breaker", self.circuit_breaker, "a BreakerConfig")
        adaptive = self.adaptive_concurrency
        if not isinstance(adaptive, AdaptiveConfig):
            raise _PY.bad_type("adaptive_concurrency", adaptive, "an AdaptiveConfig")
        check_floor(
            "adaptive_concurrency.min_concurrent_calls",
            adaptive.min_concurrent_calls,
            "max_concurrent_calls",
            self.max_concurrent_calls,
        )
        object.__setattr__(self, "rules", tuple(self.rules))
        for i, rule in enumerate(self.rules):
            if not isinstance(rule, Rule):
                raise _PY.bad_type(f"rules[{i}]", rule, "an anygate.Rule")
        object.__setattr__(self, "control_flow", _PY.names("control_flow", self.control_flow))

    def to_mapping(self) -> dict[str, dict[str, Any]]:
        """The effective settings in the YAML shape, every default filled in."""
        r, b, a = self.retry, self.circuit_breaker, self.adaptive_concurrency
        return {
            "llm_call": {
                "name": self.name,
                "gate_name": self.gate_name or self.name,
                "provider": self.provider,
                "max_concurrent_calls": self.max_concurrent_calls,
                "busy_wait_s": self.busy_wait_s,
                "attempt_timeout_s": self.attempt_timeout_s,
                "reraise": self.reraise,
                "retry_max_attempts": r.max_attempts,
                "retry_base_delay_ms": r.base_delay_ms,
                "retry_cap_delay_ms": r.cap_delay_ms,
                "burst_retry_base_delay_ms": r.burst_base_delay_ms,
                "retry_after_max_s": r.retry_after_max_s,
                "reason_budgets": dict(r.reason_budgets),
                "exception_budgets": dict(r.exception_budgets),
                "retry_throttle_attempts": r.throttle_attempts,
                "control_flow_exceptions": list(self.control_flow),
                "rules": [_rule_to_mapping(rule) for rule in self.rules],
                "requests_per_minute": None if self.rate is None else self.rate.requests_per_minute,
                "tokens_per_minute": None if self.rate is None else self.rate.tokens_per_minute,
                "input_tokens_per_minute": (
                    None if self.rate is None else self.rate.input_tokens_per_minute
                ),
                "output_tokens_per_minute": (
                    None if self.rate is None else self.rate.output_tokens_per_minute
                ),
                "ramp": None if self.rate is None else self.rate.ramp,
                "ramp_window_s": None if self.rate is None else self.rate.window_s,
                "rate_is_ceiling": self.rate_is_ceiling,
                "concurrency_is_ceiling": self.concurrency_is_ceiling,
                # None below means "the gate's existing adaptive limit's value" (defaults
                # when this policy creates it).
                "adaptive_concurrency": {
                    "enabled": a.enabled,
                    "min_concurrent_calls": a.min_concurrent_calls,
                    "decrease_factor": a.decrease_factor,
                    "pause_ms": a.pause_ms,
                    "pace_burst_rate": a.pace_burst_rate,
                    "latency": a.latency,
                },
            },
            "circuit_breaker": {
                "enabled": b.enabled,
                "name": b.name or self.name,
                "failure_threshold": b.failure_threshold,
                "recovery_timeout_sec": b.recovery_timeout_sec,
                "when_open": b.when_open,
                "max_wait_sec": b.max_wait_sec,
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


def check_floor(path: str, floor: int | None, cap_path: str, cap: int | None) -> None:
    """The adaptive floor may not exceed a stated cap (``0``, no cap, has no ceiling).

    Raises:
        ConfigError: naming ``path``, the floor and the cap.
    """
    if floor is not None and cap and floor > cap:
        msg = f"{path} must be <= {cap_path} ({cap}) (got {floor})"
        raise ConfigError(msg, path=path, value=floor)
