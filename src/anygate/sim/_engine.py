"""Run a fleet against the provider model on a virtual clock, deterministically.

Each strategy runs in its own ``trio.run`` with ``trio.testing.MockClock(autojump_threshold=0)``:
whenever every task is blocked, the clock jumps straight to the next deadline, so an hour of
storm takes a second of CPU. All timing in the simulated code goes through AnyIO
(``anyio.sleep``, cancel scopes, ``anyio.current_time``), as it does in the library, so the
library's real :class:`~anygate.Gate` and :class:`~anygate.Policy` run unchanged.

Determinism. With the same seed, two runs must produce identical results, in any process,
whatever ran before. Three things could break that, and each is handled:

* Scheduling order. trio runs the tasks of one scheduling batch in an order it perturbs on
  purpose, and it has two ways of doing so, chosen per *process*: normally it reverses
  the batch half the time; once Hypothesis has been imported (trio registers a Hypothesis
  plugin that flips ``trio._core._run._ALLOW_DETERMINISTIC_SCHEDULING``), it sorts the
  batch by task creation order and shuffles it. Both draw from the module-level
  ``random.Random`` instance ``trio._core._run._r``. A run inside a test session that
  imported Hypothesis therefore took other turns than the same run in a fresh
  interpreter, which is how this bug showed up. :func:`seeded_scheduler` pins *both*: the
  sorted-and-shuffled mode and the seed, for the duration of each run, restoring the
  previous values afterwards. The sorted mode is chosen because it is canonical: tasks
  woken in the same batch run in an order that depends only on when they were created and
  on the seed, never on the order they were woken in. That also neutralises trio's
  ``id()``-based orders (ties between equal cancel-scope deadlines, iteration over sets of
  tasks when a scope cancels several), which depend on memory addresses and so on
  everything the process allocated before.
* Equal deadlines. Even so, the model avoids exact ties where it can: agents start at
  distinct instants (``start_jitter_s``) and every provider answer, success or rejection,
  takes a randomly drawn time. Where the library creates ties on purpose (every attempt
  admitted during an adaptive pause resumes at the pause's end), the canonical batch order
  makes them harmless.
* Every random draw comes from a ``random.Random`` seeded from the run's seed and a purpose
  string (workload, provider, policy), never from the global generator.

The test suite proves it, including across processes with different hash seeds.
"""

from __future__ import annotations

import functools
import importlib
import random
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol

import anyio

from ._naive import NaiveInvoker
from ._provider import ProviderModel
from ._results import Recorder, SimulationResult, StrategyResult, summarize
from ._spec import Scenario, StrategySpec
from ._workload import AgentPlan, CallPlan, FanOutPlan, LowerBound, Workload, build_workload

__all__ = ["Invoker", "run_scenario", "run_strategy", "seeded_scheduler"]


class Invoker(Protocol):
    """A strategy, ready to run inside one simulation: makes one logical call at a time."""

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

#: trio's switch between its two batch-ordering modes (see :func:`seeded_scheduler`).
_MODE = "_ALLOW_DETERMINISTIC_SCHEDULING"


@contextmanager
def seeded_scheduler(seed: str) -> Iterator[None]:
    """Pin trio's batch ordering for one run: canonical mode, seeded; restore both on exit.

    Sets ``trio._core._run._ALLOW_DETERMINISTIC_SCHEDULING`` (sort each batch by task
    creation order, then shuffle it) and seeds ``trio._core._run._r``, the generator both
    of trio's ordering modes draw from. Without the first, results depended on whether the
    process had imported Hypothesis (see the module docstring).

    Both names are private to trio. If a future trio drops or renames them, runs stay
    correct but may stop being bit-for-bit repeatable; the determinism tests catch that.
    Not thread-safe: two simulations must not run at the same time in one process (trio's
    scheduler state is process-wide).
    """
    module = importlib.import_module("trio._core._run")
    shuffler = getattr(module, "_r", None)
    mode = getattr(module, _MODE, None)
    if not isinstance(shuffler, random.Random) or not isinstance(mode, bool):
        yield  # pragma: no cover - depends on trio
        return
    state = shuffler.getstate()
    shuffler.seed(seed)
    setattr(module, _MODE, True)
    try:
        yield
    finally:
        setattr(module, _MODE, mode)
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
    with anyio.move_on_after(scenario.time_limit_s):
        async with anyio.create_task_group() as tg:
            for agent in workload.agents:
                tg.start_soon(_agent, agent, invoke)
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
