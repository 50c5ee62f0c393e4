"""The slot ledger: capacity, in-flight count, the FIFO queue and the handoff.

Every state change of a gate happens here, under one ``threading.Lock``, in a short
synchronous step that returns the waiters to wake; waking happens after the lock is released
(a wake may call into another event loop, and nothing foreign runs under our lock). Nothing
here knows which runtime is running (``_waiters`` does) or what the public API looks like
(``_gate`` does).

The invariants, each kept by the step named:

I1  ``in_flight`` counts tokens that exist and are unreleased, including slots reserved for a
    woken waiter that has not resumed yet; it never goes below 0.  (``_handoff_locked``)
I2  Admission only when nobody is queued and ``in_flight < capacity``. A release while
    someone is queued hands the slot to the head in the same locked step (``in_flight``
    unchanged); raising capacity admits from the head while room remains.
    (``_admit``, ``_enqueue``, ``_handoff_locked``, ``_set_limit``)
I3  Lowering capacity revokes nothing; nobody is admitted until ``in_flight`` drops below
    the new capacity; lower-then-raise never admits more than the final capacity.
    (``_handoff_locked`` drops rather than hands over while ``in_flight > capacity``)
I4  A waiter that leaves after a grant passes the slot on or frees it; one that leaves
    before a grant unregisters in O(1) amortised (lazy deletion, ``_withdraw_locked``).
    (``_abandon`` via ``_drain``, ``_wake``)
I5  Releasing is synchronous, idempotent and never awaits. (``_release``)
I6  No event loop is bound: waiters carry their own wake-up route (``_waiters``).
I7  Work found where the lock cannot be waited for (a finalizer running on a thread that
    already holds it) is deferred, never dropped: every locked step drains ``_deferred``
    right after unlocking. (``_drain``; a user finalizer's ``release()``: ``_release``)
"""

from __future__ import annotations

import math
import sys
import threading
from collections import deque
from typing import TYPE_CHECKING

from ._waiters import DEAD, GONE, GRANTED, WAITING, Waiter, _protected, ki_protected

if TYPE_CHECKING:
    from types import FrameType

    from ._token import Token

__all__ = ["UNLIMITED", "Ledger"]

UNLIMITED = sys.maxsize
# Rebuild the queue once dead entries outnumber live ones (plus slack), so withdrawal stays
# O(1) amortised without deque.remove() scans.
_COMPACT_SLACK = 64


