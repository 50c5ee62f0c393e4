"""Gate benchmarks, each printed as a ratio against a baseline measured in the same run.

    python benchmarks/bench_gate.py            # everything (a couple of minutes)
    python benchmarks/bench_gate.py a c        # only some sections

(a) uncontended acquire+release pair vs asyncio.Semaphore, anyio.Semaphore(fast_acquire=True)
    and anyio.CapacityLimiter on asyncio; vs trio.Semaphore and anyio.Semaphore on trio.
    Target: <= 1.5x anyio.Semaphore(fast_acquire=True) on each backend.
(b) contended: 1000 tasks x 20 rounds, capacity 10, one checkpoint while holding.
    Target: <= 1.15x the fastest native semaphore on each backend.
(c) cross-thread wake latency: a plain thread releases, a task on a loop resumes; vs the bare
    call_soon_threadsafe / run_sync_soon round trip. Target: median <= 1.3x.
(d) 10^4 vs 10^5 queued waiters cancelling, and memory per queued waiter.
    Target: 10^5 <= 12x the 10^4 time; <= 600 bytes per waiter (the gate's share).

Timings are best-of-N wall clock on a shared machine: read ratios, not absolute numbers.
"""

from __future__ import annotations

import asyncio
import gc
import random
import statistics
import sys
import threading
import time
import tracemalloc
from typing import TYPE_CHECKING, Any

import anyio
import trio
import trio.lowlevel

from anygate import Gate, _waiters

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable


def report(name: str, value: float, target: float, unit: str = "x") -> None:
    verdict = "ok" if value <= target else "MISSED"
    print(f"    {name}: {value:.2f}{unit} (target <= {target:g}{unit}) {verdict}")


def best_of(runs: int, fn: Callable[[], float]) -> float:
    return min(fn() for _ in range(runs))


# ----------------------------------------------------------------------------- (a)

PAIRS = 100_000


async def _pairs_gate(gate: Gate) -> float:
    start = time.perf_counter()
    for _ in range(PAIRS):
        async with gate.acquire():
            pass
    return (time.perf_counter() - start) / PAIRS


async def _pairs_cm(cm: Any) -> float:
    start = time.perf_counter()
    for _ in range(PAIRS):
        async with cm:
            pass
    return (time.perf_counter() - start) / PAIRS


async def _uncontended(backend: str) -> None:
    contenders: dict[str, Callable[[], Awaitable[float]]] = {
        "anygate.Gate": lambda: _pairs_gate(Gate(10)),
        "anyio.Semaphore(fast_acquire=True)": lambda: _pairs_cm(
            anyio.Semaphore(10, fast_acquire=True)
        ),
        "anyio.CapacityLimiter": lambda: _pairs_cm(anyio.CapacityLimiter(10)),
    }
    if backend == "asyncio":
        contenders["asyncio.Semaphore"] = lambda: _pairs_cm(asyncio.Semaphore(10))
    else:
        contenders["trio.Semaphore"] = lambda: _pairs_cm(trio.Semaphore(10))
    results = dict.fromkeys(contenders, 1000000000.0)
    for _ in range(5):  # interleave the contenders so drift hits all of them alike
        for name, run in contenders.items():
            results[name] = min(results[name], await run())
    for name, seconds in results.items():
        print(f"    {name:38s} {seconds * 1e9:7.0f} ns/pair")
    report(
        "anygate / anyio.Semaphore(fast_acquire=True)",
        results["anygate.Gate"] / results["anyio.Semaphore(fast_acquire=True)"],
        1.5,
    )


# ----------------------------------------------------------------------------- (b)

TASKS, ROUNDS, CAPACITY = 1000, 20, 10


async def _contended_run(make_cm: Callable[[], Any]) -> float:
    cm = make_cm()

    async def worker() -> None:
        for _ in range(ROUNDS):
            async with cm:
                await anyio.lowlevel.checkpoint()

    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(TASKS):
            tg.start_soon(worker)
    return time.perf_counter() - start


async def _contended(backend: str) -> None:
    contenders: dict[str, Callable[[], Any]] = {
        "anyio.Semaphore": lambda: anyio.Semaphore(CAPACITY),
        "anyio.Semaphore(fast_acquire=True)": lambda: anyio.Semaphore(CAPACITY, fast_acquire=True),
    }
    if backend == "asyncio":
        contenders["asyncio.Semaphore"] = lambda: asyncio.Semaphore(CAPACITY)
    else:
        contenders["trio.Semaphore"] = lambda: trio.Semaphore(CAPACITY)

    async def run_gate() -> float:
        gate = Gate(CAPACITY)

        async def worker() -> None:
            for _ in range(ROUNDS):
                async with gate.acquire():
                    await anyio.lowlevel.checkpoint()

        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(TASKS):
                tg.start_soon(worker)
        return time.perf_counter() - start

    results = dict.fromkeys([*contenders, "anygate.Gate"], 1000000000.0)
    for _ in range(3):
        for name, make in contenders.items():
            results[name] = min(results[name], await _contended_run(make))
        results["anygate.Gate"] = min(results["anygate.Gate"], await run_gate())
    for name, seconds in results.items():
        print(f"    {name:38s} {seconds * 1e3:7.1f} ms")
    native = min(v for k, v in results.items() if k != "anygate.Gate")
    report("anygate / fastest native semaphore", results["anygate.Gate"] / native, 1.15)


