"""Races around the gate's slot handoff, each forced into one exact interleaving.

Every test here pins a single interleaving with events, thread joins, lock hooks or
``anyio.wait_all_tasks_blocked()``, never with sleeps, so it either always passes or always
fails. Each of the nine bugs these tests found was first committed here as a strict xfail
and then fixed; the docstrings keep the interleaving each one pins.

Some tests reach below the public API on purpose: they replace ``Gate._lock`` with an
instrumented lock (to detect a same-thread re-acquire instead of deadlocking, or to hold two
releasers at the lock's door), or enqueue hand-made waiters, because the interleavings they
pin cannot be reached deterministically otherwise.
"""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import textwrap
import threading
import warnings
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
import pytest

from anygate import Busy, Gate, Token
from anygate._gate import ledger as _ledger
from anygate._gate import waiters as _waiters

from .conftest import mock_clock

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

pytestmark = pytest.mark.anyio


# --------------------------------------------------------------------------- helpers


def _loop_factories() -> list[Any]:
    factories = [pytest.param(asyncio.new_event_loop, id="asyncio")]
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is optional (no Windows wheels)
        return factories
    factories.append(pytest.param(uvloop.new_event_loop, id="uvloop"))
    return factories


LOOP_FACTORIES = _loop_factories()


def in_thread(fn: Callable[[], object]) -> None:
    """Run ``fn`` in another thread and wait for it: a cross-thread step at an exact point."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # re-raised below, on the calling thread
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]


class WouldDeadlock(Exception):
    """The thread that holds the gate lock tried to take it again (a plain Lock hangs here)."""


class CheckedLock:
    """A stand-in for the gate's ``threading.Lock`` that makes two hazards deterministic.

    * A blocking re-acquire by the owning thread raises :class:`WouldDeadlock` (and is
      recorded) where the real lock would hang forever; a non-blocking one fails, like the
      real lock.
    * ``on_locked`` runs once, right after the first successful acquire, to stand in for
      something that happens *inside* a locked section (e.g. a gc pass triggered by an
      allocation there).
    * ``barrier`` holds the first ``barrier.parties`` acquirers at the door until
      all of them have arrived, so they contend for the lock at the same moment.
    """

    def __init__(
        self,
        *,
        on_locked: Callable[[], object] | None = None,
        barrier: threading.Barrier | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._owner: int | None = None
        self._on_locked = on_locked
        self._barrier = barrier
        self._door_lock = threading.Lock()
        self._at_door = 0 if barrier is None else barrier.parties
        self.reentries: list[str] = []

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        me = threading.get_ident()
        if self._owner == me:
            if not blocking:
                return False
            frame = sys._getframe(1)
            while frame.f_back is not None and frame.f_code.co_name == "__enter__":
                frame = frame.f_back
            self.reentries.append(frame.f_code.co_name)
            msg = "the gate lock's owner tried to take it again"
            raise WouldDeadlock(msg)
        # Non-blocking tries wait at the door too: _release tries the lock first (a user
        # finalizer inside a locked step must not block on it).
        if self._barrier is not None:
            with self._door_lock:
                held_at_door = self._at_door > 0
                self._at_door -= held_at_door
            # A releaser that never reaches the lock (broken barrier) is fine too: go ahead.
            if held_at_door:
                with suppress(threading.BrokenBarrierError):
                    self._barrier.wait()
        if not self._lock.acquire(blocking, timeout):
            return False
        self._owner = me
        hook, self._on_locked = self._on_locked, None
        if hook is not None:
            hook()
        return True

    def release(self) -> None:
        self._owner = None
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc_info: object) -> None:
        self.release()


@contextmanager
def gc_paused() -> Iterator[None]:
    """No automatic gc inside the block: cyclic garbage is collected only when a test says so."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def park_on_private_loop(
    gate: Gate, new_loop: Callable[[], asyncio.AbstractEventLoop]
) -> asyncio.AbstractEventLoop:
    """Run a fresh loop on this thread until one new task is parked on ``gate``.

    Returns the loop stopped but not closed. No reference to the parked task escapes this
    function: afterwards only the loop (and the gate's queue) keep it alive.
    """
    loop = new_loop()
    before = gate.waiting
    tasks: list[asyncio.Task[Token]] = []

    async def acquire() -> Token:
        return await gate.acquire()

    async def park() -> None:
        tasks.append(loop.create_task(acquire()))
        while gate.waiting == before:
            await asyncio.sleep(0)

    loop.run_until_complete(park())
    tasks.clear()
    return loop


