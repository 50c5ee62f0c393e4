"""Gate: capacity, in-flight count, a FIFO queue and the slot handoff.

Every state change happens under one ``threading.Lock`` in a short synchronous method that
returns the waiters to wake; waking happens after the lock is released (a wake may call into
another event loop, and nothing foreign runs under our lock). The gate binds to no event loop.

The invariants, each kept by the method named:

I1  ``in_flight`` counts tokens that exist and are unreleased, including slots reserved for a
    woken waiter that has not resumed yet; it never goes below 0.  (``_handoff_locked``)
I2  Admission only when nobody is queued and ``in_flight < capacity``. A release while
    someone is queued hands the slot to the head in the same locked step (``in_flight``
    unchanged); raising capacity admits from the head while room remains.
    (``_admit_locked``, ``_handoff_locked``, ``capacity`` setter)
I3  Lowering capacity revokes nothing; nobody is admitted until ``in_flight`` drops below
    the new capacity; lower-then-raise never admits more than the final capacity.
    (``_handoff_locked`` drops rather than hands over while ``in_flight > capacity``)
I4  A waiter that leaves after a grant passes the slot on or frees it; one that leaves
    before a grant unregisters in O(1) amortised (lazy deletion, ``_withdraw_locked``).
    (``_abandon``, ``_wake``)
I5  Releasing is synchronous, idempotent and never awaits. (``_release``)
I6  No event loop is bound: waiters carry their own wake-up route (``_waiters``).
"""

from __future__ import annotations

import math
import sys
import threading
import warnings
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, final

import anyio

from . import _waiters
from ._errors import Busy
from ._token import Token, code_site, make_token
from ._waiters import DEAD, GONE, GRANTED, WAITING, Waiter, ki_protected

if TYPE_CHECKING:
    from collections.abc import Generator
    from types import CodeType, TracebackType

__all__ = ["Gate", "GateStatistics"]

_UNLIMITED = sys.maxsize
_getframe = sys._getframe
# Rebuild the queue once dead entries outnumber live ones (plus slack), so withdrawal stays
# O(1) amortised without deque.remove() scans.
_COMPACT_SLACK = 64


@dataclass(frozen=True)
class GateStatistics:
    """A consistent snapshot of a gate, taken under its lock.

    Attributes:
        name: the gate's name.
        capacity: the current capacity (``math.inf`` when unlimited).
        in_flight: unreleased tokens, including slots reserved for woken waiters.
        waiting: callers queued for a slot.
        admitted: tokens issued since the gate was created.
        rejected: ``acquire_nowait`` / ``timeout=0`` attempts refused because the gate was full.
        timed_out: waits that ended in :class:`Busy` because the timeout passed.
        cancelled: waits that ended in cancellation or another exception.
        leaked: tokens reclaimed after being garbage-collected unreleased.
    """

    name: str
    capacity: float
    in_flight: int
    waiting: int
    admitted: int
    rejected: int
    timed_out: int
    cancelled: int
    leaked: int


def _check_capacity(value: object) -> int | float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        msg = f"capacity must be an int >= 0 or math.inf (got {value!r} of type {type(value).__name__})"
        raise TypeError(msg)
    if isinstance(value, float):
        if math.isnan(value):
            msg = f"capacity must be an int >= 0 or math.inf (got {value!r})"
            raise ValueError(msg)
        if value == math.inf:
            return math.inf
        if not value.is_integer():
            msg = f"capacity must be a whole number (got {value!r})"
            raise ValueError(msg)
        value = int(value)
    if value < 0:
        msg = f"capacity must be >= 0 (got {value!r})"
        raise ValueError(msg)
    return value


