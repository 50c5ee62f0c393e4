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
                (?:(?:proxy-)?authorization|x-api-key|api[-_]?key|x-goog-api-key
                  |(?:access|refresh|id|auth)[-_]?token|x-auth-token|client[-_]?secret
                  |secret[-_]?(?:access[-_]?)?key|password
                  |x-amz-(?:security-token|signature|credential))
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
    # Query parameters that carry a key in URLs: Gemini's "?key=AIza...", Azure SAS "sig=",
    # generic "token=" (the header forms are covered above).
    (
        re.compile(r"(?i)(?P<label>[?&;](?:key|token|sig|signature)=)[^&#\s\"'<>]+"),
        "label",
    ),
    # Free-standing bearer tokens: "Bearer eyJhbGciOi..."
    (re.compile(r"(?i)\b(?P<label>bearer\s+)[A-Za-z0-9._~+/\-]+=*"), "label"),
    # OpenAI / Anthropic / DeepSeek / DashScope / OpenRouter style keys: sk-..., sk-proj-...,
    # sk-ant-..., sk-or-v1-...
    (re.compile(r"\bsk-[A-Za-z0-9_\-]{6,}"), ""),
    # Other providers' key shapes, wherever they appear (header, query, JSON body, repr):
    # Google AIza..., Groq gsk_..., xAI xai-..., Hugging Face hf_..., Replicate r8_...,
    # Perplexity pplx-..., Fireworks fw_..., GitHub gh?_..., AWS access key ids, JWTs.
    (
        re.compile(
            r"""(?x)
            \b(?:
                AIza[0-9A-Za-z_\-]{30,}
              | gsk_[A-Za-z0-9]{20,}
              | xai-[A-Za-z0-9]{20,}
              | hf_[A-Za-z0-9]{20,}
              | r8_[A-Za-z0-9]{20,}
              | pplx-[A-Za-z0-9]{20,}
              | fw_[A-Za-z0-9]{20,}
              | gh[pousr]_[A-Za-z0-9]{20,}
              | (?:AKIA|ASIA)[0-9A-Z]{16}
              | eyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]*
            )
            """
        ),
        "",
    ),
)


def _sub_labelled(match: re.Match[str]) -> str:
    label = match.group("label")
    quote = match.groupdict().get("q")
    if quote:
        return f"{label}{quote}{REDACTED}{quote}"
    return f"{label}{REDACTED}"


def redact(text: object) -> str:
    """Return ``text`` with API keys, bearer tokens and ``Authorization`` values masked.

    Recognised: ``sk-...`` keys (OpenAI, Anthropic ``sk-ant-``, DeepSeek, DashScope,
    OpenRouter), Google ``AIza...``, Groq ``gsk_``, xAI ``xai-``, Hugging Face ``hf_``,
    Replicate ``r8_``, Perplexity ``pplx-``, Fireworks ``fw_``, GitHub tokens, AWS access
    key ids and JWTs anywhere; ``Bearer <token>``; the value of any ``Authorization``,
    ``Proxy-Authorization``, ``x-api-key``, ``api_key``/``api-key``, ``x-goog-api-key``,
    ``access_token`` (and refresh/id/auth tokens), ``client_secret``, ``password`` or
    ``X-Amz-Security-Token``/``-Signature``/``-Credential`` label in header, query,
    keyword, repr or JSON form; and URL query parameters ``key=``, ``token=``, ``sig=``
    (Gemini's ``?key=AIza...``, Azure SAS URLs). Each secret becomes ``[REDACTED]``; labels stay so the
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
