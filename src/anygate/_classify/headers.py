"""Rate-limit response headers -> :class:`LimitReport`: what the provider says its limits are.

Three header families, read from any response (success or error):

* OpenAI (and many compatible servers: Azure OpenAI, Groq, Together, vLLM gateways)::

      x-ratelimit-limit-requests: 500        x-ratelimit-limit-tokens: 30000
      x-ratelimit-remaining-requests: 499    x-ratelimit-remaining-tokens: 29000
      x-ratelimit-reset-requests: 120ms      x-ratelimit-reset-tokens: 2s

  limits per minute; reset is a Go duration (``6m0s``, ``12ms``, ``1h2m3.5s``, ``0s``) or
  plain seconds, the time until the bucket is full again.
* Anthropic: ``anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,
  remaining,reset}``, limits per minute, reset an RFC 3339 time of full replenishment,
  turned into seconds from the response's ``Date`` header (or the local clock). The
  ``tokens-*`` trio is "the most restrictive limit currently in effect", not a limit on
  total tokens: :attr:`LimitReport.token_limit` paces by the input/output limits when
  they are sent (docs.claude.com/en/api/rate-limits, "Response headers"). Its token
  ``remaining`` values are "rounded to the nearest thousand": a whole thousand is
  reported less the 500 the rounding may have added (see ``_ANTHROPIC_ROUNDING``).
* IETF (draft-ietf-httpapi-ratelimit-headers), both generations: the older trio
  ``RateLimit-Limit`` / ``RateLimit-Remaining`` / ``RateLimit-Reset`` (delta seconds; the
  window from ``RateLimit-Policy: 100;w=60`` or a ``;w=`` on the limit), the dictionary
  form ``RateLimit: limit=100, remaining=5, reset=30``, and the newer structured fields
  ``RateLimit: "name";r=5;t=30`` with ``RateLimit-Policy: "name";q=100;w=60`` (matched by
  name; ``qu`` other than requests is ignored; of several policies the one with the
  lowest rate is reported).

Nothing here raises on what a server sends: absent, garbage, NaN, negative, ``-1`` and
``0`` limits (Azure has been seen sending both), a remaining above its limit, resets
beyond a day: each value that cannot be trusted is dropped, and a dimension whose
remaining contradicts its limit is dropped whole (we cannot tell which one lies).

This is parsing only: what to do with a report is :mod:`anygate._limits.learn`'s business.
One concern: limit headers into one report, for the three families, with the consistency
checks they share (:func:`_dimension`). The text of a single value (counts, durations,
dates) is read by :mod:`~anygate._classify.header_values`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import final

# MAX_RESET_S is re-exported: the limits read it here, with the report it bounds.
from .header_values import MAX_RESET_S as MAX_RESET_S
from .header_values import bounded_seconds, count, date_of, go_duration, rfc3339_seconds

__all__ = ["EMPTY", "LimitReport", "ReportedLimit", "parse_limit_headers"]

_MINUTE = 60.0
#: Anthropic rounds each token ``remaining`` to the nearest thousand (its rate-limit
#: documentation, "Response headers"); a value that is a whole thousand (0 aside) is
#: reported less half of that, the least it may have been. Taken at face value, a rounded-up level let the gate's output-token
#: budget (set to the provider's count) send a 1,000-token reservation into an OTPM
#: bucket holding 600-990 of them: an Anthropic-like project a tier below its published
#: 30,000 / 8,000 (15,000 ITPM, 4,000 OTPM, 40 agents; seeds 1-3) got 2.5 % of calls a
#: 429 (13 % in seed 1).
_ANTHROPIC_ROUNDING = 1000


@final
@dataclass(frozen=True)
class ReportedLimit:
    """One limit (requests or tokens) as a response reported it; every field may be ``None``.

    Attributes:
        limit: units allowed per ``window_s`` (``> 0``), or ``None`` if not (credibly) sent.
        remaining: units left now (``0 <= remaining <= limit``).
        reset_s: seconds from the response until the limit is fully available again
            (``>= 0``, at most a day).
        window_s: the window ``limit`` is counted over, in seconds: 60 for OpenAI and
            Anthropic (per-minute limits), ``w`` of an IETF policy (``None`` if unknown).
        refused: stated by a refusal on this limit (a 429's wording, read by
            :func:`~anygate._classify.limit_wording.stated_limits`), not by headers: a
            provider that turned a request away at this limit is not a fresh key's full
            bucket, so one such report is evidence enough (``RateLearner``'s ``confirm``).
    """

    limit: float | None = None
    remaining: float | None = None
    reset_s: float | None = None
    window_s: float | None = None
    refused: bool = False

    @property
    def per_minute(self) -> float | None:
        """``limit`` scaled to one minute, or ``None`` without a limit or a window."""
        if self.limit is None or self.window_s is None:
            return None
        return self.limit * _MINUTE / self.window_s

    @property
    def drained(self) -> bool:
        """Whether the provider says nothing is left (``remaining == 0``)."""
        return self.remaining == 0


@final
@dataclass(frozen=True)
class LimitReport:
    """What one response's headers say about the provider's limits.

    Attributes:
        requests: the request limit, or ``None`` if the response said nothing usable.
        tokens: the token limit as the ``*-tokens`` headers state it: OpenAI's tokens per
            minute (input plus output); Anthropic's ``anthropic-ratelimit-tokens-*``, which
            shows *the most restrictive token limit currently in effect* (Anthropic's
            rate-limit docs): one of the input, output or workspace limits, or a combined
            view, depending on the moment, so it is not a budget for total tokens when the
            split limits are reported (see :attr:`token_limit`).
        input_tokens: Anthropic's input-token limit (ITPM).
        output_tokens: Anthropic's output-token limit (OTPM).
        source: ``"openai"``, ``"anthropic"``, ``"ietf"``, or ``""`` when nothing was found
            (the first family found wins; providers send one).
    """

    requests: ReportedLimit | None = None
    tokens: ReportedLimit | None = None
    input_tokens: ReportedLimit | None = None
    output_tokens: ReportedLimit | None = None
    source: str = ""

    def __bool__(self) -> bool:
        return any(
            d is not None
            for d in (self.requests, self.tokens, self.input_tokens, self.output_tokens)
        )

    @property
    def token_limit(self) -> ReportedLimit | None:
        """The budget for *total* tokens (input plus output), what a gate that charges one
        token count per call paces by; ``None`` when the provider limits input and output
        separately.

        * OpenAI (and a response with no input/output split): ``tokens``.
        * Anthropic with input and/or output limits: none. ``tokens`` shows whichever
          limit binds now, so pacing total tokens by it is wrong both ways; the lower of
          the split limits paced an agent fleet (2,000-token prompts, ITPM 30,000, OTPM
          8,000) at 8,000 total tokens a minute, 5.3x the oracle's makespan, and their sum
          overran the input limit. One total-token budget cannot stand for two; a drained
          input or output limit still holds the gate (:attr:`split_limits`).
        """
        if self.input_tokens is not None or self.output_tokens is not None:
            return None
        return self.tokens

    @property
    def split_limits(self) -> tuple[ReportedLimit, ...]:
        """The separate input and output token limits reported (Anthropic), if any."""
        return tuple(d for d in (self.input_tokens, self.output_tokens) if d is not None)


#: The report of a response that says nothing.
EMPTY = LimitReport()

# ---------------------------------------------------------------------- dimensions


def _dimension(
    limit: float | None, remaining: float | None, reset_s: float | None, window_s: float | None
) -> ReportedLimit | None:
    """A dimension from its checked values; ``None`` if empty or self-contradictory."""
    if limit is not None and limit <= 0:
        limit = None  # Azure's -1 / 0: "no limit known", not "nothing allowed"
    if limit is not None and remaining is not None and remaining > limit:
        return None  # contradictory: we cannot tell which number lies
    if limit is None and remaining is None and reset_s is None:
        return None
    return ReportedLimit(limit, remaining, reset_s, window_s if limit is not None else None)


# ---------------------------------------------------------------------- header access


def _lowered(headers: object) -> dict[str, str] | None:
    """The rate-limit-relevant headers by lower-cased name, or ``None`` if there are none.

    Accepts httpx / httpx2 ``Headers`` (read through ``raw``: bytes pairs, nothing decoded
    that is not needed), mappings, and sequences of ``(name, value)`` pairs, with ``str``
    or ``bytes`` names and values. Only names that mention ``ratelimit`` (and ``date``)
    are kept: a response without them costs one pass over its names.
    """
    items: object = getattr(headers, "raw", None)
    if not isinstance(items, list):
        method = getattr(headers, "items", None)
        items = method() if method is not None else headers
    found: dict[str, str] | None = None
    date: str | None = None
    for key, value in items:  # type: ignore[attr-defined]
        if isinstance(key, bytes):
            lower = key.lower()
            if b"ratelimit" not in lower:
                if lower == b"date":
                    date = value.decode("latin-1") if isinstance(value, bytes) else str(value)
                continue
            name = lower.decode("latin-1")
        else:
            name = key.lower()
            if "ratelimit" not in name:
                if name == "date":
                    date = value.decode("latin-1") if isinstance(value, bytes) else str(value)
                continue
        text = value.decode("latin-1") if isinstance(value, bytes) else str(value)
        if found is None:
            found = {}
        # Repeated fields join with ", " (RFC 9110), which structured fields expect.
        found[name] = f"{found[name]}, {text}" if name in found else text
    if found is not None and date is not None:
        found["date"] = date
    return found


def parse_limit_headers(headers: object, *, now: float | None = None) -> LimitReport:
    """Read a response's rate-limit headers; never raises.

    Args:
        headers: httpx / httpx2 ``Headers``, any mapping, or a sequence of ``(name,
            value)`` pairs; names match case-insensitively. ``None`` gives an empty report.
        now: the wall-clock time (POSIX seconds) to measure Anthropic's reset times from
            when the response has no usable ``Date`` header; default ``time.time()``.

    Returns:
        A :class:`LimitReport`; falsy (:data:`EMPTY`) when nothing usable was sent.
    """
    if headers is None:
        return EMPTY
    try:
        found = _lowered(headers)
    except Exception:  # a headers object that cannot be iterated as pairs
        return EMPTY
    if found is None:
        return EMPTY
    try:
        return _parse(found, now)
    except Exception:  # belt and braces: a server must never break the caller
        return EMPTY


def _parse(h: dict[str, str], now: float | None) -> LimitReport:
    if any(k.startswith("x-ratelimit-") for k in h):
        report = _openai(h)
        if report:
            return report
    if any(k.startswith("anthropic-ratelimit-") for k in h):
        report = _anthropic(h, now)
        if report:
            return report
    if any(k.startswith("ratelimit") for k in h):
        return _ietf(h)
    return EMPTY


def _openai(h: dict[str, str]) -> LimitReport:
    dims = [
        _dimension(
            count(h.get(f"x-ratelimit-limit-{kind}")),
            count(h.get(f"x-ratelimit-remaining-{kind}")),
            go_duration(h.get(f"x-ratelimit-reset-{kind}")),
            _MINUTE,
        )
        for kind in ("requests", "tokens")
    ]
    return LimitReport(requests=dims[0], tokens=dims[1], source="openai")


def _anthropic(h: dict[str, str], now: float | None) -> LimitReport:
    base = date_of(h.get("date"))
    if base is None:
        base = time.time() if now is None else now
    dims = {}
    resets: dict[str, float | None] = {}  # the dimensions usually share one reset time
    for kind in ("requests", "tokens", "input-tokens", "output-tokens"):
        prefix = f"anthropic-ratelimit-{kind}-"
        raw = h.get(prefix + "reset")
        if raw is None:
            reset = None
        elif raw in resets:
            reset = resets[raw]
        else:
            reset = resets[raw] = rfc3339_seconds(raw, base)
        remaining = count(h.get(prefix + "remaining"))
        if remaining and kind != "requests" and remaining % _ANTHROPIC_ROUNDING == 0:
            remaining -= _ANTHROPIC_ROUNDING // 2  # rounded: the least it may have been
        dims[kind] = _dimension(count(h.get(prefix + "limit")), remaining, reset, _MINUTE)
    return LimitReport(
        requests=dims["requests"],
        tokens=dims["tokens"],
        input_tokens=dims["input-tokens"],
        output_tokens=dims["output-tokens"],
        source="anthropic",
    )


# ---------------------------------------------------------------------- IETF fields

_Item = tuple[str, dict[str, str]]


def _split(text: str, sep: str) -> list[str]:
    """Split on ``sep`` outside double quotes."""
    parts: list[str] = []
    quoted = False
    start = 0
    for i, ch in enumerate(text):
        if ch == '"':
            quoted = not quoted
        elif ch == sep and not quoted:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _items(text: str) -> list[_Item]:
    """A structured-field list (or dictionary) as ``(bare item, params)`` pairs, leniently.

    ``"name";q=100;w=60`` gives ``("name", {"q": "100", "w": "60"})``; a dictionary member
    ``limit=100;w=60`` gives ``("limit", {"": "100", "w": "60"})`` (its value under "").
    """
    items: list[_Item] = []
    for member in _split(text, ","):
        pieces = _split(member.strip(), ";")
        head = pieces[0].strip()
        params: dict[str, str] = {}
        if "=" in head and not head.startswith('"'):
            head, _, value = head.partition("=")
            params[""] = value.strip()
        for piece in pieces[1:]:
            key, _, value = piece.strip().partition("=")
            params[key.strip().lower()] = value.strip().strip('"') if value else "?1"
        items.append((head.strip().strip('"'), params))
    return items


def _ietf(h: dict[str, str]) -> LimitReport:
    policies = _items(h["ratelimit-policy"]) if "ratelimit-policy" in h else []
    if "ratelimit" in h:
        items = _items(h["ratelimit"])
        if any(p.get("") is not None for _, p in items):
            return _ietf_dictionary(items, policies)
        return _ietf_named(items, policies)
    return _ietf_trio(h, policies)


def _window(params: dict[str, str]) -> float | None:
    w = count(params.get("w"))
    return w if w is not None and w > 0 else None


def _ietf_trio(h: dict[str, str], policies: list[_Item]) -> LimitReport:
    # RateLimit-Limit may carry the policies itself: "100, 100;w=60, 1000;w=3600".
    raw = h.get("ratelimit-limit")
    limit_items = _items(raw) if raw is not None else []
    limit = count(limit_items[0][0]) if limit_items else None
    window = None
    for value, params in [*limit_items, *policies]:
        if count(value) == limit and _window(params) is not None:
            window = _window(params)
            break
    dim = _dimension(
        limit,
        count(h.get("ratelimit-remaining")),
        bounded_seconds(count(h.get("ratelimit-reset"))),
        window,
    )
    return LimitReport(requests=dim, source="ietf") if dim is not None else EMPTY


def _ietf_dictionary(items: list[_Item], policies: list[_Item]) -> LimitReport:
    # draft 05-07: RateLimit: limit=100, remaining=5, reset=30
    values = {name.lower(): p.get("", "") for name, p in items}
    limit = count(values.get("limit"))
    window = None
    for value, params in policies:
        if count(value) == limit:
            window = _window(params)
            break
    dim = _dimension(
        limit, count(values.get("remaining")), bounded_seconds(count(values.get("reset"))), window
    )
    return LimitReport(requests=dim, source="ietf") if dim is not None else EMPTY


def _ietf_named(items: list[_Item], policies: list[_Item]) -> LimitReport:
    # draft 08+: RateLimit: "name";r=5;t=30 with RateLimit-Policy: "name";q=100;w=60
    by_name = dict(policies)
    best: ReportedLimit | None = None
    for name, params in items:
        policy = by_name.get(name, {})
        if policy.get("qu", "requests") != "requests":
            continue  # content-bytes, concurrent-requests: not a request rate
        dim = _dimension(
            count(policy.get("q")),
            count(params.get("r")),
            bounded_seconds(count(params.get("t"))),
            _window(policy),
        )
        if dim is None:
            continue
        if best is None or _stricter(dim, best):
            best = dim
    return LimitReport(requests=best, source="ietf") if best is not None else EMPTY


def _stricter(a: ReportedLimit, b: ReportedLimit) -> bool:
    """Whether ``a`` binds harder than ``b``: drained first, then the lower rate."""
    if a.drained != b.drained:
        return a.drained
    rate_a = math.inf if a.per_minute is None else a.per_minute
    rate_b = math.inf if b.per_minute is None else b.per_minute
    return rate_a < rate_b
