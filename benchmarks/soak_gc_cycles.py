"""Soak: tokens that die in garbage cycles with the user object that releases them (issue 27).

A user object in a reference cycle whose ``__del__`` releases its token gives the slot back
exactly once; it must never be counted as a leak (``Gate.statistics().leaked``) nor warned
about, whichever of the two the cyclic collector finalizes first. A real leak in a cycle
(an object that never releases) must still be counted, once, with its warning.

Each runtime (asyncio, asyncio + uvloop where installed, trio, and two plain threads, all at
once, on one gate) repeats: acquire, hand the token to a cyclic owner, drop it. One owner in
``LEAK_EVERY`` never releases (a real leak). The collector runs on its own (a low gen-0
threshold, so collections start inside the gate's own steps too) and at the end.

It prints, per run: the operations, the real leaks made, the leaks the gate counted, the
false leaks (counted minus real), the ResourceWarnings seen and the slots left held.

Usage: ``python benchmarks/soak_gc_cycles.py [--ops N] [--runs R]``
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import threading
import warnings
from typing import Any

import anyio
import anyio.lowlevel

from anygate import Gate, Token

LEAK_EVERY = 50


class Owner:
    """Owns a token in a reference cycle and gives it back in ``__del__``."""

    def __init__(self, token: Token) -> None:
        self.token = token
        self.me = self

    def __del__(self) -> None:
        self.token.release()


class Hoarder:
    """Owns a token in a reference cycle and never gives it back: a real leak."""

    def __init__(self, token: Token) -> None:
        self.token = token
        self.me = self


class Count:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.real = 0

    def add(self) -> None:
        with self.lock:
            self.real += 1


def step(n: int, token: Token, count: Count) -> None:
    if n % LEAK_EVERY == LEAK_EVERY - 1:
        count.add()
        Hoarder(token)
    else:
        Owner(token)


async def async_worker(gate: Gate, ops: int, count: Count) -> None:
    for n in range(ops):
        token = await gate.acquire()
        step(n, token, count)
        del token
        if n % 64 == 0:
            await anyio.lowlevel.checkpoint()


def sync_worker(gate: Gate, ops: int, count: Count) -> None:
    for n in range(ops):
        token = gate.acquire_sync()
        step(n, token, count)
        del token


def run(ops: int) -> tuple[int, int, int, int]:
    """One run of ``ops`` operations per runtime; returns (real, counted, warned, held)."""
    import trio  # noqa: F401  # imported once here: concurrent first imports race

    gate = Gate(10_000, name="gc-cycles")
    count = Count()
    runtimes: list[tuple[str, dict[str, Any]]] = [("asyncio", {})]
    if importlib.util.find_spec("uvloop") is not None:
        runtimes.append(("asyncio", {"use_uvloop": True}))
    runtimes.append(("trio", {}))
    threads = [
        threading.Thread(
            target=lambda b=backend, o=options: anyio.run(
                async_worker, gate, ops, count, backend=b, backend_options=o
            )
        )
        for backend, options in runtimes
    ]
    threads += [threading.Thread(target=sync_worker, args=(gate, ops, count)) for _ in range(2)]
    warned = 0
    old = gc.get_threshold()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always", ResourceWarning)
        gc.set_threshold(50)
        try:
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        finally:
            gc.set_threshold(*old)
        gc.collect()
        gc.collect()
        warned = sum(issubclass(w.category, ResourceWarning) for w in record)
    stats = gate.statistics()
    return count.real, stats.leaked, warned, stats.in_flight


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=2000, help="operations per runtime")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    total = [0, 0, 0, 0, 0]
    for _ in range(args.runs):
        real, counted, warned, held = run(args.ops)
        runtimes = 4 + (importlib.util.find_spec("uvloop") is not None)
        ops = args.ops * runtimes
        print(
            f"ops {ops}: real leaks {real}, counted {counted}, false leaks {counted - real}, "
            f"warnings {warned}, slots held {held}"
        )
        for i, value in enumerate((ops, real, counted - real, warned, held)):
            total[i] += value
    print(
        f"total: ops {total[0]}, real leaks {total[1]}, false leaks {total[2]}, "
        f"warnings {total[3]}, slots held {total[4]}"
    )


if __name__ == "__main__":
    main()
