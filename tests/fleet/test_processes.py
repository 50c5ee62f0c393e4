"""The fleet across real OS processes: half asyncio, half trio, one Redis.

Each worker process runs its own agent and callers; a counter in Redis, incremented after
every grant and decremented before every release, records the highest concurrency seen
fleet-wide (it can only under-state the truth, so ``max <= capacity`` is a sound check).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import pytest

from .fleetproc import Fleet

if TYPE_CHECKING:
    from collections.abc import Callable

    from .redis_proc import RedisProc


# Several processes each: run once per CI run, not per Python (see pyproject markers).
pytestmark = pytest.mark.processes


def jain(values: list[float]) -> float:
    """Jain's fairness index: 1 when all equal, 1/n when one gets everything."""
    total = sum(values)
    squares = sum(v * v for v in values)
    return total * total / (len(values) * squares) if squares else 1.0


def _configs(n: int, **common: Any) -> list[dict[str, Any]]:
    return [{**common, "backend": "asyncio" if i % 2 == 0 else "trio", "seed": i} for i in range(n)]


def _strings(reply: bytes) -> list[str]:
    """The bulk strings of a flat RESP array reply (``TIME``, ``ZRANGE ... WITHSCORES``)."""
    lines = reply.split(b"\r\n")
    return [lines[i + 1].decode() for i, line in enumerate(lines[:-1]) if line.startswith(b"$")]


def _redis_ms(server: RedisProc) -> float:
    """Redis ``TIME`` in milliseconds: the clock every lease and ticket is scored on."""
    seconds, micros = _strings(server.command("TIME"))
    return int(seconds) * 1000 + int(micros) / 1000


def _scores(server: RedisProc, key: str) -> dict[str, float]:
    """Members of a sorted set and their scores (Redis-time milliseconds)."""
    flat = _strings(server.command("ZRANGE", key, 0, -1, "WITHSCORES"))
    return {flat[i]: float(flat[i + 1]) for i in range(0, len(flat), 2)}


def _maximum(server: RedisProc, name: str) -> int:
    reply = server.command("GET", f"max:{name}")
    return int(reply.split(b"\r\n")[1]) if reply.startswith(b"$") and b"$-1" not in reply else 0


def _run_mixed(server: RedisProc, name: str, duration: float) -> list[dict[str, Any]]:
    fleet = Fleet(
        _configs(
            8,
            name=name,
            url=server.url,
            counter_url=server.url,
            capacity=16,
            tasks=50,
            duration=duration,
            hold=(0.002, 0.03),
            lease_ttl=5.0,
        )
    )
    try:
        fleet.go()
        results = fleet.results(timeout=duration + 60)
    finally:
        fleet.kill()
    return results


def test_eight_mixed_processes_never_exceed_capacity(
    redis_server: RedisProc, gate_name: str
) -> None:
    """8 processes (4 asyncio, 4 trio) x 50 tasks, capacity 16: never more than 16 at once,
    and every process is served (a short run; the 20 s soak is the slow test below)."""
    results = _run_mixed(redis_server, gate_name, duration=3.0)
    assert 0 < _maximum(redis_server, gate_name) <= 16
    grants = [r["grants"] for r in results]
    assert all(g > 0 for g in grants), grants
    assert all(r["busy"] == 0 and r["unavailable"] == 0 for r in results)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_eight_mixed_processes_soak_20s(redis_server: RedisProc, gate_name: str) -> None:
    """The same for 20 s: the cap holds, every process is served, shares are fair."""
    results = _run_mixed(redis_server, gate_name, duration=20.0)
    assert 0 < _maximum(redis_server, gate_name) <= 16
    grants = [r["grants"] for r in results]
    assert all(g > 0 for g in grants), grants
    assert jain(grants) >= 0.95, grants


