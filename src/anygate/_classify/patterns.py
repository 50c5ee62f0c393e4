"""The words, codes, statuses and class names classification looks for.

Kept apart from the logic in ``classify`` so the tables read as one list per reason and
can grow (a new provider's phrasing) without touching the decision order.
"""

from __future__ import annotations

__all__ = [
    "AUTH_CODES",
    "AUTH_PATTERNS",
    "BURST_PATTERNS",
    "BUSY_CODES",
    "BUSY_PATTERNS",
    "CONTENT_POLICY_PATTERNS",
    "HTTP_MODULES",
    "NOT_RETRIED_5XX",
    "QUOTA_CODES",
    "QUOTA_PATTERNS",
    "RATE_LIMIT_PATTERNS",
    "RATE_WINDOW_PATTERNS",
    "STREAM_NAMES",
    "STREAM_PATTERNS",
    "TRANSIENT_4XX",
    "TRANSIENT_NAMES_ANYWHERE",
    "TRANSIENT_NAMES_HTTP",
    "TRANSIENT_PATTERNS",
]

QUOTA_CODES = frozenset(
    {"insufficient_quota", "billing_hard_limit_reached", "billing_not_active", "arrearage"}
)
QUOTA_PATTERNS = (
    "insufficient_quota",
    "exceeded your current quota",
    "quota",
    "billing",
    "credit balance",
    "payment required",
    "余额不足",
    "超出限额",
    "额度不足",
    "欠费",
)
# "Quota" wording that describes a moving window (tokens per minute) is a rate limit that
# clears by itself, not an empty account.
RATE_WINDOW_PATTERNS = (
    "per minute",
    "per second",
    "tokens per",
    "requests per",
    "rate quota",
    "ratequota",
    " tpm",
    " rpm",
)
AUTH_CODES = frozenset(
    {"invalid_api_key", "authentication_error", "permission_error", "invalid_authentication"}
)
AUTH_PATTERNS = (
    "authentication",
    "unauthorized",
    "invalid api key",
    "invalid_api_key",
    "incorrect api key",
    "invalid x-api-key",
    "permission denied",
    "forbidden",
    "access denied",
    "无权",
    "未授权",
)
BURST_PATTERNS = (
    "limit_burst_rate",
    "burst rate",
    "burst-rate",
    "burst_rate",
    "burstrate",
    "request rate increased too quickly",
    "slope limit",
    "请求速率增长过快",
    "请求频率增长过快",
    "增长过快",
    "突发限流",
    "突增",
)
# Content-safety rejections sometimes say "please try again"; they must not be retried.
CONTENT_POLICY_PATTERNS = (
    "data_inspection_failed",
    "datainspectionfailed",
    "content_filter",
    "content_policy",
    "inappropriate content",
    "内容违规",
    "违规内容",
    "内容审核",
)
# A per-minute rate limit (OpenAI "Rate limit reached for ... (RPM)", Anthropic
# rate_limit_error, OpenAI rate_limit_exceeded) is the caller's own pace hitting a window,
# not the provider being overloaded, even when it adds "please try again in 20s". The
# codes end up in the searched text too, hence the underscore forms.
RATE_LIMIT_PATTERNS = (
    "rate limit",
    "rate_limit",
    "rate-limit",
    "ratelimit",
)
BUSY_CODES = frozenset({"overloaded_error", "server_busy", "engine_overloaded"})
BUSY_PATTERNS = (
    "overloaded",
    "server busy",
    "server is busy",
    "temporarily unavailable",
    "upstream request failed",
    "try again later",
    "please retry",
    "please try again",
    "high demand",
    "负载较高",
    "服务繁忙",
    "稍后重试",
)
TRANSIENT_PATTERNS = (
    "peer closed connection",
    "incomplete chunked read",
    "server disconnected",
    "connection reset",
    "connection aborted",
    "connection dropped",
    "connection refused",
    "broken pipe",
    "eof occurred",
    "timed out",
)
STREAM_PATTERNS = (
    "incomplete chunked read",
    "peer closed connection without sending complete message body",
    "stream interrupted",
    "chunk timeout",
)
# Exception class names that mean "the network or the stream failed, try again". Generic
# names (ReadError, ConnectError) count only from HTTP/SDK modules, so an application's own
# ReadError is not mistaken for a dropped connection.
TRANSIENT_NAMES_ANYWHERE = frozenset(
    {"APITimeoutError", "APIConnectionError", "StreamChunkTimeoutError", "OverloadedError"}
)
TRANSIENT_NAMES_HTTP = frozenset(
    {
        "ReadError",
        "WriteError",
        "RemoteProtocolError",
        "ConnectError",
        "ConnectTimeout",
        "ReadTimeout",
        "WriteTimeout",
        "PoolTimeout",
        "TimeoutException",
        "NetworkError",
        "ProtocolError",
        "IncompleteRead",
        "ChunkedEncodingError",
        "ServerDisconnectedError",
        "ClientConnectionError",
        "ClientPayloadError",
        "BrokenResourceError",
        "EndOfStream",
    }
)
HTTP_MODULES = (
    "httpx",
    "httpx2",
    "httpcore",
    "h11",
    "h2",
    "openai",
    "anthropic",
    "urllib3",
    "requests",
    "aiohttp",
    "anyio",
    "langchain",
    "http.",
)
STREAM_NAMES = frozenset(
    {"StreamChunkTimeoutError", "IncompleteRead", "ChunkedEncodingError", "ClientPayloadError"}
)
# 501 (not implemented), 505 (version) and 511 (network auth) will not change on retry.
NOT_RETRIED_5XX = frozenset({501, 505, 511})
TRANSIENT_4XX = frozenset({408, 409, 425, 429})
