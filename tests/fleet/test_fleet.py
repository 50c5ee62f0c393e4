"""FleetGate in one test process: several fleet gates of one name act as several processes.

Each FleetGate has its own agent (its own identity, thread and Redis connections), so two
of them in one process behave towards Redis exactly like two processes; their callers run
on the test's backend (asyncio, asyncio+uvloop, trio) and the agents on asyncio or trio.
Waits for a fleet-wide condition are bounded polls (``eventually``): the state lives in
another thread and in Redis, so there is nothing local to wait on.
"""

from __future__ import annotations

import gc
import pickle
import threading
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
import pytest

import anygate
from anygate.fleet import FleetGate, FleetUnavailable

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from .redis_proc import RedisProc

pytestmark = pytest.mark.anyio


def agent_backend(anyio_backend: Any) -> str:
    name = anyio_backend if isinstance(anyio_backend, str) else anyio_backend[0]
    return "trio" if name == "trio" else "asyncio"


@pytest.fixture
def make(anyio_backend: Any) -> Iterator[Callable[..., FleetGate]]:
    """Fleet gates with short TTLs, closed after the test."""
    made: list[FleetGate] = []

    def build(name: str, url: str, **kwargs: Any) -> FleetGate:
        settings: dict[str, Any] = {
            "capacity": 3,
            "lease_ttl": 2.0,
            "ticket_ttl": 0.5,
            "op_timeout": 0.5,
            "linger": 0.0,
            "restart_grace": 0.5,
            "backend": agent_backend(anyio_backend),
        }
        settings.update(kwargs)
        fleet = FleetGate(name, url=url, **settings)
        made.append(fleet)
        return fleet

    yield build
    for fleet in made:
        fleet.close()
    gc.collect()  # coredis's leaked streams, while the conftest's filter is active


async def eventually(check: Callable[[], bool], within: float = 10.0) -> None:
    with anyio.fail_after(within):
        while not check():
            await anyio.sleep(0.01)


def held_in_redis(server: RedisProc, name: str) -> int:
    raw = server.command("HVALS", f"anygate:{{{name}}}:held").split(b"\r\n")
    return sum(int(x) for x in raw if x.isdigit())


async def test_two_processes_never_exceed_the_fleet_capacity(
    redis_server: RedisProc, gate_name: str, make: Callable[..., FleetGate]
) -> None:
    """Two fleet gates (two processes to Redis) with 8 tasks each: at most 3 at once."""
    fleets = [make(gate_name, redis_server.url) for _ in range(2)]
    current = peak = 0
    served = [0, 0]

    async def task(i: int) -> None:
        nonlocal current, peak
        for _ in range(15):
            async with fleets[i].acquire(timeout=20):
                current += 1
                peak = max(peak, current)
                served[i] += 1
                await anyio.sleep(0.002)
                current -= 1

    async with anyio.create_task_group() as tg:
        for i in (0, 1):
            for _ in range(8):
                tg.start_soon(task, i)
    assert peak <= 3
    assert served == [120, 120]


async def test_tokens_are_ordinary_tokens_usable_by_policy_and_threads(
    redis_server: RedisProc, gate_name: str, make: Callable[..., FleetGate]
) -> None:
    """A fleet slot is an anygate.Token: Policy on fleet.gate, sync threads, cross-task release."""
    fleet = make(gate_name, redis_server.url, capacity=2)
    policy = anygate.Policy(
        name="fleet-policy", gate=fleet.gate, adaptive_concurrency=False, circuit_breaker=None
    )

    async def call() -> int:
        assert fleet.gate.in_flight >= 1
        return 7

    assert await policy.call(call) == 7

    def in_thread() -> bool:
        token = fleet.acquire_sync(timeout=20)
        with token:
            return isinstance(token, anygate.Token)

    results = [await anyio.to_thread.run_sync(in_thread) for _ in range(3)]
    assert results == [True, True, True]
    token = await fleet.acquire(timeout=20)
    done = threading.Event()
    threading.Thread(target=lambda: (token.release(), token.release(), done.set())).start()
    await anyio.to_thread.run_sync(done.wait)
    assert token.released
    await eventually(lambda: fleet.gate.in_flight == 0)


