"""Fleet gate benchmarks on a redis-server started here, ratios against baselines of the same run.

    python benchmarks/bench_fleet.py          # everything (about a minute)
    python benchmarks/bench_fleet.py a        # only some sections

(a) uncontended acquire+release vs one raw EVALSHA round trip (a trivial script) on the
    same kind of connection, both on asyncio; the baseline is measured back to back and, as
    the agent makes its calls, after an idle gap with a blocking pop pending. "cold": every acquire needs a grant from Redis
    (``linger=0``; the lease went back before the next acquire). "warm": the lease lingers
    in the process (the default), so the acquire is local. "script flushed": SCRIPT FLUSH
    before each acquire (the script not loaded: a fresh or restarted server). "with a fleet
    rate": the lease and the rate permit in the same call. "first acquire": a new FleetGate
    (agent thread, connection, the script sent with EVAL). Target: cold median <= 2x.
(b) 8 processes (4 asyncio, 4 trio) x 50 tasks, capacity 16, holds of 1-5 ms: grants per
    second, the ideal (16 slots / mean hold), Jain's index over processes (target >= 0.99),
    the worst wait, and Redis commands per grant from INFO commandstats (target <= 3):
    client-issued commands (EVALSHA, BLPOP, ...) and everything including the commands the
    script runs.

(c) the fleet rate: 8 processes x 20 tasks against 1200 requests/minute: admissions per
    minute and the worst excess over ``rate x d + burst`` in any span ``d`` of the run
    (with no lag allowed, and with the lag the docs state), Jain's index over processes.

Numbers from a shared 2-core machine: read the ratios.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.fleet.fleetproc import Fleet
from tests.fleet.redis_proc import RedisProc

from anygate import Rate
from anygate.fleet import FleetGate


def jain(values: list[float]) -> float:
    total, squares = sum(values), sum(v * v for v in values)
    return total * total / (len(values) * squares) if squares else 1.0


def commandstats(server: RedisProc) -> dict[str, int]:
    raw = server.command("INFO", "commandstats").decode()
    out: dict[str, int] = {}
    for line in raw.splitlines():
        if line.startswith("cmdstat_"):
            name, rest = line[len("cmdstat_") :].split(":", 1)
            out[name] = int(rest.split("calls=", 1)[1].split(",", 1)[0])
    return out


async def uncontended(server: RedisProc, n: int = 300) -> None:
    import coredis

    client: Any = coredis.Redis.from_url(server.url, decode_responses=True)
    hot: list[float] = []
    idle: list[float] = []
    async with client:
        script = client.register_script("return 1")
        await script()
        for _ in range(n):
            t0 = time.perf_counter()
            await client.evalsha(script.sha, keys=[], args=[])
            hot.append(time.perf_counter() - t0)

        # The same call as the agent makes it: after an idle gap (the machine's wake-up
        # latency is part of a cold acquire too) and with a blocking pop pending on
        # another connection of the same client.
        async def blocked() -> None:
            while True:
                await client.blpop(["bench:nothing"], timeout=1)

        async with anyio.create_task_group() as tg:
            tg.start_soon(blocked)
            for _ in range(n):
                await anyio.sleep(0.005)
                t0 = time.perf_counter()
                await client.evalsha(script.sha, keys=[], args=[])
                idle.append(time.perf_counter() - t0)
            tg.cancel_scope.cancel()
    base = statistics.median(idle)
    print(
        f"(a) raw EVALSHA round trip: median {statistics.median(hot) * 1e6:.0f} us back to back, "
        f"{base * 1e6:.0f} us after a 5 ms idle gap with a BLPOP pending (the agent's conditions)"
    )
    # What any client pays on a cold server: the fleet script itself sent with EVAL after
    # a SCRIPT FLUSH (Redis compiles it), on a hot connection; and a new connection's
    # first command (TCP connect, HELLO, the call).
    from anygate.fleet._redis import RATELESS
    from anygate.fleet._scripts import SYNC, keys_for, prefix_for

    args = ["bench:pid", 0, 0, 4, 10000, 2000, 10000, prefix_for("bench-raw"), "0", "peek"]
    args += [0, "", 0, *RATELESS]
    compiled: list[float] = []
    connected: list[float] = []
    async with coredis.Redis.from_url(server.url, decode_responses=True) as raw:
        for _ in range(20):
            server.command("SCRIPT", "FLUSH")
            t0 = time.perf_counter()
            await raw.eval(SYNC, keys=keys_for("bench-raw"), args=args)
            compiled.append(time.perf_counter() - t0)
    for _ in range(20):
        t0 = time.perf_counter()
        fresh: Any = coredis.Redis.from_url(server.url, decode_responses=True)
        async with fresh:
            await fresh.eval("return 1", keys=[], args=[])
        connected.append(time.perf_counter() - t0)
    print(
        f"    raw EVAL of the fleet script on a flushed server: median "
        f"{statistics.median(compiled) * 1e6:.0f} us; a new connection's first EVAL of a trivial script: "
        f"{statistics.median(connected) * 1e6:.0f} us"
    )
    fast_rate = Rate(requests_per_minute=6e6, burst_s=1.0)  # permits never bind
    variants: list[tuple[str, float, bool, Rate | None]] = [
        ("cold", 0.0, False, None),
        ("cold, script flushed", 0.0, True, None),
        ("cold, with a fleet rate", 0.0, False, fast_rate),
        ("warm", 1.0, False, None),
    ]
    for label, linger, flush, rate in variants:
        fleet = FleetGate(f"bench-a-{label}", capacity=4, url=server.url, linger=linger, rate=rate)
        samples: list[float] = []
        try:
            (await fleet.acquire()).release()
            for _ in range(n):
                if linger == 0:
                    with anyio.fail_after(5):
                        while fleet.statistics().held:
                            await anyio.sleep(0.001)
                if flush:
                    server.command("SCRIPT", "FLUSH")
                t0 = time.perf_counter()
                token = await fleet.acquire()
                token.release()
                samples.append(time.perf_counter() - t0)
        finally:
            fleet.close()
        report(f"{label} fleet acquire+release", samples, base, statistics.median(hot))
    # The very first acquire of a process: agent thread, connection, EVAL of the script.
    first: list[float] = []
    for i in range(20):
        fleet = FleetGate(f"bench-a-first-{i}", capacity=4, url=server.url)
        try:
            t0 = time.perf_counter()
            (await fleet.acquire()).release()
            first.append(time.perf_counter() - t0)
        finally:
            fleet.close()
    report("first acquire of a new FleetGate", first, base, statistics.median(hot))


def report(label: str, samples: list[float], idle: float, hot: float) -> None:
    med = statistics.median(samples)
    p90 = sorted(samples)[int(len(samples) * 0.9)]
    print(
        f"    {label}: median {med * 1e6:.0f} us = {med / idle:.2f}x idle EVALSHA, "
        f"{med / hot:.2f}x back-to-back (p90 {p90 * 1e6:.0f} us)"
    )


def contended(server: RedisProc, duration: float = 10.0) -> None:
    hold = (0.001, 0.005)
    configs = [
        {
            "name": "bench-b",
            "url": server.url,
            "capacity": 16,
            "tasks": 50,
            "duration": duration,
            "hold": hold,
            "backend": "asyncio" if i % 2 == 0 else "trio",
            "seed": i,
        }
        for i in range(8)
    ]
    fleet = Fleet(configs)
    fleet.go()
    before = commandstats(server)
    t0 = time.time()
    results = fleet.results(timeout=duration + 60)
    after = commandstats(server)
    elapsed = max(time.time() - t0, duration)
    grants = [r["grants"] for r in results]
    total = sum(grants)
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    client = sum(
        delta.get(k, 0)
        for k in ("evalsha", "eval", "blpop", "script|load", "hello", "client|setinfo", "ping")
    )
    everything = sum(v for k, v in delta.items() if k != "info")
    ideal = 16 / statistics.mean(hold) * duration
    print(
        f"(b) 8 processes x 50 tasks, capacity 16, holds {hold[0] * 1e3:.0f}-{hold[1] * 1e3:.0f} ms, {duration:.0f} s:\n"
        f"    grants/s {total / elapsed:.0f} (ideal {ideal / duration:.0f}: {total / ideal:.0%} of the slots' time used)\n"
        f"    per process {grants}; Jain's index {jain(grants):.4f}\n"
        f"    worst wait {max(r['max_wait'] for r in results) * 1e3:.0f} ms, median of medians "
        f"{statistics.median(r['p50_wait'] for r in results) * 1e3:.1f} ms\n"
        f"    Redis commands per grant: {client / total:.3f} client-issued "
        f"(evalsha {delta.get('evalsha', 0)}, blpop {delta.get('blpop', 0)}), "
        f"{everything / total:.3f} including the script's own"
    )


def rate_bound(server: RedisProc, duration: float = 5.0) -> None:
    from tests.fleet.test_rate_processes import LAG_S, worst_excess

    rpm, burst_s = 1200.0, 0.5
    configs = [
        {
            "name": "bench-c",
            "url": server.url,
            "capacity": 16,
            "tasks": 20,
            "duration": duration,
            "hold": (0.001, 0.005),
            "backend": "asyncio" if i % 2 == 0 else "trio",
            "seed": i,
            "times": True,
            "rate": {"requests_per_minute": rpm, "burst_s": burst_s},
        }
        for i in range(8)
    ]
    fleet = Fleet(configs)
    fleet.go()
    results = fleet.results(timeout=duration + 60)
    times = sorted(t for r in results for t in r["grant_mono"])
    per_s = rpm / 60
    span = times[-1] - times[0]
    tight = worst_excess(times, [1] * len(times), per_s, per_s * burst_s, 0.0)
    slack = worst_excess(times, [1] * len(times), per_s, per_s * burst_s, LAG_S)
    grants = [r["grants"] for r in results]
    print(
        f"(c) fleet rate, 8 processes x 20 tasks, {rpm:.0f}/min, burst {burst_s} s, "
        f"{duration:.0f} s:\n"
        f"    admitted {len(times)} in {span:.2f} s = {len(times) / span * 60:.0f}/min "
        f"(rate x span + burst = {per_s * span + per_s * burst_s:.0f})\n"
        f"    worst excess over rate x d + burst in any span d: {tight:+.1f} admissions with "
        f"no lag allowed, {slack:+.1f} with the stated {LAG_S} s lag (<= 0 holds)\n"
        f"    per process {grants}; Jain's index {jain(grants):.4f}"
    )


def main() -> None:
    sections = set(sys.argv[1:]) or {"a", "b", "c"}
    server = RedisProc()
    server.start()
    try:
        if "a" in sections:
            anyio.run(uncontended, server)
        if "b" in sections:
            contended(server)
        if "c" in sections:
            rate_bound(server)
    finally:
        server.close()


if __name__ == "__main__":
    main()
