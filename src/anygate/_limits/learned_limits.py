"""LearnedLimits: what a gate's RateLearner has learned so far, as a frozen snapshot.

The record :attr:`anygate.RateLearner.limits` returns (the provider's own numbers: the
adopted limits before headroom, the measured shares, the counts of reports, holds and
syncs, the rate last set), kept apart from the learner as the gate's statistics records
are (``_gate/rate.py``).

Not for: learning anything. How reports become a gate's rate is
:mod:`anygate._limits.learn`'s; this module only says what the snapshot holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import final

# At run time, not only for type checkers: typing.get_type_hints(LearnedLimits), which
# Sphinx and users call, resolves the ``rate`` field's annotation here.
from .._gate.rate import Rate  # noqa: TC001 - see the comment above

__all__ = ["LearnedLimits"]


@final
@dataclass(frozen=True)
class LearnedLimits:
    """What a :class:`RateLearner` has learned so far (the provider's own numbers).

    Attributes:
        requests_per_minute: the adopted request limit, before headroom; ``None`` if none.
        tokens_per_minute: the adopted token limit, before headroom; ``None`` if none.
        source: the header family of the last usable report (``"openai"``, ...), or ``""``.
        reports: usable reports observed.
        holds: drained reports that held the gate.
        syncs: reports whose ``remaining`` lowered the gate's budgets.
        requests_share_per_minute: the request rate a shared bucket was measured to leave
            this gate (its limit less what others spend), or ``None`` (not measured).
        tokens_share_per_minute: the same for tokens.
        rate: the rate the learner last set on the gate, or ``None`` if it never set one.
        input_tokens_per_minute: the adopted input-token limit (Anthropic's ITPM), learned
            only for a gate with an input budget of its own; ``None`` if none.
        output_tokens_per_minute: the same for output tokens (OTPM).
    """

    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    source: str = ""
    reports: int = 0
    holds: int = 0
    rate: Rate | None = None
    syncs: int = 0
    requests_share_per_minute: float | None = None
    tokens_share_per_minute: float | None = None
    input_tokens_per_minute: float | None = None
    output_tokens_per_minute: float | None = None
