"""The slot ledger: one gate's state under one lock, its wait queue and the handoff.

Every state change of a gate happens under one ``threading.Lock``, in a short synchronous
step that returns the waiters to wake; waking happens after the lock is released (a wake may
call into another event loop, and nothing foreign runs under our lock). This module holds
what those steps share: the state (capacity, in-flight count, the queues, the counters, the
rate budgets), the ``*_locked`` primitives every step is made of (queueing, withdrawing,
picking the next waiter, granting, giving a slot back), the wake-ups after unlocking
(``_fire``) and the work deferred to them (``_drain``). The steps themselves live in two
subclasses that :class:`anygate.Gate` inherits: ``slot_steps`` (a caller's acquire, wait and
release; a capacity change) and ``budget_steps`` (what changes the rate budgets outside an
admission: a rate change, a settle, header learning). Nothing here knows which runtime is
running (``waiters`` does) or what the public API looks like (``gate`` does); the rate
arithmetic lives in ``budgets``.

Split by class, not by object: the steps are methods of this same object, so the hot ones
(``_admit``, ``_release``) still spell their bookkeeping out inline on ``self`` rather than
calling helpers (benchmarks a and b). A queue object of its own would put a call on those
paths. Not for use on its own: only a :class:`anygate.Gate` is a complete ledger.

The invariants, each kept by the step named (in this module unless another is named):

I1  ``in_flight`` counts tokens that exist and are unreleased, including slots reserved for a
    woken waiter that has not resumed yet; it never goes below 0.  (``_advance_locked``)
I2  Admission only when the caller would be *next* (nobody queued ahead of it), a slot is
    free and every rate budget allows it now. Whenever a slot frees up, capacity rises, the
    budget refills (a waiter's timer), a settle refunds or the rate changes, the next
    waiters are admitted in the same locked step while all three hold. (``_admit`` and
    ``_enqueue`` in ``slot_steps``, ``_advance_locked``)
I3  Lowering capacity revokes nothing; nobody is admitted until ``in_flight`` drops below
    the new capacity; lower-then-raise never admits more than the final capacity.
    (``_advance_locked`` admits only while ``in_flight < capacity``)
I4  A waiter that leaves after a grant passes the slot on or frees it, and its rate cost is
    refunded, once; one that leaves before a grant unregisters in O(1) amortised (lazy
    deletion, ``_withdraw_locked``). (``_abandon`` via ``_drain``, ``_fire``)
I5  Releasing is synchronous, idempotent and never awaits. (``_release`` in ``slot_steps``)
I6  No event loop is bound: waiters carry their own wake-up route (``waiters``).
I7  Work found where the lock cannot be waited for (a finalizer running on a thread that
    already holds it) is deferred, never dropped: every locked step drains ``_deferred``
    right after unlocking. (``_drain``; a user finalizer's ``release()``: ``_release`` in
    ``slot_steps``)
I8  Order: strictly FIFO within a priority class, for slots and budget together (the next
    waiter blocks everyone behind it, however cheap). Higher classes go first, but the
    longest-waiting caller is overtaken at most ``OVERTAKES`` times in a row: then it goes
    next. (``_pick_locked``)
I9  Each waiter is woken at most once per arming (``armed``): a grant or a *nudge* (the
    next waiter must set its budget timer, earlier than it knew) disarms it under the lock,
    and only the waiter itself re-arms, under the lock, just before it parks again, and
    looks at its state after every park. A wake-up can arrive *before* the park it is
    meant for (a release run on the waiter's own thread between queueing and parking: a
    user ``__del__``, or the deferred work drained as ``_enqueue`` unlocks, I7): it must
    not be lost, so every route keeps it until the park (asyncio: the future stays
    resolved; threads: the lock stays released; trio: ``TrioWaiter.pending``). A wake-up
    from another thread can also arrive after the park it was meant for (the waiter
    polled instead of parking, then re-armed): it must wake nothing but that waiter's
    current park, so the routes make it harmless (trio reschedules only while
    ``TrioWaiter.parked``; asyncio: one future resolved at most once; threads: a lock
    released at most once), and the waiter's look at its state absorbs the early return.

Header learning (``_limits.learn``) changes the budgets through ``budget_steps``, where
its invariant note lives (a hold is a debt like any other: I2 and the hot paths are
unchanged).
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, ClassVar

from .budgets import Budgets
from .rate_math import EPSILON
from .waiters import (
    DEAD,
    GONE,
    GRANTED,
    WAITING,
    Waiter,
    ki_protected,
    waiter_out,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from .rate import Rate
    from .token import Token

__all__ = ["OVERTAKES", "UNLIMITED", "Ledger", "token_out"]

UNLIMITED = sys.maxsize
# Rebuild a class queue once dead entries outnumber live ones (plus slack), so withdrawal
# stays O(1) amortised without deque.remove() scans.
_COMPACT_SLACK = 64
#: The longest-waiting caller is overtaken by higher classes at most this many times in a
#: row; the next admission is then its own. A lower class therefore gets at least one in
#: every ``OVERTAKES + 1`` admissions while it waits.
OVERTAKES = 3
_INF = math.inf
_monotonic = time.monotonic


def token_out(token: Token | None) -> int:
    """The output part of ``token``'s cost (``acquire(output_tokens=)`` or a settle).

    The ``_out`` slot is written only when an output part is stated, so an acquire that
    states none (every gate without split budgets) pays no store for it; unset reads 0.
    """
    try:
        return token._out  # type: ignore[union-attr]
    except AttributeError:
        return 0


class Ledger:
    """The locked state of one gate; :class:`anygate.Gate` is its public face."""

    #: The rate and its budgets are someone else's to change: a fleet's local gate shares
    #: the fleet's through Redis, so header learning neither holds, lowers nor marks them
    #: here (a hold in one process would pause only that process, and the fleet's
    #: budgets have no mark to count from: both raised ``AttributeError`` before).
    _shares_rate: ClassVar[bool] = False

    __slots__ = (
        "__weakref__",
        "_admitted",
        "_budgets",
        "_cancelled",
        "_capacity",
        "_clock",
        "_costs",
        "_counts",
        "_deferred",
        "_in_flight",
        "_leaked",
        "_limit",
        "_live",
        "_lock",
        "_passed",
        "_queues",
        "_rejected",
        "_seq",
        "_timed_out",
    )

    def __init__(
        self, capacity: float, rate: Rate | None = None, clock: Callable[[], float] | None = None
    ) -> None:
        self._capacity: float = capacity
        # int mirror of capacity so the hot path compares int to int.
        self._limit = UNLIMITED if capacity == math.inf else int(capacity)
        self._in_flight = 0
        # One FIFO per priority class that has live waiters; an emptied class is dropped.
        self._queues: dict[int, deque[Waiter]] = {}
        self._counts: dict[int, int] = {}  # live waiters per class
        self._costs: dict[int, int] = {}  # tokens stated by the live waiters per class
        self._live = 0  # queued waiters still WAITING; the rest of the queues are GONE
        self._seq = 0  # arrival order across classes (for the overtaking bound)
        self._passed = 0  # admissions in a row that overtook the longest-waiting caller
        self._lock = threading.Lock()
        self._clock: Callable[[], float] = time.monotonic if clock is None else clock
        self._budgets = None if rate is None else Budgets(rate, self._read_clock())
        # Work that must not wait for the lock: leaked slots (None) found by Token.__del__,
        # waiters abandoned by an exception, and tokens released by a user finalizer,
        # possibly running while this thread holds _lock. Appending is atomic; see _drain
        # for who processes it.
        self._deferred: list[Waiter | Token | None] = []
        self._admitted = 0
        self._rejected = 0
        self._timed_out = 0
        self._cancelled = 0
        self._leaked = 0

    @property
    def _queue(self) -> list[Waiter]:
        """Every queued entry, live or withdrawn, class by class (tests check compaction)."""
        return [waiter for queue in self._queues.values() for waiter in queue]

    # ------------------------------------------------------------------ the queue

    def _overtakes_locked(self, priority: int) -> bool:
        """Would a newcomer of ``priority`` be next although others are queued? (I8)"""
        return priority > max(self._counts) and self._passed < OVERTAKES

    def _push_locked(self, waiter: Waiter) -> None:
        priority = waiter.priority
        queues = self._queues
        if queues and (len(queues) > 1 or priority not in queues):
            # Arrival order matters only across classes (I8). A waiter queued while its
            # class is the only one keeps seq 0: it is older than any waiter of another
            # class, all of which arrive (and are stamped) later. Skipping the stamp
            # saves an int object per queued waiter in the common one-class case.
            self._seq += 1
            waiter.seq = self._seq
        queue = queues.get(priority)
        if queue is None:
            queues[priority] = queue = deque()
            self._counts[priority] = 0
            self._costs[priority] = 0
        queue.append(waiter)
        self._counts[priority] += 1
        if waiter.tokens:
            self._costs[priority] += waiter.tokens
        self._live += 1
        # Last: a ThreadWaiter is GONE until queued, and an exception that reaches
        # acquire_sync before we return must find it either not queued or fully queued.
        waiter.state = WAITING

    def _withdraw_locked(self, waiter: Waiter) -> bool:
        state = waiter.state
        if state == WAITING:
            # I4: lazy deletion. The entry stays in its deque as GONE and is skipped when
            # it reaches the head; compaction bounds the dead weight.
            waiter.state = GONE
            self._live -= 1
            priority = waiter.priority
            left = self._counts[priority] - 1
            if left:
                self._counts[priority] = left
                if waiter.tokens:
                    self._costs[priority] -= waiter.tokens
                queue = self._queues[priority]
                if len(queue) > 2 * left + _COMPACT_SLACK:
                    self._queues[priority] = deque(w for w in queue if w.state == WAITING)
            else:
                del self._counts[priority], self._costs[priority], self._queues[priority]
        return state == GRANTED

    # ------------------------------------------------------------------ the handoff

    def _pick_locked(self) -> Waiter:
        """The next waiter (I8); ``_live`` must be non-zero. Drops withdrawn heads."""
        queues = self._queues
        if len(queues) == 1:
            for queue in queues.values():
                waiter = queue[0]
                while waiter.state != WAITING:  # skip entries withdrawn earlier
                    queue.popleft()
                    waiter = queue[0]
                return waiter
        best: Waiter | None = None
        oldest: Waiter | None = None
        for queue in queues.values():
            waiter = queue[0]
            while waiter.state != WAITING:
                queue.popleft()
                waiter = queue[0]
            if best is None or waiter.priority > best.priority:
                best = waiter
            if oldest is None or waiter.seq < oldest.seq:
                oldest = waiter
        assert best is not None
        assert oldest is not None
        return oldest if self._passed >= OVERTAKES else best

    def _advance_locked(self, now: float, wakes: list[Waiter]) -> None:
        """Admit the next waiters while slot and budget allow; set the next one's timer."""
        budgets = self._budgets
        while self._live and self._in_flight < self._limit:
            waiter = self._pick_locked()
            if budgets is not None:
                # Split input/output budgets only: a fleet gate's budgets take no ``out``.
                split = budgets.split
                out = waiter_out(waiter) if split else 0
                due = (
                    budgets.when(now, waiter.tokens, out=out)
                    if split
                    else budgets.when(now, waiter.tokens)
                )
                if due > now + EPSILON:
                    # Budget-bound: it must wake at `due`. Nudge it only if it would sleep
                    # longer than that (a refill came earlier than it knew, I9).
                    if due < waiter.due:
                        waiter.due = due
                        if waiter.armed:
                            waiter.armed = False
                            wakes.append(waiter)
                    return
                if split:
                    budgets.take(now, waiter.tokens, out)
                else:
                    budgets.take(now, waiter.tokens)
            self._grant_locked(waiter)
            if waiter.armed:
                waiter.armed = False
                wakes.append(waiter)

    def _grant_locked(self, waiter: Waiter) -> None:
        """Move ``waiter`` (the result of ``_pick_locked``) from its queue to in-flight."""
        priority = waiter.priority
        queues = self._queues
        if len(queues) > 1:
            # I8: count how often the longest-waiting caller was overtaken.
            overtaken = any(q[0].seq < waiter.seq for q in queues.values() if q[0] is not waiter)
            self._passed = self._passed + 1 if overtaken else 0
        else:
            self._passed = 0
        queues[priority].popleft()
        left = self._counts[priority] - 1
        if left:
            self._counts[priority] = left
            if waiter.tokens:
                self._costs[priority] -= waiter.tokens
        else:
            del self._counts[priority], self._costs[priority], queues[priority]
        self._live -= 1
        waiter.state = GRANTED
        self._in_flight += 1
        self._admitted += 1
        waiter.seen = self._in_flight
        waiter.since = _monotonic()  # granted now, whenever its task runs (Token.admitted_at)

    def _give_back_locked(self, waiter: Waiter, wakes: list[Waiter], now: float | None) -> None:
        """A granted waiter will never use its slot: refund its cost once, pass the slot on."""
        if self._budgets is not None:
            if self._budgets.split:
                self._budgets.refund(1, waiter.tokens, waiter_out(waiter))
            else:
                self._budgets.refund(1, waiter.tokens)
        self._in_flight -= 1
        if now is not None:
            self._advance_locked(now, wakes)

    def _safe_now(self) -> float | None:
        """The clock for paths a finalizer may run: ``None`` if it cannot be read now.

        An injected virtual clock (``anyio.current_time``) raises outside its run, and a
        leaked token may be collected after the run ended. The bookkeeping still happens;
        only the handoff waits for the next locked step that can read the clock.
        """
        return 0.0 if self._budgets is None else self._read_clock()

    def _read_clock(self) -> float | None:
        try:
            return self._clock()
        except Exception:
            return None

    @ki_protected
    def _fire(self, wakes: list[Waiter]) -> None:
        """Wake waiters outside the lock; one that can never run again gives its turn up."""
        i = 0
        while i < len(wakes):
            waiter = wakes[i]
            i += 1
            if not waiter.wake():
                self._fire_failed(waiter, wakes)

    def _fire_failed(self, waiter: Waiter, wakes: list[Waiter]) -> None:
        """``waiter`` can never run again: give its turn up (I4); more wakes may follow."""
        lock = self._lock
        lock.acquire()
        try:
            # Still GRANTED unless its own cleanup already passed the slot on (a task
            # freed on the spot by a failed wake-up runs its GeneratorExit first).
            state = waiter.state
            now = self._safe_now()
            if state == GRANTED:
                waiter.state = DEAD
                self._cancelled += 1
                self._give_back_locked(waiter, wakes, now)
            elif state == WAITING:  # a nudge that cannot arrive: it is next, drop it
                self._withdraw_locked(waiter)
                waiter.state = DEAD
                self._cancelled += 1
                if now is not None:
                    self._advance_locked(now, wakes)
        finally:
            lock.release()
            if self._deferred:
                self._drain()

    # ------------------------------------------------------------------ deferred work

    def _abandon(self, waiter: Waiter) -> None:
        """A waiter left by an exception (cancellation, loop teardown, KeyboardInterrupt).

        Deferred like a leak rather than taking the lock: a parked coroutine whose loop
        died is closed by the garbage collector (GeneratorExit), which may run inside a
        locked section on this very thread.
        """
        self._deferred.append(waiter)
        self._drain()

    def _reclaim(self) -> None:
        """One token was garbage-collected unreleased; may run inside our own locked section."""
        self._deferred.append(None)  # None stands for one leaked slot
        self._drain()

    @ki_protected
    def _drain(self) -> None:
        """Process deferred leaks and abandonments, if the lock can be had without waiting.

        Never blocks: this may run from a finalizer on a thread that already holds the lock
        (gc triggered by an allocation inside a locked section). If the lock is taken, its
        holder drains after releasing it: every locked section checks ``_deferred`` right
        after ``release()``, and our append happened before our failed try, so it is seen.
        """
        deferred = self._deferred
        lock = self._lock
        while deferred and lock.acquire(blocking=False):
            wakes: list[Waiter] = []
            try:
                now = self._safe_now()
                while deferred:
                    item = deferred.pop()
                    if item is None:  # a leaked token's slot (its rate cost stays spent)
                        self._leaked += 1
                        self._in_flight -= 1
                        if now is not None:
                            self._advance_locked(now, wakes)
                        continue
                    if not isinstance(item, Waiter):  # a token released by a finalizer
                        if item._gate is not None:  # idempotent, as in _release
                            item._gate = None
                            self._in_flight -= 1
                            if now is not None:
                                self._advance_locked(now, wakes)
                        continue
                    # an abandoned waiter
                    if item.state != DEAD:  # a dead waiter was counted by _fire
                        self._cancelled += 1
                    if self._withdraw_locked(item):
                        # I4: the slot was reserved for it; pass it on, never lose it.
                        item.state = GONE
                        self._give_back_locked(item, wakes, now)
                    elif self._budgets is not None and now is not None:
                        self._advance_locked(now, wakes)  # it may have been the next one
            finally:
                lock.release()
            if wakes:
                self._fire(wakes)
