"""Render a :class:`SimulationResult` in the terminal with rich: a table and a chart.

rich is imported only here and only when a report is printed (the ``cli`` extra); the
simulator itself needs none of it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._chart import chart
from ._provider import KINDS

if TYPE_CHECKING:
    from collections.abc import Callable

    from rich.console import Console
    from rich.table import Table

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


def _summary_columns(*, tokens: bool = False) -> list[tuple[str, Callable[[StrategyResult], str]]]:
    """The compact table's columns: what decides between strategies, in 80 columns."""
    columns: list[tuple[str, Callable[[StrategyResult], str]]] = [
        ("lost", lambda s: _count(s.failed)),
        ("makespan", lambda s: _seconds(s.makespan_s)),
    ]
    if tokens:
        columns.append(("tokens/s", lambda s: f"{s.tokens_per_s or 0:,.0f}"))
    else:
        columns.append(("÷ bound", lambda s: _ratio(s.ratio, 1.10, 1.5)))
    return [
        *columns,
        ("÷ oracle", lambda s: _ratio(s.oracle_ratio, 1.05, 1.3)),
        (
            "got 429",
            lambda s: f"[{'green' if s.rate_429 < 0.01 else 'red'}]{s.rate_429:.1%}[/]",
        ),
        ("attempts", lambda s: str(s.attempts)),
    ]


def _detail_columns() -> list[tuple[str, Callable[[StrategyResult], str]]]:
    """The details table's columns: why calls were lost, what was rejected, how long."""
    return [
        ("lost by cause", _causes),
        ("rejections", _rejects),
        ("latency p50/95", lambda s: f"{s.latency.p50:.1f}/{s.latency.p95:.1f}"),
    ]


def _table(title: str, rows: list[StrategyResult], columns: Any) -> Table:
    from rich import box
    from rich.table import Table

    table = Table(title=title, title_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("strategy", style="bold", no_wrap=True)
    for label, _ in columns:
        table.add_column(label, justify="left" if label == "lost by cause" else "right")
    for strategy in rows:
        table.add_row(strategy.name, *(cell(strategy) for _, cell in columns))
    return table


def print_report(
    result: SimulationResult,
    console: Console,
    *,
    description: str = "",
    details: bool = False,
    show_chart: bool = True,
) -> None:
    """Print the report to ``console``, readable in 80 columns.

    First a compact table (lost calls, makespan, ratios, 429 share, attempts: what decides
    between strategies) and the bound; with ``details``, also why calls were lost, the
    rejections by kind, latency, one line per strategy saying what it does, and (unless
    ``show_chart`` is false) the chart. ``--json`` has everything regardless.
    """
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
    if description:
        console.print(Text(description, style="dim"))
    tokens = any(s.tokens_per_s for s in result.strategies)
    title = f"{result.scenario} (seed {result.seed}, {result.calls} calls)"
    console.print(_table(title, list(result.strategies), _summary_columns(tokens=tokens)))
    console.print(
        Text(
            f"lower bound {_seconds(bound.seconds)}, set by {bound.binding} ("
            + ", ".join(parts)
            + "); makespan = until the last call ended, lost or not; — = calls were lost, "
            "so no ratio.",
            style="dim",
        )
    )
    if not details:
        console.print(
            Text(
                "--details: why calls were lost, rejections, latency, each strategy's "
                "settings and the chart; --json: everything.",
                style="dim",
            )
        )
        return
    console.print()
    console.print(_table("details", list(result.strategies), _detail_columns()))
    console.print(
        Text(
            "rejections: b burst rate, r RPM, t TPM, i input TPM, u output TPM, "
            "c concurrency (429), o overloaded (503/529), q queue full (503)",
            style="dim",
        )
    )
    console.print()
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
