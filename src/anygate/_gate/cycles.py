"""Tokens the cyclic collector finalizes unreleased are judged when its collection ends.

A token and the user object that owns it often die together in one garbage cycle, and the
object's ``__del__`` may release the token. The collector calls every finalizer of the
garbage in one pass, in no set order (its list order, which is roughly allocation order:
the token, made first, usually goes first). A token finalized first used to count itself
leaked, reclaim its slot and warn, and the owner's release a moment later was a no-op
(issue 27: 555 false leaks in a 23k-operation soak, 100 of 100 when the token is made
before its owner). So a token finalized while a collection runs *on this thread* is kept
(a *suspect*) and judged when that collection ends (``gc.callbacks``, phase ``"stop"``,
after every finalizer of the pass ran): released by then, it was no leak; otherwise it is
reclaimed and reported exactly as before, with its acquisition site.

Not via a weakref callback instead of ``__del__``: the collector clears weakrefs and calls
their callbacks *before* it calls any ``__del__``, so it would always judge before the
owner had its say; and a finalizer per token costs the hot path (DESIGN.md).

- A token dropped outside a collection (its reference count reached zero), or on another
  thread while this one collects, is judged at once, as before: only the collecting
  thread's finalizers are deferred (one entry per collecting thread; callbacks and
  finalizers run on the thread that started the collection, and collections do not nest).
- Every suspect is judged even when one judgement raises (a ``ResourceWarning`` is an
  error under ``-W error``): the first exception is re-raised once all are judged, and the
  collector reports it as unraisable, as it does for one raised by ``__del__``.
- Keeping a suspect resurrects the token alone (it references no user object); the
  collector frees the rest of the garbage now and the token when it is dropped after its
  judgement, without a second ``__del__`` (PEP 442).
- The slot is flipped under the gate's lock, as every release flips it, so exactly once.
  An owner's release still queued in the gate's deferred work (I7: its thread held the
  lock) counts as released. The ``"stop"`` callback may run while this thread holds the
  lock (a collection started by an allocation inside a locked step): then nothing else
  flips or drains meanwhile, and a leak is reclaimed as from ``__del__``
  (``Gate._reclaim_leaked`` defers the bookkeeping to the step's unlock). The judgement
  never waits for a lock this thread may hold: it waits only when ``inside_locked_step``
  says this thread holds none, and at most ``LOCK_WAIT_S``.
- A ``"stop"`` that never came (someone removed our callback mid-collection) is made up
  for at this thread's next ``"start"``.
"""

from __future__ import annotations

import gc
import threading
from typing import TYPE_CHECKING

from .waiters import inside_locked_step

if TYPE_CHECKING:
    from collections.abc import Callable

    from .gate import Gate
    from .token import Token

__all__ = ["defer"]


class _Collections:
    """The suspects of each thread that is running a collection, keyed by thread ident.

    A plain dict: its single operations are atomic, and none of this takes a lock (it runs
    inside finalizers and collections). The collections late in interpreter shutdown (as
    modules are torn down) call no ``gc.callbacks``: tokens finalized then are judged at
    once, as before.
    """

    __slots__ = ("_ident", "_judge", "_running")

    def __init__(self, judge: Callable[[Token], None]) -> None:
        self._running: dict[int, list[Token]] = {}
        self._ident = threading.get_ident
        self._judge = judge

    def defer(self, token: Token) -> bool:
        """Keep ``token`` until this thread's collection ends; False when none is running."""
        running = self._running
        if running:
            suspects = running.get(self._ident())
            if suspects is not None:
                suspects.append(token)
                return True
        return False

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        ident = self._ident()
        suspects = self._running.pop(ident, None)
        if phase == "start":
            self._running[ident] = []
        if suspects:  # "stop", or a "start" after a lost "stop"
            self._judge_all(suspects)

    def _judge_all(self, suspects: list[Token]) -> None:
        first: BaseException | None = None
        judge = self._judge
        while suspects:
            try:
                judge(suspects.pop())
            except BaseException as exc:  # noqa: PERF203  # re-raised once all are judged
                if first is None:
                    first = exc
        if first is not None:
            try:
                raise first
            finally:
                first = None  # no cycle through this frame


#: How long a judgement waits for a gate's lock that ``inside_locked_step`` says this thread
#: does not hold, seconds. Another thread's locked steps take microseconds; past this, the
#: holder is taken to be this very thread (a locked section outside ``@ki_protected``),
#: which must not wait for itself.
LOCK_WAIT_S = 0.1


def _judge(token: Token) -> None:
    """A suspect its owner did not release during the collection leaked: reclaim, report."""
    gate = token._gate
    if gate is None:  # released by its owner's __del__ in the same collection: no leak
        return
    lock = gate._lock
    if lock.acquire(False) or (not inside_locked_step() and lock.acquire(timeout=LOCK_WAIT_S)):
        # Under the lock, as every release flips it: exactly once even if the owner
        # resurrected the token and another thread releases it right now.
        try:
            held = token._gate is not None and not _queued(gate, token)
            if held:
                token._gate = None
        finally:
            lock.release()
            if gate._deferred:  # I7: work others left while we held the lock (maybe the
                gate._drain()  # owner's release, queued when its thread held the lock)
        if held:
            gate._reclaim_leaked(token._code, token._lasti)
        return
    # This thread holds the lock (the collection started inside a locked step): nothing
    # else flips the token or drains meanwhile. The owner's release made during the
    # collection is then still queued (SlotSteps._release, I7), applied as the step unlocks.
    if _queued(gate, token):
        return
    token._gate = None
    gate._reclaim_leaked(token._code, token._lasti)  # defers under the lock, as from __del__


def _queued(gate: Gate, token: Token) -> bool:
    """Whether a release of ``token`` waits in ``gate``'s deferred work (I7)."""
    return any(item is token for item in gate._deferred)


_collections = _Collections(_judge)
gc.callbacks.append(_collections)
defer = _collections.defer
