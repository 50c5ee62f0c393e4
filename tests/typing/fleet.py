"""Type-level tests of anygate.fleet: checked by mypy and pyright, never executed."""

# pyright: strict, reportUnnecessaryTypeIgnoreComment=error

from __future__ import annotations

from typing_extensions import assert_type

import anygate
from anygate.fleet import FleetGate, FleetStatistics, FleetUnavailable


async def fleet_api() -> None:
    fleet = FleetGate("llm", capacity=16, url="redis://127.0.0.1:6379/0", on_unavailable="open")
    assert_type(fleet.gate, anygate.Gate)
    assert_type(fleet.capacity, int)
    assert_type(fleet.name, str)
    assert_type(fleet.acquire(), anygate.Acquisition)
    assert_type(await fleet.acquire(timeout=1.0), anygate.Token)
    async with fleet.acquire() as token:
        assert_type(token, anygate.Token)
    assert_type(fleet.acquire_sync(timeout=2), anygate.Token)
    assert_type(fleet.acquire_nowait(), anygate.Token)
    await fleet.set_capacity(8)
    fleet.set_capacity_sync(8, timeout=1.0)
    stats = fleet.statistics()
    assert_type(stats, FleetStatistics)
    assert_type(stats.unavailable, str | None)
    with fleet:
        pass
    fleet.close(timeout=1.0)
    try:
        pass
    except FleetUnavailable as exc:
        assert_type(exc.cause, str)
        assert_type(exc.fleet, str)
    FleetGate("llm", capacity="8")  # type: ignore[arg-type]
    anygate.Policy(gate=fleet.gate)
    rated = FleetGate("llm", capacity=16, rate=anygate.Rate(tokens_per_minute=10_000))
    token = await rated.acquire(timeout=1.0, tokens=100, priority=1)
    assert_type(rated.rate, anygate.Rate | None)
    await rated.set_rate(anygate.Rate(tokens_per_minute=20_000), timeout=2.0)
    rated.set_rate_sync(anygate.Rate(tokens_per_minute=20_000))
    await rated.set_rate(None)  # type: ignore[arg-type]
    token.settle(tokens=120)
    assert_type(rated.acquire_sync(tokens=5), anygate.Token)
    assert_type(rated.acquire_nowait(tokens=5, priority=2), anygate.Token)
    FleetGate("llm", capacity=16, rate="60/min")  # type: ignore[arg-type]
    split = FleetGate(
        "llm",
        capacity=16,
        rate=anygate.Rate(input_tokens_per_minute=30_000, output_tokens_per_minute=8_000),
    )
    token = await split.acquire(timeout=1.0, tokens=1_100, output_tokens=1_000)
    token.settle(tokens=400, output_tokens=300)
    assert_type(split.acquire_sync(tokens=5, output_tokens=1), anygate.Token)
    assert_type(split.acquire_nowait(output_tokens=5), anygate.Token)
    split.acquire(output_tokens="5")  # type: ignore[arg-type]
