"""The entry points that hand what a provider answered to a gate's :class:`RateLearner`.

:func:`learn_from_headers` for a response (the transports call it on every response; a
policy on results that expose headers), :func:`learn_from_error` for a failed call (its
headers, and the limits a 429 states in words: :mod:`anygate._classify.limit_wording`).
Neither makes a learner for a gate that never hears a limit, nor raises on what the
provider said. :func:`raise_ceiling` is the fleet's: a live rate set above a learner's
ceiling raises it.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from .._classify.headers import parse_limit_headers
from .._classify.limit_wording import error_limits
from .learn import _KINDS, _SPLIT_KINDS, RateLearner

if TYPE_CHECKING:
    from .._gate.gate import Gate
    from .._gate.rate import BudgetMark, Rate

__all__ = ["learn_from_error", "learn_from_headers", "raise_ceiling"]


def learn_from_headers(
    gate: Gate, headers: object, *, now: float | None = None, sent: BudgetMark | None = None
) -> bool:
    """Let ``gate``'s :class:`RateLearner` learn from one response's headers.

    The entry point for code that sees responses (the transports call it on every
    response; a policy on results that expose headers). Never raises on what the headers
    say.

    Args:
        gate: the gate to pace.
        headers: httpx / httpx2 ``Headers``, a mapping, pairs, or ``None`` (nothing).
        now: when the response arrived, on the gate's clock; default now.
        sent: ``gate.budget_mark()`` taken when the reported request was admitted:
            with it, the reported ``remaining`` lowers the gate's budgets
            (:meth:`RateLearner.observe`).

    Returns:
        ``True`` if the gate's rate, hold or budget level changed.
    """
    report = parse_limit_headers(headers)
    if not report:
        return False  # no learner is made for a gate that never hears a limit
    return RateLearner.of(gate).observe(report, now, sent=sent)


def learn_from_error(
    gate: Gate,
    exc: BaseException,
    *,
    now: float | None = None,
    sent: BudgetMark | None = None,
    headers: bool = True,
) -> bool:
    """Let ``gate``'s :class:`RateLearner` learn from a failed call's answer.

    Its rate-limit headers, as :func:`learn_from_headers`, and the token limits its 429
    states in words where the headers say nothing of them: OpenAI's "... on tokens per min
    (TPM): Limit 30000, Used 29937, Requested 385" (the limit, and ``Limit - Used``
    remaining) and Anthropic's "... of 30,000 input tokens per minute" (the limit). A
    limit stated by a refusal is adopted at once, without ``confirm`` reports in a row.
    A request limit in words is left to the adaptive limit, which counts
    it at each per-minute 429 (``docs/learning.md``). Never raises on what the provider
    said.

    Args:
        gate: the gate to pace.
        exc: the exception the call raised (an SDK's ``RateLimitError``, an
            ``httpx.HTTPStatusError``, anything carrying a response or a message).
        now: when the answer arrived, on the gate's clock; default now.
        sent: ``gate.budget_mark()`` taken when the refused request was admitted (see
            :func:`learn_from_headers`).
        headers: ``False`` when the headers were learned from already (a gated
            transport reads them as the response arrives): only the stated limits the
            headers left out are learned.

    Returns:
        ``True`` if the gate's rate, hold or budget level changed.
    """
    report = error_limits(exc, headers=headers)
    if report.requests is not None and report.requests.refused:
        # A request limit is not learned from words: the adaptive limit counts it at each
        # per-minute 429 within one request (``_limits.requests``), and follows a sliding
        # window, which the gate's rate budget does not: paced at the stated 600 RPM, the
        # morning peak with a hidden 600 behind a published 1,200 went 0.999x -> 1.021x.
        report = dataclasses.replace(report, requests=None)
    if not report:
        return False
    return RateLearner.of(gate).observe(report, now, sent=sent)


def raise_ceiling(gate: Gate, rate: Rate) -> None:
    """Raise the ceiling of ``gate``'s learner, if it has one, to at least ``rate`` in
    each dimension both have: a fleet's live rate set above it (``FleetGate.set_rate``,
    by a user in any process) is then not learned back down to the fleet's rate when
    the learner was made. A learned rate never exceeds its learner's ceiling, so
    adopting one changes nothing here."""
    learner = RateLearner._existing(gate)
    ceiling = None if learner is None else learner.ceiling
    if learner is None or ceiling is None:
        return
    raised = {
        field: max(old, new)
        for field in (f"{kind}_per_minute" for kind in (*_KINDS, *_SPLIT_KINDS))
        if (old := getattr(ceiling, field)) is not None
        and (new := getattr(rate, field)) is not None
    }
    learner.ceiling = dataclasses.replace(ceiling, **raised)