# ----------------------------------------------------------------------------- (c)

WAKES = 1500


def _spin_until(predicate: Callable[[], bool]) -> None:
    while not predicate():
        time.sleep(0)


def _latency_asyncio(loop: asyncio.AbstractEventLoop, use_gate: bool) -> list[float]:
    samples = []
    gate = Gate(1)
    for _ in range(WAKES):
        parked = threading.Event()
        fut_box: list[asyncio.Future[None]] = []
        holder = gate.acquire_nowait() if use_gate else None

        async def wait(
            parked: threading.Event = parked, fut_box: list[asyncio.Future[None]] = fut_box
        ) -> float:
            if use_gate:
                token = await gate.acquire()
                resumed = time.perf_counter()
                token.release()
                return resumed
            fut = loop.create_future()
            fut_box.append(fut)
            parked.set()
            await fut
            return time.perf_counter()

        cf = asyncio.run_coroutine_threadsafe(wait(), loop)
        if use_gate:
            _spin_until(lambda: gate.waiting == 1)
            start = time.perf_counter()
            assert holder is not None
            holder.release()
        else:
            _spin_until(parked.is_set)  # the same handshake as the gate variant
            start = time.perf_counter()
            loop.call_soon_threadsafe(fut_box[0].set_result, None)
        samples.append(cf.result() - start)
    return samples


def _latency_trio(portal: anyio.from_thread.BlockingPortal, use_gate: bool) -> list[float]:
    samples = []
    gate = Gate(1)
    trio_token = portal.call(trio.lowlevel.current_trio_token)
    for _ in range(WAKES):
        parked = threading.Event()
        task_box: list[Any] = []
        holder = gate.acquire_nowait() if use_gate else None

        async def wait(parked: threading.Event = parked, task_box: list[Any] = task_box) -> float:
            if use_gate:
                token = await gate.acquire()
                resumed = time.perf_counter()
                token.release()
                return resumed
            task_box.append(trio.lowlevel.current_task())
            parked.set()
            await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.SUCCEEDED)
            return time.perf_counter()

        cf = portal.start_task_soon(wait)
        if use_gate:
            _spin_until(lambda: gate.waiting == 1)
            start = time.perf_counter()
            assert holder is not None
            holder.release()
        else:
            _spin_until(parked.is_set)
            start = time.perf_counter()
            trio_token.run_sync_soon(trio.lowlevel.reschedule, task_box[0])
        samples.append(cf.result() - start)
    return samples


def _cross_thread() -> None:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        bare = statistics.median(_latency_asyncio(loop, use_gate=False))
        gated = statistics.median(_latency_asyncio(loop, use_gate=True))
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
    print(
        f"    asyncio: bare call_soon_threadsafe {bare * 1e6:6.1f} us, anygate {gated * 1e6:6.1f} us"
    )
    report("asyncio median wake latency / bare round trip", gated / bare, 1.3)
    with anyio.from_thread.start_blocking_portal("trio") as portal:
        bare = statistics.median(_latency_trio(portal, use_gate=False))
        gated = statistics.median(_latency_trio(portal, use_gate=True))
    print(f"    trio: bare run_sync_soon {bare * 1e6:6.1f} us, anygate {gated * 1e6:6.1f} us")
    report("trio median wake latency / bare round trip", gated / bare, 1.3)


# ----------------------------------------------------------------------------- (d)


async def _cancel_many(n: int, *, gate: bool) -> tuple[float, int]:
    """Park ``n`` tasks (on the gate, or on a bare Event), cancel them all; (seconds, bytes)."""
    g = Gate(0)
    event = anyio.Event()

    async def wait() -> None:
        if gate:
            await g.acquire()
        else:
            await event.wait()

    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    async with anyio.create_task_group() as tg:
        for _ in range(n):
            tg.start_soon(wait)
        await anyio.wait_all_tasks_blocked()
        parked = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
        start = time.perf_counter()
        tg.cancel_scope.cancel()
    elapsed = time.perf_counter() - start
    if gate:
        assert g.waiting == 0
    return elapsed, parked


