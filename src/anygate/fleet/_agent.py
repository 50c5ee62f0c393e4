"""The per-process agent: one thread with its own event loop, holding the fleet's leases.

Callers never talk to Redis. They queue on an ordinary local :class:`anygate.Gate` whose
capacity the agent keeps at (at most) the number of fleet leases this process holds, so
every local guarantee (FIFO, cancellation safety, tokens any thread may release) holds as
is. The agent:

* asks Redis for more leases when local callers wait (one script call for a batch),
* gives leases back when they are idle (after ``linger``) or when this process holds more
  than its fair share while another process is short,
* renews all its leases in one call per heartbeat, and re-asserts them after Redis lost
  them (restart) — the same call,
* waits for wake-up hints on one blocking connection,
* and, when Redis cannot be reached, applies the configured unavailability mode.

Why a thread of its own: the leases must be renewed even while every user event loop is
busy or blocked, and one agent then serves asyncio loops, trio runs and plain threads of
the process alike.

Invariant (A1): the local gate's capacity never exceeds the leases Redis has confirmed.
It is lowered *before* a release is sent, and raised only *after* a reply.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio

from .._gate.budgets import Budgets
from ._permits import Returned, rate_share
from ._ratescript import rate_argv
from ._redis import RATELESS, SPLITLESS, Link, LinkDown

if TYPE_CHECKING:
    from collections.abc import Callable
    from concurrent.futures import Future

    from .._gate.rate import Rate
    from ._local import FleetLocalGate
    from ._permits import FleetBudgets
    from ._redis import Session, SyncReply

__all__ = ["Agent", "Settings"]

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


class Agent:
    """The fleet's per-process agent (see the module docstring)."""

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

    # ------------------------------------------------------------------ other threads

    def start(self) -> None:
        """Start the agent thread (idempotent)."""
        if self._thread is not None:
            return
        thread = threading.Thread(
            target=self._run, name=f"anygate-fleet-{self.s.name}", daemon=True
        )
        self._thread = thread
        thread.start()
        self._started.wait(5.0)

    def kick(self) -> None:
        """Ask the agent to look at the local gate now (cheap; coalesced; any thread)."""
        if self._kicked or self._call_soon is None:
            return
        self._kicked = True
        try:
            self._call_soon(self._on_kick)
        except RuntimeError:  # the agent's loop has ended (closed)
            self._kicked = False

    def request_capacity(self, capacity: int, future: Future[None]) -> None:
        """Queue a fleet capacity change; ``future`` resolves once Redis applied it."""
        self._cap_requests.append((capacity, future))
        self.kick()

    def close(self, timeout: float) -> None:
        """Stop: give back idle leases, stop renewing (in-use ones lapse with the TTL)."""
        self._closing = True
        self._kicked = False
        self.kick()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "held": self.held,
                "limit": self.limit,
                "fleet_capacity": self.cap,
                "epoch": self.epoch,
                "processes": self.active,
                "grace_left": self.grace_left,
                "unavailable": self.down,
                "redis_calls": self.calls,
            }

    # ------------------------------------------------------------------ agent thread

    def _on_kick(self) -> None:
        self._kicked = False
        if self._event is not None:
            self._event.set()

    def _run(self) -> None:
        try:
            anyio.run(self._main, backend=self.s.backend)
        finally:
            self._call_soon = None
            self._started.set()

    async def _main(self) -> None:
        self._event = anyio.Event()
        if self.s.backend == "trio":
            import trio

            self._call_soon = trio.lowlevel.current_trio_token().run_sync_soon
        else:
            import asyncio

            self._call_soon = asyncio.get_running_loop().call_soon_threadsafe
        self._started.set()
        while True:
            try:
                if self.down is not None:
                    await self.link.probe()
                async with self.link.session() as session:
                    await self._serve(session)
                return  # closing
            except LinkDown as exc:
                if self.down is None and not exc.deadline and not self._retried:
                    # A dropped connection (CLIENT KILL, a proxy or failover) usually takes
                    # milliseconds to re-open: one reconnect at once, under the call's own
                    # deadline, before queued callers are failed (issue 27: one CLIENT KILL
                    # failed ~280 of them). A deadline already cost op_timeout: no retry.
                    self._retried = True
                    self._synced = False
                    logger.debug("fleet %r %s: reconnecting: %s", self.s.name, self.pid, exc.cause)
                    continue
                self._went_down(exc.cause)
            except Exception as exc:  # never let the agent die: that would freeze the gate
                logger.exception("fleet gate %r: agent error", self.s.name)
                self._went_down(f"{type(exc).__name__}: {exc}")
            if self._closing:
                return
            await self._pause(self._backoff)
            self._backoff = min(self._backoff * 2, MAX_BACKOFF)

    async def _pause(self, seconds: float) -> None:
        """Sleep ``seconds`` (a kick or close ends it early), applying the outage mode."""
        deadline = time.monotonic() + seconds
        while not self._closing and time.monotonic() < deadline:
            self._apply_outage_mode()
            await self._wait(min(deadline - time.monotonic(), self.s.idle_poll_interval))

    async def _wait(self, seconds: float) -> None:
        event = self._event
        assert event is not None
        with anyio.move_on_after(max(seconds, 0.0)):
            await event.wait()
        self._event = anyio.Event()  # before looking: a kick from now on is not lost

    async def _serve(self, session: Session) -> None:
        failure: list[LinkDown] = []

        async def listen(scope: anyio.CancelScope) -> None:
            wait = max(0.2, min(2.0, self.s.lease_ttl / 3))
            try:
                while True:
                    if await session.wait_hint(self.pid, wait):
                        self._hinted = True
                        if self._event is not None:
                            self._event.set()
            except LinkDown as exc:
                failure.append(exc)
                scope.cancel()

        async with anyio.create_task_group() as tg:
            tg.start_soon(listen, tg.cancel_scope)
            try:
                await self._drive(session)
            except LinkDown as exc:
                failure.append(exc)
            tg.cancel_scope.cancel()
        if failure:
            raise failure[0]

    async def _drive(self, session: Session) -> None:
        first = True
        while True:
            if not first:
                await self._wait(self._next_wait())
            first = False
            if self._closing:
                await self._leave(session)
                return
            await self._cycle(session)

    def _next_wait(self) -> float:
        gate = self.gate
        moving = gate.waiting or self.limit is not None or self._hinted or self._cap_requests
        budgets = self.budgets
        if budgets is not None and (budgets.settled() or budgets.permits):
            moving = True
        return self.s.poll_interval if moving else self.s.idle_poll_interval

    async def _cycle(self, session: Session) -> None:
        while self._cap_requests:
            capacity, future = self._cap_requests[0]
            try:
                reply = await self._call(session, op="cap", cap=capacity)
            except LinkDown as exc:
                if not future.done():
                    cause = f"cannot reach Redis at {self.link.where()}: {exc.cause}"
                    future.set_exception(ConnectionError(cause))
                self._cap_requests.pop(0)
                raise
            self._cap_requests.pop(0)
            if not future.done():
                future.set_result(None)
            self._set_local(self._allowed(reply.held, reply.limit))
        plan = self._plan(time.monotonic())
        if plan is not None:
            keep, demand, wantmax, want = plan
            reply = await self._call(session, keep=keep, demand=demand, wantmax=wantmax, want=want)
            self._set_local(self._allowed(reply.held, reply.limit))

    @staticmethod
    def _allowed(held: int, limit: int | None) -> int:
        return held if limit is None else min(held, limit)

    def _set_local(self, capacity: int) -> None:
        # After a lapse (A2) the capacity may be unchanged yet callers wait: set it anyway,
        # which admits from the head of the queue.
        if self.gate.capacity != capacity or self._relimit:
            self._relimit = False
            self.gate.capacity = capacity

    def _plan(self, now: float) -> tuple[int, int, int, int] | None:
        """Decide what to tell Redis, lowering the local capacity first (A1)."""
        gate = self.gate
        held, limit = self.held, self.limit
        demand = gate.in_flight + gate.waiting
        if demand >= held:
            self._busy_at = now
        bound = math.inf if limit is None else limit
        linger = limit is None and now - self._busy_at < self.s.linger
        want = max(demand, held if linger else 0)
        wantmax = int(min(bound, want))
        target = min(held, wantmax)
        self._set_local(target)
        keep = max(gate.in_flight, target)
        due = not self._synced or self._hinted or keep < held
        if demand > held and (not self._posted or now >= self._renew_at):
            # Post (and keep renewing) our unmet demand even while our share caps what we
            # may hold: shares are computed from posted demands, so a process that
            # stayed silent at its share of 0 would never be given a larger one.
            due = True
        if self._ticket and want <= held:
            due = True  # withdraw the ticket: nobody here waits any more
        budgets = self.budgets
        if budgets is not None:
            if budgets.wanted and gate.waiting and (now >= self._permit_at or budgets.retry):
                due = True  # callers wait for fleet rate permits
            if budgets.settled() or (budgets.permits and not gate.waiting):
                due = True  # settled tokens, or unused permits, go back to the fleet
        if now >= self._heartbeat_at and (held > 0 or self._ticket):
            due = True
        if not due:
            return None
        self._hinted = False
        return keep, demand, wantmax, want

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
    ) -> SyncReply:
        if keep is None:  # a capacity change: restate what we hold, change nothing else
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

    def _rate_args(self, op: str) -> tuple[tuple[object, ...], tuple[object, ...]]:
        """The script's rate and split-budget arguments (ARGV 14-24, 26-33); a sync (or
        leave) gives the unused permits back."""
        budgets, rate = self.budgets, self.s.rate
        if budgets is None or rate is None:
            return RATELESS, SPLITLESS
        if op not in ("sync", "leave"):
            return rate_argv(rate, self.gate.in_flight, [], [], Returned(), split=budgets.split)
        most = self.PERMIT_BATCH if op == "sync" else 0
        in_flight, costs, outs, returned = self.gate._rate_demand(budgets, most)
        return rate_argv(rate, in_flight, costs, outs, returned, split=budgets.split)

    async def _leave(self, session: Session) -> None:
        """Closing: stop admitting, give back every lease that is not in use."""
        self._set_local(0)
        in_use = self.gate.in_flight
        with anyio.CancelScope(shield=True):
            with contextlib.suppress(LinkDown):  # else the TTL returns them
                op = "leave" if in_use == 0 else "sync"
                await self._call(session, keep=in_use, demand=in_use, wantmax=in_use, op=op)

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
        budgets, rate = self.budgets, self.s.rate
        if budgets is not None and rate is not None:
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
