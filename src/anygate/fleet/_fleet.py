"""FleetGate: one capacity shared by every process of a fleet, through Redis.

Composition: a fleet gate *has* an ordinary local :class:`anygate.Gate` (``fleet.gate``)
whose capacity a per-process agent keeps equal to the fleet leases this process may use.
Callers get plain :class:`anygate.Token` objects from that local gate, so tokens stay
transferable and idempotent, and :class:`anygate.Policy` or the transports take
``fleet.gate`` unchanged. The fleet's own ``acquire`` methods add two things to the local
gate's: they wake the agent at once when a caller has to wait (a bare ``fleet.gate`` user is
noticed by the agent's local poll instead, within ``idle_poll_interval``), and in
``closed`` mode they turn an outage into :class:`FleetUnavailable`.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, final

import anyio

from .._errors import Busy
from .._gate import Gate
from .._validation import check_number, show
from ._acquire import _FleetAcquire
from ._agent import Agent, Settings
from ._errors import FleetUnavailable

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import TracebackType

    from typing_extensions import Self

    from .._acquisition import Acquisition
    from .._token import Token

__all__ = ["FleetGate", "FleetStatistics"]

_MODES = ("closed", "open")
_BACKENDS = ("asyncio", "trio")


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


def _seconds(param: str, value: object, *, allow_zero: bool = False) -> float:
    """A finite duration through the project's one number path (huge ints, NaN, bools)."""
    bound = ">= 0" if allow_zero else "> 0"
    seconds = check_number(
        param,
        value,
        minimum=0.0,
        strict=not allow_zero,
        allowed=f"a finite number of seconds {bound}",
    )
    assert seconds is not None  # none=False
    return seconds


