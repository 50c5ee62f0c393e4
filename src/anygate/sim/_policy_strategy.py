"""Policy strategies (``seed``, ``anygate``, users' configs): the library's real Policy.

The strategy's config mapping goes through :meth:`anygate.Policy.from_config`, the same
loader users' YAML goes through, so a config that the simulator accepts is a config the
library accepts, with the same error messages. Only the *environment* is swapped for the
simulation, through the policy's own injection points:

* ``gate``: a fresh :class:`anygate.Gate` per run, sized by ``max_concurrent_calls``
  (instead of the process-wide shared gate, which would leak state between runs);
* ``breaker``: a fresh :class:`anygate.CircuitBreaker` on the virtual clock;
* ``clock``: the virtual clock, for the gate's adaptive limit (fresh with the gate);
* ``rng``: ``random.Random`` seeded from the run's seed (not the strategy's name);
* ``hooks``: one hook that files slot waits under the call the running task is making (a
  context variable), and counts breaker trips and adaptive limit cuts, for the report.

The fleet's per-call deadline goes to the policy's own ``deadline=`` (the simulator also
bounds every strategy's call by it).
"""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio

from .. import (
    BreakerStateChanged,
    Busy,
    CallFailed,
    CircuitBreaker,
    CircuitOpen,
    ConfigError,
    Event,
    Gate,
    LimitChanged,
    Policy,
    SlotAdmitted,
    headers_of,
    learn_from_error,
    learn_from_headers,
    load_config,
    usage_tokens,
)
from ._protocol import CallLost, Request
from ._results import RunStats, current_call
from ._scenarios import builtin_policy, deep_merge

if TYPE_CHECKING:
    from collections.abc import Iterator

    from .. import Attempt, BudgetMark, PolicyConfig, Rate
    from ._protocol import Send, StrategyContext
    from ._spec import Published, StrategySpec

__all__ = [
    "PolicyClient",
    "config_changes",
    "published_facts",
    "quiet_policy_logs",
    "strategy_config",
]


