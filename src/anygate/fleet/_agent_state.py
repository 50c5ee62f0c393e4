"""The fleet agent's state, and the steps that write it: Redis's replies and its outages.

Why. :class:`~anygate.fleet._agent.Agent` is one object on one thread, but its concerns
are two: what Redis last confirmed and how that reaches the local gate (here), and the
thread, its loop and the decisions of when to call Redis and with what (:mod:`._agent`).
Each is a class in that chain, as the adaptive limit is split (:mod:`anygate._limits.state`).

What. :class:`Settings`; :class:`AgentState`: every field, the constructor (its arguments
are :class:`~anygate.fleet._agent.Agent`'s), one script call and what its reply writes
(the leases held, the limit, the epoch, the rate permits), setting the local gate's
capacity (lowered before a release is sent, raised only after a reply: invariant A1 in
:mod:`._agent`), and the unavailability mode applied while Redis cannot be reached. Not
for use on its own, and not for deciding anything: what to ask Redis for is the agent's.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._gate.budgets import Budgets
from ._permits import Returned, rate_share
from ._ratescript import parse_rate_wire, rate_argv
from ._redis import RATELESS, SPLITLESS, Link

if TYPE_CHECKING:
    from collections.abc import Callable
    from concurrent.futures import Future

    import anyio

    from .._gate.rate import Rate
    from ._local import FleetLocalGate
    from ._permits import FleetBudgets
    from ._redis import Session, SyncReply

__all__ = ["MAX_BACKOFF", "AgentState", "Settings"]

logger = logging.getLogger("anygate.fleet")

#: Seconds between reconnect attempts at most (doubling from 0.05). A survivor of an empty
#: restart returns within this plus a probe and a call: a newcomer's wait (``_scripts``).
MAX_BACKOFF = 1.0


@dataclass(frozen=True)
class Settings:
    """Validated settings of one fleet gate (see :class:`anygate.fleet.FleetGate`)."""

    name: str
    url: str
    capacity: int
    lease_ttl: float
    ticket_ttl: float
    restart_grace: float
    op_timeout: float
    linger: float
    on_unavailable: str
    fallback_capacity: int | None
    backend: str
    cluster: bool
    rate: Rate | None = None
    poll_interval: float = 0.002
    idle_poll_interval: float = 0.05


class AgentState:
    """The fleet agent's fields and the steps that write them (see the module docstring)."""

    #: Queued callers whose token costs one permit request states, at most.
    PERMIT_BATCH = 256

    def __init__(
        self,
        settings: Settings,
        gate: FleetLocalGate,
        on_outage: Callable[[str], None] | None = None,
        budgets: FleetBudgets | None = None,
    ) -> None:
        self.s = settings
        self.gate = gate
        self.budgets = budgets
        self._permit_at = -math.inf
        self.pid = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self.owner_pid = os.getpid()
        self.link = Link(
            settings.url, settings.name, op_timeout=settings.op_timeout, cluster=settings.cluster
        )
        self._on_outage = on_outage
        # What Redis last confirmed; read by other threads for statistics (plain reads of
        # ints are atomic; _lock keeps the multi-field snapshot consistent).
        self._lock = threading.Lock()
        self.held = 0
        self.limit: int | None = None
        self.cap = settings.capacity
        self.epoch: str | None = None
        self.active = 0
        self.grace_left = 0.0
        self.down: str | None = None
        self.calls = 0
        self._synced = False
        self._ticket = False
        self._posted = False
        self._hinted = False
        self._busy_at = -math.inf
        self._valid_until = -math.inf
        self._heartbeat_at = -math.inf
        self._renew_at = -math.inf
        self._backoff = 0.05
        self._cap_requests: list[tuple[int, Future[None]]] = []
        self._rate_requests: list[tuple[str, Future[None]]] = []  # rate_wire, applied
        self.rate_version = 0  # the live fleet rate's version adopted last (0: none)
        self._hold_to = -math.inf  # monotonic: a hold of the fleet's budgets to send
        # The loop's thread-safe scheduling call, set once the thread runs.
        self._call_soon: Callable[[Callable[[], object]], object] | None = None
        self._event: anyio.Event | None = None
        self._kicked = False
        self._closing = False
        self._started = threading.Event()
        self._retried = False  # the one reconnect after a drop was spent (reset by a reply)
        self._relimit = False  # the local limit must be set again, changed or not
        self._down_at = 0.0
        self._thread: threading.Thread | None = None

    @staticmethod
    def _allowed(held: int, limit: int | None) -> int:
        return held if limit is None else min(held, limit)

    def _set_local(self, capacity: int) -> None:
        # After a lapse (A2) the capacity may be unchanged yet callers wait: set it anyway,
        # which admits from the head of the queue.
        if self.gate.capacity != capacity or self._relimit:
            self._relimit = False
            self.gate.capacity = capacity

    async def _call(
        self,
        session: Session,
        *,
        keep: int | None = None,
        demand: int = 0,
        wantmax: int = 0,
        want: int | None = None,
        op: str = "sync",
        cap: int | None = None,
        live: str = "",
    ) -> SyncReply:
        if keep is None:  # a capacity or rate change: restate what we hold, change nothing else
            keep = min(self.held, max(self.gate.in_flight, int(self.gate.capacity)))
            demand = self.gate.in_flight + self.gate.waiting
            wantmax = keep
        if want is None:
            want = wantmax
        rate, split = self._rate_args(op)
        started = time.monotonic()
        self.calls += 1
        logger.debug(
            "fleet %r %s: %s keep=%s demand=%s wantmax=%s",
            self.s.name,
            self.pid,
            op,
            keep,
            demand,
            wantmax,
        )
        reply = await session.call(
            self.pid,
            keep=keep,
            demand=demand,
            wantmax=wantmax,
            want=want,
            cap=self.cap if cap is None else cap,
            lease_ms=int(self.s.lease_ttl * 1000),
            ticket_ms=int(self.s.ticket_ttl * 1000),
            grace_ms=int(self.s.restart_grace * 1000),
            newcomer_ms=int((MAX_BACKOFF + 2 * self.s.op_timeout) * 1000),
            epoch=self.epoch,
            op=op,
            rate=rate,
            split=split,
            live=live,
            rate_version=self.rate_version,
        )
        logger.debug(
            "fleet %r %s: -> held=%s limit=%s used=%s",
            self.s.name,
            self.pid,
            reply.held,
            reply.limit,
            reply.used,
        )
        with self._lock:
            self.held = reply.held
            self.limit = reply.limit
            self.cap = reply.cap
            self.epoch = reply.epoch
            self.active = reply.active
            self.grace_left = reply.grace_left
            was_down, self.down = self.down, None
        self._synced = True
        self._ticket = want > reply.held
        self._posted = demand > reply.held
        self._valid_until = started + self.s.lease_ttl
        gate = self.gate
        if time.monotonic() >= gate._lease_until:
            self._relimit = True  # the limit read 0 (A2): admit from the head again
        gate._lease_until = self._valid_until
        self._heartbeat_at = started + self.s.lease_ttl / 3
        self._renew_at = started + self.s.ticket_ttl / 3
        self._backoff = 0.05
        self._retried = False
        if was_down is not None:
            self._hinted = True  # look again at once: local state moved during the outage
            logger.info(
                "fleet gate %r: Redis at %s answers again after %.1fs",
                self.s.name,
                self.link.where(),
                time.monotonic() - self._down_at,
            )
        if reply.rate_version != self.rate_version:
            self._adopt_rate(reply.rate_version, reply.live_rate)
        budgets = self.budgets
        if budgets is not None:
            wait = reply.permit_wait
            self._permit_at = -math.inf if wait is None else started + wait
            with self.gate._lock:
                budgets.down = False
                budgets.fallback = None
            next_at = -math.inf if wait is None else time.monotonic() + wait
            inputs, outputs = reply.permit_inputs, reply.permit_outputs
            self.gate._refill(budgets, reply.permits, reply.permit_tokens, next_at, inputs, outputs)
        return reply

    def _adopt_rate(self, version: int, wire: str) -> None:
        """Redis holds another live fleet rate than this process adopted last: adopt it
        (``wire``), or keep the rate adopted last when Redis holds none any more (it lost
        its data; ``wire`` is empty)."""
        self.rate_version = version
        budgets = self.budgets
        if not wire or budgets is None:
            return
        try:
            rate = parse_rate_wire(wire)
        except (TypeError, ValueError) as exc:
            logger.warning(
                "fleet gate %r: a live rate this process cannot read: %s", self.s.name, exc
            )
            return
        if rate.split != budgets.split:
            # Another process's shape (its rate= differs from ours): the script charges
            # this one the budgets it has; its own estimates stay as they were.
            logger.warning(
                "fleet gate %r: the fleet's rate %r is %s split input/output budgets, "
                "unlike this process's rate=; give every process the same budgets",
                self.s.name,
                rate,
                "with" if rate.split else "without",
            )
            return
        if rate != budgets.rate:
            logger.info("fleet gate %r: the fleet's rate is now %r", self.s.name, rate)
        self.gate._adopt_rate(budgets, rate)

    def _rate_args(self, op: str) -> tuple[tuple[object, ...], tuple[object, ...]]:
        """The script's rate and split-budget arguments (ARGV 14-24, 26-33); a sync (or
        leave) gives the unused permits back."""
        budgets = self.budgets
        if budgets is None:
            return RATELESS, SPLITLESS
        rate = budgets.rate  # the live fleet rate once one was adopted
        if op not in ("sync", "leave"):
            return rate_argv(rate, self.gate.in_flight, [], [], Returned(), split=budgets.split)
        most = self.PERMIT_BATCH if op == "sync" else 0
        in_flight, costs, outs, returned = self.gate._rate_demand(budgets, most)
        return rate_argv(rate, in_flight, costs, outs, returned, split=budgets.split)

    def _went_down(self, cause: str) -> None:
        with self._lock:
            first = self.down is None
            self.down = cause
        # One line per state change, not per retry (each backoff step would repeat it).
        if first:
            self._down_at = time.monotonic()
            logger.warning(
                "fleet gate %r: cannot reach Redis at %s: %s; failing %s",
                self.s.name,
                self.link.where(),
                cause,
                self.s.on_unavailable,
            )
        else:
            logger.debug("fleet %r %s: still down: %s", self.s.name, self.pid, cause)
        self._synced = False
        self._apply_outage_mode()
        if first and self._on_outage is not None and self.s.on_unavailable == "closed":
            self._on_outage(cause)

    def _apply_outage_mode(self) -> None:
        if self.down is None:
            return
        budgets = self.budgets
        if budgets is not None:
            rate = budgets.rate
            with self.gate._lock:
                if self.s.on_unavailable == "closed":
                    budgets.down = True
                elif budgets.fallback is None:
                    # Open: pace to this process's share of the fleet rate, locally.
                    budgets.fallback = Budgets(rate_share(rate, self.active), self.gate._clock())
        if self.s.on_unavailable == "open":
            if self.gate._lease_until != math.inf:
                # Failing open admits without leases: their lapse no longer gates (A2).
                self.gate._lease_until = math.inf
                self._relimit = True
            self._set_local(self.fallback())
        elif time.monotonic() >= self._valid_until:
            # Closed: our leases may have lapsed on Redis and been granted elsewhere.
            self._set_local(0)

    def fallback(self) -> int:
        """The local cap while Redis is unreachable in ``open`` mode."""
        if self.s.fallback_capacity is not None:
            return self.s.fallback_capacity
        return self.cap // max(self.active, 1)
