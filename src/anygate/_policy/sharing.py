"""Finding or creating the process-wide gate, breaker and adaptive limit a policy uses.

Policies with the same gate name share one gate and with the same breaker name one breaker;
every policy on one gate (shared by name or handed in) shares that gate's adaptive limit.
Building a policy never reconfigures them *silently*: a setting the policy states that
differs from the shared object's raises ConfigError unless ``reconfigure=True``. Otherwise a
stale config object built late could undo a fresh one (the race that made deer-flow freeze
its cap at startup). Settings a policy leaves unset inherit what the shared object has.

:func:`anygate.shared_breaker` is the same lookup for code that wants a named breaker
without a policy; it keeps its own rules (``ValueError`` on a conflicting setting, no
``reconfigure``), which are public behaviour.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import weakref
from typing import TYPE_CHECKING

from .._errors import ConfigError
from .._gate.gate import Gate
from .._gate.registry import Registry, gates
from .._limits.adaptive import AdaptiveLimit
from .._limits.learn import RateLearner
from .breaker import CircuitBreaker
from .breaker_state import check_recovery, check_threshold

if TYPE_CHECKING:
    from collections.abc import Callable

    from .._config.policy_config import PolicyConfig
    from .._gate.rate import Rate

__all__ = [
    "breakers",
    "reconcile_capacity",
    "reconcile_rate",
    "resolve_adaptive",
    "resolve_breaker",
    "resolve_gate",
    "shared_breaker",
]

logger = logging.getLogger("anygate")

# Here rather than next to ``gates`` in the gate room's registry: breakers are the
# policy's, and the gate room imports nothing of the policy's.
breakers: Registry[CircuitBreaker] = Registry("breaker")

#: The rate each shared gate was *stated* (by the policy that made it, or the last that
#: reconfigured it): what a later policy's rate is compared with. The gate's own rate
#: moves on its own (headers lower it, a published rate is probed upward), which is no
#: other configuration: compared with the live rate, every policy made after such a
#: step raised ConfigError, as a per-request ``Policy(...)`` in a web handler does.
_stated: weakref.WeakKeyDictionary[Gate, Rate | None] = weakref.WeakKeyDictionary()


def resolve_gate(cfg: PolicyConfig, gate: Gate | None) -> tuple[Gate, bool]:
    """The gate a policy uses: ``gate`` as given, or the shared one for its gate name.

    Returns the gate and whether this policy's settings still need reconciling with it
    (:func:`reconcile_capacity`): true for a shared gate that existed already.
    """
    given: object = gate
    if gate is not None:
        if not isinstance(given, Gate):
            msg = f"gate must be an anygate.Gate (got {gate!r})"
            raise TypeError(msg)
        return gate, False
    gname = cfg.gate_name or cfg.name
    wanted = cfg.max_concurrent_calls
    cap = wanted if wanted else math.inf
    shared, created = gates.get_or_create(gname, lambda: Gate(cap, name=gname, rate=cfg.rate))
    if created:
        _stated[shared] = cfg.rate
    return shared, not created


def _stated_rate(gate: Gate) -> Rate | None:
    """The rate ``gate`` was stated (see ``_stated``); a gate no policy made: its own."""
    return _stated.get(gate, gate.rate)


def reconcile_rate(cfg: PolicyConfig, gate: Gate, reconfigure: bool) -> None:
    """Check (or, with ``reconfigure``, apply) this policy's rate on an existing shared gate."""
    wanted = cfg.rate
    stated = _stated_rate(gate)
    if wanted is None or stated == wanted:
        return
    if not reconfigure:
        msg = (
            f"llm_call rate: the shared gate {gate.name!r} already has rate {stated!r} "
            f"and this policy asks for {wanted!r}. Pass reconfigure=True to change it live, "
            "set gate.rate, or use another gate_name"
        )
        raise ConfigError(msg, path="llm_call.requests_per_minute", value=wanted)
    logger.info("gate %r rate set to %r by policy %r", gate.name, wanted, cfg.name)
    gate.rate = wanted
    _stated[gate] = wanted


