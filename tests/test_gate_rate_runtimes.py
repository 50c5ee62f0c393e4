"""Rate admission on real loops and threads: asyncio, asyncio+uvloop, trio, plain threads.

Durations are never asserted. Where a test needs a budget that stays empty or fills at a
chosen moment, the gate runs on a test-controlled clock (``clock=lambda: now[0]``): waiters
then park with real timers that never fire within the test, so only the step under test (a
refund, a rate change, a dead loop) can wake them, and ``fail_after`` turns a lost wake-up
into a failure instead of a hang.
"""

from __future__ import annotations

import asyncio
import random
import threading
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

import anyio
import pytest

from anygate import Gate, Rate, Token

from .test_gate_runtimes import loop_thread, start_thread, wait_until

if TYPE_CHECKING:
    from concurrent.futures import Future

pytestmark = pytest.mark.anyio


def manual_clock(start: float = 0.0) -> tuple[list[float], Any]:
    now = [start]
    return now, lambda: now[0]


async def test_budget_waiters_go_in_arrival_order_on_real_timers(anyio_backend: Any) -> None:
    """One admission per millisecond: each next waiter sleeps on its loop's timer, FIFO holds.

    One slot as well, so that each admission waits for the previous holder's release: the
    order the tasks *resume* in is then the order they were admitted in. (Uncapped, a late
    timer on a loaded machine admits two waiters at once, and trio may run the second one
    first: FIFO admission, but not what ``order`` records.)
    """
    gate = Gate(1, rate=Rate(requests_per_minute=60_000, burst_s=0.001))
    order: list[int] = []

    async def call(i: int) -> None:
        async with gate.acquire():
            order.append(i)

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            for i in range(20):
                tg.start_soon(call, i)
                await anyio.wait_all_tasks_blocked()
    assert order == list(range(20))
    stats = gate.statistics()
    assert (stats.admitted, stats.in_flight, stats.waiting) == (20, 0, 0)


async def test_settle_refund_from_a_thread_wakes_a_budget_waiter(anyio_backend: Any) -> None:
    """A refund settled on another thread admits the budget-bound head on this loop at once."""
    now, clock = manual_clock()
    gate = Gate(rate=Rate(tokens_per_minute=600, burst_s=60), clock=clock)
    now[0] = 100.0  # a full budget: 600 tokens
    big = gate.acquire_nowait(tokens=600)
    admitted = anyio.Event()

    async def second() -> None:
        async with gate.acquire(tokens=300):  # 30 s away on a clock that stands still
            admitted.set()

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(second)
            await anyio.wait_all_tasks_blocked()
            assert gate.waiting == 1
            await anyio.to_thread.run_sync(lambda: big.settle(tokens=200))
            await admitted.wait()
    big.release()
    assert gate.statistics().admitted == 2


async def test_rate_change_from_a_thread_wakes_a_budget_waiter(anyio_backend: Any) -> None:
    """A rate set on another thread admits the waiter that sleeps for the old budget."""
    now, clock = manual_clock()
    gate = Gate(rate=Rate(requests_per_minute=1, burst_s=60), clock=clock)  # due at 60 s

    def change() -> None:
        now[0] = 30.0  # half a request refilled; the level carries over to the new rate
        # A burst of half a request: a request conforms once the budget holds the burst.
        gate.rate = Rate(requests_per_minute=60, burst_s=0.5)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: _acquire_release(gate))
            await anyio.wait_all_tasks_blocked()
            assert gate.waiting == 1
            await anyio.to_thread.run_sync(change)
    assert gate.statistics().admitted == 1


async def _acquire_release(gate: Gate) -> None:
    (await gate.acquire()).release()


def test_budget_head_on_a_closed_loop_gives_its_turn_to_the_next() -> None:
    """A nudge or grant that cannot reach a closed loop drops that waiter; the next one goes."""
    now, clock = manual_clock()
    gate = Gate(rate=Rate(requests_per_minute=1, burst_s=60), clock=clock)  # due at 60 s
    loop = asyncio.new_event_loop()
    queued = threading.Event()
    stranded: list[asyncio.Task[Token]] = []

    async def acquire() -> Token:
        return await gate.acquire()

    async def strand() -> None:
        stranded.append(loop.create_task(acquire()))  # parks and is never resumed
        await asyncio.sleep(0)
        queued.set()

    def run_then_close() -> None:
        loop.run_until_complete(strand())
        loop.close()

    thread = threading.Thread(target=run_then_close)
    thread.start()
    thread.join()
    assert queued.is_set()
    _, second = start_thread(gate.acquire_sync)
    wait_until(lambda: gate.waiting == 2, "the thread to queue behind the stranded task")
    # An earlier admission time for the head: its nudge fails (loop closed), so it is
    # dropped, and the thread becomes the next waiter with its own timer.
    gate.rate = Rate(requests_per_minute=2, burst_s=60)
    wait_until(lambda: gate.waiting == 1, "the dead head to be dropped")
    now[0] = 100.0
    gate.rate = Rate(requests_per_minute=2, burst_s=60)  # budget there: the thread goes
    token = second.result(timeout=10)
    assert isinstance(token, Token)
    assert gate.statistics().cancelled == 1
    token.release()


def test_soak_rated_gate_across_runtimes() -> None:
    """Loops and threads hammer a rated gate with priorities, settles and live rate changes.

    Capacity holds throughout; afterwards nothing is in flight or queued, and every
    acquisition was admitted exactly once.
    """
    gate = Gate(3, rate=Rate(requests_per_minute=120_000, tokens_per_minute=6e6, burst_s=0.01))
    lock = threading.Lock()
    holding = 0
    rounds = 150

    def enter() -> None:
        nonlocal holding
        with lock:
            holding += 1
            assert holding <= 3

    def leave(token: Token, rng: random.Random) -> None:
        nonlocal holding
        with lock:
            holding -= 1
        token.release()
        if rng.random() < 0.5:
            token.settle(tokens=rng.randrange(0, 800))  # after release: still defined

    async def async_worker(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(rounds):
            token = await gate.acquire(tokens=rng.randrange(0, 500), priority=rng.randrange(3))
            enter()
            await anyio.lowlevel.checkpoint()
            leave(token, rng)

    def thread_worker(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(rounds):
            token = gate.acquire_sync(tokens=rng.randrange(0, 500), priority=rng.randrange(3))
            enter()
            leave(token, rng)

    def retune() -> None:
        for n in range(30):
            gate.rate = Rate(
                requests_per_minute=60_000 * (1 + n % 3),
                tokens_per_minute=6e6,
                ramp=None if n % 2 else 4.0,
                window_s=0.5,
                burst_s=0.01,
                ramp_floor=20,
            )
            gate.capacity = 1 + n % 3
            threading.Event().wait(0.002)
        gate.capacity = 3

    with ExitStack() as stack:
        portals = [stack.enter_context(loop_thread(k)) for k in ("asyncio", "asyncio", "trio")]
        futures: list[Future[Any]] = []
        for p, portal in enumerate(portals):
            futures += [portal.start_task_soon(async_worker, p * 10 + k) for k in range(2)]
        futures += [start_thread(lambda i=i: thread_worker(100 + i))[1] for i in range(2)]
        futures.append(start_thread(retune)[1])
        for future in futures:
            future.result(timeout=120)
    stats = gate.statistics()
    assert holding == 0
    assert (stats.in_flight, stats.waiting) == (0, 0)
    assert stats.admitted == 8 * rounds
