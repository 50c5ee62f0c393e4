"""Rate-limit header parsing: each provider format, each garbage case, and never raising."""

from __future__ import annotations

import math
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from anygate import LimitReport, ReportedLimit, headers_of, parse_limit_headers
from anygate._classify.header_values import go_duration, rfc3339_seconds

OPENAI = {
    "x-ratelimit-limit-requests": "500",
    "x-ratelimit-remaining-requests": "499",
    "x-ratelimit-reset-requests": "120ms",
    "x-ratelimit-limit-tokens": "30000",
    "x-ratelimit-remaining-tokens": "29000",
    "x-ratelimit-reset-tokens": "2s",
}

ANTHROPIC = {
    "date": "Thu, 03 Dec 2026 10:00:00 GMT",
    "anthropic-ratelimit-requests-limit": "50",
    "anthropic-ratelimit-requests-remaining": "49",
    "anthropic-ratelimit-requests-reset": "2026-12-03T10:00:01Z",
    "anthropic-ratelimit-tokens-limit": "48000",
    "anthropic-ratelimit-tokens-remaining": "47000",
    "anthropic-ratelimit-tokens-reset": "2026-12-03T10:00:01.5Z",
    "anthropic-ratelimit-input-tokens-limit": "40000",
    "anthropic-ratelimit-input-tokens-remaining": "39000",
    "anthropic-ratelimit-input-tokens-reset": "2026-12-03T12:00:02+02:00",
    "anthropic-ratelimit-output-tokens-limit": "8000",
    "anthropic-ratelimit-output-tokens-remaining": "8000",
    "anthropic-ratelimit-output-tokens-reset": "2026-12-03T10:00:00Z",
}


# ----------------------------------------------------------------------------- OpenAI


@pytest.mark.parametrize(
    "headers",
    [
        OPENAI,
        httpx.Headers(OPENAI),
        list(OPENAI.items()),
        [(k.upper().encode(), v.encode()) for k, v in OPENAI.items()],
    ],
    ids=["dict", "httpx", "pairs", "bytes-pairs"],
)
def test_openai_headers_in_every_container(headers: Any) -> None:
    """OpenAI's six headers parse the same from a dict, httpx Headers and (bytes) pairs."""
    report = parse_limit_headers(headers)
    assert report.source == "openai"
    assert report.requests == ReportedLimit(500, 499, 0.12, 60)
    assert report.tokens == ReportedLimit(30000, 29000, 2.0, 60)
    assert report.token_limit is report.tokens
    assert report.requests.per_minute == 500


def test_httpx2_headers() -> None:
    """httpx2's Headers work too (the SDKs' own response headers)."""
    httpx2 = pytest.importorskip("httpx2")
    report = parse_limit_headers(httpx2.Headers(OPENAI))
    assert report.requests == ReportedLimit(500, 499, 0.12, 60)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("6m0s", 360.0),
        ("12ms", 0.012),
        ("1h2m3.5s", 3723.5),
        ("0s", 0.0),
        ("0", 0.0),
        ("1.5", 1.5),
        ("250us", 250e-6),
        ("250\u00b5s", 250e-6),
        ("1m30.5s", 90.5),
        (".5s", 0.5),
        ("7ns", 7e-9),
    ],
)
def test_go_durations(text: str, seconds: float) -> None:
    """Go durations (and plain seconds) become seconds."""
    assert go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text", ["", "s", "-1s", "1x", "1s2", "abc", "1s 2m", "nan", "inf", "25h1s", "1" * 80, "--"]
)
def test_garbage_go_durations_are_none(text: str) -> None:
    """Garbage, negative and beyond-a-day durations are dropped, not guessed."""
    assert go_duration(text) is None


# ----------------------------------------------------------------------------- Anthropic


def test_anthropic_headers_count_resets_from_the_date_header() -> None:
    """RFC 3339 resets (Z, fractions, offsets) are seconds from the response's Date.
    Token counts come rounded to the nearest thousand: a whole thousand is reported
    less 500, the least it may have been; requests are exact."""
    report = parse_limit_headers(ANTHROPIC, now=0.0)  # now is ignored: Date is used
    assert report.source == "anthropic"
    assert report.requests == ReportedLimit(50, 49, 1.0, 60)
    assert report.tokens == ReportedLimit(48000, 46500, 1.5, 60)
    assert report.input_tokens == ReportedLimit(40000, 38500, 2.0, 60)
    assert report.output_tokens == ReportedLimit(8000, 7500, 0.0, 60)
    # The combined header is reported as sent, but with split limits there is no one
    # total-token budget to pace by (issue 30: the lower split limit paced 5.3x slow).
    assert report.token_limit is None
    assert report.split_limits == (report.input_tokens, report.output_tokens)


