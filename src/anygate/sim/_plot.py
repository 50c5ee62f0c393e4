"""Write a run's chart as an image file (PNG, SVG, PDF) with matplotlib (the ``plot`` extra).

One panel per strategy, sharing both axes: requests in service at the provider (line, left
axis) and 429 / 503 answers per bucket (bars, right axis). Uses ``matplotlib.figure.Figure``
directly rather than ``pyplot``, so no GUI backend or global figure state is involved.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from .. import ConfigError
from ._results import SimulationResult, series

if TYPE_CHECKING:
    from matplotlib.artist import Artist

__all__ = ["SUFFIXES", "write_plot"]

#: File types the plot can be written as.
SUFFIXES = (".png", ".svg", ".pdf")


def write_plot(result: SimulationResult, path: str | Path, *, buckets: int = 200) -> Path:
    """Draw ``result`` into ``path``; the suffix picks the format.

    Raises:
        ConfigError: the suffix is not one of :data:`SUFFIXES`.
        ImportError: matplotlib is not installed (the ``plot`` extra).
    """
    target = Path(path)
    if target.suffix.lower() not in SUFFIXES:
        msg = f"--plot must end in one of {', '.join(SUFFIXES)} (got {str(target)!r})"
        raise ConfigError(msg, path="--plot", value=str(target))
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        msg = "plotting needs matplotlib: pip install 'anygate[plot]'"
        raise ImportError(msg, name="matplotlib") from exc

    strategies = result.strategies
    horizon = result.horizon
    figure = Figure(figsize=(10, 2.2 * len(strategies) + 0.8), layout="constrained")
    axes = figure.subplots(len(strategies), 1, sharex=True, squeeze=False)[:, 0]
    bucketed = [series(s, horizon=horizon, buckets=buckets) for s in strategies]
    top = max(max(b.in_flight, default=0.0) for b in bucketed) or 1.0
    top_rejects = max(
        max((a + b for a, b in zip(s.rejected_429, s.rejected_503, strict=True)), default=0)
        for s in bucketed
    )
    for ax, strategy, data in zip(axes, strategies, bucketed, strict=True):
        width = data.bucket_s
        times = [i * width for i in range(len(data.in_flight))]
        rejects = ax.twinx()
        rejects.bar(
            times,
            data.rejected_429,
            width=width,
            align="edge",
            color="tab:red",
            alpha=0.5,
            label="429 answers per bucket (right axis)",
        )
        if any(data.rejected_503):
            rejects.bar(
                times,
                data.rejected_503,
                width=width,
                align="edge",
                bottom=data.rejected_429,
                color="tab:purple",
                alpha=0.5,
                label="503 answers per bucket (right axis)",
            )
        rejects.set_ylim(0, max(1, top_rejects) * 1.05)
        rejects.set_ylabel("rejections / bucket")
        ax.step(
            times,
            data.in_flight,
            where="post",
            color="tab:blue",
            label="requests in service (left axis)",
        )
        ax.set_ylim(0, top * 1.05)
        ax.set_ylabel("in service")
        ax.set_zorder(rejects.get_zorder() + 1)  # the line above the bars
        ax.patch.set_visible(False)
        versus = (
            f"{strategy.ratio:.2f}x bound" if strategy.ratio is not None else "no ratio: lost calls"
        )
        ax.set_title(
            f"{strategy.name}: makespan {strategy.makespan_s:.0f}s ({versus}), "
            f"{strategy.rate_429:.1%} calls got a 429, {strategy.failed} lost",
            fontsize="medium",
            loc="left",
        )
    # One legend for the figure: the colours mean the same in every panel.
    legend: dict[str, Artist] = {}
    for ax in figure.axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(label, handle)
    figure.legend(list(legend.values()), list(legend), loc="outside lower center", ncols=3)
    axes[-1].set_xlabel("virtual time (s)")
    axes[-1].set_xlim(0, horizon)
    figure.suptitle(
        f"{result.scenario} (seed {result.seed}, {result.calls} calls, "
        f"lower bound {result.bound.seconds:.0f}s)"
    )
    target.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(target)
    return target
