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
    from ._spec import FleetSpec, Outage, ProviderSpec

__all__ = ["AgentPlan", "CallPlan", "FanOutPlan", "LowerBound", "Workload", "build_workload"]


@dataclass(frozen=True, slots=True)
class CallPlan:
    """One logical call: ``think_s`` of tool time, then a call needing ``service_s``."""

    index: int
    service_s: float
    think_s: float = 0.0


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
    """

    seconds: float
    binding: str
    slots_s: float
    chain_s: float
    rpm_s: float | None
    burst_s: float | None
    outage_s: float = 0.0


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
        binding = max(parts, key=lambda name: parts[name])
        return LowerBound(
            seconds=parts[binding],
            binding=binding,
            slots_s=parts["slots"],
            chain_s=parts["chain"],
            rpm_s=parts.get("rpm"),
            burst_s=parts.get("burst"),
            outage_s=outage,
        )


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
    calls: list[CallPlan] = []

    def call(first: bool) -> CallPlan:
        think = 0.0 if first or fleet.think is None else sample(fleet.think, rng)
        plan = CallPlan(index=len(calls), service_s=sample(provider.latency, rng), think_s=think)
        calls.append(plan)
        return plan

    agents = []
    for number in range(fleet.agents):
        start = number * fleet.ramp_s / fleet.agents
        if fleet.start_jitter_s > 0:
            start += rng.uniform(0.0, fleet.start_jitter_s)
        steps: list[CallPlan | FanOutPlan] = []
        for position in range(1, fleet.calls_per_agent + 1):
            steps.append(call(first=position == 1))
            fan = fleet.fanout
            if fan is not None and position == fan.after_call:
                chains = tuple(
                    tuple(call(first=i == 0) for i in range(fan.calls))
                    for _ in range(fan.subagents)
                )
                steps.append(FanOutPlan(chains=chains))
        agents.append(AgentPlan(start_s=start, steps=tuple(steps)))
    return Workload(agents=tuple(agents), calls=tuple(calls))
