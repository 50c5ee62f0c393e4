"""Shared fakes for the policy tests: scripted provider calls and provider errors."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from anygate import ResponseError

if TYPE_CHECKING:
    from anygate._limits.sends import SendLimit


def burst() -> ResponseError:
    """A DashScope/Ark-style slope throttle."""
    return ResponseError(
        429,
        body={
            "error": {"code": "limit_burst_rate", "message": "Request rate increased too quickly"}
        },
    )


def transient(retry_after: str | None = None) -> ResponseError:
    """A 503; optionally with a Retry-After header (seconds)."""
    headers = None if retry_after is None else {"retry-after": retry_after}
    return ResponseError(503, headers=headers, body={"error": {"message": "upstream hiccup"}})


def quota() -> ResponseError:
    """OpenAI's billing error: never retried."""
    return ResponseError(
        429, body={"code": "insufficient_quota", "message": "You exceeded your current quota"}
    )


class StreamChunkTimeoutError(TimeoutError):
    """Named like langchain-openai's stream watchdog error."""


class FakeClock:
    """A manual monotonic clock for breakers."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Script:
    """An async provider call that raises the scripted errors in order, then returns."""

    def __init__(self, *errors: BaseException, result: object = "ok") -> None:
        self.errors = list(errors)
        self.result = result
        self.calls = 0

    async def __call__(self, *args: Any, **kwargs: Any) -> object:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return self.result


class SyncScript:
    """A blocking provider call that raises the scripted errors in order, then returns."""

    def __init__(self, *errors: BaseException, result: object = "ok") -> None:
        self.errors = list(errors)
        self.result = result
        self.calls = 0
        self._lock = threading.Lock()

    def __call__(self, *args: Any, **kwargs: Any) -> object:
        with self._lock:
            self.calls += 1
            error = self.errors.pop(0) if self.errors else None
        if error is not None:
            raise error
        return self.result


def send_if_let(limit: SendLimit, at: float, caller: object | None = None) -> float:
    """Ask ``limit`` (a :class:`anygate._limits.sends.SendLimit`) about a send at ``at``,
    and send when let go, as the adaptive limit does with every limit: the wait (``0.0``:
    it went)."""
    wait = limit.wait(at, 1.0, caller)
    if wait <= 0:
        limit.sent(at, 1.0, caller)
    return wait
