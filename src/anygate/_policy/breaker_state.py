"""A circuit breaker's values: its states, its statistics record, the checks of its settings.

Shared by :mod:`~anygate._policy.breaker` (the state machine), :mod:`~anygate._policy.permit`
(a call's handle on it, which reads the state) and :mod:`~anygate._policy.sharing` (which
checks settings before it creates or reconfigures a shared breaker). Kept apart from the
breaker so that the permit can read the state without importing the breaker that creates
it. Values and checks only: no state, no lock.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .._validation import check_int, check_number

__all__ = ["BreakerState", "BreakerStatistics", "check_recovery", "check_threshold"]


class BreakerState(str, enum.Enum):
    """A breaker's state. A ``str`` enum: ``BreakerState.OPEN == "open"``."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class BreakerStatistics:
    """A consistent snapshot of a breaker.

    Attributes:
        name: the breaker's name.
        state: the current state.
        failures: consecutive counted failures while closed.
        failure_threshold, recovery_timeout: the current settings.
        opened: times the breaker has opened (including re-opening after a failed probe).
        rejected: calls failed fast with :class:`anygate.CircuitOpen`.
        retry_after: seconds until a probe may run (0 unless open).
    """

    name: str
    state: BreakerState
    failures: int
    failure_threshold: int
    recovery_timeout: float
    opened: int
    rejected: int
    retry_after: float


def check_threshold(value: object) -> int:
    checked = check_int("failure_threshold", value, minimum=1)
    assert checked is not None
    return checked


def check_recovery(value: object) -> float:
    checked = check_number("recovery_timeout", value, allowed="a finite number of seconds >= 0")
    assert checked is not None
    return checked
