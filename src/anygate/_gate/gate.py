"""Gate: the public admission gate, built on the slot ledger in ``ledger``.

This module is the API and the runtime glue: validating arguments, the three ways to
acquire (awaiting on asyncio or trio, non-blocking, blocking a plain thread), statistics and
repr. Every state change is one of the ledger's locked steps (``slot_steps``,
``budget_steps``, over the state in ``ledger``, where the invariants are listed).

One concern (the public class), about the usual ~500 lines because every public method
carries its full contract in its docstring; the async acquisition and its untimed park
live in ``token`` (the token is its own acquisition), the contended path's park loops and
refusals in ``parking``, argument checks in ``gate_args``, introspection in ``inspect``.
"""

from __future__ import annotations

import math
import sys
import time
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, final

from .._validation import check_name
from . import waiters as _waiters
from .gate_args import (
    MAX_TOKENS,
    check_capacity,
    check_cost,
    check_fast_acquire,
    check_priority,
    check_rate,
    check_timeout,
    check_tokens,
)
from .inspect import QueuedCaller, SlotHolder, holders_of, waiters_of
from .ledger import UNLIMITED
from .parking import Parking
from .token import PENDING, Token, code_site, pending_token
from .waiters import GONE, ki_protected

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import CodeType

    from .acquisition import Acquisition
    from .rate import BudgetMark, Rate, RateStatistics

__all__ = ["Gate", "GateStatistics"]

_getframe = sys._getframe
_INF = math.inf
_new_token = object.__new__
_monotonic = time.monotonic


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
        available: free slots, ``capacity - in_flight`` (never below 0; ``math.inf``
            when unlimited). A free slot is not an admission: queued callers go first, and
            a rate budget may hold the next one back.
        rate: the rate view (budget left, next admission, admitted per window), or
            ``None`` when the gate has no :class:`Rate`.
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
    rate: RateStatistics | None = None
    available: float = 0


