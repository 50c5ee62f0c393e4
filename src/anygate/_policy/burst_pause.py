"""The burst-rate pause and its probe: after a slope throttle, everyone waits, one tries.

Why. A burst-rate 429 says the provider's current window is spent; every attempt sent
into it gets the same answer a reject latency later. So the gate stops admitted attempts
for ``pause_s`` (or the provider's Retry-After), and when the pause is over lets **one**
attempt go first, the *probe*: its success ends the pause for everyone, another burst 429
starts a new pause, anything else (an error, a cancellation) hands the probe role on. A
pause that ended with everyone at once would send the whole queue into a window that may
still be spent.

While the gate's rate is paced (:mod:`anygate._policy.pacer`) the probe need not be waited
for to the end: a probe not turned away within its grace got past the provider's rate
check (a throttle comes back in a reject latency, a success may take the whole generation
time), and the paced rate decides how fast the others go.

What. One :class:`BurstPause` per :class:`~anygate._policy.adaptive.AdaptiveLimit`: the
pause's state and its transitions. Every method except :attr:`pausing` (a flag read
without the lock on the hot path) and :meth:`wait` runs under the adaptive limit's lock,
which also guards the limit and the generation a throttle changes at the same moment.
"""

from __future__ import annotations

import math
from typing import final

from .._config.limit_values import probe_grace
from .._gate.latch import Latch

__all__ = ["BurstPause"]


@final
class BurstPause:
    """The pause state of one adaptive limit (see the module docstring); not public.

    Not thread-safe on its own: the owner calls every method under its lock, except the
    unlocked :attr:`pausing` read and :meth:`wait`.
    """

    __slots__ = ("_probe_out", "_probe_sent", "_reject_s", "_resume", "_until", "pausing")

    def __init__(self, name: str) -> None:
        #: Whether a pause lasts or its probe is out; read without the lock on the hot path
        #: (a stale ``True`` is checked again under the lock, a stale ``False`` lets one
        #: attempt through that was admitted as the pause began).
        self.pausing = False
        self._until = -math.inf
        self._probe_out = False
        self._probe_sent = -math.inf
        self._reject_s = 0.0  # the slowest burst 429 a probe got (pacing's probe grace)
        self._resume = Latch(name)  # shut while a pause lasts

    def left(self, now: float) -> float:
        """Seconds of pause left (0 while only the probe is out, or with no pause)."""
        return max(0.0, self._until - now) if self.pausing else 0.0

    def lasts(self, now: float) -> bool:
        """Whether the pause itself (not only its probe) is on at ``now``."""
        return self.pausing and now < self._until

    def passing(self, now: float, *, pause_s: float, paced: bool) -> tuple[float, bool]:
        """An attempt about to call the provider: ``(seconds to wait, is the probe)``.

        ``(0, False)``: go. While the pause lasts: wait until it ends. When it has ended,
        the first attempt to ask is the probe ``(0, True)``; the others wait for its outcome
        (at most ``pause_s`` before asking again), or, with the rate ``paced``, only until
        the probe's grace is over, which ends the pause.
        """
        if self._until == -math.inf:  # ended meanwhile (the flag was read unlocked)
            return 0.0, False
        left = self._until - now
        if left > 0:
            return left, False
        if not self._probe_out:
            self._probe_out = True
            self._probe_sent = now
            return 0.0, True
        if paced:
            grace = probe_grace(self._reject_s, pause_s=pause_s)
            if now - self._probe_sent >= grace:
                self.end()
                return 0.0, False
            return max(self._probe_sent + grace - now, 1e-3), False
        return max(pause_s, 1e-3), False

    async def wait(self, seconds: float) -> None:
        """Wait ``seconds`` or until the pause ends, whichever comes first (no lock)."""
        await self._resume.wait(seconds)

    def start(self, now: float, seconds: float, *, probe: bool) -> None:
        """A burst throttle: a new pause of ``seconds`` (none for 0); ``probe``: it was the
        probe that was turned away, so how long that took widens the next probe's grace."""
        if probe:
            self._reject_s = max(self._reject_s, now - self._probe_sent)
        self._probe_out = False
        if seconds > 0:
            self._until = now + seconds
            self.pausing = True
            self._resume.shut()

    def probe_succeeded(self) -> None:
        """The probe's call succeeded: the pause is over for everyone."""
        if self.pausing and self._probe_out:
            self.end()

    def probe_ended(self) -> None:
        """The probe ended without an answer about the rate: the next to ask probes."""
        self._probe_out = False

    def end(self) -> None:
        """End the pause (and any probe) now and let every waiter go."""
        self.pausing = False
        self._probe_out = False
        self._until = -math.inf
        self._resume.open()
