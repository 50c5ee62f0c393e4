"""Token accounting for TPM budgets: estimate a request's cost, read the real one back.

* :func:`estimate_tokens` guesses a request body's cost before it is sent: the prompt
  (every string under ``messages``, ``input``, ``prompt``, ``system``, ``instructions``,
  ``tools``, counted by a pluggable counter, ``len(text) / 4`` by default) plus the output
  cap it states (``max_tokens``, ``max_completion_tokens`` or ``max_output_tokens``, times
  ``n``). The gate charges it at admission (``acquire(tokens=)``).
* :func:`usage_tokens` reads the real total from a response document: OpenAI chat
  completions (``usage.total_tokens``), the Responses API (``usage`` at the top or under
  ``response``), Anthropic messages (``input_tokens + cache_creation_input_tokens +
  cache_read_input_tokens + output_tokens``).
* ``anygate.integrations._stream_usage.StreamUsage`` (the transports') follows a
  server-sent-event stream and knows the total once the stream says it.

The token is then settled once with the real number (``Token.settle``), which replaces the
estimate: nothing is counted twice. This module only reads bytes and JSON; the transports
(``integrations/_accounting``) decide when.
"""

from __future__ import annotations

import importlib
import json
import math
from collections.abc import Callable, Mapping
from typing import Any

from .._validation import check_number

__all__ = [
    "TokenCounter",
    "chars_counter",
    "estimate_tokens",
    "tiktoken_counter",
    "usage_tokens",
]

#: Counts the tokens of one text.
TokenCounter = Callable[[str], int]

_PROMPT_KEYS = ("messages", "input", "prompt", "system", "instructions", "tools")
_OUTPUT_KEYS = ("max_completion_tokens", "max_output_tokens", "max_tokens")
# Keys under a message that are not text the model reads (ids, roles, types).
_SKIP_KEYS = frozenset({"role", "type", "id", "tool_call_id", "name", "cache_control"})
# Far more than any real request; a body bigger than this is not estimated from its text.
_MAX_WALK = 10_000
_MAX_TOKENS = 2**53


def chars_counter(chars_per_token: float = 4.0) -> TokenCounter:
    """A counter of ``ceil(len(text) / chars_per_token)`` tokens (OpenAI's rule of thumb).

    Raises:
        TypeError: ``chars_per_token`` is not a number.
        ValueError: ``chars_per_token`` is not a finite number > 0.
    """
    per = check_number("chars_per_token", chars_per_token, strict=True, maximum=1e6, unit="")
    assert per is not None

    def count(text: str) -> int:
        return math.ceil(len(text) / per)

    return count


_default_counter = chars_counter()


def tiktoken_counter(encoding: str = "o200k_base") -> TokenCounter:
    """A counter using ``tiktoken``'s ``encoding`` (optional: ``pip install tiktoken``).

    Raises:
        ImportError: tiktoken is not installed (anygate never requires it).
    """
    try:
        tiktoken = importlib.import_module("tiktoken")
    except ImportError as exc:
        msg = "tiktoken_counter() needs tiktoken: pip install tiktoken (or use chars_counter())"
        raise ImportError(msg) from exc
    enc = tiktoken.get_encoding(encoding)

    def count(text: str) -> int:
        return len(enc.encode(text, disallowed_special=()))

    return count


def _texts(value: object, out: list[str], budget: list[int]) -> None:
    """Collect the strings under ``value`` (depth-first, bounded by ``budget``)."""
    budget[0] -= 1
    if budget[0] < 0:
        return
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if key not in _SKIP_KEYS:
                _texts(item, out, budget)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _texts(item, out, budget)


def _as_document(body: object) -> Mapping[str, Any] | None:
    if isinstance(body, Mapping):
        return body
    if isinstance(body, (bytes, bytearray, memoryview, str)):
        try:
            doc = json.loads(bytes(body) if not isinstance(body, str) else body)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return None
        return doc if isinstance(doc, Mapping) else None
    return None


def _int(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_TOKENS:
        return None
    return value


def estimate_tokens(
    body: object, *, counter: TokenCounter | None = None, default_output: int = 0
) -> int | None:
    """The token cost of a request body before it is sent, or ``None`` if it is not JSON.

    ``prompt + output cap x n``: the prompt counted by ``counter`` over the body's text
    (see the module docstring), the cap from ``max_completion_tokens``,
    ``max_output_tokens`` or ``max_tokens`` (``default_output`` when none is stated), and
    ``n`` choices (default 1). An over-estimate is refunded when the call is settled, an
    under-estimate charged then: later callers wait out the difference.

    Args:
        body: the request's JSON as bytes, str or a mapping.
        counter: tokens of one text; default ``chars_counter()`` (4 characters a token).
        default_output: the output cost assumed when the body states no cap.
    """
    doc = _as_document(body)
    if doc is None:
        return None
    texts: list[str] = []
    budget = [_MAX_WALK]
    for key in _PROMPT_KEYS:
        if key in doc:
            _texts(doc[key], texts, budget)
    count = counter or _default_counter
    try:
        prompt = count("\n".join(texts)) if texts else 0
    except Exception:  # a user's counter failing must not fail the request
        prompt = _default_counter("\n".join(texts))
    output = None
    for key in _OUTPUT_KEYS:
        output = _int(doc.get(key))
        if output is not None:
            break
    if output is None:
        output = default_output
    choices = _int(doc.get("n")) or 1
    return min(_MAX_TOKENS, max(0, int(prompt)) + output * choices)


def _usage_total(usage: object) -> int | None:
    """The total of one ``usage`` object, OpenAI or Anthropic shaped."""
    if not isinstance(usage, Mapping):
        return None
    total = _int(usage.get("total_tokens"))
    if total is not None:
        return total
    parts = [
        _int(usage.get(key))
        for key in (
            "prompt_tokens",
            "completion_tokens",
            "input_tokens",
            "output_tokens",
            "cache_creation_input_tokens",
            "cache_read_input_tokens",
        )
    ]
    found = [p for p in parts if p is not None]
    return sum(found) if found else None


def usage_tokens(doc: object) -> int | None:
    """The total tokens a response document reports, or ``None`` if it reports none.

    Args:
        doc: a decoded JSON response (or its bytes / str): an OpenAI chat completion or
            Responses object, an Anthropic message, or a stream event carrying either.
    """
    found = _as_document(doc)
    if found is None:
        return None
    total = _usage_total(found.get("usage"))
    if total is None:
        inner = found.get("response")  # Responses API events: {"response": {...}}
        if isinstance(inner, Mapping):
            total = _usage_total(inner.get("usage"))
    return total
