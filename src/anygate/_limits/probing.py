"""The published probes' switch and steps: the gate's published rates, stepped up while they bind.

Why. A published limit is a starting point, not a truth (issue 30): a policy whose rate is
the provider's published one (``rate_is_ceiling=False``) probes it upward while it binds
and no 429 says it is the real one (:mod:`anygate._limits.published` holds the probes'
arithmetic and its evidence). Where the requests are the gate's only per-minute budget,
its published minute goes at once (:mod:`anygate._limits.pace`).

What. :class:`PublishedSteps`, the adaptive limit's methods for that: the switch
(:meth:`~PublishedSteps._probe_published_rate`, set by the policy that states the gate's
rate), whether it is on (:attr:`~PublishedSteps.probes_published_rate`), and one step of
each probe (:meth:`~PublishedSteps._probe_published`,
:meth:`~PublishedSteps._probe_published_tokens`), which the send path calls at a pass and
at a per-minute 429. Each takes the limit's lock for its reads and sets the gate's rate
outside it.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from .learn import RateLearner
from .published import BIND_S, PublishedProbe, TokenProbe
from .state import AdaptiveState

if TYPE_CHECKING:
    from collections.abc import Callable

    from .._gate.gate import Gate
    from .._gate.rate import Rate

__all__ = ["PublishedSteps"]


class PublishedSteps(AdaptiveState):
    """The published probes of :class:`~anygate._limits.adaptive.AdaptiveLimit` (see the
    module docstring). Not for use on its own."""

    __slots__ = ()

    @property
    def probes_published_rate(self) -> bool:
        """Whether the gate's requests or tokens per minute are the provider's published
        limits, stepped up while they bind and no 429 says they are the real ones
        (:mod:`anygate._limits.published`; a policy with ``rate_is_ceiling=False`` turns
        it on)."""
        return any(probe is not None and not probe.ended for probe in self._probes())

    def _probes(self) -> tuple[PublishedProbe | None, TokenProbe | None]:
        return self._published, self._published_tokens

    def _probe_published_rate(self, on: bool) -> None:
        """Probe the gate's published request and token rates upward (``on``) or not:
        set by the policy that states the gate's rate (``_policy.sharing.apply_ceiling``).
        Only with pacing on (``pace_burst_rate``): the probes' answer, the per-minute
        estimates, is part of it."""
        gate = self._gate()
        # A fleet's local gate: its rate is the fleet's, set once for every process.
        rate = None if gate is None or gate._shares_rate else gate.rate
        rpm = None if rate is None else rate.requests_per_minute
        tpm = None if rate is None else rate.tokens_per_minute
        with self._lock:
            on = on and self._pace
            if not on or rpm is None:
                self._published = None
            elif self._published is None:
                self._published = PublishedProbe(rpm)
            if not on or tpm is None:
                self._published_tokens = None
            elif self._published_tokens is None:
                self._published_tokens = TokenProbe(tpm)
            # The published minute goes at once, each trailing one held to the rate
            # (anygate._limits.pace), where it is the gate's only per-minute budget.
            minute = (
                self._published is not None and rate is not None and not rate.split and tpm is None
            )
            changed = minute != self._sends.pace.minute
            self._sends.pace.by_minute(self._sends.requests.log if minute else None)
        if gate is not None and changed:
            # Outside our lock: the gate takes its own. Only on a change: a ceiling's
            # budget starts (empty) at its first use, not when its policy is made.
            gate._requests_by_minute(minute)

    def _probe_published(self, probe: PublishedProbe, *, at_once: bool = False) -> None:
        """Step the gate's published request rate (:mod:`anygate._limits.published`);
        ``at_once``: look now (a per-minute 429 came), not at the probe's next look."""

        def step(now: float, gate: Gate, rate: Rate | None) -> float | None:
            rejected = self._sends.requests.limit is not None
            accepted = self._sends.requests_in_minute(now)
            recent = self._sends.requests.log.count(now - BIND_S, now)
            rpm = None if rate is None else rate.requests_per_minute
            return probe.step(now, accepted, rpm, rejected, recent)

        self._look(probe, at_once, step, tokens=False)

    def _probe_published_tokens(
        self, probe: TokenProbe, *, at_once: bool = False, refused: bool = False
    ) -> None:
        """Step the gate's published token rate (:class:`anygate._limits.published.TokenProbe`);
        ``at_once``: look now (a tokens-per-minute 429 came); ``refused``: a 429 that did
        not say which limit came, and may be the tokens' (a stepped rate goes back)."""

        def step(now: float, gate: Gate, rate: Rate | None) -> float | None:
            if RateLearner.told(gate, "tokens"):
                probe.ended = True  # the provider states its limit: the learner's now
                return None
            tokens = self._sends.tokens
            tpm = None if rate is None else rate.tokens_per_minute
            rejected = refused or tokens.limit is not None
            return probe.step(now, tokens.held(now, BIND_S), tokens.accepted, tpm, rejected)

        self._look(probe, at_once, step, tokens=True)

    def _look(
        self,
        probe: PublishedProbe | TokenProbe,
        at_once: bool,
        step: Callable[[float, Gate, Rate | None], float | None],
        *,
        tokens: bool,
    ) -> None:
        """One look of ``probe``: its ``step`` under the lock, unless another answer looked
        first (``at_once``: look anyway); the gate's requests (or ``tokens``) per minute
        set to what it returns."""
        gate = self._pace_gate() if self._enabled else None
        if gate is None:
            return
        rate = gate.rate
        with self._lock:
            now = self._clock()
            if now < probe.next_at and not at_once:
                return  # another answer looked first
            new = step(now, gate, rate)
        if new is not None and rate is not None:
            stepped = (
                dataclasses.replace(rate, tokens_per_minute=new)
                if tokens
                else dataclasses.replace(rate, requests_per_minute=new)
            )
            _step_rate(gate, rate, stepped)


def _step_rate(gate: Gate, rate: Rate, stepped: Rate) -> None:
    """Set a probe's step (``stepped``) on ``gate``, only over the ``rate`` it was
    computed from: another thread (the header learner, a user) may have set one since,
    and it is theirs then (the probe sees it changed at its next look and ends)."""
    if gate.rate is rate:
        gate.rate = stepped
