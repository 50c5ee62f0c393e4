"""Scenario files are validated strictly, and errors name the key path, value and rule."""

from __future__ import annotations

import itertools
import random
from typing import TYPE_CHECKING, Any

import pytest

import anygate
from anygate import ConfigError, sim
from anygate.sim._parse import parse_scenario
from anygate.sim._provider import ProviderModel
from anygate.sim._scenarios import builtin_policy, deep_merge
from anygate.sim._spec import DEFAULT_STRATEGIES, BurstRule, Lognormal, ProviderSpec, SharedPool

if TYPE_CHECKING:
    from pathlib import Path

pytest.importorskip("yaml")


@pytest.mark.parametrize(
    ("data", "path", "message"),
    [
        ({"provider": {"slots": 0}}, "provider.slots", "an integer >= 1 (got 0)"),
        ({"provider": {"slots": True}}, "provider.slots", "an integer >= 1 (got True)"),
        ({"provider": {"on_full": "drop"}}, "provider.on_full", '"reject" or "queue"'),
        ({"provider": {"rpm": -5}}, "provider.rpm", "an integer >= 1 (got -5)"),
        ({"provider": {"burst": {"growth": 0.5}}}, "provider.burst.growth", ">= 1"),
        ({"provider": {"burst": {"window_s": 0}}}, "provider.burst.window_s", "> 0"),
        ({"provider": {"burst": {"floor": 0}}}, "provider.burst.floor", ">= 1"),
        ({"provider": {"latency": {"sigma": -1}}}, "provider.latency.sigma", ">= 0 (got -1.0)"),
        (
            {"provider": {"latency": {"min_s": 5, "max_s": 2}}},
            "provider.latency.max_s",
            ">= min_s (5)",
        ),
        (
            {"provider": {"latency": {"median_s": float("nan")}}},
            "provider.latency.median_s",
            "finite",
        ),
        ({"provider": {"retry_after_s": "soon"}}, "provider.retry_after_s", "a number"),
        ({"provider": {"max_queue": 3}}, "provider.max_queue", 'unless on_full is "queue"'),
        (
            {"provider": {"outages": [{"start_s": 10, "end_s": 5}]}},
            "provider.outages[0].end_s",
            "> start_s (10)",
        ),
        ({"provider": {"outages": {"start_s": 1}}}, "provider.outages", "a list"),
        ({"provider": {"slotz": 3}}, "provider.slotz", "not a known key"),
        ({"fleet": {"agents": "many"}}, "fleet.agents", "an integer >= 1"),
        ({"fleet": {"ramp_s": -1}}, "fleet.ramp_s", ">= 0"),
        (
            {"fleet": {"calls_per_agent": 2, "fanout": {"after_call": 3}}},
            "fleet.fanout.after_call",
            "<= calls_per_agent (2)",
        ),
        ({"fleet": {"call_deadline_s": 0}}, "fleet.call_deadline_s", "> 0"),
        ({"fleet": []}, "fleet", "a mapping"),
        ({"seed": -1}, "seed", "an integer >= 0"),
        ({"time_limit_s": 0}, "time_limit_s", "> 0"),
        ({"name": ""}, "name", "a non-empty string"),
        ({"providers": {}}, "providers", "not a known key"),
        ({"strategies": {"mine": {}}}, "strategies.mine", "{naive: {...}}, {policy:"),
        (
            {"strategies": {"mine": {"naive": {}, "policy": {}}}},
            "strategies.mine",
            "not both",
        ),
        ({"strategies": {"seed": {"naive": {}}}}, "strategies.seed.naive", "policy strategy"),
        (
            {"strategies": {"slow": {"naive": {"factor": 0.5}}}},
            "strategies.slow.naive.factor",
            ">= 1",
        ),
        (
            {"strategies": {"slow": {"naive": {"retries": 3}}}},
            "strategies.slow.naive.retries",
            "not a known key",
        ),
    ],
)
def test_bad_values_name_the_key(data: dict[str, Any], path: str, message: str) -> None:
    """Each invalid value raises ConfigError with the dotted path, the rule and the value."""
    with pytest.raises(ConfigError) as info:
        parse_scenario(data)
    assert info.value.path == path
    assert path in str(info.value)
    assert message in str(info.value)


def test_defaults_and_shorthands() -> None:
    """An empty scenario is valid; a bare number is a constant duration; 0 means no limit."""
    scenario = parse_scenario({"provider": {"latency": 3, "rpm": 0, "burst": {}}})
    assert scenario.provider.latency == Lognormal(median_s=3.0)
    assert scenario.provider.rpm is None
    assert scenario.provider.burst == BurstRule(window_s=10.0, growth=2.0, floor=20)
    assert scenario.fleet.total_calls == 100 * 5


