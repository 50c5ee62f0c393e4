"""Reality check of the simulator (issue 29): one token-limited scenario, simulated and run for real.

The real run is the real ``openai`` SDK (``AsyncOpenAI``, httpx2) over real sockets against
a fake provider on 127.0.0.1 (``reality_provider.py``: hypercorn serving the simulator's
own provider model, so the rules, headers, 429 wording and Retry-After are the simulator's
code, not a copy). Two strategies, each made the way a user makes it:

* ``anygate``: ``anygate.httpx2.GatedTransport(policy=...)`` under the SDK with
  ``max_retries=0``, token accounting and header learning on (the transport's defaults);
  the policy is the one the simulator's ``anygate`` strategy builds (the library's
  defaults plus the published RPM and TPM, a fresh gate and breaker, the same seeded
  jitter stream), taken from ``anygate.sim._policy_strategy.PolicyClient``.
* ``sdk+cap``: the SDK's own retries (``max_retries=2``, its defaults) inside a
  semaphore of 32 held for the whole call.
* ``cookbook+cap``: the OpenAI cookbook's recipe, real tenacity
  (``wait_random_exponential(min=1, max=60)``, ``stop_after_attempt(6)``; ``sleep=anyio.sleep``
  instead of its default ``asyncio.sleep``, so that it runs on trio's clock) around the
  same default SDK, in the same semaphore. A third strategy makes the ranking say more
  than "the one that lost nothing comes first".

The same fleet (``sim._workload``: start times, think times, prompt sizes, ``max_tokens``;
service times and completion sizes on the provider's side) runs the same chains as in the
simulator (``sim._engine._agent``: a failed call ends its agent's chain). Both runs are then
printed side by side, with the three agreement criteria of the issue: makespan within 5 %,
the share of calls that got a 429 within 2x, and the same ranking (fewer lost calls first,
then the shorter makespan, as the simulator's report ranks).

Time scaling. Client and provider each run in ``trio.run`` with
``trio.testing.MockClock(rate=SCALE)``: a clock that runs ``SCALE`` times faster than the
wall clock (it does not jump; ``autojump`` stays off). Everything that reads the clock or
sleeps through trio sees virtual seconds: the provider's service times, reject latencies,
bucket refill and the Retry-After it computes; the SDK's backoff (``anyio.sleep``) and its
timeouts; the policy's backoff, pacing, breaker and gate (given ``anyio.current_time`` as
their clock, as the simulator gives them). So no header or number is rewritten: a 540 s
virtual run takes 540 / SCALE s of wall time, and the Retry-After the SDK honours means the
same virtual seconds on both sides. The two processes' clocks differ by a constant offset,
which nothing depends on (``POST /sim/reset`` sets the provider's time 0; resets are
durations, not dates).

What it distorts: everything that takes *wall* time is stretched ``SCALE`` times in
virtual time: the HTTP round trip on 127.0.0.1, JSON and SDK overhead, the client's and the
server's CPU (each request costs the SDK and hypercorn a few ms), and any time a process
spends descheduled on a loaded machine. At ``SCALE`` 10, 1 ms of overhead is 10 ms of
virtual time, against a 50 ms median reject latency and a 4 s median service time. Each
run prints both loops' lag (how late a 50 ms sleep ended, in virtual ms) to show how much.
Measured (``docs/simulate.md``, "Reality check"): a storm of retries feels it most, since
each rejection comes back later than the simulator's reject latency and the buckets refill
a little more before each retry (``cookbook+cap`` loses fewer calls and ends later, more
so at ``SCALE`` 20 than 10); a paced strategy (``anygate``) moves by about 1 %.

Usage (not part of the test suite: it takes a few minutes of wall time)::

    PYTHONPATH=src python benchmarks/reality_check.py [--scale 10] [--reps 2]
        [--scenario openai-tier1-tpm] [--seed 1] [--set KEY=VALUE ...] [--json FILE]

or ``nox -s reality``. ``--serve`` is the provider's process (started by the script).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import httpx2
import openai
import tenacity
import trio
import trio.testing
import yaml

from anygate.httpx2 import GatedTransport
from anygate.sim import Scenario, StrategyContext, StrategyResult, load_scenario, simulate
from anygate.sim._engine import _agent
from anygate.sim._policy_strategy import PolicyClient, quiet_policy_logs
from anygate.sim._provider import Trace
from anygate.sim._results import Recorder, current_call, summarize
from anygate.sim._scenarios import deep_merge, resolve_strategies, scenario_mapping
from anygate.sim._workload import CallPlan, build_workload

# The sibling module, also when this file is imported rather than run as a script.
sys.path.insert(0, str(Path(__file__).parent))
from reality_provider import (
    SimulatedOpenAI,
    lag_summary,
    listening_socket,
    prompt_text,
    serve,
    watch_lag,
)

if TYPE_CHECKING:
    import random
    from collections.abc import Iterator

STRATEGIES = ("anygate", "sdk+cap", "cookbook+cap")
#: The ``+cap`` peers' semaphore (``sim._peers.DEFAULT_CAP``).
CAP = 32
MODEL = "gpt-4o-mini"
#: Connection limits of the SDK's own default client (openai ``DEFAULT_CONNECTION_LIMITS``).
LIMITS = httpx2.Limits(max_connections=1000, max_keepalive_connections=100)
#: The SDK's default timeout (600 s), with a connect timeout long enough that a loaded
#: machine's slow accept is never a timeout the SDK retries: the simulator has none.
TIMEOUT = httpx2.Timeout(600.0, connect=60.0)


def scenario_for(name: str, changes: list[str]) -> Scenario:
    """The scenario with each ``KEY=VALUE`` change (dotted key, YAML value) laid over it."""
    mapping, _ = scenario_mapping(name)
    for change in changes:
        key, _, text = change.partition("=")
        value: Any = yaml.safe_load(text)
        for part in reversed(key.split(".")):
            value = {part: value}
        mapping = deep_merge(mapping, value)
    return load_scenario(mapping)


# ---------------------------------------------------------------------- the provider process


def run_provider(scenario: Scenario, seed: int, scale: float) -> None:
    """Serve the fake provider until stdin closes; print its port first."""
    app = SimulatedOpenAI(scenario, seed)
    sock = listening_socket()
    print(sock.getsockname()[1], flush=True)

    async def stdin_closed() -> None:
        await trio.to_thread.run_sync(sys.stdin.read)

    async def main() -> None:
        app.reset()
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch_lag, app.lag)
            await serve(app, sock, stdin_closed)
            tg.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(rate=scale))


# ---------------------------------------------------------------------- the client side


class Recording(httpx2.AsyncBaseTransport):
    """Counts every HTTP attempt, and every 429, against the call the task is making."""

    def __init__(self, inner: httpx2.AsyncBaseTransport) -> None:
        self._inner = inner

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        record = current_call.get()
        response = await self._inner.handle_async_request(request)
        if record is not None:
            record.attempts += 1
            record.got_429 |= response.status_code == 429
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


def _cause(exc: BaseException) -> str:
    """The simulator's name for why a call was lost."""
    if isinstance(exc, openai.APIStatusError):
        retry_after = exc.response.headers.get("retry-after-ms")
        if retry_after is not None and float(retry_after) / 1000 > 120:
            return "retry_after_too_long"
        return "gave_up"
    if isinstance(exc, tenacity.RetryError):
        return "gave_up"
    return type(exc).__name__


