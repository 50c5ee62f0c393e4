"""FleetGate: one capacity shared by every process of a fleet, through Redis.

Composition: a fleet gate *has* an ordinary local :class:`anygate.Gate` (``fleet.gate``)
whose capacity a per-process agent keeps equal to the fleet leases this process may use.
Callers get plain :class:`anygate.Token` objects from that local gate, so tokens stay
transferable and idempotent, and :class:`anygate.Policy` or the transports take
``fleet.gate`` unchanged. That local gate (``_local.FleetLocalGate``) wakes the agent when
a caller has to wait and, in ``closed`` mode, turns an outage into
:class:`FleetUnavailable`, so a bare ``fleet.gate`` behaves like the fleet's own
``acquire`` methods, which are the same calls on it. With a fleet rate, its rate budget is
the permit pool of ``_permits``.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import os
import threading
from typing import TYPE_CHECKING, final

import anyio

from .._gate.gate_args import check_rate
from .._validation import check_name, check_redis_url
from ._acquire import _FleetAcquire
from ._agent import Agent, Settings
from ._args import MIN_LEASE_TTL, MIN_OP_TIMEOUT, MIN_TICKET_TTL, choice, count, seconds
from ._errors import FleetUnavailable
from ._local import FleetLocalGate
from ._permits import FleetBudgets
from ._ratescript import rate_wire
from ._statistics import FleetStatistics

if TYPE_CHECKING:
    from types import TracebackType

    from typing_extensions import Self

    from .._gate.acquisition import Acquisition
    from .._gate.gate import Gate
    from .._gate.rate import Rate
    from .._gate.token import Token

__all__ = ["FleetGate"]

_MODES = ("closed", "open")
_BACKENDS = ("asyncio", "trio")


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
            within this time. The heartbeat renews every ``lease_ttl / 3``. At least 0.1.
        ticket_ttl: seconds a waiting process's place in the fleet queue, and a grant it
            has not claimed, lives without renewal (a dead waiter blocks nobody longer).
            At least 0.01, and shorter than ``lease_ttl``.
        restart_grace: seconds after Redis lost its state during which nothing new is
            granted, so that surviving holders re-assert their leases first. Default
            ``lease_ttl``.
        op_timeout: the client-side deadline, in seconds, of every Redis call (at least
            0.001).
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
        rate: a :class:`anygate.Rate` the whole fleet shares: its request and token
            budgets (split input/output budgets included) and its slope bound are kept by
            the script on Redis time, and callers admit on permits it grants (see
            ``docs/fleet.md``). Every process should pass the same rate. ``None`` (the
            default): no fleet rate.

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
        rate: Rate | None = None,
    ) -> None:
        # The shared checks first (issue 28: empty names, and URLs the client would misread).
        check_name("name", name)
        check_redis_url("url", url)
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
        ttl = seconds("lease_ttl", lease_ttl, least=MIN_LEASE_TTL)
        settings = Settings(
            name=name,
            url=url,
            capacity=count("capacity", capacity),
            lease_ttl=ttl,
            ticket_ttl=seconds("ticket_ttl", ticket_ttl, least=MIN_TICKET_TTL),
            restart_grace=ttl
            if restart_grace is None
            else seconds("restart_grace", restart_grace, allow_zero=True),
            op_timeout=seconds("op_timeout", op_timeout, least=MIN_OP_TIMEOUT),
            linger=seconds("linger", linger, allow_zero=True),
            on_unavailable=choice("on_unavailable", on_unavailable, _MODES),
            fallback_capacity=None
            if fallback_capacity is None
            else count("fallback_capacity", fallback_capacity),
            backend=choice("backend", backend, _BACKENDS),
            cluster=bool(cluster),
            rate=check_rate(rate),
        )
        if settings.ticket_ttl >= ttl:
            msg = f"ticket_ttl must be shorter than lease_ttl (got {ticket_ttl!r} >= {lease_ttl!r})"
            raise ValueError(msg)
        import coredis  # noqa: F401  # fail here, not in the agent thread, when it is missing

        self._settings = settings
        self._gate = FleetLocalGate(f"fleet:{name}", self)
        self._budgets: FleetBudgets | None = None
        if settings.rate is not None:
            self._budgets = FleetBudgets(settings.rate)
            self._gate._install(self._budgets)
        self._lock = threading.Lock()
        self._agent: Agent | None = None
        self._closed = False

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
            rate=self.rate,
            rate_version=agent.rate_version,
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
            RuntimeError: the fleet gate was closed.
        """
        future = self._capacity_future(capacity, timeout)
        await anyio.to_thread.run_sync(future.result, timeout, abandon_on_cancel=True)

    def set_capacity_sync(self, capacity: int, *, timeout: float = 5.0) -> None:
        """:meth:`set_capacity` for plain threads (blocks this thread)."""
        self._capacity_future(capacity, timeout).result(timeout)

    def _capacity_future(self, capacity: int, timeout: float) -> concurrent.futures.Future[None]:
        value = count("capacity", capacity)
        seconds("timeout", timeout)
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._changing_agent().request_capacity(value, future)
        return future

    # ------------------------------------------------------------------ rate

    @property
    def rate(self) -> Rate | None:
        """The fleet rate this process paces to: ``rate=``, or the live rate set with
        :meth:`set_rate` (in any process) once this process heard of it; ``None``: no
        fleet rate."""
        budgets = self._budgets
        return None if budgets is None else budgets.rate

    async def set_rate(self, rate: Rate, *, timeout: float = 5.0) -> None:  # noqa: ASYNC109 - as set_capacity
        """Set the fleet rate, for every process, and wait until Redis applied it.

        From that moment Redis charges every permit, in every process, at ``rate``, and
        wakes every process that called it in the last ten minutes to adopt it for its
        own estimates (:attr:`rate`); one idle for longer adopts it at its next call.
        Each budget keeps its level in units (requests or tokens left, or owed), capped
        at what the new budget holds, as a local gate's do when its rate changes: a
        higher rate does not wait out a debt at the old pace, and a lower one does not
        admit a burst. The live rate wins over every process's ``rate=``, also over a
        process started later, until Redis loses its data (then each process keeps the
        rate it adopted; set it again).

        Only the numbers change: the fleet must have been created with a rate, and
        ``rate`` must have split input/output budgets exactly when that one has.

        Raises:
            TypeError, ValueError: bad ``rate`` or ``timeout`` (the message names it).
            ConnectionError: Redis could not be reached.
            TimeoutError: not applied within ``timeout`` seconds.
            RuntimeError: the fleet gate was closed.
        """
        future = self._rate_future(rate, timeout)
        await anyio.to_thread.run_sync(future.result, timeout, abandon_on_cancel=True)

    def set_rate_sync(self, rate: Rate, *, timeout: float = 5.0) -> None:
        """:meth:`set_rate` for plain threads (blocks this thread)."""
        self._rate_future(rate, timeout).result(timeout)

    def _rate_future(self, rate: Rate, timeout: float) -> concurrent.futures.Future[None]:
        value = check_rate(rate)
        budgets = self._budgets
        if value is None:
            msg = "rate must be an anygate.Rate (got None): a fleet rate cannot be removed live"
            raise TypeError(msg)
        if budgets is None:
            msg = (
                f"fleet gate {self.name!r} has no rate to change: create it with "
                f"FleetGate(rate=...) (got rate={value!r})"
            )
            raise ValueError(msg)
        if value.split != budgets.split:
            has = "has" if budgets.split else "has no"
            msg = (
                f"rate must keep the fleet's budgets: fleet gate {self.name!r} {has} split "
                f"input/output token budgets (got {value!r})"
            )
            raise ValueError(msg)
        seconds("timeout", timeout)
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._changing_agent().request_rate(rate_wire(value), future)
        return future

    # ------------------------------------------------------------------ acquiring

    def acquire(
        self,
        *,
        timeout: float | None = None,
        tokens: int | None = None,
        priority: int = 0,
        output_tokens: int | None = None,
    ) -> Acquisition:
        """Wait for a fleet slot: ``await fleet.acquire()`` or ``async with fleet.acquire()``.

        Args:
            timeout, tokens, priority, output_tokens: as for :meth:`anygate.Gate.acquire`;
                ``tokens`` is charged to the fleet's token budget, and with split budgets
                ``output_tokens`` to its output budget and ``tokens - output_tokens`` to
                its input budget (correct them with :meth:`anygate.Token.settle`, which
                reaches the fleet's budgets too).

        Returns:
            An :class:`anygate.Acquisition`: awaited, an :class:`anygate.Token` of
            :attr:`gate`; as an async context manager it yields the token and releases it
            on exit.

        Raises:
            Busy: no slot (or fleet rate permit) within ``timeout``.
            FleetUnavailable: ``closed`` mode and Redis is unreachable (at once, not after
                ``timeout``, for a caller that would have to wait).
            TypeError, ValueError: as for :meth:`anygate.Gate.acquire` (raised here).
        """
        self._ensure_agent()
        inner = self._gate.acquire(
            timeout=timeout, tokens=tokens, priority=priority, output_tokens=output_tokens
        )
        return _FleetAcquire(self, inner)

    def acquire_sync(
        self,
        *,
        timeout: float | None = None,
        tokens: int | None = None,
        priority: int = 0,
        output_tokens: int | None = None,
    ) -> Token:
        """Block this thread for a fleet slot; for plain (non-async) threads.

        Raises:
            Busy, FleetUnavailable: as for :meth:`acquire` (a thread already waiting when
                Redis goes away is woken to get ``FleetUnavailable``).
            RuntimeError: called on a thread running an event loop.
        """
        self._ensure_agent()
        return self._gate.acquire_sync(
            timeout=timeout, tokens=tokens, priority=priority, output_tokens=output_tokens
        )

    def acquire_nowait(
        self, *, tokens: int | None = None, priority: int = 0, output_tokens: int | None = None
    ) -> Token:
        """Take a slot only if this process holds an idle lease; never waits or calls Redis.

        Raises:
            Busy: no idle lease here (or callers are queued, or no rate permit is here);
                :class:`FleetUnavailable` while Redis is unreachable in ``closed`` mode.
        """
        self._ensure_agent()
        return self._gate.acquire_nowait(
            tokens=tokens, priority=priority, output_tokens=output_tokens
        )

    # What the local gate asks of its fleet (``_local.Owner``).

    def _kick(self) -> None:
        agent = self._agent
        if agent is not None:
            agent.kick()

    def _outage(self) -> str | None:
        agent = self._agent
        if agent is None or self._settings.on_unavailable != "closed":
            return None
        return agent.down

    def _unavailable(self, cause: str, waited: float) -> FleetUnavailable:
        agent = self._agent
        where = "Redis" if agent is None else f"Redis at {agent.link.where()}"
        return FleetUnavailable(
            fleet=self.name,
            cause=f"cannot reach {where}: {cause}",
            capacity=self.capacity,
            in_flight=self._gate.in_flight,
            waited=waited,
        )

    def _share_rate(self, rate: Rate) -> bool:
        """Header learning's rate (``_limits.learn``): ``Agent.share_rate``."""
        agent = self._live_agent()
        return agent is not None and agent.share_rate(rate)

    def _hold(self, seconds: float) -> bool:
        """Header learning's hold: ``Agent.request_hold``."""
        agent = self._live_agent()
        return agent is not None and agent.request_hold(seconds)

    def _changing_agent(self) -> Agent:
        """The agent a fleet-wide change goes through; a closed gate says so at once
        (its stopped agent would leave the change to time out)."""
        if self._closed:
            msg = f"fleet gate {self.name!r} is closed"
            raise RuntimeError(msg)
        return self._ensure_agent()

    def _live_agent(self) -> Agent | None:
        """This process's running agent, or ``None`` (not started, closed, or a parent's
        after ``fork``): what learning from an answer may use without raising (a call
        that was in flight when the gate closed still has its answer learned from)."""
        agent = self._agent
        if agent is None or self._closed or agent.owner_pid != os.getpid():
            return None
        return agent

    def _on_outage(self, cause: str) -> None:
        """Agent thread: Redis went away in closed mode; fail the queued callers at once."""
        self._gate._fail_waiters(cause)

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
                agent = Agent(self._settings, self._gate, self._on_outage, self._budgets)
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