@final
class Gate(Parking):
    """A process-wide admission gate: at most ``capacity`` slots held at once, FIFO beyond.

    One gate serves every runtime in the process at the same time: asyncio (and uvloop)
    loops in any number of threads, trio runs, and plain threads blocking in
    :meth:`acquire_sync`. Create it anywhere, including at import time outside any loop.

    Callers get explicit :class:`Token` objects that any task, thread or loop may release.
    Waiters are served strictly first come, first served across all runtimes: a freed slot is
    handed to the oldest waiter in the same step that frees it, and a newcomer never
    overtakes a queued caller. Capacity can change at any time, in both directions.

    With a :class:`Rate`, an admission also needs room in the rate budgets (requests and
    tokens per minute, and the slope bound), in the same FIFO order: the next caller waits
    for slot and budget together and nobody behind it overtakes, however cheap. Callers
    may state a ``priority``: higher classes go first, but the longest-waiting caller is
    overtaken at most three times in a row (see ``docs/rates.md``).

    This is not a lease manager (tokens never expire) and not a provider-side limiter (it
    paces this process only). For retries, backoff and circuit breaking around it, see
    :class:`anygate.Policy`.

    Args:
        capacity: maximum unreleased tokens; an ``int >= 0``, or ``math.inf`` (the default)
            for no limit. ``0`` pauses admissions until raised.
        name: shown in reprs, statistics and :class:`Busy` messages (not empty); default
            ``gate-<id>``.
        rate: a :class:`Rate`, or ``None`` (the default) for no rate limit.
        clock: the monotonic clock in seconds the rate budgets run on; default
            ``time.monotonic``, shared by every runtime. Inject a virtual clock (such as
            ``anyio.current_time`` inside one trio ``MockClock`` run) only when every
            caller waits on that same virtual time; the clock must be cheap and must not
            call into the gate (it is read under the gate's lock).
        fast_acquire: ``False`` (the default): :meth:`acquire` is always a full
            checkpoint, as every async call is on trio and as ``anyio.Semaphore`` is by
            default; an uncontended acquire also lets other tasks run, so a task that
            acquires and releases in a loop cannot starve its peers. ``True``: an
            uncontended acquire is a cancel point but not a schedule point (it never
            yields), like ``anyio.Semaphore(fast_acquire=True)``; cheaper, for code that
            awaits something else between acquires anyway. A wait for a slot is a full
            checkpoint either way. See ``docs/gate.md``.

    Raises:
        TypeError: ``capacity`` is not a number (or is a bool), ``name`` is not a string,
            ``rate`` is not a :class:`Rate`, ``clock`` is not callable, ``fast_acquire``
            is not a bool.
        ValueError: ``capacity`` is negative, NaN or a non-integral float; ``name`` is empty
            or only whitespace.
    """

    __slots__ = ("_fast_acquire", "_name")

    def __init__(
        self,
        capacity: float = math.inf,
        *,
        name: str | None = None,
        rate: Rate | None = None,
        clock: Callable[[], float] | None = None,
        fast_acquire: bool = False,
    ) -> None:
        cap = check_capacity(capacity)
        fast = check_fast_acquire(fast_acquire)
        # One rule for every name (issue 28): empty and whitespace-only names are refused.
        label = f"gate-{id(self):x}" if name is None else check_name("name", name)
        checked = check_rate(rate)
        given: object = clock
        if given is not None and not callable(given):
            msg = f"clock must be a callable returning seconds (got {given!r})"
            raise TypeError(msg)
        self._name = label
        self._fast_acquire = fast
        super().__init__(cap, checked, clock)

    # ------------------------------------------------------------------ introspection

    @property
    def name(self) -> str:
        """The gate's name."""
        return self._name

    @property
    def fast_acquire(self) -> bool:
        """Whether an uncontended :meth:`acquire` skips the schedule point (see the class)."""
        return self._fast_acquire

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
        self._set_limit(check_capacity(value))

    @property
    def rate(self) -> Rate | None:
        """The gate's :class:`Rate`, or ``None``. Settable at any time, from any thread.

        A budget that stays configured keeps its level (units left or owed); a budget that
        appears starts empty; the slope window keeps its history unless ``window_s``
        changes. Whoever can go under the new rate is admitted at once, and the next
        waiter's timer moves to its new admission time.
        """
        budgets = self._budgets
        return None if budgets is None else budgets.rate

    @rate.setter
    def rate(self, value: Rate | None) -> None:
        self._set_rate(check_rate(value))

    @property
    def in_flight(self) -> int:
        """Unreleased tokens, including slots reserved for waiters that are waking up."""
        return self._in_flight

    @property
    def waiting(self) -> int:
        """Callers queued for a slot (or rate budget)."""
        return self._live

    @ki_protected
    def statistics(self) -> GateStatistics:
        """A consistent snapshot of the gate's state and cumulative counters."""
        if self._deferred:  # count leaks found since the last gate operation
            self._drain()
        # Read under the lock, build outside it: an allocation in a locked section can start
        # a collection whose finalizers then run while we hold the lock (see _release).
        # Plain local reads allocate nothing; only a rate view must be built under the lock
        # (its numbers move with the clock), and a release from such a finalizer defers.
        with self._lock:
            capacity = self._capacity
            in_flight = self._in_flight
            waiting = self._live
            admitted = self._admitted
            rejected = self._rejected
            timed_out = self._timed_out
            cancelled = self._cancelled
            leaked = self._leaked
            budgets = self._budgets
            rate = None if budgets is None else budgets.statistics(self._clock())
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
            rate=rate,
            available=_INF if capacity == _INF else max(0, int(capacity) - in_flight),
        )

    def budget_mark(self) -> BudgetMark | None:
        """What the rate budgets have charged so far, stamped with the gate's clock now.

        Take one right after an admission, before the request goes out, and pass it with
        the response's headers (``learn_from_headers(gate, headers, sent=mark)``,
        ``RateLearner.observe(report, sent=mark)``): a provider's ``remaining`` then lowers
        the gate's budgets to what is left, less what this gate charged after the mark
        (the provider may not have counted those yet; see :doc:`learning`). Thread-safe.

        Returns:
            a :class:`~anygate.BudgetMark`, or ``None`` when the gate has no rate budget
            of its own (none, or a :class:`~anygate.fleet.FleetGate`'s, which Redis
            keeps) or its clock cannot be read now (a virtual clock outside its run).
        """
        return self._budget_mark()

    @property
    def available(self) -> float:
        """Free slots: ``capacity - in_flight``, never below 0 (``math.inf`` if unlimited).

        A free slot does not mean the next ``acquire()`` is admitted at once: queued
        callers go first, and a rate budget may hold the next one back.
        """
        capacity, in_flight = self._capacity, self._in_flight
        return _INF if capacity == _INF else max(0, int(capacity) - in_flight)

    def holders(self) -> tuple[SlotHolder, ...]:
        """Who holds the slots: one :class:`SlotHolder` per unreleased token, oldest first.

        For debugging a stuck slot (where was it acquired, how long ago), not for a metrics
        loop: the gate keeps no list of its tokens (a list would cost every acquire and
        release, and keep leaked tokens alive), so this walks the garbage collector's
        objects, O(size of the heap) -- milliseconds in a large process. Tokens that are
        unreachable garbage not yet collected are included: they still hold their slots.
        :meth:`statistics` stays a few counter reads.

        The records keep their tokens alive (``SlotHolder.token``): drop them when done.
        """
        return holders_of(self)

    def waiters(self) -> tuple[QueuedCaller, ...]:
        """The queued callers, one :class:`QueuedCaller` each, with how long they have waited.

        Highest priority class first, oldest first within a class (the overtaking bound
        may let an older caller of a lower class go sooner). One locked step, O(waiters).
        """
        return waiters_of(self)

    def __repr__(self) -> str:
        cap = "inf" if self._limit == UNLIMITED else self._limit
        return f"<anygate.Gate {self._name!r} {self._in_flight}/{cap}, {self._live} waiting>"

    # ------------------------------------------------------------------ acquiring

    def acquire(
        self,
        *,
        timeout: float | None = None,
        tokens: int | None = None,
        priority: int = 0,
        output_tokens: int | None = None,
    ) -> Acquisition:
        """Wait for a slot; use as ``await gate.acquire()`` or ``async with gate.acquire()``.

        Args:
            timeout: seconds to wait at most; ``None`` (the default) waits until a slot is
                free or an enclosing cancel scope fires, ``0`` behaves like
                :meth:`acquire_nowait`. With a rate, a caller whose earliest admission
                lies beyond the timeout fails with :class:`Busy` at once.
            tokens: the call's token cost for the rate's ``tokens_per_minute`` (an
                estimate; correct it with :meth:`Token.settle`). ``None`` charges 0 now:
                the cost is then charged when settled, and later callers wait out the debt.
            priority: the caller's class; higher classes go first (default 0).
            output_tokens: the output part of ``tokens`` (typically the request's
                ``max_tokens``), for a rate's ``output_tokens_per_minute``; the rest,
                ``tokens - output_tokens``, is the input part charged to
                ``input_tokens_per_minute``. ``None`` = 0 (the whole cost is input);
                with ``tokens=None`` the total is ``output_tokens``. Settle both parts
                with ``Token.settle(tokens=..., output_tokens=...)``.

        Returns:
            An awaitable giving a :class:`Token`; as an async context manager it yields the
            token and releases it on exit.

        Raises:
            Busy: no slot (or budget) within ``timeout`` (raised from the await, not this
                call); ``retry_after_s`` says when the budget would admit it.
            TypeError, ValueError: a bad ``timeout``, ``tokens`` (negative, above one
                minute's token budget), ``output_tokens`` (negative, above ``tokens`` or
                one minute of its budget) or ``priority``.
        """
        if timeout is not None:
            timeout = check_timeout(timeout)
        out = 0
        if output_tokens is not None:
            cost, out = check_cost(tokens, output_tokens, self)
        elif tokens is None:
            cost = 0
        else:
            budgets = self._budgets
            # The common valid case in one line (a function call costs a tenth of the
            # rate path's budget), against an int limit (gate_args.max_cost); anything
            # else gets the full check and its message.
            if type(tokens) is int and 0 <= tokens <= (
                MAX_TOKENS if budgets is None else budgets.max_tokens
            ):
                cost = tokens
            else:
                cost = check_tokens(tokens, self)
        if priority:
            priority = check_priority(priority)
        frame = _getframe(1)
        # The token to be, not yet admitted (see _token), built here: a call fewer.
        token: Token = _new_token(Token)
        token._gate = None
        token._home = self
        token._code = frame.f_code
        token._lasti = frame.f_lasti
        token._cost = cost
        if out:
            token._out = out
        token._timeout = timeout
        token._priority = priority
        token._since = PENDING  # _seen is set at admission (Token.in_flight_at_admission)
        return token  # type: ignore[return-value]  # pyright: ignore[reportReturnType]

    @ki_protected
    def acquire_nowait(
        self, *, tokens: int | None = None, priority: int = 0, output_tokens: int | None = None
    ) -> Token:
        """Take a slot only if one is free, the budget allows it and nobody queued is ahead.

        Args:
            tokens, priority, output_tokens: as for :meth:`acquire`.

        Raises:
            Busy: the gate is full, the budget is spent, or other callers are ahead.
            TypeError, ValueError: bad ``tokens``, ``output_tokens`` or ``priority``.
        """
        if not _waiters.trio_protection_done:  # a sync-only path may be trio's first use
            _waiters.ensure_trio_protection()
        out = 0
        if output_tokens is not None:
            cost, out = check_cost(tokens, output_tokens, self)
        else:
            cost = 0 if tokens is None else check_tokens(tokens, self)
        if priority:
            priority = check_priority(priority)
        frame = _getframe(1)
        # Marked held by the admitting step itself, as in acquire_sync: no step between
        # admission and the caller where a slot is held by nobody.
        token = pending_token(self, frame.f_code, frame.f_lasti, cost)
        if out:
            token._out = out
        if self._admit(cost, priority, token):
            token._seen = self._in_flight
            token._since = _monotonic()
            return token
        raise self._refusal(cost, priority)

    def acquire_sync(
        self,
        *,
        timeout: float | None = None,
        tokens: int | None = None,
        priority: int = 0,
        output_tokens: int | None = None,
    ) -> Token:
        """Block this thread until a slot is free; for plain (non-async) threads.

        The returned token is a context manager: ``with gate.acquire_sync() as token:``.

        Args:
            timeout, tokens, priority, output_tokens: as for :meth:`acquire`.

        Raises:
            Busy: no slot (or budget) within ``timeout``.
            RuntimeError: called on a thread that is running an event loop (it would freeze
                the loop; use ``await gate.acquire()`` there).
            TypeError, ValueError: bad ``timeout``, ``tokens``, ``output_tokens`` or
                ``priority``.
        """
        if timeout is not None:
            timeout = check_timeout(timeout)
        out = 0
        if output_tokens is not None:
            cost, out = check_cost(tokens, output_tokens, self)
        else:
            cost = 0 if tokens is None else check_tokens(tokens, self)
        if priority:
            priority = check_priority(priority)
        running = _waiters.event_loop_running()
        if running is not None:
            msg = (
                f"Gate.acquire_sync() called on a thread running an event loop ({running}); "
                "it would block the loop. Use `await gate.acquire()` instead"
            )
            raise RuntimeError(msg)
        frame = _getframe(1)
        # The token is built before admission and the locked step that admits marks it
        # held (issue 26, item 7): admitting first and wrapping after left a window, a
        # KeyboardInterrupt at make_token's entry, where the slot was held by nobody, for
        # good. Now every step of the slot's way is recorded under the gate's lock (on
        # the token, or on the waiter's state), and the handler below reads it there.
        token = pending_token(self, frame.f_code, frame.f_lasti, cost)
        if out:
            token._out = out
        waiter: _waiters.ThreadWaiter | None = None
        try:
            if self._admit(cost, priority, token):
                token._seen = self._in_flight
                token._since = _monotonic()
                return token
            if timeout == 0:
                raise self._refusal(cost, priority)
            waiter = _waiters.ThreadWaiter()  # GONE until the queueing step queues it
            waiter.tokens, waiter.priority = cost, priority
            if out:
                waiter.out = out
            if not self._enqueue(waiter, timeout) and not self._block(waiter, timeout):
                raise self._busy(timeout or 0.0, timed_out=True)
            token._gate = self  # the granted waiter's slot is the token's from here on
            token._seen = waiter.seen  # as granted (see parking)
            token._since = waiter.since
            return token
        except BaseException:
            # KeyboardInterrupt (main thread), another asynchronous exception, or our own
            # Busy: give back a slot the token holds, else leave the queue or pass on a
            # slot that was already reserved for the waiter (I4). Both are exclusive: the
            # token holds a slot only once the waiter's grant has moved to it.
            if token._gate is not None:
                token.release()
            elif waiter is not None and waiter.state != GONE:
                self._abandon(waiter)
            raise

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
