"""Pure arithmetic for retries: decorrelated jitter and ``Retry-After`` parsing.

Nothing here sleeps, reads a clock or touches global state; callers pass the random source
and "now" in, so every result is reproducible in tests and in the simulator.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import timezone
from email.utils import parsedate_to_datetime
from typing import Protocol

__all__ = ["Uniform", "decorrelated_jitter", "jitter_window", "parse_retry_after"]


class Uniform(Protocol):
    """Anything with ``uniform(a, b)``, such as :class:`random.Random`."""

    def uniform(self, a: float, b: float) -> float: ...


def jitter_window(prev_ms: float | None, *, base_ms: float, cap_ms: float) -> tuple[float, float]:
    """The interval the next decorrelated-jitter delay is drawn from, in milliseconds.

    Formula (AWS "decorrelated jitter", with the window clamped *before* drawing)::

        lo   = min(base, cap)
        prev = lo                        if prev is None (the first retry)
        hi   = min(cap, max(lo, 3 * prev))
        window = [lo, hi]

    Seeding ``prev`` with the reason's *own* base keeps the first window wide: with the
    burst-rate defaults (base 5000 ms, cap 8000 ms) it is [5000, 8000] rather than the
    degenerate [5000, 5000] a fleet would retry on in lockstep. Clamping to the cap before
    drawing spreads delays uniformly instead of piling them on the cap. A base above the
    cap is treated as the cap.

    Args:
        prev_ms: the previous delay of this call, or ``None`` before the first retry.
        base_ms: the smallest delay (>= 0).
        cap_ms: the largest delay (>= 0).

    Returns:
        ``(lo, hi)`` with ``0 <= lo <= hi <= max(cap_ms, 0)``.
    """
    lo = max(0.0, min(float(base_ms), float(cap_ms)))
    prev = lo if prev_ms is None else max(0.0, float(prev_ms))
    hi = min(float(cap_ms), max(lo, 3.0 * prev))
    return lo, max(lo, hi)


def decorrelated_jitter(
    prev_ms: float | None, *, base_ms: float, cap_ms: float, rng: Uniform
) -> float:
    """Draw the next retry delay in milliseconds: ``uniform(*jitter_window(...))``.

    See :func:`jitter_window` for the formula. Defaults used by :class:`anygate.Policy`:
    base 1000 ms (5000 ms for ``burst_rate``), cap 8000 ms.

    Args:
        prev_ms: the previous delay of this call, or ``None`` before the first retry.
        base_ms: the smallest delay.
        cap_ms: the largest delay.
        rng: the random source, e.g. ``random.Random(seed)``.
    """
    lo, hi = jitter_window(prev_ms, base_ms=base_ms, cap_ms=cap_ms)
    if lo == hi:
        return lo
    # Some generators can return b itself; clamp so the contract lo <= d <= hi holds.
    return min(hi, max(lo, rng.uniform(lo, hi)))


def _header(headers: object, name: str) -> str | None:
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
    raw_ms = _header(headers, "retry-after-ms")
    if raw_ms is not None:
        ms = _finite_non_negative(raw_ms)
        if ms is not None:
            return ms / 1000.0
    raw = _header(headers, "retry-after")
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
