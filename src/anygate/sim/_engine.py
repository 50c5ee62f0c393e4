"""Run a fleet against the provider model on a virtual clock, deterministically.

Each strategy runs in its own ``trio.run`` with ``trio.testing.MockClock(autojump_threshold=0)``:
whenever every task is blocked, the clock jumps straight to the next deadline, so an hour of
storm takes a second of CPU. All timing in the simulated code goes through AnyIO
(``anyio.sleep``, cancel scopes, ``anyio.current_time``), as it does in the library, so the
library's real :class:`~anygate.Gate` and :class:`~anygate.Policy` run unchanged.

Determinism. With the same seed, two runs must produce identical results. Three things
could break that, and each is handled:

* trio shuffles the order in which it runs the tasks of one scheduling batch (half the
  time it reverses the batch, using the module-level ``random.Random`` instance
  ``trio._core._run._r``), to keep users from relying on an order. We seed that instance
  for the duration of each run and restore its state afterwards (:func:`seeded_scheduler`).
* trio breaks ties between *equal* deadlines by ``id()`` of the cancel scope, which differs
  between processes. The model avoids exact ties instead: agents start at distinct instants
  (``start_jitter_s``), and every provider answer, success or rejection, takes a randomly
  drawn time, so no two sleeps end at the same float instant except by a vanishing chance.
* Every random draw comes from a ``random.Random`` seeded from the run's seed and a purpose
  string (workload, provider, policy), never from the global generator.

The test suite proves it, including across processes with different hash seeds.
"""

from __future__ import annotations

import functools
import importlib
import random
from collections.abc import Callable, Coroutine, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

import anyio

from ._naive import NaiveInvoker
from ._provider import ProviderModel
from ._results import Recorder, SimulationResult, StrategyResult, summarize
from ._spec import Scenario, StrategySpec
from ._workload import AgentPlan, CallPlan, FanOutPlan, LowerBound, Workload, build_workload

__all__ = ["Invoker", "run_scenario", "run_strategy", "seeded_scheduler"]


class Invoker(Protocol):
    """A strategy, ready to run inside one simulation: makes one logical call at a time.

    It may also have a ``controller`` attribute: an async callable the engine runs as a
    task beside the fleet and cancels when the fleet is done.
    """

    @property
    def summary(self) -> str:
        """One line describing the strategy."""
        ...

    async def __call__(self, call: CallPlan) -> None:
        """Make ``call``, retrying as the strategy does, and record the outcome."""
        ...


#: Builds the invoker for a policy strategy; set by ``_policy_strategy`` (kept apart so the
#: naive baseline and the engine import nothing of the policy).
PolicyFactory = Callable[[StrategySpec, ProviderModel, Recorder, int], Invoker]


@contextmanager
def seeded_scheduler(seed: str) -> Iterator[None]:
    """Seed trio's batch-order shuffle for one run; restore its previous state on exit.

    ``trio._core._run._r`` is private. If a future trio drops or renames it, runs stay
    correct but may stop being bit-for-bit repeatable; the determinism tests catch that.
    """
    module = importlib.import_module("trio._core._run")
    shuffler = getattr(module, "_r", None)
    if not isinstance(shuffler, random.Random):  # pragma: no cover - depends on trio
        yield
        return
    state = shuffler.getstate()
    shuffler.seed(seed)
    try:
        yield
    finally:
        shuffler.setstate(state)


async def _chain(steps: Sequence[CallPlan | FanOutPlan], invoke: Invoker) -> None:
    for step in steps:
        if isinstance(step, CallPlan):
            if step.think_s:
                await anyio.sleep(step.think_s)
            await invoke(step)
        else:
            async with anyio.create_task_group() as tg:
                for sub in step.chains:
                    tg.start_soon(_chain, sub, invoke)


async def _agent(agent: AgentPlan, invoke: Invoker) -> None:
    await anyio.sleep(agent.start_s)
    await _chain(agent.steps, invoke)