def _withdraw_only(n: int, *, shuffled: bool, gate_work: bool = True) -> float:
    """The gate's own share of (d): queue ``n`` waiters, then withdraw every one of them.

    No event loop is involved, so this isolates the ledger's unregistration (lazy deletion
    plus compaction) from the runtime's cost of delivering ``n`` cancellations, which on
    asyncio is itself superlinear (see the bare anyio.Event line). With ``gate_work=False``
    it only touches each waiter object in the same order: the memory-hierarchy baseline
    (10^5 scattered objects no longer fit in cache, whatever the algorithm).
    """
    gate = Gate(0)
    waiters = [_waiters.ThreadWaiter() for _ in range(n)]
    for waiter in waiters:
        gate._enqueue(waiter)
    order = list(range(n))
    if shuffled:
        random.Random(n).shuffle(order)
    start = time.perf_counter()
    if gate_work:
        for i in order:
            gate._withdraw(waiters[i])
        assert gate.waiting == 0
    else:
        for i in order:
            waiters[i].state = _waiters.GONE
    return time.perf_counter() - start


async def _scaling(backend: str) -> None:
    small, _ = await _cancel_many(10_000, gate=True)
    large, mem_gate = await _cancel_many(100_000, gate=True)
    bare_small, _ = await _cancel_many(10_000, gate=False)
    bare_large, mem_bare = await _cancel_many(100_000, gate=False)
    print(f"    cancel 10^4 waiters: {small * 1e3:7.1f} ms, 10^5: {large * 1e3:7.1f} ms")
    print(
        f"    same on a bare anyio.Event: 10^4 {bare_small * 1e3:7.1f} ms, "
        f"10^5 {bare_large * 1e3:7.1f} ms ({bare_large / bare_small:.1f}x: the runtime's own scaling)"
    )
    report("10^5 / 10^4 cancellation time", large / small, 12)
    per_task = mem_gate / 100_000
    per_gate = (mem_gate - mem_bare) / 100_000
    print(
        f"    memory per parked task: {per_task:.0f} B on the gate, "
        f"{mem_bare / 100_000:.0f} B on a bare anyio.Event (task + coroutine frames)"
    )
    report("memory per queued waiter, the gate's share", per_gate, 600, " B")


# ----------------------------------------------------------------------------- main


def _withdrawal() -> None:
    def ratio(**kw: bool) -> tuple[float, float]:
        small = best_of(3, lambda: _withdraw_only(10_000, **kw))
        large = best_of(3, lambda: _withdraw_only(100_000, **kw))
        return small, large

    small, large = ratio(shuffled=False)
    print(
        f"    gate only, FIFO order: withdraw 10^4 {small * 1e3:6.1f} ms, 10^5 {large * 1e3:6.1f} ms"
    )
    report("gate-only 10^5 / 10^4 withdrawal time (FIFO order)", large / small, 12)
    small, large = ratio(shuffled=True)
    touch_small, touch_large = ratio(shuffled=True, gate_work=False)
    print(
        f"    gate only, random order: {large / small:.1f}x; merely touching the same objects "
        f"in that order: {touch_large / touch_small:.1f}x (cache misses, not the algorithm)"
    )


def main(argv: list[str]) -> None:
    sections = set(argv) or {"a", "b", "c", "d"}
    print(
        f"Python {sys.version.split()[0]}, anyio {anyio.__version__ if hasattr(anyio, '__version__') else ''} trio {trio.__version__}"
    )
    backends: list[tuple[str, str, dict[str, Any]]] = [("asyncio", "asyncio", {})]
    try:
        import uvloop  # noqa: F401

        backends.append(("asyncio+uvloop", "asyncio", {"use_uvloop": True}))
    except ImportError:
        pass
    backends.append(("trio", "trio", {}))
    if "a" in sections:
        print("(a) uncontended acquire+release pair")
        for label, backend, options in backends:
            print(f"  {label}")
            anyio.run(_uncontended, backend, backend=backend, backend_options=options)
    if "b" in sections:
        print(f"(b) contended: {TASKS} tasks x {ROUNDS} rounds, capacity {CAPACITY}")
        for label, backend, options in backends:
            print(f"  {label}")
            anyio.run(_contended, backend, backend=backend, backend_options=options)
    if "c" in sections:
        print("(c) cross-thread wake latency (median)")
        _cross_thread()
    if "d" in sections:
        print("(d) cancelling many queued waiters")
        _withdrawal()
        for label, backend, options in backends:
            print(f"  {label}")
            anyio.run(_scaling, backend, backend=backend, backend_options=options)


if __name__ == "__main__":
    main(sys.argv[1:])
