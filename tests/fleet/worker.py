"""One fleet process for the multi-process tests and the benchmark (run as a script).

Usage: ``python worker.py '<json settings>'``. Starts ``tasks`` tasks on ``backend``
(asyncio or trio) that, until ``duration`` seconds have passed, acquire a fleet slot,
increment a shared counter in Redis (remembering its maximum), hold the slot for a random
time, decrement the counter and release. Prints one JSON line of results.

The counter is incremented after the grant and decremented before the release, so its
maximum can only under-state the real concurrency, never over-state it.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from typing import Any

import anyio

from anygate import Busy, Rate
from anygate.fleet import FleetGate, FleetUnavailable

COUNT = """
local v = redis.call('INCRBY', KEYS[1], ARGV[1])
if tonumber(ARGV[1]) > 0 and v > tonumber(redis.call('GET', KEYS[2]) or '0') then
  redis.call('SET', KEYS[2], v)
end
return v
"""


async def main(cfg: dict[str, Any]) -> dict[str, Any]:
    import coredis

    rng = random.Random(cfg.get("seed", 0))
    fleet = FleetGate(
        cfg["name"],
        capacity=cfg["capacity"],
        url=cfg["url"],
        lease_ttl=cfg.get("lease_ttl", 10.0),
        ticket_ttl=cfg.get("ticket_ttl", 2.0),
        restart_grace=cfg.get("restart_grace"),
        op_timeout=cfg.get("op_timeout", 1.0),
        linger=cfg.get("linger", 1.0),
        on_unavailable=cfg.get("mode", "closed"),
        fallback_capacity=cfg.get("fallback"),
        backend=cfg.get("agent_backend", cfg["backend"]),
        **({"rate": Rate(**cfg["rate"])} if cfg.get("rate") else {}),
    )
    counter_url = cfg.get("counter_url")
    out: dict[str, Any] = {"grants": 0, "busy": 0, "unavailable": 0, "max_wait": 0.0}
    grant_times: list[float] = []
    grant_mono: list[float] = []  # CLOCK_MONOTONIC: one clock for every process of a host
    settled: list[int] = []
    stated, settle = cfg.get("tokens"), cfg.get("settle")
    unavailable_times: list[float] = []
    unavailable_mono: list[float] = []
    # (granted, released) on CLOCK_MONOTONIC: the gate's grant time (Token.admitted_at)
    # and a time taken before the release, so the overlap they show can only under-state
    # the real one.
    intervals: list[tuple[float, float]] = []
    waits: list[float] = []
    hold_min, hold_max = cfg.get("hold", (0.005, 0.05))
    retry_pause = cfg.get("retry_pause", 0.05)
    fleet.statistics()  # starts the agent
    # Start barrier: the parent says go once every worker is ready (imports on a loaded
    # machine take seconds, and the processes must overlap).
    print("ready", flush=True)
    await anyio.to_thread.run_sync(sys.stdin.readline)
    end_at = time.time() + cfg["duration"]
    out["started"] = time.time()
    client: Any = None
    if counter_url:
        client = coredis.Redis.from_url(counter_url, decode_responses=True)
    keys = [f"count:{cfg['name']}", f"max:{cfg['name']}"]

    async def task() -> None:
        count = client.register_script(COUNT) if client is not None else None
        while time.time() < end_at:
            t0 = time.monotonic()
            try:
                token = await fleet.acquire(
                    timeout=cfg.get("acquire_timeout", 30.0),
                    **({} if stated is None else {"tokens": stated}),
                )
            except FleetUnavailable:
                out["unavailable"] += 1
                unavailable_times.append(time.time())
                unavailable_mono.append(time.monotonic())
                await anyio.sleep(retry_pause)
                continue
            except Busy:
                out["busy"] += 1
                await anyio.sleep(retry_pause)
                continue
            # The grant's own time: a slot handed over just before a SIGSTOP is held
            # from then, though this task runs again only after the SIGCONT.
            granted_at = token.admitted_at
            assert granted_at is not None
            waited = granted_at - t0
            waits.append(waited)
            out["max_wait"] = max(out["max_wait"], waited)
            try:
                if count is not None:
                    await count(keys=keys, args=[1])
                out["grants"] += 1
                grant_times.append(time.time())
                grant_mono.append(time.monotonic())
                if settle is not None:
                    token.settle(tokens=settle)
                settled.append(token.tokens)
                await anyio.sleep(rng.uniform(hold_min, hold_max))
                if count is not None:
                    await count(keys=keys, args=[-1])
            finally:
                intervals.append((granted_at, time.monotonic()))
                token.release()

    if client is not None:
        async with client:
            async with anyio.create_task_group() as tg:
                for _ in range(cfg["tasks"]):
                    tg.start_soon(task)
    else:
        async with anyio.create_task_group() as tg:
            for _ in range(cfg["tasks"]):
                tg.start_soon(task)
    stats = fleet.statistics()
    fleet.close()
    waits.sort()
    out["p50_wait"] = waits[len(waits) // 2] if waits else 0.0
    out["redis_calls"] = stats.redis_calls
    if cfg.get("times"):
        out["grant_times"] = grant_times
        out["grant_mono"] = grant_mono
        out["settled"] = settled
        out["unavailable_times"] = unavailable_times
        out["unavailable_mono"] = unavailable_mono
        out["intervals"] = intervals
    return out


if __name__ == "__main__":
    import faulthandler
    import signal

    faulthandler.register(signal.SIGUSR1, all_threads=True)  # debugging a stuck worker
    if os.environ.get("ANYGATE_FLEET_DEBUG"):
        import logging

        logging.basicConfig(
            level=logging.DEBUG, format="%(relativeCreated)d %(threadName)s %(message)s"
        )
    settings = json.loads(sys.argv[1])
    result = anyio.run(main, settings, backend=settings["backend"])
    print(json.dumps(result), flush=True)
