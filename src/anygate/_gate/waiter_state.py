"""What a parked caller is, whatever runs it: the waiter's states and the fields of its record.

:class:`Waiter` is the record the gate's ledger queues and writes under its lock (its
state, arming, due time, what it asked for, its arrival number), and the base of every kind
of waiter; :data:`WAITING`, :data:`GRANTED`, :data:`GONE` and :data:`DEAD` are the states it
moves through. Nothing here asks which runtime runs the caller.

Not for: waking anyone. How a parked caller is woken (the asyncio, trio and thread kinds
of waiter) and every question about the running event loop are
:mod:`anygate._gate.waiters`'s, the only module that knows the runtime.
"""

from __future__ import annotations

import math
import time
from typing import Final

WAITING: Final = 0
GRANTED: Final = 1
GONE: Final = 2  # left the queue (cancelled, timed out) or passed its grant on
DEAD: Final = 3  # granted, but its loop can never run it again; the gate passed the slot on

_monotonic = time.monotonic


class Waiter:
    """One parked caller. Every field is written under the gate's lock.

    ``armed`` says a wake-up may be sent to the current park (one per park: trio must
    never see a reschedule of a task that is not parked); ``due`` is the gate-clock time
    the waiter will wake by itself to look at the budget again (``inf``: only when woken).
    ``tokens`` and ``priority`` are what it asked for, ``seq`` its arrival number, ``since``
    when it was created (``time.monotonic``, for :meth:`Gate.waiters`). ``out``, the
    output part of ``tokens`` (split token budgets), is set only when stated: read it
    with :func:`waiter_out` (an unset slot costs the contended path no store).
    """

    __slots__ = ("armed", "due", "out", "priority", "seen", "seq", "since", "state", "tokens")

    out: int
    # The gate's in_flight just after the grant, this waiter's slot included: set by the
    # granting step, read once granted (Token.in_flight_at_admission).
    seen: int

    def __init__(self) -> None:
        self.state: int = WAITING
        self.armed = True
        self.due = math.inf
        self.priority = 0
        self.tokens = 0
        self.seq = 0
        # Queued: since when (Gate.waiters()); granted: when (Token.admitted_at).
        self.since = _monotonic()

    def prepare(self) -> None:
        """Ready the wake-up route for another park (before re-arming under the lock)."""

    def wake(self) -> bool:  # pragma: no cover - abstract
        """Make the parked caller runnable; ``False`` if it can never run again."""
        raise NotImplementedError


def waiter_out(waiter: Waiter) -> int:
    """``waiter.out``, or 0 when no output part was stated (see :class:`Waiter`)."""
    try:
        return waiter.out
    except AttributeError:
        return 0
