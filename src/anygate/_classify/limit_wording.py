"""The limits a provider's 429 *states in words* -> :class:`LimitReport`.

Why. A per-minute 429 from OpenAI (and the servers that copy its wording: Groq, Together,
many gateways) names the limit it enforced and how full it was::

    Rate limit reached for gpt-4o in organization org-... on tokens per min (TPM):
    Limit 30000, Used 29937, Requested 385. Please try again in 644ms.

and Anthropic's names the limit::

    This request would exceed the rate limit for your organization (...) of 30,000
    input tokens per minute.

The body survives where the ``x-ratelimit-*`` headers do not (a gateway or proxy that
forwards the error but not its headers), and it says the limit at the one moment that
matters. Counted from this client's own sends instead, a bucket that started full read
~176,000 for a real 100,000 TPM (the first bucket's surplus is in the count) and fell a
few thousand tokens per 429: the tier-1-like scenario with the hidden 100,000 TPM behind a
published 200,000 and no headers had 6.67 % of its calls rejected (seeds 1-3), 0.17 %
learning from the wording.

What. :func:`stated_limits` reads the wording (lower-cased text, as
:func:`~anygate._classify.facts.gather` keeps it) into a report whose dimensions are marked
:attr:`~ReportedLimit.refused`: stated by a refusal, so adopted without a second report.
``Used`` gives ``remaining`` (``Limit - Used``, at least 0); no reset is stated (the
"try again in" is the rejected request's wait, which ``Retry-After`` already carries).
Only per-minute limits: "requests per day (RPD)" and the like are quotas, not paces.
:func:`error_limits` is what an exception says in all: its headers' report, with the
dimensions the headers leave out filled in from its wording.

Never raises on what a server sends (a number that is not one is no limit).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Final

from .facts import gather, headers_of
from .header_values import count
from .headers import EMPTY, LimitReport, ReportedLimit, parse_limit_headers

__all__ = ["error_limits", "full_window_limit", "stated_limits"]

_MINUTE: Final = 60.0
# A count, thousands separated or not ("30,000"); it ends on a digit, so a list's comma
# after it ("limit 30000, used ...") is not part of it.
_NUMBER: Final = r"~?(\d(?:[\d,]*\d)?)"
# OpenAI (and Groq, which says "per minute"): "on tokens per min (tpm): limit 30000, used
# 29937, requested 385", the older "on tokens per min. limit: 10000 / min.", and "request
# too large ... on tokens per min (tpm): limit 30000, requested 31538".
_OPENAI: Final = re.compile(
    r"on (requests|tokens|input tokens|output tokens) per min(?:ute)?\b"
    r"(?: \((?:rpm|tpm|itpm|otpm)\))?[:.]? limit:? " + _NUMBER + r"(?: / min)?"
    r"(?:[,.] used:? " + _NUMBER + r")?"
)
# Anthropic: "would exceed the rate limit for your organization (<id>) of 30,000 input
# tokens per minute".
_ANTHROPIC: Final = re.compile(
    r"rate limit for your organization(?: \([^)]*\))? of " + _NUMBER + " "
    r"(requests|tokens|input tokens|output tokens) per minute"
)
_FIELDS: Final = {
    "requests": "requests",
    "tokens": "tokens",
    "input tokens": "input_tokens",
    "output tokens": "output_tokens",
}


def _number(text: str | None) -> float | None:
    return None if text is None else count(text.replace(",", ""))


def stated_limits(text: str) -> LimitReport:
    """The per-minute limits a 429's lower-cased ``text`` states; :data:`EMPTY` if none."""
    found: dict[str, ReportedLimit] = {}
    source = ""
    for match in _OPENAI.finditer(text):
        limit, used = _number(match.group(2)), _number(match.group(3))
        if limit is None or limit <= 0:
            continue
        remaining = None if used is None else max(0.0, limit - used)
        found.setdefault(
            _FIELDS[match.group(1)], ReportedLimit(limit, remaining, None, _MINUTE, refused=True)
        )
        source = source or "openai"
    for match in _ANTHROPIC.finditer(text):
        limit = _number(match.group(1))
        if limit is None or limit <= 0:
            continue
        found.setdefault(
            _FIELDS[match.group(2)], ReportedLimit(limit, None, None, _MINUTE, refused=True)
        )
        source = source or "anthropic"
    if not found:
        return EMPTY
    return LimitReport(**found, source=source)


def error_limits(exc: BaseException, *, headers: bool = True) -> LimitReport:
    """What a failed call's answer says about the provider's limits.

    Its headers' report (:func:`~anygate.parse_limit_headers`), with each dimension the
    headers leave out taken from the words of the error (:func:`stated_limits`).
    ``headers=False``: only those words, for a caller that learned the headers already
    (a gated transport reads every response's headers as it arrives). Never raises.
    """
    try:
        reported = parse_limit_headers(headers_of(exc))
        stated = stated_limits(gather(exc).text)
    except Exception:  # an exception whose attributes misbehave tells nothing
        return EMPTY
    words = {
        field: dim
        for field in ("requests", "tokens", "input_tokens", "output_tokens")
        if getattr(reported, field) is None and (dim := getattr(stated, field)) is not None
    }
    base = reported if headers else EMPTY
    if not words:
        return base
    return dataclasses.replace(base, **words, source=base.source or stated.source)


def full_window_limit(exc: BaseException | None) -> float | None:
    """The requests a minute a rejected call's answer quotes as its limit, when it says
    that minute was full; ``None`` otherwise. Never raises.

    OpenAI's "on requests per min (RPM): Limit 600, Used 600, Requested 1" (or headers
    saying the same: a limit with nothing remaining) quotes the window the 429 met. A
    quote of a window that was not full ("Limit 1200, Used 20": the minute enforced per
    second) names a limit the 429 did not meet, and says nothing of where it is.
    """
    if exc is None:
        return None
    requests = error_limits(exc).requests
    if requests is None or requests.remaining is None or requests.remaining >= 1:
        return None
    return requests.per_minute