@dataclass
class _Invoker:
    """Makes one logical call through the real SDK and records it, as ``sim._engine`` does."""

    sdk: openai.AsyncOpenAI
    recorder: Recorder
    semaphore: anyio.Semaphore | None = None
    tenacity: bool = False

    async def __call__(self, call: CallPlan) -> bool:
        record = self.recorder.begin(call.index)
        outcome = "ok"
        try:
            if self.semaphore is None:
                await self._call(call)
            else:
                async with self.semaphore:
                    await self._call(call)
        except Exception as exc:
            outcome = _cause(exc)
        self.recorder.finish(record, outcome)
        return outcome == "ok"

    async def _call(self, call: CallPlan) -> None:
        if not self.tenacity:
            await self._create(call)
            return
        # The cookbook's @retry(wait=wait_random_exponential(min=1, max=60),
        # stop=stop_after_attempt(6)), as the simulator's ``cookbook`` peer models it.
        retrying = tenacity.AsyncRetrying(
            wait=tenacity.wait_random_exponential(min=1, max=60),
            stop=tenacity.stop_after_attempt(6),
            sleep=anyio.sleep,
        )
        async for attempt in retrying:
            with attempt:
                await self._create(call)

    async def _create(self, call: CallPlan) -> None:
        await self.sdk.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": prompt_text(call.prompt_tokens)}],
            max_tokens=call.max_tokens,
            extra_headers={"x-sim-call": str(call.index)},
        )


