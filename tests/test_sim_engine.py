"""The simulator end to end: deterministic for a seed, honest against its bound, real policy.

These tests run whole (small) simulations synchronously: each strategy gets its own
``trio.run`` on a ``MockClock``, exactly as ``anygate simulate`` does.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from typing import TYPE_CHECKING, Any

import pytest

from anygate import ConfigError, sim
from anygate.sim._engine import seeded_scheduler
from anygate.sim._spec import DEFAULT_STRATEGIES

if TYPE_CHECKING:
    import random

pytest.importorskip("trio")
pytest.importorskip("yaml")

SMALL: dict[str, Any] = {
    "name": "small storm",
    "seed": 5,
    "provider": {
        "slots": 6,
        "rpm": 240,
        "burst": {"window_s": 5, "growth": 2.0, "floor": 8},
        "latency": {"median_s": 1.0, "sigma": 0.5},
    },
    "fleet": {
        "agents": 30,
        "ramp_s": 5,
        "calls_per_agent": 3,
        "think": {"median_s": 0.5, "sigma": 0.5},
        "fanout": {"after_call": 1, "subagents": 2, "calls": 1},
    },
    "strategies": {
        "seed": {"policy": {"llm_call": {"max_concurrent_calls": 6}}},
        "anygate": {"policy": {"llm_call": {"max_concurrent_calls": 6}}},
    },
}


def _digest(result: sim.SimulationResult) -> str:
    return hashlib.sha256(json.dumps(result.to_dict(), sort_keys=True).encode()).hexdigest()


def test_same_seed_gives_identical_results() -> None:
    """Two runs with one seed agree field for field, traces included, for every strategy."""
    scenario = sim.load_scenario(SMALL)
    first = sim.simulate(scenario)
    second = sim.simulate(scenario)
    assert [s.name for s in first.strategies] == list(DEFAULT_STRATEGIES)
    assert first == second
    # The storm really happened, so equality is not vacuous.
    naive = first.strategies[0]
    assert naive.count_429 > 50
    assert naive.retries > 50


def test_other_seed_gives_other_results() -> None:
    """A different seed draws a different workload and different results."""
    scenario = sim.load_scenario(SMALL)
    assert _digest(sim.simulate(scenario, seed=5)) != _digest(sim.simulate(scenario, seed=6))


def test_trio_scheduler_order_does_not_leak_into_results() -> None:
    """Results do not depend on trio's batch-order RNG state before the run (it is seeded)."""
    import trio._core._run as trio_run

    scenario = sim.load_scenario(SMALL)
    shuffler = trio_run._r
    saved = shuffler.getstate()
    try:
        shuffler.seed(123)
        first = sim.simulate(scenario)
        shuffler.seed(456)
        for _ in range(17):
            shuffler.random()
        assert sim.simulate(scenario) == first
    finally:
        shuffler.setstate(saved)


def test_seeded_scheduler_restores_trio_state() -> None:
    """The pinning is scoped: trio's RNG and ordering mode are what they were after the run."""
    import trio._core._run as trio_run

    shuffler: random.Random = trio_run._r
    before = shuffler.getstate()
    # Read through a plain bool: trio declares the flag Final, so a type checker takes it
    # for a constant.
    mode: bool = trio_run._ALLOW_DETERMINISTIC_SCHEDULING
    with seeded_scheduler("x"):
        assert shuffler.getstate() != before
        pinned: bool = trio_run._ALLOW_DETERMINISTIC_SCHEDULING
        assert pinned is True
        shuffler.random()
    assert shuffler.getstate() == before
    after: bool = trio_run._ALLOW_DETERMINISTIC_SCHEDULING
    assert after is mode