def apply_ceiling(cfg: PolicyConfig, gate: Gate, adaptive: AdaptiveLimit) -> None:
    """Tell the gate's :class:`~anygate.RateLearner` whether this policy's rate is a ceiling.

    Only when the policy states a rate and it is the gate's (the shared gate's, once
    reconciled, or a gate handed in with that rate; one handed in with another keeps its
    learner's settings). ``rate_is_ceiling=False``: the rate is the provider's
    published limits, and its headers may raise it as well as lower it (no ceiling).
    The gate's learner is shared: the last policy to state its rate decides. The gate's
    adaptive limit (``adaptive``) probes a published request rate upward
    (:meth:`~anygate.AdaptiveLimit.probes_published_rate`). Likewise a policy that states
    ``max_concurrent_calls`` says whether it is a ceiling (``concurrency_is_ceiling``) or
    a published slot count the latencies may raise
    (:meth:`~anygate.AdaptiveLimit.probes_published_slots`).
    """
    if cfg.max_concurrent_calls:
        adaptive._probe_published_slots(not cfg.concurrency_is_ceiling)
    if cfg.rate is None or _stated_rate(gate) != cfg.rate:
        return
    RateLearner.of(gate).ceiling = cfg.rate if cfg.rate_is_ceiling else None
    # A published request rate is stepped up while it binds and draws no 429
    # (``_limits.published``): without headers, only trying more says more is allowed.
    adaptive._probe_published_rate(not cfg.rate_is_ceiling)


def reconcile_capacity(
    cfg: PolicyConfig, gate: Gate, adaptive: AdaptiveLimit, reconfigure: bool
) -> None:
    """Check (or, with ``reconfigure``, apply) this policy's cap on an existing shared gate.

    Compared with the adaptive limit's *maximum*, not the gate's momentary capacity: a
    limit lowered after a throttle is not a different configuration.
    """
    wanted = cfg.max_concurrent_calls
    if wanted is None:
        return
    cap = wanted if wanted else math.inf
    have = adaptive.max_concurrent_calls
    if have == cap:
        return
    if not reconfigure:
        shown = 0 if math.isinf(have) else int(have)
        msg = (
            f"llm_call.max_concurrent_calls: the shared gate {gate.name!r} already has "
            f"capacity {shown} (0 = no cap) and this policy asks for {wanted}. Pass "
            f"reconfigure=True to resize it live, set policy.max_concurrent_calls, or "
            f"use another gate_name"
        )
        raise ConfigError(msg, path="llm_call.max_concurrent_calls", value=wanted)
    logger.info(
        "gate %r resized to %s by policy %r",
        gate.name,
        wanted or "no cap",
        cfg.name,
        extra={"gate": gate.name, "policy": cfg.name},
    )
    adaptive.resize(cap)


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
            recovery_timeout=bcfg.effective_recovery_timeout_sec,
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


def resolve_adaptive(
    cfg: PolicyConfig,
    gate: Gate,
    clock: Callable[[], float] | None,
    reconfigure: bool,
) -> AdaptiveLimit:
    """The gate's adaptive limit, created with this policy's settings if it has none.

    The limit belongs to the gate, so every policy on the gate follows it, whatever its
    own config says when it did not *state* a setting. A stated setting that differs from
    the existing limit's raises ConfigError unless ``reconfigure=True`` (then it applies
    live, to every policy on the gate): two policies on one gate cannot disagree about
    how the gate answers a throttle. The first creator's clock is kept.
    """
    acfg = cfg.adaptive_concurrency
    wanted = acfg.effective()
    limit, created = adaptive_limit_for(
        gate,
        lambda: AdaptiveLimit(
            gate,
            enabled=wanted["enabled"],
            min_concurrent_calls=wanted["min_concurrent_calls"],
            decrease_factor=wanted["decrease_factor"],
            pause_s=wanted["pause_ms"] / 1000.0,
            pace_burst_rate=wanted["pace_burst_rate"],
            latency=wanted["latency"],
            clock=time.monotonic if clock is None else clock,
        ),
    )
    if created:
        return limit
    enabled, floor, factor, pause_s = limit.settings()
    stated = {
        "enabled": (acfg.enabled, enabled),
        "min_concurrent_calls": (acfg.min_concurrent_calls, floor),
        "decrease_factor": (acfg.decrease_factor, factor),
        "pause_ms": (acfg.pause_ms, pause_s * 1000.0),
        "pace_burst_rate": (acfg.pace_burst_rate, limit.pace_burst_rate),
        "latency": (acfg.latency, limit.latency),
    }
    differ = {k: v for k, v in stated.items() if v[0] is not None and v[0] != v[1]}
    if not differ:
        return limit
    if not reconfigure:
        have = ", ".join(f"{k}={v[1]!r}" for k, v in differ.items())
        want = ", ".join(f"{k}={v[0]!r}" for k, v in differ.items())
        msg = (
            f"llm_call.adaptive_concurrency: the gate {gate.name!r} already has an adaptive "
            f"limit with {have}; this policy asks for {want}. Pass reconfigure=True to apply "
            f"them live to every policy on the gate, or leave those settings out to follow "
            f"the gate's"
        )
        raise ConfigError(msg, path="llm_call.adaptive_concurrency", value=acfg)
    logger.info(
        "adaptive limit of gate %r reconfigured by policy %r",
        gate.name,
        cfg.name,
        extra={"gate": gate.name, "policy": cfg.name},
    )
    limit.configure(
        enabled=acfg.enabled,
        min_concurrent_calls=acfg.min_concurrent_calls,
        decrease_factor=acfg.decrease_factor,
        pause_s=None if acfg.pause_ms is None else acfg.pause_ms / 1000.0,
        pace_burst_rate=acfg.pace_burst_rate,
        latency=acfg.latency,
    )
    return limit


