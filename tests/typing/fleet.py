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
