"""Reporting: percentiles, time bucketing, the text chart, the rich table, JSON and the plot."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from anygate import ConfigError
from anygate.sim._chart import area_rows, chart, sparkline
from anygate.sim._results import Percentiles, SimulationResult, StrategyResult, series
from anygate.sim._workload import LowerBound

if TYPE_CHECKING:
    from pathlib import Path


def _result(
    name: str,
    in_service: tuple[tuple[float, int], ...],
    rejects: tuple[tuple[float, str], ...] = (),
    *,
    ok: int = 10,
) -> StrategyResult:
    return StrategyResult(
        name=name,
        summary=f"{name} strategy",
        makespan_s=in_service[-1][0],
        ratio=1.25 if ok == 10 else None,
        calls=10,
        ok=ok,
        failures={} if ok == 10 else {"gave_up": 10 - ok},
        responses={"ok": ok, "burst": len(rejects), "rpm": 0, "concurrency": 0},
        calls_with_429=len(rejects),
        attempts=ok + len(rejects),
        retries=len(rejects),
        breaker_trips=0,
        max_concurrency=max(n for _, n in in_service),
        latency=Percentiles(1.0, 2.0, 3.0),
        slot_wait=Percentiles(0.0, 0.5, 0.7),
        in_service=in_service,
        rejects=rejects,
        oracle_ratio=1.1 if ok == 10 else None,
    )


def _simulation() -> SimulationResult:
    bound = LowerBound(
        seconds=8.0, binding="slots", slots_s=8.0, chain_s=4.0, rpm_s=None, burst_s=None
    )
    steady = _result("steady", ((0.0, 0), (0.0, 2), (10.0, 0)))
    stormy = _result(
        "stormy", ((0.0, 0), (0.0, 4), (5.0, 1), (10.0, 0)), ((1.0, "burst"), (1.5, "burst")), ok=8
    )
    return SimulationResult(
        scenario="test", seed=1, calls=10, bound=bound, strategies=(steady, stormy)
    )


def test_percentiles_are_nearest_rank() -> None:
    """p50/p95/p99 pick actual samples by nearest rank; no samples give zeros."""
    values = [float(v) for v in range(1, 101)]
    assert Percentiles.of(values) == Percentiles(50.0, 95.0, 99.0)
    assert Percentiles.of([3.0]) == Percentiles(3.0, 3.0, 3.0)
    assert Percentiles.of([]) == Percentiles(0.0, 0.0, 0.0)


def test_series_is_a_time_weighted_mean() -> None:
    """4 in service for 5 s then 1 for 5 s: buckets of 5 s hold means 4 and 1."""
    result = _simulation().strategies[1]
    bucketed = series(result, horizon=10.0, buckets=2)
    assert bucketed.in_flight == (4.0, 1.0)
    assert bucketed.rejected_429 == (2, 0)
    finer = series(result, horizon=10.0, buckets=4)  # buckets of 2.5 s
    assert finer.in_flight == (4.0, 4.0, 1.0, 1.0)
    odd = series(result, horizon=10.0, buckets=3)  # 3.33 s: one bucket spans the drop
    assert odd.in_flight[1] == pytest.approx((1.67 * 4 + 1.67 * 1) / 3.33, rel=0.01)


def test_area_rows_resolve_eighths() -> None:
    """Two rows of eighths: a full value fills both, a half fills the bottom, a quarter half of it."""
    rows = area_rows([8.0, 4.0, 2.0, 0.0], top=8.0, height=2)
    assert rows == ["█   ", "██▄ "]


def test_sparkline_shows_any_nonzero_value() -> None:
    """A single rejection among hundreds still shows as the lowest block, zero as blank."""
    assert sparkline([0, 1, 400, 200], top=400) == " ▁█▄"
    assert sparkline([0, 0], top=0) == "  "


def test_chart_shares_scales_and_axis() -> None:
    """Every strategy gets area rows, a 429 row and an axis of the same width."""
    panels = chart(_simulation(), width=20, height=3)
    assert len(panels) == 2
    for rows in panels:
        kinds = [row.kind for row in rows]
        assert kinds == ["in_flight"] * 3 + ["429", "axis"]
        assert {len(row.cells) for row in rows} == {20}
    steady, stormy = panels
    # stormy reached 4, the shared top: its first columns fill the top row; steady's 2 do not.
    assert stormy[0].cells.startswith("█")
    assert steady[0].cells.strip() == ""
    assert steady[3].cells.strip() == ""
    assert stormy[3].cells.startswith("  ██ ")  # one 429 at 1.0 s, one at 1.5 s, of 10 s
    assert steady[4].cells.startswith("0s")
    assert steady[4].cells.endswith("10s")


def test_print_report_shows_every_strategy_and_metric() -> None:
    """The table lists each strategy, its lost calls by cause, both ratios (none for the one
    that lost calls) and the bound; the chart follows."""
    pytest.importorskip("rich")
    from rich.console import Console

    console = Console(record=True, width=80, color_system=None)
    from anygate.sim._report import print_report

    print_report(_simulation(), console, description="a test scenario", details=True)
    text = console.export_text()
    stormy_row = next(line for line in text.splitlines() if line.lstrip("│ ").startswith("stormy"))
    assert "—" in stormy_row
    assert "1.25x" not in stormy_row
    for needle in (
        "a test scenario",
        "steady",
        "stormy",
        "1.25x",
        "1.10x",
        "gave up 2",
        "b2",
        "lower bound 8.0s, set by slots",
        "latency p50/95",
        "stormy: stormy strategy",
        "in service (max 4)",
    ):
        assert needle in text, needle


def test_to_dict_is_json_ready() -> None:
    """The JSON form holds every metric and bucketed series, and round-trips through json."""
    data = json.loads(json.dumps(_simulation().to_dict(buckets=5)))
    assert data["lower_bound"]["binding"] == "slots"
    stormy = data["strategies"][1]
    assert stormy["failed"] == 2
    assert stormy["rate_429"] == pytest.approx(0.2)
    assert len(stormy["series"]["in_flight"]) == 5
    assert "in_service" not in stormy


def test_plot_writes_svg(tmp_path: Path) -> None:
    """--plot draws one panel per strategy into the requested file type."""
    pytest.importorskip("matplotlib")
    from anygate.sim._plot import write_plot

    target = write_plot(_simulation(), tmp_path / "storm.svg", buckets=10)
    text = target.read_text()
    assert text.lstrip().startswith("<?xml")
    assert "stormy" in text


def test_plot_rejects_unknown_suffix(tmp_path: Path) -> None:
    """An unsupported file type is a ConfigError naming --plot, before anything is drawn."""
    from anygate.sim._plot import write_plot

    with pytest.raises(ConfigError, match=r"--plot must end in"):
        write_plot(_simulation(), tmp_path / "storm.gif")