async def test_a_policy_with_its_defaults_on_a_fleet_gate_gets_its_first_call_through(
    redis_server: RedisProc, gate_name: str, make: Callable[..., FleetGate]
) -> None:
    """``Policy(gate=fleet.gate)`` with the adaptive limit on (the default), made before
    the agent's first lease (the local gate starts at capacity 0): the limit adopted 0 as
    its maximum, and the first call, admitted once a lease came, was held at the send
    forever (``_over_limit``). The capacity the agent sets is adopted as the maximum."""
    fleet = make(gate_name, redis_server.url, capacity=2)
    policy = anygate.Policy(name="fleet-defaults", gate=fleet.gate)

    async def call() -> int:
        return 7

    with anyio.fail_after(20):
        assert await policy.call(call) == 7
        assert await policy.call(call) == 7
    assert policy.adaptive_limit.max_concurrent_calls >= 1


async def test_capacity_changes_live_from_another_process_and_lowering_revokes_nothing(
    redis_server: RedisProc, gate_name: str, make: Callable[..., FleetGate]
) -> None:
    """Lowering from one process: holders keep their slots, nobody new until below; raising
    from the other admits queued callers at once."""
    a = make(gate_name, redis_server.url, capacity=4)
    b = make(gate_name, redis_server.url, capacity=4)
    held = [await a.acquire(timeout=20) for _ in range(4)]
    await b.set_capacity(2)
    assert a.capacity in (2, 4)
    assert b.capacity == 2
    # Nothing was revoked: all four tokens are still held.
    assert not any(t.released for t in held)
    waiter_got: list[anygate.Token] = []

    async def wait_in_b() -> None:
        waiter_got.append(await b.acquire(timeout=20))

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait_in_b)
        held.pop().release()
        held.pop().release()
        # 2 still held by a: at the new capacity, b is not admitted.
        await anyio.sleep(0.3)
        assert not waiter_got
        held.pop().release()  # 1 held: b may have one
    assert len(waiter_got) == 1
    waiter_got[0].release()
    held.pop().release()
    # Raise from b; a's queued callers are admitted up to the new capacity.
    tokens: list[anygate.Token] = []

    async def take() -> None:
        tokens.append(await a.acquire(timeout=20))

    async with anyio.create_task_group() as tg:
        for _ in range(5):
            tg.start_soon(take)
        await eventually(lambda: len(tokens) == 2)
        await b.set_capacity(5)
    assert len(tokens) == 5
    for token in tokens:
        token.release()


async def test_cancellation_storm_during_blocking_waits_leaks_nothing(
    redis_server: RedisProc, gate_name: str, make: Callable[..., FleetGate]
) -> None:
    """Callers cancelled at random while the fleet is full: afterwards every lease returns."""
    holder = make(gate_name, redis_server.url, capacity=3)
    crowd = make(gate_name, redis_server.url, capacity=3)
    held = [await holder.acquire(timeout=20) for _ in range(3)]
    async with anyio.create_task_group() as tg:
        for i in range(40):

            async def wait(delay: float = (i % 7) * 0.01) -> None:
                with anyio.move_on_after(0.02 + delay):
                    async with crowd.acquire():
                        await anyio.lowlevel.checkpoint()

            tg.start_soon(wait)
        # Release in the middle of the storm: grants and cancellations race.
        await anyio.sleep(0.04)
        for token in held:
            token.release()
    await eventually(lambda: crowd.gate.in_flight == 0 and crowd.gate.waiting == 0)
    # Every lease is back in the fleet: 3 fresh acquires succeed, from either side.
    await eventually(lambda: held_in_redis(redis_server, gate_name) == 0)
    again = [await crowd.acquire(timeout=20) for _ in range(3)]
    for token in again:
        token.release()


async def test_closed_mode_outage_is_busy_at_once_and_admits_after_restart(
    redis_factory: Callable[[], RedisProc], gate_name: str, make: Callable[..., FleetGate]
) -> None:
    """Closed: a parked caller and a newcomer get FleetUnavailable (naming the fleet and the
    cause) long before their timeout; after Redis restarts empty, the fleet admits again."""
    server = redis_factory()
    fleet = make(gate_name, server.url, capacity=1)
    token = await fleet.acquire(timeout=20)
    outcome: list[BaseException] = []

    async def parked() -> None:
        try:
            await fleet.acquire(timeout=60)
        except FleetUnavailable as exc:
            outcome.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(parked)
        await eventually(lambda: fleet.gate.waiting == 1)
        server.stop()
        with anyio.fail_after(10):  # far below the caller's 60 s timeout
            while not outcome:
                await anyio.sleep(0.01)
    exc = outcome[0]
    assert isinstance(exc, anygate.Busy)
    assert gate_name in str(exc)
    assert "Redis at 127.0.0.1" in str(exc)
    with pytest.raises(FleetUnavailable):
        await fleet.acquire(timeout=60)
    token.release()
    server.start()
    with anyio.fail_after(15):
        while True:
            try:
                again = await fleet.acquire(timeout=5)
                break
            except FleetUnavailable:
                await anyio.sleep(0.05)
    again.release()


