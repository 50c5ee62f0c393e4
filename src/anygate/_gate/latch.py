"""A latch: callers wait, bounded by a timeout, until it is opened.

The breaker parks callers on one while it is open (they go on when it closes) and the
adaptive limit parks attempts on one during a burst-rate pause (they go on when the probe
succeeds). Both are shared by asyncio loops, trio runs and threads, so the latch is a
:class:`anygate.Gate` of capacity ``inf`` (open) or ``0`` (shut): waiting is acquiring
and releasing at once, FIFO, and a cancelled or timed-out wait leaves nothing behind.

Opening and shutting take the gate's lock; callers may hold their own lock around them
(lock order: theirs, then the gate's; the gate never calls back).
"""

from __future__ import annotations

import math
from typing import final

from .._errors import Busy
from .gate import Gate

__all__ = ["Latch"]


@final
class Latch:
    """Open (callers pass) or shut (callers wait until it opens or their timeout ends)."""

    __slots__ = ("_gate",)

    def __init__(self, name: str) -> None:
        self._gate = Gate(math.inf, name=name)

    def open(self) -> None:
        """Let every waiter, and every later caller, through."""
        self._gate.capacity = math.inf

    def shut(self) -> None:
        """Make later callers wait (waiters already through are not affected)."""
        self._gate.capacity = 0

    async def wait(self, seconds: float) -> None:
        """Return when the latch is open, or after ``seconds``, whichever comes first."""
        try:
            token = await self._gate.acquire(timeout=seconds)
        except Busy:
            return
        token.release()

    def wait_sync(self, seconds: float) -> None:
        """The blocking twin of :meth:`wait`."""
        try:
            token = self._gate.acquire_sync(timeout=seconds)
        except Busy:
            return
        token.release()
