"""Introspection: who holds the slots (site, age), who waits (age, runtime), ``available``."""

from __future__ import annotations

import math
import threading
from typing import Any

import anyio
import pytest

import anygate
from anygate import Gate, QueuedCaller, SlotHolder
from anygate._gate import gate as _gate
from anygate._gate import inspect as _inspect
from anygate._gate import ledger as _ledger
from anygate._gate import parking as _parking
from anygate._gate import slot_steps as _slot_steps
from anygate._gate import token as _token
from anygate._gate import waiters as _waiters

from .test_gate_runtimes import await_until

pytestmark = pytest.mark.anyio


class FakeClock:
    """Stands in for time.monotonic in every path that stamps a token or a waiter, and in
    the reports: exact ages. (The parking path was left on the real clock: a first
    acquire that waited for its rate budget's refill, a fraction of a millisecond,
    stamped its token on real time and sorted it after the second: a flaky order.)"""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    for module in (_gate, _parking, _token, _waiters, _inspect, _ledger, _slot_steps):
        monkeypatch.setattr(module, "_monotonic", fake)
    return fake


def _line_of(marker: str) -> int:
    """The line of this file that carries ``marker`` in a comment."""
    with open(__file__, encoding="utf-8") as source:
        for number, line in enumerate(source, 1):
            if line.rstrip().endswith(f"# {marker}") and "_line_of" not in line:
                return number
    raise AssertionError(marker)


async def test_holders_report_site_age_and_cost_oldest_first(
    anyio_backend: Any, clock: FakeClock
) -> None:
    """Each held token appears once with its file:line, exact age and cost; released ones go."""
    gate = Gate(3, rate=anygate.Rate(tokens_per_minute=10**6, burst_s=60))
    other = Gate(3)
    first = await gate.acquire(tokens=5)  # site-first
    clock.now += 2.5
    async with gate.acquire() as second:  # site-second
        other_token = await other.acquire()
        clock.now += 1.0
        holders = gate.holders()
        assert [h.acquired_at for h in holders] == [
            f"{__file__}:{_line_of('site-first')}",
            f"{__file__}:{_line_of('site-second')}",
        ]
        assert [h.age_s for h in holders] == [3.5, 1.0]
        assert [h.tokens for h in holders] == [5, 0]
        assert holders[0].token is first
        assert holders[1].token is second
        assert all(isinstance(h, SlotHolder) for h in holders)
        del holders
    assert [h.token for h in gate.holders()] == [first]
    first.release()
    assert gate.holders() == ()
    assert [h.token for h in other.holders()] == [other_token]
    other_token.release()


async def test_a_queued_callers_slot_is_held_from_its_grant_not_its_wake_up(
    anyio_backend: Any, clock: FakeClock
) -> None:
    """``Token.admitted_at`` and a holder's age count from the moment the gate handed the
    slot over (a release in another task or thread), not from when the waiting task ran
    again: a process stopped in between (SIGSTOP) holds the slot all along, and the fleet's
    fault test measured its overlap from the wake-up. ``None`` before admission; kept
    after the release. The sync path (a thread's queued caller) too."""
    gate = Gate(1)
    holder = await gate.acquire()
    pending = gate.acquire()
    assert pending.admitted_at is None
    granted: list[anygate.Token] = []

    async def wait() -> None:
        granted.append(await pending)

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        await anyio.wait_all_tasks_blocked()
        clock.now = 1005.0
        holder.release()  # the grant: the waiting task has not run yet
        clock.now = 1010.0
    assert granted[0].admitted_at == 1005.0
    assert [h.age_s for h in gate.holders()] == [5.0]
    granted[0].release()
    assert granted[0].admitted_at == 1005.0
    mine = await gate.acquire()
    assert mine.admitted_at == 1010.0
    box: list[anygate.Token] = []
    thread = threading.Thread(target=lambda: box.append(gate.acquire_sync(timeout=10)))
    thread.start()
    await await_until(lambda: bool(gate.waiters()), "the thread to queue")
    clock.now = 1012.0
    mine.release()
    thread.join(10)
    assert box[0].admitted_at == 1012.0
    box[0].release()


