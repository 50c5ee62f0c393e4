"""The hot paths' shortcuts (issue 14), each next to the general path it stands in for.

The contended asyncio handoff decides "is the releaser on the waiter's loop?" from the
loop's ``_thread_id`` when the loop's class keeps it (the standard library's loops, checked
on first sight), and from ``asyncio._get_running_loop()`` otherwise (uvloop). Both routes
run here on every asyncio flavour by forcing the class check either way; the cancel point's
two paths (private and public) are ``test_cancel_state``'s.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import anyio
import pytest

from anygate import Gate
from anygate._gate import waiters as _waiters

if TYPE_CHECKING:
    from collections.abc import Iterator

    from anygate import Token

pytestmark = pytest.mark.anyio


def _is_trio(anyio_backend: Any) -> bool:
    return (anyio_backend if isinstance(anyio_backend, str) else anyio_backend[0]) == "trio"


@pytest.fixture(params=["thread_id", "running_loop"])
def route(request: pytest.FixtureRequest, anyio_backend: Any) -> Iterator[str]:
    """Force the wake-up route's class check: ``_thread_id`` trusted, or not."""
    if _is_trio(anyio_backend):
        pytest.skip("asyncio wake-up routes")
    saved = dict(_waiters._thread_id_loops)
    _waiters._thread_id_loops.clear()
    yield request.param
    _waiters._thread_id_loops.clear()
    _waiters._thread_id_loops.update(saved)


def _force(route: str) -> None:
    loop = asyncio.get_running_loop()
    # Forcing True on a loop without _thread_id would be a lie the wake path cannot survive.
    trusted = route == "thread_id" and hasattr(loop, "_thread_id")
    _waiters._thread_id_loops[type(loop)] = trusted


async def test_the_loop_class_check_trusts_only_stdlib_loops(anyio_backend: Any) -> None:
    """First sight of a loop class: the standard library's loops keep ``_thread_id``."""
    if _is_trio(anyio_backend):
        pytest.skip("asyncio only")
    loop = asyncio.get_running_loop()
    _waiters._thread_id_loops.pop(type(loop), None)
    waiter = _waiters.asyncio_waiter(loop)
    expected = isinstance(loop, asyncio.BaseEventLoop)
    assert waiter.here is expected
    assert _waiters._thread_id_loops[type(loop)] is expected
    waiter.future.cancel()


async def test_a_release_on_the_same_loop_hands_over(anyio_backend: Any, route: str) -> None:
    """A holder on the waiter's own loop releases: the waiter resumes with the slot."""
    _force(route)
    gate = Gate(1, fast_acquire=True)
    holder = await gate.acquire()
    box: list[Token] = []

    async def wait() -> None:
        async with gate.acquire() as token:
            box.append(token)
            assert gate.in_flight == 1

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        await anyio.wait_all_tasks_blocked()
        assert gate.waiting == 1
        holder.release()
    assert box[0].released
    assert (gate.in_flight, gate.waiting) == (0, 0)


async def test_a_release_from_a_plain_thread_hands_over(anyio_backend: Any, route: str) -> None:
    """Another thread releases: the waiter is woken through the loop's thread-safe call."""
    _force(route)
    gate = Gate(1)
    holder = gate.acquire_nowait()
    box: list[Token] = []

    async def wait() -> None:
        box.append(await gate.acquire())

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        await anyio.wait_all_tasks_blocked()
        await anyio.to_thread.run_sync(holder.release)
    assert gate.in_flight == 1
    box[0].release()
    assert gate.in_flight == 0


async def test_a_chain_of_waiters_keeps_fifo(anyio_backend: Any, route: str) -> None:
    """Several waiters on one loop, each release handing over to the next, in order."""
    _force(route)
    gate = Gate(1)
    holder = await gate.acquire()
    order: list[int] = []

    async def wait(i: int) -> None:
        async with gate.acquire():
            order.append(i)

    async with anyio.create_task_group() as tg:
        for i in range(5):
            tg.start_soon(wait, i)
            await anyio.wait_all_tasks_blocked()
        holder.release()
    assert order == [0, 1, 2, 3, 4]
    assert (gate.in_flight, gate.waiting) == (0, 0)


async def test_a_cancelled_waiter_passes_a_granted_slot_on(anyio_backend: Any, route: str) -> None:
    """A grant and a cancellation in the same tick: the slot is used or passed on, never
    lost (I4); the next waiter gets it either way."""
    _force(route)
    gate = Gate(1)
    holder = await gate.acquire()
    got: list[str] = []

    async def wait(name: str, scope: anyio.CancelScope) -> None:
        with scope:
            async with gate.acquire():
                got.append(name)

    first, second = anyio.CancelScope(), anyio.CancelScope()
    async with anyio.create_task_group() as tg:
        tg.start_soon(wait, "first", first)
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(wait, "second", second)
        await anyio.wait_all_tasks_blocked()
        holder.release()  # grants "first" ...
        first.cancel()  # ... which is cancelled before it resumes
    # asyncio lets a wait that completed win over a cancellation that came after it (the
    # cancellation then lands at the next checkpoint): "first" may use the slot.
    assert got in (["second"], ["first", "second"])
    assert (gate.in_flight, gate.waiting) == (0, 0)


async def test_a_pending_token_reports_no_admission(anyio_backend: Any) -> None:
    """``in_flight_at_admission`` is 0 until admitted (the field is set only then)."""
    gate = Gate(2)
    acquisition: Any = gate.acquire()
    assert acquisition.in_flight_at_admission == 0
    token = await acquisition
    assert token.in_flight_at_admission == 1
    token.release()


async def test_leaving_the_block_never_yields_and_frees_the_slot_at_once(
    anyio_backend: Any,
) -> None:
    """The fast pair is no schedule point at either end: the exit's awaitable (one shared,
    finished awaitable, never used up) returns at once, so a task started before the
    blocks has not run after three of them, and each exit has freed its slot."""
    gate = Gate(1, fast_acquire=True)
    ran: list[int] = []

    async def other() -> None:
        ran.append(1)

    async with anyio.create_task_group() as tg:
        tg.start_soon(other)  # runs at our next yield, if any
        for seen in (1, 1, 1):
            async with gate.acquire() as token:
                assert token.in_flight_at_admission == seen
            assert (gate.in_flight, token.released) == (0, True)
        assert ran == []
    assert ran == [1]
