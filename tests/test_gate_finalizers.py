"""Token.release() from a user ``__del__`` that runs inside one of the gate's locked steps.

Regression tests for issue 9, fault 4. ``docs/gate.md`` promises that release works from
``__del__``; a collection can start at any allocation (on 3.12+ at any call) inside a
locked step, and a user finalizer calling ``release()`` then blocked on the
non-reentrant lock its own thread held: the thread hung for good.

Deterministic: the garbage is created by a ``gc.callbacks`` hook at the start of a
collection that runs while the gate's lock is held, so that very collection finalizes it
inside the locked step. Each scenario runs in a daemon thread so a regression fails the
test (the thread is still stuck) instead of hanging the suite.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from typing import TYPE_CHECKING, Any

import pytest

from anygate import Busy, Gate, Token

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator


class ReleasesOnDel:
    """A user object that owns a token and releases it when it is finalized."""

    def __init__(self, token: Token) -> None:
        self.token = token
        self.cycle: object = self  # only the cyclic collector can free it

    def __del__(self) -> None:
        self.token.release()


@contextlib.contextmanager
def garbage_inside_the_lock(gate: Gate, token: Token) -> Iterator[list[bool]]:
    """While active, the first collection that starts with ``gate``'s lock held finalizes
    a :class:`ReleasesOnDel` owning ``token``. Yields ``[fired]``."""
    fired = [False]

    def callback(phase: str, info: dict[str, Any]) -> None:
        if phase == "start" and not fired[0] and gate._lock.locked():
            fired[0] = True
            ReleasesOnDel(token)  # unreachable at once: collected by this very collection

    thresholds = gc.get_threshold()
    gc.callbacks.append(callback)
    gc.set_threshold(1)  # collect at (nearly) every allocation
    try:
        yield fired
    finally:
        gc.set_threshold(*thresholds)
        gc.callbacks.remove(callback)


def run_bounded(work: Callable[[], None], seconds: float = 10.0) -> None:
    """Run ``work`` in a daemon thread; fail if it is still running after ``seconds``."""
    errors: list[BaseException] = []

    def target() -> None:
        try:
            work()
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "deadlocked: release() blocked on the gate's own lock"
    if errors:
        raise errors[0]


def churn_the_queue(gate: Gate, *, anchor: bool = True) -> None:
    """Timed-out waits until the queue compacts (an allocation under the lock).

    Withdrawn entries pile up only behind a live waiter (a class queue whose last live
    waiter leaves is dropped whole), so unless the caller already has one queued, a thread
    parks at the head first; it takes the slot the finalizer frees and gives it back.
    """
    head = None
    errors: list[BaseException] = []
    if anchor:

        def hold_the_head() -> None:
            try:
                gate.acquire_sync(timeout=10).release()
            except BaseException as exc:  # reported in the churning thread
                errors.append(exc)

        head = threading.Thread(target=hold_the_head, daemon=True)
        head.start()
        while not gate.waiting and head.is_alive():
            threading.Event().wait(0.0005)  # another thread's step: nothing to await
        if errors:
            raise errors[0]
    for _ in range(80):
        with contextlib.suppress(Busy):
            gate.acquire_sync(timeout=1e-6).release()
    if head is not None:
        head.join(10)
        if errors:
            raise errors[0]


def read_statistics(gate: Gate) -> None:
    """statistics() used to build its record under the lock."""
    for _ in range(50):
        gate.statistics()


def test_a_user_finalizer_releasing_inside_a_locked_step_does_not_deadlock() -> None:
    """The release is deferred and applied when the step unlocks: the slot comes back and
    the thread goes on (before the fix: a permanent self-deadlock)."""
    gate = Gate(1, name="fin")
    token = gate.acquire_nowait()
    with garbage_inside_the_lock(gate, token) as fired:
        run_bounded(lambda: churn_the_queue(gate))
    assert fired[0]
    stats = gate.statistics()
    assert token.released
    assert (stats.in_flight, stats.waiting, stats.leaked) == (0, 0, 0)


def test_statistics_allocates_nothing_under_the_lock() -> None:
    """With a collection due at every allocation, none starts while statistics() holds the
    lock (it used to build its record there, which deadlocked the finalizer above)."""
    gate = Gate(1, name="fin")
    token = gate.acquire_nowait()
    with garbage_inside_the_lock(gate, token) as fired:
        run_bounded(lambda: read_statistics(gate))
    assert not fired[0]
    token.release()


def test_a_deferred_release_hands_the_slot_to_the_head_waiter() -> None:
    """A release deferred from a finalizer still serves the queue in FIFO order (I2)."""
    gate = Gate(1, name="fin")
    token = gate.acquire_nowait()
    got: list[Token] = []

    def waiter() -> None:
        got.append(gate.acquire_sync(timeout=10))

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    while not gate.waiting:
        threading.Event().wait(0.0005)  # another thread's step: nothing to await
    with garbage_inside_the_lock(gate, token) as fired:
        run_bounded(lambda: churn_the_queue(gate, anchor=False))  # the waiter is the head
    thread.join(10)
    assert fired[0]
    assert len(got) == 1
    assert gate.in_flight == 1
    got[0].release()
    assert gate.statistics().in_flight == 0


def test_a_second_release_of_a_deferred_token_is_a_no_op() -> None:
    """Idempotence holds for deferred releases: two finalizer releases give back one slot."""
    gate = Gate(2, name="fin")
    token = gate.acquire_nowait()
    other = gate.acquire_nowait()
    fired = [0]

    def callback(phase: str, info: dict[str, Any]) -> None:
        if phase == "start" and fired[0] < 2 and gate._lock.locked():
            fired[0] += 1
            ReleasesOnDel(token)

    thresholds = gc.get_threshold()
    gc.callbacks.append(callback)
    gc.set_threshold(1)
    try:
        run_bounded(lambda: churn_the_queue(gate))
    finally:
        gc.set_threshold(*thresholds)
        gc.callbacks.remove(callback)
    assert fired[0] >= 1
    assert gate.statistics().in_flight == 1
    other.release()
    assert gate.statistics().in_flight == 0


@pytest.mark.parametrize(
    ("backend", "options"),
    [
        ("asyncio", {}),
        ("asyncio", {"use_uvloop": True}),
        ("trio", {}),
    ],
    ids=["asyncio", "asyncio+uvloop", "trio"],
)
def test_a_finalizer_release_on_an_event_loop_thread_does_not_freeze_the_loop(
    backend: str, options: dict[str, Any]
) -> None:
    """The same on each event loop: waiters cancelled one by one compact the queue under
    the lock on the loop's thread, the user finalizer's release is deferred, and the head
    waiter gets the slot (before the fix the loop's thread deadlocked)."""
    if options.get("use_uvloop"):
        pytest.importorskip("uvloop")
    import anyio

    gate = Gate(1, name="fin")
    token = gate.acquire_nowait()
    got: list[Token] = []
    outcome: list[tuple[bool, bool]] = []

    async def main() -> None:
        async def wait(scope: anyio.CancelScope) -> None:
            with scope:
                got.append(await gate.acquire())

        scopes = [anyio.CancelScope() for _ in range(80)]
        async with anyio.create_task_group() as tg:
            for scope in scopes:
                # One at a time: trio starts a batch of new tasks in random order, and the
                # queue's head must be scopes[0], the one waiter never cancelled.
                tg.start_soon(wait, scope)
                await anyio.wait_all_tasks_blocked()
            with garbage_inside_the_lock(gate, token) as fired:
                for scope in reversed(scopes[1:]):  # the head stays, to receive the slot
                    scope.cancel()
                    await anyio.wait_all_tasks_blocked()
            outcome.append((fired[0], token.released))
            token.release()  # no-op if the finalizer did it; else the head waits forever

    run_bounded(lambda: anyio.run(main, backend=backend, backend_options=options))
    assert outcome == [(True, True)]  # a collection ran in the lock; its finalizer released
    assert len(got) == 1
    got[0].release()
    assert gate.statistics().in_flight == 0


class CollectsBeforeUnlocking:
    """Stands in for a gate's lock: the first time it is released with a caller queued, a
    collection runs first, with the lock still held, and finalizes a
    :class:`ReleasesOnDel` owning ``token`` (what a gen-0 collection at any allocation in
    the locked step would do, made deterministic)."""

    def __init__(self, gate: Gate, token: Token) -> None:
        self._gate = gate
        self._lock = gate._lock
        self._token: Token | None = token
        self.fired = False

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        token = self._token
        if token is not None and self._gate._live:
            self._token = None
            ReleasesOnDel(token)
            gc.collect()
            self.fired = True
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc_info: object) -> None:
        self.release()


