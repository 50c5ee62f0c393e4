"""What a :class:`anygate.Policy` accepts: its argument checks, and its arguments from a config.

Kept apart from ``policy`` (as ``gate_args`` is from the gate) so the class reads as what a
policy does: :func:`check_policy_args` turns the constructor's keyword arguments into a
validated :class:`~anygate.PolicyConfig` plus the pieces a config cannot hold (callable
rules, exception classes, hooks), and :func:`policy_kwargs` is the inverse used by
:meth:`anygate.Policy.from_config`. Each check names the argument, what it must hold and
the value; nothing is built or shared (no gate, breaker or adaptive limit) before they all
pass.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from .._classify.classify import Rule, RuleLike
from .._config.config import AdaptiveConfig, BreakerConfig, RetryConfig
from .._config.policy_config import PolicyConfig
from .._validation import show

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .._events.events import Hook
    from .._gate.rate import Rate
    from .backoff import Uniform

__all__ = ["PolicyArgs", "check_policy_args", "policy_kwargs"]


@dataclass(frozen=True)
class PolicyArgs:
    """A policy's checked arguments: its config and what the config does not carry."""

    config: PolicyConfig
    #: Every rule as given, callables included (``config.rules`` keeps the Rule objects).
    rules: tuple[RuleLike, ...]
    control_types: tuple[type[BaseException], ...]
    control_names: frozenset[str]
    hooks: tuple[Hook, ...]


def check_policy_args(
    *,
    name: str,
    max_concurrent_calls: int | None,
    busy_wait_s: float | None,
    attempt_timeout_s: float | None,
    gate_name: str | None,
    provider: str | None,
    retry: RetryConfig | None,
    circuit_breaker: BreakerConfig | bool | None,
    adaptive_concurrency: AdaptiveConfig | bool | None,
    rules: Sequence[RuleLike],
    control_flow: Sequence[type[BaseException] | str],
    hooks: Sequence[Hook],
    logging_hook: Hook | None,
    rate: Rate | None,
    rng: Uniform | None,
    reraise: bool = False,
    rate_is_ceiling: bool = True,
    concurrency_is_ceiling: bool = True,
) -> PolicyArgs:
    """Check :class:`anygate.Policy`'s arguments, always in the same order.

    The order is part of the behaviour: with several bad arguments, the first one in it is
    the one reported (control_flow, rules, adaptive_concurrency, the config's own
    settings, hooks, logging_hook, rng).

    Raises:
        TypeError, ValueError: an argument of the wrong type or value, named.
        ConfigError: a setting :class:`~anygate.PolicyConfig` refuses.
    """
    control_types: list[type[BaseException]] = []
    control_names: list[str] = []
    items = _sequence("control_flow", control_flow, "exception classes or class names")
    for item in items:
        if isinstance(item, type) and issubclass(item, BaseException):
            control_types.append(item)
        elif isinstance(item, str):
            control_names.append(item)
        else:
            msg = f"control_flow entries must be exception classes or names (got {item!r})"
            raise TypeError(msg)
    given = _sequence("rules", rules, "anygate.Rule objects or callables")
    for rule in given:
        if not isinstance(rule, Rule) and not callable(rule):
            msg = f"rules entries must be anygate.Rule objects or callables (got {rule!r})"
            raise TypeError(msg)
    all_rules = cast("tuple[RuleLike, ...]", given)
    declarative = tuple(r for r in all_rules if isinstance(r, Rule))
    adaptive: object = adaptive_concurrency
    if adaptive is None or isinstance(adaptive, bool):
        adaptive = AdaptiveConfig(enabled=adaptive)
    elif not isinstance(adaptive, AdaptiveConfig):
        msg = (
            "adaptive_concurrency must be an anygate.AdaptiveConfig, True, False or None "
            f"(got {adaptive!r})"
        )
        raise TypeError(msg)
    config = PolicyConfig(
        name=name,
        gate_name=gate_name,
        max_concurrent_calls=max_concurrent_calls,
        busy_wait_s=busy_wait_s,
        attempt_timeout_s=attempt_timeout_s,
        provider=provider,
        retry=RetryConfig() if retry is None else retry,
        circuit_breaker=_breaker_config(circuit_breaker),
        adaptive_concurrency=adaptive,
        rules=declarative,
        control_flow=tuple(control_names) + tuple(t.__name__ for t in control_types),
        rate=rate,
        rate_is_ceiling=rate_is_ceiling,
        concurrency_is_ceiling=concurrency_is_ceiling,
        reraise=reraise,
    )
    hook_list = _sequence("hooks", hooks, "callables taking one event")
    for hook in hook_list:
        if not callable(hook):
            msg = f"hooks must be callables (got {hook!r})"
            raise TypeError(msg)
    given_log: object = logging_hook  # checked at runtime: callers may not type-check
    if given_log is not None and not callable(given_log):
        msg = f"logging_hook must be a callable taking one event, or None (got {logging_hook!r})"
        raise TypeError(msg)
    if rng is not None and not callable(getattr(rng, "uniform", None)):
        msg = f"rng must have a uniform(a, b) method, like random.Random (got {rng!r})"
        raise TypeError(msg)
    return PolicyArgs(
        config=config,
        rules=all_rules,
        control_types=tuple(control_types),
        control_names=frozenset(control_names),
        hooks=cast("tuple[Hook, ...]", hook_list),
    )


def policy_kwargs(config: PolicyConfig) -> dict[str, Any]:
    """The :class:`anygate.Policy` keyword arguments that build a policy from ``config``."""
    return {
        "name": config.name,
        "gate_name": config.gate_name,
        "max_concurrent_calls": config.max_concurrent_calls,
        "busy_wait_s": config.busy_wait_s,
        "attempt_timeout_s": config.attempt_timeout_s,
        "provider": config.provider,
        "retry": config.retry,
        "circuit_breaker": config.circuit_breaker if config.circuit_breaker.enabled else None,
        "adaptive_concurrency": config.adaptive_concurrency,
        "rules": config.rules,
        "rate": config.rate,
        "rate_is_ceiling": config.rate_is_ceiling,
        "concurrency_is_ceiling": config.concurrency_is_ceiling,
        "control_flow": config.control_flow,
        "reraise": config.reraise,
    }


def _breaker_config(value: object) -> BreakerConfig:
    """``circuit_breaker=``: a BreakerConfig, or True/False/None (like adaptive_concurrency)."""
    if value is None or value is False:
        return BreakerConfig(enabled=False)
    if value is True:
        return BreakerConfig()
    if not isinstance(value, BreakerConfig):
        msg = (
            "circuit_breaker must be an anygate.BreakerConfig, True, False or None "
            f"(got {show(value)} of type {type(value).__name__})"
        )
        raise TypeError(msg)
    return value


def _sequence(name: str, value: object, items: str) -> tuple[object, ...]:
    """``value`` as a tuple, refusing a lone string or callable where a list is expected.

    ``hooks=print`` or ``control_flow="KeyError"`` are easy slips: a string iterates as its
    letters and a function is not iterable, and neither error would name the argument.

    Raises:
        TypeError: naming ``name`` and what it must hold.
    """
    if isinstance(value, (str, bytes)) or callable(value) or not isinstance(value, Iterable):
        hint = f"; for one item write {name}=[{show(value)}]"
        msg = f"{name} must be a list (or other sequence) of {items} (got {show(value)}{hint})"
        raise TypeError(msg)
    return tuple(value)
