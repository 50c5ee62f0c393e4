"""Handing a held slot to the call a burst pause's probe is kept for (issue 30).

Why. A pause's probe is kept for the retry of the call its 429 turned away
(:mod:`.pause`), but that retry has no slot: the attempt gave its slot back before the 429
was classified, and after a pause every slot is held by a caller the pause holds back, so
none frees in time. Queued at the gate ahead of fresh calls, the retry still lost the slots
that did free: a higher class may overtake the gate's longest-waiting caller at most three
times in a row (``docs/rates.md``), and a pause's probes used that up. The probe then went
to a fresh call after the reservation (morning peak, 30 s burst window, seed 5: probes 5 s
late, the window's edge learned 4-8 s late, 1.03x the oracle where 1.004x was reached).
So the retry waits for a slot handed over: the first caller the pause holds back that asks
once the probe is due is told to yield (``YIELD``) and hands its token over; it queues
again ahead of fresh calls. A token may be released from any task or thread, so it moves
with no change to the gate's count, and its charge is settled to the retry's tokens.

What. :class:`SlotHandoff`, one per burst pause; every method runs under the adaptive
limit's lock except :meth:`wait` and :meth:`wait_sync`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, final

from .._gate.latch import Latch

if TYPE_CHECKING:
    from .._gate.token import Token

__all__ = ["SlotHandoff"]


@final
class SlotHandoff:
    """A slot handed from a held caller to the probe's owner (see the module docstring)."""

    __slots__ = ("_handed", "_latch", "_promised", "_waits", "returned")

    def __init__(self, name: str) -> None:
        self._waits = False  # the owner waits for a slot
        self._promised = False  # a held caller was told to yield one
        self._handed: Token | None = None
        self._latch = Latch(name)  # shut while the owner waits and nothing was handed
        #: Slots handed over and released unused (the owner left, or its reservation ran
        #: out, first): each an admission with no provider call.
        self.returned = 0

    def ask(self) -> None:
        """The owner, with no slot, starts waiting for one."""
        self.drop()
        self._waits = True
        self._latch.shut()

    def promise(self) -> bool:
        """Whether a held caller asking now is to yield its slot (once per wait)."""
        if not self._waits or self._promised or self._handed is not None:
            return False
        self._promised = True
        return True

    def hand(self, token: Token) -> bool:
        """A caller told to yield hands ``token`` over; ``False``: the owner no longer
        waits (the caller keeps its slot)."""
        if not (self._waits and self._promised) or self._handed is not None:
            return False
        self._handed = token
        self._latch.open()
        return True

    def take(self) -> Token | None:
        """The owner stops waiting: the slot handed to it, if any (``None``: queue)."""
        token, self._handed = self._handed, None
        self._waits = self._promised = False
        self._latch.open()
        return token

    def drop(self) -> None:
        """The owner is gone or the pause over: a slot handed and not taken goes back to
        the gate, and a waiting owner stops waiting (it then queues)."""
        token = self.take()
        if token is not None:
            self.returned += 1
            token.release()

    async def wait(self, seconds: float) -> None:
        """Wait ``seconds`` or until a slot is handed (or the wait ends), no lock."""
        await self._latch.wait(seconds)

    def wait_sync(self, seconds: float) -> None:
        """The blocking twin of :meth:`wait`."""
        self._latch.wait_sync(seconds)
