"""Retries for a gated transport, driven by a :class:`~anygate.Policy`'s own decisions.

Why not ``policy.call(fn)``: a policy holds its slot for exactly the duration of ``fn``,
but a transport must keep the slot until the *response body* is closed, long after
``handle_async_request`` has returned. So the transport takes its slots itself, and this
module runs the policy's attempt loop around it, reusing the policy's ``Retrier`` for
everything that is a decision (classification with the policy's rules, per-reason budgets,
jitter or ``Retry-After``, deadlines, the testing switch, events, breaker outcomes). Only the
slot handling differs from :meth:`anygate.Policy.call`.

How a failed *response* travels: the attempt raises :class:`ErrorResponse` (an
:class:`anygate.ResponseError` carrying the buffered response) so the policy classifies
it like any provider error; when the policy gives up, the transport hands that response to
the client marked ``x-should-retry: false``, so an SDK on top raises its usual typed error
(``RateLimitError``...) and does not retry again what anygate already retried.
"""

from __future__ import annotations

import json
import time
from contextlib import suppress
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from .._attempts import Attempts
from .._errors import Busy, CallFailed, ResponseError
from .._retrying import SUCCESS, Run, Stop
from .._testing import testing_state

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from .._gate import Gate
    from .._policy import Policy
    from .._retrying import Retrier

__all__ = [
    "CLASSIFIED_STATUSES",
    "ErrorResponse",
    "admitter",
    "decode_body",
    "retry_async",
    "retry_sync",
]

T = TypeVar("T")

# The statuses a provider uses for "not now" (the SDKs retry the same set, plus 425 Too
# Early); others (400, 401, 404...) are answers, returned to the caller untouched.
CLASSIFIED_STATUSES = frozenset({408, 409, 425, 429})


def is_classified(status: int) -> bool:
    """Whether a response with ``status`` is classified (and possibly retried)."""
    return status in CLASSIFIED_STATUSES or status >= 500


class ErrorResponse(ResponseError):
    """Raised inside a transport attempt for a classified status; carries the response.

    The response's body has been read and buffered, so it can still be handed to the
    client if this turns out to be the final answer.
    """


def decode_body(content: bytes) -> object:
    """The JSON document in ``content``, else its text (classification reads either)."""
    text = content.decode("utf-8", "replace")
    try:
        return json.loads(text)
    except ValueError:
        return text


def _retrier(policy: Policy) -> Retrier:
    # The policy's decision-maker, shared with Policy.call/call_sync. Private on purpose:
    # a public "run your attempts but let me hold the slot" entry point on Policy would
    # replace this reach-in (see the integration docs' design note).
    retrier: Retrier = policy._retrier
    return retrier


def breaker_passer(policy: Policy) -> Attempts | None:
    """What takes each attempt's breaker permit (waiting while open, as in
    :meth:`Policy.call`), or ``None`` for a policy without a breaker."""
    if policy.breaker is None:
        return None
    config = policy.config
    return Attempts(
        name=policy.name,
        gate=policy.gate,
        adaptive=policy.adaptive_limit,
        hooks=policy.hooks,
        busy_wait=None,
        attempt_timeout=None,
        max_attempts=config.retry.max_attempts,
        retrier=_retrier(policy),
        breaker=policy.breaker,
        wait_when_open=config.circuit_breaker.when_open == "wait",
    )


def admitter(policy: Policy, gate: Gate, timeout: float | None) -> Attempts:
    """How a transport under ``policy`` takes a slot: exactly as :meth:`Policy.call` does.

    Its ``admit`` / ``admit_sync`` take a slot of ``gate`` within ``timeout`` seconds, sit
    out the adaptive limit's pause (after a burst-rate throttle) *holding* the slot, record
    the limit's generation in the run, and emit SlotWaiting / SlotAdmitted. The attempt
    loop itself (``run``) is not used here: the transport keeps the slot past the attempt,
    until the response body is closed.
    """
    config = policy.config
    return Attempts(
        name=policy.name,
        gate=gate,
        # The policy's gate's limit, even for a transport given another gate: the throttle
        # is reported to that limit (by the policy's Retrier), so its pause is the one to
        # honour.
        adaptive=policy.adaptive_limit,
        hooks=policy.hooks,
        busy_wait=timeout,
        attempt_timeout=config.attempt_timeout_s,
        max_attempts=config.retry.max_attempts,
        retrier=_retrier(policy),
    )


