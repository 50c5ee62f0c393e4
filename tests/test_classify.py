"""classify(): provider errors -> Verdict, by duck typing; user rules; redaction."""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import pytest

import anygate
from anygate import Reason, ResponseError, Rule, Verdict, classify, classify_response


def rate_limited(body: object, *, headers: dict[str, str] | None = None) -> ResponseError:
    return ResponseError(429, headers=headers, body=body)


# --------------------------------------------------------------------------- burst rate


@pytest.mark.parametrize(
    "error",
    [
        rate_limited({"error": {"code": "limit_burst_rate", "message": "Too many"}}),
        rate_limited({"error": {"type": "limit_burst_rate"}}),
        rate_limited({"code": "limit_burst_rate"}),  # openai passes body["error"] as body
        rate_limited({"error": {"message": "Request rate increased too quickly."}}),
        ResponseError(429, body="the burst rate of your requests is too high"),
        ResponseError(429, body={"error": {"message": "请求速率增长过快 请平滑调整"}}),
        RuntimeError("Error code: 429 - limit_burst_rate"),
    ],
    ids=["error.code", "error.type", "body.code", "message", "text", "chinese", "plain"],
)
def test_burst_rate_is_found_in_message_code_or_type(error: Exception) -> None:
    """limit_burst_rate and its phrasings are ``burst_rate`` and retriable, wherever they are."""
    verdict = classify(error)
    assert verdict.reason is Reason.BURST_RATE
    assert verdict.retriable


def test_burst_rate_code_attribute_on_the_exception() -> None:
    """An SDK-style ``exc.code`` attribute is read too."""

    class SDKError(Exception):
        code = "limit_burst_rate"
        status_code = 429

    assert classify(SDKError("Error code: 429")).reason is Reason.BURST_RATE


# --------------------------------------------------------------------------- quota / auth


def test_openai_insufficient_quota_is_quota_and_never_retried() -> None:
    """OpenAI's 429 insufficient_quota means billing: quota, not retriable."""
    error = rate_limited(
        {"code": "insufficient_quota", "message": "You exceeded your current quota."}
    )
    verdict = classify(error)
    assert (verdict.reason, verdict.retriable, verdict.status) == (Reason.QUOTA, False, 429)
    assert verdict.code == "insufficient_quota"


def test_dashscope_insufficient_quota_is_a_temporary_window() -> None:
    """DashScope uses insufficient_quota on 429 for a per-minute limit: transient."""
    error = rate_limited({"code": "insufficient_quota", "message": "quota exceeded"})
    assert classify(error, provider="dashscope").reason is Reason.TRANSIENT
    assert classify(error, provider="openai").reason is Reason.QUOTA


def test_provider_is_guessed_from_the_request_host() -> None:
    """Without a hint, the request URL's host tells DashScope from OpenAI."""
    httpx = pytest.importorskip("httpx")
    request = httpx.Request("POST", "https://dashscope.aliyuncs.com/compatible-mode/v1/chat")
    response = httpx.Response(429, request=request, json={"error": {"code": "insufficient_quota"}})
    error = ResponseError(429, body={"code": "insufficient_quota"}, response=response)
    assert classify(error).reason is Reason.TRANSIENT


def test_per_minute_quota_wording_is_a_rate_limit() -> None:
    """'quota ... per minute' on a 429 is a moving window, not an empty account."""
    error = ResponseError(429, body="Quota exceeded for requests per minute")
    assert classify(error).reason is Reason.TRANSIENT


@pytest.mark.parametrize(
    "error",
    [
        ResponseError(401, body={"error": {"message": "Incorrect API key provided: sk-abcdefgh"}}),
        ResponseError(403, body="forbidden"),
        ResponseError(400, body={"error": {"code": "invalid_api_key"}}),
        PermissionError("access denied"),
    ],
)
def test_auth_failures_are_not_retried(error: Exception) -> None:
    """401/403, invalid keys and access-denied wording are ``auth``, not retriable."""
    verdict = classify(error)
    assert (verdict.reason, verdict.retriable) == (Reason.AUTH, False)


# --------------------------------------------------------------------------- transient / busy


