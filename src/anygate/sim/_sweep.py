"""``anygate simulate sweep``: every variation x strategy x seed, in parallel processes.

A variation sets dotted keys of the scenario file (``provider.slots=16``); the sweep is the
Cartesian product of every ``--vary`` list, each run for every seed and every strategy. One
run (variation, seed, strategy) is one task for a process pool, so the work spreads evenly
over the cores; each task rebuilds its workload from the seed (cheap, and deterministic),
and returns a small summary rather than the whole trace.

Aggregation is honest about lost work: a strategy that lost calls in any seed of a
variation gets no makespan ratio for it (``None``; the table shows "—" and the lost count).
"""

from __future__ import annotations

import itertools
import math
import os
import statistics
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from .. import ConfigError

__all__ = [
    "Cell",
    "SweepResult",
    "SweepRow",
    "format_sweep",
    "parse_seeds",
    "parse_vary",
    "run_sweep",
]


def _split_top(text: str) -> list[str]:
    """Split on commas outside brackets and braces (values may be YAML lists/mappings)."""
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for char in text:
        if char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [p.strip() for p in parts]


def parse_vary(items: Sequence[str]) -> list[tuple[str, list[Any]]]:
    """``["provider.slots=16,32"]`` -> ``[("provider.slots", [16, 32])]``; values are YAML.

    Raises:
        ConfigError: not ``key=v1,v2,...``, an empty key or value, a repeated key.
    """
    import yaml

    result: list[tuple[str, list[Any]]] = []
    for item in items:
        key, sep, values = item.partition("=")
        key = key.strip()
        if not sep or not key or not values.strip():
            msg = f"--vary must be KEY=V1,V2,... (got {item!r})"
            raise ConfigError(msg, path="--vary", value=item)
        if any(key == k for k, _ in result):
            msg = f"--vary keys must differ (got {key!r} twice)"
            raise ConfigError(msg, path="--vary", value=item)
        try:
            parsed = [yaml.safe_load(v) for v in _split_top(values)]
        except yaml.YAMLError as exc:
            msg = f"--vary {key}: a value is not valid YAML: {exc}"
            raise ConfigError(msg, path="--vary", value=item) from exc
        result.append((key, parsed))
    return result


def parse_seeds(text: str) -> list[int]:
    """``"1-5"``, ``"3"`` or ``"1,4,9"`` -> the seeds, in order.

    Raises:
        ConfigError: anything else, or a range that runs backwards.
    """
    seeds: list[int] = []
    try:
        for part in text.split(","):
            low, sep, high = part.strip().partition("-")
            first = int(low)
            last = int(high) if sep else first
            if first < 0 or last < first:
                raise ValueError(part)
            seeds.extend(range(first, last + 1))
    except ValueError as exc:
        msg = f"--seeds must be N, N-M or a comma list of those, N <= M, N >= 0 (got {text!r})"
        raise ConfigError(msg, path="--seeds", value=text) from exc
    return seeds


def _set(data: dict[str, Any], dotted: str, value: Any) -> None:
    node = data
    parts = dotted.split(".")
    for part in parts[:-1]:
        child = node.get(part)
        node[part] = dict(child) if isinstance(child, Mapping) else {}
        node = node[part]
    node[parts[-1]] = value


def _variation(base: Mapping[str, Any], settings: Mapping[str, Any]) -> dict[str, Any]:
    import copy

    data = copy.deepcopy(dict(base))
    for key, value in settings.items():
        _set(data, key, value)
    return data


@dataclass(frozen=True)
class Cell:
    """One run's summary: a strategy on one variation and seed."""

    strategy: str
    seed: int
    makespan_s: float
    bound_s: float
    ok: int
    failed: int
    lost: Mapping[str, int]
    rate_429: float
    calls_with_429: int
    attempts: int
    oracle_ratio: float | None = None
    tokens_per_s: float | None = None
    tokens_ratio: float | None = None  # tokens_per_s / the oracle's, lost calls or not

    @property
    def ratio(self) -> float | None:
        """Makespan / lower bound, or ``None`` when calls were lost."""
        return None if self.failed else self.makespan_s / self.bound_s


