"""The fleet gate's argument checks: durations, counts and choices, each error naming the
parameter, the constraint and the value (the project's one number path)."""

from __future__ import annotations

from .._validation import check_number, show

__all__ = ["MIN_LEASE_TTL", "MIN_OP_TIMEOUT", "MIN_TICKET_TTL", "choice", "count", "seconds"]

# The least durations that mean what they say (issue 27: 0.0009 s became a 0 ms lease that
# lapsed at once, 8 in use against 4). The script counts Redis time in whole milliseconds,
# and the heartbeat renews every lease_ttl / 3 through a thread hop and a round trip (about
# a millisecond here, far more on a loaded host): below 100 ms a lease would lapse between
# renewals. A ticket is renewed the same way, 10 ms leaves it a few round trips; a Redis
# call cannot answer in less than 1 ms.
MIN_LEASE_TTL = 0.1
MIN_TICKET_TTL = 0.01
MIN_OP_TIMEOUT = 0.001


def seconds(
    param: str, value: object, *, allow_zero: bool = False, least: float | None = None
) -> float:
    """A finite duration through the project's one number path (huge ints, NaN, bools)."""
    bound = ">= 0" if allow_zero else "> 0" if least is None else f">= {least:g}"
    checked = check_number(
        param,
        value,
        minimum=0.0,
        strict=not allow_zero,
        allowed=f"a finite number of seconds {bound}",
    )
    assert checked is not None  # none=False
    if least is not None and checked < least:
        msg = f"{param} must be a finite number of seconds >= {least:g} (got {show(value)})"
        raise ValueError(msg)
    return checked


def count(param: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        msg = f"{param} must be an int >= 0 (got {show(value)} of type {type(value).__name__})"
        raise TypeError(msg)
    if value < 0 or value >= 2**53:
        msg = f"{param} must be an int >= 0 and < 2**53 (got {show(value)})"
        raise ValueError(msg)
    return value


def choice(param: str, value: object, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        msg = f"{param} must be one of {', '.join(map(repr, choices))} (got {value!r})"
        raise ValueError(msg) if isinstance(value, str) else TypeError(msg)
    return value