def test_anthropic_without_date_uses_now_and_split_token_limits() -> None:
    """No Date: resets count from ``now``; split limits alone give no total budget."""
    headers = {
        k: v
        for k, v in ANTHROPIC.items()
        if k != "date" and not k.startswith("anthropic-ratelimit-tokens-")
    }
    now = 1_796_292_000.0  # 2026-12-03T10:00:00Z
    report = parse_limit_headers(headers, now=now)
    assert report.tokens is None
    assert report.requests is not None
    assert report.requests.reset_s == pytest.approx(1.0)
    assert report.token_limit is None
    assert len(report.split_limits) == 2


#: A real response's rate-limit headers (tier 2, August 2025, recorded in tidyllm's test
#: fixtures): tokens-* showed ITPM + OTPM while nothing bound.
ANTHROPIC_TIER2 = {
    "date": "Thu, 21 Aug 2025 12:41:00 GMT",
    "anthropic-ratelimit-input-tokens-limit": "80000",
    "anthropic-ratelimit-input-tokens-remaining": "80000",
    "anthropic-ratelimit-input-tokens-reset": "2025-08-21T12:40:59Z",
    "anthropic-ratelimit-output-tokens-limit": "16000",
    "anthropic-ratelimit-output-tokens-remaining": "16000",
    "anthropic-ratelimit-output-tokens-reset": "2025-08-21T12:41:00Z",
    "anthropic-ratelimit-requests-limit": "1000",
    "anthropic-ratelimit-requests-remaining": "999",
    "anthropic-ratelimit-requests-reset": "2025-08-21T12:40:59Z",
    "anthropic-ratelimit-tokens-limit": "96000",
    "anthropic-ratelimit-tokens-remaining": "96000",
    "anthropic-ratelimit-tokens-reset": "2025-08-21T12:40:59Z",
}


def test_anthropic_tokens_header_is_not_a_total_token_budget() -> None:
    """tokens-* is the most restrictive limit in effect (here ITPM + OTPM), not a total
    budget; neither is the lower split limit (OTPM 16000): split limits give none."""
    report = parse_limit_headers(ANTHROPIC_TIER2)
    assert report.tokens is not None
    assert report.tokens.limit == 96000  # reported as sent
    assert report.input_tokens == ReportedLimit(80000, 79500, 0.0, 60)
    assert report.token_limit is None


def test_anthropic_split_limits_report_their_drains() -> None:
    """A drained input limit is reported drained, with its own reset (the learner holds
    the gate on it; see tests/test_learn.py)."""
    headers = {
        **ANTHROPIC_TIER2,
        "anthropic-ratelimit-input-tokens-remaining": "0",
        "anthropic-ratelimit-input-tokens-reset": "2025-08-21T12:41:03Z",
        "anthropic-ratelimit-output-tokens-remaining": "12000",
    }
    report = parse_limit_headers(headers)
    drained = [d for d in report.split_limits if d.drained]
    assert drained == [ReportedLimit(80000, 0, 3.0, 60)]


def test_anthropic_tokens_header_alone_is_the_token_budget() -> None:
    """Without the split headers (older responses, gateways) tokens-* is all there is."""
    headers = {k: v for k, v in ANTHROPIC_TIER2.items() if "put-tokens" not in k}
    report = parse_limit_headers(headers)
    assert report.token_limit is report.tokens
    assert report.tokens == ReportedLimit(96000, 95500, 0.0, 60)


@pytest.mark.parametrize(
    ("sent", "reported"), [("12000", 11500), ("0", 0), ("12345", 12345), ("1000", 500)]
)
def test_anthropic_token_counts_are_read_as_the_least_they_may_have_been(
    sent: str, reported: float
) -> None:
    """Anthropic rounds token ``remaining`` to the nearest thousand: taken at face value a
    rounded-up level sent 1,000-token reservations into an output bucket holding 600-990
    (an Anthropic-like project a tier below its published limits: 2.5 % of calls with a
    429). A whole thousand is read 500 lower; 0, and a count that was not rounded, as
    sent."""
    headers = {
        "anthropic-ratelimit-output-tokens-limit": "16000",
        "anthropic-ratelimit-output-tokens-remaining": sent,
        "anthropic-ratelimit-requests-limit": "1000",
        "anthropic-ratelimit-requests-remaining": "1000",
    }
    report = parse_limit_headers(headers, now=0.0)
    assert report.output_tokens is not None
    assert report.output_tokens.remaining == reported
    assert report.requests is not None
    assert report.requests.remaining == 1000


