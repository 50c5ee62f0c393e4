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

    from ._results import SimulationResult, StrategyResult

__all__ = ["print_report"]

_ROW_STYLES = {"in_flight": "cyan", "429": "red", "503": "magenta", "axis": "dim"}


def _seconds(value: float) -> str:
    return f"{value:.1f}s" if value < 100 else f"{value:.0f}s"


def _ratio(value: float | None, good: float, fair: float) -> str:
    # A strategy that lost calls finished less work: no ratio (the lost column says why).
    if value is None:
        return "[red]—[/]"
    style = "green" if value <= good else ("yellow" if value <= fair else "red")
    return f"[{style}]{value:.2f}x[/]"


def _count(value: int, *, bad: bool = True) -> str:
    return f"[red]{value}[/]" if value and bad else str(value)


def _causes(s: StrategyResult) -> str:
    return ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in s.failures.items()) or ""


def _rejects(s: StrategyResult) -> str:
    short = {
        "burst": "b",
        "rpm": "r",
        "tpm": "t",
        "itpm": "i",
        "otpm": "u",
        "concurrency": "c",
        "overloaded": "o",
        "queue_full": "q",
    }
    parts = [f"{short[k]}{s.responses[k]}" for k in KINDS if s.responses.get(k)]
    return " ".join(parts) or "0"


def _cuts(s: StrategyResult) -> str:
    if not s.limit_cuts or s.lowest_limit is None:
        return "0"
    return f"{s.limit_cuts} (to {s.lowest_limit:g})"


def _columns(*, tokens: bool = False) -> list[tuple[str, Callable[[StrategyResult], str]]]:
    columns: list[tuple[str, Callable[[StrategyResult], str]]] = [
        ("lost", lambda s: _count(s.failed)),
        ("lost by cause", _causes),
        ("makespan", lambda s: _seconds(s.makespan_s)),
    ]
    if tokens:
        columns.append(("tokens/s", lambda s: f"{s.tokens_per_s or 0:,.0f}"))
    return [
        *columns,
        ("÷ bound", lambda s: _ratio(s.ratio, 1.10, 1.5)),
        ("÷ oracle", lambda s: _ratio(s.oracle_ratio, 1.05, 1.3)),
        (
            "got 429",
            lambda s: f"[{'green' if s.rate_429 < 0.01 else 'red'}]{s.rate_429:.1%}[/]",
        ),
        ("rejections", _rejects),
        ("attempts", lambda s: str(s.attempts)),
        ("latency p50/95", lambda s: f"{s.latency.p50:.1f}/{s.latency.p95:.1f}"),
    ]


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
    if bound.outage_s:
        parts.append(f"outages add {_seconds(bound.outage_s)}")
    if bound.rpm_s is not None:
        parts.append(f"RPM {_seconds(bound.rpm_s)}")
    if bound.burst_s is not None:
        parts.append(f"burst slope {_seconds(bound.burst_s)}")
    if bound.tokens_s is not None:
        parts.append(f"token buckets {_seconds(bound.tokens_s)}")
    table = Table(
        title=f"anygate simulate: {result.scenario} (seed {result.seed}, {result.calls} calls)",
        caption=f"lower bound {_seconds(bound.seconds)}, set by {bound.binding} ("
        + ", ".join(parts)
        + "); makespan = until the last call ended, lost or not; — = calls were lost, "
        "so no ratio; rejections: b burst rate, r RPM, t TPM, i input TPM, u output TPM, "
        "c concurrency (429), o overloaded (503/529), q queue full (503)",
        title_style="bold",
    )
    table.add_column("strategy", style="bold", no_wrap=True)
    columns = _columns(tokens=any(s.tokens_per_s for s in result.strategies))
    for label, _ in columns:
        table.add_column(label, justify="left" if label == "lost by cause" else "right")
    for strategy in result.strategies:
        table.add_row(strategy.name, *(cell(strategy) for _, cell in columns))
    if description:
        console.print(Text(description, style="dim"))
    console.print(table)
    for strategy in result.strategies:
        line = strategy.summary
        if strategy.breaker_trips or strategy.limit_cuts:
            line += f" [breaker trips {strategy.breaker_trips}, adaptive cuts {_cuts(strategy)}]"
        console.print(Text.assemble((f"{strategy.name}: ", "bold"), line))
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
