"""One GCRA budget as an object: the input- and output-token budgets of a split rate.

Anthropic limits input tokens per minute (ITPM) and output tokens per minute (OTPM)
separately, each a continuously refilled bucket (its rate-limit documentation); OTPM is
estimated from ``max_tokens`` when a request starts and corrected to the tokens really
generated when it ends. A :class:`anygate.Rate` with ``input_tokens_per_minute`` /
``output_tokens_per_minute`` keeps one :class:`Bucket` each, charged the input part
(``tokens - output_tokens``) and the output part (``output_tokens``) of what
``acquire`` / ``Token.settle`` state.

The request and total-token budgets stay spelled out inline in ``Budgets`` (their
uncontended path is the benchmark's); these two exist only on gates that configure them,
so a gate without them pays nothing for their generality.
"""

from __future__ import annotations

__all__ = ["Bucket"]


class Bucket:
    """A GCRA budget of ``per_minute`` units, holding at most ``tau`` seconds of refill.

    Same arithmetic as the gate's other budgets (``rate_math.admission_time`` and
    ``rate_math.charge``, spelled out here):
    the level at ``t`` is ``(tau - max(0, tat - t)) / interval`` units, negative in debt.
    ``spent`` counts every unit charged (never refunds), ``back`` every unit refunded by a
    settle: what a provider's ``remaining`` header is synced against (``lower``).
    """

    __slots__ = ("back", "interval", "spent", "tat", "tau")

    interval: float
    tau: float
    tat: float
    spent: float
    back: float

    def __init__(self, per_minute: float, tau: float, now: float, old: Bucket | None) -> None:
        """A budget that starts empty at ``now``, or keeps ``old``'s level (in units)."""
        self.interval = 60.0 / per_minute
        self.tau = tau
        self.spent = 0.0 if old is None else old.spent
        self.back = 0.0 if old is None else old.back
        units = 0.0 if old is None else min(old.left(now), tau / self.interval)
        self.tat = now + tau - units * self.interval

    def left(self, now: float) -> float:
        """Units in the budget at ``now`` (negative while in debt)."""
        return (self.tau - max(0.0, self.tat - now)) / self.interval

    def at(self, now: float, cost: float, ahead: float = 0.0) -> float:
        """Earliest time ``>= now`` this budget can pay ``cost`` behind ``ahead`` units."""
        interval = self.interval
        tat = max(self.tat, now) + ahead * interval
        return max(now, tat - self.tau + min(cost * interval, self.tau))

    def pay(self, at: float, cost: float) -> None:
        """Charge ``cost`` units at time ``at``."""
        if cost:
            self.tat = max(self.tat, at) + cost * self.interval
            self.spent += cost

    def settle(self, delta: float, now: float | None) -> None:
        """Charge ``delta`` more units at ``now`` (a refund when negative; see ``Budgets``)."""
        if delta > 0:
            self.spent += delta
            if now is not None and self.tat < now:
                self.tat = now
        elif delta < 0:
            self.back -= delta
        self.tat += delta * self.interval

    def refund(self, units: float) -> None:
        """Give ``units`` back (an admission that was never used)."""
        self.tat -= units * self.interval

    def hold(self, at: float) -> None:
        """Spend the budget until ``at``: empty then (a provider said it is drained)."""
        self.tat = max(self.tat, at + self.tau)

    def sync(self, now: float, left: float, since: float) -> bool:
        """Bring the level to ``left - since`` units (a provider's ``remaining`` less our
        charges since it was sent), capped at the burst; ``True`` if it changed.

        Down always, as the request and total-token budgets are synced. Up only while
        this budget's net charges are within its first bucket (``tau`` seconds of refill):
        a provider's bucket starts full, this one empty, and the provider's count is what
        lets a fleet spend that first bucket (the Anthropic-like TOKEN_TUNING cell 1.126x
        -> 1.031x the oracle, no 429). Raising after it, on every report, overdrew a
        bucket others share: with 55 % of the limit spent by others (an Anthropic-like
        cell with background load, issue 30) 44 % of calls got a 429 and 92 were lost, as
        the total-token raise did before (docs/simulate.md, "Token cells"). A report
        ``d`` seconds old credits no refill since, so it errs low.
        """
        tat = max(now, now + self.tau - (left - since) * self.interval)
        if tat < self.tat and self.spent - self.back > self.tau / self.interval:
            return False  # past the first bucket: lowered only
        if tat != self.tat and not (tat == now and self.tat <= now):
            self.tat = tat
            return True
        return False