def _client(name: str, scenario: Scenario, seed: int, base_url: str) -> tuple[Any, str]:
    """``(AsyncOpenAI, summary)`` for strategy ``name``, built inside the trio run."""
    inner = Recording(httpx2.AsyncHTTPTransport(limits=LIMITS))
    if name == "anygate":
        (spec,) = resolve_strategies(scenario, only=["anygate"])
        context = StrategyContext(name=name, published=scenario.published, seed=seed)
        built = PolicyClient(spec, context)
        transport: httpx2.AsyncBaseTransport = GatedTransport(inner=inner, policy=built.policy)
        retries, summary = 0, "GatedTransport(policy=<the simulator's anygate policy>)"
    else:
        transport, retries = inner, 2
        summary = f"openai SDK defaults (2 retries), semaphore cap {CAP}"
        if name == "cookbook+cap":
            summary = "tenacity cookbook recipe around " + summary
    http = httpx2.AsyncClient(transport=transport, timeout=TIMEOUT)
    sdk = openai.AsyncOpenAI(
        base_url=f"{base_url}/v1", api_key="sk-reality", max_retries=retries, http_client=http
    )
    return sdk, summary


async def _fleet(
    name: str, scenario: Scenario, seed: int, base_url: str
) -> tuple[StrategyResult, dict[str, Any]]:
    workload = build_workload(scenario.fleet, scenario.provider, seed)
    async with httpx2.AsyncClient() as control:
        (await control.post(f"{base_url}/sim/reset")).raise_for_status()
    start = anyio.current_time()
    recorder = Recorder(len(workload.calls))
    sdk, summary = _client(name, scenario, seed, base_url)
    capped = name.endswith("+cap")
    invoke = _Invoker(
        sdk, recorder, anyio.Semaphore(CAP) if capped else None, name.startswith("cookbook")
    )
    stop = scenario.fleet.on_failure == "stop"
    lag: list[float] = []
    async with anyio.create_task_group() as watcher:
        watcher.start_soon(watch_lag, lag)
        with anyio.move_on_after(scenario.time_limit_s):
            async with anyio.create_task_group() as tg:
                for agent in workload.agents:
                    tg.start_soon(_agent, agent, invoke, recorder, stop)  # type: ignore[arg-type]
        watcher.cancel_scope.cancel()
    run_end = anyio.current_time() - start
    await sdk.close()
    async with httpx2.AsyncClient() as control:
        seen = (await control.get(f"{base_url}/sim/trace")).json()
    for record in recorder.records:
        record.start -= start
        record.end -= start
    trace = Trace()
    trace.counts.update(seen["counts"])
    trace.tokens = seen["tokens"]
    trace.admitted = seen["admitted"]
    trace.max_in_service = seen["max_in_service"]
    bound = workload.lower_bound(scenario.provider)
    result = summarize(name, summary, recorder, trace, bound, run_end=run_end)
    return result, {"client": lag_summary(lag), "server": seen["lag"]}


def run_real(name: str, scenario: Scenario, seed: int, base_url: str, scale: float) -> Any:
    """One strategy's real run: ``(result, wall seconds, loop lag of client and server)``."""
    began = time.perf_counter()
    clock = trio.testing.MockClock(rate=scale)
    with quiet_policy_logs():
        result, lag = trio.run(_fleet, name, scenario, seed, base_url, clock=clock)
    return result, time.perf_counter() - began, lag


