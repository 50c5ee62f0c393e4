"""The fleet rate across real OS processes (half asyncio, half trio), one Redis.

The bound checked is the one ``docs/fleet.md`` states: fleet-wide, in any span of ``d``
seconds, admissions cost at most ``rate x (d + lag) + burst``, where ``lag`` covers the
time a permit takes from the script (which charges it on Redis time) to its caller (one
reply and one wake-up). Admission times are taken on ``CLOCK_MONOTONIC``, one clock for
every process of this host. N processes pacing to the rate each on their own would admit
N times it, far outside the bound.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

import anygate
from anygate.fleet import FleetGate

from .fleetproc import Fleet

if TYPE_CHECKING:
    from .redis_proc import RedisProc

#: Seconds from the script's charge to the caller's admission, at most (a reply and a
#: wake-up on a loaded 2-core machine; typically a millisecond).
LAG_S = 0.25


# Several processes each: run once per CI run, not per Python (see pyproject markers).
pytestmark = pytest.mark.processes


def _configs(n: int, **common: Any) -> list[dict[str, Any]]:
    return [{**common, "backend": "asyncio" if i % 2 == 0 else "trio", "seed": i} for i in range(n)]


def worst_excess(
    times: list[float], costs: list[int], per_s: float, burst: float, lag: float
) -> float:
    """max over spans [t_i, t_j] of cost(i..j) - (per_s x (t_j - t_i + lag) + burst)."""
    order = sorted(range(len(times)), key=times.__getitem__)
    ts = [times[k] for k in order]
    cs = [costs[k] for k in order]
    worst = -float("inf")
    for i in range(len(ts)):
        total = 0
        for j in range(i, len(ts)):
            total += cs[j]
            worst = max(worst, total - (per_s * (ts[j] - ts[i] + lag) + burst))
    return worst


def _run(server: RedisProc, name: str, n: int, **cfg: Any) -> list[dict[str, Any]]:
    fleet = Fleet(_configs(n, name=name, url=server.url, times=True, hold=(0.001, 0.005), **cfg))
    try:
        fleet.go()
        return fleet.results(timeout=cfg["duration"] + 60)
    finally:
        fleet.kill()


@pytest.mark.timeout(120)
def test_eight_processes_never_exceed_the_fleet_request_rate(
    redis_server: RedisProc, gate_name: str
) -> None:
    """8 processes x 20 tasks against 600 requests/minute (burst 0.5 s): in every span the
    fleet admits at most rate x (span + lag) + burst, and every process is served."""
    rpm, burst_s = 600.0, 0.5
    results = _run(
        redis_server,
        gate_name,
        8,
        capacity=16,
        tasks=20,
        duration=5.0,
        rate={"requests_per_minute": rpm, "burst_s": burst_s},
    )
    times = [t for r in results for t in r["grant_mono"]]
    assert all(r["grants"] > 0 for r in results), [r["grants"] for r in results]
    assert all(r["unavailable"] == 0 for r in results)
    per_s = rpm / 60
    excess = worst_excess(times, [1] * len(times), per_s, per_s * burst_s, LAG_S)
    assert excess <= 0, (excess, len(times))
    # Not vacuous: the fleet did run at its rate (a stalled fleet passes the bound too).
    span = max(times) - min(times)
    assert len(times) >= per_s * span * 0.5, (len(times), span)


@pytest.mark.timeout(120)
def test_four_processes_never_exceed_the_fleet_token_rate_with_settles(
    redis_server: RedisProc, gate_name: str
) -> None:
    """4 processes state 10 tokens per call and settle 15: the settled tokens stay within
    tokens_per_minute x (span + lag) + burst, plus the debts still in flight (each settle
    is charged fleet-wide at the agent's next call, 5 more tokens per call held)."""
    tpm, burst_s, capacity = 6000.0, 1.0, 8
    results = _run(
        redis_server,
        gate_name,
        4,
        capacity=capacity,
        tasks=10,
        duration=5.0,
        tokens=10,
        settle=15,
        rate={"tokens_per_minute": tpm, "burst_s": burst_s},
    )
    times = [t for r in results for t in r["grant_mono"]]
    costs = [c for r in results for c in r["settled"]]
    assert set(costs) == {15}
    per_s = tpm / 60
    in_flight_debt = capacity * (15 - 10)
    excess = worst_excess(times, costs, per_s, per_s * burst_s + in_flight_debt, LAG_S)
    assert excess <= 0, (excess, len(times))
    span = max(times) - min(times)
    assert sum(costs) >= per_s * span * 0.5, (sum(costs), span)


@pytest.mark.timeout(120)
def test_a_rate_set_live_by_one_process_paces_every_other(
    redis_server: RedisProc, gate_name: str
) -> None:
    """4 processes (half asyncio, half trio) given one request a minute, under which a
    second admission waits a minute: a fifth process sets the fleet's rate to 6,000 a
    minute as they start, and every one of them is then admitted many times within the
    4 s run, never beyond the new rate's bound (plus the one the old rate may admit)."""
    slow, rpm = {"requests_per_minute": 1.0}, 6000.0
    fleet = Fleet(
        _configs(
            4,
            name=gate_name,
            url=redis_server.url,
            times=True,
            hold=(0.001, 0.005),
            capacity=8,
            tasks=5,
            duration=4.0,
            rate=slow,
        )
    )
    setter = FleetGate(gate_name, capacity=8, url=redis_server.url, rate=anygate.Rate(**slow))
    try:
        fleet.go()
        setter.set_rate_sync(anygate.Rate(requests_per_minute=rpm), timeout=10)
        results = fleet.results(timeout=60)
    finally:
        fleet.kill()
        setter.close()
    assert all(r["grants"] >= 10 for r in results), [r["grants"] for r in results]
    times = [t for r in results for t in r["grant_mono"]]
    per_s = rpm / 60
    excess = worst_excess(times, [1] * len(times), per_s, per_s * 1.0 + 1, LAG_S)
    assert excess <= 0, (excess, len(times))
