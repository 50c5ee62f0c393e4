"""The limits a 429 states in words: parsed from real providers' wording, learned at once.

Messages are real ones (OpenAI, Groq, Anthropic, as users have reported them), lower-cased
as :func:`anygate._classify.facts.gather` keeps an exception's text.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from anygate import (
    Gate,
    LimitReport,
    Rate,
    RateLearner,
    ReportedLimit,
    learn_from_error,
)
from anygate._classify.limit_wording import error_limits, full_window_limit, stated_limits

OPENAI_TPM = (
    "Rate limit reached for gpt-4o in organization org-abc on tokens per min (TPM): "
    "Limit 30000, Used 29937, Requested 385. Please try again in 644ms. Visit "
    "https://platform.openai.com/account/rate-limits to learn more."
)


def stated(limit: float, remaining: float | None = None) -> ReportedLimit:
    return ReportedLimit(limit, remaining, None, 60.0, refused=True)


@pytest.mark.parametrize(
    ("text", "field", "expected"),
    [
        (OPENAI_TPM, "tokens", stated(30_000, 63)),
        (  # Used above the limit (Groq; OpenAI too): nothing left, not a negative count
            "Rate limit reached for model `llama3-70b-8192` in organization `org_123` on "
            "tokens per minute (TPM): Limit 5000, Used 5747, Requested ~4251. Please try "
            "again in 59.977s.",
            "tokens",
            stated(5_000, 0),
        ),
        (  # the older wording: the limit only
            "Rate limit reached for 10KTPM-200RPM in organization org-g on tokens per min. "
            "Limit: 10000 / min. Please try again in 6ms.",
            "tokens",
            stated(10_000),
        ),
        (  # a request larger than the limit still states it
            "Request too large for gpt-4o in organization org-7 on tokens per min (TPM): "
            "Limit 30000, Requested 31538. The input or output tokens must be reduced.",
            "tokens",
            stated(30_000),
        ),
        (
            "Rate limit reached for gpt-4o-mini in organization org-x on requests per min "
            "(RPM): Limit 500, Used 500, Requested 1. Please try again in 120ms.",
            "requests",
            stated(500, 0),
        ),
        (
            "This request would exceed the rate limit for your organization (4f1e-a2) of "
            "30,000 input tokens per minute. For details, refer to: https://docs.claude.com.",
            "input_tokens",
            stated(30_000),
        ),
        (
            "This request would exceed the rate limit for your organization (4f1e-a2) of "
            "8,000 output tokens per minute.",
            "output_tokens",
            stated(8_000),
        ),
    ],
)
def test_real_wording_states_the_limit(text: str, field: str, expected: ReportedLimit) -> None:
    report = stated_limits(text.lower())
    assert getattr(report, field) == expected
    others = {"requests", "tokens", "input_tokens", "output_tokens"} - {field}
    assert all(getattr(report, other) is None for other in others)


@pytest.mark.parametrize(
    "text",
    [
        # A daily quota is no pace.
        "Rate limit reached for gpt-4 on requests per day (RPD): Limit 200, Used 200, Requested 1.",
        "Rate limit reached for model on tokens per day (TPD): Limit 500000, Used 499000",
        # No number, or none that is a limit.
        "Requests to the ChatCompletions_Create Operation have exceeded token rate limit of "
        "your current OpenAI S0 pricing tier. Please retry after 6 seconds.",
        "Too Many Requests",
        "on tokens per min (TPM): Limit 0, Used 0, Requested 5.",
        "",
    ],
)
def test_wording_without_a_per_minute_limit_states_nothing(text: str) -> None:
    assert not stated_limits(text.lower())


@given(st.text(max_size=300))
def test_any_text_never_raises(text: str) -> None:
    report = stated_limits(text.lower())
    for dim in (report.requests, report.tokens, report.input_tokens, report.output_tokens):
        if dim is not None:
            assert dim.limit is not None
            assert dim.limit > 0
            assert dim.remaining is None or 0 <= dim.remaining <= dim.limit


class _Response:
    status_code = 429

    def __init__(self, headers: dict[str, str]) -> None:
        self.headers = headers


class RateLimited(Exception):
    """Shaped like the SDKs' RateLimitError: a message and a response with headers."""

    def __init__(self, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.response = _Response(headers or {})


def test_headers_win_and_the_words_fill_in_what_they_leave_out() -> None:
    exc = RateLimited(
        OPENAI_TPM,
        {"x-ratelimit-limit-requests": "500", "x-ratelimit-remaining-requests": "499"},
    )
    report = error_limits(exc)
    assert report.requests == ReportedLimit(500, 499, None, 60.0)
    assert report.tokens == stated(30_000, 63)
    assert report.source == "openai"
    # The headers learned already (a transport): only what they leave out.
    assert error_limits(exc, headers=False) == LimitReport(
        tokens=stated(30_000, 63), source="openai"
    )
    told = RateLimited(
        OPENAI_TPM,
        {"x-ratelimit-limit-tokens": "40000", "x-ratelimit-remaining-tokens": "100"},
    )
    assert error_limits(told).tokens == ReportedLimit(40_000, 100, None, 60.0)
    assert not error_limits(told, headers=False)


class Broken(Exception):
    """An exception whose attributes raise."""

    @property
    def response(self) -> Any:
        raise RuntimeError("no response")

    def __str__(self) -> str:
        raise RuntimeError("no text")


def test_an_error_whose_attributes_raise_tells_nothing() -> None:
    assert not error_limits(Broken())
    gate = Gate(4)
    assert not learn_from_error(gate, Broken())
    assert gate.rate is None


def test_a_stated_limit_is_adopted_at_once_a_header_limit_after_two() -> None:
    gate = Gate(4)
    assert learn_from_error(gate, RateLimited(OPENAI_TPM))
    assert gate.rate == Rate(tokens_per_minute=27_000)  # unsynced: 90 %
    headers = Gate(4)
    plain = {"x-ratelimit-limit-tokens": "30000", "x-ratelimit-remaining-tokens": "63"}
    assert not learn_from_error(headers, RateLimited("Too Many Requests", plain))
    assert headers.rate is None
    assert learn_from_error(headers, RateLimited("Too Many Requests", plain))
    assert headers.rate == Rate(tokens_per_minute=27_000)


def test_a_stated_limit_syncs_the_budget_to_what_the_words_leave() -> None:
    clock = [1_000.0]
    gate = Gate(4, rate=Rate(tokens_per_minute=200_000, burst_s=60), clock=lambda: clock[0])
    clock[0] += 60
    mark = gate.budget_mark()
    assert learn_from_error(gate, RateLimited(OPENAI_TPM), sent=mark)
    assert gate.rate == Rate(tokens_per_minute=30_000, burst_s=60)  # synced: the whole limit
    rate = gate.statistics().rate
    assert rate is not None
    assert rate.tokens_available == pytest.approx(63)
    limits = RateLearner.of(gate).limits
    assert (limits.tokens_per_minute, limits.syncs) == (30_000, 1)


def test_headers_that_follow_a_stated_limit_replace_it() -> None:
    gate = Gate(4)
    learn_from_error(gate, RateLimited(OPENAI_TPM))
    plain = {"x-ratelimit-limit-tokens": "40000", "x-ratelimit-remaining-tokens": "100"}
    learn_from_error(gate, RateLimited("Too Many Requests", plain))
    assert gate.rate == Rate(tokens_per_minute=27_000)  # one header report: no evidence
    learn_from_error(gate, RateLimited("Too Many Requests", plain))
    assert gate.rate == Rate(tokens_per_minute=36_000)


def test_a_stated_limit_stays_under_the_users_ceiling() -> None:
    gate = Gate(4, rate=Rate(tokens_per_minute=20_000))
    learn_from_error(gate, RateLimited(OPENAI_TPM))
    assert gate.rate == Rate(tokens_per_minute=20_000)
    assert RateLearner.of(gate).limits.tokens_per_minute == 30_000


def test_a_request_limit_in_words_is_left_to_the_adaptive_limit() -> None:
    """Parsed, but not learned: the send path's window estimate counts requests at each
    per-minute 429 (docs/learning.md, "Limits a 429 states in words")."""
    exc = RateLimited(
        "Rate limit reached for gpt-4o-mini in organization org-x on requests per min "
        "(RPM): Limit 500, Used 500, Requested 1."
    )
    assert error_limits(exc).requests == stated(500, 0)
    gate = Gate(4)
    assert not learn_from_error(gate, exc)
    assert gate.rate is None


OPENAI_RPM = (
    "Rate limit reached for gpt-4o in organization org-abc on requests per min (RPM): "
    "Limit {limit}, Used {used}, Requested 1. Please try again in 100ms."
)


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (RateLimited(OPENAI_RPM.format(limit=600, used=600)), 600.0),
        (RateLimited(OPENAI_RPM.format(limit=600, used=612)), 600.0),  # Used above: full
        # The minute enforced per second: a limit the 429 did not meet.
        (RateLimited(OPENAI_RPM.format(limit=1200, used=20)), None),
        (RateLimited(OPENAI_TPM), None),  # tokens, not requests
        (RateLimited("Too Many Requests"), None),
        (
            RateLimited(
                "", {"x-ratelimit-limit-requests": "500", "x-ratelimit-remaining-requests": "0"}
            ),
            500.0,
        ),
        (
            RateLimited(
                "", {"x-ratelimit-limit-requests": "500", "x-ratelimit-remaining-requests": "3"}
            ),
            None,
        ),
        (None, None),
    ],
)
def test_a_full_windows_quoted_request_limit(exc: Exception | None, expected: float | None) -> None:
    """The requests a minute a 429 quotes as the limit it met: only with its window full
    (nothing remaining), in words or headers."""
    assert full_window_limit(exc) == expected


def test_a_quote_from_an_error_whose_attributes_raise_is_none() -> None:
    assert full_window_limit(Broken()) is None
