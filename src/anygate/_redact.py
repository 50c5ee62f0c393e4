"""Secret redaction for every message, event and log line anygate produces.

Provider errors echo request details back: OpenAI repeats a wrong key in its 401 message
("Incorrect API key provided: sk-proj-..."), proxies dump headers, and SDK reprs include
``Authorization`` values. Anything anygate turns into text passes through :func:`redact`
first, and the ``anygate`` logger carries a filter that redacts records (including
formatted tracebacks) that other code logs under it.

This is a safety net for the shapes keys usually take, not a data-loss-prevention system:
a secret with no recognisable prefix or label cannot be told apart from ordinary text.
"""

from __future__ import annotations

import logging
import re
import traceback

__all__ = ["REDACTED", "RedactingFilter", "redact"]

REDACTED = "[REDACTED]"

# Order matters: labelled values first (they may contain a "Bearer" or "sk-" inside), then
# free-standing shapes.
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # Authorization / Proxy-Authorization / x-api-key / api-key / api_key headers or fields,
    # in "Name: value", "name=value", "'name': 'value'" and JSON forms. The value runs to the
    # end of a quoted string, or to a delimiter when unquoted. "Bearer xyz" stays one value.
    (
        re.compile(
            r"""(?ix)
            (?P<label>
                ["']?
                (?:(?:proxy-)?authorization|x-api-key|api[-_]?key|x-goog-api-key|access[-_]?token)
                ["']?
                \s*[:=]\s*
            )
            (?:
                (?P<q>["'])(?P<quoted>[^"'\r\n]*)(?P=q)
              | (?P<bare>(?:(?:bearer|basic|token)\s+)?[^\s,;"'}\]\)]+)
            )
            """
        ),
        "label",
    ),
    # Free-standing bearer tokens: "Bearer eyJhbGciOi..."
    (re.compile(r"(?i)\b(?P<label>bearer\s+)[A-Za-z0-9._~+/\-]+=*"), "label"),
    # OpenAI / Anthropic / DeepSeek / DashScope style keys: sk-..., sk-proj-..., sk-ant-...
    (re.compile(r"\bsk-[A-Za-z0-9_\-]{6,}"), ""),
)


def _sub_labelled(match: re.Match[str]) -> str:
    label = match.group("label")
    quote = match.groupdict().get("q")
    if quote:
        return f"{label}{quote}{REDACTED}{quote}"
    return f"{label}{REDACTED}"


def redact(text: object) -> str:
    """Return ``text`` with API keys, bearer tokens and ``Authorization`` values masked.

    Recognised: ``sk-...`` keys (OpenAI, Anthropic ``sk-ant-``, DeepSeek, DashScope),
    ``Bearer <token>``, and the value of any ``Authorization``, ``Proxy-Authorization``,
    ``x-api-key``, ``api_key``/``api-key`` or ``access_token`` label in header, query,
    keyword, repr or JSON form. Each secret becomes ``[REDACTED]``; labels stay so the
    text still says *which* credential was involved.

    Args:
        text: any string; non-strings are converted with ``str()`` first.
    """
    if not isinstance(text, str):
        text = str(text)
    if not text:
        return text
    for pattern, kind in _PATTERNS:
        text = pattern.sub(_sub_labelled, text) if kind == "label" else pattern.sub(REDACTED, text)
    return text


class RedactingFilter(logging.Filter):
    """A logging filter that redacts a record's message, arguments and traceback.

    Attached to the ``anygate`` logger at import. It formats the message once (so
    ``%``-style arguments holding secrets are covered) and pre-renders ``exc_info`` into
    ``exc_text`` so handlers print the redacted traceback instead of formatting the
    original exception themselves.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken format string must not lose the record
            message = str(record.msg)
        record.msg = redact(message)
        record.args = None
        if record.exc_info and record.exc_info[0] is not None:
            rendered = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
            record.exc_text = redact(rendered)
            record.exc_info = None
        elif record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


logger = logging.getLogger("anygate")
if not any(isinstance(f, RedactingFilter) for f in logger.filters):
    logger.addFilter(RedactingFilter())