@pytest.fixture
def unraisable(monkeypatch: pytest.MonkeyPatch) -> list[BaseException | None]:
    """Collect exceptions raised in finalizers (gc) during the test instead of failing late."""
    seen: list[BaseException | None] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda info: seen.append(info.exc_value))
    return seen


# ------------------------------------------------------------- grant vs. cancellation


GRANT_FROM = ["this-thread", "other-thread"]
ORDER = ["grant-first", "cancel-first"]


async def _race_grant_and_cancel(
    *, order: str, grant_from: str, wait_s: float | None, scope_of: Callable[[], anyio.CancelScope]
) -> tuple[list[str], Gate]:
    """Queue ``first`` then ``third`` behind a holder, then grant and cancel ``first`` in one tick.

    ``scope_of()`` gives the scope whose ``cancel()`` stands for the cancellation (an outer
    cancel scope, or the deadline scope of ``acquire(timeout=...)``). The grant is the
    holder's release, made on this thread or in another thread joined on the spot, so the
    wake-up is queued but not yet delivered when the cancellation lands.
    """
    gate = Gate(1)
    holder = gate.acquire_nowait()
    log: list[str] = []
    outer = anyio.CancelScope()

    async def first() -> None:
        with outer:
            try:
                token = await gate.acquire(timeout=wait_s)
            except Busy:
                log.append("first-busy")
                return
            log.append("first")
            token.release()
            await anyio.lowlevel.checkpoint()  # a cancellation still pending lands here

    async def third() -> None:
        token = await gate.acquire()
        log.append("third")
        token.release()

    def grant() -> None:
        if grant_from == "this-thread":
            holder.release()
        else:
            in_thread(holder.release)

    async with anyio.create_task_group() as tg:
        tg.start_soon(first)
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(third)
        await anyio.wait_all_tasks_blocked()
        scope = outer if wait_s is None else scope_of()
        if order == "grant-first":
            grant()
            scope.cancel()
        else:
            scope.cancel()
            grant()
    return log, gate


@pytest.mark.parametrize("grant_from", GRANT_FROM)
@pytest.mark.parametrize("order", ORDER)
async def test_cancel_scope_and_grant_in_the_same_tick_lose_no_slot(
    anyio_backend: Any, order: str, grant_from: str
) -> None:
    """A grant and an outer cancellation landing in one tick: the slot is used or passed on.

    Covers the four orders: on asyncio the grant either resolves the future first (anyio then
    skips ``task.cancel()`` and the task keeps the slot) or arrives for a task whose future
    was already cancelled (``_abandon`` sees GRANTED and hands over); on trio the abort
    callback returns FAILED after a grant (also one made from another thread whose
    ``run_sync_soon`` reschedule is still queued) or SUCCEEDED before one. In every case the
    third waiter gets a slot and nothing stays in flight.
    """
    log, gate = await _race_grant_and_cancel(
        order=order, grant_from=grant_from, wait_s=None, scope_of=anyio.CancelScope
    )
    assert log in (["third"], ["first", "third"])
    stats = gate.statistics()
    assert (stats.in_flight, stats.waiting) == (0, 0)
    assert stats.cancelled == (1 if log == ["third"] else 0)