async def test_holders_include_tokens_handed_to_threads_and_taken_by_threads(
    anyio_backend: Any,
) -> None:
    """The report is the gate's, not a task's: thread-acquired and handed-over tokens count."""
    gate = Gate(2)
    mine = await gate.acquire()
    box: list[anygate.Token] = []
    thread = threading.Thread(target=lambda: box.append(gate.acquire_sync()))
    thread.start()
    thread.join(10)
    assert {id(h.token) for h in gate.holders()} == {id(mine), id(box[0])}
    assert gate.available == 0
    await anyio.to_thread.run_sync(mine.release)  # released from another thread
    assert [h.token for h in gate.holders()] == box
    box[0].release()
    assert gate.holders() == ()


async def test_waiters_report_age_runtime_priority_and_cost(
    anyio_backend: Any, clock: FakeClock
) -> None:
    """Queued tasks and a blocked thread, highest class first, oldest first within a class."""
    gate = Gate(1)
    holder = gate.acquire_nowait()
    runtime = "trio" if anyio_backend == "trio" else "asyncio"
    got: list[str] = []

    async def task(name: str, priority: int) -> None:
        async with gate.acquire(priority=priority):
            got.append(name)

    def blocking() -> None:
        with gate.acquire_sync(tokens=7):
            got.append("thread")

    async with anyio.create_task_group() as tg:
        tg.start_soon(task, "low", 0)
        await anyio.wait_all_tasks_blocked()
        clock.now += 1.0
        thread = threading.Thread(target=blocking)
        thread.start()
        while gate.waiting < 2:  # the thread queues on its own schedule
            await anyio.to_thread.run_sync(threading.Event().wait, 0.001)
        clock.now += 1.0
        tg.start_soon(task, "high", 5)
        await anyio.wait_all_tasks_blocked()
        clock.now += 0.5
        assert gate.waiters() == (
            QueuedCaller(age_s=0.5, runtime=runtime, priority=5, tokens=0),
            QueuedCaller(age_s=2.5, runtime=runtime, priority=0, tokens=0),
            QueuedCaller(age_s=1.5, runtime="thread", priority=0, tokens=7),
        )
        holder.release()
        await anyio.to_thread.run_sync(thread.join, 10)
    assert got == ["high", "low", "thread"]
    assert gate.waiters() == ()


async def test_a_cancelled_waiter_leaves_the_report(anyio_backend: Any) -> None:
    """Withdrawn waiters stay in the queue until compaction, but never in the report."""
    gate = Gate(0)

    async def wait() -> None:
        await gate.acquire()

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        tg.start_soon(wait)
        await anyio.wait_all_tasks_blocked()
        assert len(gate.waiters()) == 2
        tg.cancel_scope.cancel()
    assert gate.waiters() == ()
    assert len(gate._queue) in (0, 2)  # lazily deleted entries may remain


def test_available_follows_capacity_and_holders() -> None:
    """``available`` is free slots, never negative, infinite without a cap; statistics agree."""
    gate = Gate(3)
    tokens = [gate.acquire_nowait() for _ in range(2)]
    assert gate.available == 1 == gate.statistics().available
    gate.capacity = 1  # lowered below in_flight: nothing free, not -1
    assert gate.available == 0 == gate.statistics().available
    for token in tokens:
        token.release()
    assert gate.available == 1
    unlimited = Gate()
    held = unlimited.acquire_nowait()
    assert unlimited.available == math.inf == unlimited.statistics().available
    held.release()


def test_holders_include_an_uncollected_leaked_token() -> None:
    """A token lost in a garbage cycle still holds its slot until collected: it is reported."""
    import gc
    import warnings

    gate = Gate(1, name="cycle")
    gc.disable()
    try:

        class Box:
            pass

        box = Box()
        box.token = gate.acquire_nowait()  # type: ignore[attr-defined]
        box.me = box  # type: ignore[attr-defined]
        del box
        assert len(gate.holders()) == 1
        assert gate.in_flight == 1
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            gc.collect()
    finally:
        gc.enable()
    assert gate.holders() == ()
    assert gate.statistics().leaked == 1
