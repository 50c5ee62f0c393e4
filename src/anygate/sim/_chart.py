"""Text charts of a run: requests in service and rejections over virtual time, per strategy.

Plain strings of Unicode block characters, one list of rows per strategy, every strategy on
the same time axis and the same vertical scale, so the shapes compare at a glance. Styling
(colours) is the caller's business; this module only computes the glyphs, which keeps it
testable and independent of any terminal library.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._results import SimulationResult, series

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["ChartRow", "area_rows", "chart", "sparkline"]

_EIGHTHS = " ▁▂▃▄▅▆▇█"


@dataclass(frozen=True)
class ChartRow:
    """One line of a chart: a label, the glyphs, and what the glyphs show.

    ``kind`` is ``"in_flight"``, ``"429"``, ``"503"`` or ``"axis"``; the renderer picks a
    colour by it.
    """

    label: str
    cells: str
    kind: str


def area_rows(values: Sequence[float], top: float, height: int) -> list[str]:
    """An area chart ``height`` rows tall (top row first), ``top`` filling every row.

    Each column resolves eighths of a row, so ``height`` rows show ``8 * height`` levels.
    """
    units = [0 if top <= 0 else round(min(v, top) / top * 8 * height) for v in values]
    rows = []
    for row in range(height - 1, -1, -1):
        base = row * 8
        rows.append("".join(_EIGHTHS[min(max(u - base, 0), 8)] for u in units))
    return rows


def sparkline(values: Sequence[float], top: float) -> str:
    """One row; any non-zero value shows at least the lowest block, zero shows blank."""
    if top <= 0:
        return " " * len(values)
    return "".join(
        _EIGHTHS[0 if v <= 0 else max(1, min(8, math.ceil(v / top * 8)))] for v in values
    )


def _axis(horizon: float, width: int) -> str:
    left, right = "0s", f"{horizon:.0f}s"
    middle = f"{horizon / 2:.0f}s"
    line = [" "] * width
    for position, text in ((0, left), (width // 2 - len(middle) // 2, middle)):
        line[position : position + len(text)] = text
    line[width - len(right) :] = right
    return "".join(line[:width])


def chart(result: SimulationResult, *, width: int = 72, height: int = 4) -> list[list[ChartRow]]:
    """Rows for every strategy of ``result``: in-service area, 429s, 503s (if any), axis.

    The in-service scale tops out at the largest concurrency any strategy reached; the
    rejection rows share the largest per-column count of any strategy.
    """
    horizon = result.horizon
    bucketed = [series(s, horizon=horizon, buckets=width) for s in result.strategies]
    top = max((max(b.in_flight, default=0.0) for b in bucketed), default=0.0)
    top429 = max((max(b.rejected_429, default=0) for b in bucketed), default=0)
    top503 = max((max(b.rejected_503, default=0) for b in bucketed), default=0)
    panels = []
    for strategy, buckets in zip(result.strategies, bucketed, strict=True):
        rows = [
            ChartRow(
                label=f"in service (max {strategy.max_concurrency})" if i == 0 else "",
                cells=cells,
                kind="in_flight",
            )
            for i, cells in enumerate(area_rows(buckets.in_flight, top, height))
        ]
        rows.append(
            ChartRow(
                label=f"429s ({strategy.count_429})",
                cells=sparkline(buckets.rejected_429, top429),
                kind="429",
            )
        )
        if top503:
            rows.append(
                ChartRow(
                    label=f"503s ({strategy.count_503})",
                    cells=sparkline(buckets.rejected_503, top503),
                    kind="503",
                )
            )
        rows.append(ChartRow(label="", cells=_axis(horizon, width), kind="axis"))
        panels.append(rows)
    return panels
