"""End-to-end storm benchmark: every built-in scenario and a sweep, every strategy, seeds 1-10.

For each variation and strategy it prints, over the seeds, the makespan as a ratio to the
provider-capacity lower bound and to the oracle (median / worst), the share of calls that
got a 429 (median / worst) and the lost calls by cause (summed over the seeds). A strategy
that lost calls in any seed gets no ratio for that variation ("—"): it did less work.

Variations (each one change to ``morning-peak``, so each row says what it tests):

* ``provider.slots`` 16 and 64 (32 in the scenario);
* ``provider.burst.window_s`` 5 and 30 (10 in the scenario);
* ``provider.latency.median_s`` 6 (x3) and 1 (/2);
* ``fleet.agents`` 480 (x2) and 960 (x4);
* an outage from 60 s to 150 s;
* the burst rule with a dynamic threshold (growth drifting in [1.5, 3]) and with rejected
  arrivals counted toward the slope;
* a shared pool that turns 5 % of arrivals away at random (``limit_burst_rate``).

Then issue 30's further one-change cells of ``morning-peak`` (hidden RPM a tier below and
above the published one, slots 48, slope growth 1.5 and 3, plain 429s, the peak scaled
x10), and issue 29's token-limited cells, each one change to ``openai-tier1-tpm``: hidden TPM a
tier below and above the published one, background load from another service on the key, plain 429s,
prompts growing along the chain, a long-context workload, an Anthropic-like ITPM/OTPM
provider with a 529 outage, and Azure OpenAI's rule (a 200,000 TPM deployment: 1,200 RPM
evaluated per sliding 10 s, tokens per sliding 60 s). Their tables add tokens per second
against the oracle's.

Besides every built-in it runs one diagnostic strategy, ``anygate+cap32``: the library's
defaults with the cap people pick when nothing is published (32, as the ``+cap`` peers
use; ``anygate_cap32.yaml``), to separate what the missing cap costs from what the policy
does once it has one.

``--tuning`` runs the tuning sets instead: ``TUNING`` (one-change cells of ``morning-peak``)
and ``TOKEN_TUNING`` (one-change cells of ``openai-tier1-tpm``: hidden TPM 150,000,
background load 20 % and 55 %, 80 agents, latency 2 s, ~15,000-token prompts, an
Anthropic-like 50k/12k/80 provider without an outage, Azure's rule at 120,000 TPM), none of
them in a reporting set.

Tuning and reporting are kept apart: nothing here chooses a default. The built-in
``anygate`` strategy is the library's defaults plus the scenario's published facts; no
value in it was picked on any of these variations (the policy issue that follows tunes on
a separate tuning set and reports here).

Virtual time, so the numbers are deterministic for the seeds and independent of the
machine; only the wall time depends on it. Runs are spread over ``--jobs`` processes.

Usage: ``python benchmarks/bench_storm.py [--seeds 1-10] [--jobs N] [--json FILE] [--tuning]``
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from anygate import sim
from anygate.sim._scenarios import scenario_mapping
from anygate.sim._spec import BUILTIN_STRATEGIES
from anygate.sim._sweep import SweepResult, format_sweep, parse_seeds, parse_vary, run_sweep

#: A diagnostic extra: the library's defaults with a hand-picked cap of 32 (see the file).
CAP32 = ("anygate+cap32", str(Path(__file__).with_name("anygate_cap32.yaml")))

#: The reporting set (issue 12's targets): one-change variations of morning-peak.
SWEEP: tuple[tuple[str, list[str]], ...] = (
    ("slots", ["provider.slots=16,96"]),
    ("burst window", ["provider.burst.window_s=5,30"]),
    ("latency x3", ["provider.latency.median_s=6.0"]),
    ("fleet x4", ["fleet.agents=960"]),
    ("outage", ["provider.outages=[{start_s: 60, end_s: 150}]"]),
    ("Retry-After on", ["provider.retry_after_s=auto"]),
    (
        "dynamic burst threshold",
        [
            "provider.burst={window_s: 10, growth: 2.0, floor: 60, growth_min: 1.5, "
            "growth_max: 3.0, drift: 0.25}"
        ],
    ),
    (
        "burst counts rejected arrivals",
        ["provider.burst={window_s: 10, growth: 2.0, floor: 60, count_rejected: true}"],
    ),
    # Other tenants on a shared pool: 5 % of arrivals are turned away with limit_burst_rate
    # whatever the client sends. Every strategy gets ~5 % 429s; the 429 target here is the
    # oracle's share plus 0.5 %.
    ("shared pool", ["provider.shared_pool={probability: 0.05, kind: burst}"]),
)

#: Issue 29's token-limited cells: one change each to ``openai-tier1-tpm`` (500 RPM,
#: 200,000 TPM, token buckets, OpenAI headers). Reported, never tuned on.
TOKEN_SWEEP: tuple[tuple[str, list[str]], ...] = (
    # The docs say 200,000 TPM; the project really has a tier below (published unchanged).
    ("hidden TPM a tier below", ["provider.tokens.tpm=100000"]),
    # ... and a tier above (a project upgraded since; the headers say 400,000). Added in
    # stop 40 with the fix it found (rate_is_ceiling): 2.096x -> 1.010x the oracle.
    ("hidden TPM a tier above", ["provider.tokens.tpm=400000"]),
    # Another service on the same API key steadily spends 40 % of every budget.
    ("background load 40 %", ["provider.tokens.background=0.4"]),
    ("plain 429s", ["provider.plain_429=true"]),
    ("prompts grow along the chain", ["fleet.tokens.grow=true"]),
    (
        "long context (few calls, huge prompts)",
        [
            "fleet.tokens.prompt={median: 60000, sigma: 0.3, min: 20000, max: 120000}",
            "fleet.agents=20",
        ],
    ),
    (
        "Anthropic-like ITPM/OTPM, 529s",
        [
            "provider.tokens={rpm: 50, itpm: 30000, otpm: 8000}",
            "published={rpm: 50, itpm: 30000, otpm: 8000}",
            "provider.headers=anthropic",
            "provider.outages=[{start_s: 120, end_s: 150}]",
            "fleet.agents=40",
        ],
    ),
    # Azure OpenAI: a TPM quota per deployment, RPM 6 per 1,000 TPM (1,200 here, as the
    # portal shows it), requests over a sliding 10 s, tokens over a sliding 60 s.
    (
        "Azure OpenAI rule (1,200 RPM per 10 s, TPM per 60 s)",
        [
            "provider.tokens={rule: azure, tpm: 200000}",
            "published={rpm: 1200, tpm: 200000}",
        ],
    ),
    # ... with a deployment given a tier less than the published quota. Added in stop 40
    # with the fix it found (the window copy's sync at another rate): 1.050x -> 1.000x.
    (
        "Azure OpenAI rule, hidden TPM a tier below (100,000 behind 200,000)",
        [
            "provider.tokens={rule: azure, tpm: 100000}",
            "published={rpm: 1200, tpm: 200000}",
        ],
    ),
)

#: Issue 30's one-change cells of morning-peak not in SWEEP: hidden limits a tier below and
#: above the published one, slots 48, slope growth 1.5 and 3, plain 429s, the peak scaled
#: x10 (2,400 agents, 320 slots, 12,000 RPM published and real), and the RPM enforced per
#: second. Reported, never tuned on.
CONTROLLER_SWEEP: tuple[tuple[str, list[str]], ...] = (
    ("hidden RPM a tier below (600 behind 1,200)", ["provider.rpm=600"]),
    ("hidden RPM a tier above (2,400 behind 1,200)", ["provider.rpm=2400"]),
    ("slots 48", ["provider.slots=48"]),
    ("burst growth 1.5", ["provider.burst={window_s: 10, growth: 1.5, floor: 60}"]),
    ("burst growth 3", ["provider.burst={window_s: 10, growth: 3.0, floor: 60}"]),
    ("plain 429s", ["provider.plain_429=true"]),
    (
        "morning peak x10",
        ["fleet.agents=2400", "provider.slots=320", "provider.rpm=12000", "published.rpm=12000"],
    ),
    # The published RPM enforced per second (OpenAI: "60,000 requests a minute may be
    # enforced as 1,000 a second"), a request bucket that holds a second. Added in stop 50
    # with the fix it found: a burst of such 429s, worded "requests per minute", confirmed
    # a minute's threshold at whatever count the minute held (5.4x the oracle -> 1.003x).
    (
        "RPM enforced per second",
        ["provider.rpm=null", "provider.tokens={rpm: 1200, capacity_s: 1}"],
    ),
)

#: The tuning set: where defaults were chosen (``--tuning``). Disjoint from SWEEP and from
#: the built-in scenarios, so the reported cells say how the defaults do where they were not
#: fitted.
TUNING: tuple[tuple[str, list[str]], ...] = (
    ("slots", ["provider.slots=24,48"]),
    ("burst window", ["provider.burst.window_s=15"]),
    ("latency", ["provider.latency.median_s=3.5,1.5"]),
    ("fleet", ["fleet.agents=360,720"]),
    ("outage", ["provider.outages=[{start_s: 30, end_s: 80}]"]),
    ("Retry-After on, slots 24", ["provider.retry_after_s=auto", "provider.slots=24"]),
    ("burst growth 1.6", ["provider.burst={window_s: 10, growth: 1.6, floor: 40}"]),
    ("shared pool 3 %", ["provider.shared_pool={probability: 0.03, kind: burst}"]),
    # Every limit answered with a bare 429 (no code, no wording, no headers): where the
    # attribution of plain 429s (anygate._limits.attribute) was developed.
    ("plain 429s, slots 24 / 48", ["provider.plain_429=true", "provider.slots=24,48"]),
    # The peak scaled x5: where the herd limit's growth (HERD_GROWTH) was chosen.
    (
        "morning peak x5",
        ["fleet.agents=1200", "provider.slots=160", "provider.rpm=6000", "published.rpm=6000"],
    ),
)

#: The token tuning set (``--tuning``): one change each to ``openai-tier1-tpm``, none of them
#: in TOKEN_SWEEP, where token defaults are chosen; TOKEN_SWEEP reports how they do elsewhere.
TOKEN_TUNING: tuple[tuple[str, list[str]], ...] = (
    ("hidden TPM 150,000 behind 200,000", ["provider.tokens.tpm=150000"]),
    ("background load 20 %", ["provider.tokens.background=0.2"]),
    ("background load 55 %", ["provider.tokens.background=0.55"]),
    ("fleet 80 agents", ["fleet.agents=80"]),
    ("latency 2 s", ["provider.latency.median_s=2.0"]),
    (
        "mid-size context (~15,000-token prompts, 40 agents)",
        [
            "fleet.tokens.prompt={median: 15000, sigma: 0.4, min: 2000, max: 60000}",
            "fleet.agents=40",
        ],
    ),
    (
        "Anthropic-like ITPM/OTPM, no outage",
        [
            "provider.tokens={rpm: 80, itpm: 50000, otpm: 12000}",
            "published={rpm: 80, itpm: 50000, otpm: 12000}",
            "provider.headers=anthropic",
            "fleet.agents=40",
        ],
    ),
    (
        "Azure OpenAI rule at 120,000 TPM (720 RPM per 10 s)",
        [
            "provider.tokens={rule: azure, tpm: 120000}",
            "published={rpm: 720, tpm: 120000}",
        ],
    ),
)

#: The capped peers anygate is held against (a semaphore around the user's retries).
CAPPED_PEERS = ("sdk+cap", "cookbook+cap", "stamina+cap")


def _cells(results: list[SweepResult]) -> list[tuple[str, list[Any]]]:
    """Every (variation label, its rows) of every sweep, in order."""
    cells: dict[str, list[Any]] = {}
    for result in results:
        for row in result.rows:
            key = ", ".join(f"{k}={v}" for k, v in row.variation.items()) or result.scenario
            cells.setdefault(key, []).append(row)
    return list(cells.items())


def _where_anygate_loses(results: list[SweepResult]) -> list[str]:
    """Per variation: anygate next to the best peer by lost calls, then by makespan."""
    lines = []
    for label, rows in _cells(results):
        anygate = next((r for r in rows if r.strategy == "anygate"), None)
        peers = [r for r in rows if r.strategy not in ("anygate", "oracle", CAP32[0])]
        if anygate is None or not peers:
            continue
        lost = sum(anygate.lost.values())
        best = min(peers, key=lambda r: (sum(r.lost.values()), (r.bound_ratio or (9e9,))[0]))
        best_lost = sum(best.lost.values())
        ratio = anygate.bound_ratio
        best_ratio = best.bound_ratio
        verdict = "ok"
        if lost > best_lost:
            verdict = f"LOSES: {lost} lost calls vs {best_lost} ({best.strategy})"
        elif ratio and best_ratio and ratio[0] > best_ratio[0] * 1.01:
            verdict = f"slower: {ratio[0]:.3f}x vs {best_ratio[0]:.3f}x ({best.strategy})"
        causes = ", ".join(f"{k} {v}" for k, v in anygate.lost.items()) or "none"
        lines.append(f"  {label[:60]:<60} {verdict}; anygate lost by cause: {causes}")
    return lines


#: Issue 30: in runs of fewer than this many calls a 429 share up to 1 % meets the target.
_SHORT_RUN = 2000


def _verdicts(results: list[SweepResult]) -> list[str]:
    """Per cell: the built-in anygate against issue 12's targets, every miss named.

    Targets: no lost calls where the oracle loses none; makespan <= 1.03x the oracle
    (median over seeds) and <= 1.01x the best capped peer that lost nothing; calls that got
    a 429 <= 0.5 %, or <= 1 % in runs of fewer than 2,000 calls (issue 30: learning each
    limit costs a few rejections, a larger share of a short run), plus the oracle's share
    where noise forces some.
    """
    lines = []
    for label, rows in _cells(results):
        named = {r.strategy: r for r in rows}
        anygate, oracle = named.get("anygate"), named.get("oracle")
        if anygate is None:
            continue
        misses = []
        lost = sum(anygate.lost.values())
        oracle_lost = sum(oracle.lost.values()) if oracle is not None else 0
        if lost > oracle_lost:
            causes = ", ".join(f"{k} {v}" for k, v in anygate.lost.items())
            misses.append(f"lost {lost} ({causes}) vs oracle {oracle_lost}")
        ratio = anygate.oracle_ratio
        if ratio is not None and ratio[0] > 1.03:
            misses.append(f"{ratio[0]:.3f}x oracle > 1.03")
        clean = [named[p] for p in CAPPED_PEERS if p in named and named[p].oracle_ratio is not None]
        best = min(clean, key=lambda r: r.oracle_ratio[0]) if clean else None
        if ratio is not None and best is not None and ratio[0] > best.oracle_ratio[0] * 1.01:
            misses.append(
                f"{ratio[0]:.3f}x vs {best.strategy} {best.oracle_ratio[0]:.3f}x (> 1.01x)"
            )
        share = anygate.rate_429[0]
        # Where the provider turns calls away at random (a shared pool), nobody avoids
        # those 429s: the target is what the oracle got, plus 0.5 %.
        floor = oracle.rate_429[0] if oracle is not None else 0.0
        calls = anygate.cells[0].ok + anygate.cells[0].failed if anygate.cells else 0
        margin = 0.01 if calls < _SHORT_RUN else 0.005
        if share > floor + margin:
            allowed = f"{margin:.1%}" if not floor else f"the oracle's {floor:.2%} + {margin:.1%}"
            misses.append(f"429 {share:.2%} > {allowed}")
        shown = "-" if ratio is None else f"{ratio[0]:.3f}x oracle"
        peer = "" if best is None else f", best capped peer {best.oracle_ratio[0]:.3f}x"
        verdict = "ok" if not misses else "MISS: " + "; ".join(misses)
        lines.append(f"  {label[:58]:<58} {shown}{peer}, 429 {share:.2%}: {verdict}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="1-10", help="seeds, e.g. 1-10 (default) or 1-3")
    parser.add_argument("--jobs", type=int, default=None, help="worker processes (default: CPUs)")
    parser.add_argument("--only", default=None, help="comma-separated strategies (default: all)")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write every row")
    parser.add_argument("--quick", action="store_true", help="scenarios only, no sweep")
    parser.add_argument(
        "--tuning",
        action="store_true",
        help="run the tuning sets instead (TUNING and TOKEN_TUNING; no scenarios)",
    )
    args = parser.parse_args()
    seeds = parse_seeds(args.seeds)
    names = args.only.split(",") if args.only else [*BUILTIN_STRATEGIES, CAP32[0]]
    extra = [CAP32]
    started = time.perf_counter()
    results: list[SweepResult] = []
    print(
        f"anygate storm benchmark: seeds {args.seeds}, strategies {', '.join(names)}\n"
        "ratio = makespan (until the last call ended) / lower bound or / oracle, "
        "median/worst over seeds\n"
    )
    for scenario in [] if args.tuning else sim.builtin_scenarios():
        base, _ = scenario_mapping(scenario)
        result = run_sweep(base, [], seeds, names, extra=extra, jobs=args.jobs)
        results.append(result)
        print(format_sweep(result), end="\n\n", flush=True)
    if not args.quick:
        base, _ = scenario_mapping(sim.DEFAULT_SCENARIO)
        for label, vary in TUNING if args.tuning else SWEEP:
            result = run_sweep(base, parse_vary(vary), seeds, names, extra=extra, jobs=args.jobs)
            results.append(result)
            print(f"-- sweep: {label} (morning-peak with one change)")
            print(format_sweep(result), end="\n\n", flush=True)
        if args.tuning:
            base, _ = scenario_mapping("openai-tier1-tpm")
            for label, vary in TOKEN_TUNING:
                result = run_sweep(
                    base, parse_vary(vary), seeds, names, extra=extra, jobs=args.jobs
                )
                results.append(result)
                print(f"-- sweep: {label} (openai-tier1-tpm with one change)")
                print(format_sweep(result), end="\n\n", flush=True)
        else:
            for label, vary in CONTROLLER_SWEEP:
                result = run_sweep(
                    base, parse_vary(vary), seeds, names, extra=extra, jobs=args.jobs
                )
                results.append(result)
                print(f"-- sweep: {label} (morning-peak with one change)")
                print(format_sweep(result), end="\n\n", flush=True)
            base, _ = scenario_mapping("openai-tier1-tpm")
            for label, vary in TOKEN_SWEEP:
                result = run_sweep(
                    base, parse_vary(vary), seeds, names, extra=extra, jobs=args.jobs
                )
                results.append(result)
                print(f"-- sweep: {label} (openai-tier1-tpm with one change)")
                print(format_sweep(result), end="\n\n", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump([r.to_dict() for r in results], fh, indent=1)
    print("where the built-in anygate (library defaults + published facts) loses:")
    print("\n".join(_where_anygate_loses(results)))
    print("\nthe built-in anygate against the targets (lost, 1.03x oracle, 1.01x best capped")
    print("peer, 429 <= 0.5 %), per cell:")
    print("\n".join(_verdicts(results)))
    print(f"\n(wall time {time.perf_counter() - started:.0f}s)")


if __name__ == "__main__":
    main()
