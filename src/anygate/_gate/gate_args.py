"""What a :class:`anygate.Gate` accepts: its argument checks, on the one number path.

Each check names the parameter, the constraint and the value (``_validation.show`` keeps
huge ints readable) and returns the normalised value; the gate changes nothing before
they pass.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .._validation import MAX_COUNT, check_flag, check_int, check_wait, show
from .rate import Rate

if TYPE_CHECKING:
    from .ledger import Ledger

__all__ = [
    "MAX_TOKENS",
    "check_capacity",
    "check_cost",
    "check_fast_acquire",
    "check_output_tokens",
    "check_priority",
    "check_rate",
    "check_timeout",
    "check_tokens",
    "check_tokens_type",
    "max_cost",
]


def check_capacity(value: object) -> int | float:
    """An ``int >= 0`` (at most ``MAX_COUNT``), a whole float, or ``math.inf``."""
    if type(value) is int and 0 <= value <= MAX_COUNT:
        return value
    allowed = "an int >= 0 or math.inf"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        msg = f"capacity must be {allowed} (got {show(value)} of type {type(value).__name__})"
        raise TypeError(msg)
    if isinstance(value, float):
        if value == math.inf:
            return math.inf
        if math.isnan(value):
            msg = f"capacity must be {allowed} (got {value!r})"
            raise ValueError(msg)
        if value < 0:
            msg = f"capacity must be >= 0 (got {value!r})"
            raise ValueError(msg)
        if not value.is_integer():
            msg = f"capacity must be a whole number (got {value!r})"
            raise ValueError(msg)
        if value > MAX_COUNT:
            msg = f"capacity must be <= {MAX_COUNT} (math.inf: no limit) (got {value!r})"
            raise ValueError(msg)
        return int(value)
    checked = check_int("capacity", value, minimum=0)
    assert checked is not None
    return checked


def check_fast_acquire(value: object) -> bool:
    """``fast_acquire=``: a bool (no truthy stand-ins: a typo'd ``"no"`` must not mean True)."""
    return check_flag("fast_acquire", value)


def check_timeout(value: object) -> float | None:
    # No upper bound short of overflow: the waiters cap a wait at threading.TIMEOUT_MAX.
    return check_wait("timeout", value)


# Token counts stay exactly representable as floats in the budget arithmetic.
MAX_TOKENS = 2**53
_MAX_PRIORITY = 10**9


def max_cost(rate: Rate) -> int:
    """The largest ``tokens=`` one admission may state under ``rate``, in whole tokens.

    A whole minute of the token budget, and of the input budget (a cost stating no output
    part is all input), rounded down; ``MAX_TOKENS`` without either. An int, so that the
    uncontended ``acquire(tokens=)`` checks a cost with one int comparison (an int against
    a float rate compares slower; an int is at most a float ``x`` iff at most ``floor(x)``).
    """
    limit = MAX_TOKENS
    for per_minute in (rate.tokens_per_minute, rate.input_tokens_per_minute):
        if per_minute is not None:
            limit = min(limit, math.floor(per_minute))
    return limit


def check_tokens(value: object, gate: Ledger) -> int:
    """``tokens=``: an int >= 0 (None = 0), no more than one minute of the token budget."""
    if value is None:
        return 0
    value = check_tokens_type(value)
    budgets = gate._budgets
    if budgets is not None:
        tpm = budgets.rate.tokens_per_minute
        if tpm is not None and value > tpm:
            msg = (
                f"tokens must be <= the gate's tokens_per_minute ({tpm:g}): a cost above one "
                f"minute's budget can never be admitted (got {show(value)})"
            )
            raise ValueError(msg)
        itpm = budgets.rate.input_tokens_per_minute
        if itpm is not None and value > itpm:
            msg = (
                f"tokens must be <= the gate's input_tokens_per_minute ({itpm:g}) when no "
                "output_tokens are stated (the whole cost is then input): a cost above one "
                f"minute's budget can never be admitted (got {show(value)})"
            )
            raise ValueError(msg)
    return value


def check_output_tokens(value: object, tokens: int | None) -> int:
    """``output_tokens=``: an int >= 0, the output part of ``tokens`` (``<= tokens``)."""
    if isinstance(value, bool) or not isinstance(value, int):
        msg = (
            "output_tokens must be an int >= 0 or None "
            f"(got {show(value)} of type {type(value).__name__})"
        )
        raise TypeError(msg)
    if not 0 <= value <= MAX_TOKENS:
        msg = f"output_tokens must be >= 0 and <= 2**53 (got {show(value)})"
        raise ValueError(msg)
    if tokens is not None and value > tokens:
        msg = (
            "output_tokens must be <= tokens: they are the output part of the call's total "
            f"(got output_tokens={show(value)}, tokens={show(tokens)})"
        )
        raise ValueError(msg)
    return value


def check_cost(tokens: object, output_tokens: object, gate: Ledger) -> tuple[int, int]:
    """``tokens=`` with ``output_tokens=`` stated: ``(total, output part)``.

    ``tokens=None`` means the total is the output part alone (no input stated). The input
    part (``total - output``) must fit a minute of ``input_tokens_per_minute``, the output
    part a minute of ``output_tokens_per_minute``, the total a minute of
    ``tokens_per_minute``: a bigger cost could never be admitted.
    """
    if tokens is not None:
        check_tokens_type(tokens)
    total = tokens if isinstance(tokens, int) else None
    out = check_output_tokens(output_tokens, total)
    total = out if total is None else total
    budgets = gate._budgets
    if budgets is not None:
        rate = budgets.rate
        for name, limit, value in (
            ("tokens", rate.tokens_per_minute, total),
            ("the input part (tokens - output_tokens)", rate.input_tokens_per_minute, total - out),
            ("output_tokens", rate.output_tokens_per_minute, out),
        ):
            if limit is not None and value > limit:
                per = {
                    "tokens": "tokens_per_minute",
                    "output_tokens": "output_tokens_per_minute",
                }.get(name, "input_tokens_per_minute")
                msg = (
                    f"{name} must be <= the gate's {per} ({limit:g}): a cost above one "
                    f"minute's budget can never be admitted (got {show(value)})"
                )
                raise ValueError(msg)
    return total, out


def check_tokens_type(value: object) -> int:
    """``tokens=``'s type and range alone (no budget involved)."""
    if isinstance(value, bool) or not isinstance(value, int):
        msg = (
            f"tokens must be an int >= 0 or None (got {show(value)} of type {type(value).__name__})"
        )
        raise TypeError(msg)
    if not 0 <= value <= MAX_TOKENS:
        msg = f"tokens must be >= 0 and <= 2**53 (got {show(value)})"
        raise ValueError(msg)
    return value


def check_priority(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        msg = f"priority must be an int (got {show(value)} of type {type(value).__name__})"
        raise TypeError(msg)
    if not -_MAX_PRIORITY <= value <= _MAX_PRIORITY:
        msg = f"priority must be between -1e9 and 1e9 (got {show(value)})"
        raise ValueError(msg)
    return value


def check_rate(value: object) -> Rate | None:
    if value is not None and not isinstance(value, Rate):
        msg = f"rate must be an anygate.Rate or None (got {show(value)} of type {type(value).__name__})"
        raise TypeError(msg)
    return value
