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
import math
import random
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING

import anyio

from ._protocol import CallLost, Client, Request, StrategyContext, load_factory
from ._provider import ProviderError, ProviderModel, ProviderResponse
from ._results import Recorder, SimulationResult, StrategyResult, summarize
from ._spec import Scenario, StrategySpec
from ._workload import AgentPlan, CallPlan, FanOutPlan, LowerBound, Workload, build_workload

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

__all__ = ["build_client", "run_scenario", "run_strategy", "seeded_scheduler"]

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


def build_client(spec: StrategySpec, context: StrategyContext, provider: ProviderModel) -> Client:
    """The client for one run of ``spec``: every kind goes through the strategy protocol.

    Only the ``oracle`` is handed ``provider``; every other strategy sees the provider
    through ``context.published`` alone.

    Raises:
        ConfigError: an invalid policy config or an unloadable factory.
    """
    from ._naive import NaiveClient
    from ._oracle import Oracle
    from ._peers import PEERS

    if spec.naive is not None:
        return NaiveClient(spec.naive)
    if spec.policy is not None:
        from ._policy_strategy import PolicyClient

        return PolicyClient(spec, context)
    if spec.factory is not None:
        factory = spec.factory
        if isinstance(factory, str):
            factory = load_factory(factory, where=f"strategy {spec.name!r} factory")
        client: Client = factory(context)
        return client
    if spec.name == "oracle":
        return Oracle(provider)
    peer = PEERS.get(spec.name)
    if peer is None:
        msg = f"strategy {spec.name!r} has no naive, policy or factory setting"
        raise ValueError(msg)
    built: Client = peer(context)  # type: ignore[operator]
    return built


class _Invoker:
    """Makes one logical call with a client and records it (attempts, 429s, outcome)."""

    def __init__(self, client: Client, provider: ProviderModel, recorder: Recorder) -> None:
        self.client = client
        self._provider = provider
        self._recorder = recorder

    async def __call__(self, call: CallPlan) -> bool:
        recorder = self._recorder
        record = recorder.begin(call.index)
        provider = self._provider

        async def send_once(
            *, on_headers: Callable[[int, dict[str, str]], None] | None = None
        ) -> ProviderResponse:
            record.attempts += 1
            try:
                return await provider.serve(
                    call.service_s,
                    call.prompt_tokens,
                    call.max_tokens,
                    call.completion_tokens,
                    on_headers=on_headers,
                )
            except ProviderError as exc:
                record.got_429 |= exc.status_code == 429
                raise

        send = Request(send_once, prompt_tokens=call.prompt_tokens, max_tokens=call.max_tokens)

        deadline = recorder.call_deadline_s
        outcome = "deadline"
        # A caller's deadline bounds the whole call, as an enclosing timeout would.
        with anyio.move_on_after(math.inf if deadline is None else deadline):
            try:
                await self.client.call(send)
            except CallLost as exc:
                outcome = exc.cause
            except Exception as exc:
                outcome = type(exc).__name__
            else:
                outcome = "ok"
        recorder.finish(record, outcome)
        return outcome == "ok"


def _calls_in(steps: Sequence[CallPlan | FanOutPlan]) -> int:
    return sum(
        1 if isinstance(step, CallPlan) else sum(_calls_in(sub) for sub in step.chains)
        for step in steps
    )


async def _chain(
    steps: Sequence[CallPlan | FanOutPlan], invoke: _Invoker, recorder: Recorder, stop: bool
) -> None:
    for position, step in enumerate(steps):
        if isinstance(step, CallPlan):
            if step.think_s:
                await anyio.sleep(step.think_s)
            if not await invoke(step) and stop:
                # An agent turn ends on an error: the rest of this chain never runs. (A
                # subagent's failure ends the subagent; its lead continues after the fan-out.)
                recorder.not_run += _calls_in(steps[position + 1 :])
                return
        else:
            async with anyio.create_task_group() as tg:
                for sub in step.chains:
                    tg.start_soon(_chain, sub, invoke, recorder, stop)


async def _agent(agent: AgentPlan, invoke: _Invoker, recorder: Recorder, stop: bool) -> None:
    await anyio.sleep(agent.start_s)
    await _chain(agent.steps, invoke, recorder, stop)