@pytest.mark.parametrize("status", [408, 409, 425, 429, 500, 502, 503, 504])
def test_retriable_statuses_are_transient(status: int) -> None:
    """The statuses the SDKs retry are ``transient``."""
    verdict = classify(ResponseError(status))
    assert (verdict.reason, verdict.retriable, verdict.status) == (Reason.TRANSIENT, True, status)


@pytest.mark.parametrize("status", [400, 404, 422, 501])
def test_other_statuses_are_generic(status: int) -> None:
    """Client errors and 501 will not change on retry."""
    verdict = classify(ResponseError(status))
    assert (verdict.reason, verdict.retriable) == (Reason.GENERIC, False)


@pytest.mark.parametrize(
    "error", [TimeoutError("slow"), ConnectionResetError("reset"), BrokenPipeError()]
)
def test_builtin_timeouts_and_connection_errors_are_transient(error: Exception) -> None:
    """TimeoutError and ConnectionError subclasses are transient."""
    assert classify(error).reason is Reason.TRANSIENT


def test_httpx_stream_errors_are_transient_and_flag_the_stream() -> None:
    """httpx ReadError / RemoteProtocolError (dropped streams) are transient; a cut-off body
    is flagged as an interrupted stream."""
    httpx = pytest.importorskip("httpx")
    dropped = httpx.RemoteProtocolError(
        "peer closed connection without sending complete message body (incomplete chunked read)"
    )
    verdict = classify(dropped)
    assert (verdict.reason, verdict.retriable, verdict.stream_interrupted) == (
        Reason.TRANSIENT,
        True,
        True,
    )
    assert classify(httpx.ReadError("boom")).reason is Reason.TRANSIENT
    assert classify(httpx.ConnectTimeout("slow")).reason is Reason.TRANSIENT


def test_an_applications_own_read_error_is_not_a_network_error() -> None:
    """Generic class names count only from HTTP/SDK modules."""

    class ReadError(Exception):
        pass

    assert classify(ReadError("could not read the config")).reason is Reason.GENERIC


def test_stream_chunk_timeout_is_transient_and_a_stream_interruption() -> None:
    """langchain's StreamChunkTimeoutError (matched by name) is a dropped stream."""

    class StreamChunkTimeoutError(TimeoutError):
        pass

    verdict = classify(StreamChunkTimeoutError("no chunk for 120s"))
    assert (verdict.reason, verdict.stream_interrupted) == (Reason.TRANSIENT, True)


@pytest.mark.parametrize(
    "error",
    [
        ResponseError(529, body={"type": "error", "error": {"type": "overloaded_error"}}),
        ResponseError(503, body={"error": {"message": "The server is overloaded"}}),
        ResponseError(500, body="server busy, try again later"),
        RuntimeError("服务繁忙 请稍后重试"),
    ],
)
def test_overloaded_and_try_again_later_are_busy(error: Exception) -> None:
    """'overloaded', 529, 'try again later' are ``busy`` and retriable."""
    verdict = classify(error)
    assert (verdict.reason, verdict.retriable) == (Reason.BUSY, True)


def test_content_policy_rejections_are_not_retried_even_if_they_say_try_again() -> None:
    """A content-filter rejection must not be retried because of polite wording."""
    error = ResponseError(
        400, body={"error": {"code": "data_inspection_failed", "message": "please try again"}}
    )
    verdict = classify(error)
    assert (verdict.reason, verdict.retriable) == (Reason.GENERIC, False)


def test_plain_errors_are_generic() -> None:
    """Anything unrecognised is generic and not retried."""
    verdict = classify(ValueError("bad input"))
    assert verdict == Verdict(reason=Reason.GENERIC, retriable=False)
    assert verdict.detail == "bad input"


def test_the_cause_is_classified_when_the_wrapper_says_nothing() -> None:
    """A generic wrapper raised from a network error takes the cause's verdict."""
    outer = RuntimeError("LLM call failed")
    outer.__cause__ = ConnectionResetError("reset by peer")
    assert classify(outer).reason is Reason.TRANSIENT
    assert classify(RuntimeError("LLM call failed")).reason is Reason.GENERIC


# --------------------------------------------------------------------------- headers


def test_x_should_retry_false_wins() -> None:
    """``x-should-retry: false`` makes even a 503 non-retriable."""
    verdict = classify(ResponseError(503, headers={"x-should-retry": "false"}))
    assert verdict.retriable is False


