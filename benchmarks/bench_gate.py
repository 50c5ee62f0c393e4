"""Gate benchmarks, each printed as a ratio against a baseline measured in the same run.

    python benchmarks/bench_gate.py            # everything (a couple of minutes)
    python benchmarks/bench_gate.py a c        # only some sections

(a) uncontended acquire+release pair, each mode against anyio's matching one: Gate() vs
    anyio.Semaphore() (both checkpoint), Gate(fast_acquire=True) vs
    anyio.Semaphore(fast_acquire=True); also anyio.CapacityLimiter and asyncio.Semaphore /
    trio.Semaphore. Target: <= 1.5x the matching anyio mode on each backend.
(b) contended: 1000 tasks x 20 rounds, capacity 10, one checkpoint while holding.
    Target: the fastest native semaphore x 1.3 on asyncio, x 1.5 on uvloop, x 1.15 on trio.
(c) cross-thread wake latency: a plain thread releases, a task on a loop resumes; vs the bare
    call_soon_threadsafe / run_sync_soon round trip. Target: median <= 1.3x.
(d) 10^4 vs 10^5 queued waiters cancelling, and memory per queued waiter.
    Target: 10^5 <= 12x the 10^4 time; <= 600 bytes per waiter (the gate's share).
(e) uncontended pair with a Rate configured (budget available) vs the same gate without one.
    Target: <= 1.3x on each backend.
(f) rate precision over a 10-minute virtual run (trio MockClock, the gate on its clock):
    admitted per sliding minute <= rate + burst; per tick-aligned window <= ramp x previous
    + floor. Prints the worst excess (target 0).
(g) 10^4 waiters queued on budget: memory per waiter (gate's share, <= 600 B, as (d)) and
    the cost per admission + wake-up when the rate is lifted, next to (d)'s cost per
    cancelled waiter (reported, no target of its own).

Timings are best-of-N on a shared machine: read ratios, not absolute numbers. Sections (a),
(b) and (e) run on one thread and time it by its CPU time (``time.thread_time``), so that time
the machine gives to other processes does not count; the other sections use wall time.
"""

from __future__ import annotations

import asyncio
import bisect
import gc
import math
import random
import statistics
import sys
import threading
import time
import tracemalloc
from collections import Counter
from typing import TYPE_CHECKING, Any

import anyio
import trio
import trio.lowlevel

from anygate import Gate, Rate
from anygate._gate import cancel_state as _cancel_state
from anygate._gate import waiters as _waiters

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable


_cpu = time.thread_time  # (a), (b), (e): this thread's CPU time, see the module docstring


def report(name: str, value: float, target: float, unit: str = "x") -> None:
    verdict = "ok" if value <= target else "MISSED"
    print(f"    {name}: {value:.2f}{unit} (target <= {target:g}{unit}) {verdict}")


def best_of(runs: int, fn: Callable[[], float]) -> float:
    return min(fn() for _ in range(runs))


# ----------------------------------------------------------------------------- (a)

PAIRS = 100_000


async def _pairs_gate(gate: Gate) -> float:
    start = _cpu()
    for _ in range(PAIRS):
        async with gate.acquire():
            pass
    return (_cpu() - start) / PAIRS


async def _pairs_cm(cm: Any) -> float:
    start = _cpu()
    for _ in range(PAIRS):
        async with cm:
            pass
    return (_cpu() - start) / PAIRS


async def _public_only() -> float:
    """The fast pair with the cancel point asked through the public APIs (the guard's fallback)."""
    _cancel_state.use_public(True)
    try:
        return await _pairs_gate(Gate(10, fast_acquire=True))
    finally:
        _cancel_state.use_public(False)


async def _uncontended(backend: str) -> None:
    # Each gate mode against anyio's matching mode: the default checkpoints (a schedule
    # point on every acquire), fast_acquire=True only checks for cancellation.
    contenders: dict[str, Callable[[], Awaitable[float]]] = {
        "anygate.Gate": lambda: _pairs_gate(Gate(10)),
        "anyio.Semaphore": lambda: _pairs_cm(anyio.Semaphore(10)),
        "anygate.Gate(fast_acquire=True)": lambda: _pairs_gate(Gate(10, fast_acquire=True)),
        "anyio.Semaphore(fast_acquire=True)": lambda: _pairs_cm(
            anyio.Semaphore(10, fast_acquire=True)
        ),
        "anyio.CapacityLimiter": lambda: _pairs_cm(anyio.CapacityLimiter(10)),
        "anygate.Gate(fast_acquire=True), public": _public_only,
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
        "anygate / anyio.Semaphore (both checkpoint)",
        results["anygate.Gate"] / results["anyio.Semaphore"],
        1.5,
    )
    report(
        "anygate(fast_acquire) / anyio.Semaphore(fast_acquire)",
        results["anygate.Gate(fast_acquire=True)"] / results["anyio.Semaphore(fast_acquire=True)"],
        1.5,
    )
    print(
        "    the same on the public-only fallback (no private reads): "
        f"{results['anygate.Gate(fast_acquire=True), public'] / results['anyio.Semaphore(fast_acquire=True)']:.2f}x"
    )


