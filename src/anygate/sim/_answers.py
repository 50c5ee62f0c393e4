"""What the simulated provider says: rate-limit headers and error bodies in real formats.

Headers (sent on every response, successes included, when ``provider.headers`` says so):

* ``openai``: ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}``, the reset a Go
  duration (``12ms``, ``1s``, ``6m0s``): the time until the bucket is full again
  (platform.openai.com/docs/guides/rate-limits, "Rate limits in headers").
* ``anthropic``: ``anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-
  {limit,remaining,reset}``, the reset an RFC 3339 time of full replenishment, token counts
  rounded to the nearest thousand, ``tokens`` the most restrictive token limit in effect,
  and a ``date`` header (docs.claude.com/en/api/rate-limits, "Response headers").

Virtual time 0 is :data:`SIM_EPOCH` on the wall clock for the dates.

Bodies: OpenAI's per-minute 429s say which limit was hit ("Rate limit reached for ... on
tokens per min (TPM): Limit L, Used U, Requested R. Please try again in 1.2s."), with the
error ``type`` ``requests`` or ``tokens``; Anthropic's say "This request would exceed the
rate limit for your organization ... of N input tokens per minute" (``rate_limit_error``)
and an overload is 529 ``overloaded_error`` "Overloaded". ``plain_429`` turns every 429
into "Too Many Requests" with no code, as gateways and self-hosted servers often answer.

Objects: what ``send()`` returns (:class:`ProviderResponse`) and raises
(:class:`ProviderError`, shaped like the SDKs' errors), carrying those headers and bodies.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime
from typing import Final, NamedTuple

__all__ = [
    "SIM_EPOCH",
    "Answer",
    "Dimension",
    "ProviderError",
    "ProviderResponse",
    "Used",
    "answer",
    "go_duration",
    "limit_headers",
    "retry_after_seconds",
    "rfc3339",
]

#: The wall-clock instant virtual time 0 stands for (Anthropic's reset times are dates).
SIM_EPOCH: Final = datetime(2026, 1, 1, tzinfo=timezone.utc)
#: The model named in OpenAI's wording (any name does; the classifier ignores it).
MODEL: Final = "gpt-sim"


class Dimension(NamedTuple):
    """One limit as a response reports it."""

    name: str  # requests, tokens, input-tokens, output-tokens
    limit: int
    remaining: float
    reset_s: float


class Used(NamedTuple):
    """The numbers a rate-limit 429 quotes: the limit, what is used, what was asked for."""

    limit: int
    used: int
    requested: int


class Answer(NamedTuple):
    """An error answer: status, code, type, message and the body the SDKs expose."""

    status: int
    code: str
    type: str
    message: str
    body: dict[str, object]


_LEGACY: Final = {
    "burst": (
        429,
        "limit_burst_rate",
        "rate_limit_error",
        "Request rate increased too quickly. To ensure system stability, please adjust your "
        "client logic to scale requests more smoothly over time.",
    ),
    "concurrency": (
        429,
        "concurrency_limit_exceeded",
        "rate_limit_error",
        "Too many concurrent requests for this model.",
    ),
    "overloaded": (503, "overloaded", "overloaded_error", "The server is overloaded."),
    "queue_full": (
        503,
        "server_busy",
        "server_error",
        "server busy, please try again. maximum pending requests exceeded",
    ),
}

_UNITS: Final = {
    "rpm": ("requests per min (RPM)", "requests", "requests"),
    "tpm": ("tokens per min (TPM)", "tokens", "tokens"),
    "itpm": ("input tokens per min (ITPM)", "tokens", "input tokens"),
    "otpm": ("output tokens per min (OTPM)", "tokens", "output tokens"),
}


def go_duration(seconds: float) -> str:
    """A duration as Go's ``time.Duration.String()`` prints it, rounded up to 1 ms.

    ``0.012 -> "12ms"``, ``1 -> "1s"``, ``360 -> "6m0s"``, ``83.5 -> "1m23.5s"``.
    """
    ms = max(0, math.ceil(round(seconds * 1000, 6)))
    if ms == 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs = f"{rest / 1000:.3f}".rstrip("0").rstrip(".")
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


def rfc3339(now: float) -> str:
    """Virtual time ``now`` as an RFC 3339 UTC time, rounded up to the second."""
    when = SIM_EPOCH + timedelta(seconds=math.ceil(round(now, 6)))
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def _thousands(value: float, limit: int) -> int:
    return min(limit, math.floor(value / 1000 + 0.5) * 1000)


def limit_headers(style: str, dims: list[Dimension], now: float) -> dict[str, str]:
    """The rate-limit headers of one response in ``style`` (``openai``/``anthropic``)."""
    headers: dict[str, str] = {}
    if style == "openai":
        for dim in dims:
            if dim.name not in ("requests", "tokens"):
                continue  # OpenAI has no separate input/output limits to report
            headers[f"x-ratelimit-limit-{dim.name}"] = str(dim.limit)
            headers[f"x-ratelimit-remaining-{dim.name}"] = str(math.floor(dim.remaining))
            headers[f"x-ratelimit-reset-{dim.name}"] = go_duration(dim.reset_s)
    elif style == "anthropic":
        token_dims = [d for d in dims if d.name != "requests"]
        if token_dims and not any(d.name == "tokens" for d in token_dims):
            tightest = min(token_dims, key=lambda d: d.remaining)
            dims = [*dims, tightest._replace(name="tokens")]
        for dim in dims:
            prefix = f"anthropic-ratelimit-{dim.name}-"
            remaining = math.floor(dim.remaining)
            if dim.name != "requests":
                remaining = _thousands(dim.remaining, dim.limit)
            headers[prefix + "limit"] = str(dim.limit)
            headers[prefix + "remaining"] = str(remaining)
            headers[prefix + "reset"] = rfc3339(now + dim.reset_s)
        if dims:
            headers["date"] = format_datetime(
                SIM_EPOCH + timedelta(seconds=math.floor(now)), usegmt=True
            )
    return headers


def _wait_text(seconds: float | None) -> str:
    if seconds is None:
        return ""
    return f" Please try again in {go_duration(seconds)}."


def answer(
    kind: str,
    *,
    style: str = "none",
    plain: bool = False,
    used: Used | None = None,
    wait_s: float | None = None,
) -> Answer:
    """The error answer for a rejection of ``kind`` (one of the provider's KINDS).

    ``used`` and ``wait_s`` fill in a per-minute limit's wording; ``style`` picks OpenAI's
    or Anthropic's; ``plain`` drops every word about which limit was hit.
    """
    if kind in ("rpm", "tpm", "itpm", "otpm"):
        status = 429
        unit, type_, noun = _UNITS[kind]
        if style == "anthropic":
            code, type_ = "rate_limit_error", "rate_limit_error"
            limit = f"{used.limit:,} " if used is not None else ""
            message = (
                "This request would exceed the rate limit for your organization (org-sim) "
                f"of {limit}{noun} per minute. For details, refer to: "
                "https://docs.claude.com/en/api/rate-limits."
            )
        else:
            code = "rate_limit_exceeded"
            numbers = ""
            if used is not None:
                numbers = f": Limit {used.limit}, Used {used.used}, Requested {used.requested}"
            message = (
                f"Rate limit reached for {MODEL} in organization org-sim on {unit}{numbers}."
                f"{_wait_text(wait_s)} Visit https://platform.openai.com/account/rate-limits "
                "to learn more."
            )
    elif kind == "overloaded" and style == "anthropic":
        status, code, type_, message = 529, "overloaded_error", "overloaded_error", "Overloaded"
    else:
        status, code, type_, message = _LEGACY[kind]
    if plain and status == 429:
        code, type_, message = "", "", "Too Many Requests"
        return Answer(status, code, type_, message, {"error": {"message": message}})
    if style == "anthropic":
        body: dict[str, object] = {"type": "error", "error": {"type": type_, "message": message}}
    else:
        body = {"error": {"code": code, "type": type_, "message": message}}
    return Answer(status, code, type_, message, body)


def retry_after_seconds(seconds: float) -> int:
    """The ``retry-after`` header's value: whole seconds, rounded up, at least 1.

    Rounded after 6 decimals first so float noise (``2.0000000001``) does not add a second.
    """
    return max(1, math.ceil(round(seconds, 6)))


class _Response:
    """The bit of an HTTP response the SDK errors expose: status and headers."""

    __slots__ = ("headers", "status_code")

    def __init__(self, status_code: int, headers: dict[str, str]) -> None:
        self.status_code: int = status_code
        self.headers: dict[str, str] = headers


class ProviderResponse:
    """A successful answer, as a client sees it: ``send()`` returns it.

    Attributes:
        status_code: 200.
        headers: the rate-limit headers (``provider.headers``), as of admission; empty
            with ``headers: none``.
        usage: ``{"prompt_tokens", "completion_tokens", "total_tokens"}`` (0s without
            ``fleet.tokens``), as the response body's ``usage`` says.
    """

    __slots__ = ("headers", "status_code", "usage")

    def __init__(self, headers: dict[str, str], prompt: int, completion: int) -> None:
        self.status_code: int = 200
        self.headers: dict[str, str] = headers
        self.usage: dict[str, int] = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }


class ProviderError(Exception):
    """Raised by the simulated provider when it turns a request away (429, 503 or 529).

    Attributes:
        kind: one of the provider's kinds (``_provider.KINDS``).
        status_code: 429, 503 or 529 (Anthropic's overload).
        code: the provider's error code, such as ``limit_burst_rate`` (``""`` for a plain
            429).
        type: the provider's error type.
        message: the provider's message.
        body: the error body as the SDKs expose it (``{"error": {...}}``).
        response: has ``status_code`` and ``headers`` (with ``retry-after`` in whole
            seconds, rounded up, and the precise ``retry-after-ms`` when the provider
            sends Retry-After, and the rate-limit headers of ``provider.headers``).
        retry_after: the Retry-After seconds sent, or ``None``.
    """

    def __init__(
        self,
        kind: str,
        retry_after: float | None = None,
        *,
        said: Answer | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        if said is None:
            said = answer(kind)
        super().__init__(f"Error code: {said.status} - {said.code}: {said.message}")
        self.kind = kind
        self.status_code: int = said.status
        self.code: str = said.code
        self.type: str = said.type
        self.message: str = said.message
        self.body: dict[str, object] = said.body
        headers = dict(headers or {})
        if retry_after is not None:
            headers["retry-after-ms"] = str(round(retry_after * 1000))
            # Integer seconds, rounded up, as OpenAI and Anthropic send them (the precise
            # value rides in retry-after-ms). The "%.3f" form sent before is no real
            # provider's, and LiteLLM's int() parse rejected it (issue 29).
            headers["retry-after"] = str(retry_after_seconds(retry_after))
        self.headers = headers
        self.response: _Response = _Response(said.status, headers)
        self.retry_after = retry_after