def test_anthropic_reset_in_the_past_is_zero() -> None:
    """A reset time already passed means "now", not a negative wait."""
    assert rfc3339_seconds("2026-12-03T09:00:00Z", 1_796_292_000.0) == 0.0
    assert rfc3339_seconds("not a time", 0.0) is None
    assert rfc3339_seconds("2026-13-45T99:00:00Z", 0.0) is None


# ----------------------------------------------------------------------------- IETF


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        (
            {"RateLimit": '"default";r=5;t=30', "RateLimit-Policy": '"default";q=100;w=60'},
            ReportedLimit(100, 5, 30, 60),
        ),
        (  # several policies: the one this response reports on, the strictest of them
            {
                "RateLimit": '"burst";r=90;t=1, "day";r=900;t=3600',
                "RateLimit-Policy": '"burst";q=100;w=10, "day";q=1000;w=86400',
            },
            ReportedLimit(1000, 900, 3600, 86400),
        ),
        (  # draft 07 tokens, unquoted
            {"RateLimit": "default;r=0;t=7", "RateLimit-Policy": "default;q=10;w=1"},
            ReportedLimit(10, 0, 7, 1),
        ),
        (  # the older trio, window from the limit's own policy list
            {
                "RateLimit-Limit": "10, 10;w=1, 1000;w=3600",
                "RateLimit-Remaining": "3",
                "RateLimit-Reset": "1",
            },
            ReportedLimit(10, 3, 1, 1),
        ),
        (  # the older trio with a separate policy header
            {
                "RateLimit-Limit": "100",
                "RateLimit-Remaining": "0",
                "RateLimit-Reset": "20",
                "RateLimit-Policy": "100;w=60",
            },
            ReportedLimit(100, 0, 20, 60),
        ),
        (  # the trio without any window: the limit's rate is unknown
            {"RateLimit-Limit": "100", "RateLimit-Remaining": "7", "RateLimit-Reset": "20"},
            ReportedLimit(100, 7, 20, None),
        ),
        (  # the dictionary form of drafts 05-06
            {"RateLimit": "limit=100, remaining=50, reset=30", "RateLimit-Policy": "100;w=60"},
            ReportedLimit(100, 50, 30, 60),
        ),
    ],
)
def test_ietf_fields(headers: dict[str, str], expected: ReportedLimit) -> None:
    """Both generations of the IETF draft parse to the request dimension."""
    report = parse_limit_headers(headers)
    assert report.source == "ietf"
    assert report.requests == expected
    assert report.tokens is None


def test_ietf_non_request_quota_units_are_ignored() -> None:
    """A policy counting bytes (``qu="content-bytes"``) is not a request rate."""
    headers = {"RateLimit": '"b";r=5;t=3', "RateLimit-Policy": '"b";q=10;qu="content-bytes";w=1'}
    assert not parse_limit_headers(headers)


# ----------------------------------------------------------------------------- garbage


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({}, None),
        ({"content-type": "application/json"}, None),
        (
            {"x-ratelimit-limit-requests": "-1", "x-ratelimit-remaining-requests": "5"},
            ReportedLimit(None, 5, None, None),
        ),
        (
            {"x-ratelimit-limit-requests": "0", "x-ratelimit-remaining-requests": "0"},
            ReportedLimit(None, 0, None, None),
        ),
        ({"x-ratelimit-limit-requests": "10", "x-ratelimit-remaining-requests": "11"}, None),
        (
            {"x-ratelimit-limit-requests": "10", "x-ratelimit-remaining-requests": "-3"},
            ReportedLimit(10, None, None, 60),
        ),
        ({"x-ratelimit-limit-requests": "nan", "x-ratelimit-remaining-requests": "inf"}, None),
        ({"x-ratelimit-limit-requests": "ten", "x-ratelimit-reset-requests": "soon"}, None),
        ({"x-ratelimit-limit-requests": "1e400"}, None),
        (
            {"x-ratelimit-limit-requests": "10", "x-ratelimit-reset-requests": "-5s"},
            ReportedLimit(10, None, None, 60),
        ),
        ({"x-ratelimit-limit-requests": "", "x-ratelimit-remaining-requests": " "}, None),
    ],
    ids=[
        "empty",
        "unrelated",
        "azure-minus-one",
        "azure-zero",
        "contradictory",
        "negative-remaining",
        "nan-inf",
        "words",
        "huge",
        "negative-reset",
        "blank",
    ],
)
def test_garbage_values_are_dropped(
    headers: dict[str, str], expected: ReportedLimit | None
) -> None:
    """Each untrusted value is dropped; a remaining above its limit drops the dimension."""
    report = parse_limit_headers(headers)
    assert report.requests == expected
    if expected is None:
        assert not report


