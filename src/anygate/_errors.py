"""Every exception anygate raises on purpose.

The hierarchy::

    AnygateError
    ├── Busy            no slot or rate budget within the wait (maps to HTTP 429)
    ├── CallFailed      a guarded call failed for good (carries the verdict)
    ├── CircuitOpen     the provider's breaker is open; fail fast
    ├── ConfigError     a configuration value is missing, mistyped or out of range
    │                   (also a ValueError, so generic validation handlers catch it)
    └── ResponseError   a provider answered with an error status (integrations raise it
                        inside a guarded call so the policy can classify and retry it)

Cancellation (``asyncio.CancelledError``, ``trio.Cancelled``) and other ``BaseException``
subclasses are never wrapped: they propagate unchanged.
"""

from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._verdict import Verdict

__all__ = ["AnygateError", "Busy", "CallFailed", "CircuitOpen", "ConfigError", "ResponseError"]


class AnygateError(Exception):
    """Raised for every failure anygate reports itself; the base of all others."""


class Busy(AnygateError):
    """Raised when no slot (or no rate budget) became available within the allowed wait.

    Attributes:
        gate: the gate's name.
        capacity: the gate's capacity when the wait ended.
        in_flight: the number of unreleased tokens when the wait ended.
        waited: seconds the caller was willing to wait (0 for a non-blocking attempt).
        retry_after_s: when the gate's rate budget decided: seconds from now until the
            earliest admission this caller could get (an honest ``Retry-After``);
            ``None`` when only slots were missing (nobody knows when one frees up).
    """

    def __init__(
        self,
        *,
        gate: str,
        capacity: float,
        in_flight: int,
        waited: float,
        retry_after_s: float | None = None,
    ) -> None:
        self.gate = gate
        self.capacity = capacity
        self.in_flight = in_flight
        self.waited = waited
        self.retry_after_s = retry_after_s
        cap = "unlimited" if math.isinf(capacity) else str(int(capacity))
        if retry_after_s is not None:
            limit = "wait" if waited > 0 else "caller would not wait"
            text = (
                f"gate {gate!r} is busy: its rate budget admits this call in "
                f"{_seconds(retry_after_s)}, beyond the {limit}"
                + (f" of {_seconds(waited)}" if waited > 0 else "")
                + f" ({in_flight} of {cap} slots in use)"
            )
        else:
            if waited > 0:
                wait = f"after waiting {_seconds(waited)}"
            else:
                wait = "and the caller would not wait"
            text = f"gate {gate!r} is busy: {in_flight} of {cap} slots in use {wait}; retry shortly"
        super().__init__(text)

    def __reduce__(self) -> tuple[object, ...]:
        return (
            _rebuild_busy,
            (self.gate, self.capacity, self.in_flight, self.waited, self.retry_after_s),
        )


def _rebuild_busy(
    gate: str, capacity: float, in_flight: int, waited: float, retry_after_s: float | None = None
) -> Busy:
    return Busy(
        gate=gate,
        capacity=capacity,
        in_flight=in_flight,
        waited=waited,
        retry_after_s=retry_after_s,
    )


def _seconds(value: float) -> str:
    return f"{value:.3g}s" if value < 10 else f"{value:.0f}s"


