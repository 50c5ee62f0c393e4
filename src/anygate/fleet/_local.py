"""The fleet's local gate: an :class:`anygate.Gate` that knows its fleet.

``fleet.gate`` is what :class:`anygate.Policy` and the transports take, so it must behave
like the fleet itself even when used bare (without :meth:`FleetGate.acquire`):

* a caller that has to wait wakes the agent at once (no poll of the gate's counters),
* in ``closed`` mode while Redis is unreachable, a caller that would wait gets
  :class:`FleetUnavailable` at once, and callers already queued are woken and get it too
  (a ``timeout=None`` caller would otherwise wait for Redis for ever),
* its refusals are :class:`FleetUnavailable` while the fleet is down, naming the cause,
* and it admits nobody on a lease that may have lapsed on Redis (A2 below).

It subclasses the ``@final`` :class:`anygate.Gate` on purpose, privately: every guarantee
of the gate (FIFO, cancellation, tokens) is inherited unchanged, and the three overrides
touch only the paths a caller takes when it cannot be admitted at once (never the
uncontended fast path). Its rate budget, when the fleet has a rate, is the permit pool of
``_permits``, installed by the fleet gate.
"""

from __future__ import annotations

import math
from time import monotonic
from typing import TYPE_CHECKING, Protocol

from .._gate.gate import Gate
from .._gate.gate_args import max_cost
from .._gate.ledger import Ledger
from .._gate.waiters import GONE, WAITING, waiter_out
from .._limits.learn_from import raise_ceiling

if TYPE_CHECKING:
    from .._errors import Busy
    from .._gate.rate import Rate
    from .._gate.waiters import Waiter
    from ._permits import FleetBudgets, Returned

__all__ = ["FleetLocalGate", "Owner"]

# The ledger's own storage of the int limit (a slot), which the property below wraps.
_LIMIT = Ledger.__dict__["_limit"]


class Owner(Protocol):
    """What the local gate asks its fleet gate."""

    def _kick(self) -> None: ...

    def _outage(self) -> str | None: ...

    def _unavailable(self, cause: str, waited: float) -> Busy: ...

    def _share_rate(self, rate: Rate) -> bool: ...

    def _hold(self, seconds: float) -> bool: ...


