"""End-to-end storm benchmark: the morning-peak scenario, every strategy, several seeds.

Prints, per strategy, the makespan as a ratio to the provider-capacity lower bound and the
share of calls that received a 429, measured in the same run on the same workload. Then
checks the target for the shipped default ``anygate`` config (makespan <= 1.10x the bound,
< 1 % of calls receiving a 429, ``naive`` far worse) and, unless ``--quick``, shows what
the makespan is made of:

1. when anygate's 429s happen (per burst window);
2. the makespan above the bound as idle provider slots: before the slots first fill, in
   the middle, after they were last full (the bound counts none of them);
3. the same config with adaptive concurrency off: what the gate-wide answer to burst-rate
   throttles buys (429s) and costs (makespan);
4. a sweep of static caps with adaptive concurrency off: no single cap meets both targets.

Virtual time, so the numbers are deterministic for the seeds and independent of the
machine; only the wall time printed at the end depends on it.

Usage: ``python benchmarks/bench_storm.py [--seeds N] [--quick]``
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections import Counter

from anygate import sim
from anygate.sim._scenarios import builtin_policy, deep_merge
from anygate.sim._spec import StrategySpec

TARGET_RATIO = 1.10
TARGET_429 = 0.01


def _row(name: str, values: list[sim.StrategyResult]) -> str:
    ratios = [s.ratio for s in values]
    rates = [s.rate_429 for s in values]
    failed = [s.failed for s in values]
    return (
        f"{name:<10} {ratios[0]:>6.3f}x {statistics.median(ratios):>7.3f}x {max(ratios):>7.3f}x"
        f"   {rates[0]:>7.2%} {statistics.median(rates):>7.2%} {max(rates):>7.2%}"
        f"   {sum(failed) / len(failed):>8.1f}"
    )


def _header() -> str:
    return (
        f"{'strategy':<10} {'makespan / lower bound':^26}   {'calls that got a 429':^25}"
        f"   {'failed'}\n"
        f"{'':<10} {'seed 1':>7} {'median':>8} {'worst':>8}   {'seed 1':>7} {'median':>7} "
        f"{'worst':>7}   {'(mean)':>8}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5, help="seeds 1..N (default 5)")
    parser.add_argument("--quick", action="store_true", help="one seed, no diagnosis")
    args = parser.parse_args()
    seeds = [1] if args.quick else list(range(1, args.seeds + 1))
    started = time.perf_counter()

    scenario = sim.load_scenario(sim.DEFAULT_SCENARIO)
    strategies = sim.resolve_strategies(scenario)
    runs = [sim.simulate(scenario, seed=seed, strategies=strategies) for seed in seeds]
    by_name = {s.name: [run.strategies[i] for run in runs] for i, s in enumerate(strategies)}
    bound = runs[0].bound
    print(
        f"anygate storm benchmark: scenario {scenario.name!r}, {runs[0].calls} calls, "
        f"seeds {seeds[0]}..{seeds[-1]}"
    )
    print(
        f"lower bound (seed 1): {bound.seconds:.1f}s, set by {bound.binding} "
        f"(slots {bound.slots_s:.1f}s, chain {bound.chain_s:.1f}s, RPM {bound.rpm_s or 0:.1f}s, "
        f"burst {bound.burst_s or 0:.1f}s)\n"
    )
    print(_header())
    for name, values in by_name.items():
        print(_row(name, values))

    anygate, naive = by_name["anygate"], by_name["naive"]
    worst_ratio = max(s.ratio for s in anygate)
    worst_rate = max(s.rate_429 for s in anygate)
    print("\ntarget for the shipped anygate config:")
    print(
        f"  makespan <= {TARGET_RATIO:.2f}x bound: "
        f"{'MET' if worst_ratio <= TARGET_RATIO else 'MISSED'} "
        f"(median {statistics.median(s.ratio for s in anygate):.3f}x, worst {worst_ratio:.3f}x; "
        f"{sum(s.ratio <= TARGET_RATIO for s in anygate)}/{len(anygate)} seeds within)"
    )
    print(
        f"  < {TARGET_429:.0%} of calls got a 429: "
        f"{'MET' if worst_rate < TARGET_429 else 'MISSED'} "
        f"(median {statistics.median(s.rate_429 for s in anygate):.2%}, worst {worst_rate:.2%})"
    )
    print(
        f"  naive in the same runs: median {statistics.median(s.ratio for s in naive):.2f}x, "
        f"{statistics.median(s.rate_429 for s in naive):.0%} of calls got a 429"
    )
    if not args.quick:
        _diagnose(scenario, strategies, seeds, by_name["anygate"])
    print(f"\n(wall time {time.perf_counter() - started:.1f}s)")


def _idle(result: sim.StrategyResult, slots: int) -> tuple[float, float, float]:
    """Idle slot-seconds / slots before the slots first fill, between, and after."""
    steps = result.in_service
    full = [t for t, n in steps if n >= slots] or [0.0]
    first, last = full[0], full[-1]
    spans = zip(steps, (*steps[1:], (result.makespan_s, 0)), strict=True)
    parts = [0.0, 0.0, 0.0]
    for (start, level), (end, _) in spans:
        for index, (lo, hi) in enumerate(((0.0, first), (first, last), (last, math.inf))):
            overlap = min(end, hi) - max(start, lo)
            if overlap > 0:
                parts[index] += (slots - level) * overlap / slots
    return parts[0], parts[1], parts[2]


def _variant(name: str, override: dict[str, object]) -> StrategySpec:
    return StrategySpec(
        name=name, policy=deep_merge(builtin_policy("anygate"), override), replace=True
    )


def _diagnose(
    scenario: sim.Scenario,
    strategies: list[StrategySpec],
    seeds: list[int],
    shipped: list[sim.StrategyResult],
) -> None:
    """What the makespan is made of, and what adaptive concurrency buys and costs."""
    print("\nwhat limits it")
    anygate_spec = next(s for s in strategies if s.name == "anygate")
    window = scenario.provider.burst.window_s if scenario.provider.burst else 10.0
    kinds = Counter(
        f"{int(t // window) * window:.0f}-{int(t // window + 1) * window:.0f}s"
        for t, _ in shipped[0].rejects
    )
    print(
        f"1. anygate's 429s by {window:g}s burst window (seed {seeds[0]}): {dict(kinds)}; "
        f"adaptive limit cuts per seed: {[s.limit_cuts for s in shipped]}"
    )

    off = _variant("adaptive off", {"llm_call": {"adaptive_concurrency": False}})
    without = []
    print("2. makespan above the bound, as idle provider slots (slot-seconds / slots):")
    for seed, result in zip(seeds, shipped, strict=True):
        run = sim.simulate(scenario, seed=seed, strategies=[off])
        without.append(run.strategies[0])
        for label, strategy in (("anygate", result), ("  adaptive off", run.strategies[0])):
            head, middle, tail = _idle(strategy, scenario.provider.slots)
            print(
                f"     seed {seed} {label:<15} {strategy.makespan_s - run.bound.seconds:5.1f}s "
                f"over = {head:4.1f}s before the slots first fill + {middle:4.1f}s mid-run + "
                f"{tail:4.1f}s after they were last full"
            )
    print("3. the shipped config with adaptive concurrency off, same seeds:")
    print(_header())
    print(_row("anygate", shipped))
    print(_row("adapt. off", without))

    top = anygate_spec.policy["llm_call"]["max_concurrent_calls"]  # type: ignore[index]
    caps = sorted({8, 12, 16, 20, 24, 28, top})
    sweep = [
        _variant(
            f"cap {cap}",
            {"llm_call": {"max_concurrent_calls": cap, "adaptive_concurrency": False}},
        )
        for cap in caps
    ]
    swept = sim.simulate(scenario, seed=seeds[0], strategies=sweep)
    print(f"4. static caps, adaptive off (seed {seeds[0]}): makespan / bound, calls with a 429")
    for s in swept.strategies:
        ok = s.ratio <= TARGET_RATIO and s.rate_429 < TARGET_429
        print(
            f"     {s.name:>7}: {s.ratio:6.3f}x {s.rate_429:7.2%}{'  <- meets both' if ok else ''}"
        )
    print(
        "   A cap bounds concurrency, not rate: after a burst-rate 429 each freed slot goes\n"
        "   straight to the next queued call, which is throttled too, so a per-call backoff\n"
        "   cannot keep the ramp under the burst slope, and any static cap trades 429s for\n"
        "   makespan. The adaptive limit pauses the gate and lowers it (AIMD): it removes\n"
        "   nearly every 429 for a few seconds of idle slots during the ramp. What remains\n"
        "   above the bound is the ramp itself (agents still arriving, the provider's slope)\n"
        "   and the tail (the last agents' remaining calls are sequential, and a FIFO gate\n"
        "   cannot start them earlier); the bound counts neither."
    )


if __name__ == "__main__":
    main()