@pytest.mark.parametrize(
    "headers",
    [None, 42, object(), "x-ratelimit", [("a",)], [1, 2], {"x-ratelimit-limit-requests": None}],
)
def test_unusable_header_containers_give_an_empty_report(headers: Any) -> None:
    """Whatever is passed as headers, parsing returns an (empty) report and never raises."""
    assert isinstance(parse_limit_headers(headers), LimitReport)


_NAMES = st.sampled_from(
    [
        *OPENAI,
        *(k for k in ANTHROPIC),
        "ratelimit",
        "ratelimit-policy",
        "ratelimit-limit",
        "ratelimit-remaining",
        "ratelimit-reset",
        "date",
        "x-ratelimit-limit",
    ]
)
_VALUES = st.one_of(
    st.text(max_size=40),
    st.integers(min_value=-(10**20), max_value=10**20).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(
        [
            "6m0s",
            "-1",
            "0",
            "1h2m3.5s",
            "2026-12-03T10:00:01Z",
            '"a";r=1;t=2',
            '"a";q=5;w=0',
            "q=;w=",
            '"',
            ";;,,",
        ]
    ),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_NAMES, _VALUES), max_size=12))
def test_never_raises_and_reports_only_checked_values(pairs: list[tuple[str, str]]) -> None:
    """Any mix of names and values: no exception, and every reported value is sane."""
    report = parse_limit_headers(pairs, now=1_796_292_000.0)
    for dim in (report.requests, report.tokens, report.input_tokens, report.output_tokens):
        if dim is None:
            continue
        if dim.limit is not None:
            assert 0 < dim.limit < math.inf
        if dim.remaining is not None:
            assert dim.remaining >= 0
            if dim.limit is not None:
                assert dim.remaining <= dim.limit
        if dim.reset_s is not None:
            assert 0 <= dim.reset_s <= 86_400
        if dim.window_s is not None:
            assert dim.window_s > 0


# ----------------------------------------------------------------------------- headers_of


class _Broken:
    @property
    def response(self) -> Any:
        raise RuntimeError("no response")


def test_headers_of_finds_response_headers_only() -> None:
    """Responses and errors carrying one give headers; requests, models and junk give None."""
    request = httpx.Request(
        "POST", "https://api.example/v1", headers={"x-ratelimit-limit-requests": "1"}
    )
    response = httpx.Response(429, headers=OPENAI, request=request)
    assert headers_of(response) is response.headers
    error = httpx.HTTPStatusError("429", request=request, response=response)
    assert headers_of(error) is response.headers
    assert headers_of(request) is None  # the request's own headers are not an answer
    assert headers_of(httpx.ConnectError("down", request=request)) is None
    assert headers_of(None) is None
    assert headers_of({"usage": 1}) is None
    assert headers_of(_Broken()) is None


def test_headers_of_sdk_errors_and_raw_responses() -> None:
    """openai / anthropic status errors and ``with_raw_response`` results expose headers."""
    openai = pytest.importorskip("openai")
    anthropic = pytest.importorskip("anthropic")
    httpx2 = pytest.importorskip("httpx2")
    request = httpx2.Request("POST", "https://api.example/v1/chat/completions")
    response = httpx2.Response(429, headers=OPENAI, request=request)
    for sdk in (openai, anthropic):
        error = sdk.RateLimitError("slow down", response=response, body=None)
        assert headers_of(error) is response.headers
        assert parse_limit_headers(headers_of(error)).requests == ReportedLimit(500, 499, 0.12, 60)
    assert headers_of(openai.APIConnectionError(request=request)) is None
