"""Provider error -> :class:`Verdict`: what went wrong and whether another attempt can help.

Works by duck typing on the exceptions of ``openai``, ``anthropic``, ``httpx``/``httpx2``
and friends without importing any of them: it reads ``status_code``, ``code``, ``type``,
``body`` (or the already-loaded body of ``response``), ``response.headers`` and the
message, whichever exist. Users put their own ordered
rules in front of the built-in ones (first match wins) without subclassing anything.

This is not a parser of every provider's error schema: it recognises the shapes that decide
*retry or not* and *how long to wait*, and leaves the rest to ``generic``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Union

from .._errors import ResponseError
from .._redact import redact
from .._validation import check_flag
from .._verdict import Reason, Verdict
from . import patterns as P
from .facts import Facts, decode_body, detect_provider, gather
from .retry_after import header, parse_retry_after

__all__ = [
    "Reason",
    "Rule",
    "RuleLike",
    "Verdict",
    "classify",
    "classify_response",
]


# Reason and Verdict live in ._verdict, which imports nothing of ours: _errors needs Verdict
# (CallFailed.verdict) and we need _errors, so they sit below both (issue 10: no cycles).
_RETRIABLE = frozenset({Reason.BURST_RATE, Reason.TRANSIENT, Reason.BUSY})


# A rule is a declarative Rule, or any callable returning a Verdict / Reason / reason string
# (or None for "no opinion").
RuleLike = Union["Rule", Callable[[BaseException], Verdict | Reason | str | None]]


def _as_tuple(value: object, kind: type | tuple[type, ...], name: str) -> tuple[object, ...]:
    if value is None:
        return ()
    try:
        result: tuple[object, ...] = (
            (value,) if isinstance(value, kind) else tuple(value)  # type: ignore[arg-type]
        )
    except TypeError:
        msg = f"Rule.{name} must be a {kind} or a sequence of them (got {value!r})"
        raise TypeError(msg) from None
    for item in result:
        if not isinstance(item, kind) or isinstance(item, bool):
            msg = f"Rule.{name} entries must be {kind} (got {item!r})"
            raise TypeError(msg)
    return result


@dataclass(frozen=True, init=False)
class Rule:
    """A declarative classification rule; every criterion given must match.

    Rules are tried in order before the built-in ones; the first match decides::

        rules = [
            anygate.Rule(contains="model is loading", reason="busy"),
            anygate.Rule(status=400, code="context_length_exceeded", reason="generic"),
            anygate.Rule(exception="MyGatewayHiccup", reason="transient"),
        ]
        policy = anygate.Policy(rules=rules)

    Args:
        reason: the :class:`Reason` (or its string) to give.
        retriable: override the reason's default (burst_rate, transient, busy retry).
        contains: substrings, any of which must occur (case-insensitively) in the message,
            error code or error type.
        status: HTTP statuses, any of which must match.
        code: error codes or types, any of which must equal the provider's
            (case-insensitively).
        exception: exception classes or class *names*, any of which must appear in the
            exception's MRO (names let you match classes you do not import).

    Raises:
        TypeError, ValueError: a criterion of the wrong type, an unknown reason, or a rule
            with no criterion at all.
    """

    reason: Reason
    retriable: bool | None
    contains: tuple[str, ...]
    status: tuple[int, ...]
    code: tuple[str, ...]
    exception: tuple[type | str, ...]

    def __init__(
        self,
        *,
        reason: Reason | str,
        retriable: bool | None = None,
        contains: str | Sequence[str] | None = None,
        status: int | Sequence[int] | None = None,
        code: str | Sequence[str] | None = None,
        exception: type[BaseException] | str | Sequence[type[BaseException] | str] | None = None,
    ) -> None:
        try:
            parsed = Reason(reason)
        except ValueError:
            allowed = ", ".join(r.value for r in Reason)
            msg = f"Rule.reason must be one of {allowed} (got {reason!r})"
            raise ValueError(msg) from None
        check_flag("Rule.retriable", retriable, none=True)
        subs = _as_tuple(contains, str, "contains")
        statuses = _as_tuple(status, int, "status")
        codes = _as_tuple(code, str, "code")
        excs = _as_tuple(exception, (type, str), "exception")
        if not (subs or statuses or codes or excs):
            msg = "Rule needs at least one of contains, status, code or exception"
            raise ValueError(msg)
        object.__setattr__(self, "reason", parsed)
        object.__setattr__(self, "retriable", retriable)
        object.__setattr__(self, "contains", tuple(str(s).lower() for s in subs))
        object.__setattr__(self, "status", statuses)
        object.__setattr__(self, "code", tuple(str(c).lower() for c in codes))
        object.__setattr__(self, "exception", excs)

    def _matches(self, exc: BaseException, facts: Facts) -> bool:
        if self.status and facts.status not in self.status:
            return False
        if self.code and not any(c in facts.codes for c in self.code):
            return False
        if self.contains and not any(s in facts.text for s in self.contains):
            return False
        if self.exception:
            mro = type(exc).__mro__
            for want in self.exception:
                if isinstance(want, str):
                    if want in facts.class_names:
                        break
                elif want in mro:
                    break
            else:
                return False
        return True


def _matches(text: str, patterns: Iterable[str]) -> bool:
    return any(p in text for p in patterns)


def _transient_class(exc: BaseException, facts: Facts) -> bool:
    for name, module in zip(facts.class_names, facts.modules, strict=False):
        if name in P.TRANSIENT_NAMES_ANYWHERE:
            return True
        if name in P.TRANSIENT_NAMES_HTTP and module.startswith(P.HTTP_MODULES):
            return True
    return isinstance(exc, (TimeoutError, ConnectionError))


def _builtin_reason(exc: BaseException, facts: Facts, provider: str) -> Reason:
    text, codes, status = facts.text, facts.codes, facts.status
    if _matches(text, P.BURST_PATTERNS):
        return Reason.BURST_RATE
    quota_code = any(c in P.QUOTA_CODES for c in codes)
    if quota_code or status == 402 or _matches(text, P.QUOTA_PATTERNS):
        # DashScope answers a per-minute token limit with 429 + insufficient_quota: a
        # window that clears by itself. OpenAI uses the same code for an empty account.
        if status == 429 and (provider == "dashscope" or _matches(text, P.RATE_WINDOW_PATTERNS)):
            return Reason.TRANSIENT
        return Reason.QUOTA
    if status in (401, 403) or any(c in P.AUTH_CODES for c in codes):
        return Reason.AUTH
    if _matches(text, P.AUTH_PATTERNS):
        return Reason.AUTH
    if _matches(text, P.CONTENT_POLICY_PATTERNS):
        return Reason.GENERIC
    overloaded = status == 529 or any(c in P.BUSY_CODES for c in codes)
    if not overloaded and _matches(text, P.RATE_LIMIT_PATTERNS):
        # A rate limit (burst-rate ones were caught above) is retriable, but not a sign of
        # an overloaded provider; an explicit overload status or code still says "busy".
        return Reason.TRANSIENT
    if overloaded or _matches(text, P.BUSY_PATTERNS):
        return Reason.BUSY
    if _transient_class(exc, facts):
        return Reason.TRANSIENT
    if status is not None and (
        status in P.TRANSIENT_4XX or (status >= 500 and status not in P.NOT_RETRIED_5XX)
    ):
        return Reason.TRANSIENT
    if status is None and _matches(text, P.TRANSIENT_PATTERNS):
        return Reason.TRANSIENT
    return Reason.GENERIC


def _stream_interrupted(facts: Facts) -> bool:
    if any(name in P.STREAM_NAMES for name in facts.class_names):
        return True
    return _matches(facts.text, P.STREAM_PATTERNS)


def _apply_rule(
    rule: RuleLike, exc: BaseException, facts: Facts
) -> tuple[Reason, bool] | Verdict | None:
    if isinstance(rule, Rule):
        if not rule._matches(exc, facts):
            return None
        retriable = rule.reason in _RETRIABLE if rule.retriable is None else rule.retriable
        return rule.reason, retriable
    result = rule(exc)
    if result is None:
        return None
    if isinstance(result, Verdict):
        return result
    reason = Reason(result)
    return reason, reason in _RETRIABLE


def rule_decides(rule: RuleLike, exc: BaseException) -> bool:
    """Whether ``rule`` has an opinion on ``exc`` (it matches, or returns non-``None``)."""
    return _apply_rule(rule, exc, gather(exc)) is not None


def _should_retry_header(headers: object) -> bool | None:
    raw = header(headers, "x-should-retry")
    if raw is None:
        return None
    raw = raw.strip().lower()
    if raw == "true":
        return True
    if raw == "false":
        return False
    return None


def classify(
    exc: BaseException,
    *,
    rules: Sequence[RuleLike] = (),
    provider: str | None = None,
    now: float | None = None,
) -> Verdict:
    """Classify a provider failure into a :class:`Verdict`.

    Order of decision, first match wins:

    1. ``rules``, in order (a :class:`Rule`, or a callable returning a :class:`Verdict`,
       a :class:`Reason`/reason string, or ``None`` for "no opinion").
    2. ``burst_rate``: ``limit_burst_rate``, "Request rate increased too quickly", "burst
       rate" and Chinese phrasings, in the message or the error ``code``/``type`` (on the
       exception or its ``body["error"]``).
    3. ``quota``: ``insufficient_quota``, billing and credit wording, HTTP 402, except a
       429 that describes a per-minute window or comes from DashScope, which is
       ``transient``.
    4. ``auth``: HTTP 401/403, ``invalid_api_key``, "unauthorized" and similar.
    5. content-policy rejections: ``generic`` (never retried, even if they say "try again").
    6. ``transient``: rate-limit wording ("Rate limit reached ...", ``rate_limit_error``,
       ``rate_limit_exceeded``), unless an HTTP 529 or an overload code says ``busy``.
    7. ``busy``: HTTP 529, ``overloaded_error``, "overloaded", "server busy", "try again
       later".
    8. ``transient``: timeout and connection exceptions (``TimeoutError``,
       ``ConnectionError``, httpx/httpcore ``ReadError``, ``RemoteProtocolError``, the SDKs'
       ``APIConnectionError``/``APITimeoutError``, ``StreamChunkTimeoutError``), or HTTP
       408, 409, 425, 429 and 5xx other than 501/505/511.
    9. otherwise ``generic``; if the exception was raised from another one
       (``__cause__``), that one is classified instead when it says more.

    Then an ``x-should-retry`` response header, when present, overrides ``retriable``
    (``false`` always wins). ``retry_after`` comes from ``retry-after-ms`` / ``retry-after``.

    Args:
        exc: the exception the provider call raised.
        rules: extra rules tried before the built-in ones.
        provider: ``"openai"``, ``"anthropic"``, ``"dashscope"``, ``"ark"``..., where the
            wording of errors collides; by default guessed from the request URL's host.
        now: wall-clock POSIX time for HTTP-date ``Retry-After`` values; default
            ``time.time()``.
    """
    return _classify(exc, rules, provider, now, depth=0)


def _classify(
    exc: BaseException,
    rules: Sequence[RuleLike],
    provider: str | None,
    now: float | None,
    depth: int,
) -> Verdict:
    facts = gather(exc)
    decided: tuple[Reason, bool] | Verdict | None = None
    for rule in rules:
        decided = _apply_rule(rule, exc, facts)
        if decided is not None:
            break
    if isinstance(decided, Verdict):
        return decided
    if decided is None:
        reason = _builtin_reason(exc, facts, detect_provider(facts, provider))
        retriable = reason in _RETRIABLE
        cause = exc.__cause__
        if reason is Reason.GENERIC and cause is not None and depth < 3:
            inner = _classify(cause, rules, provider, now, depth + 1)
            if inner.reason is not Reason.GENERIC:
                return inner
    else:
        reason, retriable = decided

    should_retry = _should_retry_header(facts.headers)
    if should_retry is not None:
        retriable = should_retry
        if should_retry and reason is Reason.GENERIC:
            reason = Reason.TRANSIENT
    retry_after = parse_retry_after(facts.headers, now=time.time() if now is None else now)
    detail = redact(str(exc).strip() or type(exc).__name__)
    if len(detail) > 500:
        detail = detail[:497] + "..."
    return Verdict(
        reason=reason,
        retriable=retriable,
        retry_after=retry_after,
        status=facts.status,
        code=facts.codes[0] if facts.codes else None,
        detail=detail,
        stream_interrupted=_stream_interrupted(facts),
    )


def classify_response(
    status: int,
    headers: object = None,
    body: object = None,
    *,
    rules: Sequence[RuleLike] = (),
    provider: str | None = None,
    now: float | None = None,
) -> Verdict:
    """Classify an HTTP response that is not an exception (for transports and proxies).

    Equivalent to ``classify(anygate.ResponseError(status, headers=headers, body=body))``:
    the same rules see the status, the headers (``Retry-After``, ``x-should-retry``) and
    the JSON body's ``error.code`` / ``error.type`` / ``error.message``.

    Args:
        status: the HTTP status code.
        headers: httpx/httpx2 ``Headers``, a mapping or a list of pairs.
        body: the decoded JSON (a dict), or raw ``bytes``/``str`` (decoded as JSON when it
            looks like JSON).
        rules, provider, now: as for :func:`classify`.

    Raises:
        TypeError: ``status`` is not an int.
    """
    if isinstance(status, bool) or not isinstance(status, int):
        msg = f"status must be an int (got {status!r} of type {type(status).__name__})"
        raise TypeError(msg)
    error = ResponseError(status, headers=headers, body=decode_body(body))
    return classify(error, rules=rules, provider=provider, now=now)