@dataclass(frozen=True)
class SweepRow:
    """One variation x strategy over every seed."""

    variation: Mapping[str, Any]
    strategy: str
    cells: tuple[Cell, ...]

    def _stat(self, values: list[float | None]) -> tuple[float, float] | None:
        if not values or any(v is None for v in values):
            return None
        known = [v for v in values if v is not None]
        return statistics.median(known), max(known)

    @property
    def bound_ratio(self) -> tuple[float, float] | None:
        """(median, worst) makespan / lower bound; ``None`` if any seed lost calls."""
        return self._stat([c.ratio for c in self.cells])

    @property
    def oracle_ratio(self) -> tuple[float, float] | None:
        """(median, worst) makespan / the oracle's; ``None`` if any seed lost calls."""
        return self._stat([c.oracle_ratio for c in self.cells])

    @property
    def tokens_ratio(self) -> tuple[float, float] | None:
        """(median, worst) tokens per second / the oracle's; ``None`` without tokens.

        Throughput, so it is shown even when calls were lost (a run that lost calls served
        fewer tokens over a shorter makespan; the lost column says so). Worst is lowest.
        """
        values = [c.tokens_ratio for c in self.cells]
        if not values or any(v is None for v in values):
            return None
        known = [v for v in values if v is not None]
        return statistics.median(known), min(known)

    @property
    def rate_429(self) -> tuple[float, float]:
        """(median, worst) share of calls that got a 429."""
        rates = [c.rate_429 for c in self.cells]
        return statistics.median(rates), max(rates)

    @property
    def lost(self) -> dict[str, int]:
        """Lost calls by cause, summed over seeds."""
        total: dict[str, int] = {}
        for cell in self.cells:
            for cause, count in cell.lost.items():
                total[cause] = total.get(cause, 0) + count
        return dict(sorted(total.items()))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        ratio, oracle, rate = self.bound_ratio, self.oracle_ratio, self.rate_429
        return {
            "variation": dict(self.variation),
            "strategy": self.strategy,
            "ratio_median": None if ratio is None else ratio[0],
            "ratio_worst": None if ratio is None else ratio[1],
            "oracle_ratio_median": None if oracle is None else oracle[0],
            "oracle_ratio_worst": None if oracle is None else oracle[1],
            "tokens_ratio_median": None if self.tokens_ratio is None else self.tokens_ratio[0],
            "rate_429_median": rate[0],
            "rate_429_worst": rate[1],
            "lost": self.lost,
            "seeds_with_loss": sum(1 for c in self.cells if c.failed),
            "runs": [
                {
                    "seed": c.seed,
                    "makespan_s": c.makespan_s,
                    "ratio": c.ratio,
                    "oracle_ratio": c.oracle_ratio,
                    "ok": c.ok,
                    "failed": c.failed,
                    "lost": dict(c.lost),
                    "rate_429": c.rate_429,
                    "calls_with_429": c.calls_with_429,
                    "attempts": c.attempts,
                    "tokens_per_s": c.tokens_per_s,
                }
                for c in self.cells
            ],
        }


@dataclass(frozen=True)
class SweepResult:
    """Every row of a sweep, variation-major, strategies in display order."""

    scenario: str
    seeds: tuple[int, ...]
    vary: tuple[tuple[str, tuple[Any, ...]], ...]
    rows: tuple[SweepRow, ...]
    calls: Mapping[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "scenario": self.scenario,
            "seeds": list(self.seeds),
            "vary": {key: list(values) for key, values in self.vary},
            "rows": [row.to_dict() for row in self.rows],
        }


_Task = tuple[
    Mapping[str, Any],
    str | None,
    tuple[str, ...],
    tuple[tuple[str, str], ...],
    str | None,
    int,
    str,
]


def _run_task(task: _Task) -> Cell:
    """One (variation, seed, strategy) run in a worker process."""
    from pathlib import Path

    from ._engine import run_strategy
    from ._parse import parse_scenario
    from ._policy_strategy import quiet_policy_logs
    from ._scenarios import resolve_strategies
    from ._workload import build_workload

    data, base_dir, _names, extra, config, seed, name = task
    scenario = parse_scenario(data, base_dir=None if base_dir is None else Path(base_dir))
    (spec,) = resolve_strategies(scenario, config=config, extra=extra, only=[name])
    workload = build_workload(scenario.fleet, scenario.provider, seed)
    with quiet_policy_logs():
        result = run_strategy(scenario, workload, spec, seed=seed)
    return Cell(
        strategy=name,
        seed=seed,
        makespan_s=result.makespan_s,
        bound_s=result.makespan_s / result.bound_ratio if result.bound_ratio else math.inf,
        ok=result.ok,
        failed=result.failed,
        lost=dict(result.failures),
        rate_429=result.rate_429,
        calls_with_429=result.calls_with_429,
        attempts=result.attempts,
        tokens_per_s=result.tokens_per_s,
    )