def _rescue_parked_waiters() -> None:
    """Wake every trio task parked on a gate waiter (only when the test already failed: a
    task parked for ever on a granted slot would otherwise keep the run from ending)."""
    from anygate._gate import waiters as _waiters

    for obj in gc.get_objects():
        if isinstance(obj, _waiters.TrioWaiter) and obj.parked:
            obj._deliver()


@pytest.mark.anyio
@pytest.mark.parametrize("timeout", [None, 60.0], ids=["untimed", "timed"])
async def test_a_grant_from_a_finalizer_before_the_park_is_not_lost(
    anyio_backend: Any, timeout: float | None
) -> None:
    """Issue 26, item 6: the only slot's token is released by a user ``__del__`` during a
    collection inside the locked step that queues a waiter. The release is deferred and
    drained as that step unlocks, which grants the waiter and wakes it on its own thread
    *before* it parks. The wake-up must be kept: the waiter is admitted, not parked for
    ever on a granted slot (before the fix, on trio, it parked with ``in_flight`` 1 and
    nobody waiting, and its own timeout could not end the wait)."""
    import anyio

    gate = Gate(1, name="fin")
    token = gate.acquire_nowait()
    got: list[Token] = []
    lock = gate._lock = CollectsBeforeUnlocking(gate, token)  # type: ignore[assignment]

    async def acquire() -> None:
        got.append(await gate.acquire(timeout=timeout))

    async with anyio.create_task_group() as tg:
        tg.start_soon(acquire)
        await anyio.wait_all_tasks_blocked()
        admitted = len(got)
        stuck = (gate.in_flight, gate.waiting)
        if not admitted:
            _rescue_parked_waiters()
    assert lock.fired  # the collection did run inside the queueing step
    assert token.released
    assert admitted == 1, f"the granted waiter parked for good: (in_flight, waiting)={stuck}"
    got[0].release()
    stats = gate.statistics()
    assert (stats.in_flight, stats.waiting, stats.admitted) == (0, 0, 2)