def test_x_should_retry_true_makes_a_generic_error_transient() -> None:
    """``x-should-retry: true`` on an otherwise generic error retries it."""
    verdict = classify(ResponseError(400, headers={"X-Should-Retry": "true"}))
    assert (verdict.reason, verdict.retriable) == (Reason.TRANSIENT, True)


def test_retry_after_is_read_from_response_or_exception_headers() -> None:
    """retry_after comes from exc.headers or exc.response.headers."""
    assert classify(ResponseError(429, headers={"retry-after-ms": "250"})).retry_after == 0.25

    class Response:
        status_code = 503
        headers: ClassVar[dict[str, str]] = {"Retry-After": "7"}

    class SDKError(Exception):
        response = Response()

    verdict = classify(SDKError("unavailable"))
    assert (verdict.status, verdict.retry_after) == (503, 7.0)


# --------------------------------------------------------------------------- real SDK errors


def test_real_openai_errors() -> None:
    """openai's own exception objects are understood without anygate importing openai."""
    openai = pytest.importorskip("openai")
    httpx2 = pytest.importorskip("httpx2")
    request = httpx2.Request("POST", "https://api.openai.com/v1/chat/completions")
    response = httpx2.Response(429, request=request, headers={"retry-after-ms": "1200"})
    quota = openai.RateLimitError(
        "Error code: 429", response=response, body={"code": "insufficient_quota", "type": "x"}
    )
    assert classify(quota).reason is Reason.QUOTA
    burst = openai.RateLimitError(
        "Error code: 429", response=response, body={"code": "limit_burst_rate"}
    )
    verdict = classify(burst)
    assert (verdict.reason, verdict.retry_after, verdict.status) == (Reason.BURST_RATE, 1.2, 429)
    assert classify(openai.APITimeoutError(request=request)).reason is Reason.TRANSIENT
    assert classify(openai.APIConnectionError(request=request)).reason is Reason.TRANSIENT


def test_real_anthropic_errors() -> None:
    """anthropic's overloaded (529) and auth errors are classified by duck typing."""
    anthropic = pytest.importorskip("anthropic")
    httpx2 = pytest.importorskip("httpx2")
    request = httpx2.Request("POST", "https://api.anthropic.com/v1/messages")
    body = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    overloaded = anthropic.InternalServerError(
        "Overloaded", response=httpx2.Response(529, request=request), body=body
    )
    assert classify(overloaded).reason is Reason.BUSY
    auth_body = {"type": "error", "error": {"type": "authentication_error", "message": "bad"}}
    auth = anthropic.AuthenticationError(
        "bad key", response=httpx2.Response(401, request=request), body=auth_body
    )
    assert classify(auth).reason is Reason.AUTH


# --------------------------------------------------------------------------- rules


def test_user_rules_come_first_and_the_first_match_wins() -> None:
    """Ordered rules override the built-ins; the first matching rule decides."""
    rules = [
        Rule(contains="model is loading", reason="busy"),
        Rule(contains="loading", reason="generic"),
        Rule(status=400, code="context_length_exceeded", reason="generic"),
    ]
    verdict = classify(ResponseError(400, body="Model is loading, wait"), rules=rules)
    assert (verdict.reason, verdict.retriable) == (Reason.BUSY, True)
    assert classify(ResponseError(503, body="loading"), rules=rules).reason is Reason.GENERIC


def test_rule_criteria_must_all_match() -> None:
    """A rule with several criteria matches only when every one holds."""
    rule = Rule(status=429, exception="ResponseError", reason="quota", retriable=True)
    assert classify(ResponseError(429), rules=[rule]) == Verdict(Reason.QUOTA, True, status=429)
    assert classify(ResponseError(503), rules=[rule]).reason is Reason.TRANSIENT
    by_type = Rule(exception=KeyError, reason="transient")
    assert classify(KeyError("x"), rules=[by_type]).reason is Reason.TRANSIENT


def test_callable_rules_may_return_a_reason_a_verdict_or_nothing() -> None:
    """Callables: None means "no opinion", a reason string or Verdict decides."""
    seen: list[BaseException] = []

    def abstain(exc: BaseException) -> None:
        seen.append(exc)

    def by_text(exc: BaseException) -> str | None:
        return "busy" if "hiccup" in str(exc) else None

    custom = Verdict(Reason.TRANSIENT, True, retry_after=3.0)
    error = ValueError("gateway hiccup")
    assert classify(error, rules=[abstain, by_text]).reason is Reason.BUSY
    assert seen == [error]
    assert classify(error, rules=[lambda e: custom]) is custom


