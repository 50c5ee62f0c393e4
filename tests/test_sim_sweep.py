"""``anygate simulate sweep``: variations x strategies x seeds, aggregated honestly."""

from __future__ import annotations

import json
from typing import Any

import pytest

from anygate import ConfigError
from anygate.cli import main
from anygate.sim._sweep import parse_seeds, parse_vary, run_sweep

pytest.importorskip("trio")
pytest.importorskip("yaml")

TINY: dict[str, Any] = {
    "name": "tiny sweep",
    "provider": {"slots": 2, "latency": 0.5, "burst": {"window_s": 5, "growth": 2, "floor": 4}},
    "fleet": {"agents": 6, "calls_per_agent": 2},
}


def test_parse_vary_and_seeds() -> None:
    """YAML values split on top-level commas only; seed ranges and lists expand in order."""
    assert parse_vary(["provider.slots=1,2", "provider.outages=[],[{start_s: 1, end_s: 2}]"]) == [
        ("provider.slots", [1, 2]),
        ("provider.outages", [[], [{"start_s": 1, "end_s": 2}]]),
    ]
    assert parse_seeds("1-3,7") == [1, 2, 3, 7]
    for bad in ("3-1", "x", "-2"):
        with pytest.raises(ConfigError, match="--seeds"):
            parse_seeds(bad)
    for bad_vary in (["slots"], ["=1"], ["a=1", "a=2"]):
        with pytest.raises(ConfigError, match="--vary"):
            parse_vary(bad_vary)


def test_sweep_rows_ratios_and_lost_work() -> None:
    """2 variations x 2 strategies x 2 seeds: every row has both seeds; the oracle is 1.00x
    of itself; a strategy that lost calls in a seed gets no ratio, only the lost count."""
    result = run_sweep(TINY, parse_vary(["provider.slots=1,2"]), [1, 2], ["sdk", "oracle"], jobs=1)
    assert [(r.variation["provider.slots"], r.strategy) for r in result.rows] == [
        (1, "sdk"),
        (1, "oracle"),
        (2, "sdk"),
        (2, "oracle"),
    ]
    for row in result.rows:
        assert [c.seed for c in row.cells] == [1, 2]
        if row.strategy == "oracle":
            assert row.oracle_ratio == pytest.approx((1.0, 1.0))
            assert row.bound_ratio is not None
            assert row.bound_ratio[0] >= 1.0
        if any(c.failed for c in row.cells):
            assert row.bound_ratio is None
            assert row.oracle_ratio is None
            assert sum(row.lost.values()) == sum(c.failed for c in row.cells)
    sdk_one_slot = result.rows[0]
    assert sum(sdk_one_slot.lost.values()) > 0  # 6 uncapped agents on 1 slot lose calls


def test_sweep_rejects_a_bad_variation_before_running() -> None:
    """An invalid value names the variation and the key."""
    with pytest.raises(ConfigError, match=r"provider\.slots=0.*provider\.slots"):
        run_sweep(TINY, parse_vary(["provider.slots=2,0"]), [1], ["oracle"], jobs=1)


def test_cli_sweep_json(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """simulate sweep FILE --vary --seeds --json: rows with the documented keys; in two
    worker processes the numbers equal the in-process ones."""
    import yaml

    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY))
    argv = ["simulate", "sweep", str(path), "--vary", "provider.slots=1,2", "--seeds", "1-2"]
    argv += ["--only", "sdk+cap,oracle", "--json"]
    assert main([*argv, "--jobs", "2"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["seeds"] == [1, 2]
    assert data["vary"] == {"provider.slots": [1, 2]}
    keys = {
        "variation",
        "strategy",
        "ratio_median",
        "ratio_worst",
        "oracle_ratio_median",
        "oracle_ratio_worst",
        "rate_429_median",
        "rate_429_worst",
        "lost",
        "runs",
    }
    assert all(keys <= set(row) for row in data["rows"])
    assert main([*argv, "--jobs", "1"]) == 0
    assert json.loads(capsys.readouterr().out) == data
    assert main(["simulate", "sweep", str(path), "--seeds", "1", "--only", "oracle"]) == 0
    assert "÷ oracle" in capsys.readouterr().out
