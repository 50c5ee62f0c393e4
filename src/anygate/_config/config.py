"""Frozen configuration objects: the sections a policy is built from.

The same objects (:class:`RetryConfig`, :class:`BreakerConfig`, :class:`AdaptiveConfig`)
come out of :func:`anygate.load_config` (YAML or a mapping, see ``loader``) and are what
the Python API takes. Each validates itself on construction: a value of the wrong *type*
raises ``TypeError`` (house rule for Python arguments) and a bad value
:class:`anygate.ConfigError`, each naming the setting, the value and what is allowed.

One section per class, each checking only its own fields; the whole policy that holds
them, and the checks that span sections, are :class:`~anygate._config.policy_config.PolicyConfig`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

from .._errors import ConfigError
from .._validation import PY as _PY
from .._validation import show
from .limit_values import (
    DEFAULT_DECREASE_FACTOR,
    DEFAULT_ENABLED,
    DEFAULT_LATENCY,
    DEFAULT_MIN_CONCURRENT_CALLS,
    DEFAULT_PACE_BURST_RATE,
    DEFAULT_PAUSE_MS,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "AdaptiveConfig",
    "BreakerConfig",
    "RetryConfig",
    "default_recovery_s",
]

#: The recovery interval a policy's breaker gets when none is stated, by ``when_open``.
#: Failing fast, a probe a minute is the classic choice (pybreaker's default); waiting
#: callers pay every second the breaker stays open after the provider is back, and a probe
#: is one request, so it asks every few seconds.
_DEFAULT_RECOVERY_S = {"fail": 60.0, "wait": 5.0}


#: The longest a call waits in all for an open breaker (``when_open: wait``) before it
#: gives up. Why a time: a default must never hang (issue 26: a call with no deadline
#: waited for ever on a provider that stayed down). Why 600 s: an outage holds every call
#: at once, and each one that gives up ends its agent's chain. At 120 s (the longest
#: ``Retry-After`` obeyed, the first choice) an outage of 150 s in the morning peak lost
#: 1,864 of 2,880 calls (seed 1; the oracle none, stamina with a 32 cap 497), 240 s as
#: many; at 600 s none, 1.005x / 1.000x the oracle (seeds 1-2), and a 90 s outage is
#: unchanged. Provider incidents last minutes more often than seconds; ten minutes is
#: still a ceiling, and a call's deadline ends its wait sooner. Counting failed probes
#: against ``max_attempts`` instead was tried and rejected: at about 15 s it failed work
#: in a 50 s outage that the wait exists to save.
DEFAULT_BREAKER_MAX_WAIT_S = 600.0


def default_recovery_s(when_open: str) -> float:
    """The breaker's recovery interval when the config states none."""
    return _DEFAULT_RECOVERY_S[when_open]


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
            YAML ``reason_budgets``. Empty: throttles, burst-rate ones included, use
            ``throttle_attempts``.
        exception_budgets: per-exception-class-name budgets, matched anywhere in the MRO;
            they only tighten. YAML ``exception_budgets``. ``{"StreamChunkTimeoutError": 2}``.
        throttle_attempts: the budget for attempts answered with a *throttle* (a 429, an
            overload answer: the provider is up and asks for less), counted apart from
            ``max_attempts``, which bounds the other failures. A throttled call is not
            failing, it is early; it waits its turn (the gate learns the provider's
            limits from the throttles meanwhile). YAML ``retry_throttle_attempts``. 12.

    Raises:
        TypeError: a value of the wrong type.
        ConfigError: a value out of range.
    """

    max_attempts: int = 3
    base_delay_ms: float = 1000.0
    cap_delay_ms: float = 8000.0
    burst_base_delay_ms: float = 5000.0
    retry_after_max_s: float = 120.0
    reason_budgets: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    exception_budgets: Mapping[str, int] = field(
        default_factory=lambda: MappingProxyType({"StreamChunkTimeoutError": 2})
    )
    throttle_attempts: int = 12

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "max_attempts", _PY.integer("max_attempts", self.max_attempts, minimum=1))
        set_(
            self,
            "throttle_attempts",
            _PY.integer("throttle_attempts", self.throttle_attempts, minimum=1),
        )
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
                self.throttle_attempts,
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
            self.throttle_attempts,
        )

    def __repr__(self) -> str:
        return (
            f"RetryConfig(max_attempts={self.max_attempts}, base_delay_ms={self.base_delay_ms:g}, "
            f"cap_delay_ms={self.cap_delay_ms:g}, burst_base_delay_ms={self.burst_base_delay_ms:g}, "
            f"retry_after_max_s={self.retry_after_max_s:g}, "
            f"reason_budgets={dict(self.reason_budgets)!r}, "
            f"exception_budgets={dict(self.exception_budgets)!r}, "
            f"throttle_attempts={self.throttle_attempts})"
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
            value; when this policy creates it, 5 with ``when_open: wait`` and 60 with
            ``when_open: fail``.
        enabled: ``False`` turns the breaker off. YAML ``circuit_breaker.enabled``.
        name: the process-wide breaker's name; ``None`` uses the policy's name. YAML
            ``circuit_breaker.name``.
        when_open: what a call does while the breaker is open. ``"wait"`` (the default):
            it waits, within its deadline, for the single probe's outcome and goes on when
            the breaker closes, so an overload or a short outage delays work instead of
            failing it; ``"fail"``: it fails fast with :class:`anygate.CircuitOpen` (or
            :class:`anygate.CallFailed` after a first attempt). YAML
            ``circuit_breaker.when_open``.
        max_wait_sec: with ``when_open: "wait"``, the longest a call waits for the breaker
            in all (its waits summed over its attempts), in seconds (> 0); then it gives
            up as in fail mode. Its deadline, if sooner, still ends the wait first. YAML
            ``circuit_breaker.max_wait_sec``. 600 (ten minutes: a provider incident's
            length, not a single call's ``Retry-After``).

    Raises:
        TypeError: a value of the wrong type.
        ConfigError: a value out of range.
    """

    failure_threshold: int | None = None
    recovery_timeout_sec: float | None = None
    enabled: bool = True
    name: str | None = None
    when_open: Literal["wait", "fail"] = "wait"
    max_wait_sec: float = DEFAULT_BREAKER_MAX_WAIT_S

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
        if self.when_open not in ("wait", "fail"):
            msg = f"when_open must be 'wait' or 'fail' (got {show(self.when_open)})"
            raise ConfigError(msg, path="when_open", value=self.when_open)
        set_(
            self,
            "max_wait_sec",
            _PY.number("max_wait_sec", self.max_wait_sec, minimum=0.0, strict=True),
        )

    @property
    def effective_recovery_timeout_sec(self) -> float:
        """The recovery interval a breaker created from this config gets, in seconds:
        ``recovery_timeout_sec``, else 5 with ``when_open: wait`` and 60 with ``fail``."""
        if self.recovery_timeout_sec is not None:
            return self.recovery_timeout_sec
        return default_recovery_s(self.when_open)


