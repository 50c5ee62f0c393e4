"""anygate.sim: a virtual-clock storm simulator for anygate call policies.

It runs a fleet of agents against a model of a provider (slots, an RPM limit, a burst-slope
throttle, outages, lognormal latency) on trio's ``MockClock``, once per strategy: the peers
users really run (the openai SDK's retries, the cookbook's tenacity recipe, stamina, LiteLLM's
Router, with and without a semaphore cap), the library's real :class:`~anygate.Gate` and
:class:`~anygate.Policy`, your own strategies (:class:`StrategyContext` describes the
protocol) and an ``oracle`` that knows the provider's hidden rules. Results are
deterministic for a seed. The ``anygate simulate`` command is the usual way in; this module is the same
thing for scripts and notebooks::

    from anygate import sim

    scenario = sim.load_scenario("morning-peak")
    result = sim.simulate(scenario, seed=1)
    for strategy in result.strategies:
        print(strategy.name, strategy.ratio, strategy.oracle_ratio, dict(strategy.failures))

It needs trio and PyYAML (the ``cli`` extra); nothing here is imported by ``import anygate``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._engine import run_scenario
from ._protocol import CallLost as CallLost
from ._protocol import Client as Client
from ._protocol import Request as Request
from ._protocol import Send as Send
from ._protocol import StrategyContext as StrategyContext
from ._protocol import StrategyFactory as StrategyFactory
from ._provider import ProviderError as ProviderError
from ._provider import ProviderResponse as ProviderResponse
from ._results import Percentiles as Percentiles
from ._results import SimulationResult as SimulationResult
from ._results import StrategyResult as StrategyResult
from ._scenarios import DEFAULT_SCENARIO as DEFAULT_SCENARIO
from ._scenarios import builtin_scenarios as builtin_scenarios
from ._scenarios import load_scenario as load_scenario
from ._scenarios import resolve_strategies as resolve_strategies
from ._spec import Published as Published
from ._spec import Scenario as Scenario
from ._spec import StrategySpec as StrategySpec
from ._workload import LowerBound as LowerBound

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from pathlib import Path

__all__ = [
    "DEFAULT_SCENARIO",
    "CallLost",
    "Client",
    "LowerBound",
    "Percentiles",
    "ProviderError",
    "ProviderResponse",
    "Published",
    "Request",
    "Scenario",
    "Send",
    "SimulationResult",
    "StrategyContext",
    "StrategyFactory",
    "StrategyResult",
    "StrategySpec",
    "builtin_scenarios",
    "load_scenario",
    "resolve_strategies",
    "simulate",
]


def simulate(
    scenario: Scenario,
    *,
    seed: int | None = None,
    strategies: Sequence[StrategySpec] | None = None,
    config: str | Path | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> SimulationResult:
    """Run every strategy on the scenario's workload and return the comparison.

    Args:
        scenario: from :func:`load_scenario`.
        seed: overrides the scenario's seed; the same seed gives the same result.
        strategies: what to compare; default :func:`resolve_strategies` (the built-ins
            and the scenario's own).
        config: the user's policy config for the ``anygate`` strategy (ignored when
            ``strategies`` is given).
        progress: called as ``progress(strategy, finished_calls, total_calls)``.

    Raises:
        anygate.ConfigError: an invalid strategy or policy config.
    """
    from ._policy_strategy import quiet_policy_logs

    if strategies is None:
        strategies = resolve_strategies(scenario, config=config)
    with quiet_policy_logs():
        return run_scenario(scenario, strategies, seed=seed, progress=progress)
