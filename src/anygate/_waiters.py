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

``anyio.from_thread.run_sync(..., token=)`` is deliberately not used for wake-ups: it blocks
until the callback has run, which deadlocks when the releaser is the loop's own thread.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

import anyio.lowlevel

WAITING: Final = 0
GRANTED: Final = 1
GONE: Final = 2  # left the queue (cancelled, timed out) or passed its grant on
DEAD: Final = 3  # granted, but its loop can never run it again; the gate passed the slot on

_F = TypeVar("_F", bound=Callable[..., Any])

_get_ident = threading.get_ident
_get_running_loop = asyncio._get_running_loop

_asyncio_checkpoint: Callable[[], Awaitable[None]] | None = None


def checkpoint_if_cancelled() -> Awaitable[None]:
    """The running backend's ``checkpoint_if_cancelled``, minus anyio's per-call lookup.

    ``anyio.lowlevel.checkpoint_if_cancelled`` asks sniffio which library runs on every
    call, and on CPython 3.11 ``asyncio._get_running_loop()`` alone costs ~0.2 us: together
    a third of the uncontended acquire budget. Trio answers "am I in a run?" with one
    thread-local read, so trio is asked first (only if something imported it); otherwise
    the caller is on asyncio, whose check (which understands anyio cancel scopes) is
    resolved once through the public ``current_token().backend_class``.
    """
    if _trio_lowlevel is not None or _find_trio():
        assert _trio_lowlevel is not None
        if _trio_lowlevel.in_trio_run():
            checkpoint: Awaitable[None] = _trio_lowlevel.checkpoint_if_cancelled()
            return checkpoint
    check = _asyncio_checkpoint or _resolve_asyncio_checkpoint()
    return check()


_trio_lowlevel: Any = None


def _find_trio() -> bool:
    """Cache ``trio.lowlevel`` once something else has imported trio (we never import it)."""
    global _trio_lowlevel
    if "trio" in sys.modules:
        import trio.lowlevel

        _trio_lowlevel = trio.lowlevel
        return True
    return False


def _resolve_asyncio_checkpoint() -> Callable[[], Awaitable[None]]:
    global _asyncio_checkpoint
    # Raises anyio's NoEventLoopError when no loop runs at all, which is the right error.
    backend = anyio.lowlevel.current_token().backend_class
    if _get_running_loop() is None:  # some other anyio backend: do not cache it
        return backend.checkpoint_if_cancelled
    _asyncio_checkpoint = backend.checkpoint_if_cancelled
    return _asyncio_checkpoint


class Waiter:
    """One parked caller. ``state`` is only written under the owning gate's lock."""

    __slots__ = ("state", "thread_id")

    def __init__(self) -> None:
        self.state: int = WAITING
        self.thread_id = _get_ident()

    def wake(self) -> bool:  # pragma: no cover - abstract
        """Make the parked caller runnable; ``False`` if it can never run again."""
        raise NotImplementedError


def _resolve(future: asyncio.Future[None]) -> None:
    # A cancelled future means the task is already unwinding; its own cleanup sees GRANTED
    # under the gate lock and passes the slot on, so there is nothing to do here.
    if not future.done():
        future.set_result(None)


class AsyncioWaiter(Waiter):
    """A task parked on an asyncio (or uvloop) loop future."""

    __slots__ = ("future", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.loop = loop
        self.future: asyncio.Future[None] = loop.create_future()

    def wake(self) -> bool:
        try:
            if _get_ident() == self.thread_id:
                _resolve(self.future)
            else:
                self.loop.call_soon_threadsafe(_resolve, self.future)
        except RuntimeError:
            # "Event loop is closed": the task can never resume to use the slot.
            return False
        return True

    async def park(self, leave: Callable[[Waiter], bool]) -> None:
        # Cancellation arrives as CancelledError out of the await; the gate settles the
        # waiter under its lock in its own except clause, so ``leave`` is unused here.
        await self.future


class TrioWaiter(Waiter):
    """A trio task parked with ``wait_task_rescheduled``."""

    __slots__ = ("task", "trio_token")

    def __init__(self, trio_token: Any) -> None:
        super().__init__()
        import trio.lowlevel

        self.trio_token = trio_token
        self.task = trio.lowlevel.current_task()

    def wake(self) -> bool:
        import trio
        import trio.lowlevel

        if _get_ident() == self.thread_id:
            trio.lowlevel.reschedule(self.task)
            return True
        try:
            self.trio_token.run_sync_soon(trio.lowlevel.reschedule, self.task)
        except trio.RunFinishedError:
            return False
        return True

    async def park(self, leave: Callable[[Waiter], bool]) -> None:
        import trio.lowlevel

        def abort(_: object) -> trio.lowlevel.Abort:
            # Runs on the trio thread when a cancel scope fires. Not yet granted: we leave
            # the queue and let the Cancelled through. Already granted: the reschedule is
            # on its way (maybe from another thread), so the wait completes with the slot
            # and the cancellation is delivered at the caller's next checkpoint.
            if leave(self):
                return trio.lowlevel.Abort.SUCCEEDED
            return trio.lowlevel.Abort.FAILED

        await trio.lowlevel.wait_task_rescheduled(abort)


class ThreadWaiter(Waiter):
    """A plain thread blocked in ``acquire_sync``."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._lock.acquire()

    def wake(self) -> bool:
        self._lock.release()
        return True

    def block(self, timeout: float | None) -> bool:
        """Block until woken or ``timeout`` seconds pass; ``True`` if woken."""
        return self._lock.acquire(timeout=-1 if timeout is None else timeout)


def async_waiter() -> AsyncioWaiter | TrioWaiter:
    """A waiter for the task that is running now, on whichever backend runs it."""
    loop = _get_running_loop()
    if loop is not None:
        return AsyncioWaiter(loop)
    native = anyio.lowlevel.current_token().native_token
    return TrioWaiter(native)


def event_loop_running() -> str | None:
    """Name of the event loop running in this thread, or ``None`` for a plain thread."""
    if _get_running_loop() is not None:
        return "asyncio"
    trio = sys.modules.get("trio")
    if trio is not None and trio.lowlevel.in_trio_run():
        return "trio"
    return None


_protected: list[Callable[..., Any]] = []
_protection_done = False


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
    global _protection_done
    if _protection_done:
        return
    trio = sys.modules.get("trio")
    if trio is None:
        return
    for fn in _protected:
        trio.lowlevel.enable_ki_protection(fn)
    _protection_done = True
