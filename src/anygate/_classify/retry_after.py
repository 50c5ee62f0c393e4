"""``Retry-After`` parsing: how long the provider asked us to wait.

Pure reading of response headers, kept apart from the backoff arithmetic (which is the
policy's) because classification reads it too: a verdict carries the server's wait.
Nothing here sleeps or touches global state; callers pass "now" in, so every result is
reproducible in tests and in the simulator.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import timezone
from email.utils import parsedate_to_datetime

__all__ = ["header", "parse_retry_after"]


def header(headers: object, name: str) -> str | None:
    """Case-insensitive header lookup on httpx ``Headers``, dicts or lists of pairs."""
    if headers is None:
        return None
    getter = getattr(headers, "get", None)
    if getter is not None:
        try:
            value = getter(name)
        except Exception:
            value = None
        if value is not None:
            return str(value)
    items: object
    if isinstance(headers, Mapping):
        items = headers.items()
    elif isinstance(headers, (list, tuple)):
        items = headers
    else:
        return None
    try:
        for pair in items:
            key, value = pair
            if isinstance(key, bytes):
                key = key.decode("latin-1")
            if isinstance(key, str) and key.lower() == name:
                return value.decode("latin-1") if isinstance(value, bytes) else str(value)
    except (TypeError, ValueError):
        return None
    return None


def _finite_non_negative(text: str) -> float | None:
    try:
        value = float(text.strip())
    except ValueError:
        return None
    if math.isnan(value) or math.isinf(value) or value < 0:
        return None
    return value


def parse_retry_after(headers: object, *, now: float) -> float | None:
    """How long the server asked us to wait, in seconds, or ``None`` if it did not say.

    Sources, first usable one wins (the order the OpenAI and Anthropic SDKs use)::

        retry-after-ms: <float milliseconds>     -> value / 1000
        retry-after:    <float seconds>          -> value
        retry-after:    <HTTP-date>              -> max(0, date - now)

    Garbage, negative, NaN and infinite values are ignored (the next source is tried), so
    a broken header falls back to ordinary backoff instead of a wild sleep. A date in the
    past means "now" (0.0).

    Args:
        headers: httpx/httpx2 ``Headers``, a mapping, or a sequence of ``(name, value)``
            pairs; names match case-insensitively. ``None`` gives ``None``.
        now: the current wall-clock time as a POSIX timestamp (``time.time()``), used only
            for the HTTP-date form.
    """
    raw_ms = header(headers, "retry-after-ms")
    if raw_ms is not None:
        ms = _finite_non_negative(raw_ms)
        if ms is not None:
            return ms / 1000.0
    raw = header(headers, "retry-after")
    if raw is None:
        return None
    seconds = _finite_non_negative(raw)
    if seconds is not None:
        return seconds
    try:
        when = parsedate_to_datetime(raw.strip())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # "-0000" parses naive; RFC 9110 dates are GMT anyway
        when = when.replace(tzinfo=timezone.utc)
    try:
        delta = when.timestamp() - now
    except (OverflowError, OSError, ValueError):
        return None
    if math.isnan(delta):
        return None
    return max(0.0, delta)
