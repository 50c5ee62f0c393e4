"""How a parked caller is woken. The only module that knows which runtime is running.

A waiter is created only when a caller actually has to wait (the uncontended path never
touches this module beyond the cancellation check). The gate decides *who* gets a slot under
its lock and marks that waiter ``GRANTED``; it then calls :meth:`Waiter.wake` *outside* the
lock. ``wake`` returns ``False`` when the waiter can never resume (its event loop closed or its
trio run finished), and the gate passes the reserved slot on.

Three kinds share that contract:

* asyncio (and uvloop): a loop future. Same thread: resolve it directly. Other thread:
  ``loop.call_soon_threadsafe``, which raises ``RuntimeError`` once the loop is closed.
* trio: ``wait_task_rescheduled`` with an abort callback. Same thread: ``reschedule``. Other
  thread: ``TrioToken.run_sync_soon``, which raises ``RunFinishedError`` after the run.
* threads: a pre-acquired ``threading.Lock`` used as a one-shot event (cheaper than
  ``threading.Event``, which wraps a Condition).

The record they share (:class:`Waiter`) and its states (``WAITING``, ``GRANTED``, ``GONE``,
``DEAD``) live in :mod:`anygate._gate.waiter_state`, which knows no runtime; they are
re-imported here.

``anyio.from_thread.run_sync(..., token=)`` is deliberately not used for wake-ups: it blocks
until the callback has run, which deadlocks when the releaser is the loop's own thread.
"""

from __future__ import annotations

import asyncio
import math
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Generator
from typing import TYPE_CHECKING, Any, TypeVar

import anyio.lowlevel

from . import cancel_state as _cancel_state
from .waiter_state import DEAD as DEAD
from .waiter_state import GONE as GONE
from .waiter_state import GRANTED as GRANTED
from .waiter_state import WAITING as WAITING
from .waiter_state import Waiter as Waiter
from .waiter_state import waiter_out as waiter_out

if TYPE_CHECKING:
    from types import FrameType

_F = TypeVar("_F", bound=Callable[..., Any])

_get_ident = threading.get_ident
_monotonic = time.monotonic
_get_running_loop = asyncio._get_running_loop
_modules = sys.modules

_trio: Any = None
_trio_lowlevel: Any = None
_trio_run_finished: Any = None
_sniffio_local: Any = None


def _find_trio() -> Any:
    """Cache trio's pieces once something else has imported trio (we never import it).

    Returns sniffio's thread-local (``None`` while trio is not imported).
    """
    global _trio, _trio_lowlevel, _trio_run_finished, _sniffio_local
    if "trio" not in sys.modules:
        return None
    import sniffio  # a dependency of trio
    import trio.lowlevel

    _trio = trio
    _trio_run_finished = trio.RunFinishedError
    _trio_lowlevel = trio.lowlevel
    _sniffio_local = sniffio.thread_local
    ensure_trio_protection()
    return _sniffio_local


def _in_trio() -> bool:
    """Is this thread inside a trio run right now (guest-mode ticks included)?

    Trio sets ``sniffio.thread_local.name`` to ``"trio"`` for exactly the time it runs
    tasks on this thread: a thread-local read, far cheaper than ``in_trio_run()`` (which
    raises and swallows an AttributeError outside a run). In trio's guest mode on an
    asyncio host, ``asyncio._get_running_loop()`` also answers inside trio tasks, so trio
    must be asked first.
    """
    local = _sniffio_local or _find_trio()
    return local is not None and local.name == "trio"


def trio_checkpoint_if_cancelled() -> Awaitable[None]:
    """trio's ``checkpoint_if_cancelled()`` (trio is imported lazily, see :func:`_find_trio`)."""
    check: Awaitable[None] = _trio_lowlevel.checkpoint_if_cancelled()
    return check


