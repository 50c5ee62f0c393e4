"""Render a :class:`SimulationResult` in the terminal with rich: a table and a chart.

rich is imported only here and only when a report is printed (the ``cli`` extra); the
simulator itself needs none of it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._chart import chart
from ._provider import KINDS

if TYPE_CHECKING:
    from collections.abc import Callable

    from rich.console import Console

    from ._results import Percentiles, SimulationResult, StrategyResult

__all__ = ["print_report"]

_ROW_STYLES = {"in_flight": "cyan", "429": "red", "503": "magenta", "axis": "dim"}


def _seconds(value: float) -> str:
    return f"{value:.1f}s" if value < 100 else f"{value:.0f}s"


def _triple(p: Percentiles) -> str:
    return f"{p.p50:.1f}/{p.p95:.1f}/{p.p99:.1f}"


def _ratio(s: StrategyResult) -> str:
    style = "green" if s.ratio <= 1.10 else ("yellow" if s.ratio <= 1.5 else "red")
    # A strategy that dropped calls finished less work: its makespan flatters it.
    return f"[{style}]{s.ratio:.2f}x[/]" + ("*" if s.failed else "")


def _count(value: int, *, bad: bool = True) -> str:
    return f"[red]{value}[/]" if value and bad else str(value)


def _response_count(kind: str) -> Callable[[StrategyResult], str]:
    return lambda s: str(s.responses.get(kind, 0))


def _failure_count(reason: str) -> Callable[[StrategyResult], str]:
    return lambda s: str(s.failures.get(reason, 0))


_KIND_LABELS = {
    "burst": "  429 burst rate",
    "rpm": "  429 RPM",
    "concurrency": "  429 concurrency",
    "overloaded": "  503 overloaded",
    "queue_full": "  503 queue full",
}


def _cuts(s: StrategyResult) -> str:
    if not s.limit_cuts or s.lowest_limit is None:
        return "0"
    return f"{s.limit_cuts} (to {s.lowest_limit:g})"


def _rows(result: SimulationResult) -> list[tuple[str, Callable[[StrategyResult], str]]]:
    strategies = result.strategies
    rows: list[tuple[str, Callable[[StrategyResult], str]]] = [
        ("makespan", lambda s: _seconds(s.makespan_s)),
        ("÷ lower bound", _ratio),
        ("calls ok", lambda s: str(s.ok)),
        ("calls failed", lambda s: _count(s.failed)),
    ]
    reasons = sorted({r for s in strategies for r in s.failures})
    rows.extend((f"  {r.replace('_', ' ')}", _failure_count(r)) for r in reasons)
    rows.append(
        (
            "calls that got 429",
            lambda s: f"[{'green' if s.rate_429 < 0.01 else 'red'}]{s.rate_429:.1%}[/]",
        )
    )
    rows.extend(
        (_KIND_LABELS[kind], _response_count(kind))
        for kind in KINDS
        if any(s.responses.get(kind) for s in strategies)
    )
    rows += [
        ("attempts", lambda s: str(s.attempts)),
        ("retries", lambda s: str(s.retries)),
        ("breaker trips", lambda s: str(s.breaker_trips)),
    ]
    if any(s.limit_cuts for s in strategies):
        rows.append(("adaptive limit cuts", _cuts))
    rows += [
        ("max concurrency", lambda s: str(s.max_concurrency)),
        ("latency p50/95/99", lambda s: _triple(s.latency)),
        ("slot wait p50/95/99", lambda s: _triple(s.slot_wait)),
    ]
    return rows


def print_report(
    result: SimulationResult,
    console: Console,
    *,
    description: str = "",
    show_chart: bool = True,
) -> None:
    """Print the comparison table, then (optionally) the chart, to ``console``."""
    from rich.table import Table
    from rich.text import Text

    bound = result.bound
    parts = [f"slots {_seconds(bound.slots_s)}", f"longest chain {_seconds(bound.chain_s)}"]
    if bound.rpm_s is not None:
        parts.append(f"RPM {_seconds(bound.rpm_s)}")
    if bound.burst_s is not None:
        parts.append(f"burst slope {_seconds(bound.burst_s)}")
    table = Table(
        title=f"anygate simulate: {result.scenario} (seed {result.seed}, {result.calls} calls)",
        caption=f"lower bound {_seconds(bound.seconds)}, set by {bound.binding} ("
        + ", ".join(parts)
        + "); times in seconds"
        + (
            "; * failed calls shorten the makespan"
            if any(s.failed for s in result.strategies)
            else ""
        ),
        title_style="bold",
    )
    table.add_column("", style="bold")
    for strategy in result.strategies:
        table.add_column(strategy.name, justify="right")
    for label, cell in _rows(result):
        table.add_row(label, *(cell(s) for s in result.strategies))
    if description:
        console.print(Text(description, style="dim"))
    console.print(table)
    for strategy in result.strategies:
        console.print(Text.assemble((f"{strategy.name}: ", "bold"), strategy.summary))
    if not show_chart:
        return
    label_width = 24
    width = max(20, min(120, console.width - label_width - 2))
    console.print()
    for strategy, rows in zip(result.strategies, chart(result, width=width), strict=True):
        console.print(Text(strategy.name, style="bold"))
        for row in rows:
            console.print(
                Text.assemble(
                    (f"{row.label:>{label_width}} ", "dim"),
                    (row.cells, _ROW_STYLES[row.kind]),
                ),
                no_wrap=True,
                overflow="crop",
            )