def _check_timeout(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        msg = f"timeout must be a number of seconds >= 0 or None (got {value!r} of type {type(value).__name__})"
        raise TypeError(msg)
    if math.isnan(value) or value < 0:
        msg = f"timeout must be >= 0 seconds or None (got {value!r})"
        raise ValueError(msg)
    return None if value == math.inf else float(value)


@final
class Gate:
    """A process-wide admission gate: at most ``capacity`` slots held at once, FIFO beyond.

    One gate serves every runtime in the process at the same time: asyncio (and uvloop)
    loops in any number of threads, trio runs, and plain threads blocking in
    :meth:`acquire_sync`. Create it anywhere, including at import time outside any loop.

    Callers get explicit :class:`Token` objects that any task, thread or loop may release.
    Waiters are served strictly first come, first served across all runtimes: a freed slot is
    handed to the oldest waiter in the same step that frees it, and a newcomer never
    overtakes a queued caller. Capacity can change at any time, in both directions.

    This is not a rate limiter (it bounds concurrency, not requests per second) and not a
    lease manager (tokens never expire). For retries, backoff and circuit breaking around
    it, see :class:`anygate.Policy`.

    Args:
        capacity: maximum unreleased tokens; an ``int >= 0``, or ``math.inf`` (the default)
            for no limit. ``0`` pauses admissions until raised.
        name: shown in reprs, statistics and :class:`Busy` messages.

    Raises:
        TypeError: ``capacity`` is not a number (or is a bool), ``name`` is not a string.
        ValueError: ``capacity`` is negative, NaN or a non-integral float.
    """

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
        "_name",
        "_queue",
        "_rejected",
        "_timed_out",
    )

    def __init__(self, capacity: float = math.inf, *, name: str | None = None) -> None:
        cap = _check_capacity(capacity)
        # Typed as object: the check is for callers that are not type-checked, and mypy
        # would otherwise call it unreachable.
        label: object = name
        if label is None:
            label = f"gate-{id(self):x}"
        elif not isinstance(label, str):
            msg = f"name must be a str (got {label!r} of type {type(label).__name__})"
            raise TypeError(msg)
        self._name = label
        self._capacity: float = cap
        # int mirror of capacity so the hot path compares int to int.
        self._limit = _UNLIMITED if cap == math.inf else int(cap)
        self._in_flight = 0
        self._queue: deque[Waiter] = deque()
        self._live = 0  # queued waiters still WAITING; the rest of _queue are GONE
        self._lock = threading.Lock()
        # Work that must not wait for the lock: leaked slots (None) found by Token.__del__
        # and waiters abandoned by an exception, possibly from a finalizer running while
        # this thread holds _lock. Appending is atomic; see _drain for who processes it.
        self._deferred: list[Waiter | None] = []
        self._admitted = 0
        self._rejected = 0
        self._timed_out = 0
        self._cancelled = 0
        self._leaked = 0
        _waiters.ensure_trio_protection()

    # ------------------------------------------------------------------ introspection

    @property
    def name(self) -> str:
        """The gate's name."""
        return self._name

    @property
    def capacity(self) -> float:
        """Maximum unreleased tokens (``math.inf`` when unlimited). Settable at any time.

        Raising it admits queued waiters from the head at once. Lowering it revokes
        nothing: holders finish, and nobody is admitted until ``in_flight`` is below the
        new value. ``0`` pauses admissions.
        """
        return self._capacity

    @capacity.setter
    def capacity(self, value: float) -> None:
        self._set_capacity(value)

    @property
    def in_flight(self) -> int:
        """Unreleased tokens, including slots reserved for waiters that are waking up."""
        return self._in_flight

    @property
    def waiting(self) -> int:
        """Callers queued for a slot."""
        return self._live

    def statistics(self) -> GateStatistics:
        """A consistent snapshot of the gate's state and cumulative counters."""
        if self._deferred:  # count leaks found since the last gate operation
            self._drain()
        with self._lock:
            stats = GateStatistics(
                name=self._name,
                capacity=self._capacity,
                in_flight=self._in_flight,
                waiting=self._live,
                admitted=self._admitted,
                rejected=self._rejected,
                timed_out=self._timed_out,
                cancelled=self._cancelled,
                leaked=self._leaked,
            )
        if self._deferred:
            self._drain()
        return stats

    def __repr__(self) -> str:
        cap = "inf" if self._limit == _UNLIMITED else self._limit
        return f"<anygate.Gate {self._name!r} {self._in_flight}/{cap}, {self._live} waiting>"

    # ------------------------------------------------------------------ acquiring

    def acquire(self, *, timeout: float | None = None) -> _Acquire:
        """Wait for a slot; use as ``await gate.acquire()`` or ``async with gate.acquire()``.

        Args:
            timeout: seconds to wait at most; ``None`` (the default) waits until a slot is
                free or an enclosing cancel scope fires, ``0`` behaves like
                :meth:`acquire_nowait`.

        Returns:
            An awaitable giving a :class:`Token`; as an async context manager it yields the
            token and releases it on exit.

        Raises:
            Busy: no slot within ``timeout`` (raised from the await, not this call).
            TypeError, ValueError: ``timeout`` is not a number, or is negative or NaN.
        """
        if timeout is not None:
            timeout = _check_timeout(timeout)
        frame = _getframe(1)
        return _Acquire(self, timeout, frame.f_code, frame.f_lasti)

    def acquire_nowait(self) -> Token:
        """Take a slot only if one is free and nobody is queued; never waits.

        Raises:
            Busy: the gate is full, or other callers are already waiting.
        """
        if not _waiters.trio_protection_done:  # a sync-only path may be trio's first use
            _waiters.ensure_trio_protection()
        frame = _getframe(1)
        if self._admit():
            return make_token(self, frame.f_code, frame.f_lasti)
        raise self._busy(0.0, rejected=True)

    def acquire_sync(self, *, timeout: float | None = None) -> Token:
        """Block this thread until a slot is free; for plain (non-async) threads.

        The returned token is a context manager: ``with gate.acquire_sync() as token:``.

        Args:
            timeout: as for :meth:`acquire`.

        Raises:
            Busy: no slot within ``timeout``.
            RuntimeError: called on a thread that is running an event loop (it would freeze
                the loop; use ``await gate.acquire()`` there).
            TypeError, ValueError: bad ``timeout``.
        """
        if timeout is not None:
            timeout = _check_timeout(timeout)
        running = _waiters.event_loop_running()
        if running is not None:
            msg = (
                f"Gate.acquire_sync() called on a thread running an event loop ({running}); "
                "it would block the loop. Use `await gate.acquire()` instead"
            )
            raise RuntimeError(msg)
        frame = _getframe(1)
        code, lasti = frame.f_code, frame.f_lasti
        if self._admit():
            return make_token(self, code, lasti)
        if timeout == 0:
            raise self._busy(0.0, rejected=True)
        waiter = _waiters.ThreadWaiter()
        if self._enqueue(waiter):
            return make_token(self, code, lasti)
        granted = False
        try:
            # A timed-out wait can still have been granted just after the timeout: the
            # withdrawal under the lock decides, and a late wake-up of our private lock is
            # harmless because nobody waits on it any more.
            granted = waiter.block(timeout) or not self._withdraw(waiter)
        except BaseException:
            # KeyboardInterrupt (main thread) or another asynchronous exception: leave the
            # queue, or pass on a slot that was already reserved for us (I4).
            if not granted:
                self._abandon(waiter)
            raise
        if granted:
            return make_token(self, code, lasti)
        raise self._busy(timeout or 0.0, timed_out=True)

    @ki_protected
    def _try_fast(self, code: CodeType, lasti: int) -> Token | None:
        """The uncontended path of :meth:`acquire` (I2), after the cancellation check.

        Inlined rather than calling :meth:`_admit`: this is the benchmark's budget, and an
        explicit acquire/release pair costs half of ``with lock:`` on CPython 3.11.
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
        return make_token(self, code, lasti) if admitted else None

    @ki_protected
    async def _wait(self, wait_s: float | None, code: CodeType, lasti: int) -> Token:
        if wait_s == 0:
            raise self._busy(0.0, rejected=True)
        waiter = _waiters.async_waiter()
        if self._enqueue(waiter):  # a slot freed up since the fast path looked
            return make_token(self, code, lasti)
        try:
            if wait_s is None:
                # Returning normally means woken, and only a grant wakes (I2).
                await waiter.park(self._withdraw)
                return make_token(self, code, lasti)
            with anyio.move_on_after(wait_s) as scope:
                await waiter.park(self._withdraw)
        except BaseException:
            self._abandon(waiter)
            raise
        # The timeout fired; a grant can still have won the race. Then the slot is ours and
        # the timeout's own cancellation was absorbed by the scope, so nothing is swallowed.
        if scope.cancelled_caught and self._withdraw(waiter):
            raise self._busy(wait_s, timed_out=True)
        return make_token(self, code, lasti)

    # ------------------------------------------------------------------ locked steps

    @ki_protected
    def _admit(self) -> bool:
        """Fast path: take a slot if nobody is queued and there is room (I2)."""
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

    @ki_protected
    def _release(self, token: Token) -> None:
        """Give ``token``'s slot back (I5): hand it to the head waiter or free it."""
        successor = None
        lock = self._lock
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
    def _set_capacity(self, value: object) -> None:
        cap = _check_capacity(value)
        granted: list[Waiter] = []
        lock = self._lock
        lock.acquire()
        try:
            self._capacity = cap
            self._limit = _UNLIMITED if cap == math.inf else int(cap)
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

    def _reclaim_leaked(self, code: CodeType, lasti: int) -> None:
        """Called from ``Token.__del__``; may run inside this thread's own locked section."""
        self._deferred.append(None)  # None stands for one leaked slot
        self._drain()
        warnings.warn(
            f"an anygate token of gate {self._name!r} acquired at {code_site(code, lasti)} "
            "was garbage-collected without release(); its slot has been reclaimed",
            ResourceWarning,
            stacklevel=2,
        )

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

    def _busy(self, waited: float, *, rejected: bool = False, timed_out: bool = False) -> Busy:
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
        return Busy(gate=self._name, capacity=self._capacity, in_flight=in_flight, waited=waited)