def cancellation_check() -> Awaitable[None] | None:
    """What to await to honour a cancellation already pending, or ``None`` if there is none.

    This is the uncontended acquire's cancel point, and asked through the public APIs it
    would be half of that path's budget, so the question "is one pending?" is answered from
    the runtime's own state behind a guard (``cancel_state``); only when the answer is yes
    is the public checkpoint awaited, which raises it (trio's ``checkpoint_if_cancelled``,
    anyio's ``checkpoint``). Trio is recognised by a thread-local read (see
    :func:`_in_trio`), asyncio by ``_get_running_loop()``.
    """
    # _in_trio() inline: this is the hot path (no call at all while trio is not imported).
    local = _sniffio_local or ("trio" in _modules and _find_trio())
    if local and local.name == "trio":
        context = _cancel_state.trio_context
        if context is not None:
            # _cancel_state's guarded read, inline (a call is a third of this function): no
            # cancellation and no Ctrl-C pending. A Ctrl-C pending for another task than
            # the main one only makes us await trio's own check, which then passes. The
            # cancel point is counted as trio's own check counts it, so trio.testing's
            # assert_checkpoints() / assert_no_checkpoints() see the acquire as before.
            task = context.task
            if not (task._cancel_status.effectively_cancelled or task._runner.ki_pending):
                task._cancel_points += 1
                return None
        elif not _cancel_state.trio_pending():  # the first question, or the public path
            return None
        trio_check: Awaitable[None] = _trio_lowlevel.checkpoint_if_cancelled()
        return trio_check
    loop = _get_running_loop()
    if loop is not None:
        return anyio.lowlevel.checkpoint() if _cancel_state.asyncio_pending(loop) else None
    return anyio.lowlevel.checkpoint_if_cancelled()  # no loop: anyio raises its usual error


def schedule_point() -> Awaitable[None]:
    """What to await for a schedule point that is not a cancel point, once a slot is taken.

    The checkpointing acquire (``Gate(fast_acquire=False)``, the default) takes a free
    slot first and then awaits this, so that an uncontended acquire lets other tasks run
    (trio's checkpoint rule, anyio's default semaphore) without giving up arrival order:
    callers that arrive together are admitted in the order they called, not the order the
    scheduler resumes them (issue 26, item 3). This is what ``trio.Lock``,
    ``trio.CapacityLimiter`` and ``anyio.Semaphore`` do; the cancel point is the check
    before admission (:func:`cancellation_check`), so an already-cancelled scope still
    gets no slot.

    On trio this is ``trio.lowlevel.cancel_shielded_checkpoint()``: nothing can cancel
    it. On asyncio it is a bare yield to the loop (what ``asyncio.sleep(0)`` does), not
    anyio's ``cancel_shielded_checkpoint()``, whose shielding cancel scope would cost
    about as much as the rest of the acquire: a cancellation delivered during that one
    yield (a native ``Task.cancel()``, or a cancel scope fired in that very tick) raises
    there, and the caller gives the slot back, as ``anyio.Semaphore`` does for a native
    cancellation.
    """
    local = _sniffio_local or ("trio" in _modules and _find_trio())  # _in_trio() inline
    if local and local.name == "trio":
        trio_yield: Awaitable[None] = _trio_lowlevel.cancel_shielded_checkpoint()
        return trio_yield
    if _get_running_loop() is not None:
        return _ASYNCIO_YIELD
    return anyio.lowlevel.cancel_shielded_checkpoint()  # no loop: anyio raises its usual error


class _AsyncioYield:
    """Awaitable: a bare yield; the task is rescheduled at once, after the tasks already ready."""

    __slots__ = ()

    def __await__(self) -> Generator[None, None, None]:
        yield


_ASYNCIO_YIELD = _AsyncioYield()


def _resolve(future: asyncio.Future[None]) -> None:
    # A cancelled future means the task is already unwinding; its own cleanup sees GRANTED
    # under the gate lock and passes the slot on, so there is nothing to do here.
    if not future.done():
        future.set_result(None)


