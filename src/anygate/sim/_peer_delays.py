"""The peers' delay formulas, as pure functions: what each waits before its next try.

Each function is one peer's formula, written from its current source (named with its
version in the docstring) with the constants it uses beside it, and drawing from a seeded
generator in the same order as the source draws (for example tenacity computes the next
wait *before* checking whether to stop). Pure: no clock, no state, so
``tests/test_sim_peers.py`` checks each number by number and ``docs/simulate.md`` states
the same formulas. The retry loops that call them, on AnyIO time, are
:mod:`._peers`'.

Split out of ``_peers`` as its own concern: the arithmetic of each peer, apart from the
loops and clients around it.

Sources read for these (late 2026): openai-python 3.57.0 ``_base_client.py`` /
``_constants.py``; tenacity 9.1.4+ (main at c650fb4) ``wait.py``; stamina 26.1.0+ (main
at 87ccfa4) ``_core.py``; LiteLLM Router's ``_time_to_sleep_before_retry``,
``litellm.utils._calculate_retry_after`` and ``constants.py``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Final, Protocol

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "LITELLM_INITIAL_RETRY_DELAY",
    "LITELLM_JITTER",
    "LITELLM_MAX_RETRY_AFTER",
    "LITELLM_MAX_RETRY_DELAY",
    "OPENAI_INITIAL_RETRY_DELAY",
    "OPENAI_MAX_RETRIES",
    "OPENAI_MAX_RETRY_AFTER",
    "OPENAI_MAX_RETRY_DELAY",
    "Random",
    "cookbook_wait",
    "litellm_retry_after",
    "litellm_retry_delay",
    "openai_retry_after",
    "openai_retry_delay",
    "openai_should_retry",
    "stamina_backoff",
]

# openai-python 3.57.0 _constants.py
OPENAI_MAX_RETRIES: Final = 2
OPENAI_INITIAL_RETRY_DELAY: Final = 0.5
OPENAI_MAX_RETRY_DELAY: Final = 8.0
OPENAI_MAX_RETRY_AFTER: Final = 120.0
# litellm constants.py
LITELLM_INITIAL_RETRY_DELAY: Final = 0.5
LITELLM_MAX_RETRY_DELAY: Final = 8.0
LITELLM_JITTER: Final = 0.75
LITELLM_MAX_RETRY_AFTER: Final = 60


class Random(Protocol):
    """The draws the peers make: ``random.Random`` (seeded) or a test's pinned stand-in."""

    def random(self) -> float: ...
    def uniform(self, a: float, b: float) -> float: ...


# ---------------------------------------------------------------------- pure delays


def openai_retry_after(headers: Mapping[str, str]) -> float | None:
    """openai-python ``_parse_retry_after_header``: ``retry-after-ms`` / 1000, else
    ``retry-after`` as (fractional) seconds. (The HTTP-date form is not modelled: the
    simulated provider never sends one.)"""
    for header, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(header)
        if value is None:
            continue
        try:
            delay = float(value)
        except ValueError:
            continue
        if delay == math.inf and value.strip().lower() not in ("inf", "+inf", "infinity"):
            return OPENAI_MAX_RETRY_AFTER + 1
        return delay / divisor
    return None


def openai_should_retry(status: int, headers: Mapping[str, str]) -> bool:
    """openai-python ``_should_retry``: no when Retry-After > 120 s; obey ``x-should-retry``;
    else retry 408, 409, 429 and >= 500."""
    retry_after = openai_retry_after(headers)
    if (
        retry_after is not None
        and math.isfinite(retry_after)
        and retry_after > OPENAI_MAX_RETRY_AFTER
    ):
        return False
    flag = headers.get("x-should-retry")
    if flag == "true":
        return True
    if flag == "false":
        return False
    return status in (408, 409, 429) or status >= 500


def openai_retry_delay(retries_taken: int, headers: Mapping[str, str], rng: Random) -> float:
    """openai-python ``_calculate_retry_timeout``, retry number ``retries_taken + 1``.

    ``Retry-After`` in ``(0, 120]`` is used as is; else
    ``min(0.5 * 2**retries_taken, 8) * (1 - 0.25 * U)``, ``U = rng.random()`` (drawn only
    then). ``retries_taken`` is ``max_retries - remaining_retries``: 0 before the first retry.
    """
    retry_after = openai_retry_after(headers)
    if (
        retry_after is not None
        and math.isfinite(retry_after)
        and 0 < retry_after <= OPENAI_MAX_RETRY_AFTER
    ):
        return retry_after
    exponent = min(retries_taken, 1000)
    sleep = min(OPENAI_INITIAL_RETRY_DELAY * 2.0**exponent, OPENAI_MAX_RETRY_DELAY)
    timeout = sleep * (1 - 0.25 * rng.random())
    return max(timeout, 0.0)


def cookbook_wait(
    attempt_number: int, rng: Random, *, low: float = 1.0, high: float = 60.0
) -> float:
    """tenacity ``wait_random_exponential(min=1, max=60)`` after attempt ``attempt_number``.

    ``wait_exponential``: ``top = max(min, min(multiplier * 2**(attempt_number - 1), max))``
    (multiplier 1); then ``random.uniform(min, top)``. So 1 s after the first attempt, then
    U(1, 2), U(1, 4), U(1, 8), U(1, 16).
    """
    exponent = attempt_number - 1
    if exponent > math.log(high, 2):
        top = max(low, high)
    else:
        top = max(max(0.0, low), min(2.0**exponent, high))
    return rng.uniform(low, top)


def stamina_backoff(
    num: int,
    rng: Random,
    *,
    initial: float = 0.1,
    maximum: float = 5.0,
    exp_base: float = 2.0,
    jitter: float = 1.0,
) -> float:
    """stamina ``_compute_backoff`` after attempt ``num`` (1-based), its defaults.

    ``min(wait_max, wait_initial * wait_exp_base**(num - 1) + U(0, wait_jitter))``: with
    the defaults ``min(5, 0.1 * 2**(num - 1) + U(0, 1))``.
    """
    extra = rng.uniform(0, jitter) if jitter else 0.0
    try:
        return min(maximum, initial * exp_base ** (num - 1) + extra)
    except OverflowError:
        return maximum


def litellm_retry_after(headers: Mapping[str, str]) -> int | None:
    """LiteLLM ``_get_retry_after_from_exception_header``: ``int(retry-after)``, else none.

    ``int()`` of a fractional value such as ``"2.500"`` fails, and LiteLLM then falls back
    to its own backoff, as modelled here. (The HTTP-date form is not modelled.)
    """
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None


def litellm_retry_delay(exponent: int, headers: Mapping[str, str], rng: Random) -> float:
    """LiteLLM Router, one deployment: ``_calculate_retry_after`` with ``min_timeout=0``.

    ``jitter = 0.75 * U``; an integer ``Retry-After`` in ``(0, 60]``: that plus jitter; else
    ``min(max(0.5 * 2**exponent, 0), 8) + jitter``. ``exponent`` is
    ``num_retries - remaining_retries``.
    """
    extra = LITELLM_JITTER * rng.random()
    retry_after = litellm_retry_after(headers)
    if retry_after is not None and 0 < retry_after <= LITELLM_MAX_RETRY_AFTER:
        return retry_after + extra
    sleep = max(LITELLM_INITIAL_RETRY_DELAY * 2.0**exponent, 0)
    return min(sleep, LITELLM_MAX_RETRY_DELAY) + extra