def _count(param: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        msg = f"{param} must be an int >= 0 (got {show(value)} of type {type(value).__name__})"
        raise TypeError(msg)
    if value < 0 or value >= 2**53:
        msg = f"{param} must be an int >= 0 and < 2**53 (got {show(value)})"
        raise ValueError(msg)
    return value


def _choice(param: str, value: object, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        msg = f"{param} must be one of {', '.join(map(repr, choices))} (got {value!r})"
        raise ValueError(msg) if isinstance(value, str) else TypeError(msg)
    return value


def _current_call_soon() -> Callable[[Callable[[], object]], object]:
    """The running loop's thread-safe scheduling call (asyncio or trio)."""
    import sniffio

    if sniffio.current_async_library() == "trio":
        import trio

        return trio.lowlevel.current_trio_token().run_sync_soon
    import asyncio

    return asyncio.get_running_loop().call_soon_threadsafe


@final
class FleetGate:
    """At most ``capacity`` slots held at once across every process that uses this name.

    Each process creates its own ``FleetGate`` with the same ``name`` and Redis ``url``;
    together they never hold more than the fleet capacity while Redis answers. Slots are
    leases in Redis with an expiry on Redis time, renewed by one heartbeat per process, so
    a process that dies gives its slots back within ``lease_ttl``. Within a process,
    callers are served first come, first served by an ordinary local :class:`anygate.Gate`
    (:attr:`gate`); between processes the capacity is divided in max-min fair shares and
    granted round robin.

    The agent thread (one per fleet gate per process, holding one Redis connection that
    waits and one for commands) starts on first use, so a gate created before a
    ``fork`` (gunicorn ``--preload``) starts its agent in each worker.

    This is not a rate limiter, and not a lock: a provider cannot check fencing tokens,
    so in the failure modes listed in the docs the fleet can briefly admit more than its
    capacity (see ``docs/fleet.md``); it never hangs or leaks.

    Args:
        name: the fleet gate's name: every process using it shares one capacity. It is
            the Redis Cluster hash tag of all its keys, so it may not contain ``{`` or ``}``.
        capacity: the fleet capacity to set when Redis has none yet (first use, or after
            Redis lost its data). A live capacity set with :meth:`set_capacity` wins.
        url: the Redis URL (``redis://``, ``rediss://``, ``unix://``).
        lease_ttl: seconds a lease lives without renewal; a dead process's slots come back
            within this time. The heartbeat renews every ``lease_ttl / 3``.
        ticket_ttl: seconds a waiting process's place in the fleet queue, and a grant it
            has not claimed, lives without renewal (a dead waiter blocks nobody longer).
        restart_grace: seconds after Redis lost its state during which nothing new is
            granted, so that surviving holders re-assert their leases first. Default
            ``lease_ttl``.
        op_timeout: the client-side deadline, in seconds, of every Redis call.
        linger: seconds an idle lease stays with this process (so the next acquire is
            local) when no other process is short. ``0`` returns leases at once.
        on_unavailable: ``"closed"``: while Redis is unreachable, leases already held are
            used until they could have lapsed, and callers who would wait get
            :class:`FleetUnavailable`. ``"open"``: admit up to ``fallback_capacity``
            locally.
        fallback_capacity: the local cap in ``open`` mode; default: the fleet capacity
            divided by the number of active processes at the last contact.
        backend: the event loop the agent thread runs (``"asyncio"`` or ``"trio"``);
            callers may use any runtime either way.
        cluster: connect with ``coredis.RedisCluster``.

    Raises:
        TypeError, ValueError: a parameter has the wrong type or is out of range; the
            message names it.
        ImportError: coredis is not installed (``pip install anygate[redis]``).
    """

    def __init__(
        self,
        name: str,
        *,
        capacity: int,
        url: str = "redis://127.0.0.1:6379/0",
        lease_ttl: float = 10.0,
        ticket_ttl: float = 2.0,
        restart_grace: float | None = None,
        op_timeout: float = 1.0,
        linger: float = 1.0,
        on_unavailable: str = "closed",
        fallback_capacity: int | None = None,
        backend: str = "asyncio",
        cluster: bool = False,
    ) -> None:
        label: object = name
        if not isinstance(label, str):
            msg = f"name must be a str (got {label!r} of type {type(label).__name__})"
            raise TypeError(msg)
        if not label or "{" in label or "}" in label:
            msg = f"name must be a non-empty str without '{{' or '}}' (got {label!r})"
            raise ValueError(msg)
        where: object = url
        if not isinstance(where, str) or "://" not in where:
            msg = f"url must be a redis://, rediss:// or unix:// URL string (got {url!r})"
            raise TypeError(msg) if not isinstance(where, str) else ValueError(msg)
        ttl = _seconds("lease_ttl", lease_ttl)
        settings = Settings(
            name=name,
            url=url,
            capacity=_count("capacity", capacity),
            lease_ttl=ttl,
            ticket_ttl=_seconds("ticket_ttl", ticket_ttl),
            restart_grace=ttl
            if restart_grace is None
            else _seconds("restart_grace", restart_grace, allow_zero=True),
            op_timeout=_seconds("op_timeout", op_timeout),
            linger=_seconds("linger", linger, allow_zero=True),
            on_unavailable=_choice("on_unavailable", on_unavailable, _MODES),
            fallback_capacity=None
            if fallback_capacity is None
            else _count("fallback_capacity", fallback_capacity),
            backend=_choice("backend", backend, _BACKENDS),
            cluster=bool(cluster),
        )
        if settings.ticket_ttl >= ttl:
            msg = f"ticket_ttl must be shorter than lease_ttl (got {ticket_ttl!r} >= {lease_ttl!r})"
            raise ValueError(msg)
        import coredis  # noqa: F401  # fail here, not in the agent thread, when it is missing

        self._settings = settings
        self._gate = Gate(0, name=f"fleet:{name}")
        self._lock = threading.Lock()
        self._agent: Agent | None = None
        self._closed = False
        # Async waiters to fail at once when Redis goes away in closed mode.
        self._waiters: dict[
            int, tuple[anyio.CancelScope, Callable[[Callable[[], object]], object]]
        ] = {}

    # ------------------------------------------------------------------ introspection

    @property
    def name(self) -> str:
        """The fleet gate's name."""
        return self._settings.name

    @property
    def gate(self) -> Gate:
        """The local gate this process's callers queue on; pass it to Policy or transports.

        Its capacity belongs to the fleet's agent: do not set it (nor enable adaptive
        concurrency on it), or the agent and you will fight over it.
        """
        self._ensure_agent()
        return self._gate

    @property
    def capacity(self) -> int:
        """The fleet capacity as last read from Redis (change it with :meth:`set_capacity`)."""
        agent = self._agent
        return self._settings.capacity if agent is None else agent.cap

    def statistics(self) -> FleetStatistics:
        """This process's view of the fleet gate."""
        agent = self._ensure_agent()
        snap = agent.snapshot()
        gate = self._gate
        return FleetStatistics(
            name=self.name,
            fleet_capacity=snap["fleet_capacity"],
            held=snap["held"],
            limit=snap["limit"],
            local_capacity=gate.capacity,
            in_flight=gate.in_flight,
            waiting=gate.waiting,
            processes=snap["processes"],
            unavailable=snap["unavailable"],
            on_unavailable=self._settings.on_unavailable,
            grace_left=snap["grace_left"],
            redis_calls=snap["redis_calls"],
        )

    def __repr__(self) -> str:
        agent = self._agent
        held = 0 if agent is None else agent.held
        gate = self._gate
        return (
            f"<anygate.fleet.FleetGate {self.name!r} capacity {self.capacity}, holding {held}, "
            f"{gate.in_flight} in flight, {gate.waiting} waiting here>"
        )

    # ------------------------------------------------------------------ capacity

    async def set_capacity(self, capacity: int, *, timeout: float = 5.0) -> None:  # noqa: ASYNC109 - the wait happens in the agent thread, not under a cancel scope here
        """Set the fleet-wide capacity, for every process, and wait until Redis applied it.

        Raising it grants queued processes at once; lowering it revokes nothing (holders
        finish; processes over their new share shed as their slots free up).

        Raises:
            TypeError, ValueError: bad ``capacity`` or ``timeout``.
            ConnectionError: Redis could not be reached.
            TimeoutError: not applied within ``timeout`` seconds.
        """
        future = self._capacity_future(capacity, timeout)
        await anyio.to_thread.run_sync(future.result, timeout, abandon_on_cancel=True)

    def set_capacity_sync(self, capacity: int, *, timeout: float = 5.0) -> None:
        """:meth:`set_capacity` for plain threads (blocks this thread)."""
        self._capacity_future(capacity, timeout).result(timeout)

    def _capacity_future(self, capacity: int, timeout: float) -> concurrent.futures.Future[None]:
        value = _count("capacity", capacity)
        _seconds("timeout", timeout)
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._ensure_agent().request_capacity(value, future)
        return future

    # ------------------------------------------------------------------ acquiring

    def acquire(self, *, timeout: float | None = None) -> Acquisition:
        """Wait for a fleet slot: ``await fleet.acquire()`` or ``async with fleet.acquire()``.

        Args:
            timeout: seconds to wait at most (``None``: no limit), as for
                :meth:`anygate.Gate.acquire`.

        Returns:
            An :class:`anygate.Acquisition`: awaited, an :class:`anygate.Token` of
            :attr:`gate`; as an async context manager it yields the token and releases it
            on exit.

        Raises:
            Busy: no slot within ``timeout``.
            FleetUnavailable: ``closed`` mode and Redis is unreachable (at once, not after
                ``timeout``, for a caller that would have to wait).
        """
        return _FleetAcquire(self, timeout)

    def acquire_sync(self, *, timeout: float | None = None) -> Token:
        """Block this thread for a fleet slot; for plain (non-async) threads.

        A thread that is already waiting when Redis goes away learns it at its
        ``timeout`` (a blocked thread cannot be interrupted from outside); one that arrives
        during the outage gets :class:`FleetUnavailable` at once.

        Raises:
            Busy, FleetUnavailable: as for :meth:`acquire`.
            RuntimeError: called on a thread running an event loop.
        """
        agent = self._ensure_agent()
        gate = self._gate
        if gate.waiting or gate.in_flight >= gate.capacity:
            self._refuse_if_down(agent, 0.0)
            agent.kick()
        try:
            return gate.acquire_sync(timeout=timeout)
        except Busy as exc:
            self._refuse_if_down(agent, timeout or 0.0, exc)
            raise

    def acquire_nowait(self) -> Token:
        """Take a slot only if this process holds an idle lease; never waits or calls Redis.

        Raises:
            Busy: no idle lease here (or callers are queued).
        """
        agent = self._ensure_agent()
        try:
            return self._gate.acquire_nowait()
        except Busy as exc:
            self._refuse_if_down(agent, 0.0, exc)
            raise

    async def _acquire(self, wait_s: float | None) -> Token:
        agent = self._ensure_agent()
        gate = self._gate
        if not (gate.waiting or gate.in_flight >= gate.capacity):
            return await gate.acquire(timeout=wait_s)
        self._refuse_if_down(agent, 0.0)
        agent.kick()
        scope = anyio.CancelScope()
        key = id(scope)
        closed = self._settings.on_unavailable == "closed"
        if closed:
            with self._lock:
                self._waiters[key] = (scope, _current_call_soon())
        try:
            with scope:
                return await gate.acquire(timeout=wait_s)
        except Busy as exc:
            self._refuse_if_down(agent, wait_s or 0.0, exc)
            raise
        finally:
            if closed:
                with self._lock:
                    self._waiters.pop(key, None)
        # Only our own outage cancellation lands here (an outer cancel propagates): the
        # local gate already passed on any slot reserved for us.
        raise self._unavailable(agent.down or "Redis unreachable", 0.0)

    def _refuse_if_down(
        self, agent: Agent, waited: float, exc: BaseException | None = None
    ) -> None:
        cause = agent.down
        if cause is not None and self._settings.on_unavailable == "closed":
            raise self._unavailable(cause, waited) from exc

    def _unavailable(self, cause: str, waited: float) -> FleetUnavailable:
        agent = self._agent
        where = "Redis" if agent is None else f"Redis at {agent.link.where()}"
        return FleetUnavailable(
            fleet=self.name,
            cause=f"{where}: {cause}",
            capacity=self.capacity,
            in_flight=self._gate.in_flight,
            waited=waited,
        )

    def _on_outage(self, cause: str) -> None:
        """Agent thread: Redis went away in closed mode; fail the parked async callers."""
        with self._lock:
            waiters = list(self._waiters.values())
        for scope, call_soon in waiters:
            # RuntimeError: that loop has ended, and its caller with it.
            with contextlib.suppress(RuntimeError):
                call_soon(scope.cancel)

    def _released(self) -> None:
        agent = self._agent
        if agent is not None and agent.limit is not None:
            agent.kick()  # shedding toward a fair share: return the lease now, not at the poll

    # ------------------------------------------------------------------ lifecycle

    def _ensure_agent(self) -> Agent:
        agent = self._agent
        if agent is not None and agent.owner_pid == os.getpid():
            return agent
        with self._lock:
            if self._closed:
                msg = f"fleet gate {self.name!r} is closed"
                raise RuntimeError(msg)
            agent = self._agent
            if agent is not None and agent.owner_pid != os.getpid():
                msg = (
                    f"fleet gate {self.name!r} was started in process {agent.owner_pid} and "
                    "used after fork(); create fleet gates in each worker (or before the "
                    "first acquire)"
                )
                raise RuntimeError(msg)
            if agent is None:
                agent = Agent(self._settings, self._gate, self._on_outage)
                agent.start()
                atexit.register(self.close, 1.0)
                self._agent = agent
            return agent

    def close(self, timeout: float = 5.0) -> None:
        """Stop this process's agent: give back idle leases; stop admitting here.

        Leases still in use are not released early (their holders are running); they
        lapse after ``lease_ttl``. Idempotent.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            agent = self._agent
        atexit.unregister(self.close)
        if agent is not None and agent.owner_pid == os.getpid():
            agent.close(timeout)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        self.close()