# ---------------------------------------------------------------------- comparison


@contextmanager
def jitter_stream(salt: int) -> Iterator[None]:
    """Give every strategy another client random stream (its jitter) for the runs inside.

    The real runs draw their jitter from the SDK's and tenacity's global generators, so
    they cannot repeat the simulator's draws; how far the simulator itself moves when only
    the clients' draws change is the noise band a real run should be judged against. The
    simulator seeds the clients' streams from the run's seed (``StrategyContext.rng``);
    this benchmark, and nothing in the library, salts them by patching that method.
    """
    original = StrategyContext.rng

    def salted(self: StrategyContext, purpose: str = "") -> random.Random:
        return original(self, f"{purpose}#jitter-stream-{salt}")

    StrategyContext.rng = salted  # type: ignore[method-assign]
    try:
        yield
    finally:
        StrategyContext.rng = original  # type: ignore[method-assign]


def simulate_band(
    scenario: Scenario, seed: int, names: list[str], streams: int
) -> dict[str, list[StrategyResult]]:
    """Each strategy simulated with ``streams`` other client jitter streams (same workload)."""
    specs = resolve_strategies(scenario, only=names)
    band: dict[str, list[StrategyResult]] = {name: [] for name in names}
    for salt in range(streams):
        with jitter_stream(salt):
            for result in simulate(scenario, seed=seed, strategies=specs).strategies:
                band[result.name].append(result)
    return band


def _share_agrees(sim_share: float, real_share: float) -> bool:
    """Within 2x: both 0, or the larger at most twice the smaller."""
    if sim_share == 0 or real_share == 0:
        return sim_share == real_share
    return max(sim_share, real_share) <= 2 * min(sim_share, real_share)


def _ranking(results: dict[str, StrategyResult]) -> list[str]:
    """Fewer lost calls first, then the shorter makespan (the report's order of merit)."""
    return sorted(results, key=lambda n: (results[n].failed, results[n].makespan_s))


def _lost(result: StrategyResult) -> str:
    causes = ", ".join(f"{k} {v}" for k, v in sorted(result.failures.items()))
    return f"{result.failed}" + (f" ({causes})" if causes else "")


