"""What kind of "slow down" a provider error is: the policy steers differently by kind.

A classified failure (:class:`anygate.Verdict`) says whether to retry; this module says what
the answer tells about the provider's limits, which decides what the *gate* does:

========================  =====================================================  ===========
kind                      recognised by                                          the gate
========================  =====================================================  ===========
``"concurrency"``         429 whose code or message names concurrency            limit cut to
                          (``concurrency_limit_exceeded``, "too many concurrent   the calls in
                          requests")                                             flight - 1
                          503 whose message says the server's queue is full      (slots and
                          ("maximum pending requests exceeded": Ollama's         queue)
                          ``OLLAMA_MAX_QUEUE``; "no slots available")
``"overload"``            Anthropic 529 / ``overloaded_error`` at 429 or 529,    limit cut by
                          503 *with* ``Retry-After`` (a server asking for less   the adaptive
                          load, not one that is down)                            factor
``"burst"``               ``limit_burst_rate`` (:attr:`Reason.BURST_RATE`)       rate paced,
                                                                                 pause
``"rate"``                any other 429 (RPM / TPM)                              waits out
                                                                                 Retry-After;
                                                                                 rate paced
========================  =====================================================  ===========

Anything else (a 503 without Retry-After, timeouts, dropped connections) is not a throttle:
it is what the circuit breaker counts. None of these kinds is a failure for the breaker: a
throttled provider is up, and it recovers by being asked less, not by being left alone.

Pure functions of the verdict, so the decision is testable without a clock or a gate.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, Literal

from .classify import Reason

if TYPE_CHECKING:
    from .classify import Verdict

__all__ = ["RateUnit", "ThrottleKind", "rate_unit", "throttle_kind"]

ThrottleKind = Literal["concurrency", "overload", "burst", "rate"]
#: What a per-minute 429 counted: requests or tokens (any token budget).
RateUnit = Literal["requests", "tokens"]

_CONCURRENCY_WORDS: Final = ("concurren", "parallel request", "simultaneous")
# A server that queues what its slots cannot take yet, up to a bound, and answers 503
# beyond it: Ollama's "server busy, please try again.  maximum pending requests exceeded"
# (``OLLAMA_MAX_QUEUE``, 512 by default) and its runner's "llm busy - no slots available".
# The calls in flight then filled the slots and the queue: a concurrency answer, and a
# server that is up. Read as a 503 like an outage's, these went to the breaker and the
# retry budget: 24 agents on a 1-slot server with a 4-deep queue lost 135 calls of 360
# (seeds 1-3; ``anygate simulate``'s local model server with no slot count published).
_QUEUE_WORDS: Final = ("pending request", "no slots available", "queue is full")
_OVERLOAD_CODES: Final = frozenset({"overloaded_error", "overloaded", "server_overloaded"})
# OpenAI: "on requests per min (RPM)", "on tokens per min (TPM)"; Anthropic: "of N input
# tokens per minute", "... requests per minute"; Azure: "exceeded call rate limit" /
# "token rate limit". Tokens first: "requests per min" never names tokens, while Azure's
# token message also mentions the requests it came from.
_TOKEN_WORDS: Final = ("tokens per min", "(tpm)", "token rate limit", "tokens per minute")
_REQUEST_WORDS: Final = ("requests per min", "(rpm)", "call rate limit", "requests per minute")


def throttle_kind(verdict: Verdict) -> ThrottleKind | None:
    """What kind of throttle a classified failure was, as :class:`anygate.Policy` reads it.

    ``"concurrency"``: the provider's concurrent-request limit (a 429 naming concurrency,
    or a 503 saying the server's queue is full: Ollama's "maximum pending requests
    exceeded", "no slots available"); ``"overload"``: the provider asks for less load
    (Anthropic's 529 / ``overloaded_error``, a 503 *with* ``Retry-After``); ``"burst"``:
    the request rate rose too steeply (:attr:`anygate.Reason.BURST_RATE`); ``"rate"``:
    any other retriable 429 (requests or tokens per minute). ``None``: no throttle: a
    failure the circuit breaker counts (a 503 without ``Retry-After``, a timeout, a 500),
    one not to retry (a quota 429 is billing), or a success.

    Args:
        verdict: from :func:`anygate.classify` or :func:`anygate.classify_response`.
    """
    if not verdict.retriable:
        return None
    if verdict.reason is Reason.BURST_RATE:
        return "burst"
    status = verdict.status
    code = (verdict.code or "").lower()
    if status == 529 or (status == 429 and code in _OVERLOAD_CODES):
        return "overload"
    if status == 503 and _queue_full(verdict):
        return "concurrency"
    if status == 503 and verdict.retry_after is not None:
        return "overload"
    if status == 429:
        text = f"{code} {verdict.detail.lower()}"
        if any(word in text for word in _CONCURRENCY_WORDS):
            return "concurrency"
        return "rate"
    return None


def _queue_full(verdict: Verdict) -> bool:
    """Whether ``verdict``'s words say the server's queue is full (``_QUEUE_WORDS``): a
    server that queues, and turned this call away for the calls ahead of it."""
    text = f"{verdict.code or ''} {verdict.detail}".lower()
    return any(word in text for word in _QUEUE_WORDS)


def rate_unit(verdict: Verdict) -> RateUnit | None:
    """What a per-minute 429 (:func:`throttle_kind` ``"rate"``) says was counted, from its
    wording; ``None`` when it does not say (a plain "Too Many Requests")."""
    text = verdict.detail.lower()
    if any(word in text for word in _TOKEN_WORDS):
        return "tokens"
    if any(word in text for word in _REQUEST_WORDS):
        return "requests"
    return None