class CallFailed(AnygateError):
    """Raised when a guarded call failed for good: not retriable, or out of budget or time.

    The provider's exception is the ``__cause__``.

    Attributes:
        verdict: how the last failure was classified.
        attempts: how many attempts were made (1 = no retry).
        user_message: wording safe to show an end user (secrets redacted).
    """

    def __init__(self, message: str, *, verdict: Verdict, attempts: int, user_message: str) -> None:
        super().__init__(message)
        self.verdict = verdict
        self.attempts = attempts
        self.user_message = user_message

    @classmethod
    def of(cls, exc: BaseException) -> CallFailed | None:
        """The :class:`CallFailed` a policy with ``reraise=True`` gave up with, for the
        provider exception it raised instead; ``None`` for any other exception.

        ``except openai.RateLimitError as e: CallFailed.of(e).attempts``: the verdict and
        the attempts stay reachable while the SDK's own type is what propagates.
        """
        found = getattr(exc, _ATTACHED, None)
        return found if isinstance(found, CallFailed) else None

    def _attach(self, exc: BaseException) -> None:
        """Make this failure reachable from ``exc`` (:meth:`of`) and add its message to
        ``exc``'s notes, so a traceback shows the attempts and the verdict.

        An exception that takes no attributes (``__slots__``) gets the note only.
        """
        with contextlib.suppress(AttributeError, TypeError):
            setattr(exc, _ATTACHED, self)
        note = f"anygate: {self}"
        notes = getattr(exc, "__notes__", None)
        if isinstance(notes, list) and note in notes:
            return  # the same exception given up on twice (nested policies): one note
        with contextlib.suppress(AttributeError, TypeError):
            if isinstance(notes, list):
                notes.append(note)
            else:
                # BaseException.add_note is 3.11+; __notes__ is the PEP 678 spelling 3.10's
                # backports (exceptiongroup, pytest) read.
                exc.__notes__ = [note]  # type: ignore[attr-defined,unused-ignore]


#: The attribute :meth:`CallFailed.attach` sets on a re-raised provider exception.
_ATTACHED = "_anygate_call_failed"


class CircuitOpen(AnygateError):
    """Raised when the circuit breaker is open (or half-open with its probe taken).

    Attributes:
        name: the breaker's name.
        retry_after: seconds until the breaker lets a probe through (0 when half-open).
    """

    def __init__(self, *, name: str, retry_after: float) -> None:
        self.name = name
        self.retry_after = retry_after
        if retry_after > 0:
            when = f"retry in {_seconds(retry_after)}"
        else:
            # Half-open with the single probe already out: the next few seconds decide.
            when = "a probe call is testing the provider; retry shortly"
        super().__init__(f"circuit {name!r} is open: the provider failed repeatedly; {when}")

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_circuit_open, (self.name, self.retry_after))


def _rebuild_circuit_open(name: str, retry_after: float) -> CircuitOpen:
    return CircuitOpen(name=name, retry_after=retry_after)


class ConfigError(AnygateError, ValueError):
    """Raised when a configuration value is unknown, mistyped or out of range.

    Attributes:
        path: the dotted key path, such as ``llm_call.retry_max_attempts``.
        value: the offending value.
    """

    def __init__(self, message: str, *, path: str = "", value: object = None) -> None:
        super().__init__(message)
        self.path = path
        self.value = value


class ResponseError(AnygateError):
    """Raised when a provider answered with an HTTP error status instead of a result.

    Integrations (and users wrapping a raw HTTP client) raise it inside a guarded call so
    that :func:`anygate.classify` sees the status, headers and JSON body, exactly as it
    sees an SDK's own status errors. :func:`anygate.classify_response` classifies the same
    data without raising.

    Attributes:
        status_code: the HTTP status.
        headers: the response headers (any mapping or httpx ``Headers``), or ``None``.
        body: the decoded JSON body (usually a dict), the raw text, or ``None``.
        response: the original response object, if the caller passed one.
    """

    def __init__(
        self,
        status_code: int,
        *,
        headers: object = None,
        body: object = None,
        message: str | None = None,
        response: object = None,
    ) -> None:
        self.status_code = status_code
        self.headers = headers
        self.body = body
        self.response = response
        if message is None:
            message = _body_message(body)
        text = f"HTTP {status_code}" + (f": {message}" if message else "")
        from ._redact import redact  # local: _redact imports logging machinery

        super().__init__(redact(text))

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_response_error, (self.status_code, self.headers, self.body, str(self)))


def _rebuild_response_error(
    status_code: int, headers: object, body: object, text: str
) -> ResponseError:
    err = ResponseError(status_code, headers=headers, body=body)
    err.args = (text,)
    return err


def _body_message(body: object) -> str:
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict):
            for key in ("message", "msg", "detail", "code", "type"):
                value = error.get(key)
                if isinstance(value, str) and value:
                    return value
        elif isinstance(error, str):
            return error
        for key in ("message", "msg", "detail", "code"):
            value = body.get(key)
            if isinstance(value, str) and value:
                return value
        return ""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str):
        return body.strip()[:300]
    return ""
