"""Token: proof of one admitted slot, releasable once from any task, thread or event loop.

A token is also what :meth:`Gate.acquire` returns, before it is admitted: awaiting or
entering it is the acquisition (``__aenter__``), so the ``async with gate.acquire()`` path
builds one object, not an acquisition object and then a token (benchmark a). Its life:

* **pending** (``_since == PENDING``): made by ``acquire()``, not yet awaited or entered;
* **acquiring** (``_since == ACQUIRING``): being awaited or entered; a second wait on
  it (or one after its wait failed) is an error, never a second slot behind one token;
* **held** (``_gate`` set, ``_since`` the admission time): counted in ``in_flight``;
* **released** (``_gate`` None, ``_since >= 0``): given back, once.

Awaiting or entering a held token again gives it back as is. The uncontended admission
and release are the ledger's common cases spelled out here (``SlotSteps._admit`` and
``SlotSteps._release``; the invariants I2 and I5 live there), and so is the contended
path's common case, one park ended by a grant (``Parking._park`` and ``Parking._wait`` do
the rest): a call or a coroutine fewer on each path the benchmarks measure (a and b).

Here: what changes a token (the acquisition, the release, settle, the finalizer) and the
gate's constructors of tokens. Its fields, read-only properties, refusals to be copied or
pickled, repr and :func:`code_site` are :mod:`anygate._gate.token_state`'s.
"""

from __future__ import annotations

import sys
import time
import types
import weakref
from asyncio import _get_running_loop
from typing import TYPE_CHECKING, Any, cast, final

from anyio.lowlevel import checkpoint as _anyio_checkpoint

from . import cancel_state as _cancel_state
from . import waiters as _waiters
from .cycles import defer as _judged_later
from .gate_args import check_output_tokens
from .token_state import TokenState
from .token_state import code_site as code_site
from .waiters import GONE, GRANTED, ki_protected

if TYPE_CHECKING:
    from collections.abc import Awaitable, Generator
    from types import CodeType, TracebackType

    from typing_extensions import Self

    from .gate import Gate

__all__ = ["Token"]

_INF = float("inf")
_modules = sys.modules
_ref = weakref.ref

#: ``Token._since`` of an acquisition not yet awaited or entered.
PENDING = -1.0
#: ``Token._since`` of an acquisition being awaited (or one whose wait failed).
ACQUIRING = -2.0


