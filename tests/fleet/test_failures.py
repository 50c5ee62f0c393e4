"""The fleet gate's failure paths (issue 27), each on a real redis-server.

The script-level tests drive the fleet's one Lua script through a :class:`Session` as two
processes would (two process ids), so the interleaving that broke is exact rather than a
race to win; the gate-level tests run whole fleet gates against a server they restart.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from anygate.fleet._redis import Link

if TYPE_CHECKING:
    from .redis_proc import RedisProc

pytestmark = pytest.mark.anyio

# No grace by default: the session's server has just started, and a newcomer on a server
# younger than the grace waits it out (see the restart test).
_MS = {"lease_ms": 10_000, "ticket_ms": 2_000, "grace_ms": 0}


def held_by(server: RedisProc, name: str) -> dict[str, int]:
    raw = server.command("HGETALL", f"anygate:{{{name}}}:held").split(b"\r\n")
    values = [x.decode() for x in raw if x and not x.startswith((b"*", b"$"))]
    return {values[i]: int(values[i + 1]) for i in range(0, len(values), 2)}


async def sync(session: Any, pid: str, *, keep: int, want: int, cap: int, **kw: Any) -> Any:
    args: dict[str, Any] = {"demand": want, "wantmax": want, "want": want, "cap": cap}
    args.update(_MS)
    args.update(kw)
    return await session.call(pid, keep=keep, **args)


async def test_raising_the_capacity_from_a_queued_holder_keeps_its_leases(
    redis_server: RedisProc, gate_name: str
) -> None:
    """A holds 4 of 4 with a fifth caller queued and raises the capacity to 5: Redis still
    counts A's 4 plus the 1 granted, so B is granted nothing (before: A's count became 1
    and B got 4, 8 in use against 5)."""
    link = Link(redis_server.url, gate_name, op_timeout=2.0)
    async with link.session() as session:
        first = await sync(session, "A", keep=0, want=4, cap=4)
        assert first.held == 4
        queued = await sync(session, "A", keep=4, want=5, cap=4)
        assert queued.held == 4
        raised = await sync(session, "A", keep=4, want=4, cap=5, op="cap")
        assert raised.cap == 5
        assert raised.held == 5
        assert held_by(redis_server, gate_name) == {"A": 5}
        other = await sync(session, "B", keep=0, want=4, cap=5)
        assert other.held == 0
        assert sum(held_by(redis_server, gate_name).values()) == 5


async def test_a_newcomer_after_an_empty_restart_waits_for_the_survivors(
    redis_factory: Any, gate_name: str
) -> None:
    """A holds 4 of 4; Redis restarts empty; B, a process that never saw Redis, syncs
    first: it is granted nothing while the restart grace runs, and A re-asserts its 4
    (before: B was granted 4, then A re-asserted 4: 8 recorded against 4)."""
    server = redis_factory()
    link = Link(server.url, gate_name, op_timeout=2.0)
    async with link.session() as session:
        a = await sync(session, "A", keep=0, want=4, cap=4, grace_ms=0)
        assert a.held == 4
    server.stop()
    server.start()
    async with link.session() as session:
        b = await sync(session, "B", keep=0, want=4, cap=4, grace_ms=60_000)
        assert b.held == 0
        assert b.grace_left > 0
        back = await sync(session, "A", keep=4, want=4, cap=4, epoch=a.epoch, grace_ms=60_000)
        assert back.held == 4
        again = await sync(session, "B", keep=0, want=4, cap=4, grace_ms=60_000)
        assert again.held == 0
        assert held_by(server, gate_name).get("B", 0) == 0
        assert sum(held_by(server, gate_name).values()) == 4