@pytest.mark.parametrize("name", sim.builtin_scenarios())
def test_builtin_scenarios_are_valid(name: str) -> None:
    """Every shipped scenario parses, names itself and describes what it shows."""
    scenario = sim.load_scenario(name)
    assert scenario.name
    assert len(scenario.description) > 40
    for spec in sim.resolve_strategies(scenario):
        if spec.policy is not None:
            anygate.load_config(spec.policy)


def test_default_scenario_is_first_and_morning_peak() -> None:
    """`anygate simulate` without arguments runs the morning peak."""
    assert sim.builtin_scenarios()[0] == sim.DEFAULT_SCENARIO == "morning-peak"


@pytest.mark.parametrize("name", ["seed", "anygate"])
def test_builtin_policy_configs_validate(name: str) -> None:
    """The shipped seed/anygate configs pass the policy's own loader unchanged."""
    config = anygate.load_config(builtin_policy(name))
    assert config.name == name


def test_seed_config_is_deer_flow_defaults() -> None:
    """The seed strategy is deer-flow's shipped retry settings with a fixed cap."""
    config = anygate.load_config(builtin_policy("seed"))
    retry = config.retry
    assert (retry.max_attempts, retry.base_delay_ms, retry.cap_delay_ms) == (3, 1000, 8000)
    assert retry.burst_base_delay_ms == 5000
    assert dict(retry.reason_budgets) == {"burst_rate": 2}
    assert config.max_concurrent_calls == 32
    assert config.circuit_breaker.failure_threshold == 5
    assert config.circuit_breaker.recovery_timeout_sec == 60


def test_unknown_scenario_name_lists_the_known_ones() -> None:
    """A typo in a scenario name says which names exist."""
    with pytest.raises(ConfigError, match="morning-peak"):
        sim.load_scenario("morning")


def test_scenario_file_with_relative_policy_path(tmp_path: Path) -> None:
    """A strategy's policy file path is resolved against the scenario file's directory."""
    (tmp_path / "mine.yaml").write_text("llm_call:\n  max_concurrent_calls: 4\n")
    (tmp_path / "s.yaml").write_text("strategies:\n  mine:\n    policy: mine.yaml\n")
    scenario = sim.load_scenario(tmp_path / "s.yaml")
    (mine,) = (s for s in scenario.strategies if s.name == "mine")
    assert mine.policy == {"llm_call": {"max_concurrent_calls": 4}}
    assert mine.replace


def test_missing_policy_file_is_a_config_error(tmp_path: Path) -> None:
    """An unreadable strategy file is reported with the key that named it."""
    (tmp_path / "s.yaml").write_text("strategies:\n  mine:\n    policy: nowhere.yaml\n")
    with pytest.raises(ConfigError, match=r"strategies\.mine\.policy.*nowhere\.yaml"):
        sim.load_scenario(tmp_path / "s.yaml")


def test_overrides_merge_over_the_builtin_config() -> None:
    """A scenario's seed/anygate override changes only the keys it names."""
    scenario = parse_scenario(
        {"strategies": {"seed": {"policy": {"llm_call": {"max_concurrent_calls": 2}}}}}
    )
    seed = next(s for s in sim.resolve_strategies(scenario) if s.name == "seed")
    assert seed.policy == deep_merge(
        builtin_policy("seed"), {"llm_call": {"max_concurrent_calls": 2}}
    )
    assert seed.policy is not None
    assert seed.policy["llm_call"]["retry_max_attempts"] == 3


def test_resolve_strategies_order_config_and_only(tmp_path: Path) -> None:
    """Built-ins first, then scenario strategies, then extras; --config replaces anygate."""
    mine = tmp_path / "mine.yaml"
    mine.write_text("llm_call: {max_concurrent_calls: 3}\n")
    scenario = parse_scenario({"strategies": {"slow": {"naive": {"base_delay_s": 5}}}})
    names = [s.name for s in sim.resolve_strategies(scenario, extra=[("x", mine)])]
    assert names == [*DEFAULT_STRATEGIES, "slow", "x"]
    assert "cookbook" in [s.name for s in sim.resolve_strategies(scenario, only=["all"])]
    (chosen,) = sim.resolve_strategies(scenario, config=mine, only=["anygate"])
    assert chosen.policy == {"llm_call": {"max_concurrent_calls": 3}}
    with pytest.raises(ConfigError, match="--only"):
        sim.resolve_strategies(scenario, only=["nope"])
    with pytest.raises(ConfigError, match="--strategy"):
        sim.resolve_strategies(scenario, extra=[("seed", mine)])


