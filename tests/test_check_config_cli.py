"""``anygate check-config`` as a user runs it: the rough edges of issue 15.

Each case runs the real command line (``main`` in-process, or the console module in a
subprocess where the process boundary matters: pipes and missing modules).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import anygate
from anygate.cli import main

pytest.importorskip("yaml")
SRC = Path(anygate.__file__).resolve().parent.parent


def _check(tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    code = main(["check-config", str(path)])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n"])
def test_empty_file_is_reported_as_empty(
    tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """An empty file is not "valid": it states nothing (exit 2, the message says empty)."""
    code, err = _check(tmp_path, text, capsys)
    assert code == 2
    assert "is empty: nothing to check" in err


def test_duplicate_keys_are_rejected(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A key given twice is an error naming both lines, not a silent last-one-wins."""
    code, err = _check(tmp_path, "llm_call:\n  busy_wait_s: 5\n  busy_wait_s: 6\n", capsys)
    assert code == 2
    assert "config.yaml:3: duplicate key 'busy_wait_s' (first at line 2)" in err


def test_every_error_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Four independent mistakes: four error lines and a count, in one run."""
    text = (
        "llm_call:\n  busy_wait_s: -1\n  retry_max_attempts: x\n  retry_max_atempts: 3\n"
        "  rules:\n    - {contains: overloaded}\n"
        "circuit_breaker:\n  failure_threshold: 0\n"
    )
    code, err = _check(tmp_path, text, capsys)
    assert code == 2
    for key in (
        "llm_call.retry_max_atempts",
        "llm_call.busy_wait_s",
        "llm_call.retry_max_attempts",
        "llm_call.rules[0].reason is required",
        "circuit_breaker.failure_threshold",
    ):
        assert key in err, key
    assert "config.yaml: 5 errors" in err


def test_yaml_errors_name_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A YAML syntax error points at the file, line and column, not "<unicode string>"."""
    code, err = _check(tmp_path, "llm_call: [\n", capsys)
    assert code == 2
    assert f'in "{tmp_path / "config.yaml"}", line 2' in err
    assert "<unicode string>" not in err


def test_json_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    """``check-config --json | head`` with the reader gone: no BrokenPipeError traceback."""
    path = tmp_path / "config.yaml"
    path.write_text("llm_call:\n  max_concurrent_calls: 4\n")
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader has already gone, as `head` has after its lines
    try:
        done = subprocess.run(
            [sys.executable, "-m", "anygate.cli", "check-config", "--json", str(path)],
            stdout=write_end,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(SRC)},
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert "Traceback" not in done.stderr, done.stderr
    assert "BrokenPipeError" not in done.stderr
    assert done.returncode == 0


@pytest.mark.parametrize(
    "argv", [["check-config", "config.yaml"], ["simulate", "steady"]], ids=["check", "simulate"]
)
def test_missing_pyyaml_exits_1_for_every_command(tmp_path: Path, argv: list[str]) -> None:
    """Without PyYAML both commands exit 1 (a missing optional dependency) and say what
    to install; check-config used to exit 2, as for an invalid file."""
    (tmp_path / "config.yaml").write_text("llm_call: {}\n")
    code = f"import sys; sys.modules['yaml'] = None; from anygate.cli import main; sys.exit(main({argv!r}))"
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(SRC)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "pip install 'anygate[" in done.stderr


def test_scenario_names_get_did_you_mean(capsys: pytest.CaptureFixture[str]) -> None:
    """A misspelt built-in scenario name suggests the closest one."""
    pytest.importorskip("trio")
    pytest.importorskip("rich")
    assert main(["simulate", "mornin-peak"]) == 2
    assert "did you mean 'morning-peak'?" in capsys.readouterr().err


def test_plot_has_a_legend(tmp_path: Path) -> None:
    """The ``--plot`` image explains its colours: a legend names the line and the bars."""
    matplotlib = pytest.importorskip("matplotlib")
    pytest.importorskip("trio")
    pytest.importorskip("rich")
    target = tmp_path / "storm.svg"
    # Keep text as <text> elements so the test can read the legend.
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        assert (
            main(["simulate", "steady", "--only", "naive", "--plot", str(target), "--no-chart"])
            == 0
        )
    svg = target.read_text("utf-8")
    assert "requests in service (left axis)" in svg
    assert "429 answers per bucket (right axis)" in svg


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "is empty"),
        (
            "llm_call:\n  busy_wait_s: 5\nllm_call:\n  retry_max_attempts: 2\n",
            "duplicate key 'llm_call'",
        ),
    ],
    ids=["empty", "duplicate"],
)
@pytest.mark.parametrize("sweep", [False, True], ids=["run", "sweep"])
def test_simulate_config_goes_through_the_one_loader(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str, sweep: bool
) -> None:
    """``simulate --config`` refuses an empty file and a key given twice, as
    ``check-config`` and ``load_config`` do (issue 28: it used to run with the defaults,
    or with the second ``llm_call:`` only), before simulating anything."""
    pytest.importorskip("trio")
    pytest.importorskip("rich")
    path = tmp_path / "config.yaml"
    path.write_text(text)
    argv = ["simulate", "steady", "--config", str(path)]
    if sweep:
        argv += ["--seeds", "1"]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_simulate_config_reads_exponent_numbers(tmp_path: Path) -> None:
    """A config file with ``1e3`` is simulated with the number (YAML 1.2), the same file
    ``load_config`` accepts; the simulator's own reading of it used to get a string."""
    pytest.importorskip("trio")
    pytest.importorskip("rich")
    from anygate import sim

    path = tmp_path / "config.yaml"
    path.write_text("llm_call:\n  busy_wait_s: 6e1\n  max_concurrent_calls: 4\n")
    scenario = sim.load_scenario("steady")
    (strategy,) = sim.resolve_strategies(scenario, config=str(path), only=["anygate"])
    assert strategy.policy["llm_call"]["busy_wait_s"] == 60.0
    assert (
        main(
            [
                "simulate",
                "steady",
                "--config",
                str(path),
                "--only",
                "anygate",
                "--json",
                str(tmp_path / "out.json"),
            ]
        )
        == 0
    )


def test_simulate_json_into_a_closed_pipe_ends_quietly() -> None:
    """``anygate simulate --json | head`` with the reader gone: no BrokenPipeError
    traceback, exit 0 (issue 28; only check-config handled it before)."""
    pytest.importorskip("trio")
    pytest.importorskip("rich")
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "anygate.cli", "simulate", "steady", "--json"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(SRC)},
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write_end)
    assert "Traceback" not in done.stderr, done.stderr
    assert "BrokenPipeError" not in done.stderr
    assert done.returncode == 0