class FleetLocalGate(Gate):  # type: ignore[misc]  # private: see the module docstring
    """``fleet.gate``: a Gate whose capacity (and rate budget) the fleet's agent owns."""

    __slots__ = ("_failed_by", "_lease_until", "_owner")

    # The fleet's rate: no budget of its own to mark, lower or keep estimates in; header
    # learning's rate and holds go to the fleet (_learned_rate, _hold_until below).
    _shares_rate = True

    def __init__(self, name: str, owner: Owner) -> None:
        # Monotonic time until which the leases behind the capacity surely live on Redis
        # (the agent's last reply plus lease_ttl; inf while failing open): see _limit.
        self._lease_until = -math.inf
        self._failed_by: str | None = None  # the cause of the last outage that failed waiters
        super().__init__(0, name=name)
        self._owner = owner

    # Invariant (A2): nobody is admitted here, nor handed a released slot, once the
    # leases may have lapsed on Redis, though the agent could not yet lower the capacity.
    # A process resumed after SIGSTOP (or a long stall) longer than lease_ttl runs its
    # callers' threads before its agent's resync, and Redis may have granted the lapsed
    # leases elsewhere (issue 27). Every admission decision of the ledger (its fast path,
    # the inlined one in Token, a release's hand-off, a raise's admissions) compares with
    # _limit, so the limit reads 0 from the lease's end until the agent's next reply.
    # Rejected: a check in _admit only (the async fast path inlines it; hand-offs skip it),
    # and lowering the capacity from a timer (the timer's thread stops with the process).

    @property  # the slot's value, gated by the lease's end
    def _limit(self) -> int:
        if monotonic() < self._lease_until:
            value: int = _LIMIT.__get__(self, Ledger)
            return value
        return 0

    @_limit.setter
    def _limit(self, value: int) -> None:
        _LIMIT.__set__(self, value)

    def _enqueue(self, waiter: Waiter, limit_s: float | None = None) -> bool:
        owner = self._owner
        cause = owner._outage()
        if cause is not None:
            waiter.state = GONE  # never queued: the caller raises our _busy at once
            return False
        admitted = super()._enqueue(waiter, limit_s)
        if not admitted and waiter.state == WAITING:
            if owner._outage() is not None:
                # The outage began while we queued, maybe after _fail_waiters looked: leave
                # now (a wake from this very thread would reach trio before we park).
                # Withdrawing fails only if a slot was granted meanwhile: then it is ours,
                # and the caller parks as usual to take the wake-up already sent to it.
                self._withdraw(waiter)
                return False
            owner._kick()
        return admitted

    def _busy(
        self,
        waited: float,
        *,
        rejected: bool = False,
        timed_out: bool = False,
        due: float | None = None,
    ) -> Busy:
        cause = self._owner._outage()
        if cause is None and due == math.inf and timed_out:
            # A waiter withdrawn by _fail_waiters wakes with no deadline of its own (due
            # inf); if Redis answered again before it woke, it must still learn why it was
            # turned away, not "its rate budget admits this call in inf s".
            cause = self._failed_by
        if cause is None:
            return super()._busy(waited, rejected=rejected, timed_out=timed_out, due=due)
        self._count_refusal(rejected=rejected, timed_out=timed_out)
        return self._owner._unavailable(cause, waited)

    def _set_rate(self, rate: Rate | None) -> None:
        msg = (
            f"the rate of fleet gate {self.name!r}'s local gate belongs to the fleet: pass "
            "rate= to FleetGate, or change it for every process with FleetGate.set_rate"
        )
        raise AttributeError(msg)

    def _learned_rate(self, rate: Rate) -> bool:
        """Header learning's rate: the fleet's live rate (``FleetGate._share_rate``)."""
        return self._owner._share_rate(rate)

    def _hold_until(self, at: float) -> bool:
        """Header learning's hold (a provider said its bucket is drained until ``at``):
        the fleet's, for every process (``FleetGate._hold``); ``False`` without a fleet
        rate or a readable clock."""
        now = self._read_clock()
        return now is not None and self._owner._hold(at - now)

    def _hold_fallback(self, budgets: FleetBudgets, seconds: float) -> None:
        """A hold while Redis is down and the gate fails open: the local share of the rate
        (``FleetBudgets.fallback``) is held too, not only the fleet's budgets once Redis
        answers again (this process would go on admitting into the provider's 429s)."""
        with self._lock:
            fallback, now = budgets.fallback, self._read_clock()
            if fallback is not None and now is not None:
                if not fallback.started:
                    fallback._start(now)
                fallback.hold_until(now + seconds)

    def _adopt_rate(self, budgets: FleetBudgets, rate: Rate) -> None:
        """The agent's thread: the fleet's live rate changed (``FleetGate.set_rate`` in
        some process). The pool's estimates and the largest cost one caller may state
        follow it; the permits here stay (Redis charged them). Who can go is admitted at
        the refill that follows in the same reply."""
        with self._lock:
            budgets.rate = rate
            budgets.max_tokens = max_cost(rate)
        raise_ceiling(self, rate)  # a user's raise is not learned back down

    def _fail_waiters(self, cause: str) -> None:
        """Redis went away (closed mode): wake every queued caller to fail at once.

        Each is withdrawn (lazy deletion, as a timeout does) and woken; its own wait loop
        then sees it is gone and raises :meth:`_busy`, a :class:`FleetUnavailable` naming
        ``cause`` (even if Redis answers again before it runs).
        """
        self._failed_by = cause
        wakes: list[Waiter] = []
        lock = self._lock
        lock.acquire()
        try:
            for queue in list(self._queues.values()):
                for waiter in list(queue):
                    if waiter.state == WAITING:
                        self._withdraw_locked(waiter)
                        if waiter.armed:
                            waiter.armed = False
                            wakes.append(waiter)
        finally:
            lock.release()
            if self._deferred:
                self._drain()
        for waiter in wakes:
            waiter.wake()  # False: its loop is gone, and the caller with it

    def _rate_demand(
        self, budgets: FleetBudgets, most: int
    ) -> tuple[int, list[int], list[int], Returned]:
        """For a permit request: ``(in_flight, costs, outs, returned)``, in one locked step.

        ``costs``: the tokens stated by the first ``most`` queued callers, higher classes
        first, in queue order within a class (the order they will be admitted in, but for
        the overtaking bound); ``outs``: their output parts (all 0 without split budgets).
        ``returned``: the pool, emptied, to give back to Redis (the request asks again for
        what the queue needs, so no permit ages here).
        """
        costs: list[int] = []
        outs: list[int] = []
        lock = self._lock
        lock.acquire()
        try:
            in_flight = self._in_flight
            for priority in sorted(self._queues, reverse=True):
                for waiter in self._queues[priority]:
                    if len(costs) >= most:
                        break
                    if waiter.state == WAITING:
                        costs.append(waiter.tokens)
                        outs.append(waiter_out(waiter))
            returned = budgets.withdraw(list(zip(costs, outs, strict=True)))
        finally:
            lock.release()
            if self._deferred:
                self._drain()
        return in_flight, costs, outs, returned

    def _refill(
        self,
        budgets: FleetBudgets,
        permits: int,
        tokens: int,
        next_at: float,
        inputs: int = 0,
        outputs: int = 0,
    ) -> None:
        """Permits arrived from Redis: add them under the lock, then admit who can go."""
        lock = self._lock
        lock.acquire()
        try:
            budgets.deposit(permits, tokens, next_at, inputs, outputs)
        finally:
            lock.release()
            if self._deferred:
                self._drain()
        self._set_limit(self._capacity)  # a locked step that admits from the head

    def _install(self, budgets: FleetBudgets) -> None:
        """Make ``budgets`` this gate's rate budget (before any caller arrives)."""
        with self._lock:
            self._budgets = budgets  # type: ignore[assignment]  # duck-typed Budgets
