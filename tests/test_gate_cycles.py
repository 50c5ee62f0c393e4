"""Tokens that die in a garbage cycle with the user object that releases them (issue 27).

The cyclic collector finalizes the garbage of one collection in its list order, roughly
allocation order: a token made before its owner is finalized first. It used to count
itself leaked (slot reclaimed, ``ResourceWarning``) and its owner's ``release()`` a moment
later was a no-op. A token finalized during a collection is now judged when the collection
ends (``anygate._gate.cycles``). Each test makes the token before its owner, the order that
always went wrong.
"""

from __future__ import annotations

import gc
import sys
import threading
import warnings
from typing import Any

import anyio
import pytest

from anygate import Gate, Token
from anygate._gate.token import make_token
from anygate._gate.waiters import inside_locked_step
from tests.test_gate_finalizers import churn_the_queue, run_bounded

pytestmark = pytest.mark.anyio


class Owner:
    """A user object in a reference cycle that gives its token back in ``__del__``."""

    def __init__(self, token: Token) -> None:
        self.token = token
        self.me = self

    def __del__(self) -> None:
        self.token.release()


class Hoarder:
    """A user object in a reference cycle that never gives its token back: a real leak."""

    def __init__(self, token: Token) -> None:
        self.token = token
        self.me = self


def hoard(gate: Gate) -> int:
    """Acquire a token, leave it in a garbage cycle; returns the line that acquired it."""
    Hoarder(gate.acquire_nowait())
    return sys._getframe().f_lineno - 1


def test_a_token_its_owner_releases_in_a_garbage_cycle_is_no_leak() -> None:
    """The slot comes back once (``in_flight`` 0, not below), no leak is counted and no
    ``ResourceWarning`` is raised (before the fix: 100 leaks and 100 warnings of 100)."""
    gate = Gate(1000, name="owned")
    gc.collect()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(100):
            Owner(gate.acquire_nowait())
        assert gate.in_flight == 100  # only the cyclic collector can free them
        gc.collect()
    assert [str(w.message) for w in record] == []
    stats = gate.statistics()
    assert (stats.in_flight, stats.leaked, stats.admitted) == (0, 0, 100)


def test_a_real_leak_in_a_garbage_cycle_is_reclaimed_once_with_its_site() -> None:
    """A token no one releases, collected in a cycle, is judged when the collection ends:
    reclaimed once and reported with the gate and the ``file:line`` that acquired it."""
    gate = Gate(2, name="hoarded")
    gc.collect()
    line = hoard(gate)
    Owner(gate.acquire_nowait())  # collected in the same pass, and no leak
    with pytest.warns(ResourceWarning) as record:
        gc.collect()
    assert len(record) == 1
    message = str(record[0].message)
    assert "gate 'hoarded'" in message
    assert f"test_gate_cycles.py:{line}" in message
    stats = gate.statistics()
    assert (stats.in_flight, stats.leaked) == (0, 1)
    gc.collect()  # the judged token is gone: nothing more to report
    assert gate.statistics().leaked == 1


def test_every_suspect_is_judged_when_a_warning_is_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With ``ResourceWarning`` an error, the first real leak's warning raises inside the
    collector's callback: every other suspect is still judged (each leak reclaimed, each
    owner's release kept), and the first error is reported once, as unraisable."""
    gate = Gate(100, name="strict")
    unraisable: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    gc.collect()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        for n in range(12):
            if n % 3:
                Owner(gate.acquire_nowait())
            else:
                hoard(gate)
        gc.collect()
    stats = gate.statistics()
    assert (stats.in_flight, stats.leaked) == (0, 4)
    assert len(unraisable) == 1
    assert isinstance(unraisable[0].exc_value, ResourceWarning)


def test_a_leak_dropped_outside_a_collection_is_reported_at_once() -> None:
    """A token whose reference count drops to zero on this thread while another thread is
    inside a collection is reclaimed and reported at once, not at that collection's end."""
    gate = Gate(1, name="refcount")
    inside, leave = threading.Event(), threading.Event()

    def stall(phase: str, info: dict[str, Any]) -> None:
        if phase == "start" and threading.current_thread() is collector:
            inside.set()
            leave.wait(10)

    collector = threading.Thread(target=gc.collect, daemon=True)
    gc.callbacks.append(stall)
    try:
        collector.start()
        assert inside.wait(10)
        with pytest.warns(ResourceWarning, match="gate 'refcount'"):
            gate.acquire_nowait()  # dropped at once: reference count zero
        stats = gate.statistics()
        assert (stats.in_flight, stats.leaked) == (0, 1)
    finally:
        leave.set()
        collector.join(10)
        gc.callbacks.remove(stall)
    assert not collector.is_alive()