@final
class _Acquire:
    """What :meth:`Gate.acquire` returns: awaitable, and an async context manager."""

    __slots__ = ("_code", "_gate", "_lasti", "_timeout", "_token")

    def __init__(self, gate: Gate, timeout: float | None, code: CodeType, lasti: int) -> None:
        self._gate = gate
        self._timeout = timeout
        self._code = code
        self._lasti = lasti
        self._token: Token | None = None

    @ki_protected
    def __await__(self) -> Generator[Any, None, Token]:
        # A generator rather than a coroutine: one frame fewer on the uncontended path,
        # which is measured against anyio.Semaphore(fast_acquire=True).
        gate = self._gate
        # Checked even when we are about to queue: a grant can complete the wait before
        # anyio delivers a pending cancellation, and acquire() must fail in a cancelled scope.
        yield from _waiters.checkpoint_if_cancelled().__await__()
        # Unlocked hint (I2 is re-checked under the lock): a caller that will queue anyway
        # skips the fast path's lock round trip.
        if not gate._live and gate._in_flight < gate._limit:
            token = gate._try_fast(self._code, self._lasti)
            if token is not None:
                return token
        return (yield from gate._wait(self._timeout, self._code, self._lasti).__await__())

    async def __aenter__(self) -> Token:
        self._token = await self
        return self._token

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        if self._token is not None:
            self._token.release()