async def _run(
    scenario: Scenario,
    workload: Workload,
    strategy: StrategySpec,
    seed: int,
    bound: LowerBound,
    progress: Callable[[int], None] | None,
) -> StrategyResult:
    provider = ProviderModel(
        scenario.provider,
        random.Random(f"anygate.sim:{seed}:provider"),
        growth_rng=random.Random(f"anygate.sim:{seed}:burst-growth"),
        pool_rng=random.Random(f"anygate.sim:{seed}:shared-pool"),
        head_rng=random.Random(f"anygate.sim:{seed}:first-byte"),
    )
    recorder = Recorder(
        len(workload.calls), progress, call_deadline_s=scenario.fleet.call_deadline_s
    )
    context = StrategyContext(
        name=strategy.name,
        published=scenario.published,
        seed=seed,
        call_deadline_s=scenario.fleet.call_deadline_s,
        _stats=recorder,
    )
    invoke = _Invoker(build_client(strategy, context, provider), provider, recorder)
    stop = scenario.fleet.on_failure == "stop"
    with anyio.move_on_after(scenario.time_limit_s):
        async with anyio.create_task_group() as tg:
            for agent in workload.agents:
                tg.start_soon(_agent, agent, invoke, recorder, stop)
    return summarize(
        strategy.name,
        invoke.client.summary,
        recorder,
        provider.trace,
        bound,
        run_end=anyio.current_time(),
    )


def run_strategy(
    scenario: Scenario,
    workload: Workload,
    strategy: StrategySpec,
    *,
    seed: int,
    progress: Callable[[int], None] | None = None,
) -> StrategyResult:
    """Simulate one strategy on ``workload`` in a fresh virtual-clock trio run.

    Args:
        scenario: provider, published facts and limits.
        workload: the fleet's calls (the same for every strategy of one comparison).
        strategy: what to run.
        seed: seeds the provider, the strategy's jitter and trio's scheduler.
        progress: called with the number of finished calls as the run goes.

    Raises:
        ConfigError: an invalid policy config or an unloadable factory.
        RuntimeError: called inside a running trio run (runs do not nest).
    """
    import trio
    import trio.testing

    bound = workload.lower_bound(scenario.provider)
    clock = trio.testing.MockClock(autojump_threshold=0)
    with seeded_scheduler(f"anygate.sim:{seed}:trio"):
        return trio.run(_run, scenario, workload, strategy, seed, bound, progress, clock=clock)


def _forward(progress: Callable[[str, int, int], None], name: str, total: int, done: int) -> None:
    progress(name, done, total)


def with_oracle_ratios(
    results: Sequence[StrategyResult], oracle_makespan: float | None
) -> tuple[StrategyResult, ...]:
    """Each result with ``oracle_ratio`` filled in (``None`` when it lost calls)."""
    out = []
    for result in results:
        ratio = None
        if oracle_makespan and not result.failed:
            ratio = result.makespan_s / oracle_makespan
        out.append(replace(result, oracle_ratio=ratio))
    return tuple(out)


def run_scenario(
    scenario: Scenario,
    strategies: Sequence[StrategySpec],
    *,
    seed: int | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    reference: bool = True,
) -> SimulationResult:
    """Simulate every strategy on the same workload, one after another.

    The ``oracle`` is the yardstick of ``oracle_ratio``: when it is not among
    ``strategies`` (and ``reference`` is true) it runs once more, unreported.

    Args:
        scenario: what to simulate.
        strategies: in display order.
        seed: overrides ``scenario.seed``.
        progress: called as ``progress(strategy_name, finished_calls, total_calls)``.
        reference: run the oracle for ``oracle_ratio`` when it is not selected.
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
        results.append(run_strategy(scenario, workload, strategy, seed=seed, progress=report))
    oracle = next((r for r, s in zip(results, strategies, strict=True) if _is_oracle(s)), None)
    if oracle is None and reference:
        oracle = run_strategy(scenario, workload, StrategySpec(name="oracle"), seed=seed)
    oracle_makespan = oracle.makespan_s if oracle is not None and not oracle.failed else None
    return SimulationResult(
        scenario=scenario.name,
        seed=seed,
        calls=total,
        bound=workload.lower_bound(scenario.provider),
        strategies=with_oracle_ratios(results, oracle_makespan),
        oracle_makespan_s=oracle_makespan,
    )


def _is_oracle(spec: StrategySpec) -> bool:
    return (
        spec.name == "oracle"
        and spec.naive is None
        and spec.policy is None
        and spec.factory is None
    )
