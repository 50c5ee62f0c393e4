"""What kind of "slow down" a provider error is: the policy steers differently by kind.

A classified failure (:class:`anygate.Verdict`) says whether to retry; this module says what
the answer tells about the provider's limits, which decides what the *gate* does:

========================  =====================================================  ===========
kind                      recognised by                                          the gate
========================  =====================================================  ===========
``"concurrency"``         429 whose code or message names concurrency            limit cut to
                          (``concurrency_limit_exceeded``, "too many concurrent   the calls in
                          requests")                                             flight - 1
``"overload"``            Anthropic 529 / ``overloaded_error`` at 429 or 529,    limit cut by
                          503 *with* ``Retry-After`` (a server asking for less   the adaptive
                          load, not one that is down)                            factor
``"burst"``               ``limit_burst_rate`` (:attr:`Reason.BURST_RATE`)       rate paced,
                                                                                 pause
``"rate"``                any other 429 (RPM / TPM)                              waits out
                                                                                 Retry-After;
                                                                                 rate paced
========================  =====================================================  ===========

Anything else (a 503 without Retry-After, timeouts, dropped connections) is not a throttle:
it is what the circuit breaker counts. None of these kinds is a failure for the breaker: a
throttled provider is up, and it recovers by being asked less, not by being left alone.

Pure functions of the verdict, so the decision is testable without a clock or a gate.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, Literal

from .classify import Reason

if TYPE_CHECKING:
    from .classify import Verdict

__all__ = ["ThrottleKind", "throttle_kind"]

ThrottleKind = Literal["concurrency", "overload", "burst", "rate"]

_CONCURRENCY_WORDS: Final = ("concurren", "parallel request", "simultaneous")
_OVERLOAD_CODES: Final = frozenset({"overloaded_error", "overloaded", "server_overloaded"})


def throttle_kind(verdict: Verdict) -> ThrottleKind | None:
    """The throttle ``verdict`` reports, or ``None`` when it is no throttle at all."""
    if verdict.reason is Reason.BURST_RATE:
        return "burst"
    status = verdict.status
    code = (verdict.code or "").lower()
    if status == 529 or (status == 429 and code in _OVERLOAD_CODES):
        return "overload"
    if status == 503 and verdict.retry_after is not None:
        return "overload"
    if status == 429:
        text = f"{code} {verdict.detail.lower()}"
        if any(word in text for word in _CONCURRENCY_WORDS):
            return "concurrency"
        return "rate"
    return None
