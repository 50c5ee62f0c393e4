"""Per-call overhead of the policy with a no-op function, next to stamina and tenacity.

    python benchmarks/bench_policy.py

For each backend (asyncio, trio) it prints the cost of one guarded call of an ``async def``
that returns at once, in microseconds, best of several runs:

* ``Policy.call``: the default policy (breaker on, adaptive limit on, uncapped shared gate);
* ``@policy.retry``: the decorator form (a thin client of ``Policy.call``);
* ``Policy.run``: the public attempt loop, the step taking its slot itself;
* ``policy.attempts()``: the block form (``async for attempt ...: async with attempt:``);
* ``bare``: the function called directly (the floor);
* stamina's ``@stamina.retry`` and tenacity's ``@tenacity.retry``, when installed (``nox -s
  bench`` installs them; they are not dependencies of anygate).

There is no target: issue 10 asks that the policy's cost does not grow, and the peers give
the scale (each retries, none holds a slot or consults a breaker). Timings are the process's
CPU time (best of several runs), so other load on a shared machine counts less than in wall
time; still, compare within one run.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import anyio

from anygate import Policy

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

CALLS = 10_000
RUNS = 15


async def noop() -> int:
    return 1


async def _time(call: Callable[[], Awaitable[Any]]) -> float:
    best = float("inf")
    for _ in range(RUNS):
        start = time.process_time()
        for _ in range(CALLS):
            await call()
        best = min(best, time.process_time() - start)
    return best / CALLS * 1e6


async def _measure(backend: str) -> None:
    policy = Policy(name=f"bench-{backend}", max_concurrent_calls=0)
    rows: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
        ("bare", noop),
        ("Policy.call", lambda: policy.call(noop)),
        ("@policy.retry", policy.retry(noop)),
    ]
    run = getattr(policy, "run", None)
    if run is not None:

        async def step(attempt: Any) -> int:
            async with await attempt.acquire():
                return await noop()

        rows.append(("Policy.run", lambda: run(step)))
    if getattr(policy, "attempts", None) is not None:

        async def block() -> int:
            async for attempt in policy.attempts():
                async with attempt:
                    return await noop()
            raise AssertionError  # pragma: no cover

        rows.append(("policy.attempts()", block))
    try:
        import stamina

        rows.append(("stamina.retry", stamina.retry(on=Exception)(noop)))
    except ImportError:
        print("    (stamina not installed)")
    try:
        import tenacity

        rows.append(("tenacity.retry", tenacity.retry(stop=tenacity.stop_after_attempt(10))(noop)))
    except ImportError:
        print("    (tenacity not installed)")
    for name, call in rows:
        print(f"    {name:<20} {await _time(call):6.2f} us/call")


def main() -> None:
    for backend in ("asyncio", "trio"):
        print(f"{backend}:")
        anyio.run(_measure, backend, backend=backend)


if __name__ == "__main__":
    main()
