"""One gate shared by plain threads, asyncio loops and trio runs in other threads at once."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from concurrent.futures import Future
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING, Any

import anyio
import anyio.from_thread
import anyio.to_thread
import pytest

from anygate import Busy, Gate, Token
from anygate._gate import waiters as _waiters

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

pytestmark = pytest.mark.anyio

LOOP_KINDS = ["asyncio", "trio"]


def wait_until(predicate: Callable[[], bool], what: str, limit: float = 10.0) -> None:
    """Block until ``predicate()`` holds (another thread is doing the work); fail after ``limit``.

    Cross-thread steps cannot be ordered with wait_all_tasks_blocked, so tests wait for
    the observable state they need (a waiter being queued) instead of sleeping blindly.
    """
    deadline = time.monotonic() + limit
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.0005)


async def await_until(predicate: Callable[[], bool], what: str) -> None:
    """Async twin of :func:`wait_until` for a test running on an event loop."""
    with anyio.fail_after(10):
        while not predicate():
            await anyio.sleep(0.0005)
    assert predicate(), what


@contextmanager
def loop_thread(kind: str) -> Iterator[anyio.from_thread.BlockingPortal]:
    """An event loop of ``kind`` running in its own thread, driven through a portal."""
    with anyio.from_thread.start_blocking_portal(kind) as portal:
        yield portal


def start_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, Future[Any]]:
    """Run ``fn`` in a plain thread; its result or exception lands in the future."""
    result: Future[Any] = Future()

    def run() -> None:
        try:
            result.set_result(fn())
        except BaseException as exc:
            result.set_exception(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


# --------------------------------------------------------------------- plain threads


def test_threads_never_exceed_capacity() -> None:
    """Eight threads looping on acquire_sync never hold more than the capacity."""
    gate = Gate(3)
    lock = threading.Lock()
    holding = peak = 0

    def worker() -> None:
        nonlocal holding, peak
        for _ in range(50):
            with gate.acquire_sync():
                with lock:
                    holding += 1
                    peak = max(peak, holding)
                time.sleep(0)
                with lock:
                    holding -= 1

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert 1 <= peak <= 3
    assert gate.in_flight == 0
    assert gate.statistics().admitted == 400


def test_threads_are_served_fifo() -> None:
    """Threads queued one after another are admitted in that order."""
    gate = Gate(1)
    holder = gate.acquire_nowait()
    log: list[int] = []
    futures = []
    for i in range(5):

        def take(i: int = i) -> None:
            with gate.acquire_sync():
                log.append(i)

        futures.append(start_thread(take)[1])
        wait_until(lambda i=i: gate.waiting == i + 1, f"thread {i} to queue")
    holder.release()
    for future in futures:
        future.result(timeout=10)
    assert log == [0, 1, 2, 3, 4]
    assert gate.in_flight == 0


def test_acquire_sync_timeout_raises_busy() -> None:
    """A thread whose wait times out gets Busy and leaves the queue."""
    gate = Gate(1, name="llm")
    holder = gate.acquire_nowait()
    with pytest.raises(Busy, match="'llm' is busy"):
        gate.acquire_sync(timeout=0.01)
    with pytest.raises(Busy):
        gate.acquire_sync(timeout=0)
    stats = gate.statistics()
    assert (stats.waiting, stats.timed_out, stats.rejected) == (0, 1, 1)
    holder.release()


def test_thread_interrupted_while_queued_leaves_the_queue() -> None:
    """KeyboardInterrupt in a thread blocked in acquire_sync unregisters it; nothing leaks."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals are delivered to the main thread only")
    gate = Gate(1)
    holder = gate.acquire_nowait()
    main = threading.main_thread().ident
    assert main is not None
    fired = threading.Event()

    def once(signum: int, frame: object) -> None:
        # Only the first signal interrupts; repeats (below) that land after it are spent.
        if not fired.is_set():
            fired.set()
            raise KeyboardInterrupt

    def interrupt() -> None:
        wait_until(lambda: gate.waiting == 1, "the main thread to queue")
        # A signal that lands after the waiter is queued but before the thread blocks in
        # the lock's acquire is only noticed at the next bytecode check, which the C call
        # may not pass first: then nothing interrupts the wait (seen under heavy load).
        # Signal again until the handler has run.
        while not fired.is_set():
            signal.pthread_kill(main, signal.SIGINT)
            fired.wait(0.05)

    old_handler = signal.signal(signal.SIGINT, once)
    try:
        thread, _ = start_thread(interrupt)
        with pytest.raises(KeyboardInterrupt):
            gate.acquire_sync()
        thread.join(10)
    finally:
        signal.signal(signal.SIGINT, old_handler)
    stats = gate.statistics()
    assert (stats.waiting, stats.cancelled, stats.in_flight) == (0, 1, 1)
    holder.release()
    assert gate.in_flight == 0


