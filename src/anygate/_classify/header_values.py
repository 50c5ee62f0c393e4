"""Rate-limit header values -> numbers: counts, Go durations, RFC 3339 and HTTP dates.

The value parsers that every header family in :mod:`~anygate._classify.headers` shares:
OpenAI's counts and Go-duration resets (``6m0s``, ``12ms``, ``1h2m3.5s``), Anthropic's
RFC 3339 reset times measured from the response's ``Date`` header, the IETF fields' delta
seconds. Each takes the raw text a server sent and returns a number it can be trusted
with, or ``None``; none of them raises on what a server sends (garbage, NaN, negative,
huge counts, resets beyond a day). Which header means what, and whether a limit and its
remaining agree, is the families' business, not this module's.

Split out of ``headers`` as its own concern (the text of one value, not the meaning of a
header); the only state is the one-entry cache of the last ``Date`` header.
"""

from __future__ import annotations

import math
import re
from datetime import datetime, timedelta, timezone
from email.utils import parsedate_to_datetime

__all__ = ["MAX_RESET_S", "bounded_seconds", "count", "date_of", "go_duration", "rfc3339_seconds"]

#: Resets beyond a day are not per-minute buckets and not worth waiting for.
MAX_RESET_S = 86_400.0
# Counts beyond this are typos or overflow artefacts, not limits.
_MAX_COUNT = 1e15


def count(text: str | None) -> float | None:
    """A non-negative finite count, or ``None`` (garbage, NaN, negative, huge)."""
    if text is None:
        return None
    try:
        value = float(text.strip())
    except ValueError:
        return None
    if not 0 <= value <= _MAX_COUNT:  # also rejects NaN
        return None
    return value


def bounded_seconds(value: float | None) -> float | None:
    """``value`` if it is a usable reset (0 to :data:`MAX_RESET_S` seconds), else ``None``."""
    if value is None or not 0 <= value <= MAX_RESET_S:
        return None
    return value


_GO_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|\u00b5s|\u03bcs|ms|s|m|h)")
_GO_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "\u00b5s": 1e-6,
    "\u03bcs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}


def go_duration(text: str | None) -> float | None:
    """Seconds in a Go duration (``6m0s``, ``12ms``, ``1h2m3.5s``, ``0``) or plain seconds.

    ``None`` for garbage, negative durations, and anything beyond a day.
    """
    if text is None:
        return None
    text = text.strip()
    if not text or len(text) > 64:
        return None
    plain = count(text)
    if plain is not None:
        return bounded_seconds(plain)
    # The common shapes ("12ms", "1.5s") without the regex; "1m2s" and friends below.
    if text.endswith("ms"):
        number, scale = text[:-2], 1e-3
    elif text.endswith("s"):
        number, scale = text[:-1], 1.0
    else:
        number, scale = "", 0.0
    if number and number.replace(".", "", 1).isdigit() and number.isascii():
        return bounded_seconds(float(number) * scale)
    total = 0.0
    pos = 0
    for match in _GO_PART.finditer(text):
        if match.start() != pos:
            return None
        total += float(match.group(1)) * _GO_UNITS[match.group(2)]
        pos = match.end()
    if pos != len(text) or pos == 0:
        return None
    return bounded_seconds(total)


_RFC3339 = re.compile(
    r"(\d{4})-(\d\d)-(\d\d)[Tt ](\d\d):(\d\d):(\d\d)(\.\d+)?([Zz]|[+-]\d\d:?\d\d)?$"
)


def rfc3339_seconds(text: str | None, now: float) -> float | None:
    """Seconds from ``now`` (a POSIX time) until an RFC 3339 time; 0 if it has passed."""
    if text is None:
        return None
    match = _RFC3339.match(text.strip())
    if match is None:
        return bounded_seconds(count(text))  # some gateways send delta seconds here
    year, month, day, hour, minute, second, frac, zone = match.groups()
    try:
        when = datetime(
            int(year),
            int(month),
            int(day),
            int(hour),
            int(minute),
            int(second),
            tzinfo=timezone.utc,
        )
        if zone and zone not in "Zz":
            sign = 1 if zone[0] == "+" else -1
            digits = zone[1:].replace(":", "")
            when -= sign * timedelta(hours=int(digits[:2]), minutes=int(digits[2:]))
        at = when.timestamp() + (float(frac) if frac else 0.0)
    except (ValueError, OverflowError, OSError):
        return None
    delta = at - now
    if math.isnan(delta) or delta > MAX_RESET_S:
        return None
    return max(0.0, delta)


_last_date: tuple[str, float | None] = ("", None)


def date_of(text: str | None) -> float | None:
    """The response's ``Date`` header as a POSIX time, or ``None`` (the last one is cached:
    responses arriving within a second share it)."""
    global _last_date  # a one-entry cache; a race only recomputes it
    if text is None:
        return None
    last = _last_date
    if last[0] == text:
        return last[1]
    _last_date = (text, at := _parse_date(text))
    return at


def _parse_date(text: str) -> float | None:
    try:
        when = parsedate_to_datetime(text.strip())
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
        return when.timestamp()
    except (TypeError, ValueError, IndexError, OverflowError, OSError):
        return None