@dataclass(frozen=True, kw_only=True)
class AdaptiveConfig:
    """Adaptive concurrency for burst-rate throttling. Immutable; compare and hash by value.

    After a provider answers ``limit_burst_rate``, the gate pauses new provider calls for
    ``pause_ms`` (or the provider's ``Retry-After``), lowers its capacity to
    ``decrease_factor`` times the current limit (never below ``min_concurrent_calls``), and
    grows it back by about one slot per limit's worth of successful calls, up to
    ``max_concurrent_calls`` (see :class:`anygate.AdaptiveLimit`). Inactive without a cap.

    The limit belongs to the *gate*: every policy on one gate follows it. ``None`` (the
    default for each field) keeps the value of the gate's existing adaptive limit, or the
    default shown when this policy creates it.

    Args:
        enabled: ``False`` turns it off. YAML ``llm_call.adaptive_concurrency.enabled``
            (or ``adaptive_concurrency: false``). Default on.
        min_concurrent_calls: the floor, >= 1. YAML ``...min_concurrent_calls``. Default 1.
        decrease_factor: the multiplier on a throttle, > 0 and < 1. YAML
            ``...decrease_factor``. Default 0.8.
        pause_ms: how long admitted attempts wait after a throttle without
            ``Retry-After``, >= 0. YAML ``...pause_ms``. Default 5000.
        pace_burst_rate: answer a burst-rate throttle by learning the provider's slope
            rule (growth, floor and window, from this gate's own counts at each full
            window's end) and holding sends to it, instead of cutting the concurrency
            limit; a per-minute 429 that does not say what it counted paces the gate's
            request rate (no pause, no cut), never above a rate the gate had. YAML
            ``...pace_burst_rate``. Default on; ``False`` restores the cut.
        latency: set the limit from latency alone, for a server that queues rather than
            refuses (a local model server): the concurrency at which its answers stop
            coming faster (:mod:`anygate._limits.latency`, Vegas-style). Works without a
            cap; never above ``max_concurrent_calls`` nor below ``min_concurrent_calls``;
            throttles keep their answers. YAML ``...latency``. Default off: where no
            slots are published, a slow answer is more often a long generation than a
            queue (docs/policy.md).

    Raises:
        TypeError: a value of the wrong type.
        ConfigError: a value out of range.
    """

    enabled: bool | None = None
    min_concurrent_calls: int | None = None
    decrease_factor: float | None = None
    pause_ms: float | None = None
    pace_burst_rate: bool | None = None
    latency: bool | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if self.enabled is not None:
            _PY.boolean("enabled", self.enabled)
        if self.pace_burst_rate is not None:
            _PY.boolean("pace_burst_rate", self.pace_burst_rate)
        if self.latency is not None:
            _PY.boolean("latency", self.latency)
        set_(
            self,
            "min_concurrent_calls",
            _PY.integer("min_concurrent_calls", self.min_concurrent_calls, minimum=1, none=True),
        )
        set_(
            self,
            "decrease_factor",
            _PY.fraction("decrease_factor", self.decrease_factor, none=True),
        )
        set_(self, "pause_ms", _PY.number("pause_ms", self.pause_ms, none=True))

    def effective(self) -> dict[str, Any]:
        """Every setting, with the defaults filled in where this config leaves one unset."""
        return {
            "enabled": DEFAULT_ENABLED if self.enabled is None else self.enabled,
            "min_concurrent_calls": (
                DEFAULT_MIN_CONCURRENT_CALLS
                if self.min_concurrent_calls is None
                else self.min_concurrent_calls
            ),
            "decrease_factor": (
                DEFAULT_DECREASE_FACTOR if self.decrease_factor is None else self.decrease_factor
            ),
            "pause_ms": DEFAULT_PAUSE_MS if self.pause_ms is None else self.pause_ms,
            "pace_burst_rate": (
                DEFAULT_PACE_BURST_RATE if self.pace_burst_rate is None else self.pace_burst_rate
            ),
            "latency": DEFAULT_LATENCY if self.latency is None else self.latency,
        }