def test_thread_interrupted_after_its_grant_passes_the_slot_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An exception that hits a thread right after it was granted hands the slot to the next."""
    gate = Gate(1)
    holder = gate.acquire_nowait()
    real_block = _waiters.ThreadWaiter.block
    first = threading.Event()

    def block_then_interrupt(self: _waiters.ThreadWaiter, timeout: float | None) -> bool:
        woken = real_block(self, timeout)
        if not first.is_set():
            first.set()
            raise KeyboardInterrupt  # as if Ctrl-C landed between the wake and the return
        return woken

    monkeypatch.setattr(_waiters.ThreadWaiter, "block", block_then_interrupt)
    _, interrupted = start_thread(gate.acquire_sync)
    wait_until(lambda: gate.waiting == 1, "first thread to queue")
    _, second = start_thread(gate.acquire_sync)
    wait_until(lambda: gate.waiting == 2, "second thread to queue")
    holder.release()
    with pytest.raises(KeyboardInterrupt):
        interrupted.result(timeout=10)
    token = second.result(timeout=10)
    assert isinstance(token, Token)
    assert gate.in_flight == 1
    token.release()
    assert gate.in_flight == 0


# --------------------------------------------------------------------- loops in threads


async def test_release_from_a_plain_thread_wakes_an_async_waiter(anyio_backend: Any) -> None:
    """A waiter on this loop is woken by a release in a worker thread (no polling)."""
    gate = Gate(1)
    holder = gate.acquire_nowait()
    async with anyio.create_task_group() as tg:
        box: list[Token] = []

        async def wait() -> None:
            box.append(await gate.acquire())

        tg.start_soon(wait)
        await anyio.wait_all_tasks_blocked()
        assert gate.waiting == 1
        await anyio.to_thread.run_sync(holder.release)
    assert gate.in_flight == 1
    box[0].release()


@pytest.mark.parametrize("remote", LOOP_KINDS)
async def test_release_on_this_loop_wakes_a_waiter_on_another_loop(
    anyio_backend: Any, remote: str
) -> None:
    """A token released here wakes a waiter parked on an asyncio or trio loop in another thread."""
    gate = Gate(1)
    holder = gate.acquire_nowait()
    # Portal calls block (and trio refuses them from any trio thread), so every portal
    # operation goes through a worker thread.
    portal_cm = anyio.from_thread.start_blocking_portal(remote)
    portal = await anyio.to_thread.run_sync(portal_cm.__enter__)
    try:
        future = await anyio.to_thread.run_sync(portal.start_task_soon, gate.acquire)
        await await_until(lambda: gate.waiting == 1, "remote waiter to queue")
        holder.release()
        token = await anyio.to_thread.run_sync(future.result, 10)
    finally:
        await anyio.to_thread.run_sync(portal_cm.__exit__, None, None, None)
    assert isinstance(token, Token)
    assert gate.in_flight == 1
    token.release()  # released on a different loop than it was acquired on
    assert gate.in_flight == 0


@pytest.mark.parametrize("remote", LOOP_KINDS)
def test_token_acquired_on_one_loop_released_on_another(remote: str) -> None:
    """A token taken by a task on loop A is released by a task on loop B (any kinds)."""
    gate = Gate(1)
    with loop_thread(remote) as a, loop_thread("asyncio") as b:
        token = a.call(gate.acquire)
        waiting = a.start_task_soon(gate.acquire)
        wait_until(lambda: gate.waiting == 1, "second acquire to queue")

        async def release() -> None:
            token.release()

        b.call(release)
        second = waiting.result(timeout=10)
        assert gate.in_flight == 1
        b.call(anyio.to_thread.run_sync, second.release)
    assert gate.in_flight == 0


def test_fifo_across_every_kind_of_waiter() -> None:
    """Threads, asyncio tasks and trio tasks queued on one gate are served in queue order."""
    gate = Gate(1)
    holder = gate.acquire_nowait()
    log: list[str] = []

    async def take(name: str) -> None:
        async with gate.acquire():
            log.append(name)

    def take_sync(name: str) -> None:
        with gate.acquire_sync():
            log.append(name)

    with ExitStack() as stack:
        asyncio_portal = stack.enter_context(loop_thread("asyncio"))
        trio_portal = stack.enter_context(loop_thread("trio"))
        order = ["trio-1", "thread-1", "asyncio-1", "trio-2", "asyncio-2", "thread-2"]
        futures: list[Future[Any]] = []
        for i, name in enumerate(order):
            if name.startswith("trio"):
                futures.append(trio_portal.start_task_soon(take, name))
            elif name.startswith("asyncio"):
                futures.append(asyncio_portal.start_task_soon(take, name))
            else:
                futures.append(start_thread(lambda name=name: take_sync(name))[1])
            wait_until(lambda i=i: gate.waiting == i + 1, f"{name} to queue")
        holder.release()
        for future in futures:
            future.result(timeout=10)
    assert log == order
    assert gate.in_flight == 0


def test_waiter_on_a_closed_loop_passes_its_slot_on() -> None:
    """A waiter whose asyncio loop closed while it waited cannot take the slot; the next one does."""
    gate = Gate(1)
    holder = gate.acquire_nowait()
    loop = asyncio.new_event_loop()
    queued = threading.Event()

    async def acquire() -> Token:
        return await gate.acquire()

    stranded: list[asyncio.Task[Token]] = []

    async def strand() -> None:
        stranded.append(loop.create_task(acquire()))  # parks and is never resumed
        await asyncio.sleep(0)
        queued.set()

    def run_then_close() -> None:
        loop.run_until_complete(strand())
        loop.close()  # the pending acquire task is abandoned with its loop

    thread = threading.Thread(target=run_then_close)
    thread.start()
    thread.join()
    assert queued.is_set()
    assert gate.waiting == 1
    _, second = start_thread(gate.acquire_sync)
    wait_until(lambda: gate.waiting == 2, "the thread to queue behind the stranded task")
    holder.release()  # the wake-up fails (loop closed): the slot must go to the thread
    token = second.result(timeout=10)
    assert isinstance(token, Token)
    assert gate.statistics().cancelled == 1
    token.release()
    assert gate.in_flight == 0


def test_soak_many_runtimes_share_one_gate() -> None:
    """Two asyncio loops, a uvloop/trio mix and plain threads hammer one gate; the cap holds.

    Half of the tokens are released from a different thread than the one that acquired
    them, and the capacity changes while the soak runs; afterwards nothing is in flight
    and every acquisition was admitted exactly once.
    """
    gate = Gate(3)
    lock = threading.Lock()
    holding = peak = 0
    rounds = 400
    handoff: list[Token] = []
    handoff_lock = threading.Lock()

    def enter() -> None:
        nonlocal holding, peak
        with lock:
            holding += 1
            peak = max(peak, holding)
            assert holding <= 4  # the largest capacity set below

    def leave() -> None:
        nonlocal holding
        with lock:
            holding -= 1

    def give_away(token: Token) -> None:
        """Release a token held by someone else, if any, then park ours for someone else."""
        with handoff_lock:
            other = handoff.pop() if handoff else None
            handoff.append(token)
        if other is not None:
            leave()
            other.release()

    async def async_worker(i: int) -> None:
        for n in range(rounds):
            token = await gate.acquire()
            enter()
            await anyio.lowlevel.checkpoint()
            if (n + i) % 2:
                give_away(token)
            else:
                leave()
                token.release()

    def thread_worker(i: int) -> None:
        for n in range(rounds):
            token = gate.acquire_sync()
            enter()
            time.sleep(0)
            if (n + i) % 2:
                give_away(token)
            else:
                leave()
                token.release()

    def resize() -> None:
        for n in range(40):
            gate.capacity = 1 + n % 4
            time.sleep(0.0005)
        gate.capacity = 3

    with ExitStack() as stack:
        portals = [
            stack.enter_context(loop_thread(kind)) for kind in ("asyncio", "asyncio", "trio")
        ]
        futures: list[Future[Any]] = []
        for p, portal in enumerate(portals):
            futures += [portal.start_task_soon(async_worker, p * 10 + k) for k in range(3)]
        futures += [start_thread(lambda i=i: thread_worker(i))[1] for i in range(3)]
        futures.append(start_thread(resize)[1])
        for future in futures:
            future.result(timeout=60)
    for token in handoff:
        leave()
        token.release()
    assert holding == 0
    assert 1 <= peak <= 4
    stats = gate.statistics()
    assert (stats.in_flight, stats.waiting) == (0, 0)
    assert stats.admitted == 12 * rounds


def test_acquire_sync_refused_inside_trio_and_asyncio_loops() -> None:
    """acquire_sync() in a coroutine on either loop raises RuntimeError naming the loop."""
    gate = Gate(1)

    async def call() -> None:
        gate.acquire_sync()

    for kind in LOOP_KINDS:
        with loop_thread(kind) as portal, pytest.raises(RuntimeError, match=kind):
            portal.call(call)
    assert gate.in_flight == 0