def shared_breaker(
    name: str,
    *,
    failure_threshold: int | None = None,
    recovery_timeout: float | None = None,
    clock: Callable[[], float] | None = None,
) -> CircuitBreaker:
    """The one process-wide :class:`CircuitBreaker` called ``name``, created on first use.

    Settings given here apply only when this call creates the breaker (unset ones take
    the defaults: 5 failures, 60 s, :func:`time.monotonic`). Asking again with *different*
    settings raises ``ValueError`` rather than silently changing a breaker other code
    relies on; change it on purpose with :meth:`CircuitBreaker.configure`.

    Raises:
        TypeError, ValueError: bad arguments, or settings that conflict with the existing
            breaker.
    """
    # Validated before any comparison with an existing breaker (10**400 must not reach
    # float() there).
    if failure_threshold is not None:
        failure_threshold = check_threshold(failure_threshold)
    if recovery_timeout is not None:
        recovery_timeout = check_recovery(recovery_timeout)
    threshold = 5 if failure_threshold is None else failure_threshold
    recovery = 60.0 if recovery_timeout is None else recovery_timeout
    breaker, created = breakers.get_or_create(
        name,
        lambda: CircuitBreaker(
            name,
            failure_threshold=threshold,
            recovery_timeout=recovery,
            clock=time.monotonic if clock is None else clock,
        ),
    )
    if created:
        return breaker
    conflicts = []
    if failure_threshold is not None and breaker.failure_threshold != failure_threshold:
        conflicts.append(f"failure_threshold {breaker.failure_threshold} (got {failure_threshold})")
    if recovery_timeout is not None and breaker.recovery_timeout != float(recovery_timeout):
        conflicts.append(
            f"recovery_timeout {breaker.recovery_timeout:g} (got {recovery_timeout!r})"
        )
    if clock is not None and breaker.clock is not clock:
        conflicts.append(f"clock {breaker.clock!r} (got {clock!r})")
    if conflicts:
        msg = (
            f"shared_breaker({name!r}) already exists with " + "; ".join(conflicts) + ". "
            f"Use another name, or change it on purpose with shared_breaker({name!r}).configure()"
        )
        raise ValueError(msg)
    return breaker


# --------------------------------------------------------------------------- adaptive limits per gate

_by_gate: weakref.WeakKeyDictionary[Gate, AdaptiveLimit] = weakref.WeakKeyDictionary()
_by_gate_lock = threading.Lock()


def adaptive_limit_for(
    gate: Gate, factory: Callable[[], AdaptiveLimit]
) -> tuple[AdaptiveLimit, bool]:
    """The gate's adaptive limit, creating it with ``factory()`` if it has none.

    Returns the limit and whether this call created it. Keyed by the gate object (held
    weakly), so a gate handed to several policies has one limit, and a gate that is gone
    takes its limit with it.
    """
    with _by_gate_lock:
        limit = _by_gate.get(gate)
        if limit is not None:
            return limit, False
        limit = _by_gate[gate] = factory()
        return limit, True