@pytest.mark.parametrize("grant_from", GRANT_FROM)
@pytest.mark.parametrize("order", ORDER)
async def test_timeout_and_grant_in_the_same_tick_lose_no_slot(
    anyio_backend: Any, order: str, grant_from: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``acquire(timeout=...)`` whose deadline fires in the same tick as a grant keeps the slot.

    The deadline scope that ``acquire`` opens is captured and cancelled by hand, which is
    exactly what its deadline expiry does, so the two events can be ordered. Either the
    caller gets the token (the grant won, nothing counted as timed out) or it gets Busy and
    the slot went to the next waiter; never both, never neither.
    """
    scopes: list[anyio.CancelScope] = []
    real_move_on_after = anyio.move_on_after

    def recording_move_on_after(delay: float | None, shield: bool = False) -> anyio.CancelScope:
        scope = real_move_on_after(delay, shield=shield)
        scopes.append(scope)
        return scope

    monkeypatch.setattr(anyio, "move_on_after", recording_move_on_after)

    def deadline_scope() -> anyio.CancelScope:
        assert len(scopes) == 1, "acquire(timeout=...) no longer opens anyio.move_on_after"
        return scopes[0]

    log, gate = await _race_grant_and_cancel(
        order=order, grant_from=grant_from, wait_s=3600, scope_of=deadline_scope
    )
    # After Busy, `first` and `third` are woken in one step, so they may log in either order.
    assert log == ["first", "third"] or sorted(log) == ["first-busy", "third"]
    stats = gate.statistics()
    assert (stats.in_flight, stats.waiting) == (0, 0)
    assert stats.timed_out == ("first-busy" in log)
    if order == "grant-first":
        assert log[0] == "first"  # a grant that landed first is never turned into Busy


async def test_contended_acquire_in_an_already_cancelled_scope_raises(anyio_backend: Any) -> None:
    """``acquire()`` in a scope cancelled before the call raises, even if a grant lands first.

    Another task that releases is made runnable, then the scope is cancelled, then
    ``acquire()`` queues on the full gate. On asyncio anyio delivers a cancellation for the
    *current* task only on the next loop iteration, and skips ``task.cancel()`` when the
    awaited future is already done; the releaser runs first and resolves it. Only an
    explicit cancellation check before queueing makes the call raise as a checkpoint must.
    """
    gate = Gate(1)
    holder = gate.acquire_nowait()
    go = anyio.Event()
    reached: list[Token] = []

    async def release_when_told() -> None:
        await go.wait()
        holder.release()

    async with anyio.create_task_group() as tg:
        tg.start_soon(release_when_told)
        await anyio.wait_all_tasks_blocked()
        with anyio.CancelScope() as scope:
            go.set()  # the releaser becomes runnable first...
            scope.cancel()  # ...then this scope is cancelled, before acquire() is called
            token = await gate.acquire()
            reached.append(token)
            token.release()
    assert reached == []
    assert scope.cancelled_caught
    stats = gate.statistics()
    assert (stats.in_flight, stats.waiting) == (0, 0)


@pytest.mark.parametrize("anyio_backend", [mock_clock()])
async def test_trio_deadline_due_after_a_cross_thread_grant_returns_the_token(
    anyio_backend: Any,
) -> None:
    """trio: a real deadline expiring while another thread's grant is still queued keeps the slot.

    The other thread grants (``run_sync_soon`` queues the reschedule), then the virtual clock
    jumps past the deadline before the scheduler runs again: the deadline's abort callback
    finds the waiter GRANTED and returns FAILED, and the wait completes with the token.
    """
    import trio

    gate = Gate(1)
    holder = gate.acquire_nowait()
    outcome: list[str] = []

    async def first() -> None:
        try:
            token = await gate.acquire(timeout=5)
        except Busy:
            outcome.append("busy")
        else:
            outcome.append("token")
            token.release()

    async with anyio.create_task_group() as tg:
        tg.start_soon(first)
        await anyio.wait_all_tasks_blocked()
        in_thread(holder.release)
        trio.lowlevel.current_clock().jump(5)  # type: ignore[attr-defined]
    assert outcome == ["token"]
    stats = gate.statistics()
    assert (stats.in_flight, stats.timed_out, stats.admitted) == (0, 0, 2)


def test_acquire_sync_granted_just_after_its_timeout_returns_the_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A thread whose lock wait timed out, then got a grant before withdrawing, keeps the slot.

    The grant (another thread's release) lands between the timed-out ``block()`` and the
    withdrawal; the withdrawal sees GRANTED, so the caller gets a token, not Busy, and the
    late wake of its private lock is harmless.
    """
    gate = Gate(1)
    holder = gate.acquire_nowait()
    real_block = _waiters.ThreadWaiter.block

    def time_out_then_get_granted(self: _waiters.ThreadWaiter, timeout: float | None) -> bool:
        assert real_block(self, 0) is False  # nothing granted yet: the wait times out
        in_thread(holder.release)  # ...and the grant arrives right after
        return False

    monkeypatch.setattr(_waiters.ThreadWaiter, "block", time_out_then_get_granted)
    token = gate.acquire_sync(timeout=1)
    assert not token.released
    stats = gate.statistics()
    assert (stats.in_flight, stats.waiting, stats.timed_out) == (1, 0, 0)
    token.release()
    assert gate.in_flight == 0


# ------------------------------------------------------------- releases and leaks


def test_simultaneous_double_release_from_two_threads_frees_one_slot() -> None:
    """Two threads releasing one token at the same instant hand over exactly one slot.

    Both threads pass ``Token.release``'s unlocked check and meet at the gate lock's door
    (a barrier), so both enter ``_release``; the one that loses must see the token already
    released. With two waiters queued, only the first is granted.
    """
    gate = Gate(1)
    token = gate.acquire_nowait()
    first, second = _waiters.ThreadWaiter(), _waiters.ThreadWaiter()
    assert not gate._enqueue(first)
    assert not gate._enqueue(second)
    gate._lock = CheckedLock(barrier=threading.Barrier(2, timeout=10))  # type: ignore[assignment]
    threads = [threading.Thread(target=token.release) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert token.released
    assert first._lock.acquire(blocking=False)  # woken
    assert not second._lock.acquire(blocking=False)  # still waiting
    stats = gate.statistics()
    assert (stats.in_flight, stats.waiting, stats.admitted) == (1, 1, 2)


def test_token_finalized_before_its_owner_releases_it_is_freed_once() -> None:
    """A token collected in the same gc pass as the owner whose ``__del__`` releases it frees one slot."""
    gate = Gate(1)

    class Owner:
        """Holds a token and releases it on collection; the self-reference makes it cyclic."""

        def __init__(self, token: Token) -> None:
            self.token = token
            self.me = self

        def __del__(self) -> None:
            self.token.release()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        with gc_paused():
            Owner(gate.acquire_nowait())  # token allocated first, so finalized first
            gc.collect()
    assert gate.in_flight == 0
    token = gate.acquire_nowait()
    with pytest.raises(Busy):
        gate.acquire_nowait()  # capacity 1 still means 1
    token.release()


class _WithdrawTrap(_waiters.ThreadWaiter):
    """A thread waiter whose wait times out and whose withdrawal races another thread's leak.

    Its ``state`` is read under the gate lock when it withdraws; at that moment another
    thread drops the last reference to ``victim``'s token, whose ``Token.__del__`` finds
    the lock taken and leaves the reclaim to the lock's holder.
    """

    victim: list[Token]
    gate: Gate

    @property
    def state(self) -> int:
        if self.victim and self.gate._lock.locked():

            def drop() -> None:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", ResourceWarning)
                    self.victim.clear()

            in_thread(drop)
        return self._state

    @state.setter
    def state(self, value: int) -> None:
        self._state = value

    def block(self, timeout: float | None) -> bool:
        return False  # the wait timed out


def test_leak_reclaimed_while_a_timed_out_waiter_withdraws_reaches_the_queue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A slot reclaimed from a leak during another caller's withdrawal is handed to the head waiter."""
    gate = Gate(1)
    victim = [gate.acquire_nowait()]
    head = _waiters.ThreadWaiter()
    assert not gate._enqueue(head)

    def trap() -> _WithdrawTrap:
        waiter = _WithdrawTrap()
        waiter.victim, waiter.gate = victim, gate
        return waiter

    monkeypatch.setattr(_waiters, "ThreadWaiter", trap)
    try:
        with pytest.raises(Busy):
            gate.acquire_sync(timeout=1)  # times out, withdraws: the leak happens meanwhile
        assert not victim
        assert (gate.waiting, gate.in_flight) == (0, 1)  # the leaked slot went to `head`
        assert head._lock.acquire(blocking=False)
    finally:
        gate.statistics()  # drains, so a failing run leaves nothing behind


# ------------------------------------------------------------- closed and stopped loops


@pytest.mark.parametrize("new_loop", LOOP_FACTORIES)
def test_same_thread_wake_of_a_waiter_on_a_closed_loop_frees_its_slot_once(
    new_loop: Callable[[], asyncio.AbstractEventLoop],
) -> None:
    """Releasing on the thread whose closed loop holds the head waiter gives the slot back once."""
    gate = Gate(1)
    holder = gate.acquire_nowait()
    park_on_private_loop(gate, new_loop).close()  # the parked task is abandoned with it
    holder.release()  # same thread as the dead loop: the direct (non-threadsafe) wake path
    stats = gate.statistics()
    assert (stats.in_flight, stats.waiting, stats.cancelled) == (0, 0, 1)
    token = gate.acquire_nowait()
    with pytest.raises(Busy):
        gate.acquire_nowait()
    token.release()


@pytest.mark.parametrize("new_loop", LOOP_FACTORIES)
def test_cross_thread_wake_of_a_waiter_on_a_closed_loop_passes_the_slot_on(
    new_loop: Callable[[], asyncio.AbstractEventLoop],
) -> None:
    """``call_soon_threadsafe`` raising on a closed loop (asyncio and uvloop) hands the slot on."""
    gate = Gate(1)
    holder = gate.acquire_nowait()
    park_on_private_loop(gate, new_loop).close()
    behind = _waiters.ThreadWaiter()
    assert not gate._enqueue(behind)
    in_thread(holder.release)
    assert behind._lock.acquire(blocking=False)
    stats = gate.statistics()
    assert (stats.in_flight, stats.waiting, stats.cancelled) == (1, 0, 1)


@pytest.mark.parametrize("new_loop", LOOP_FACTORIES)
def test_grant_stranded_by_a_loop_closed_before_its_callback_ran_comes_back_at_gc(
    new_loop: Callable[[], asyncio.AbstractEventLoop],
) -> None:
    """A loop closed after a successful ``call_soon_threadsafe`` strands the slot only until gc.

    The wake-up was accepted, so the gate cannot know; ``loop.close()`` then drops the
    callback. The slot stays reserved for a task that can never run until gc collects the
    task/future cycle, whose coroutine's GeneratorExit passes the slot on (I4, late).
    """
    gate = Gate(1)
    holder = gate.acquire_nowait()
    with gc_paused():
        loop = park_on_private_loop(gate, new_loop)
        in_thread(holder.release)  # the wake-up is queued on the stopped loop...
        loop.close()  # ...and dropped with it
        del loop
        assert (gate.in_flight, gate.waiting) == (1, 0)  # stranded until collection
        gc.collect()
    stats = gate.statistics()
    assert (stats.in_flight, stats.waiting, stats.cancelled) == (0, 0, 1)


@pytest.mark.parametrize("closed", ["after-grant", "before-grant"])
@pytest.mark.parametrize("new_loop", LOOP_FACTORIES)
def test_parked_coroutine_collected_under_the_gate_lock_does_not_deadlock(
    new_loop: Callable[[], asyncio.AbstractEventLoop],
    closed: str,
    unraisable: list[BaseException | None],
) -> None:
    """gc finalizing an abandoned parked ``acquire()`` inside a locked section neither hangs nor leaks."""
    gate = Gate(1)
    holder = gate.acquire_nowait()
    with gc_paused():
        loop = park_on_private_loop(gate, new_loop)
        if closed == "after-grant":
            in_thread(holder.release)
            loop.close()
        else:
            loop.close()
            in_thread(holder.release)  # wake fails: DEAD, the slot is freed
        del loop
        lock = CheckedLock(on_locked=gc.collect)  # gc inside the next locked section
        gate._lock = lock  # type: ignore[assignment]
        gate.statistics()
    assert lock.reentries == [], f"would deadlock; finalizer errors: {unraisable!r}"
    assert (gate.in_flight, gate.waiting) == (0, 0)


# ------------------------------------------------------------- queue and capacity


async def test_compaction_keeps_fifo_and_counts_under_mass_cancellation(anyio_backend: Any) -> None:
    """Cancelling most of a long queue compacts it (I4) without losing or reordering survivors."""
    gate = Gate(1)
    holder = gate.acquire_nowait()
    total = 200
    survivors = list(range(0, total, 4))
    log: list[int] = []
    scopes = [anyio.CancelScope() for _ in range(total)]

    async def waiter(i: int) -> None:
        with scopes[i]:
            token = await gate.acquire()
            log.append(i)
            token.release()

    async with anyio.create_task_group() as tg:
        for i in range(total):
            tg.start_soon(waiter, i)
            await anyio.wait_all_tasks_blocked()
        for i in range(total):
            if i not in survivors:
                scopes[i].cancel()
        await anyio.wait_all_tasks_blocked()
        assert gate.waiting == len(survivors)
        # Dead entries are bounded by the live ones (plus slack), not by the cancellations.
        assert len(gate._queue) <= 2 * gate.waiting + _ledger._COMPACT_SLACK
        holder.release()
    assert log == survivors
    stats = gate.statistics()
    assert (stats.in_flight, stats.waiting, stats.cancelled) == (0, 0, total - len(survivors))


class _Recorder(_waiters.Waiter):
    """A waiter that records its wake-up; ``on_wake`` runs first and decides whether it lives."""

    def __init__(
        self, log: list[str], name: str, on_wake: Callable[[], bool] | None = None
    ) -> None:
        super().__init__()
        self.log, self.name, self.on_wake = log, name, on_wake

    def wake(self) -> bool:
        alive = True if self.on_wake is None else self.on_wake()
        if alive:
            self.log.append(self.name)
        return alive


def test_capacity_lowered_while_a_dead_grant_is_passed_on_drops_the_slot() -> None:
    """A slot bounced by a dead waiter is dropped, not re-granted, if capacity fell meanwhile (I3).

    Raising capacity 0 -> 2 grants the dead head and the next waiter; while the dead one's
    wake-up fails, capacity is lowered to 1. Its slot would exceed the new capacity, so the
    third waiter must stay queued.
    """
    gate = Gate(0)
    log: list[str] = []

    def lower_then_die() -> bool:
        gate.capacity = 1
        return False

    dead = _Recorder(log, "dead", lower_then_die)
    second, third = _Recorder(log, "second"), _Recorder(log, "third")
    for waiter in (dead, second, third):
        assert not gate._enqueue(waiter)
    gate.capacity = 2
    assert log == ["second"]
    stats = gate.statistics()
    assert (stats.capacity, stats.in_flight, stats.waiting, stats.cancelled) == (1, 1, 1, 1)


# ------------------------------------------------------------- KeyboardInterrupt (trio)


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_trio_grant_to_token_step_is_ki_protected(
    anyio_backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between consuming a grant and owning the token, trio must not be able to raise KI.

    The step is in ``Token.__aenter__``, which copies the grant's time from the waiter
    right after the grant: the probe sits on that read.
    """
    import trio

    probes: list[bool] = []

    class ProbedWaiter(_waiters.TrioWaiter):
        # A property over the slot: the grant stores the time here, the token's step
        # reads it (and the probe with it).
        @property  # type: ignore[override]
        def since(self) -> float:
            if sys._getframe(1).f_code.co_name == "__aenter__":
                probes.append(trio.lowlevel.currently_ki_protected())
            return self._probed_since

        @since.setter
        def since(self, value: float) -> None:
            self._probed_since = value

    monkeypatch.setattr(_waiters, "TrioWaiter", ProbedWaiter)
    gate = Gate(1)
    holder = gate.acquire_nowait()
    async with anyio.create_task_group() as tg:

        async def wait() -> None:
            (await gate.acquire()).release()

        tg.start_soon(wait)
        await anyio.wait_all_tasks_blocked()
        holder.release()
    assert probes == [True]


_LATE_TRIO_SCRIPT = textwrap.dedent(
    """
    import sys, threading
    import anygate
    assert "trio" not in sys.modules, "importing anygate imported trio"
    gate = anygate.Gate(1)  # e.g. a module-level gate, created before the app imports trio
    import trio

    protected = []

    class ProbeLock:
        def __init__(self):
            self._lock = threading.Lock()
        def acquire(self, blocking=True, timeout=-1):
            protected.append(trio.lowlevel.currently_ki_protected())
            return self._lock.acquire(blocking, timeout)
        def release(self):
            self._lock.release()
        def locked(self):
            return self._lock.locked()
        def __enter__(self):
            return self.acquire()
        def __exit__(self, *exc):
            self.release()

    gate._lock = ProbeLock()

    async def main():
        gate.acquire_nowait().release()
        (await gate.acquire()).release()  # uncontended: the fast path only

    trio.run(main)
    print(protected)
    """
)


def test_gate_created_before_trio_was_imported_is_ki_protected_under_trio() -> None:
    """A gate built before ``import trio`` still has KI-safe locked steps under trio (subprocess)."""
    result = subprocess.run(
        [sys.executable, "-c", _LATE_TRIO_SCRIPT],
        capture_output=True,
        text=True,
        timeout=50,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    probes = result.stdout.strip()
    assert probes.startswith("[True"), probes
    assert "False" not in probes, probes


# ------------------------------------------------------------- other runtimes and inputs


def test_acquire_sync_waits_with_a_timeout_beyond_timeout_max(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A huge but finite timeout (1e12 s) waits like ``None`` and gets the released slot."""
    gate = Gate(1)
    holder = gate.acquire_nowait()
    real_block = _waiters.ThreadWaiter.block

    def release_then_block(self: _waiters.ThreadWaiter, timeout: float | None) -> bool:
        in_thread(holder.release)  # the slot is granted to us, so the block returns at once
        return real_block(self, timeout)

    monkeypatch.setattr(_waiters.ThreadWaiter, "block", release_then_block)
    token = gate.acquire_sync(timeout=1e12)
    assert gate.in_flight == 1
    token.release()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_trio_guest_run_on_an_asyncio_host_can_wait_for_a_slot(anyio_backend: Any) -> None:
    """A trio task in guest mode queues, is woken by a release in the host loop, and gets the slot."""
    import trio

    loop = asyncio.get_running_loop()
    gate = Gate(1)
    holder = gate.acquire_nowait()
    done: asyncio.Future[Any] = loop.create_future()

    async def guest() -> str:
        token = await gate.acquire()
        token.release()
        return "admitted"

    trio.lowlevel.start_guest_run(
        guest,
        run_sync_soon_threadsafe=loop.call_soon_threadsafe,
        done_callback=done.set_result,
        host_uses_signal_set_wakeup_fd=True,
    )
    with anyio.fail_after(10):
        while gate.waiting == 0 and not done.done():
            await anyio.lowlevel.checkpoint()  # guest ticks arrive through the host loop
    holder.release()
    outcome = await done
    assert outcome.unwrap() == "admitted"
    assert gate.in_flight == 0
