"""Token usage reported inside a server-sent-event stream, for the gated transports.

:class:`StreamUsage` follows a stream and knows the total once the stream says it:
OpenAI's final chunk when ``stream_options.include_usage`` was set, the Responses API's
``response.completed``, Anthropic's ``message_start`` (input) and ``message_delta``
(cumulative output). A stream that never says keeps the estimate. It reads bytes only and
lives with the transports, which are the only code that sees a stream's raw bytes (the
documents' own usage is :func:`anygate.usage_tokens`'s).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from ._usage_report import document_report

__all__ = ["StreamUsage"]

_MAX_TOKENS = 2**53  # as anygate.usage_tokens: a larger count is garbage, not usage


def _int(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_TOKENS:
        return None
    return value


class StreamUsage:
    """Follows a server-sent-event stream's bytes; :attr:`tokens` once it reports usage.

    Feed it every chunk of the (decoded) body in order. Lines are parsed only if they
    mention ``usage``, so following a long stream costs a substring search per line.
    Anthropic splits its usage over events: input tokens in ``message_start``, output
    tokens (cumulative) in each ``message_delta``; the largest of each field seen counts.
    """

    __slots__ = ("_fields", "_input", "_model", "_output", "_rest", "_total")

    def __init__(self) -> None:
        self._rest = b""
        self._total: int | None = None
        self._fields: dict[str, int] = {}
        self._input: int | None = None
        self._output: int | None = None
        self._model: str | None = None

    @property
    def parts(self) -> tuple[int | None, int | None, str | None]:
        """``(input, output, model)`` as reported so far (for telemetry; ``None``: unsaid)."""
        return self._input, self._output, self._model

    @property
    def tokens(self) -> int | None:
        """The total the stream reported so far, or ``None``."""
        if self._total is not None:
            return self._total
        return sum(self._fields.values()) if self._fields else None

    def feed(self, chunk: bytes) -> None:
        """Take the next bytes of the stream."""
        if not chunk:
            return
        data = self._rest + chunk
        if b"\n" not in data:
            self._rest = data if len(data) < 1 << 22 else b""  # a runaway line: drop it
            return
        *lines, self._rest = data.split(b"\n")
        for line in lines:
            if b"usage" in line and line.startswith(b"data:"):
                self._line(line[5:])

    def close(self) -> None:
        """The stream ended: a last line without a newline still counts."""
        rest, self._rest = self._rest, b""
        if b"usage" in rest and rest.startswith(b"data:"):
            self._line(rest[5:])

    def _line(self, payload: bytes) -> None:
        try:
            event = json.loads(payload)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return
        if not isinstance(event, Mapping):
            return
        given, output, model = document_report(event)
        # Anthropic's message_delta repeats the output so far: the largest seen counts.
        if given is not None:
            self._input = max(given, self._input or 0)
        if output is not None:
            self._output = max(output, self._output or 0)
        if model is not None:
            self._model = model
        usage = event.get("usage")
        if usage is None:
            message = event.get("message") or event.get("response")  # message_start / Responses
            if isinstance(message, Mapping):
                usage = message.get("usage")
        if not isinstance(usage, Mapping):
            return
        total = _int(usage.get("total_tokens"))
        if total is not None:
            self._total = total
            return
        for key, value in usage.items():
            count = _int(value)
            if count is not None and key.endswith("_tokens"):
                self._fields[key] = max(count, self._fields.get(key, 0))