@pytest.mark.timeout(90)
def test_sigkilled_holder_slots_come_back_within_the_ttl(
    redis_server: RedisProc, gate_name: str
) -> None:
    """A process holding every slot is SIGKILLed; its slots return within the lease TTL.

    Checked on Redis time, the clock leases live on: when it dies, the holder's leases
    expire at most ``lease_ttl`` later (the one heartbeat renews them all), and they come
    back through that expiry (the dead process is swept from ``held``). The wall-clock
    deadline below only guards against a hang."""
    import anyio

    from anygate.fleet import FleetGate

    ttl = 2.0
    holder = Fleet(
        [
            {
                "name": gate_name,
                "url": redis_server.url,
                "capacity": 4,
                "tasks": 4,
                "duration": 600,
                "hold": (600, 600),
                "backend": "trio",
                "lease_ttl": ttl,
                "ticket_ttl": 0.5,
            }
        ]
    )
    try:
        holder.go()
        fleet = FleetGate(
            gate_name, capacity=4, url=redis_server.url, lease_ttl=ttl, ticket_ttl=0.5
        )
        try:

            async def main() -> tuple[dict[str, float], float, list[str]]:
                # Wait until the holder has all four (then nobody here is admitted).
                with anyio.fail_after(30):
                    while True:
                        raw = redis_server.command("HGETALL", f"{prefix}held")
                        if b"\r\n4\r\n" in raw:
                            break
                        await anyio.sleep(0.05)
                holder.kill()  # SIGKILL
                killed_at = _redis_ms(redis_server)
                expiries = _scores(redis_server, f"{prefix}exp")  # only the holder's so far
                with anyio.fail_after(60):  # a hang guard, far beyond the TTL
                    tokens = [await fleet.acquire() for _ in range(4)]
                holders = _strings(redis_server.command("HKEYS", f"{prefix}held"))
                for token in tokens:
                    token.release()
                return expiries, killed_at, holders

            prefix = f"anygate:{{{gate_name}}}:"
            expiries, killed_at, holders_after = anyio.run(main)
        finally:
            fleet.close()
    finally:
        holder.kill()
    # The leases lapse on Redis time at most ttl after the kill (their last renewal came
    # before it), and the slots came back through that lapse: the dead holder is swept.
    assert len(expiries) == 1, expiries
    ((dead_pid, expiry),) = expiries.items()
    assert expiry <= killed_at + ttl * 1000
    assert dead_pid not in holders_after


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["closed", "open"])
def test_redis_killed_and_restarted_empty_mid_run(
    redis_server: RedisProc, redis_factory: Callable[[], RedisProc], gate_name: str, mode: str
) -> None:
    """8 processes; Redis is SIGKILLed mid-run and restarted empty on the same port.

    closed: callers get FleetUnavailable while it is down, and the fleet admits again
    after the restart (the prototype's failure: it never did with 8 processes).
    open: the fleet keeps admitting, within capacity throughout (counter on another server).
    """
    fleet_redis = redis_factory()
    name = f"{gate_name}-{mode}"
    duration = 9.0
    fleet = Fleet(
        _configs(
            8,
            name=name,
            url=fleet_redis.url,
            counter_url=redis_server.url,
            capacity=16,
            tasks=20,
            duration=duration,
            hold=(0.005, 0.05),
            lease_ttl=2.0,
            ticket_ttl=0.5,
            restart_grace=1.0,
            op_timeout=0.5,
            mode=mode,
            times=True,
            acquire_timeout=5.0,
        )
    )
    try:
        start_at = fleet.go()
        time.sleep(max(0.0, start_at + 2.5 - time.time()))
        fleet_redis.stop()
        down_at = time.time()
        time.sleep(2.0)
        fleet_redis.start()
        up_at = time.time()
        results = fleet.results(timeout=duration + 60)
    finally:
        fleet.kill()
    assert _maximum(redis_server, name) <= 16
    after = [sum(1 for t in r["grant_times"] if t > up_at + 2.0) for r in results]
    before = [sum(1 for t in r["grant_times"] if t < down_at) for r in results]
    assert all(b > 0 for b in before), before
    # Every process is admitted again once Redis is back (restart grace included).
    assert all(a > 0 for a in after), after
    if mode == "closed":
        refused = sum(len(r["unavailable_times"]) for r in results)
        assert refused > 0
        # Refusals happen while Redis is down (plus detection and the grace), not later.
        late = [t for r in results for t in r["unavailable_times"] if t > up_at + 2.0]
        assert not late, late
    else:
        assert all(r["unavailable"] == 0 for r in results)


@pytest.mark.timeout(90)
def test_dead_waiter_at_the_head_blocks_nobody_beyond_the_ticket_ttl(
    redis_server: RedisProc, gate_name: str
) -> None:
    """A waiting process queued first is SIGKILLed; when slots free up, the next process gets
    them within the ticket TTL (0.5 s), not the lease TTL (20 s) of the dead one."""
    import anyio

    from anygate.fleet import FleetGate

    settings = {"capacity": 2, "url": redis_server.url, "lease_ttl": 20.0, "ticket_ttl": 0.5}
    holder = FleetGate(gate_name, **settings)
    second = FleetGate(gate_name, **settings)
    dead = Fleet(
        [
            {
                "name": gate_name,
                "url": redis_server.url,
                "capacity": 2,
                "tasks": 5,
                "duration": 600,
                "hold": (600, 600),
                "backend": "asyncio",
                "lease_ttl": 20.0,
                "ticket_ttl": 0.5,
            }
        ]
    )
    try:

        async def main() -> tuple[float, float, str, list[str]]:
            held = [await holder.acquire(timeout=20) for _ in range(2)]
            dead.go()
            queue = f"anygate:{{{gate_name}}}:q"
            with anyio.fail_after(30):  # the doomed process is queued (first)
                while b"*1\r\n" not in redis_server.command("ZRANGE", queue, 0, -1):
                    await anyio.sleep(0.02)
            head = _strings(redis_server.command("ZRANGE", queue, 0, 0))[0]  # the doomed one
            got: list[object] = []
            async with anyio.create_task_group() as tg:

                async def wait() -> None:
                    got.append(await second.acquire(timeout=30))

                for _ in range(2):
                    tg.start_soon(wait)
                with anyio.fail_after(30):  # and the second one queued behind it
                    while b"*2\r\n" not in redis_server.command("ZRANGE", queue, 0, -1):
                        await anyio.sleep(0.02)
                dead.kill()  # SIGKILL while first in line
                killed_at = _redis_ms(redis_server)
                ticket = _scores(redis_server, f"anygate:{{{gate_name}}}:tix")[head]
                for token in held:
                    token.release()
                # A hang guard, and below the dead process's 20 s lease TTL: waiting that
                # long would mean its lease, not its ticket, decided.
                with anyio.fail_after(15.0):
                    while len(got) < 2:
                        await anyio.sleep(0.01)
            queued_after = _strings(redis_server.command("ZRANGE", queue, 0, -1))
            for token in got:
                token.release()  # type: ignore[attr-defined]
            return killed_at, ticket, head, queued_after

        killed_at, ticket, head, queued_after = anyio.run(main)
    finally:
        dead.kill()
        holder.close()
        second.close()
    # On Redis time: the dead head's ticket lapses within ticket_ttl of the kill (it was
    # renewed before it), and it was passed by dropping that ticket: it left the queue.
    assert ticket <= killed_at + 0.5 * 1000
    assert head not in queued_after