async def _run(
    scenario: Scenario,
    workload: Workload,
    strategy: StrategySpec,
    seed: int,
    bound: LowerBound,
    policy_factory: PolicyFactory | None,
    progress: Callable[[int], None] | None,
) -> StrategyResult:
    provider = ProviderModel(scenario.provider, random.Random(f"anygate.sim:{seed}:provider"))
    recorder = Recorder(
        len(workload.calls), progress, call_deadline_s=scenario.fleet.call_deadline_s
    )
    invoke: Invoker
    if strategy.naive is not None:
        invoke = NaiveInvoker(strategy.naive, provider, recorder)
    elif policy_factory is None:
        msg = f"strategy {strategy.name!r} needs a policy factory"
        raise RuntimeError(msg)
    else:
        invoke = policy_factory(strategy, provider, recorder, seed)
    # A strategy may bring a controller task (say, one that adapts the cap over time); it
    # runs beside the fleet and is cancelled once every agent is done.
    controller: Callable[[], Coroutine[Any, Any, None]] | None = getattr(invoke, "controller", None)
    async with anyio.create_task_group() as outer:
        if controller is not None:
            outer.start_soon(controller)
        with anyio.move_on_after(scenario.time_limit_s):
            async with anyio.create_task_group() as tg:
                for agent in workload.agents:
                    tg.start_soon(_agent, agent, invoke)
        outer.cancel_scope.cancel()
    return summarize(strategy.name, invoke.summary, recorder, provider.trace, bound)


def run_strategy(
    scenario: Scenario,
    workload: Workload,
    strategy: StrategySpec,
    *,
    seed: int,
    policy_factory: PolicyFactory | None = None,
    progress: Callable[[int], None] | None = None,
) -> StrategyResult:
    """Simulate one strategy on ``workload`` in a fresh virtual-clock trio run.

    Args:
        scenario: provider and limits.
        workload: the fleet's calls (the same for every strategy of one comparison).
        strategy: what to run.
        seed: seeds the provider, the policy's jitter and trio's scheduler.
        policy_factory: builds policy strategies (``seed``, ``anygate``, custom ones).
        progress: called with the number of finished calls as the run goes.

    Raises:
        RuntimeError: a policy strategy without ``policy_factory``, or called inside a
            running trio run (runs do not nest).
    """
    import trio
    import trio.testing

    bound = workload.lower_bound(scenario.provider)
    clock = trio.testing.MockClock(autojump_threshold=0)
    with seeded_scheduler(f"anygate.sim:{seed}:trio"):
        return trio.run(
            _run,
            scenario,
            workload,
            strategy,
            seed,
            bound,
            policy_factory,
            progress,
            clock=clock,
        )


def _forward(progress: Callable[[str, int, int], None], name: str, total: int, done: int) -> None:
    progress(name, done, total)


def run_scenario(
    scenario: Scenario,
    strategies: Sequence[StrategySpec],
    *,
    seed: int | None = None,
    policy_factory: PolicyFactory | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> SimulationResult:
    """Simulate every strategy on the same workload, one after another.

    Args:
        scenario: what to simulate.
        strategies: in display order.
        seed: overrides ``scenario.seed``.
        policy_factory: builds policy strategies.
        progress: called as ``progress(strategy_name, finished_calls, total_calls)``.
    """
    seed = scenario.seed if seed is None else seed
    workload = build_workload(scenario.fleet, scenario.provider, seed)
    total = len(workload.calls)
    results = []
    for strategy in strategies:
        report: Callable[[int], None] | None = None
        if progress is not None:
            progress(strategy.name, 0, total)
            report = functools.partial(_forward, progress, strategy.name, total)

        results.append(
            run_strategy(
                scenario,
                workload,
                strategy,
                seed=seed,
                policy_factory=policy_factory,
                progress=report,
            )
        )
    return SimulationResult(
        scenario=scenario.name,
        seed=seed,
        calls=total,
        bound=workload.lower_bound(scenario.provider),
        strategies=tuple(results),
    )
