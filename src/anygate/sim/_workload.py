"""The fleet's work, drawn once per seed, and the provider-capacity lower bound on its makespan.

Every logical call gets its service time (how long the provider needs once it admits the
call) and the think time before it when the workload is drawn, not when the call runs. All
strategies therefore serve exactly the same work (common random numbers), differences in
the results come from the strategies alone, and the lower bound is a property of the
workload and the provider, the same for every strategy.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._provider import sample

if TYPE_CHECKING:
    from ._spec import FleetSpec, Outage, ProviderSpec, TokenLimits

__all__ = ["AgentPlan", "CallPlan", "FanOutPlan", "LowerBound", "Workload", "build_workload"]


@dataclass(frozen=True, slots=True)
class CallPlan:
    """One logical call: ``think_s`` of tool time, then a call needing ``service_s``.

    With ``fleet.tokens`` it also sends ``prompt_tokens`` with ``max_tokens`` and its
    answer is ``completion_tokens`` long (all 0 without).
    """

    index: int
    service_s: float
    think_s: float = 0.0
    prompt_tokens: int = 0
    max_tokens: int = 0
    completion_tokens: int = 0


@dataclass(frozen=True, slots=True)
class FanOutPlan:
    """Subagents started together; the parent continues when every chain has finished."""

    chains: tuple[tuple[CallPlan, ...], ...]


@dataclass(frozen=True, slots=True)
class AgentPlan:
    """A lead agent: starts at ``start_s`` and runs its steps in order."""

    start_s: float
    steps: tuple[CallPlan | FanOutPlan, ...]


@dataclass(frozen=True)
class LowerBound:
    """A lower bound on any strategy's makespan, from the provider's capacity.

    Each part alone is a valid bound; ``seconds`` is the largest, named by ``binding``.

    Attributes:
        seconds: the bound: the largest of the parts.
        binding: which part it is: ``"slots"``, ``"chain"``, ``"rpm"`` or ``"burst"``.
        slots_s: first start + total service time / slots (the slots are busy the whole
            time at best), plus what outages take out of it (see ``outage_s``).
        chain_s: the longest chain: an agent's start plus its calls' service and think
            times, subagent chains counting as their longest one, and no call admitted
            during an outage (a call that would start inside one waits for its end).
        rpm_s: first start + 60 s * (ceil(calls / rpm) - 1) + shortest service time: with at
            most ``rpm`` admissions per sliding minute, admission number ``k * rpm + 1``
            comes at least ``k`` minutes after the first.
        burst_s: with every burst window admitting the most the slope rule allows (a floor,
            then ``growth`` times the previous window; the highest growth a dynamic
            threshold can reach), the window holding the last admission starts no earlier
            than this, plus the shortest service time. ``None`` with ``count_rejected``
            (rejected arrivals then raise the next window's allowance, so admissions per
            window have no such bound).
        outage_s: the part of ``slots_s`` due to outages: no request is admitted during an
            outage, and only the calls admitted before it continue (at most the ``slots``
            longest calls of the workload, each for at most the outage's length), so the
            work left over waits for the outage's end.
        tokens_s: with token buckets: a bucket full at the first start admits at most
            ``capacity + rate * (t - first)`` by time ``t``, so the last admission comes no
            earlier than ``first + (total cost - capacity) / rate`` (the output bucket
            counts the real completions, which bound what it keeps after settling), plus
            the shortest service time; the largest over the buckets.
    """

    seconds: float
    binding: str
    slots_s: float
    chain_s: float
    rpm_s: float | None
    burst_s: float | None
    outage_s: float = 0.0
    tokens_s: float | None = None


@dataclass(frozen=True)
class Workload:
    """Everything the fleet will ask of the provider."""

    agents: tuple[AgentPlan, ...]
    calls: tuple[CallPlan, ...]

    @property
    def first_start(self) -> float:
        """When the first agent starts."""
        return min(agent.start_s for agent in self.agents)

    def lower_bound(self, provider: ProviderSpec) -> LowerBound:
        """The provider-capacity lower bound for this workload; see :class:`LowerBound`."""
        first = self.first_start
        total = len(self.calls)
        shortest = min(call.service_s for call in self.calls)
        work = math.fsum(call.service_s for call in self.calls)
        slots = first + work / provider.slots
        outage = _outage_delay(
            first, work, provider.slots, provider.outages, [c.service_s for c in self.calls]
        )
        parts: dict[str, float] = {
            "slots": slots + outage,
            "chain": max(_agent_span(agent, provider.outages) for agent in self.agents),
        }
        if provider.rpm is not None:
            parts["rpm"] = first + 60.0 * (math.ceil(total / provider.rpm) - 1) + shortest
        burst = provider.burst
        if burst is not None and not burst.count_rejected:
            window = math.floor(first / burst.window_s)
            allowed = burst.floor
            admitted = allowed
            while admitted < total:
                allowed = max(burst.floor, math.floor(burst.highest_growth * allowed))
                admitted += allowed
                window += 1
            parts["burst"] = max(first, window * burst.window_s) + shortest
        limits = provider.tokens
        if limits is not None and limits.rule == "azure":
            parts["tokens"] = first + _window_wait_of(self.calls, limits) + shortest
        elif limits is not None:
            costs = (
                (limits.rpm, float(total)),
                (limits.tpm, math.fsum(c.prompt_tokens + c.max_tokens for c in self.calls)),
                (limits.itpm, math.fsum(c.prompt_tokens for c in self.calls)),
                (limits.otpm, math.fsum(c.completion_tokens for c in self.calls)),
            )
            waits = [
                max(0.0, cost - limit * limits.capacity_s / 60.0)
                / (limit * (1.0 - limits.background) / 60.0)
                for limit, cost in costs
                if limit is not None
            ]
            parts["tokens"] = first + max(waits) + shortest
        binding = max(parts, key=lambda name: parts[name])
        return LowerBound(
            seconds=parts[binding],
            binding=binding,
            slots_s=parts["slots"],
            chain_s=parts["chain"],
            rpm_s=parts.get("rpm"),
            burst_s=parts.get("burst"),
            outage_s=outage,
            tokens_s=parts.get("tokens"),
        )


def _window_wait_of(calls: tuple[CallPlan, ...], limits: TokenLimits) -> float:
    """Azure's windows admit at most ``capacity`` per ``window_s``: a bucket of that
    capacity refilled at ``capacity / window_s`` admits at least as much, so its wait for
    the whole fleet's cost bounds the windows' from below."""
    from ._buckets import AzureWindows, Buckets

    waits = []
    for window in AzureWindows(limits).all:
        cost = math.fsum(Buckets.cost(window, c.prompt_tokens, c.max_tokens) for c in calls)
        waits.append(max(0.0, cost - window.capacity) / window.rate)
    return max(waits)


def _outage_delay(
    first: float, work: float, slots: int, outages: tuple[Outage, ...], services: list[float]
) -> float:
    """How much later than ``first + work / slots`` the work can end, given the outages.

    Before an outage the slots do at most ``slots`` seconds of work per second; during it
    only the calls already admitted continue, at most the ``slots`` longest calls, each for
    no longer than the outage; after it the remaining work needs ``remaining / slots``.
    """
    if not outages:
        return 0.0
    longest = sorted(services, reverse=True)[:slots]
    remaining, t = work, first
    for down in outages:  # sorted by start
        if down.end_s <= t:
            continue
        start = max(down.start_s, t)
        before = slots * (start - t)
        if remaining <= before:
            break
        remaining -= before
        if start > first:  # nothing can be in flight before the first agent starts
            remaining -= min(remaining, math.fsum(min(s, down.end_s - start) for s in longest))
        t = down.end_s
        if remaining <= 0:
            break
    end = t + max(remaining, 0.0) / slots
    return max(0.0, end - (first + work / slots))


def _chain_end(
    chain: tuple[CallPlan | FanOutPlan, ...], start: float, outages: tuple[Outage, ...]
) -> float:
    """When a chain started at ``start`` ends at best: its calls in order, each admitted no
    earlier than its think time allows and never inside an outage (it waits for the end)."""
    t = start
    for step in chain:
        if isinstance(step, CallPlan):
            t += step.think_s
            for down in outages:  # sorted by start: one pass moves t past each in turn
                if down.start_s <= t < down.end_s:
                    t = down.end_s
            t += step.service_s
        else:
            t = max(_chain_end(sub, t, outages) for sub in step.chains)
    return t


def _agent_span(agent: AgentPlan, outages: tuple[Outage, ...] = ()) -> float:
    return _chain_end(agent.steps, agent.start_s, outages)


def build_workload(fleet: FleetSpec, provider: ProviderSpec, seed: int) -> Workload:
    """Draw the fleet's calls for ``seed``: start times, service times, think times.

    The same ``(fleet, provider.latency, seed)`` always gives the same workload.
    """
    rng = random.Random(f"anygate.sim:{seed}:workload")
    # Token sizes from their own stream, so a workload with tokens has the very same
    # starts, service and think times as the one without (and every existing scenario's
    # results stay what they were).
    token_rng = random.Random(f"anygate.sim:{seed}:tokens")
    calls: list[CallPlan] = []
    sizes = fleet.tokens

    def call(first: bool, history: list[int]) -> CallPlan:
        """``history[0]``: the conversation the chain's next call carries (with ``grow``)."""
        think = 0.0 if first or fleet.think is None else sample(fleet.think, rng)
        service = sample(provider.latency, rng)
        if sizes is None:
            plan = CallPlan(index=len(calls), service_s=service, think_s=think)
        else:
            prompt = round(sample(sizes.prompt, token_rng)) + history[0]
            completion = min(round(sample(sizes.completion, token_rng)), sizes.max_tokens)
            if sizes.grow:
                history[0] = prompt + completion
            plan = CallPlan(
                index=len(calls),
                service_s=service,
                think_s=think,
                prompt_tokens=prompt,
                max_tokens=sizes.max_tokens,
                completion_tokens=max(completion, 1),
            )
        calls.append(plan)
        return plan

    agents = []
    for number in range(fleet.agents):
        start = number * fleet.ramp_s / fleet.agents
        if fleet.start_jitter_s > 0:
            start += rng.uniform(0.0, fleet.start_jitter_s)
        steps: list[CallPlan | FanOutPlan] = []
        lead = [0]
        for position in range(1, fleet.calls_per_agent + 1):
            steps.append(call(position == 1, lead))
            fan = fleet.fanout
            if fan is not None and position == fan.after_call:
                chains = []
                for _ in range(fan.subagents):
                    own = [0]  # a subagent starts its own conversation
                    chains.append(tuple(call(i == 0, own) for i in range(fan.calls)))
                steps.append(FanOutPlan(chains=tuple(chains)))
        agents.append(AgentPlan(start_s=start, steps=tuple(steps)))
    workload = Workload(agents=tuple(agents), calls=tuple(calls))
    _check_sizes(workload, provider)
    return workload


def _check_sizes(workload: Workload, provider: ProviderSpec) -> None:
    """Refuse a call that no bucket could ever admit (it would be retried forever).

    Real providers answer such a request with a non-retriable error ("Request too large");
    the simulator has no such answer, so the scenario is refused instead.

    Raises:
        ConfigError: naming the bucket, its capacity and the largest call's cost.
    """
    if provider.tokens is None:
        return
    from .. import ConfigError
    from ._buckets import Buckets, make_buckets

    for bucket in make_buckets(provider.tokens).all:
        worst = max(Buckets.cost(bucket, c.prompt_tokens, c.max_tokens) for c in workload.calls)
        if worst > bucket.capacity:
            where = f"provider.tokens.{bucket.kind}"
            per_s = getattr(bucket, "window_s", provider.tokens.capacity_s)
            msg = (
                f"{where} holds at most {bucket.capacity:g} per {per_s:g}"
                f" s, less than the largest call's cost ({worst:g}); raise it or shrink"
                " fleet.tokens"
            )
            raise ConfigError(msg, path=where, value=bucket.limit)
