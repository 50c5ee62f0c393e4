"""Gate: the public admission gate, built on the slot ledger in ``_ledger``.

This module is the API and the runtime glue: validating arguments, the three ways to
acquire (awaiting on asyncio or trio, non-blocking, blocking a plain thread), statistics and
repr. Every state change is one of the ledger's locked steps, where the invariants live.
"""

from __future__ import annotations

import math
import sys
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, final

import anyio

from . import _waiters
from ._errors import Busy
from ._ledger import UNLIMITED, Ledger
from ._token import code_site, make_token
from ._validation import FLOAT_MAX, MAX_COUNT, check_int, check_number, show
from ._waiters import ki_protected

if TYPE_CHECKING:
    from collections.abc import Generator
    from types import CodeType, TracebackType

    from ._token import Token

__all__ = ["Gate", "GateStatistics"]

_getframe = sys._getframe


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
    """An ``int >= 0`` (at most ``MAX_COUNT``), a whole float, or ``math.inf``."""
    if type(value) is int and 0 <= value <= MAX_COUNT:
        return value
    allowed = "an int >= 0 or math.inf"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        msg = f"capacity must be {allowed} (got {show(value)} of type {type(value).__name__})"
        raise TypeError(msg)
    if isinstance(value, float):
        if value == math.inf:
            return math.inf
        if math.isnan(value):
            msg = f"capacity must be {allowed} (got {value!r})"
            raise ValueError(msg)
        if value < 0:
            msg = f"capacity must be >= 0 (got {value!r})"
            raise ValueError(msg)
        if not value.is_integer():
            msg = f"capacity must be a whole number (got {value!r})"
            raise ValueError(msg)
        if value > MAX_COUNT:
            msg = f"capacity must be <= {MAX_COUNT} (math.inf: no limit) (got {value!r})"
            raise ValueError(msg)
        return int(value)
    checked = check_int("capacity", value, minimum=0)
    assert checked is not None
    return checked


def _check_timeout(value: object) -> float | None:
    # No upper bound short of overflow: the waiters cap a wait at threading.TIMEOUT_MAX.
    seconds = check_number("timeout", value, none=True, infinite=True, maximum=FLOAT_MAX)
    return None if seconds == math.inf else seconds


@final
class Gate(Ledger):
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

    __slots__ = ("_name",)

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
        super().__init__(cap)

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
        self._set_limit(_check_capacity(value))

    @property
    def in_flight(self) -> int:
        """Unreleased tokens, including slots reserved for waiters that are waking up."""
        return self._in_flight

    @property
    def waiting(self) -> int:
        """Callers queued for a slot."""
        return self._live

    @ki_protected
    def statistics(self) -> GateStatistics:
        """A consistent snapshot of the gate's state and cumulative counters."""
        if self._deferred:  # count leaks found since the last gate operation
            self._drain()
        # Read under the lock, build outside it: an allocation in a locked section can start
        # a collection, and finalizers then run while we hold the lock (see _release).
        # Plain local reads allocate nothing.
        with self._lock:
            capacity = self._capacity
            in_flight = self._in_flight
            waiting = self._live
            admitted = self._admitted
            rejected = self._rejected
            timed_out = self._timed_out
            cancelled = self._cancelled
            leaked = self._leaked
        if self._deferred:
            self._drain()
        return GateStatistics(
            name=self._name,
            capacity=capacity,
            in_flight=in_flight,
            waiting=waiting,
            admitted=admitted,
            rejected=rejected,
            timed_out=timed_out,
            cancelled=cancelled,
            leaked=leaked,
        )

    def __repr__(self) -> str:
        cap = "inf" if self._limit == UNLIMITED else self._limit
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

    @ki_protected
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

    def _try_fast(self, code: CodeType, lasti: int) -> Token | None:
        """The uncontended path of :meth:`acquire`, after the cancellation check."""
        return make_token(self, code, lasti) if self._admit() else None

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

    # ------------------------------------------------------------------ reporting

    def _reclaim_leaked(self, code: CodeType, lasti: int) -> None:
        """Called from ``Token.__del__``; may run inside this thread's own locked section."""
        self._reclaim()
        warnings.warn(
            f"an anygate token of gate {self._name!r} acquired at {code_site(code, lasti)} "
            "was garbage-collected without release(); its slot has been reclaimed",
            ResourceWarning,
            stacklevel=2,
        )

    def _busy(self, waited: float, *, rejected: bool = False, timed_out: bool = False) -> Busy:
        in_flight = self._count_refusal(rejected=rejected, timed_out=timed_out)
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
        # A generator that usually never yields: the uncontended path is measured against
        # anyio.Semaphore(fast_acquire=True), so it avoids awaiting anything at all.
        gate = self._gate
        # Checked even when we are about to queue: a grant can complete the wait before
        # anyio delivers a pending cancellation, and acquire() must fail in a cancelled scope.
        check = _waiters.cancellation_check()
        if check is not None:
            yield from check.__await__()  # raises a pending cancellation
        # Unlocked hint (I2 is re-checked under the lock): a caller that will queue anyway
        # skips the fast path's lock round trip.
        if not gate._live and gate._in_flight < gate._limit:
            token = gate._try_fast(self._code, self._lasti)
            if token is not None:
                return token
        return (yield from gate._wait(self._timeout, self._code, self._lasti).__await__())

    @ki_protected
    async def __aenter__(self) -> Token:
        # The steps of __await__ spelled out: delegating to it would cost a generator.
        gate = self._gate
        check = _waiters.cancellation_check()
        if check is not None:
            await check
        token = None
        if not gate._live and gate._in_flight < gate._limit:
            token = gate._try_fast(self._code, self._lasti)
        if token is None:
            token = await gate._wait(self._timeout, self._code, self._lasti)
        self._token = token
        return token

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        if self._token is not None:
            self._token.release()