def run_sweep(
    base: Mapping[str, Any],
    vary: Sequence[tuple[str, Sequence[Any]]],
    seeds: Sequence[int],
    names: Sequence[str],
    *,
    base_dir: str | None = None,
    extra: Sequence[tuple[str, str]] = (),
    config: str | None = None,
    jobs: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> SweepResult:
    """Run every variation x seed x strategy (plus the oracle, the yardstick) and aggregate.

    Args:
        base: the scenario mapping (as read from YAML).
        vary: ``(dotted key, values)`` pairs; their Cartesian product is swept.
        seeds: seeds to run each variation with.
        names: strategies, in display order (``oracle`` runs regardless).
        base_dir: where the scenario's relative policy paths resolve.
        extra: ``--strategy`` pairs.
        config: ``--config`` for ``anygate``.
        jobs: worker processes (default: the CPU count; 1 runs in this process).
        progress: called as ``progress(done, total)`` after each run.

    Raises:
        ConfigError: an invalid variation (checked before anything runs).
    """
    from ._parse import parse_scenario
    from ._scenarios import resolve_strategies

    keys = [key for key, _ in vary]
    combos = list(itertools.product(*(values for _, values in vary))) or [()]
    settings = [dict(zip(keys, combo, strict=True)) for combo in combos]
    datas = [_variation(base, s) for s in settings]
    from pathlib import Path

    name = "unnamed"
    for index, data in enumerate(datas):  # validate every variation up front
        try:
            scenario = parse_scenario(data, base_dir=None if base_dir is None else Path(base_dir))
        except ConfigError as exc:
            where = ", ".join(f"{k}={v!r}" for k, v in settings[index].items())
            msg = f"--vary {where}: {exc}"
            raise ConfigError(msg, path=exc.path, value=exc.value) from exc
        resolve_strategies(scenario, config=config, extra=extra, only=list(names))
        name = scenario.name
    run_names = list(names) if "oracle" in names else [*names, "oracle"]
    tasks: list[_Task] = [
        (data, base_dir, tuple(names), tuple(extra), config, seed, strategy)
        for data in datas
        for seed in seeds
        for strategy in run_names
    ]
    cells: list[Cell] = []
    workers = jobs or os.cpu_count() or 1
    if workers == 1:
        for task in tasks:
            cells.append(_run_task(task))
            if progress is not None:
                progress(len(cells), len(tasks))
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            for cell in pool.map(_run_task, tasks, chunksize=1):
                cells.append(cell)
                if progress is not None:
                    progress(len(cells), len(tasks))
    per = len(seeds) * len(run_names)
    rows: list[SweepRow] = []
    for index, setting in enumerate(settings):
        block = cells[index * per : (index + 1) * per]
        oracle = {c.seed: c for c in block if c.strategy == "oracle"}
        for strategy in names:
            mine = []
            for cell in block:
                if cell.strategy != strategy:
                    continue
                ref = oracle[cell.seed]
                ratio = None
                if not cell.failed and not ref.failed and ref.makespan_s > 0:
                    ratio = cell.makespan_s / ref.makespan_s
                tokens = None
                if cell.tokens_per_s and ref.tokens_per_s:
                    tokens = cell.tokens_per_s / ref.tokens_per_s
                mine.append(_with(cell, ratio, tokens))
            rows.append(SweepRow(variation=setting, strategy=strategy, cells=tuple(mine)))
    return SweepResult(
        scenario=name,
        seeds=tuple(seeds),
        vary=tuple((key, tuple(values)) for key, values in vary),
        rows=tuple(rows),
    )


def _with(cell: Cell, oracle_ratio: float | None, tokens_ratio: float | None) -> Cell:
    from dataclasses import replace

    return replace(cell, oracle_ratio=oracle_ratio, tokens_ratio=tokens_ratio)


def _pair(value: tuple[float, float] | None, lost: int, width: int = 13) -> str:
    if value is None:
        return f"{'— (' + str(lost) + ' lost)':>{width}}"
    return f"{value[0]:>6.3f}/{value[1]:<6.3f}"


def format_sweep(result: SweepResult) -> str:
    """A plain-text table: one line per variation x strategy (medians / worst over seeds)."""
    seeds = result.seeds
    span = (
        f"{seeds[0]}-{seeds[-1]}"
        if seeds == tuple(range(seeds[0], seeds[-1] + 1))
        else ",".join(map(str, seeds))
    )
    tokens = any(row.tokens_ratio is not None for row in result.rows)
    lines = [
        f"sweep of {result.scenario!r}, seeds {span}: ratio = median/worst over seeds; "
        "'—' = calls were lost in some seed (no ratio for less work)"
        + ("; tok/s = tokens per second / the oracle's (median/lowest)" if tokens else ""),
        f"{'variation':<28} {'strategy':<13} {'÷ lower bound':>13} {'÷ oracle':>13} "
        + (f"{'tok/s ÷ oracle':>14} " if tokens else "")
        + f"{'429 % med/worst':>16}  lost calls by cause (all seeds)",
    ]
    last = None
    for row in result.rows:
        label = ", ".join(f"{k}={v}" for k, v in row.variation.items()) or "(as is)"
        shown = label if label != last else ""
        last = label
        lost = row.lost
        total = sum(lost.values())
        rate = row.rate_429
        causes = ", ".join(f"{k} {v}" for k, v in lost.items()) or "0"
        throughput = ""
        if tokens:
            pair = row.tokens_ratio
            throughput = f"{'-':>14} " if pair is None else f"{pair[0]:>6.3f}/{pair[1]:<6.3f}  "
        lines.append(
            f"{shown[:28]:<28} {row.strategy:<13} {_pair(row.bound_ratio, total)} "
            f"{_pair(row.oracle_ratio, total)} {throughput}{rate[0]:>7.2%}/{rate[1]:<7.2%}  "
            f"{causes}"
        )
    return "\n".join(lines)