def _flat(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        if isinstance(value, Mapping):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


# Names differ by design (a user's file names its own policy); they change no behaviour.
_NAMES = frozenset({"llm_call.name", "llm_call.gate_name", "circuit_breaker.name"})


def _facts(spec: StrategySpec, published: Published) -> dict[str, Any]:
    facts: dict[str, Any] = {}
    if not spec.from_published:
        return facts
    if published.concurrency is not None:
        facts["max_concurrent_calls"] = published.concurrency
        # Published, not chosen: a starting point the latencies may raise (a server with
        # 4 slots behind a published 1, seeds 1-5: 3.77x the oracle capped at 1, 1.16x).
        facts["concurrency_is_ceiling"] = False
    if spec.paces_published_rpm and published.rpm is not None:
        facts["requests_per_minute"] = published.rpm
    # A token budget only where the published one is the whole budget (OpenAI's TPM):
    # Anthropic's separate input and output budgets are not one per-minute token count,
    # and get budgets of their own (ITPM / OTPM, issue 30: with none, 2,000-token prompts
    # against 30k ITPM drew input-token 429s on 13 % of calls).
    if spec.paces_published_rpm and published.tpm is not None:
        facts["tokens_per_minute"] = published.tpm
    if spec.paces_published_rpm and published.itpm is not None:
        facts["input_tokens_per_minute"] = published.itpm
    if spec.paces_published_rpm and published.otpm is not None:
        facts["output_tokens_per_minute"] = published.otpm
    if any(key.endswith("_per_minute") for key in facts):
        # Published, not chosen: a starting point the provider's headers may raise (a
        # hidden TPM of 400,000 behind a published 200,000, seeds 1-5: 2.10x the oracle
        # paced at the published rate, 1.01x at the reported one).
        facts["rate_is_ceiling"] = False
    return facts


def published_facts(spec: StrategySpec, published: Published) -> dict[str, Any]:
    """The ``llm_call`` keys the scenario's published facts set for ``spec``: the published
    concurrency (``max_concurrent_calls``) and, for ``anygate``, the published RPM
    (``requests_per_minute``) and TPM (``tokens_per_minute``, or the input and output
    budgets), stated as published (``rate_is_ceiling: false``: a starting point the
    provider's headers replace). A user's file keeps the keys it states: the facts fill
    only the ones it leaves out."""
    facts = _facts(spec, published)
    if spec.user_file:
        stated = (spec.policy or {}).get("llm_call") or {}
        facts = {k: v for k, v in facts.items() if k not in stated}
    return facts


def config_changes(spec: StrategySpec, published: Published) -> str:
    """What a user's ``--config`` changes against the built-in ``anygate`` strategy, both
    given the scenario's published facts (``""`` for any other strategy):
    ``"FILE changes KEY VALUE (built-in: VALUE), ..."``, so a run that differs from the
    built-in one says why (issue 28: ``config.example.yaml``, which states every default,
    dropped the published-RPM pacing without a word)."""
    if not spec.user_file:
        return ""
    builtin = load_config(
        deep_merge(builtin_policy("anygate"), {"llm_call": _facts(spec, published)})
    )
    mine = load_config(
        deep_merge(spec.policy or {}, {"llm_call": published_facts(spec, published)})
    )
    theirs, ours = _effective(builtin), _effective(mine)
    changed = [
        f"{key} {_show(ours[key])} (built-in: {_show(theirs.get(key))})"
        for key in ours
        if key not in _NAMES and ours[key] != theirs.get(key)
    ]
    if not changed:
        return f"{spec.source}: the built-in's settings"
    return f"{spec.source} changes {', '.join(changed)}"


def _effective(config: PolicyConfig) -> dict[str, Any]:
    """The settings a run actually uses, flat: unset adaptive and breaker values as the
    defaults they stand for, and no slope window without a slope bound."""
    flat = _flat(config.to_mapping())
    for key, value in config.adaptive_concurrency.effective().items():
        flat[f"llm_call.adaptive_concurrency.{key}"] = value
    breaker = config.circuit_breaker
    if breaker.failure_threshold is None:
        default = inspect.signature(CircuitBreaker).parameters["failure_threshold"].default
        flat["circuit_breaker.failure_threshold"] = default
    flat["circuit_breaker.recovery_timeout_sec"] = breaker.effective_recovery_timeout_sec
    if config.rate is None or config.rate.ramp is None:
        flat.pop("llm_call.ramp_window_s", None)
    # The simulator gives each run a fresh gate of its own: 0 and unset both mean no cap.
    flat["llm_call.max_concurrent_calls"] = config.max_concurrent_calls or 0
    return flat


def _show(value: object) -> str:
    return "null" if value is None else str(value)


def strategy_config(spec: StrategySpec) -> PolicyConfig:
    """Validate a strategy's policy mapping with the policy's own loader.

    Raises:
        ConfigError: with the key path prefixed by where the strategy came from.
    """
    if spec.policy is None:
        msg = f"strategy {spec.name!r} is not a policy strategy"
        raise ValueError(msg)
    try:
        return load_config(spec.policy)
    except ConfigError as exc:
        where = f"strategy {spec.name!r} ({spec.source})"
        raise ConfigError(f"{where}: {exc}", path=exc.path, value=exc.value) from exc


@contextmanager
def quiet_policy_logs() -> Iterator[None]:
    """Silence the ``anygate`` logger while simulating; restore its level after.

    A storm produces thousands of retry warnings and breaker errors that are the *subject*
    of the simulation, not news for its user; without a configured handler Python would
    print every one of them to stderr. The report counts them instead.
    """
    logger = logging.getLogger("anygate")
    level = logger.level
    logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        logger.setLevel(level)


class PolicyClient:
    """Makes each simulated call through an :class:`anygate.Policy` built from the spec.

    A client of the public strategy protocol, like every built-in. When the spec says
    ``from_published`` (the built-in ``seed`` and ``anygate``), the published concurrency,
    if any, becomes ``max_concurrent_calls``; with ``paces_published_rpm`` (the built-in
    ``anygate`` only: deer-flow's ``seed`` has no rate limiter) the published RPM, if any,
    becomes ``requests_per_minute``, which the gate's rate admission paces to on the
    virtual clock.

    Args:
        spec: the strategy; its ``policy`` mapping is complete (built-ins resolved).
        context: the run's context (published facts, seed).

    Raises:
        ConfigError: the policy mapping is invalid.
    """

    def __init__(self, spec: StrategySpec, context: StrategyContext) -> None:
        self._changes = config_changes(spec, context.published)
        facts = published_facts(spec, context.published)
        if facts:
            spec = replace(spec, policy=deep_merge(spec.policy or {}, {"llm_call": facts}))
        config = strategy_config(spec)
        cap = config.max_concurrent_calls
        breaker_cfg = config.circuit_breaker
        breaker = None
        if breaker_cfg.enabled:
            # Unstated settings keep CircuitBreaker's defaults, as a fresh shared one would.
            settings: dict[str, Any] = {}
            if breaker_cfg.failure_threshold is not None:
                settings["failure_threshold"] = breaker_cfg.failure_threshold
            settings["recovery_timeout"] = breaker_cfg.effective_recovery_timeout_sec
            breaker = CircuitBreaker(f"sim-{spec.name}", clock=anyio.current_time, **settings)
        self._gate = Gate(
            cap if cap else math.inf,
            name=f"sim-{spec.name}",
            rate=config.rate,
            clock=anyio.current_time,
        )
        self._policy = Policy.from_config(
            config,
            # The rate goes on the gate itself: a gate handed to a Policy keeps its own.
            gate=self._gate,
            breaker=breaker,
            rng=context.rng("policy"),
            hooks=[self._hook],
            # The adaptive limit's pauses run on the virtual clock (a fresh limit per run:
            # it belongs to the fresh gate above).
            clock=anyio.current_time,
        )
        self._config = config
        self._accepts = spec.accepts
        self._deadline = context.call_deadline_s
        stats = context._stats
        self._stats: RunStats | None = stats if isinstance(stats, RunStats) else None

    @property
    def policy(self) -> Policy:
        """The policy every call goes through (its gate and breaker are this run's own)."""
        return self._policy

    @property
    def summary(self) -> str:
        """One line describing the strategy's settings."""
        c = self._config
        r = c.retry
        cap = c.max_concurrent_calls
        breaker = self._policy.breaker
        wait = "forever" if c.busy_wait_s is None else f"{c.busy_wait_s:g}s"
        budgets = ", ".join(f"{k} {v}" for k, v in r.reason_budgets.items())
        text = (
            f"cap {cap if cap else 'none'} (slot wait {wait}); {r.max_attempts} attempts, "
            f"jitter {r.base_delay_ms / 1000:g}-{r.cap_delay_ms / 1000:g}s, "
            f"burst base {r.burst_base_delay_ms / 1000:g}s"
        )
        if budgets:
            text += f", budgets: {budgets}"
        if breaker is not None:
            text += (
                f"; breaker {breaker.failure_threshold} failures / {breaker.recovery_timeout:g}s"
            )
        else:
            text += "; no breaker"
        adaptive = self._policy.adaptive_limit.statistics()
        if adaptive.enabled and cap:
            text += (
                f"; adaptive on burst rate: pause {adaptive.pause_s:g}s, "
                f"x{adaptive.decrease_factor:g} down to {adaptive.min_concurrent_calls}"
            )
        rpm = None if c.rate is None else c.rate.requests_per_minute
        text += "; no rate limit" if rpm is None else f"; paced to {rpm:g} RPM"
        return text + (f"; {self._changes}" if self._changes else "")

    def _hook(self, event: Event) -> None:
        stats = self._stats
        if stats is None:
            return
        if isinstance(event, BreakerStateChanged):
            if event.new == "open":
                stats.breaker_trips += 1
            return
        if isinstance(event, LimitChanged):
            if event.reason == "burst_rate":
                stats.limit_cuts += 1
                low = stats.lowest_limit
                stats.lowest_limit = event.new if low is None else min(low, event.new)
            return
        record = current_call.get()
        if record is not None and isinstance(event, SlotAdmitted):
            record.slot_wait += event.waited_s

    async def call(self, send: Send) -> None:
        """Make one logical call through the policy; its errors say how it was lost.

        Each attempt is made as :class:`anygate.httpx.GatedTransport` makes it, through
        :meth:`anygate.Policy.run`: when the provider's answer starts (a 2xx status and
        headers, before the generation ends) the attempt is accepted
        (:meth:`anygate.Attempt.accepted`), so a breaker's or a burst pause's probe
        releases the callers waiting for it then. With a token budget on the gate
        (published or learned) the request's estimate (its prompt plus ``max_tokens``,
        what :func:`anygate.estimate_tokens` reads from the body) is charged at
        admission, the answer's headers are learned from, and its ``usage`` settles the
        charge. A strategy that does not accept early (``seed``: deer-flow's breaker hears
        of a call when it ends) makes each call as :meth:`anygate.Policy.call` does.
        """
        cost = _estimate(send)
        try:
            if self._accepts or (cost and self._token_budget() is not None):
                await self._policy.run(partial(self._attempt, send, cost), deadline=self._deadline)
            else:
                await self._policy.call(send, deadline=self._deadline)
        except CallFailed as exc:
            raise CallLost("gave_up") from exc
        except CircuitOpen as exc:
            raise CallLost("circuit_open") from exc
        except Busy as exc:
            raise CallLost("busy") from exc

    def _token_budget(self) -> float | None:
        """The largest total cost the gate's token budgets admit (``None``: no budget)."""
        rate = self._gate.rate
        if rate is None:
            return None
        budgets = [
            b
            for b in (
                rate.tokens_per_minute,
                rate.input_tokens_per_minute,
                rate.output_tokens_per_minute,
            )
            if b is not None
        ]
        return min(budgets) if budgets else None

    async def _attempt(self, send: Send, cost: int, attempt: Attempt) -> None:
        """One attempt the way the gated transports make it (see :meth:`call`)."""
        gate = self._gate
        budget = self._token_budget()
        if not cost or budget is None:
            # No token budget: Policy.call's attempt (release, then learn from the
            # answer: an error's headers and the limits its words state).
            token = await attempt.acquire()
            learned = _Learned()
            try:
                response = await self._send(send, attempt, learned)
            except Exception as exc:
                token.release()
                learn_from_error(gate, exc)
                raise
            token.release()
            if not learned.done:
                learn_from_headers(gate, headers_of(response))
            return
        rate = gate.rate
        out = int(getattr(send, "max_tokens", 0)) if rate is not None and rate.split else None
        if _fits(rate, cost, out):
            token = await attempt.acquire(tokens=cost, output_tokens=out)
        else:  # the budget shrank below the estimate: charged after admission instead
            token = await attempt.acquire()
            token.settle(tokens=cost, output_tokens=out)
        # What the gate had charged when this request went out: its headers' `remaining`
        # are synced against the admissions after it (RateLearner.observe).
        sent = gate.budget_mark()
        learned = _Learned(sent)
        try:
            try:
                response = await self._send(send, attempt, learned)
            except Exception as exc:
                # What a gated transport under a policy does with a refused answer
                # (it reads the body to raise it): its headers and stated limits.
                learn_from_error(gate, exc, sent=sent)
                if out:
                    # An error generated nothing: the output part (max_tokens) settles to
                    # 0, as Anthropic corrects OTPM to the tokens really generated. A
                    # request it turned away (an error status) took nothing from its
                    # input bucket either (a bucket's check failed; nothing was read):
                    # the input part settles to 0 too, and the next report's count lowers
                    # the budget if the provider did charge it. Kept, an outage's probes
                    # left the input budget ~14,000 tokens below the provider's for the
                    # rest of the run (the Anthropic-like reporting cell).
                    turned_away = getattr(exc, "status_code", None) is not None
                    token.settle(tokens=0 if turned_away else cost - out, output_tokens=0)
                # An error keeps the total estimate, as a transport's error response does.
                raise
            if not learned.done:
                learn_from_headers(gate, headers_of(response), sent=sent)
            usage = getattr(response, "usage", None)
            used = usage_tokens({"usage": usage})
            if used is not None:
                generated = _completion_tokens(usage) if out is not None else None
                token.settle(tokens=used, output_tokens=generated)
        finally:
            token.release()

    async def _send(self, send: Send, attempt: Attempt, learned: _Learned) -> Any:
        """Send once: with the answer's start reported (a 2xx accepts the attempt, its
        headers are learned from) when this strategy accepts early, and cut off after
        ``attempt_timeout_s`` as :meth:`anygate.Policy.call` would (``Policy.run`` leaves
        that to the step)."""
        timeout = self._config.attempt_timeout_s
        if timeout is None:
            return await self._send_once(send, attempt, learned)
        with anyio.move_on_after(timeout):
            return await self._send_once(send, attempt, learned)
        msg = f"attempt {attempt.number} timed out after {timeout:g}s"
        raise TimeoutError(msg)

    async def _send_once(self, send: Send, attempt: Attempt, learned: _Learned) -> Any:
        if not self._accepts or not isinstance(send, Request):
            return await send()
        return await send(on_headers=partial(self._on_headers, attempt, learned))

    def _on_headers(
        self, attempt: Attempt, learned: _Learned, status_code: int, headers: Mapping[str, str]
    ) -> None:
        """The answer's status and headers arrived (its body still to come): what a gated
        transport does at that moment. It learns from the headers then (as
        ``GatedTransport`` does when ``handle_async_request`` returns, before the body),
        not when the generation ends seconds later; then it accepts a 2xx."""
        learned.done = True
        learn_from_headers(self._gate, headers, sent=learned.sent)
        if 200 <= status_code < 300:
            attempt.accepted()


class _Learned:
    """One attempt's header learning: the gate's mark when it was sent, and whether its
    headers were learned from when they arrived (then not again at its end)."""

    __slots__ = ("done", "sent")

    def __init__(self, sent: BudgetMark | None = None) -> None:
        self.sent = sent
        self.done = False


def _fits(rate: Rate | None, cost: int, out: int | None) -> bool:
    """Whether ``cost`` (``out`` of it output) fits a minute of every token budget."""
    if rate is None:
        return True
    output = out or 0
    return all(
        limit is None or value <= limit
        for limit, value in (
            (rate.tokens_per_minute, cost),
            (rate.input_tokens_per_minute, cost - output),
            (rate.output_tokens_per_minute, output),
        )
    )


def _completion_tokens(usage: object) -> int | None:
    """The output part of a response's ``usage`` (``completion_tokens`` or Anthropic's
    ``output_tokens``), or ``None`` if it states none."""
    if not isinstance(usage, Mapping):
        return None
    for key in ("completion_tokens", "output_tokens"):
        value = usage.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None


def _estimate(send: Send) -> int:
    """A request's token estimate: prompt plus ``max_tokens`` (0: unknown)."""
    return int(getattr(send, "prompt_tokens", 0)) + int(getattr(send, "max_tokens", 0))