def test_dynamic_growth_drifts_within_its_range_along_a_seeded_path() -> None:
    """The growth factor starts at ``growth``, moves by at most ``drift`` per window, stays
    in [growth_min, growth_max], and the same generator seed gives the same path."""
    rule = BurstRule(window_s=10, growth=2.0, floor=5, growth_min=1.5, growth_max=2.5, drift=0.3)
    spec = ProviderSpec(burst=rule)

    def path(seed: int) -> list[float]:
        model = ProviderModel(spec, random.Random(0), growth_rng=random.Random(seed))
        return [model.growth(k) for k in range(200)]

    first = path(1)
    assert first[0] == 2.0
    assert all(1.5 <= g <= 2.5 for g in first)
    assert all(abs(b - a) <= 0.3 + 1e-12 for a, b in itertools.pairwise(first))
    assert len(set(first)) > 50
    assert path(1) == first != path(2)
    fixed = ProviderModel(
        ProviderSpec(burst=BurstRule(window_s=10, growth=2.0, floor=5)), random.Random(0)
    )
    assert {fixed.growth(k) for k in range(20)} == {2.0}


@pytest.mark.parametrize(
    ("data", "path", "message"),
    [
        ({"published": {"rpm": -1}}, "published.rpm", ">= 1"),
        ({"published": {"slots": 3}}, "published.slots", "not a known key"),
        ({"fleet": {"on_failure": "retry"}}, "fleet.on_failure", '"stop" or "continue"'),
        (
            {"provider": {"burst": {"growth_min": 1.5}}},
            "provider.burst.growth_max",
            "set too",
        ),
        (
            {"provider": {"burst": {"growth": 4, "growth_min": 1, "growth_max": 3, "drift": 1}}},
            "provider.burst.growth",
            "within [growth_min, growth_max]",
        ),
        (
            {"provider": {"burst": {"count_rejected": "yes"}}},
            "provider.burst.count_rejected",
            "true or false",
        ),
        (
            {"strategies": {"mine": {"factory": "no-colon"}}},
            "strategies.mine.factory",
            "module:attribute",
        ),
        ({"strategies": {"sdk": {"naive": {}}}}, "strategies.sdk", "built-in peer"),
        ({"provider": {"shared_pool": {}}}, "provider.shared_pool.probability", "set"),
        (
            {"provider": {"shared_pool": {"probability": 1.0}}},
            "provider.shared_pool.probability",
            "> 0 and < 1",
        ),
        (
            {"provider": {"shared_pool": {"probability": float("nan")}}},
            "provider.shared_pool.probability",
            "finite",
        ),
        (
            {"provider": {"shared_pool": {"probability": 0}}},
            "provider.shared_pool.probability",
            "> 0",
        ),
        (
            {"provider": {"shared_pool": {"probability": 0.1, "kind": "queue_full"}}},
            "provider.shared_pool.kind",
            '"burst", "rpm" or "overloaded"',
        ),
        (
            {"provider": {"shared_pool": {"probability": 0.1, "share": 2}}},
            "provider.shared_pool.share",
            "not a known key",
        ),
    ],
)
def test_new_keys_are_validated(data: dict[str, Any], path: str, message: str) -> None:
    """published, fleet.on_failure, the dynamic burst keys and factory entries are checked
    like every other key: the error names the path and the rule."""
    with pytest.raises(ConfigError) as info:
        parse_scenario(data)
    assert info.value.path == path
    assert message in str(info.value)


def test_new_keys_parse() -> None:
    """Valid published facts, on_failure and a dynamic, counting burst rule come through."""
    scenario = parse_scenario(
        {
            "published": {"rpm": 600, "concurrency": 0},
            "fleet": {"on_failure": "continue"},
            "provider": {
                "burst": {
                    "growth": 2,
                    "growth_min": 1.5,
                    "growth_max": 3,
                    "drift": 0.25,
                    "count_rejected": True,
                }
            },
        }
    )
    assert scenario.published == sim.Published(rpm=600, concurrency=None)
    assert scenario.fleet.on_failure == "continue"
    burst = scenario.provider.burst
    assert burst is not None
    assert burst.dynamic
    assert burst.count_rejected
    assert burst.highest_growth == 3
    pool = parse_scenario({"provider": {"shared_pool": {"probability": 0.05}}}).provider
    assert pool.shared_pool == SharedPool(probability=0.05, kind="burst")
