"""Finding or creating the process-wide gate and breaker a policy uses.

Policies with the same gate name share one gate and with the same breaker name one breaker.
Building a policy never reconfigures them *silently*: a setting the policy states that
differs from the shared object's raises ConfigError unless ``reconfigure=True``. Otherwise a
stale config object built late could undo a fresh one (the race that made deer-flow freeze
its cap at startup). Settings a policy leaves unset inherit what the shared object has.
"""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING

from ._breaker import CircuitBreaker
from ._errors import ConfigError
from ._gate import Gate
from ._registry import breakers, gates

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._config import PolicyConfig

__all__ = ["resolve_breaker", "resolve_gate"]

logger = logging.getLogger("anygate")


def resolve_gate(cfg: PolicyConfig, gate: Gate | None, reconfigure: bool) -> Gate:
    """The gate a policy uses: ``gate`` as given, or the shared one for its gate name."""
    given: object = gate
    if gate is not None:
        if not isinstance(given, Gate):
            msg = f"gate must be an anygate.Gate (got {gate!r})"
            raise TypeError(msg)
        return gate
    gname = cfg.gate_name or cfg.name
    wanted = cfg.max_concurrent_calls
    cap = wanted if wanted else math.inf
    shared, created = gates.get_or_create(gname, lambda: Gate(cap, name=gname))
    if created or wanted is None or shared.capacity == cap:
        return shared
    if not reconfigure:
        have = 0 if math.isinf(shared.capacity) else int(shared.capacity)
        msg = (
            f"llm_call.max_concurrent_calls: the shared gate {gname!r} already has "
            f"capacity {have} (0 = no cap) and this policy asks for {wanted}. Pass "
            f"reconfigure=True to resize it live, set policy.max_concurrent_calls, or "
            f"use another gate_name"
        )
        raise ConfigError(msg, path="llm_call.max_concurrent_calls", value=wanted)
    logger.info("gate %r resized to %s by policy %r", gname, wanted or "no cap", cfg.name)
    shared.capacity = cap
    return shared


def resolve_breaker(
    cfg: PolicyConfig,
    breaker: CircuitBreaker | None,
    clock: Callable[[], float] | None,
    reconfigure: bool,
) -> CircuitBreaker | None:
    """The breaker a policy uses: ``breaker`` as given, none, or the shared one by name."""
    given: object = breaker
    if breaker is not None:
        if not isinstance(given, CircuitBreaker):
            msg = f"breaker must be an anygate.CircuitBreaker (got {breaker!r})"
            raise TypeError(msg)
        return breaker
    bcfg = cfg.circuit_breaker
    if not bcfg.enabled:
        return None
    bname = bcfg.name or cfg.name
    shared, created = breakers.get_or_create(
        bname,
        lambda: CircuitBreaker(
            bname,
            failure_threshold=5 if bcfg.failure_threshold is None else bcfg.failure_threshold,
            recovery_timeout=(
                60.0 if bcfg.recovery_timeout_sec is None else bcfg.recovery_timeout_sec
            ),
            clock=time.monotonic if clock is None else clock,
        ),
    )
    if created:
        return shared
    if clock is not None and shared.clock is not clock:
        msg = f"the shared breaker {bname!r} already uses clock {shared.clock!r}; pass breaker= to use another clock"
        raise ValueError(msg)
    # Only settings this policy states count; None means "whatever it has now".
    same = bcfg.failure_threshold in (None, shared.failure_threshold) and (
        bcfg.recovery_timeout_sec in (None, shared.recovery_timeout)
    )
    if not same:
        if not reconfigure:
            msg = (
                f"circuit_breaker: the shared breaker {bname!r} already has "
                f"failure_threshold={shared.failure_threshold}, recovery_timeout_sec="
                f"{shared.recovery_timeout:g}; this policy asks for "
                f"{bcfg.failure_threshold}, {bcfg.recovery_timeout_sec}. Pass "
                f"reconfigure=True to apply them live, or use another circuit_breaker.name"
            )
            raise ConfigError(msg, path="circuit_breaker", value=bcfg)
        shared.configure(
            failure_threshold=bcfg.failure_threshold,
            recovery_timeout=bcfg.recovery_timeout_sec,
        )
    return shared