def test_trio_ordering_mode_does_not_leak_into_results(monkeypatch: pytest.MonkeyPatch) -> None:
    """Results are the same whichever batch-ordering mode trio was in before the run.

    Importing Hypothesis switches trio into its sort-and-shuffle mode for the rest of the
    process; the simulator must not care (this was the cross-test determinism bug).
    """
    import trio._core._run as trio_run

    scenario = sim.load_scenario(SMALL)
    monkeypatch.setattr(trio_run, "_ALLOW_DETERMINISTIC_SCHEDULING", False)
    reversing = sim.simulate(scenario)
    monkeypatch.setattr(trio_run, "_ALLOW_DETERMINISTIC_SCHEDULING", True)
    assert sim.simulate(scenario) == reversing


#: Run in fresh interpreters: the same digest must come out whatever the process did first.
_PRELUDES = {
    "plain": "",
    # Importing Hypothesis loads trio's Hypothesis plugin, which changes how trio orders
    # each scheduling batch for the rest of the process.
    "hypothesis imported": "import hypothesis",
    # Shift every later allocation, so id()-based orders (deadline ties, sets) change.
    "allocation history": "junk = [object() for _ in range(54321)]; del junk[::3]",
}


@pytest.mark.processes
@pytest.mark.parametrize("prelude", list(_PRELUDES))
def test_deterministic_across_processes_and_hash_seeds(prelude: str) -> None:
    """Fresh interpreters with different PYTHONHASHSEED, and with Hypothesis imported or the
    allocation history shifted first, print the digest this process gets (whatever this
    test session imported before)."""
    code = textwrap.dedent(
        f"""
        {_PRELUDES[prelude]}
        import hashlib, json
        from anygate import sim
        result = sim.simulate(sim.load_scenario({SMALL!r}))
        print(hashlib.sha256(json.dumps(result.to_dict(), sort_keys=True).encode()).hexdigest())
        """
    )
    expected = _digest(sim.simulate(sim.load_scenario(SMALL)))
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        assert out.stdout.strip() == expected, (prelude, hash_seed)