class AsyncioWaiter(Waiter):
    """A task parked on an asyncio (or uvloop) loop future.

    ``here`` says the loop's class records the thread running it in ``_thread_id`` (the
    standard library's loops, checked on first sight by :func:`asyncio_waiter`): then
    "is the releaser on this loop?" is that attribute against the thread's id, not
    ``asyncio._get_running_loop()``, which on Python 3.10 and 3.11 makes a ``getpid()``
    system call (a tenth of the contended benchmark, b).
    """

    __slots__ = ("future", "here", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.state = WAITING
        self.armed = True
        self.due = math.inf
        self.priority = 0
        self.tokens = 0
        self.seq = 0
        self.since = _monotonic()
        self.loop = loop
        self.here = False
        self.future: asyncio.Future[None] = loop.create_future()

    def prepare(self) -> None:
        # A resolved or cancelled future cannot carry the next wake-up. Replaced before
        # the waiter re-arms under the lock, so a waker that sees it armed reads this one.
        if self.future.done():
            self.future = self.loop.create_future()

    def wake(self) -> bool:
        loop = self.loop
        # On the loop's own thread while it runs (the contended path's common case: the
        # releaser is a task of the same loop), resolve the future here. ``_thread_id``
        # is set for exactly the time run_forever() runs on a thread (see ``here``).
        if (
            (loop._thread_id == _get_ident())  # type: ignore[attr-defined]
            if self.here
            else (_get_running_loop() is loop)
        ):
            # A cancelled future means the task is already unwinding; its own cleanup
            # sees GRANTED under the gate lock and passes the slot on: nothing to do.
            future = self.future
            if not future.done():
                future.set_result(None)
            return True
        if loop.is_closed():
            # Do not touch the future: resolving it would detach the task, which is then
            # freed on the spot and its cleanup would race ours for the same slot.
            return False
        try:
            # Another thread (or this one outside the loop): the loop resolves it.
            loop.call_soon_threadsafe(_resolve, self.future)
        except RuntimeError:
            # "Event loop is closed": the task can never resume to use the slot.
            return False
        return True

    def park(self, leave: Callable[[Waiter], bool]) -> Awaitable[None]:
        """Wait for :meth:`wake`; cancellation arrives as ``CancelledError``.

        The gate settles the waiter under its lock in its own ``except`` clause, so
        ``leave`` is not needed here. The bare future is returned (not wrapped in a
        coroutine) to keep one frame off the contended path.
        """
        return self.future


#: Loop classes seen so far, and whether their ``_thread_id`` names the thread running
#: them (``AsyncioWaiter.here``).
_thread_id_loops: dict[type, bool] = {}
_Future = asyncio.Future
_new_asyncio_waiter = object.__new__


def asyncio_waiter(loop: asyncio.AbstractEventLoop) -> AsyncioWaiter:
    """A waiter for the running task of ``loop``, the loop running on this thread.

    ``AsyncioWaiter.__init__`` spelled out without the call (the contended path, b).
    """
    waiter: AsyncioWaiter = _new_asyncio_waiter(AsyncioWaiter)
    waiter.state = WAITING
    waiter.armed = True
    waiter.due = math.inf
    waiter.priority = waiter.tokens = waiter.seq = 0
    waiter.since = _monotonic()
    waiter.loop = loop
    here = _thread_id_loops.get(type(loop))
    if here is None:  # first sight of this loop class: does _thread_id say who runs it?
        here = isinstance(loop, asyncio.BaseEventLoop) and (
            getattr(loop, "_thread_id", None) == _get_ident()
        )
        _thread_id_loops[type(loop)] = here
    waiter.here = here
    waiter.future = _Future(loop=loop)
    return waiter


class TrioWaiter(Waiter):
    """A trio task parked with ``wait_task_rescheduled``.

    ``parked`` is true from :meth:`park` until the park ends (rescheduled, or an abort
    that succeeded) and is read and written on the trio thread only. Every wake-up is
    delivered there, through :meth:`_deliver`, which reschedules the task only while it is
    parked: trio's ``reschedule`` of a task that is running, already rescheduled or parked
    somewhere else (a ``sleep``, another lock) is an ``AssertionError`` that crashes the
    run, or a silent early return from that other wait. A wake-up sent from another thread
    can arrive that late: it was sent while the waiter was armed, the task then polled
    instead of parking (its budget timer was already due) and re-armed, so a second
    wake-up for the next park can follow.

    A wake-up that finds the task not parked is *kept* (``pending``), never dropped: the
    next :meth:`park` then returns at once instead of parking (issue 26, item 6). Dropping
    it lost grants: a release run on this very thread between queueing and parking (a
    user ``__del__`` in a collection, or the deferred work ``SlotSteps._enqueue`` drains as
    it unlocks, I7) grants the waiter and wakes it before it parks; the grant disarmed it,
    so nothing else would ever wake it and its abort refused to cancel (a task parked for
    ever on a granted slot). A kept wake-up that turns out stale costs one look at the
    state under the lock: every caller of :meth:`park` looks at ``state`` when it returns
    (I9 in ``ledger``), and :meth:`prepare` clears it before the waiter re-arms, since no
    wake-up for the next arming can be sent before that.
    """

    __slots__ = ("leave", "parked", "pending", "task", "thread_id", "trio_token")

    def __init__(self) -> None:
        self.state = WAITING
        self.thread_id = _get_ident()
        self.armed = True
        self.due = math.inf
        self.priority = 0
        self.tokens = 0
        self.seq = 0
        self.since = _monotonic()
        self.parked = False
        self.pending = False
        self.trio_token = _trio_lowlevel.current_trio_token()
        self.task = _trio_lowlevel.current_task()

    def prepare(self) -> None:
        # Runs on the trio thread before the waiter re-arms under the lock: a wake-up kept
        # from an earlier arming is stale (the caller is about to look at its state).
        self.pending = False

    def wake(self) -> bool:
        # Directly only from inside the run itself. From host code on the same thread
        # (trio guest mode) or from another thread, through run_sync_soon, which also
        # wakes the run out of its I/O wait.
        if _get_ident() == self.thread_id and _sniffio_local.name == "trio":
            self._deliver()
            return True
        try:
            self.trio_token.run_sync_soon(self._deliver)
        except _trio_run_finished:
            return False
        return True

    def _deliver(self) -> None:
        if self.parked:
            self.parked = False
            _trio_lowlevel.reschedule(self.task)
        else:
            self.pending = True  # not parked yet (or any more): the next park returns

    def park(self, leave: Callable[[Waiter], bool]) -> Awaitable[None]:
        """Wait for :meth:`wake`; a cancel scope firing first asks ``leave`` (disarm).

        Returns at once (after a schedule point that is not a cancel point) when a wake-up
        arrived before the park: the caller looks at ``state``, as after any park.
        """
        if self.pending:
            self.pending = False
            ready: Awaitable[None] = _trio_lowlevel.cancel_shielded_checkpoint()
            return ready
        self.leave = leave
        self.parked = True  # the caller awaits the result at once: no yield in between
        # A bound method rather than a closure: two fewer objects per parked task.
        wait: Awaitable[None] = _trio_lowlevel.wait_task_rescheduled(self._abort)
        return wait

    def _abort(self, _: object) -> Any:
        # Runs on the trio thread when a cancel scope fires. Still armed: no wake-up is on
        # its way, so we disarm and let the Cancelled through (the gate's except clause or
        # timeout path unqueues us). Disarmed: a grant or nudge is on its way (maybe from
        # another thread), so the wait completes and the cancellation is delivered at the
        # caller's next checkpoint.
        if self.leave(self):
            self.parked = False
            return _trio_lowlevel.Abort.SUCCEEDED
        return _trio_lowlevel.Abort.FAILED


class ThreadWaiter(Waiter):
    """A plain thread blocked in ``acquire_sync``.

    Created ``GONE`` (not queued): the queueing step makes it ``WAITING`` (or ``GRANTED``
    when it admits at once) under the gate's lock, so an exception at any step of
    ``acquire_sync`` can tell from the state alone whether there is a queue entry or a
    slot to settle (issue 26, item 7).
    """

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self.state = GONE
        self.armed = True
        self.due = math.inf
        self.priority = 0
        self.tokens = 0
        self.seq = 0
        self.since = _monotonic()
        self._lock = threading.Lock()
        self._lock.acquire()

    def wake(self) -> bool:
        try:  # noqa: SIM105 - contextlib.suppress costs a context manager per wake-up
            self._lock.release()
        except RuntimeError:
            # Already released by an earlier wake-up the thread has not consumed yet (it
            # timed out meanwhile and re-armed): it will wake and look; nothing is lost.
            pass
        return True

    def block(self, timeout: float | None) -> bool:
        """Block until woken or ``timeout`` seconds pass; ``True`` if woken."""
        # Lock.acquire rejects timeouts above TIMEOUT_MAX (~292 years): that is forever.
        if timeout is None or timeout > threading.TIMEOUT_MAX:
            return self._lock.acquire()
        return self._lock.acquire(timeout=timeout)


def async_waiter() -> AsyncioWaiter | TrioWaiter:
    """A waiter for the task that is running now, on whichever backend runs it."""
    local = _sniffio_local or ("trio" in _modules and _find_trio())  # _in_trio() inline
    if local and local.name == "trio":
        if not trio_protection_done:
            ensure_trio_protection()
        return TrioWaiter()
    loop = _get_running_loop()
    if loop is not None:
        return asyncio_waiter(loop)
    anyio.lowlevel.current_token()  # raises anyio's NoEventLoopError, naming backends
    msg = "anygate supports asyncio and trio event loops only"
    raise RuntimeError(msg)


def event_loop_running() -> str | None:
    """Name of the event loop running in this thread, or ``None`` for a plain thread."""
    if _in_trio():
        return "trio"
    if _get_running_loop() is not None:
        return "asyncio"
    return None


_protected: list[Callable[..., Any]] = []
trio_protection_done = False


def ki_protected(fn: _F) -> _F:
    """Decorator: make ``fn`` KeyboardInterrupt-safe under trio, once trio is in use.

    Trio raises ``KeyboardInterrupt`` at any bytecode unless the running frame's code object
    is marked protected, and a Ctrl-C in the middle of a locked update would leave the gate's
    counters half-written. Marking is per code object and costs nothing per call. anygate
    does not import trio itself (asyncio-only users should not pay for it), so the marks
    are applied by :func:`ensure_trio_protection` as soon as trio is seen.
    """
    _protected.append(fn)
    return fn


def ensure_trio_protection() -> None:
    """Apply trio's KI protection to every ``@ki_protected`` function, once."""
    global trio_protection_done
    if trio_protection_done:
        return
    trio = sys.modules.get("trio")
    if trio is None:
        return
    for fn in _protected:
        trio.lowlevel.enable_ki_protection(fn)
    trio_protection_done = True


# The code objects of every @ki_protected function: each of the gate's locked steps is one
# (trio's KI discipline requires it), so a frame running one of them on this thread means
# the lock may be ours. Built lazily, once all modules have registered theirs.
_locked_codes: frozenset[object] = frozenset()
_locked_count = 0


def inside_locked_step() -> bool:
    """Whether this thread is running inside a ``@ki_protected`` function (stack walk).

    Only called when a gate's lock is taken, from ``SlotSteps._release``: a user finalizer's
    release that finds its own thread inside a locked step must defer, not block.
    """
    global _locked_codes, _locked_count
    if _locked_count != len(_protected):
        _locked_codes = frozenset(getattr(fn, "__code__", None) for fn in _protected)
        _locked_count = len(_protected)
    codes = _locked_codes
    frame: FrameType | None = sys._getframe(2)  # skip ourselves and SlotSteps._release
    while frame is not None:
        if frame.f_code in codes:
            return True
        frame = frame.f_back
    return False
