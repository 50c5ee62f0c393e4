"""The ``anygate`` command line: simulate (table, chart, JSON, plot) and check-config."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from anygate.cli import main
from anygate.sim._spec import DEFAULT_STRATEGIES

if TYPE_CHECKING:
    from pathlib import Path

pytest.importorskip("trio")
pytest.importorskip("yaml")
pytest.importorskip("rich")

SCENARIO = """\
name: tiny
seed: 3
provider:
  slots: 3
  burst: {window_s: 5, growth: 2, floor: 4}
  latency: {median_s: 1.0, sigma: 0.4}
fleet:
  agents: 8
  calls_per_agent: 2
strategies:
  seed:
    policy:
      llm_call: {max_concurrent_calls: 3}
"""


@pytest.fixture
def scenario(tmp_path: Path) -> Path:
    """A small scenario file that simulates in a fraction of a second."""
    path = tmp_path / "tiny.yaml"
    path.write_text(SCENARIO)
    return path


def test_simulate_prints_a_compact_table_and_details_on_request(
    scenario: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """By default a compact report (scenario, every strategy, the bound) in 80 columns and
    a few dozen lines; ``--details`` adds causes, rejections, settings and the chart, still
    in 80 columns (issue 28: headers were cut to ``mak…`` below 120 columns)."""
    assert main(["simulate", str(scenario)]) == 0
    out = capsys.readouterr().out
    for needle in ("tiny", "naive", "seed", "anygate", "lower bound", "makespan", "÷ oracle"):
        assert needle in out, needle
    assert "in service" not in out
    assert "…" not in out
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert len(lines) <= 40
    assert main(["simulate", str(scenario), "--details"]) == 0
    details = capsys.readouterr().out
    for needle in ("lost by cause", "rejections", "latency p50/95", "in service", "429s ("):
        assert needle in details, needle
    assert "…" not in details
    assert max(len(line) for line in details.splitlines()) <= 80


def test_simulate_json_to_stdout(scenario: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--json alone prints only JSON on stdout: the metrics of every strategy."""
    assert main(["simulate", str(scenario), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["scenario"] == "tiny"
    assert data["seed"] == 3
    assert [s["name"] for s in data["strategies"]] == list(DEFAULT_STRATEGIES)
    assert data["lower_bound"]["seconds"] > 0
    for strategy in data["strategies"]:
        assert strategy["ok"] + strategy["failed"] == data["calls"] == 16
        # The JSON contract scripts depend on (issue 8).
        contract = {"name", "makespan_s", "ok", "failed", "rate_429", "calls_with_429"}
        assert contract | {"lost", "oracle_ratio", "ratio", "series"} <= set(strategy)
        assert sum(strategy["lost"].values()) == strategy["failed"]
        if strategy["failed"]:
            assert strategy["ratio"] is None
            assert strategy["oracle_ratio"] is None


def test_simulate_json_file_seed_only_and_extra_strategy(
    scenario: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--json FILE keeps the table; --seed overrides; --strategy adds; --only selects and orders."""
    mine = tmp_path / "mine.yaml"
    mine.write_text("llm_call: {max_concurrent_calls: 1}\n")
    out_file = tmp_path / "out.json"
    argv = ["simulate", str(scenario), "--seed", "9", "--json", str(out_file), "--no-chart"]
    argv += ["--strategy", f"mine={mine}", "--only", "mine,naive"]
    assert main(argv) == 0
    data = json.loads(out_file.read_text())
    assert data["seed"] == 9
    assert [s["name"] for s in data["strategies"]] == ["mine", "naive"]
    assert data["strategies"][0]["max_concurrency"] == 1
    out = capsys.readouterr().out
    assert "mine" in out
    assert "in service" not in out


def test_simulate_with_user_config(scenario: Path, tmp_path: Path) -> None:
    """--config replaces the anygate strategy's settings."""
    config = tmp_path / "config.yaml"
    config.write_text("llm_call: {max_concurrent_calls: 2}\n")
    out_file = tmp_path / "out.json"
    argv = ["simulate", str(scenario), "--config", str(config), "--json", str(out_file)]
    assert main([*argv, "--only", "anygate", "--no-chart"]) == 0
    (anygate,) = json.loads(out_file.read_text())["strategies"]
    assert anygate["max_concurrency"] == 2
    assert "cap 2" in anygate["summary"]


def test_simulate_plot(scenario: Path, tmp_path: Path) -> None:
    """--plot writes the chart as an image."""
    pytest.importorskip("matplotlib")
    target = tmp_path / "storm.png"
    assert main(["simulate", str(scenario), "--plot", str(target), "--no-chart"]) == 0
    assert target.read_bytes().startswith(b"\x89PNG")


def test_list_scenarios(capsys: pytest.CaptureFixture[str]) -> None:
    """--list names every built-in scenario with its size."""
    assert main(["simulate", "--list"]) == 0
    out = capsys.readouterr().out
    for name in ("morning-peak", "steady", "outage", "local-1-slot"):
        assert name in out


@pytest.mark.parametrize(
    ("argv", "complaint"),
    [
        (["simulate", "nonesuch"], "scenario must be one of"),
        (["simulate", "missing.yaml"], "cannot read"),
        (["simulate", "--strategy", "no-equals-sign"], "NAME=FILE"),
        (["simulate", "--plot", "chart.gif"], "--plot must end in"),
        (["simulate", "--only", "naive,bogus"], "--only names must be among"),
    ],
)
def test_simulate_usage_errors(
    argv: list[str], complaint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Bad arguments exit 2 with a message saying what is wrong."""
    assert main(argv) == 2
    assert complaint in capsys.readouterr().err


def test_bad_scenario_value_names_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An invalid scenario exits 2 naming the key path."""
    path = tmp_path / "bad.yaml"
    path.write_text("provider:\n  slots: -1\n")
    assert main(["simulate", str(path)]) == 2
    assert "provider.slots must be an integer >= 1 (got -1)" in capsys.readouterr().err


def test_check_config_prints_effective_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """check-config validates and prints every effective value, defaults filled in."""
    path = tmp_path / "config.yaml"
    path.write_text("llm_call:\n  max_concurrent_calls: 8\n")
    assert main(["check-config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "valid" in out
    assert "max_concurrent_calls: 8" in out
    assert "retry_max_attempts: 3" in out  # a default, filled in
    # Unset breaker values show the defaults a new breaker gets, with a note, not null.
    assert "failure_threshold: 5\n" in out
    assert "recovery_timeout_sec: 60.0\n" in out
    assert "not set in the file: circuit_breaker.failure_threshold" in out
    # The same for the gate's adaptive limit.
    assert "decrease_factor: 0.8\n" in out
    assert "llm_call.adaptive_concurrency.pause_ms" in out
    assert main(["check-config", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["llm_call"]["max_concurrent_calls"] == 8
    assert data["circuit_breaker"]["failure_threshold"] == 5
    assert data["llm_call"]["adaptive_concurrency"] == {
        "enabled": True,
        "min_concurrent_calls": 1,
        "decrease_factor": 0.8,
        "pause_ms": 5000.0,
        "pace_burst_rate": True,
        "latency": False,
    }


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("llm_call:\n  retry_max_attempts: 0\n", "llm_call.retry_max_attempts"),
        ("llm_call:\n  max_concurent_calls: 4\n", "llm_call.max_concurent_calls"),
        ("circuit_breaker:\n  failure_threshold: many\n", "circuit_breaker.failure_threshold"),
        (
            "llm_call:\n  adaptive_concurrency:\n    decrease_factor: 1.5\n",
            "llm_call.adaptive_concurrency.decrease_factor",
        ),
    ],
)
def test_check_config_errors_name_the_key(
    tmp_path: Path, text: str, key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """check-config exits 2 and the message names the offending key."""
    path = tmp_path / "config.yaml"
    path.write_text(text)
    assert main(["check-config", str(path)]) == 2
    assert key in capsys.readouterr().err


def test_no_command_prints_usage(capsys: pytest.CaptureFixture[str]) -> None:
    """A bare `anygate` shows the usage and exits 2."""
    assert main([]) == 2
    assert "simulate" in capsys.readouterr().err


@pytest.mark.processes
def test_default_simulate_runs_the_morning_peak() -> None:
    """`anygate simulate` with no arguments, as a user runs it, succeeds on the morning peak."""
    env = {**os.environ, "COLUMNS": "100"}
    out = subprocess.run(
        [sys.executable, "-m", "anygate.cli", "simulate"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    assert "morning peak" in out.stdout
    for name in ("naive", "seed", "anygate"):
        assert name in out.stdout
    assert "Traceback" not in out.stderr


def test_plot_without_matplotlib_says_which_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--plot without matplotlib exits 1 at once, naming the extra to install."""
    import importlib.util

    real = importlib.util.find_spec

    def find_spec(name: str, *args: object) -> object:
        return None if name == "matplotlib" else real(name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    assert main(["simulate", "--plot", "storm.png"]) == 1
    assert "anygate[plot]" in capsys.readouterr().err


def test_simulate_strategy_factory_from_the_command_line(
    scenario: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--strategy NAME=module:factory plugs in user code through the strategy protocol; its
    results sit next to the oracle's, with an oracle ratio when it lost nothing."""
    argv = ["simulate", str(scenario), "--strategy", "spy=tests.test_sim_honest:Spy"]
    assert main([*argv, "--only", "spy,oracle", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    spy, oracle = data["strategies"]
    assert spy["name"] == "spy"
    assert spy["summary"] == "spy: one attempt, no retries"
    assert oracle["oracle_ratio"] == 1.0
    assert sum(spy["lost"].values()) == spy["failed"]
    if not spy["failed"]:
        assert spy["oracle_ratio"] == pytest.approx(spy["makespan_s"] / oracle["makespan_s"])
    assert main([*argv[:2], "--strategy", "bad=no_such_module_x:f", "--only", "bad"]) == 2
    assert "cannot load" in capsys.readouterr().err


PUBLISHED = SCENARIO.replace("strategies:", "published: {rpm: 120, concurrency: 3}\nstrategies:")


def test_a_config_file_keeps_the_published_facts_it_leaves_out_and_says_what_it_changes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--config`` (issue 28): keys the file leaves out keep the published concurrency and
    RPM, so a file with nothing in it runs exactly as the built-in ``anygate``; keys it
    states win, and the report says which differ from the built-in and how."""
    monkeypatch.setenv("COLUMNS", "1000")  # long temporary paths, unwrapped
    scenario = tmp_path / "published.yaml"
    scenario.write_text(PUBLISHED)
    builtin_json, empty_json, stated_json = (tmp_path / f"{n}.json" for n in "bes")
    argv = ["simulate", str(scenario), "--only", "anygate"]
    assert main([*argv, "--json", str(builtin_json)]) == 0
    capsys.readouterr()
    empty = tmp_path / "empty.yaml"
    empty.write_text("llm_call: {}\n")
    assert main([*argv, "--config", str(empty), "--json", str(empty_json)]) == 0
    out = capsys.readouterr().out
    assert f"{empty}: the built-in's settings" in " ".join(out.split())
    (builtin,) = json.loads(builtin_json.read_text())["strategies"]
    (same,) = json.loads(empty_json.read_text())["strategies"]
    assert "paced to 120 RPM" in same["summary"]
    for key in ("makespan_s", "ok", "failed", "attempts", "calls_with_429"):
        assert same[key] == builtin[key], key

    stated = tmp_path / "stated.yaml"
    stated.write_text("llm_call: {requests_per_minute: null, retry_max_attempts: 4}\n")
    assert main([*argv, "--config", str(stated), "--json", str(stated_json)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "llm_call.requests_per_minute null (built-in: 120" in out
    assert "llm_call.retry_max_attempts 4 (built-in: 3)" in out
    assert "leave a key out of the file" in out
    (changed,) = json.loads(stated_json.read_text())["strategies"]
    assert "no rate limit" in changed["summary"]
    assert changed["max_concurrency"] <= 3  # the published concurrency, kept
