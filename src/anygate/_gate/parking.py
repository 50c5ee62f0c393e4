"""Parking a caller that cannot be admitted at once, and turning it away with ``Busy``.

The contended path of :class:`anygate.Gate`, off the uncontended one: a caller that finds
no slot (or no budget) queues through the ledger's ``_enqueue`` and parks here until it is
granted, its timeout passes or its admission time lies beyond the timeout. Two park loops,
one per kind of caller: a plain thread blocks in ``_block`` (``acquire_sync``); a task waits
in ``_wait`` (an acquire with a timeout) and ``_park`` (the one park loop for a task woken
without a grant; the common untimed park stays inline in ``Token.__aenter__``). A timeout
takes a last look under the lock before giving up (``_last_look``), and a caller that will
not or cannot wait gets its :class:`anygate.Busy` from ``_refusal`` / ``_busy``, with the
budget's estimate of when it could go.

Not where waking happens (each runtime's route is ``waiters``'s) nor where state changes
(each look is one of the ledger's locked steps, ``slot_steps``): this is the loop around
them. A subclass of the ledger's steps that :class:`anygate.Gate` inherits, with no state
of its own; the fleet's local gate overrides ``_busy``.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

import anyio

from .._errors import Busy
from . import waiters as _waiters
from .budget_steps import BudgetSteps
from .ledger import token_out
from .slot_steps import SlotSteps
from .waiters import GONE, GRANTED, ki_protected

if TYPE_CHECKING:
    from .token import Token

__all__ = ["Parking"]

_INF = math.inf
_monotonic = time.monotonic


class Parking(SlotSteps, BudgetSteps):
    """How a caller that cannot go at once waits, or is refused; :class:`anygate.Gate`
    inherits it."""

    __slots__ = ()

    if TYPE_CHECKING:
        # The gate's own slots (``Gate.__slots__``), read here: a Busy names the gate,
        # and an acquire admitted by its queueing step is a schedule point unless
        # ``fast_acquire``.
        _name: str
        _fast_acquire: bool

    def _block(self, waiter: _waiters.ThreadWaiter, timeout: float | None) -> bool:
        """Block this thread until ``waiter`` (queued) is granted (``True``) or its
        timeout passes (``False``; it has left the queue). Raises ``Busy`` at once when
        the rate budget cannot admit it within the timeout. ``acquire_sync`` settles the
        waiter if this raises."""
        timeout_s = timeout or 0.0
        if waiter.state == GONE:  # its admission time lies beyond the timeout
            raise self._busy(timeout_s, timed_out=True, due=waiter.due)
        end = None if timeout is None else time.monotonic() + timeout
        limit_at = None if timeout is None else self._clock() + timeout
        while True:
            due = waiter.due
            wait = None if due == math.inf else max(0.0, due - self._clock())
            if end is not None:
                left = end - time.monotonic()
                if left <= 0:
                    return self._last_look(waiter) == GRANTED
                wait = left if wait is None else min(wait, left)
            waiter.block(wait)
            if waiter.state == GRANTED:
                return True
            # A budget timer, a nudge or a stale wake-up: look again under the lock.
            state = self._poll(waiter, limit_at)
            if state == GRANTED:
                return True
            if state == GONE:
                raise self._busy(timeout_s, timed_out=True, due=waiter.due)

    @ki_protected
    async def _wait(self, token: Token) -> None:
        """Queue ``token`` (an acquisition with a timeout, see ``token``) and park until
        it is admitted or the timeout passes. Untimed waits park in ``Token.__aenter__``."""
        # One argument, not five: every coroutine frame slot is paid per queued waiter.
        wait_s, tokens = token._timeout, token._cost
        assert wait_s is not None
        if wait_s == 0:
            raise self._refusal(tokens, token._priority)
        waiter = _waiters.async_waiter()
        waiter.tokens, waiter.priority = tokens, token._priority
        if tokens:
            out = token_out(token)
            if out:
                waiter.out = out
        if self._enqueue(waiter, wait_s):  # a slot freed up since the fast path looked
            await self._admitted_at_once(token)
            return
        if waiter.state == GONE:  # its admission time lies beyond the timeout
            raise self._busy(wait_s, timed_out=True, due=waiter.due)
        granted = False
        try:
            with anyio.move_on_after(wait_s) as scope:
                await self._park(
                    waiter, woken=False, limit_at=self._clock() + wait_s, waited=wait_s
                )
                granted = True
            # The timeout fired; a grant can still have won the race. Then the slot is
            # ours and the timeout's own cancellation was absorbed by the scope.
            if scope.cancelled_caught:
                state = self._last_look(waiter)
                if state == GONE:
                    raise self._busy(wait_s, timed_out=True, due=waiter.due)
                granted = state == GRANTED
        except BaseException:
            if waiter.state != GONE:
                self._abandon(waiter)
            raise
        if not granted:
            raise self._busy(wait_s, timed_out=True)
        token._gate = self  # type: ignore[assignment]  # self is the Gate
        # As granted, not as now: others granted in the same step (a freed batch) are in
        # in_flight by the time this task runs.
        token._seen = waiter.seen
        token._since = waiter.since  # the grant's time, not this task's wake-up

    async def _admitted_at_once(self, token: Token) -> None:
        """``token`` was admitted by the queueing step itself (a slot freed up since the
        fast path looked): it is held now, and under the default the acquire is still a
        schedule point, since it has not yielded."""
        token._gate = self  # type: ignore[assignment]  # self is the Gate
        token._seen = self._in_flight
        token._since = _monotonic()
        if not self._fast_acquire:
            try:
                await _waiters.schedule_point()
            except BaseException:
                token._give_back()
                raise

    async def _park(
        self,
        waiter: _waiters.AsyncioWaiter | _waiters.TrioWaiter,
        *,
        woken: bool,
        limit_at: float | None = None,
        waited: float = 0.0,
    ) -> None:
        """Park a queued waiter until it is granted; raise ``Busy`` if it is turned away.

        The one park loop, for a waiter that was woken without a grant (``woken``: a budget
        timer, a nudge, a fleet outage that withdrew it), is next on a rate budget (``due``
        finite) or waits with a timeout (``_wait``, whose cancel scope ends it; ``limit_at``
        is then that deadline on the gate's clock, and ``waited`` the timeout that ``Busy``
        reports). The common case, one plain park ended by
        a grant, stays inline in ``Token.__aenter__``. Only the next waiter has a finite
        ``due`` (a timed park for its budget); the others park untimed until a grant or a
        nudge, so nobody polls. No bound method is held across an await. The caller
        withdraws the waiter if this raises.
        """
        while True:
            if woken:
                if waiter.state == GRANTED:
                    return
                waiter.prepare()  # look again under the lock
                state = self._poll(waiter, limit_at)
                if state == GRANTED:
                    return
                if state == GONE:
                    raise self._busy(waited, timed_out=True, due=waiter.due)
            woken = True
            due = waiter.due
            if due == _INF:
                await waiter.park(self._interrupt)
            elif due > self._clock():
                with anyio.move_on_after(due - self._clock()):
                    await waiter.park(self._interrupt)

    def _last_look(self, waiter: _waiters.Waiter) -> int:
        """The wait timed out: admit the waiter if it can go right now, else withdraw it.

        A grant may have won the race with the timeout, and a budget that refills exactly
        at the deadline (the estimate said it would) must not lose to the timer.
        """
        state = self._poll(waiter, None)
        if state == _waiters.WAITING and not self._withdraw(waiter):
            state = GRANTED  # granted between the two locked steps
        return state

    @ki_protected
    def _refusal(self, tokens: int, priority: int) -> Busy:
        """The Busy for a caller that would not wait, with the budget's estimate if any."""
        due = None
        if self._budgets is not None:
            with self._lock:
                budgets = self._budgets
                if budgets is not None:
                    now = self._clock()
                    estimate = self._estimate_locked(now, tokens, priority)
                    if estimate > now:
                        due = estimate
        return self._busy(0.0, rejected=True, due=due)

    def _busy(
        self,
        waited: float,
        *,
        rejected: bool = False,
        timed_out: bool = False,
        due: float | None = None,
    ) -> Busy:
        in_flight = self._count_refusal(rejected=rejected, timed_out=timed_out)
        retry_after = None if due is None else max(0.0, due - self._clock())
        return Busy(
            gate=self._name,
            capacity=self._capacity,
            in_flight=in_flight,
            waited=waited,
            retry_after_s=retry_after,
        )
