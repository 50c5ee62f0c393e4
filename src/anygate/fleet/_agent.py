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

Here: the thread, its loop and the decisions (when to call Redis, with what). The agent's
fields and the steps that write them (one script call and its reply, the local capacity,
the unavailability mode) are :class:`~._agent_state.AgentState`'s, which :class:`Agent`
extends.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import anyio

from ._agent_state import MAX_BACKOFF, AgentState, Settings
from ._ratescript import rate_wire
from ._redis import LinkDown

if TYPE_CHECKING:
    from .._gate.rate import Rate
    from ._redis import Session

__all__ = ["Agent", "Settings"]

logger = logging.getLogger("anygate.fleet")


class Agent(AgentState):
    """The fleet's per-process agent (see the module docstring)."""

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

    def request_rate(self, wire: str, future: Future[None]) -> None:
        """Queue a live fleet rate (``_ratescript.rate_wire``); ``future`` resolves once
        Redis applied it (and this process adopted it)."""
        self._rate_requests.append((wire, future))
        self.kick()

    def share_rate(self, rate: Rate) -> bool:
        """A rate learned from a provider's headers: the fleet's live rate, as
        ``FleetGate.set_rate`` but not waited for. ``False`` without a fleet rate, when
        it is the fleet's rate already (or on its way), or of another shape."""
        budgets = self.budgets
        if budgets is None or rate == budgets.rate or rate.split != budgets.split:
            return False
        wire = rate_wire(rate)
        if any(queued == wire for queued, _ in self._rate_requests):
            return False
        self.request_rate(wire, Future())
        return True

    def request_hold(self, seconds: float) -> bool:
        """A provider said its bucket is drained for ``seconds``: hold the fleet's rate
        budgets until then (sent at the next call; holds queued meanwhile merge into the
        longest). ``False`` without a fleet rate."""
        if self.budgets is None or not seconds > 0:
            return False
        with self._lock:  # callers' threads and the agent's: no hold lost between them
            self._hold_to = max(self._hold_to, time.monotonic() + seconds)
        self.gate._hold_fallback(self.budgets, seconds)  # Redis down, failing open
        self.kick()
        return True

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
        moving = (
            gate.waiting
            or self.limit is not None
            or self._hinted
            or self._cap_requests
            or self._rate_requests
            or self._hold_to != -math.inf
        )
        budgets = self.budgets
        if budgets is not None and (budgets.settled() or budgets.permits):
            moving = True
        return self.s.poll_interval if moving else self.s.idle_poll_interval

    async def _cycle(self, session: Session) -> None:
        await self._changes(session, self._cap_requests, "cap")
        await self._changes(session, self._rate_requests, "rate")
        with self._lock:
            hold_to, self._hold_to = self._hold_to, -math.inf
        if hold_to > (now := time.monotonic()):
            hold_ms = math.ceil((hold_to - now) * 1000)
            try:
                reply = await self._call(session, op="hold", live=str(hold_ms))
            except LinkDown:
                with self._lock:  # sent when Redis answers again, if it still holds then
                    self._hold_to = max(self._hold_to, hold_to)
                raise
            self._set_local(self._allowed(reply.held, reply.limit))
        plan = self._plan(time.monotonic())
        if plan is not None:
            keep, demand, wantmax, want = plan
            reply = await self._call(session, keep=keep, demand=demand, wantmax=wantmax, want=want)
            self._set_local(self._allowed(reply.held, reply.limit))

    async def _changes(
        self, session: Session, requests: list[tuple[Any, Future[None]]], op: str
    ) -> None:
        """Apply the queued fleet-wide changes of one kind (``op``: ``"cap"`` or
        ``"rate"``), one script call each, and resolve their futures."""
        while requests:
            value, future = requests[0]
            try:
                if op == "cap":
                    reply = await self._call(session, op=op, cap=value)
                else:
                    reply = await self._call(session, op=op, live=value)
            except LinkDown as exc:
                if not future.done():
                    cause = f"cannot reach Redis at {self.link.where()}: {exc.cause}"
                    future.set_exception(ConnectionError(cause))
                requests.pop(0)
                raise
            requests.pop(0)
            if not future.done():
                future.set_result(None)
            self._set_local(self._allowed(reply.held, reply.limit))

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

    async def _leave(self, session: Session) -> None:
        """Closing: stop admitting, give back every lease that is not in use."""
        self._set_local(0)
        in_use = self.gate.in_flight
        with anyio.CancelScope(shield=True):
            with contextlib.suppress(LinkDown):  # else the TTL returns them
                op = "leave" if in_use == 0 else "sync"
                await self._call(session, keep=in_use, demand=in_use, wantmax=in_use, op=op)
