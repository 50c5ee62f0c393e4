"""Looking inside a gate for debugging: who holds its slots, who waits, and since when.

Kept apart from :meth:`Gate.statistics`, which stays a handful of counter reads: finding the
holders walks the garbage collector's list of live objects (O(heap), milliseconds in a
large process), because the gate deliberately keeps no list of its tokens. A list would put
a registration and a removal on every acquire and release, and hold tokens alive, which
would defeat the leak reclaim that relies on an unreleased token being collected.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .token import Token, code_site
from .waiters import WAITING, AsyncioWaiter, TrioWaiter, Waiter, ki_protected

if TYPE_CHECKING:
    from .ledger import Ledger

__all__ = ["QueuedCaller", "SlotHolder", "holders_of", "waiters_of"]

_monotonic = time.monotonic


@dataclass(frozen=True)
class SlotHolder:
    """One held slot of a gate, as :meth:`Gate.holders` reports it.

    Attributes:
        acquired_at: ``file:line`` of the code that acquired the token.
        age_s: seconds since the token was admitted (``time.monotonic``).
        tokens: what the token is charged to the rate's token budget.
        token: the token itself, for releasing a slot that is stuck for good. Keeping
            this record keeps the token alive (and so its slot held): drop it when done.
    """

    acquired_at: str
    age_s: float
    tokens: int
    token: Token


@dataclass(frozen=True)
class QueuedCaller:
    """One caller queued on a gate, as :meth:`Gate.waiters` reports it.

    Attributes:
        age_s: seconds since it joined the queue (``time.monotonic``).
        runtime: ``"asyncio"`` (uvloop included), ``"trio"`` or ``"thread"``
            (:meth:`Gate.acquire_sync`).
        priority: its class (``acquire(priority=)``).
        tokens: the token cost it stated (``acquire(tokens=)``).
    """

    age_s: float
    runtime: str
    priority: int
    tokens: int


def holders_of(gate: Ledger) -> tuple[SlotHolder, ...]:
    """Every unreleased token of ``gate``, oldest first (see :meth:`Gate.holders`)."""
    now = _monotonic()
    # gc.get_objects() lists every container the collector tracks, and a Token (a class
    # with reference slots) is one. Tokens collected as garbage but not yet finalized are
    # included: they still hold their slots until the collector reaches them.
    found = [obj for obj in gc.get_objects() if type(obj) is Token and obj._gate is gate]
    found.sort(key=lambda token: token._since)
    return tuple(
        SlotHolder(
            acquired_at=code_site(token._code, token._lasti),
            age_s=max(0.0, now - token._since),
            tokens=token._cost,
            token=token,
        )
        for token in found
    )


def _runtime(waiter: Waiter) -> str:
    if isinstance(waiter, AsyncioWaiter):
        return "asyncio"
    if isinstance(waiter, TrioWaiter):
        return "trio"
    return "thread"


@ki_protected
def _queued(gate: Ledger) -> list[Waiter]:
    """The live waiters, highest class first, oldest first within a class (one locked step)."""
    # Protected like every locked step: a user finalizer releasing a token from a
    # collection triggered by this allocation must defer rather than wait for our lock.
    lock = gate._lock
    lock.acquire()
    try:
        queued = [
            waiter
            for priority in sorted(gate._queues, reverse=True)
            for waiter in gate._queues[priority]
            if waiter.state == WAITING
        ]
    finally:
        lock.release()
        if gate._deferred:
            gate._drain()
    return queued


def waiters_of(gate: Ledger) -> tuple[QueuedCaller, ...]:
    """The callers queued on ``gate`` now (see :meth:`Gate.waiters`)."""
    queued = _queued(gate)
    now = _monotonic()
    return tuple(
        QueuedCaller(
            age_s=max(0.0, now - waiter.since),
            runtime=_runtime(waiter),
            priority=waiter.priority,
            tokens=waiter.tokens,
        )
        for waiter in queued
    )