async def test_open_mode_outage_falls_back_to_the_stated_local_share(
    redis_factory: Callable[[], RedisProc], gate_name: str, make: Callable[..., FleetGate]
) -> None:
    """Open: while Redis is down this process admits up to fallback_capacity, no more."""
    server = redis_factory()
    fleet = make(gate_name, server.url, capacity=4, on_unavailable="open", fallback_capacity=2)
    (await fleet.acquire(timeout=20)).release()
    server.stop()
    await eventually(lambda: fleet.statistics().unavailable is not None)
    await eventually(lambda: fleet.gate.capacity == 2)
    tokens = [await fleet.acquire(timeout=5) for _ in range(2)]
    with pytest.raises(anygate.Busy) as info:
        await fleet.acquire(timeout=0.2)
    assert not isinstance(info.value, FleetUnavailable)
    for token in tokens:
        token.release()


async def test_restart_empty_holders_reassert_and_nothing_is_double_admitted(
    redis_factory: Callable[[], RedisProc], gate_name: str, make: Callable[..., FleetGate]
) -> None:
    """Redis restarts empty while a holds 2 of 3: a re-asserts them, so b gets at most 1."""
    server = redis_factory()
    a = make(gate_name, server.url, capacity=3, restart_grace=1.0)
    b = make(gate_name, server.url, capacity=3, restart_grace=1.0)
    mine = [await a.acquire(timeout=20) for _ in range(2)]
    (await b.acquire(timeout=20)).release()
    server.stop()
    server.start()
    got: list[anygate.Token] = []

    async def grab() -> None:
        while not await _try_append(got, b):
            await anyio.sleep(0.05)

    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(grab)
        await eventually(lambda: len(got) == 1, within=15)
        await anyio.sleep(0.5)  # more would have been granted by now if a had not re-asserted
        assert len(got) == 1
        assert held_in_redis(server, gate_name) == 3
        for token in mine:
            token.release()
    assert len(got) == 3
    for token in got:
        token.release()


async def _try_append(got: list[anygate.Token], fleet: FleetGate) -> bool:
    try:
        got.append(await fleet.acquire(timeout=10))
    except FleetUnavailable:  # Redis is still coming back
        return False
    return True


@pytest.mark.parametrize(
    ("kwargs", "complaint"),
    [
        ({"capacity": -1}, "capacity must be an int >= 0"),
        ({"capacity": 2.5}, "capacity must be an int >= 0"),
        ({"capacity": 2**80}, "capacity must be an int >= 0 and < 2\\*\\*53"),
        ({"lease_ttl": float("nan")}, "lease_ttl must be a finite number"),
        ({"lease_ttl": 1.0, "ticket_ttl": 2.0}, "ticket_ttl must be shorter than lease_ttl"),
        ({"on_unavailable": "maybe"}, "on_unavailable must be one of 'closed', 'open'"),
        ({"backend": "curio"}, "backend must be one of"),
        ({"url": "localhost"}, "url must be a redis://"),
        ({"fallback_capacity": True}, "fallback_capacity must be an int"),
    ],
)
def test_bad_settings_name_the_parameter(kwargs: dict[str, Any], complaint: str) -> None:
    """Every bad setting is refused with its name, the constraint and the value."""
    settings: dict[str, Any] = {"capacity": 2}
    settings.update(kwargs)
    with pytest.raises((TypeError, ValueError), match=complaint):
        FleetGate("x", **settings)


@pytest.mark.parametrize("name", ["", "a{b", "c}", 3])
def test_bad_names_are_refused(name: Any) -> None:
    """A name must be usable as one Redis Cluster hash tag."""
    with pytest.raises((TypeError, ValueError), match="name must be"):
        FleetGate(name, capacity=1)


def test_fleet_unavailable_is_busy_and_pickles() -> None:
    """FleetUnavailable is a Busy (HTTP 429 paths keep working) and survives pickling."""
    exc = FleetUnavailable(
        fleet="llm", cause="Redis at h:1: refused", capacity=4, in_flight=1, waited=0.0
    )
    assert isinstance(exc, anygate.Busy)
    back = pickle.loads(pickle.dumps(exc))
    assert (back.fleet, back.cause, str(back)) == ("llm", "Redis at h:1: refused", str(exc))
    assert "fleet gate 'llm' is unavailable" in str(exc)