# ----------------------------------------------------------------------------- (b)

TASKS, ROUNDS, CAPACITY = 1000, 20, 10


async def _contended_run(make_cm: Callable[[], Any]) -> float:
    cm = make_cm()

    async def worker() -> None:
        for _ in range(ROUNDS):
            async with cm:
                await anyio.lowlevel.checkpoint()

    start = _cpu()
    async with anyio.create_task_group() as tg:
        for _ in range(TASKS):
            tg.start_soon(worker)
    return _cpu() - start


async def _contended(backend: str, target: float) -> None:
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

        start = _cpu()
        async with anyio.create_task_group() as tg:
            for _ in range(TASKS):
                tg.start_soon(worker)
        return _cpu() - start

    results = dict.fromkeys([*contenders, "anygate.Gate"], 1000000000.0)
    for _ in range(3):
        for name, make in contenders.items():
            results[name] = min(results[name], await _contended_run(make))
        results["anygate.Gate"] = min(results["anygate.Gate"], await run_gate())
    for name, seconds in results.items():
        print(f"    {name:38s} {seconds * 1e3:7.1f} ms")
    native = min(v for k, v in results.items() if k != "anygate.Gate")
    report("anygate / fastest native semaphore", results["anygate.Gate"] / native, target)


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


# ----------------------------------------------------------------------------- (e)

# A budget that never runs out: the rate path's arithmetic runs on every pair.
_ROOMY = Rate(requests_per_minute=1e12, tokens_per_minute=1e12, burst_s=60)


async def _uncontended_rate(backend: str) -> None:
    results = {"without rate": 1e9, "with rate": 1e9, "with rate, tokens=100": 1e9}

    async def tokens_pairs(gate: Gate) -> float:
        # On the thread's CPU time, as its baseline (_pairs_gate): timed on the wall
        # clock, a loaded machine added about 5 % to this ratio alone.
        start = _cpu()
        for _ in range(PAIRS):
            async with gate.acquire(tokens=100):
                pass
        return (_cpu() - start) / PAIRS

    for _ in range(5):
        results["without rate"] = min(results["without rate"], await _pairs_gate(Gate(10)))
        results["with rate"] = min(results["with rate"], await _pairs_gate(Gate(10, rate=_ROOMY)))
        results["with rate, tokens=100"] = min(
            results["with rate, tokens=100"], await tokens_pairs(Gate(10, rate=_ROOMY))
        )
    for name, seconds in results.items():
        print(f"    {name:38s} {seconds * 1e9:7.0f} ns/pair")
    report("with rate / without", results["with rate"] / results["without rate"], 1.3)
    report(
        "with rate and tokens / without",
        results["with rate, tokens=100"] / results["without rate"],
        1.3,
    )


# ----------------------------------------------------------------------------- (f)

PRECISION_S = 600.0


async def _precision_run(rate: Rate, fleet: int, hold_s: float) -> list[float]:
    gate = Gate(64, name="precision", rate=rate, clock=anyio.current_time)
    start = anyio.current_time()
    times: list[float] = []
    rng = random.Random(7)

    async def caller() -> None:
        while anyio.current_time() - start < PRECISION_S:
            async with gate.acquire():
                times.append(anyio.current_time() - start)
                await anyio.sleep(hold_s * rng.random())
            if rng.random() < 0.02:  # idle spells, so the ramp has to start over
                await anyio.sleep(60 * rng.random())

    async with anyio.create_task_group() as tg:
        for _ in range(fleet):
            tg.start_soon(caller)
    return times


def _worst_minute_excess(times: list[float], rate: Rate) -> float:
    """Max over sliding 60 s spans of admitted - (rate + burst)."""
    assert rate.requests_per_minute is not None
    allowed = rate.requests_per_minute * (1 + rate.burst_s / 60)
    worst = -math.inf
    j = 0
    for i, t in enumerate(times):  # spans ending at each admission: the worst ones
        while times[j] <= t - 60:
            j += 1
        worst = max(worst, (i - j + 1) - allowed)
    return worst


