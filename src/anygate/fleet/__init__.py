"""One capacity across a fleet of processes and hosts, on Redis (extra ``anygate[redis]``).

::

    fleet = anygate.fleet.FleetGate("llm", capacity=16, url="redis://redis:6379/0")

    async with fleet.acquire(timeout=30) as token:  # an ordinary anygate.Token
        ...
    policy = anygate.Policy("llm", gate=fleet.gate)  # every attempt takes a fleet slot

Every process (gunicorn/uvicorn workers, replicas on other hosts) creates a
:class:`FleetGate` with the same name and Redis; together they hold at most the capacity.
See ``docs/fleet.md`` for the guarantees in each Redis failure mode.

This module needs coredis (>= 6, built on AnyIO: runs under asyncio and trio); ``import
anygate`` alone does not import it.
"""

from __future__ import annotations

from ._errors import FleetUnavailable as FleetUnavailable
from ._fleet import FleetGate as FleetGate
from ._statistics import FleetStatistics as FleetStatistics

__all__ = ["FleetGate", "FleetStatistics", "FleetUnavailable"]

# Show the public path in reprs and tracebacks (as anygate's own names do).
FleetGate.__module__ = FleetStatistics.__module__ = FleetUnavailable.__module__ = __name__
