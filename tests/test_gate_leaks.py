"""Tokens dropped without release(): reclaimed, reported, and never a deadlock."""

from __future__ import annotations

import gc
import sys
import threading
import warnings
from typing import Any

import anyio
import pytest

from anygate import Busy, Gate, Token
from anygate._gate import waiters as _waiters

pytestmark = pytest.mark.anyio


def _leak(gate: Gate) -> int:
    """Acquire a token and drop it; returns the line that acquired it."""
    gate.acquire_nowait()
    return sys._getframe().f_lineno - 1


def test_dropped_token_is_reclaimed_with_a_warning_naming_gate_and_site() -> None:
    """A garbage-collected token frees its slot and a ResourceWarning says where it came from."""
    gate = Gate(1, name="llm")
    with pytest.warns(ResourceWarning) as record:
        line = _leak(gate)
    message = str(record[0].message)
    assert "gate 'llm'" in message
    assert f"test_gate_leaks.py:{line}" in message
    assert gate.in_flight == 0
    assert gate.statistics().leaked == 1


def test_released_token_collects_silently() -> None:
    """A released token raises no warning when collected (filterwarnings=error would fail)."""
    gate = Gate(1)
    gate.acquire_nowait().release()
    gc.collect()
    assert gate.statistics().leaked == 0


async def test_reclaimed_slot_goes_to_the_head_waiter(anyio_backend: Any) -> None:
    """A leak reclaimed while someone waits hands the slot over (FIFO still holds)."""
    gate = Gate(1)
    holder: list[Token] = [gate.acquire_nowait()]
    got: list[Token] = []

    async def wait() -> None:
        got.append(await gate.acquire())

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        await anyio.wait_all_tasks_blocked()
        with pytest.warns(ResourceWarning):
            holder.clear()
    assert gate.in_flight == 1
    got[0].release()
    assert gate.in_flight == 0


class _Trap(_waiters.ThreadWaiter):
    """A waiter whose state, read under the gate's lock, drops the last reference to a token.

    This reproduces the trap from DESIGN.md deterministically: a finalizer running on the
    thread that already holds the gate's lock (in real life, gc triggered by an allocation
    inside a locked section).
    """

    def __init__(self, victim: list[Token]) -> None:
        super().__init__()
        self.victim = victim
        self._state = _waiters.WAITING

    @property  # type: ignore[override]
    def state(self) -> int:
        if self.victim:
            assert self_holds_lock(self.gate)
            self.victim.clear()  # Token.__del__ runs right here, under the lock
        return self._state

    @state.setter
    def state(self, value: int) -> None:
        self._state = value

    gate: Gate


def self_holds_lock(gate: Gate) -> bool:
    return gate._lock.locked()


def test_finalizer_under_the_gate_lock_does_not_deadlock() -> None:
    """A token finalized while this thread holds the gate lock is reclaimed after it is released."""
    gate = Gate(2)
    victim = [gate.acquire_nowait()]
    holder = gate.acquire_nowait()
    trap = _Trap(victim)
    trap.gate = gate
    assert not gate._enqueue(trap)
    with pytest.warns(ResourceWarning):
        holder.release()  # handoff reads trap.state under the lock -> victim finalized
    stats = gate.statistics()
    # The holder's slot went to the trap; the victim's slot was reclaimed afterwards.
    assert (stats.in_flight, stats.leaked, stats.waiting) == (1, 1, 0)
    assert trap._lock.acquire(blocking=False)  # the trap was woken


def test_gc_storm_with_cyclic_leaks_never_deadlocks() -> None:
    """Threads churn the gate while gc collects cyclic leaked tokens at every allocation.

    With a gc threshold of 5, finalizers run at arbitrary points, including inside the
    gate's locked sections on the same thread. A cyclic leak is only reclaimed when gc
    runs, so a thread that finds the gate full runs gc itself and retries.
    """
    gate = Gate(8)
    leaks_per_thread = 25

    class Cycle:
        token: Token
        me: Any

    def churn() -> None:
        for n in range(3 * leaks_per_thread):
            while True:
                try:
                    token = gate.acquire_sync(timeout=0.01)
                    break
                except Busy:
                    gc.collect()
            if n % 3 == 0:
                cycle = Cycle()
                cycle.token, cycle.me = token, cycle  # only gc can free this one
            else:
                token.release()

    old = gc.get_threshold()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            gc.set_threshold(5)
            threads = [threading.Thread(target=churn) for _ in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=50)
            assert not any(thread.is_alive() for thread in threads), "deadlocked"
        finally:
            gc.set_threshold(*old)
            gc.collect()
    stats = gate.statistics()
    assert stats.in_flight == 0
    assert stats.leaked == 4 * leaks_per_thread