def _give_up(retrier: Retrier, run: Run, stop: Stop, exc: BaseException) -> None:
    """Emit GaveUp and settle the breaker outcome exactly as Policy.call would."""
    # A transport answers with the provider's last response or exception, not with
    # CallFailed: that keeps the SDK's own error types (and retry rules) intact.
    with suppress(CallFailed):
        retrier.fail(run, stop.why, stop.max_attempts, exc)


async def retry_async(policy: Policy, attempt: Callable[[Run], Awaitable[T]]) -> T:
    """Run ``attempt(run)`` (``run.attempt`` = 1, 2, ...) under ``policy`` until it returns
    or the policy gives up, sleeping without a slot in between.

    ``attempt`` takes its slot through :func:`admitter`'s ``admit``, which records the
    adaptive limit's generation in ``run``: a burst-rate 429 from an attempt admitted
    before the latest cut is then old news, as in :meth:`anygate.Policy.call`.

    Raises:
        CircuitOpen: the breaker is open (``when_open: fail``); nothing was attempted.
        Busy: an attempt found no slot in time (neutral for the breaker, not retried).
        the last attempt's exception: when the policy gives up (an :class:`ErrorResponse`
            for a failed response).
    """
    retrier = _retrier(policy)
    testing = testing_state()
    passer = breaker_passer(policy)
    run = Run()
    try:
        while True:
            run.attempt += 1
            if passer is not None:
                try:
                    await passer.pass_breaker(run)
                except CallFailed:
                    # Open after a failed attempt in fail mode: answer with that attempt's
                    # response or error, as when the budget runs out.
                    assert run.exc is not None
                    raise run.exc from None
            run.phase = "attempt"
            try:
                result = await attempt(run)
            except Exception as exc:
                if isinstance(exc, Busy) or retrier.is_control_flow(exc):
                    raise
                wait = retrier.plan(
                    run,
                    exc,
                    anyio.current_time(),
                    anyio.current_effective_deadline(),
                    testing,
                )
                retrier.attempt_ended(run)
                if isinstance(wait, Stop):
                    _give_up(retrier, run, wait, exc)
                    raise
                run.phase = "sleep"
                await anyio.sleep(wait)
            else:
                run.outcome = SUCCESS
                return result
    finally:
        retrier.settle(run)


def retry_sync(policy: Policy, attempt: Callable[[Run], T]) -> T:
    """The blocking twin of :func:`retry_async` (``time.sleep`` between attempts)."""
    retrier = _retrier(policy)
    testing = testing_state()
    passer = breaker_passer(policy)
    run = Run()
    try:
        while True:
            run.attempt += 1
            if passer is not None:
                try:
                    passer.pass_breaker_sync(run, float("inf"))
                except CallFailed:
                    assert run.exc is not None
                    raise run.exc from None
            run.phase = "attempt"
            try:
                result = attempt(run)
            except Exception as exc:
                if isinstance(exc, Busy) or retrier.is_control_flow(exc):
                    raise
                wait = retrier.plan(run, exc, time.monotonic(), float("inf"), testing)
                retrier.attempt_ended(run)
                if isinstance(wait, Stop):
                    _give_up(retrier, run, wait, exc)
                    raise
                run.phase = "sleep"
                if wait > 0:
                    time.sleep(wait)
            else:
                run.outcome = SUCCESS
                return result
    finally:
        retrier.settle(run)


def final_response(exc: ErrorResponse) -> Any:
    """The response to hand the client once the policy has given up on ``exc``."""
    response: Any = exc.response
    # anygate has retried this already (or decided it must not be): an SDK on top must not.
    response.headers["x-should-retry"] = "false"
    return response
