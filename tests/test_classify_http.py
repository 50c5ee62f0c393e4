"""classify() on plain-HTTP errors and rate-limit wording.

``raise_for_status()`` raises ``httpx.HTTPStatusError`` (or httpx2's), which has no ``body``:
classification must read the JSON of its ``response`` when that body is already in memory,
and never read from the network to get it. Rate-limit wording ("Rate limit reached ...") is a
retriable rate limit (``transient``), not provider overload (``busy``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from anygate import Reason, ResponseError, classify

if TYPE_CHECKING:
    from collections.abc import Iterator

BURST_BODY = {
    "error": {
        "code": "limit_burst_rate",
        "type": "limit_burst_rate",
        "message": "Request rate increased too quickly.",
    }
}
LIBRARIES = [pytest.param("httpx", id="httpx"), pytest.param("httpx2", id="httpx2")]


def _status_error(lib: Any, response: Any) -> Exception:
    """The exception ``response.raise_for_status()`` raises (a real one, not a lookalike)."""
    with pytest.raises(lib.HTTPStatusError) as info:
        response.raise_for_status()
    error: Exception = info.value
    return error


@pytest.fixture(params=LIBRARIES)
def lib(request: pytest.FixtureRequest) -> Any:
    """httpx, then httpx2."""
    return pytest.importorskip(request.param)


def test_raise_for_status_burst_rate_is_read_from_the_json_body(lib: Any) -> None:
    """A 429 ``limit_burst_rate`` raised by ``raise_for_status()`` is ``burst_rate``, with
    its code and status, not a plain ``transient`` 429."""
    request = lib.Request("POST", "https://ark.example.com/api/v3/chat/completions")
    response = lib.Response(429, json=BURST_BODY, request=request)
    verdict = classify(_status_error(lib, response))
    assert (verdict.reason, verdict.retriable) == (Reason.BURST_RATE, True)
    assert (verdict.status, verdict.code) == (429, "limit_burst_rate")


def test_raise_for_status_reads_quota_and_retry_after(lib: Any) -> None:
    """The body decides the reason (OpenAI's ``insufficient_quota``: never retried) and the
    response's headers still give ``retry_after``."""
    request = lib.Request("POST", "https://api.openai.com/v1/chat/completions")
    body = {"error": {"code": "insufficient_quota", "message": "You exceeded your current quota"}}
    response = lib.Response(429, json=body, headers={"retry-after": "3"}, request=request)
    verdict = classify(_status_error(lib, response))
    assert (verdict.reason, verdict.retriable, verdict.retry_after) == (Reason.QUOTA, False, 3.0)


def test_an_unread_streamed_body_is_never_read(lib: Any) -> None:
    """A streamed 429 whose body was not read: classification does not read it (the stream
    is never iterated) and falls back to the status, ``transient``; after ``close()`` too."""
    reads: list[int] = []

    class Unread(lib.SyncByteStream):  # type: ignore[misc]
        def __iter__(self) -> Iterator[bytes]:
            reads.append(1)
            yield b'{"error": {"code": "limit_burst_rate"}}'

    request = lib.Request("POST", "https://ark.example.com/api/v3/chat/completions")
    response = lib.Response(429, stream=Unread(), request=request)
    assert not response.is_closed
    assert classify(_status_error(lib, response)).reason is Reason.TRANSIENT
    response.close()
    assert classify(_status_error(lib, response)).reason is Reason.TRANSIENT
    assert reads == []


def test_a_body_read_after_streaming_is_used(lib: Any) -> None:
    """Once the streamed body has been read (``response.read()``), its JSON counts."""
    request = lib.Request("POST", "https://ark.example.com/api/v3/chat/completions")
    response = lib.Response(
        429, stream=lib.ByteStream(b'{"error": {"code": "limit_burst_rate"}}'), request=request
    )
    response.read()
    assert classify(_status_error(lib, response)).reason is Reason.BURST_RATE


def test_an_exception_body_wins_over_its_response() -> None:
    """Exceptions that carry ``body`` (the SDKs', ResponseError) are read as before: the
    response's content is not consulted."""
    httpx = pytest.importorskip("httpx")
    response = httpx.Response(429, json=BURST_BODY)
    error = ResponseError(429, body={"error": {"code": "insufficient_quota"}}, response=response)
    assert classify(error).reason is Reason.QUOTA


# --------------------------------------------------------------------------- rate limits


@pytest.mark.parametrize(
    "error",
    [
        ResponseError(
            429,
            body={
                "error": {
                    "message": "Rate limit reached for gpt-4o in organization org-x on requests "
                    "per min (RPM): Limit 3, Used 3, Requested 1. Please try again in 20s.",
                    "type": "requests",
                    "code": "rate_limit_exceeded",
                }
            },
        ),
        ResponseError(429, body={"error": {"message": "Rate limit reached"}}),
        ResponseError(
            429,
            body={
                "type": "error",
                "error": {"type": "rate_limit_error", "message": "Number of requests exceeded"},
            },
        ),
        RuntimeError("Rate limit reached, please try again later"),
    ],
    ids=["openai-rpm", "short", "anthropic-type", "no-status"],
)
def test_rate_limit_wording_is_transient_not_busy(error: Exception) -> None:
    """OpenAI's "Rate limit reached ..." and ``rate_limit_*`` codes are retriable ``transient`` rate
    limits, even when they also say "please try again" (which alone means ``busy``)."""
    verdict = classify(error)
    assert (verdict.reason, verdict.retriable) == (Reason.TRANSIENT, True)


def test_a_burst_rate_message_that_mentions_a_rate_limit_stays_burst_rate() -> None:
    """Burst-rate wording wins over rate-limit wording."""
    error = ResponseError(
        429, body={"error": {"code": "limit_burst_rate", "message": "Rate limit reached"}}
    )
    assert classify(error).reason is Reason.BURST_RATE


def test_an_explicit_overload_signal_stays_busy_despite_rate_limit_wording() -> None:
    """A 529 or an ``overloaded_error`` code is provider overload whatever the text says."""
    by_status = ResponseError(529, body={"error": {"message": "rate limit: overloaded"}})
    by_code = ResponseError(
        503, body={"error": {"type": "overloaded_error", "message": "rate limited"}}
    )
    assert classify(by_status).reason is Reason.BUSY
    assert classify(by_code).reason is Reason.BUSY