@pytest.mark.parametrize(
    ("kwargs", "error", "fragment"),
    [
        ({"reason": "sleepy", "status": 1}, ValueError, "Rule.reason must be one of"),
        ({"reason": "busy"}, ValueError, "at least one of"),
        ({"reason": "busy", "status": "429"}, TypeError, "Rule.status"),
        ({"reason": "busy", "contains": 3}, TypeError, "Rule.contains"),
        ({"reason": "busy", "status": 429, "retriable": "yes"}, TypeError, "Rule.retriable"),
    ],
)
def test_bad_rules_are_rejected(
    kwargs: dict[str, Any], error: type[Exception], fragment: str
) -> None:
    """Rules validate their criteria and name the bad one."""
    with pytest.raises(error, match=fragment):
        Rule(**kwargs)


def test_classify_response_reads_status_headers_and_json_body() -> None:
    """The transport's entry point: a response that is not an exception."""
    body = b'{"error": {"code": "limit_burst_rate", "message": "slow down"}}'
    verdict = classify_response(429, {"Retry-After": "2"}, body)
    assert verdict == Verdict(Reason.BURST_RATE, True, 2.0, 429, "limit_burst_rate")
    assert classify_response(200, None, None).reason is Reason.GENERIC
    with pytest.raises(TypeError, match="status must be an int"):
        classify_response("429", None, None)  # type: ignore[arg-type]


def test_reason_is_a_str_enum() -> None:
    """Reasons compare equal to their strings and print as them."""
    assert Reason.BURST_RATE == "burst_rate"
    assert str(Reason.QUOTA) == "quota"
    assert f"{Reason.AUTH}" == "auth"


# --------------------------------------------------------------------------- redaction


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("Incorrect API key provided: sk-proj-AbC123xyz789", "sk-proj-AbC123xyz789"),
        ("key sk-ant-api03-zzzzzzzzzz rejected", "sk-ant-api03-zzzzzzzzzz"),
        ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.abc.def", "eyJhbGciOiJIUzI1NiJ9"),
        ("headers={'authorization': 'Basic dXNlcjpwYXNz'}", "dXNlcjpwYXNz"),
        ('{"Authorization": "Token abc123secret"}', "abc123secret"),
        ("x-api-key: my-anthropic-key-123", "my-anthropic-key-123"),
        ("GET /v1?api_key=AIzaSyA-secret-value&x=1", "AIzaSyA-secret-value"),
        ("using bearer abc.def.ghi now", "abc.def.ghi"),
    ],
)
def test_redact_masks_keys_tokens_and_authorization_values(text: str, secret: str) -> None:
    """Every recognised secret shape is replaced by [REDACTED]; the label stays."""
    out = anygate.redact(text)
    assert secret not in out
    assert "[REDACTED]" in out


def test_redact_leaves_ordinary_text_alone() -> None:
    """Plain error text is unchanged."""
    text = "The server is overloaded (request id req_123). Retry in 5s."
    assert anygate.redact(text) == text


def test_verdict_detail_and_response_error_text_are_redacted() -> None:
    """Secrets echoed by a provider never reach Verdict.detail or the exception text."""
    error = ResponseError(
        401, body={"error": {"message": "Incorrect API key provided: sk-live-12345678"}}
    )
    assert "sk-live" not in str(error)
    assert "sk-live" not in classify(error).detail


def test_anygate_log_records_are_redacted_including_tracebacks(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The anygate logger's filter redacts message arguments and formatted tracebacks."""
    logger = logging.getLogger("anygate")
    with caplog.at_level(logging.INFO, logger="anygate"):
        try:
            raise RuntimeError("Authorization: Bearer secret-token-xyz")
        except RuntimeError:
            logger.exception("failed with key %s", "sk-abcdef123456")
    record = caplog.records[-1]
    assert "sk-abcdef123456" not in record.getMessage()
    assert "secret-token-xyz" not in (record.exc_text or "")
    assert "[REDACTED]" in (record.exc_text or "")
    assert "secret-token-xyz" not in caplog.text