@pytest.mark.parametrize("name", sim.builtin_scenarios())
def test_no_strategy_beats_the_lower_bound(name: str) -> None:
    """Every strategy that completed all its calls took at least the lower bound."""
    scenario = sim.load_scenario(name)
    # Shrink the built-in fleets so the whole matrix stays quick; the provider is unchanged.
    fleet = scenario.fleet
    small = type(fleet)(**{**fleet.__dict__, "agents": max(4, fleet.agents // 8)})
    scenario = type(scenario)(**{**scenario.__dict__, "fleet": small})
    result = sim.simulate(scenario)
    for strategy in result.strategies:
        if strategy.failed == 0:
            assert strategy.makespan_s >= result.bound.seconds, strategy.name


def test_a_cap_at_the_provider_slots_prevents_concurrency_429s() -> None:
    """With max_concurrent_calls equal to the slots, the provider never sees excess requests."""
    scenario = sim.load_scenario(SMALL)
    result = sim.simulate(scenario)
    by_name = {s.name: s for s in result.strategies}
    assert by_name["naive"].responses["concurrency"] > 0
    for name in ("seed", "anygate"):
        assert by_name[name].responses["concurrency"] == 0
        assert by_name[name].max_concurrency <= 6


def test_naive_retries_on_a_fixed_exponential_schedule() -> None:
    """naive waits 1, 2, 4, ... s capped at 60 s, no jitter: 10 attempts at exact times."""
    scenario = sim.load_scenario(
        {
            "provider": {
                "slots": 1,
                "reject_latency": 0,
                "outages": [{"start_s": 0, "end_s": 1000}],
            },
            "fleet": {"agents": 1, "calls_per_agent": 1, "start_jitter_s": 0},
        }
    )
    (naive,) = sim.simulate(
        scenario, strategies=sim.resolve_strategies(scenario, only=["naive"])
    ).strategies
    expected = [0.0, 1.0, 3.0, 7.0, 15.0, 31.0, 63.0, 123.0, 183.0, 243.0]
    assert [t for t, _ in naive.rejects] == expected
    assert naive.failures == {"gave_up": 1}
    assert naive.makespan_s == 243.0


def test_breaker_trips_are_counted_and_fail_calls_fast() -> None:
    """During a long outage the real breaker opens; calls then fail with circuit_open."""
    scenario = sim.load_scenario(
        {
            "provider": {"slots": 4, "outages": [{"start_s": 0, "end_s": 300}]},
            "fleet": {"agents": 10, "calls_per_agent": 3, "ramp_s": 60},
        }
    )
    only = sim.resolve_strategies(scenario, only=["seed"])
    (seed,) = sim.simulate(scenario, strategies=only).strategies
    assert seed.breaker_trips >= 1
    assert seed.failures.get("circuit_open", 0) > 0
    assert seed.ok == 0


def test_time_limit_counts_unfinished_calls() -> None:
    """Calls still running (or never started) at the time limit count as unfinished."""
    scenario = sim.load_scenario(
        {
            "time_limit_s": 10,
            "provider": {"slots": 1, "on_full": "queue", "latency": 4},
            "fleet": {"agents": 3, "calls_per_agent": 2},
        }
    )
    only = sim.resolve_strategies(scenario, only=["naive"])
    (naive,) = sim.simulate(scenario, strategies=only).strategies
    assert naive.ok == 2
    assert naive.failures == {"unfinished": 4}


def test_policy_config_errors_name_the_strategy_and_key() -> None:
    """A bad policy value in a scenario fails with the policy loader's key path."""
    scenario = sim.load_scenario(
        {"strategies": {"mine": {"policy": {"llm_call": {"retry_max_attempts": 0}}}}}
    )
    with pytest.raises(ConfigError, match=r"strategy 'mine'.*llm_call\.retry_max_attempts"):
        sim.simulate(scenario)


def test_policy_strategy_really_runs_the_policy() -> None:
    """Burst-rate budgets of the config take effect: budget 1 fails every throttled call."""
    scenario = sim.load_scenario(
        {
            "provider": {"slots": 50, "burst": {"window_s": 10, "growth": 2, "floor": 5}},
            "fleet": {"agents": 20, "calls_per_agent": 1},
            "strategies": {
                "one-shot": {"policy": {"llm_call": {"reason_budgets": {"burst_rate": 1}}}},
                "patient": {
                    "policy": {
                        "llm_call": {"retry_max_attempts": 10, "reason_budgets": {"burst_rate": 10}}
                    }
                },
            },
        }
    )
    only = sim.resolve_strategies(scenario, only=["one-shot", "patient"])
    one_shot, patient = sim.simulate(scenario, strategies=only).strategies
    # The floor's 5 pass; every call the provider throttles fails at once (a call or two
    # sent after the gate's pause may find the next window open).
    assert set(one_shot.failures) == {"gave_up"}
    assert one_shot.ok + one_shot.failures["gave_up"] == 20
    assert one_shot.failures["gave_up"] >= 10
    assert one_shot.retries == 0
    assert patient.ok == 20
    assert patient.retries > 0


def test_the_oracle_admits_at_the_end_of_an_outage() -> None:
    """After an outage the burst rule allows its floor at once (the window before was
    empty), so the oracle's first admission after the outage is at its end: it idles no
    window the rules allow (issue 29: it waited one whole burst window)."""
    scenario = sim.load_scenario(
        {
            "provider": {
                "slots": 8,
                "burst": {"window_s": 10, "growth": 2.0, "floor": 4},
                "latency": 1.0,
                "outages": [{"start_s": 5, "end_s": 33}],
            },
            "fleet": {"agents": 20, "calls_per_agent": 3, "ramp_s": 0.5},
        }
    )
    only = sim.resolve_strategies(scenario, only=["oracle"])
    (oracle,) = sim.simulate(scenario, strategies=only).strategies
    assert oracle.failed == 0
    assert oracle.count_429 == 0
    admissions = [
        t
        for (t, n), (_, before) in zip(oracle.in_service[1:], oracle.in_service, strict=False)
        if n > before
    ]
    assert any(t < 5 for t in admissions)
    after = [t for t in admissions if t >= 5]
    assert after[0] == pytest.approx(33.0)