@final
class Token(TokenState):
    """One admitted slot of a :class:`Gate`.

    A token is created only by a gate (``acquire``, ``acquire_nowait``, ``acquire_sync``).
    Unlike ``anyio.CapacityLimiter``, it is not bound to the task that acquired it: hand it to
    another task, thread or event loop and release it there. :meth:`release` is synchronous,
    never awaits (so no cancellation can interrupt it halfway) and idempotent, so several
    cleanup paths may all call it and the first one wins.

    A token is also a context manager, sync and async; leaving the block releases it.

    A token that is garbage-collected unreleased gives its slot back and emits a
    :class:`ResourceWarning` naming the gate and the ``file:line`` that acquired it. Treat
    that as a bug report, not a feature: collection may happen much later than the work.

    This is not a lease: it has no expiry, and the gate never revokes it.
    """

    __slots__ = ()  # no __dict__: the fields are TokenState's, one set of slots

    # Annotated None, not NoReturn: with NoReturn mypy types the class itself as a callable
    # returning Never and rejects object.__new__(Token) in make_token.
    def __init__(self, *args: object, **kwargs: object) -> None:
        self._gate = None  # the half-built object is still finalized: keep __del__ quiet
        msg = "Token has no public constructor; obtain one from Gate.acquire() and friends"
        raise TypeError(msg)

    def release(self) -> None:
        """Give the slot back. Safe from any task or thread; a second call does nothing.

        Releasing never refunds rate budget: the request was made. Use :meth:`settle` to
        correct the token charge.
        """
        gate = self._gate
        if gate is not None:
            gate._release(self)

    def settle(self, *, tokens: int, output_tokens: int | None = None) -> None:
        """State the call's real token cost; the gate charges or refunds the difference.

        The token's charge *becomes* ``tokens``: the difference from what was charged so
        far (``acquire(tokens=)``, or an earlier settle) is applied exactly once, so
        settling twice with the same value changes nothing and nothing is ever refunded
        twice. A refund wakes whoever can now go. Safe from any task or thread, and also
        after :meth:`release` (usage often arrives with the end of a stream); it only
        touches the token budget, never the slot. Without a token rate on the gate it only
        records the value.

        With split budgets (``Rate(input_tokens_per_minute=..., output_tokens_per_minute=...)``)
        the output part becomes ``output_tokens`` and the input part ``tokens -
        output_tokens``, each charged or refunded against its own budget: settle an
        admission that stated ``max_tokens`` as its output part to the tokens generated.

        Args:
            tokens: the call's total tokens (e.g. ``usage.total_tokens``), an int >= 0.
            output_tokens: the output part of ``tokens`` (e.g. Anthropic's
                ``usage.output_tokens``), an int in ``[0, tokens]``; ``None`` keeps the
                output part stated so far (at most ``tokens``).

        Raises:
            TypeError: ``tokens`` or ``output_tokens`` is not an int (bools are rejected).
            ValueError: ``tokens`` is negative or above 2**53, or ``output_tokens`` is
                negative or above ``tokens``. The gate is unchanged.
        """
        value: object = tokens
        if isinstance(value, bool) or not isinstance(value, int):
            msg = f"tokens must be an int >= 0 (got {value!r} of type {type(value).__name__})"
            raise TypeError(msg)
        if not 0 <= value <= 2**53:
            msg = f"tokens must be >= 0 and <= 2**53 (got {value!r})"
            raise ValueError(msg)
        out = None if output_tokens is None else check_output_tokens(output_tokens, value)
        if self._since < 0.0:
            msg = "settle() needs an admitted token; await or enter gate.acquire() first"
            raise RuntimeError(msg)
        self._home._settle(self, value, out)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        self.release()

    if not TYPE_CHECKING:  # typed as Acquisition (Gate.acquire); a held token is not awaitable

        def __await__(self) -> Generator[Any, None, Token]:
            return self.__aenter__().__await__()

    @ki_protected
    async def __aenter__(self) -> Self:
        """Admit a pending acquisition (``async with gate.acquire()``); a held token as is.

        ``async with token:`` on a token already held (``token = await gate.acquire()``)
        only releases it at the end of the block, as before.
        """
        if self._since != PENDING:  # one compare on the fast path for both other states
            return self._entered_again()
        self._since = ACQUIRING
        gate = self._home
        # The cancel point comes first, before any slot is taken: an acquire in an
        # already-cancelled scope gets nothing, even a free slot (and a grant could
        # otherwise complete a wait before anyio delivers a pending cancellation).
        # _waiters.cancellation_check() spelled out for the two guarded private reads
        # (_cancel_state): the calls were a third of the fast pair on asyncio. Whatever
        # the guard has not trusted (yet) takes the function, which asks the public APIs.
        local = _waiters._sniffio_local
        loop = None  # the running asyncio loop, once the private read below has it
        if local is not None and local.name == "trio":
            context = _cancel_state.trio_context
            if context is not None:
                task = context.task
                if task._cancel_status.effectively_cancelled or task._runner.ki_pending:
                    await _waiters.trio_checkpoint_if_cancelled()  # raises it (or passes)
                else:
                    task._cancel_points += 1  # counted as trio's own check counts it
            elif _cancel_state.trio_pending():  # the first question, or the public path
                # trio's own check, asked directly (as trio_checkpoint_if_cancelled() does,
                # a call fewer on the public path): trio is imported, since _sniffio_local
                # is set only once _waiters._find_trio has cached trio's pieces.
                await _waiters._trio_lowlevel.checkpoint_if_cancelled()
        elif (
            (states_get := _cancel_state.states_get) is not None
            and (local is not None or "trio" not in _modules)  # else: maybe trio's first use
            and (loop := _get_running_loop()) is not None
        ):
            global _held_ref  # a one-entry cache, see _held_ref
            task = _cancel_state.task_of(loop)
            if task is not None:
                # Not kept in a local: the frame of a task that parks below would keep its
                # reference alive (80 B per queued waiter, benchmark d).
                if _held_ref() is not task:
                    _held_ref = _ref(task)
                state = states_get(_held_ref)
                if state is not None:  # a task anyio never saw has no anyio cancel scope
                    scope = state.cancel_scope
                    while scope is not None:  # as current_effective_deadline() walks them
                        if scope._cancel_called:
                            await _anyio_checkpoint()  # raises the pending cancellation
                            break
                        if scope._shield:
                            break
                        scope = scope._parent_scope
        else:
            check = _waiters.cancellation_check()
            if check is not None:
                await check  # raises the pending cancellation
        # Unlocked hint (I2 is re-checked under the lock): a caller that will queue anyway
        # skips the fast path's lock round trip, and its park is the schedule point.
        if not gate._live and gate._in_flight < gate._limit:
            # SlotSteps._admit's common case (nobody queued, a slot free), inline, with a
            # rate's budgets asked in the same locked step: a second lock round trip and
            # the call to _admit were a third of a rate's cost (benchmark e). ``admitted``:
            # True or False when answered here (admitted, or refused by the budget); None
            # for anything else (someone queued, whom a priority may overtake; split
            # budgets), which takes _admit. Admitted here, the token is marked held in the
            # same locked step, as _admit(token=) does (I1), and ``_seen`` is the count
            # just after this admission (before the yield, which lets others in).
            lock = gate._lock
            lock.acquire()
            try:
                admitted: bool | None
                # Read again: another thread may have changed them since the hint.
                if gate._live or gate._in_flight >= gate._limit:  # type: ignore[redundant-expr]
                    admitted = None
                elif (budgets := gate._budgets) is None or (
                    not budgets.split  # else: the output part's path, in _admit
                    and budgets.try_take(gate._clock(), self._cost)
                ):
                    gate._in_flight += 1
                    gate._admitted += 1
                    self._gate = gate
                    self._seen = gate._in_flight
                    admitted = True
                else:
                    admitted = None if budgets.split else False
            finally:
                lock.release()
                if gate._deferred:
                    gate._drain()
            if admitted or (
                admitted is None and gate._admit(self._cost, self._priority, None, self)
            ):
                if not admitted:  # admitted by _admit, which leaves the token to us
                    self._gate = gate
                    self._seen = gate._in_flight
                self._since = _monotonic()
                if not gate._fast_acquire:
                    # Slot first, then the schedule point (issue 26, item 3): yielding
                    # before admission let callers that arrived together be admitted in
                    # whatever order the scheduler resumed them, not the order they called.
                    try:
                        await _waiters.schedule_point()
                    except BaseException:
                        self._give_back()
                        raise
                return self
        if self._timeout is not None:
            await gate._wait(self)  # the gate's timed wait
            return self
        # Queue and park with no timeout: the contended path (benchmark b), inline down to
        # the common case, one park ended by a grant; anything else (a rate budget's timer,
        # a nudge) continues in Parking._park.
        # On asyncio the loop is known from the cancel point: the waiter is built for it
        # (and parks on its future) without asking again.
        waiter = _waiters.async_waiter() if loop is None else _waiters.asyncio_waiter(loop)
        if self._cost or self._priority:  # both 0 in a new waiter
            waiter.tokens = self._cost
            waiter.priority = self._priority
            # The output part, stated only with a cost (see ledger.token_out);
            # contextlib.suppress would cost a call on this path.
            try:  # noqa: SIM105
                waiter.out = self._out
            except AttributeError:
                pass
        if gate._enqueue(waiter):  # a slot freed up since we looked
            await gate._admitted_at_once(self)
            return self
        if waiter.state == GONE:  # turned away without queueing (a fleet gate in an outage)
            raise gate._busy(0.0, timed_out=True, due=waiter.due)
        try:
            if waiter.due == _INF:
                if loop is None:
                    await waiter.park(gate._interrupt)
                else:
                    await waiter.future  # type: ignore[union-attr]  # AsyncioWaiter.park
                if waiter.state != GRANTED:
                    await gate._park(waiter, woken=True)
            else:  # next on a rate budget: a timed park first
                await gate._park(waiter, woken=False)
        except BaseException:
            # Cancelled (or the loop is going away): leave the queue, or pass on a slot
            # that was granted meanwhile (I4).
            if waiter.state != GONE:
                gate._abandon(waiter)
            raise
        self._gate = gate
        self._seen = waiter.seen  # as granted: a batch granted with it is counted by now
        self._since = waiter.since
        return self

    def _entered_again(self) -> Self:
        """``__aenter__`` off the fast path's state: a held token as is; an acquisition
        already being awaited (or whose wait failed) is refused."""
        if self._since >= 0.0:
            return self
        msg = (
            "this gate.acquire() is already being awaited (or its wait failed); "
            "each acquisition is awaited or entered once: call gate.acquire() again"
        )
        raise RuntimeError(msg)

    def _give_back(self) -> None:
        """The acquire failed after its slot was taken (cancelled at the schedule point that
        follows admission): free the slot, and leave the acquisition failed, not released,
        so that awaiting it again raises instead of handing out a released token."""
        self.release()
        self._since = ACQUIRING

    @ki_protected
    def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> Awaitable[None]:
        # A plain function returning a finished awaitable: the exit never yields (release
        # never awaits, and neither anyio's nor trio's semaphores checkpoint on exit), and
        # awaiting _DONE (an exhausted generator) costs less than making and running a
        # coroutine per exit (benchmark a).
        gate = self._gate
        if gate is None:
            return _DONE
        # SlotSteps._release's common case (nobody queued: the slot is only freed), inline.
        # A waiter to hand it to (seen before locking, or under the lock), or the lock
        # taken (maybe by a finalizer running on this very thread), takes the full path.
        lock = gate._lock
        # locked() then a blocking acquire(), not acquire(False): the argument costs a
        # tuple and a parse per call. Between the two only another thread can take the
        # lock (nothing on this thread runs there that keeps it), and then we just wait.
        if not gate._live and not lock.locked():
            lock.acquire()
            try:
                # ``_gate`` is this gate or None (released meanwhile by another thread,
                # which _release below then finds and leaves alone).
                if self._gate is gate and not gate._live:
                    self._gate = None
                    gate._in_flight -= 1
                    return _DONE
            finally:
                lock.release()
                if gate._deferred:
                    gate._drain()
        gate._release(self)
        return _DONE

    def __del__(self) -> None:
        # __del__ rather than weakref.finalize: a finalizer per token costs 1-3 us at
        # creation, __del__ costs nothing until collection. The gate defers the actual
        # release because this may run while this very thread holds the gate's lock.
        # Finalized by a collection, it is judged when the collection ends: in a garbage
        # cycle the object that owns it may be finalized after it and release it then
        # (issue 27, cycles.py). Otherwise cleared first, so a release still to come is a
        # no-op, not a second give-back of the same slot.
        try:
            gate = self._gate
        except AttributeError:  # interrupted before its first field was set: holds nothing
            return
        if gate is not None and not _judged_later(self):
            self._gate = None
            gate._reclaim_leaked(self._code, self._lasti)


