"""The gate's slot steps: the locked steps of a caller's acquire, wait and release.

Each step is one short locked section over the ledger's state (``ledger``): take the gate's
lock, update the counters and the queue (through the ledger's ``*_locked`` primitives where
it is not a hot path), release the lock, drain deferred work (I7), then wake whoever the
step admitted. Here: the uncontended admission (``_admit``) and release (``_release``),
which spell their bookkeeping out inline (benchmarks a and b); queueing a waiter or
admitting it at once (``_enqueue``) and a newcomer's admission estimate; a parked waiter's
look after a wake-up (``_poll``), its interruption (``_interrupt``) and its leaving
(``_withdraw``); a capacity change (``_set_limit``); counting a refusal. The invariants are
listed in ``ledger``; the steps here keep I2 (``_admit``, ``_enqueue``), I3 (``_set_limit``
through ``_advance_locked``), I5 and I7 (``_release``).

A subclass of ``ledger.Ledger`` that :class:`anygate.Gate` inherits, with no state of its
own; not for use on its own, and not where the rate budgets change outside an admission
(``budget_steps``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .ledger import UNLIMITED, Ledger, _monotonic, token_out
from .rate_math import EPSILON
from .waiters import (
    GONE,
    GRANTED,
    WAITING,
    Waiter,
    inside_locked_step,
    ki_protected,
    waiter_out,
)

if TYPE_CHECKING:
    from .token import Token

__all__ = ["SlotSteps"]

_INF = math.inf


class SlotSteps(Ledger):
    """The ledger's steps for slots and waiters; :class:`anygate.Gate` inherits them."""

    __slots__ = ()

    # ------------------------------------------------------------------ admission

    @ki_protected
    def _admit(
        self,
        tokens: int = 0,
        priority: int = 0,
        token: Token | None = None,
        asker: Token | None = None,
    ) -> bool:
        """Take a slot now if the caller would be next and slot and budget allow (I2).

        The uncontended path. An explicit acquire/release pair rather than ``with``: half
        the cost on CPython 3.11, and this is the budget the benchmark measures. A
        ``token`` (being acquired) is marked held in the same locked step, so that an
        exception between this step and the caller finds the slot on it (I1). ``asker``
        is the token being entered when it is not marked here (``Token.__aenter__``):
        with split token budgets, ``token`` or ``asker`` holds the cost's output part.
        """
        lock = self._lock
        lock.acquire()
        try:
            admitted = self._in_flight < self._limit
            if admitted:
                if self._live:
                    admitted = self._overtakes_locked(priority)
                budgets = self._budgets
                if budgets is not None and admitted:
                    if budgets.split:
                        admitted = budgets.try_take_split(
                            self._clock(), tokens, token_out(token or asker)
                        )
                    else:
                        admitted = budgets.try_take(self._clock(), tokens)
                if admitted:
                    if self._live:
                        self._passed += 1
                    self._in_flight += 1
                    self._admitted += 1
                    if token is not None:
                        token._gate = self  # type: ignore[assignment]  # self is the Gate
        finally:
            lock.release()
            if self._deferred:
                self._drain()
        return admitted

    @ki_protected
    def _enqueue(self, waiter: Waiter, limit_s: float | None = None) -> bool:
        """Queue ``waiter``, or admit it at once (``True``) if it is next and can go.

        With a rate and a wait limit, a waiter whose earliest possible admission lies
        beyond ``limit_s`` seconds is refused instead: it is not queued, its state is
        ``GONE`` and ``waiter.due`` holds the estimate (the caller raises ``Busy``).
        """
        wakes: list[Waiter] | None = None  # no list on the contended path without a rate
        lock = self._lock
        lock.acquire()
        try:
            tokens, priority = waiter.tokens, waiter.priority
            budgets = self._budgets
            if budgets is None:
                admitted = not self._live and self._in_flight < self._limit
                if admitted:
                    # Recorded on the waiter, under the lock: an exception before the
                    # caller sees our answer still finds the slot (acquire_sync, I4).
                    waiter.state = GRANTED
                    self._in_flight += 1
                    self._admitted += 1
                    waiter.seen = self._in_flight
                    waiter.since = _monotonic()
                else:
                    queue = self._queues.get(priority)
                    if queue is not None and len(self._queues) == 1 and not tokens:
                        # Joining the only class: _push_locked's common case inline.
                        queue.append(waiter)
                        self._counts[priority] += 1
                        self._live += 1
                        waiter.state = WAITING  # a ThreadWaiter is GONE until queued
                    else:
                        self._push_locked(waiter)
            else:
                now = self._clock()
                if limit_s is not None:
                    due = self._estimate_waiter_locked(now, waiter)
                    if due > now + limit_s + EPSILON:
                        waiter.state = GONE
                        waiter.due = due
                        return False
                self._push_locked(waiter)
                waiter.armed = False  # we are not parked: never wake ourselves
                wakes = []
                self._advance_locked(now, wakes)
                admitted = waiter.state == GRANTED
                waiter.armed = True
        finally:
            lock.release()
            if self._deferred:
                self._drain()
        if wakes:
            self._fire(wakes)
        return admitted

    def _estimate_locked(self, now: float, tokens: int, priority: int) -> float:
        """A lower bound of a newcomer's admission time: the budgets those ahead must pay."""
        budgets = self._budgets
        assert budgets is not None
        ahead = ahead_tokens = 0
        for p, count in self._counts.items():
            if p >= priority:
                ahead += count
                ahead_tokens += self._costs[p]
        return budgets.when(now, tokens, ahead, ahead_tokens)

    def _estimate_waiter_locked(self, now: float, waiter: Waiter) -> float:
        """:meth:`_estimate_locked` for a queued-to-be ``waiter``, its output part included."""
        budgets = self._budgets
        assert budgets is not None
        if not budgets.split:
            return self._estimate_locked(now, waiter.tokens, waiter.priority)
        ahead = ahead_tokens = 0
        for p, count in self._counts.items():
            if p >= waiter.priority:
                ahead += count
                ahead_tokens += self._costs[p]
        return budgets.when(now, waiter.tokens, ahead, ahead_tokens, waiter_out(waiter))

    @ki_protected
    def _poll(self, waiter: Waiter, limit_at: float | None) -> int:
        """A rate waiter woke up (timer, nudge or spurious): admit it or re-arm it.

        Returns ``GRANTED``, ``WAITING`` (``waiter.due`` is when to look again; ``inf``
        until nudged) or ``GONE`` when its admission time lies beyond ``limit_at`` (on
        the gate's clock): it has been withdrawn and ``waiter.due`` holds the estimate.
        """
        wakes: list[Waiter] = []
        lock = self._lock
        lock.acquire()
        try:
            state = waiter.state
            if state == WAITING:
                waiter.armed = False
                waiter.due = _INF  # set again below if it is the next one
                now = self._clock()
                self._advance_locked(now, wakes)
                state = waiter.state
                if state == WAITING:
                    # A finite due is a budget time; inf (waiting for a slot or its turn)
                    # is not an estimate and never refuses.
                    due = waiter.due
                    if limit_at is not None and limit_at + EPSILON < due < _INF:
                        self._withdraw_locked(waiter)
                        self._advance_locked(now, wakes)
                        waiter.due = due
                        state = GONE
                    else:
                        waiter.armed = True
        finally:
            lock.release()
            if self._deferred:
                self._drain()
        if wakes:
            self._fire(wakes)
        return state

    @ki_protected
    def _interrupt(self, waiter: Waiter) -> bool:
        """A parked waiter is being interrupted (trio's abort); ``False``: a wake is coming.

        It stays queued: the caller's own exception handler or timeout path withdraws it,
        and a budget timer just polls again.
        """
        lock = self._lock
        lock.acquire()
        try:
            armed = waiter.armed
            waiter.armed = False
        finally:
            lock.release()
            if self._deferred:
                self._drain()
        return armed

    @ki_protected
    def _withdraw(self, waiter: Waiter) -> bool:
        """Take ``waiter`` out of the queue unless granted; ``True`` if it holds no slot."""
        wakes: list[Waiter] = []
        lock = self._lock
        lock.acquire()
        try:
            granted = self._withdraw_locked(waiter)
            if self._budgets is not None and self._live:
                self._advance_locked(self._clock(), wakes)  # the next one may set its timer
        finally:
            lock.release()
            if self._deferred:
                self._drain()
        if wakes:
            self._fire(wakes)
        return not granted

    # ------------------------------------------------------------------ release and capacity

    @ki_protected
    def _release(self, token: Token) -> None:
        """Give ``token``'s slot back (I5): hand it to the next waiter or free it."""
        successor: Waiter | None = None
        wakes: list[Waiter] | None = None  # no list on the uncontended path
        lock = self._lock
        # Look first: a user's __del__ calling release() can run from a collection inside
        # one of our own locked sections on this thread (any allocation there, or on 3.12+
        # any call), and blocking on our own lock would hang the thread for good. The
        # stack check runs only when the lock is taken. locked() and a blocking acquire()
        # rather than acquire(False), whose argument costs a tuple and a parse: between
        # the two only another thread can take the lock, and then we just wait for it.
        if lock.locked() and inside_locked_step():
            # Deferred (I7): the section we interrupted drains right after unlocking.
            # A false positive (another thread holds the lock while we are merely in
            # some protected frame) is harmless: that thread drains after unlocking,
            # and if it already has, our own _drain() below takes the lock and does it.
            self._deferred.append(token)
            self._drain()
            return
        lock.acquire()
        try:
            if token._gate is not None:  # else another releaser won the race: no-op
                token._gate = None
                self._in_flight -= 1
                if self._live:
                    if self._budgets is None:
                        # Without a rate one freed slot admits at most one waiter: the
                        # contended path's handoff, without _advance_locked's loop.
                        if self._in_flight < self._limit:
                            queues = self._queues
                            if len(queues) == 1:
                                # One class: _pick_locked and _grant_locked spelled out.
                                (queue,) = queues.values()
                                successor = queue.popleft()
                                while successor.state != WAITING:  # withdrawn earlier
                                    successor = queue.popleft()
                                priority = successor.priority
                                left = self._counts[priority] - 1
                                if left:
                                    self._counts[priority] = left
                                    if successor.tokens:
                                        self._costs[priority] -= successor.tokens
                                else:
                                    del self._counts[priority], self._costs[priority]
                                    del queues[priority]
                                self._passed = 0
                                self._live -= 1
                                successor.state = GRANTED
                                self._in_flight += 1
                                self._admitted += 1
                                successor.seen = self._in_flight
                                successor.since = _monotonic()
                            else:
                                successor = self._pick_locked()
                                self._grant_locked(successor)
                            if successor.armed:
                                successor.armed = False
                            else:
                                successor = None
                    else:
                        wakes = []
                        self._advance_locked(self._clock(), wakes)
        finally:
            lock.release()
            if self._deferred:
                self._drain()
        if successor is not None and not successor.wake():
            wakes = []
            self._fire_failed(successor, wakes)
        if wakes:
            self._fire(wakes)

    @ki_protected
    def _set_limit(self, cap: float) -> None:
        """Apply a validated capacity; raising it admits from the head (I2), lowering drains (I3)."""
        wakes: list[Waiter] = []
        lock = self._lock
        lock.acquire()
        try:
            self._capacity = cap
            self._limit = UNLIMITED if cap == math.inf else int(cap)
            # Nobody waiting: nobody to admit, and no clock to read (a policy built
            # before its event loop runs may resize a gate whose clock needs one).
            if self._live:
                budgets = self._budgets
                self._advance_locked(0.0 if budgets is None else self._clock(), wakes)
        finally:
            lock.release()
            if self._deferred:
                self._drain()
        if wakes:
            self._fire(wakes)

    @ki_protected
    def _count_refusal(self, *, rejected: bool = False, timed_out: bool = False) -> int:
        """Count a refused or timed-out acquire; returns ``in_flight`` for the message."""
        lock = self._lock
        lock.acquire()
        try:
            if rejected:
                self._rejected += 1
            if timed_out:
                self._timed_out += 1
            in_flight = self._in_flight
        finally:
            lock.release()
            if self._deferred:
                self._drain()
        return in_flight
