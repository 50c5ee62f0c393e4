"""What one process sees of a fleet gate (:meth:`FleetGate.statistics`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .._gate.rate import Rate

__all__ = ["FleetStatistics"]


@dataclass(frozen=True)
class FleetStatistics:
    """A snapshot of one process's view of a fleet gate.

    Attributes:
        name: the fleet gate's name.
        fleet_capacity: the fleet-wide capacity as last read from Redis.
        held: fleet leases this process holds.
        limit: this process's fair share while another process is short (``None``: none).
        local_capacity: slots this process's callers may use now (the local gate's capacity).
        in_flight: local tokens unreleased.
        waiting: local callers queued.
        processes: processes with leases or demand at the last call.
        unavailable: why Redis is unreachable, or ``None`` while it answers.
        on_unavailable: ``"closed"`` or ``"open"``.
        grace_left: seconds of restart grace left at the last call (no new grants).
        redis_calls: script calls this process made (wake-up pops not counted).
        rate: the fleet rate this process paces to (``rate=``, or the live rate it
            adopted last, :meth:`FleetGate.set_rate`); ``None``: no fleet rate.
        rate_version: the live rate's version it adopted last (``0``: none was set).
    """

    name: str
    fleet_capacity: int
    held: int
    limit: int | None
    local_capacity: float
    in_flight: int
    waiting: int
    processes: int
    unavailable: str | None
    on_unavailable: str
    grace_left: float
    redis_calls: int
    rate: Rate | None = None
    rate_version: int = 0