class Ledger:
    """The locked state of one gate; :class:`anygate.Gate` is its public face."""

    __slots__ = (
        "__weakref__",
        "_admitted",
        "_cancelled",
        "_capacity",
        "_deferred",
        "_in_flight",
        "_leaked",
        "_limit",
        "_live",
        "_lock",
        "_queue",
        "_rejected",
        "_timed_out",
    )

    def __init__(self, capacity: float) -> None:
        self._capacity: float = capacity
        # int mirror of capacity so the hot path compares int to int.
        self._limit = UNLIMITED if capacity == math.inf else int(capacity)
        self._in_flight = 0
        self._queue: deque[Waiter] = deque()
        self._live = 0  # queued waiters still WAITING; the rest of _queue are GONE
        self._lock = threading.Lock()
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

    @ki_protected
    def _admit(self) -> bool:
        """Take a slot if nobody is queued and there is room (I2): the uncontended path.

        An explicit acquire/release pair rather than ``with``: half the cost on CPython 3.11,
        and this is the budget the benchmark measures.
        """
        lock = self._lock
        lock.acquire()
        try:
            admitted = not self._live and self._in_flight < self._limit
            if admitted:
                self._in_flight += 1
                self._admitted += 1
        finally:
            lock.release()
            if self._deferred:
                self._drain()
        return admitted

    @ki_protected
    def _enqueue(self, waiter: Waiter) -> bool:
        """Queue ``waiter``, unless a slot freed up since the fast path failed (then take it)."""
        lock = self._lock
        lock.acquire()
        try:
            admitted = not self._live and self._in_flight < self._limit
            if admitted:
                self._in_flight += 1
                self._admitted += 1
            else:
                self._queue.append(waiter)
                self._live += 1
        finally:
            lock.release()
            if self._deferred:
                self._drain()
        return admitted

    @ki_protected
    def _withdraw(self, waiter: Waiter) -> bool:
        """Take ``waiter`` out of the queue unless granted; ``True`` if it holds no slot."""
        lock = self._lock
        lock.acquire()
        try:
            granted = self._withdraw_locked(waiter)
        finally:
            lock.release()
            if self._deferred:
                self._drain()
        return not granted

    def _withdraw_locked(self, waiter: Waiter) -> bool:
        state = waiter.state
        if state == WAITING:
            # I4: lazy deletion. The entry stays in the deque as GONE and is skipped when
            # it reaches the head; compaction bounds the dead weight.
            waiter.state = GONE
            self._live -= 1
            queue = self._queue
            if len(queue) > 2 * self._live + _COMPACT_SLACK:
                self._queue = deque(w for w in queue if w.state == WAITING)
        return state == GRANTED

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
    def _release(self, token: Token) -> None:
        """Give ``token``'s slot back (I5): hand it to the head waiter or free it."""
        successor = None
        lock = self._lock
        # Try first: a user's __del__ calling release() can run from a collection inside
        # one of our own locked sections on this thread (any allocation there, or on 3.12+
        # any call), and blocking on our own lock would hang the thread for good. The
        # non-blocking try costs ~20 ns; the stack check runs only when the lock is taken.
        if not lock.acquire(False):
            if _inside_locked_step():
                # Deferred (I7): the section we interrupted drains right after unlocking.
                # A false positive (another thread holds the lock while we are merely in
                # some protected frame) is harmless: that thread drains after unlocking,
                # and our append comes before our own failed try.
                self._deferred.append(token)
                self._drain()
                return
            lock.acquire()
        try:
            if token._gate is not None:  # else another releaser won the race: no-op
                token._gate = None
                if self._live:
                    successor = self._handoff_locked()
                else:
                    self._in_flight -= 1
        finally:
            lock.release()
            if self._deferred:
                self._drain()
        if successor is not None:
            self._wake(successor)

    def _handoff_locked(self) -> Waiter | None:
        """One slot is being given up: grant it to the head waiter, or free it."""
        # I3: while draining after a lowering (in_flight > capacity) the slot is dropped,
        # not handed over. in_flight <= limit means the slot fits under the new capacity.
        if self._live and self._in_flight <= self._limit:
            waiter = self._pop_head_locked()
            waiter.state = GRANTED
            self._admitted += 1
            return waiter  # I2: in_flight unchanged, the slot moves to the waiter
        self._in_flight -= 1
        return None

    def _pop_head_locked(self) -> Waiter:
        queue = self._queue
        waiter = queue.popleft()
        while waiter.state != WAITING:  # skip entries withdrawn earlier (lazy deletion)
            waiter = queue.popleft()
        self._live -= 1
        return waiter

    @ki_protected
    def _set_limit(self, cap: float) -> None:
        """Apply a validated capacity; raising it admits from the head (I2), lowering drains (I3)."""
        granted: list[Waiter] = []
        lock = self._lock
        lock.acquire()
        try:
            self._capacity = cap
            self._limit = UNLIMITED if cap == math.inf else int(cap)
            while self._live and self._in_flight < self._limit:
                waiter = self._pop_head_locked()
                waiter.state = GRANTED
                self._in_flight += 1
                self._admitted += 1
                granted.append(waiter)
        finally:
            lock.release()
            if self._deferred:
                self._drain()
        for waiter in granted:
            self._wake(waiter)

    @ki_protected
    def _wake(self, waiter: Waiter) -> None:
        """Wake a granted waiter outside the lock; if it can never run, pass its slot on."""
        successor: Waiter | None = waiter
        while successor is not None and not successor.wake():
            lock = self._lock
            lock.acquire()
            try:
                # Still GRANTED unless its own cleanup already passed the slot on (a task
                # freed on the spot by a failed wake-up runs its GeneratorExit first).
                if successor.state == GRANTED:
                    successor.state = DEAD
                    self._cancelled += 1
                    successor = self._handoff_locked()
                else:
                    successor = None
            finally:
                lock.release()
                if self._deferred:
                    self._drain()

    # ------------------------------------------------------------------ deferred work

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
            granted: list[Waiter] = []
            try:
                while deferred:
                    item = deferred.pop()
                    if item is None:  # a leaked token's slot
                        self._leaked += 1
                        successor = self._handoff_locked()
                    elif not isinstance(item, Waiter):  # a token released by a finalizer
                        successor = None
                        if item._gate is not None:  # idempotent, as in _release
                            item._gate = None
                            successor = self._handoff_locked()
                    else:  # an abandoned waiter
                        if item.state != DEAD:  # a dead waiter was counted by _wake
                            self._cancelled += 1
                        successor = None
                        if self._withdraw_locked(item):
                            # I4: the slot was reserved for it; pass it on, never lose it.
                            item.state = GONE
                            successor = self._handoff_locked()
                    if successor is not None:
                        granted.append(successor)
            finally:
                lock.release()
            for waiter in granted:
                self._wake(waiter)

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


# The code objects of every @ki_protected function: each of the gate's locked steps is one
# (trio's KI discipline requires it), so a frame running one of them on this thread means
# the lock may be ours. Built lazily, once all modules have registered theirs.
_locked_codes: frozenset[object] = frozenset()
_locked_count = 0


def _inside_locked_step() -> bool:
    """Whether this thread is running inside a ``@ki_protected`` function (stack walk).

    Only called when the gate's lock is taken, from :meth:`Ledger._release`.
    """
    global _locked_codes, _locked_count
    if _locked_count != len(_protected):
        _locked_codes = frozenset(getattr(fn, "__code__", None) for fn in _protected)
        _locked_count = len(_protected)
    codes = _locked_codes
    frame: FrameType | None = sys._getframe(2)  # skip ourselves and _release
    while frame is not None:
        if frame.f_code in codes:
            return True
        frame = frame.f_back
    return False
