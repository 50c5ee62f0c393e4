"""Frozen event records, the hook dispatcher, and the human wording of failures.

A policy reports what it does through *hooks*: plain callables that receive one event
record each, synchronously, in the task or thread making the call. Hooks are for
telemetry, progress messages and tests; they cannot change what the policy does. A hook
that raises an ``Exception`` is logged (under ``anygate``) and otherwise ignored, so a
broken dashboard can never break a provider call. Hooks must not block: hand slow work to
a queue.

A hook that raises a ``BaseException`` that is not an ``Exception`` (``KeyboardInterrupt``,
``SystemExit``, or a Ctrl-C that trio delivers inside the hook) is *not* contained: the
user asked the program to stop, and swallowing that would be worse than any telemetry gap.
It propagates out of the call after the call has cleaned up: the breaker permit is
settled (neutral unless the call had already failed for good), the attempt's slot is
released, and the hooks after it do not see that event. Nothing is stranded.

Every text field (``message``, ``detail``) has secrets redacted before the record exists.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeAlias

from .._redact import redact
from .._verdict import Reason, Verdict

__all__ = [
    "BreakerStateChanged",
    "Event",
    "GaveUp",
    "Hook",
    "LimitChanged",
    "RetryScheduled",
    "SlotAdmitted",
    "SlotWaiting",
    "UsageReported",
    "circuit_open_message",
    "emit",
    "retry_message",
    "user_message",
]

logger = logging.getLogger("anygate")


@dataclass(frozen=True)
class RetryScheduled:
    """A failed attempt will be retried after ``wait_ms``; no slot is held meanwhile.

    Attributes:
        policy: the policy's name.
        attempt: the attempt that failed (1 for the first).
        max_attempts: the *effective* budget for this failure (2 for burst-rate with the
            defaults, not the configured 3).
        wait_ms: the delay before the next attempt, in whole milliseconds: the call's own
            backoff, or after a burst-rate throttle the gate's pause that holds every
            attempt back (the call then sleeps nothing of its own).
        reason: why the attempt failed.
        from_retry_after: the delay is the provider's ``Retry-After``, not jitter.
        message: human wording, e.g. "LLM request retry 1/2: provider is throttling
            request burst rate. Retrying in 6s."
        verdict: the full classification.
        gate: the name of the gate the attempt took its slot from.
        counted: where this failure stands in the budget it counts against (the
            ``1`` in ``1/2``): throttles and other failures are counted apart, and a failed
            half-open probe is not counted, so it can be below ``attempt``.
        wait_s: ``wait_ms`` unrounded, in seconds.
    """

    policy: str
    attempt: int
    max_attempts: int
    wait_ms: int
    reason: Reason
    from_retry_after: bool
    message: str
    verdict: Verdict
    # Added after the first release, with defaults, so positional construction still works.
    gate: str = ""
    counted: int = 0
    wait_s: float = 0.0


@dataclass(frozen=True)
class GaveUp:
    """A call failed for good; :class:`anygate.CallFailed` is raised next.

    Attributes:
        policy: the policy's name.
        attempts: attempts made.
        max_attempts: the effective budget when it gave up.
        reason: the last failure's reason.
        why: ``"not_retriable"``, ``"budget"``, ``"deadline"``, ``"retry_after_ceiling"``
            or ``"circuit_open"``.
        message: the user-facing message (as ``CallFailed.user_message``).
        verdict: the last classification.
        gate: the name of the policy's gate.
    """

    policy: str
    attempts: int
    max_attempts: int
    reason: Reason
    why: str
    message: str
    verdict: Verdict
    gate: str = ""


@dataclass(frozen=True)
class BreakerStateChanged:
    """A circuit breaker moved between ``closed``, ``open`` and ``half_open``.

    Attributes:
        breaker: the breaker's name.
        old, new: the states, as strings.
        failures: consecutive counted failures at the change.
        retry_after: seconds until a probe may run (``0`` unless ``new == "open"``).
    """

    breaker: str
    old: str
    new: str
    failures: int
    retry_after: float


@dataclass(frozen=True)
class SlotWaiting:
    """An attempt found the gate full and is about to queue for a slot.

    Attributes:
        policy, gate: names.
        attempt: the attempt number (1 for the first).
        in_flight, waiting, capacity: the gate as seen just before queueing (a hook that
            reads ``gate.statistics()`` here does not see this caller in ``waiting`` yet).
    """

    policy: str
    gate: str
    attempt: int
    in_flight: int
    waiting: int
    capacity: float


@dataclass(frozen=True)
class SlotAdmitted:
    """An attempt got its slot and is about to call the provider.

    Attributes:
        policy, gate: names.
        attempt: the attempt number (1 for the first).
        waited_s: seconds spent waiting for the slot (by the policy's time source).
    """

    policy: str
    gate: str
    attempt: int
    waited_s: float


@dataclass(frozen=True)
class LimitChanged:
    """A gate's adaptive concurrency limit moved (see :class:`anygate.AdaptiveLimit`).

    Lowered after a burst-rate throttle, with a pause; raised one slot at a time as calls
    succeed. Delivered to the hooks of the policy whose call caused the change (policies
    sharing the gate share the limit, not their hooks).

    Attributes:
        policy: the policy whose call caused the change.
        gate: the gate's name.
        old, new: the gate's capacity before and after. Equal when a throttle finds the
            limit at its floor: the pause still applies.
        max_concurrent_calls: the configured maximum the limit grows back to.
        reason: ``"burst_rate"`` (lowered after a throttle), ``"recovered"`` (raised
            after successful calls) or ``"latency"`` (set from a queueing server's
            latencies, with ``adaptive_concurrency.latency`` on).
        pause_s: seconds during which admitted attempts wait before calling the provider
            (0 when raised).
    """

    policy: str
    gate: str
    old: float
    new: float
    max_concurrent_calls: float
    reason: str
    pause_s: float


@dataclass(frozen=True)
class UsageReported:
    """A provider's answer ended and said which model served it and how many tokens it used.

    Delivered by the gated transports (:mod:`anygate.httpx`, :mod:`anygate.httpx2`) built
    with a policy, to that policy's hooks, once per successful (2xx) response, when its
    body has been read or closed, in the task or thread that read it (an answer whose
    usage cannot be read, not JSON nor a stream, reports as its headers arrive). It is for telemetry
    (:class:`anygate.otel.Telemetry` turns it into the OpenTelemetry GenAI attributes and
    ``gen_ai.client.token.usage``), not for accounting: the gate's token budget is settled
    by the transport itself. Every field is a name or a number read from the exchange;
    never a message, a URL path, a header value or a prompt.

    Attributes:
        policy, gate: names.
        input_tokens, output_tokens: the usage the response reported (input including
            cached prompt tokens), or ``None`` when it reported none (a stream without
            ``stream_options.include_usage``, a body closed early).
        request_model: the ``model`` the request body named, or ``None``.
        response_model: the ``model`` the response named, or ``None``.
        server_address: the host the request went to (``api.openai.com``), or ``None``.
        server_port: its port (the scheme's default when the URL names none), or ``None``.
        operation: the GenAI operation the URL's path is an endpoint of (``"chat"``,
            ``"text_completion"``, ``"embeddings"``), or ``None`` when not recognised.
        provider: the policy's ``provider`` hint, else the API family the path belongs to
            (``"openai"`` or ``"anthropic"``), or ``None``.
    """

    policy: str
    gate: str
    input_tokens: int | None = None
    output_tokens: int | None = None
    request_model: str | None = None
    response_model: str | None = None
    server_address: str | None = None
    server_port: int | None = None
    operation: str | None = None
    provider: str | None = None


Event: TypeAlias = (
    RetryScheduled
    | GaveUp
    | BreakerStateChanged
    | SlotWaiting
    | SlotAdmitted
    | LimitChanged
    | UsageReported
)
Hook: TypeAlias = Callable[[Event], object]


def emit(hooks: Sequence[Hook], event: Event) -> None:
    """Deliver ``event`` to each hook in order; a hook's exception is logged and dropped.

    A ``BaseException`` that is not an ``Exception`` propagates (see the module docstring);
    callers emit only where every slot and permit they hold is already protected by a
    ``try`` that gives it back.
    """
    for hook in hooks:
        try:
            hook(event)
        except Exception:  # noqa: PERF203 - each hook is isolated from the others on purpose
            logger.exception(
                "anygate hook %r raised on %s; ignored",
                hook,
                type(event).__name__,
                extra={"event": type(event).__name__},
            )


# --------------------------------------------------------------------------- wording

_RETRY_REASON_TEXT = {
    Reason.BUSY: "provider is busy",
    Reason.BURST_RATE: "provider is throttling request burst rate",
}


def retry_message(attempt: int, max_attempts: int, wait_ms: float, reason: Reason) -> str:
    """``"LLM request retry 1/2: provider is throttling request burst rate. Retrying in 6s."``"""
    seconds = max(1, round(wait_ms / 1000)) if wait_ms > 0 else 0
    text = _RETRY_REASON_TEXT.get(reason, "provider request failed temporarily")
    return f"LLM request retry {attempt}/{max_attempts}: {text}. Retrying in {seconds}s."


_USER_MESSAGES = {
    Reason.QUOTA: (
        "The LLM provider rejected the request because the account is out of quota or "
        "billing is unavailable. Please check the provider account and try again."
    ),
    Reason.AUTH: (
        "The LLM provider rejected the request because authentication or access is "
        "invalid. Please check the provider credentials and try again."
    ),
    Reason.BURST_RATE: (
        "The LLM provider is temporarily throttling requests because the request rate "
        "increased too quickly. Please wait a moment and try again."
    ),
    Reason.TRANSIENT: (
        "The LLM provider is temporarily unavailable and the request could not be completed. "
        "Please wait a moment and continue."
    ),
    Reason.BUSY: (
        "The LLM provider is overloaded right now and the request could not be completed. "
        "Please wait a moment and continue."
    ),
}
_STREAM_MESSAGE = (
    "The LLM provider's response stream was interrupted before it finished. A shorter "
    "request or a lower output limit is more likely to get through; please try again."
)


def user_message(verdict: Verdict) -> str:
    """Wording safe to show an end user for a call that failed with ``verdict``.

    One message per reason (quota, auth, burst rate, transient, busy), a suggestion to ask
    for shorter output when a stream was cut off, and for ``generic`` the provider's own
    message with secrets redacted.
    """
    if verdict.stream_interrupted and verdict.reason in (Reason.TRANSIENT, Reason.BUSY):
        return _STREAM_MESSAGE
    text = _USER_MESSAGES.get(verdict.reason)
    if text is not None:
        return text
    return redact(f"LLM request failed: {verdict.detail or 'unknown error'}")


def circuit_open_message(retry_after: float) -> str:
    """Wording for end users while the breaker fails calls fast."""
    if retry_after > 0 and math.isfinite(retry_after):
        when = f" Please try again in about {max(1, math.ceil(retry_after))}s."
    else:
        when = " Please try again shortly."
    return (
        "The LLM provider is unavailable after repeated failures, so requests are paused "
        "briefly to let it recover." + when
    )
