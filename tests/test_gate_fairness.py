"""Arrival order: callers are admitted in the order they called, under every gate kind.

Issue 26, item 3. A port of trio's ``test_generic_lock_fifo_fairness`` (trio's
``tests/test_sync.py``): three tasks loop over ``async with`` on one slot; whatever order
the scheduler first runs them in, they must then take turns in that order. The
checkpointing acquire used to yield *before* it took a free slot, so callers that arrived
together were admitted in the order the scheduler resumed them; it now takes the slot
first and then yields in a schedule point that is not a cancel point, as ``trio.Lock``,
``trio.CapacityLimiter`` and ``anyio.Semaphore`` do.

Ported, not copied: trio's test has no checkpoint inside the critical section, which
relies on the acquire itself yielding. ``Gate(fast_acquire=True)`` never yields when
uncontended (that is the opt-out), so a task could take the free slot again before its
peers ever run; that kind runs only with a checkpoint inside, where it must keep order too.
"""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import pytest

from anygate import Gate, shared_gate

pytestmark = pytest.mark.anyio

LOOPS = 5
TASKS = 3


def _make(kind: str) -> Gate:
    if kind == "gate":
        return Gate(1)
    if kind == "lowered":
        gate = Gate(3)
        gate.capacity = 1
        return gate
    if kind == "shared":
        return shared_gate("fairness", capacity=1)
    assert kind == "fast"
    return Gate(1, fast_acquire=True)


@pytest.mark.parametrize(
    ("kind", "checkpoint_inside"),
    [
        ("gate", False),
        ("gate", True),
        ("lowered", False),
        ("lowered", True),
        ("shared", False),
        ("shared", True),
        ("fast", True),
    ],
)
async def test_lock_fifo_fairness(anyio_backend: Any, kind: str, checkpoint_inside: bool) -> None:
    """trio's generic lock fairness test: after the first round, the tasks are admitted
    round after round in the order they first called ``acquire()``."""
    gate = _make(kind)
    initial_order: list[int] = []
    record: list[int] = []

    async def loopy(name: int) -> None:
        initial_order.append(name)  # the order each task first runs, and so first calls
        for _ in range(LOOPS):
            async with gate.acquire():
                record.append(name)
                if checkpoint_inside:
                    await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tg:
        for name in range(TASKS):
            tg.start_soon(loopy, name)
    assert len(record) == LOOPS * TASKS
    rounds = [record[i : i + TASKS] for i in range(0, len(record), TASKS)]
    assert rounds == [initial_order] * LOOPS
    assert (gate.in_flight, gate.waiting) == (0, 0)


@pytest.mark.parametrize("kind", ["gate", "lowered", "shared", "fast"])
async def test_simultaneous_callers_are_admitted_in_call_order(
    anyio_backend: Any, kind: str
) -> None:
    """Callers that arrive together at a free gate of capacity 1 get the slot one after
    another in the order they called, each holding it across a checkpoint."""
    gate = _make(kind)
    called: list[int] = []
    admitted: list[int] = []

    async def caller(name: int) -> None:
        called.append(name)
        async with gate.acquire():
            admitted.append(name)
            await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tg:
        for name in range(8):
            tg.start_soon(caller, name)
    assert admitted == called


@pytest.mark.parametrize("kind", ["gate", "fast"])
async def test_in_flight_at_admission_is_the_count_as_admitted(
    anyio_backend: Any, kind: str
) -> None:
    """Simultaneous callers each see the gate as it was when they were admitted (1, 2, 3,
    ...), not as it is after the acquire's schedule point let the others in: the policy's
    adaptive limit learns a provider's slots from this count (issue 26)."""
    gate = Gate(10, fast_acquire=kind == "fast")
    seen: list[int] = []
    release = anyio.Event()
    async with anyio.create_task_group() as tg:
        for _ in range(5):
            tg.start_soon(_record_admission, gate, seen, release)
        await anyio.wait_all_tasks_blocked()
        assert gate.in_flight == 5
        release.set()
    assert sorted(seen) == [1, 2, 3, 4, 5]


async def _record_admission(gate: Gate, seen: list[int], release: anyio.Event) -> None:
    """Take a slot, record its ``in_flight_at_admission`` and hold it until ``release``."""
    async with gate.acquire() as token:
        seen.append(token.in_flight_at_admission)
        await release.wait()


@pytest.mark.parametrize("how", ["capacity", "release"])
async def test_a_batch_granted_in_one_step_sees_each_its_own_count(
    anyio_backend: Any, how: str
) -> None:
    """Queued callers granted in one step (a raised capacity, or a released slot passed
    on) each see the count just after their own grant, not the count once the whole
    batch was in: a batch of 5 let in after one holder reads 2 to 6, where every one of
    them read 6 and the adaptive limit took them all for at the provider (a release's
    herd read 56 at once against 32 slots)."""
    gate = Gate(1)
    seen: list[int] = []
    release = anyio.Event()
    first = await gate.acquire()
    async with anyio.create_task_group() as tg:
        for _ in range(5):
            tg.start_soon(_record_admission, gate, seen, release)
        await anyio.wait_all_tasks_blocked()
        assert gate.waiting == 5
        if how == "capacity":
            gate.capacity = 6
            await anyio.wait_all_tasks_blocked()
            assert sorted(seen) == [2, 3, 4, 5, 6]
        else:
            first.release()  # passed on to the head of the queue: 1 in flight
            await anyio.wait_all_tasks_blocked()
            assert seen == [1]
            gate.capacity = 6
            await anyio.wait_all_tasks_blocked()
            assert sorted(seen) == [1, 2, 3, 4, 5]
        release.set()
    if how == "capacity":
        first.release()