def report(
    simulated: dict[str, StrategyResult],
    reals: list[dict[str, StrategyResult]],
    band: dict[str, list[StrategyResult]],
) -> dict[str, Any]:
    """Print the side-by-side table and the criteria; return them as a mapping.

    ``band``: the simulator's runs with other client jitter streams; the table shows their
    makespan range and the checks say whether each real run's makespan falls inside it
    (an extra, beside the issue's three criteria).
    """
    print(
        f"\n{'strategy':10} {'run':6} {'makespan':>9} {'Δ vs sim':>9} {'got 429':>8}"
        f" {'attempts':>8} {'429s':>5}  lost"
    )
    rows: list[dict[str, Any]] = []
    checks: dict[str, bool] = {}
    for name in simulated:
        sim_result = simulated[name]
        runs = [("sim", sim_result)] + [(f"real{i + 1}", r[name]) for i, r in enumerate(reals)]
        for label, result in runs:
            delta = result.makespan_s / sim_result.makespan_s - 1
            print(
                f"{name:10} {label:6} {result.makespan_s:8.1f}s"
                f" {'' if label == 'sim' else f'{delta:+.1%}':>9} {result.rate_429:8.1%}"
                f" {result.attempts:8} {result.count_429:5}  {_lost(result)}"
            )
            rows.append(
                {
                    "strategy": name,
                    "run": label,
                    "makespan_s": result.makespan_s,
                    "rate_429": result.rate_429,
                    "attempts": result.attempts,
                    "count_429": result.count_429,
                    "lost": result.failed,
                    "lost_by_cause": dict(result.failures),
                }
            )
        spread = band.get(name, [])
        low = min((r.makespan_s for r in spread), default=math.nan)
        high = max((r.makespan_s for r in spread), default=math.nan)
        if spread:
            lost = sorted(r.failed for r in spread)
            shares = sorted(r.rate_429 for r in spread)
            print(
                f"{'':10} {'sim*':6} {low:6.0f}-{high:.0f}s {'':>7}"
                f" {shares[0]:.1%}-{shares[-1]:.1%}  lost {lost[0]}-{lost[-1]}"
                f"  (* {len(spread)} other client jitter streams)"
            )
        for i, real in enumerate(reals):
            r = real[name]
            checks[f"{name} real{i + 1} makespan within 5%"] = (
                abs(r.makespan_s / sim_result.makespan_s - 1) <= 0.05
            )
            checks[f"{name} real{i + 1} 429 share within 2x"] = _share_agrees(
                sim_result.rate_429, r.rate_429
            )
            if spread:
                checks[f"{name} real{i + 1} makespan in the jitter band (extra)"] = (
                    low * 0.99 <= r.makespan_s <= high * 1.01
                )
    sim_rank = _ranking(simulated)
    for i, real in enumerate(reals):
        real_rank = _ranking(real)
        checks[f"real{i + 1} ranks {' > '.join(real_rank)} (sim: {' > '.join(sim_rank)})"] = (
            real_rank == sim_rank
        )
    print()
    for check, held in checks.items():
        print(f"{'holds' if held else 'FAILS'}  {check}")
    return {"rows": rows, "checks": checks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="openai-tier1-tpm")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="change the scenario (dotted key, YAML value), e.g. provider.tokens.tpm=100000",
    )
    parser.add_argument("--scale", type=float, default=10.0, help="virtual s per wall s")
    parser.add_argument("--reps", type=int, default=2, help="real runs per strategy")
    parser.add_argument("--only", default=",".join(STRATEGIES))
    parser.add_argument(
        "--jitter-streams", type=int, default=8, help="simulator runs with other client draws"
    )
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    scenario = scenario_for(args.scenario, args.set)
    if args.serve:
        run_provider(scenario, args.seed, args.scale)
        return
    names = args.only.split(",")
    specs = resolve_strategies(scenario, only=names)
    began = time.perf_counter()
    simulated = {r.name: r for r in simulate(scenario, seed=args.seed, strategies=specs).strategies}
    changed = f" with {', '.join(args.set)}" if args.set else ""
    print(
        f"{scenario.name}{changed}, seed {args.seed}: simulated in {time.perf_counter() - began:.1f}s"
    )
    command = [sys.executable, __file__, "--serve", "--scenario", args.scenario]
    command += ["--seed", str(args.seed), "--scale", str(args.scale)]
    for change in args.set:
        command += ["--set", change]
    server = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        base_url = f"http://127.0.0.1:{int(server.stdout.readline())}"
        reals: list[dict[str, StrategyResult]] = []
        lags: list[dict[str, Any]] = []
        for rep in range(args.reps):
            runs: dict[str, StrategyResult] = {}
            for name in names:
                runs[name], wall, lag = run_real(name, scenario, args.seed, base_url, args.scale)
                mine, theirs = lag["client"], lag["server"]
                print(
                    f"real run {rep + 1}, {name}: {wall:.1f}s wall"
                    f" ({runs[name].makespan_s:.1f} virtual s at x{args.scale:g});"
                    f" loop lag p50/p99/max, virtual ms: client {mine['p50_ms']:.0f}/"
                    f"{mine['p99_ms']:.0f}/{mine['max_ms']:.0f},"
                    f" server {theirs['p50_ms']:.0f}/{theirs['p99_ms']:.0f}/{theirs['max_ms']:.0f}"
                )
                lags.append({"run": rep + 1, "strategy": name, "wall_s": wall, **lag})
            reals.append(runs)
    finally:
        assert server.stdin is not None
        server.stdin.close()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
    print(f"time scale x{args.scale:g}: virtual seconds run {args.scale:g}x the wall clock")
    band = simulate_band(scenario, args.seed, names, args.jitter_streams)
    out = report(simulated, reals, band)
    if args.json is not None:
        args.json.write_text(json.dumps({"scale": args.scale, "lag": lags, **out}, indent=2))


if __name__ == "__main__":
    main()