_new_token = object.__new__
_monotonic = time.monotonic


def _finished() -> Generator[None, None, None]:
    """Nothing to do; made awaitable below (``types.coroutine``), and :data:`_DONE` is one
    of its generators, run to its end."""
    yield from ()


types.coroutine(_finished)  # documented to mark a generator function in place: awaitable

#: What ``Token.__aexit__`` returns: an exhausted generator-based coroutine. Awaiting it
#: sends ``None`` to a finished generator, which returns ``None`` at once (the language's
#: rule for a generator that has ended, unlike a native coroutine's "cannot reuse"), on
#: any runtime: it never yields, so trio never sees it, and it allocates nothing. A
#: resolved asyncio future did the same with an iterator made and freed per exit, and a
#: coroutine would be made, run and freed per exit (benchmark a).
_exhausted = _finished()
for _ in _exhausted:  # run to its end, once
    pass
_DONE = cast("Awaitable[None]", _exhausted)

#: A weak reference to the last task whose cancel scopes the fast path looked up on
#: asyncio: anyio's task states are keyed by weak references, and while one to this task
#: is held, the lookup for the same task needs no new one (CPython hands back the existing
#: plain reference; allocating and hashing a fresh one per acquire cost ~20 ns more).
#: Checked with ``held() is task`` before use; a dead or other task's reference is
#: replaced. Keeps no task alive.
_held_ref: weakref.ref[Any] = _ref(_finished)


def make_token(gate: Gate, code: CodeType, lasti: int, cost: int = 0) -> Token:
    """Create a held token; only gates call this."""
    token: Token = _new_token(Token)
    token._gate = token._home = gate
    token._code = code
    token._lasti = lasti
    token._cost = cost
    token._timeout = None
    token._priority = 0
    token._seen = gate._in_flight
    token._since = _monotonic()
    return token


def pending_token(gate: Gate, code: CodeType, lasti: int, cost: int) -> Token:
    """A token being acquired (``ACQUIRING``), not admitted yet; the locked step that
    admits it marks it held (``SlotSteps._admit(token=)``), so that no step between
    admission and the caller leaves a slot held by nobody (``Gate.acquire_sync``)."""
    token: Token = _new_token(Token)
    token._gate = None
    token._home = gate
    token._code = code
    token._lasti = lasti
    token._cost = cost
    token._timeout = None
    token._priority = 0
    token._seen = 0
    token._since = ACQUIRING
    return token