def test_a_leak_judged_inside_a_locked_step_is_reclaimed_after_it() -> None:
    """A collection that starts inside one of the gate's locked steps finalizes a real leak
    in a cycle: judged at its end with this thread holding the lock, the slot is reclaimed
    as the step unlocks, and nothing deadlocks."""
    gate = Gate(1, name="locked")
    token = gate.acquire_nowait()
    fired = [False]

    def callback(phase: str, info: dict[str, Any]) -> None:
        nonlocal token
        if phase == "start" and not fired[0] and gate._lock.locked():
            fired[0] = True
            Hoarder(token)  # garbage for this very collection
            del token

    thresholds = gc.get_threshold()
    gc.callbacks.append(callback)
    gc.set_threshold(1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            run_bounded(lambda: churn_the_queue(gate))
    finally:
        gc.set_threshold(*thresholds)
        gc.callbacks.remove(callback)
    assert fired[0]
    stats = gate.statistics()
    assert (stats.in_flight, stats.waiting, stats.leaked) == (0, 0, 1)


def test_an_owner_release_deferred_inside_a_locked_step_is_no_leak() -> None:
    """A collection that starts inside one of the gate's locked steps on this thread
    finalizes a token and then its owner, whose ``release()`` must be deferred (this thread
    holds the lock): at the collection's end the release is still queued, and it counts.
    No leak is counted and the slot comes back once, as the step unlocks."""
    gate = Gate(1, name="locked-owner")
    holder = [gate.acquire_nowait()]  # makes the churn wait: allocations under the lock
    fired = [False]

    def callback(phase: str, info: dict[str, Any]) -> None:
        if phase == "start" and not fired[0] and gate._lock.locked() and inside_locked_step():
            fired[0] = True  # this thread holds the lock (not the churn's head thread)
            # The holder's slot passes to a token made here, before its owner: both are
            # garbage for this very collection, the token first in the collector's list.
            holder.pop()._gate = None
            Owner(make_token(gate, sys._getframe().f_code, 0))

    thresholds = gc.get_threshold()
    gc.callbacks.append(callback)
    gc.set_threshold(1)
    try:
        run_bounded(lambda: churn_the_queue(gate))
    finally:
        gc.set_threshold(*thresholds)
        gc.callbacks.remove(callback)
    assert fired[0]
    stats = gate.statistics()
    assert (stats.in_flight, stats.waiting, stats.leaked) == (0, 0, 0)


def test_a_leak_judged_while_an_unprotected_section_holds_the_lock_does_not_deadlock() -> None:
    """A real leak judged while this thread holds the gate's lock outside any
    ``@ki_protected`` step (``inside_locked_step`` cannot see it) waits for the lock
    at most ``LOCK_WAIT_S``, never for good: the slot is reclaimed once, as the holder
    drains after unlocking."""
    gate = Gate(1, name="unprotected")
    hoard(gate)

    def work() -> None:
        gate._lock.acquire()
        try:
            with pytest.warns(ResourceWarning, match="gate 'unprotected'"):
                gc.collect()
        finally:
            gate._lock.release()
            gate._drain()

    run_bounded(work)
    stats = gate.statistics()
    assert (stats.in_flight, stats.leaked) == (0, 1)


async def test_an_owner_release_in_a_cycle_hands_the_slot_to_the_waiter(
    anyio_backend: Any,
) -> None:
    """On every backend: a full gate, a queued caller, and the holder's token dies in a
    cycle with its owner; the owner's release hands the slot to the waiter, once, and no
    leak is counted."""
    gate = Gate(1, name="handoff")
    holder: list[Owner] = [Owner(await gate.acquire())]
    got: list[Token] = []

    async def wait() -> None:
        got.append(await gate.acquire())

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        await anyio.wait_all_tasks_blocked()
        holder.clear()
        gc.collect()
    assert len(got) == 1
    stats = gate.statistics()
    assert (stats.in_flight, stats.leaked) == (1, 0)
    got[0].release()
    assert gate.statistics().in_flight == 0


async def test_a_real_leak_in_a_cycle_hands_the_slot_to_the_waiter(anyio_backend: Any) -> None:
    """On every backend: a leaked token in a cycle is reclaimed at the collection's end
    and its slot goes to the queued caller, with the warning naming the site."""
    gate = Gate(1, name="leak-handoff")
    line = sys._getframe().f_lineno + 1
    holder: list[Hoarder] = [Hoarder(await gate.acquire())]
    got: list[Token] = []

    async def wait() -> None:
        got.append(await gate.acquire())

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        await anyio.wait_all_tasks_blocked()
        holder.clear()
        with pytest.warns(ResourceWarning, match=f"test_gate_cycles.py:{line}"):
            gc.collect()
    assert len(got) == 1
    stats = gate.statistics()
    assert (stats.in_flight, stats.leaked) == (1, 1)
    got[0].release()
    assert gate.statistics().in_flight == 0


def test_owners_and_leaks_in_cycles_across_runtimes_count_only_the_real_leaks() -> None:
    """A short soak: asyncio, uvloop and trio runs and two threads, at once on one gate,
    leave 2,000 tokens each to cyclic owners (one in 50 never releases) while the collector
    runs often: the leak count is exactly the real leaks and every slot comes back
    (before the fix: ~95 % of the owners' releases counted as leaks)."""
    from benchmarks.soak_gc_cycles import run

    real, counted, warned, held = run(2000)
    assert (counted, warned, held) == (real, real, 0)
    assert real > 0
