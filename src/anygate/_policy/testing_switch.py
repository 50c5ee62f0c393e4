"""The testing switch: make policies retry instantly in users' own test suites.

Process-wide, behind one ``threading.Lock``; policies read an immutable snapshot at the
start of each call, so flipping the switch never tears a call that is already running.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._validation import check_flag

if TYPE_CHECKING:
    from types import TracebackType

__all__ = ["TestingState", "is_testing", "set_testing", "testing_state"]


@dataclass(frozen=True)
class TestingState:
    """The switch's value. ``attempts`` caps every policy's attempts when not ``None``."""

    __test__ = False  # not a pytest test class despite the name

    enabled: bool = False
    attempts: int | None = None


_lock = threading.Lock()
_state = TestingState()


def testing_state() -> TestingState:
    """The current switch value (an immutable snapshot)."""
    return _state


def is_testing() -> bool:
    """Whether testing mode is on."""
    return _state.enabled


class _Restore:
    """Returned by :func:`set_testing`; restores the previous state when used with ``with``."""

    __slots__ = ("_previous",)

    def __init__(self, previous: TestingState) -> None:
        self._previous = previous

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        global _state
        with _lock:
            _state = self._previous


def set_testing(testing: bool, *, attempts: int | None = None) -> _Restore:
    """Turn testing mode on or off for every policy in the process.

    In testing mode every backoff sleep is zero (jitter *and* ``Retry-After``), and if
    ``attempts`` is given no call makes more than that many attempts. Classification,
    budgets, the breaker and events behave as usual, so tests still see each retry.

    Works as a plain call or as a context manager that restores the previous settings::

        with anygate.set_testing(True, attempts=2):
            ...                                    # retries are instant, at most 2 tries
        # the previous settings are back

    Args:
        testing: on or off.
        attempts: cap on attempts per call while on (>= 1), or ``None`` for no cap.

    Raises:
        TypeError, ValueError: bad arguments.
    """
    global _state
    check_flag("testing", testing)
    if attempts is not None:
        if isinstance(attempts, bool) or not isinstance(attempts, int):
            msg = f"attempts must be an int >= 1 or None (got {attempts!r})"
            raise TypeError(msg)
        if attempts < 1:
            msg = f"attempts must be >= 1 (got {attempts!r})"
            raise ValueError(msg)
    with _lock:
        previous = _state
        _state = TestingState(enabled=testing, attempts=attempts if testing else None)
    return _Restore(previous)