def _worst_slope_excess(times: list[float], rate: Rate) -> tuple[float, float]:
    """(tick-aligned windows, arbitrary sliding windows): max admitted - (ramp x prev + floor)."""
    assert rate.ramp is not None
    tick = rate.window_s / 10
    ticks = Counter(math.floor(round(t, 6) / tick) for t in times)
    last = max(ticks)
    worst_aligned = -math.inf
    for end in range(20, last + 11):
        current = sum(ticks.get(k, 0) for k in range(end - 10, end))
        previous = sum(ticks.get(k, 0) for k in range(end - 20, end - 10))
        worst_aligned = max(worst_aligned, current - (rate.ramp * previous + rate.floor))
    worst_any = -math.inf
    w = rate.window_s
    for t in times:  # windows (t - w, t]: how far off the tick grid the bound stays
        current = bisect.bisect_right(times, t) - bisect.bisect_right(times, t - w)
        previous = bisect.bisect_right(times, t - w) - bisect.bisect_right(times, t - 2 * w)
        worst_any = max(worst_any, current - (rate.ramp * previous + rate.floor))
    return worst_aligned, worst_any


def _precision() -> None:
    import trio.testing

    rate = Rate(requests_per_minute=600, ramp=2.0, window_s=10)
    clock = trio.testing.MockClock(autojump_threshold=0)
    start = time.perf_counter()
    times = anyio.run(
        _precision_run, rate, 100, 3.0, backend="trio", backend_options={"clock": clock}
    )
    elapsed = time.perf_counter() - start
    times.sort()
    print(f"    {len(times)} admissions in {PRECISION_S:.0f} virtual s ({elapsed:.1f} s real)")
    report(
        "worst excess per sliding minute over rate + burst",
        _worst_minute_excess(times, rate),
        0,
        "",
    )
    aligned, anywhere = _worst_slope_excess(times, rate)
    report("worst excess per tick-aligned window over ramp x prev + floor", aligned, 0, "")
    print(f"    (any sliding window, off the tick grid: worst excess {anywhere:g}; not a target)")


# ----------------------------------------------------------------------------- (g)


async def _budget_waiters(n: int) -> tuple[float, int, int]:
    """Park ``n`` tasks on an empty budget, then admit them all; (s per wake, bytes, bytes bare)."""
    gate = Gate(rate=Rate(requests_per_minute=60, burst_s=60), clock=lambda: 0.0)
    event = anyio.Event()
    done = 0

    async def wait() -> None:
        nonlocal done
        (await gate.acquire()).release()
        done += 1

    async def bare() -> None:
        await event.wait()

    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    async with anyio.create_task_group() as tg:
        for _ in range(n):
            tg.start_soon(bare)
        await anyio.wait_all_tasks_blocked()
        mem_bare = tracemalloc.get_traced_memory()[0] - base
        event.set()
    gc.collect()
    base = tracemalloc.get_traced_memory()[0]
    async with anyio.create_task_group() as tg:
        for _ in range(n):
            tg.start_soon(wait)
        await anyio.wait_all_tasks_blocked()
        parked = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
        assert gate.waiting == n
        start = time.perf_counter()
        # Lifting the rate is one locked step that admits every budget waiter; each wake
        # then resumes its task on the loop. (The clock stands still: nobody polls.)
        gate.rate = None
        while done < n:
            await anyio.lowlevel.checkpoint()
    elapsed = time.perf_counter() - start
    return elapsed / n, parked, mem_bare


async def _budget_scaling(backend: str) -> None:
    per_wake, parked, bare = await _budget_waiters(10_000)
    cancel_small, _ = await _cancel_many(10_000, gate=True)
    print(
        f"    10^4 waiters on budget: {per_wake * 1e6:6.2f} us per admission+wake; "
        f"cancelling 10^4 slot waiters (d): {cancel_small / 10_000 * 1e6:6.2f} us each"
    )
    report("memory per budget waiter, the gate's share", (parked - bare) / 10_000, 600, " B")


def main(argv: list[str]) -> None:
    sections = set(argv) or {"a", "b", "c", "d", "e", "f", "g"}
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
            target = {"asyncio": 1.3, "asyncio+uvloop": 1.5}.get(label, 1.15)
            anyio.run(_contended, backend, target, backend=backend, backend_options=options)
    if "c" in sections:
        print("(c) cross-thread wake latency (median)")
        _cross_thread()
    if "d" in sections:
        print("(d) cancelling many queued waiters")
        _withdrawal()
        for label, backend, options in backends:
            print(f"  {label}")
            anyio.run(_scaling, backend, backend=backend, backend_options=options)
    if "e" in sections:
        print("(e) uncontended acquire+release pair with a Rate (budget available)")
        for label, backend, options in backends:
            print(f"  {label}")
            anyio.run(_uncontended_rate, backend, backend=backend, backend_options=options)
    if "f" in sections:
        print("(f) rate precision, 10 virtual minutes, 600 rpm, ramp 2.0 / 10 s")
        _precision()
    if "g" in sections:
        print("(g) 10^4 waiters queued on budget")
        for label, backend, options in backends:
            print(f"  {label}")
            anyio.run(_budget_scaling, backend, backend=backend, backend_options=options)


if __name__ == "__main__":
    main(sys.argv[1:])
