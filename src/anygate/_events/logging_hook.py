"""The policy's log lines, as one event hook installed by default.

Every line a policy writes about a call it makes (a retry scheduled, a call given up, its
breaker moving, its gate's adaptive limit moving) is derived here from the event record the
policy delivers to its hooks: nothing else in the attempt loop logs. So logging is one hook
among others (stamina's ``LoggingOnRetryHook`` is the model): replace it to log elsewhere or
in another shape, or remove it, and the loop does not change.

What stays direct logging, and why (see ``docs/design.md``): a broken hook (the dispatcher
reports it, and routing that report through the hooks could loop), a shared gate, limit or
breaker reconfigured while a policy is *built* (no call is running, so there is no event
stream to put it on), and the state changes of a :class:`anygate.CircuitBreaker` used
directly, outside any policy (it has no hooks).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, final

from .events import BreakerStateChanged, GaveUp, LimitChanged, RetryScheduled

if TYPE_CHECKING:
    from .events import Event

__all__ = ["LoggingHook", "log_breaker_change"]


def log_breaker_change(logger: logging.Logger, change: BreakerStateChanged) -> None:
    """Write the log line for a breaker state change (shared by the hook and the breaker)."""
    # An open breaker is WARNING, not ERROR: the library is handling a provider outage as
    # designed (callers get CircuitOpen), nothing in the program is broken, and ERROR
    # lines from a dependency page people. It is still above INFO because calls are now
    # being refused, which an operator wants to see without turning on verbose logging.
    if change.new == "open":
        logger.warning(
            "circuit %r opened after %d failure(s); next probe in %.3gs",
            change.breaker,
            change.failures,
            change.retry_after,
            extra={"breaker": change.breaker, "state": change.new, "delay_s": change.retry_after},
        )
    elif change.new == "closed":
        logger.info(
            "circuit %r closed: the provider recovered",
            change.breaker,
            extra={"breaker": change.breaker, "state": change.new},
        )
    else:
        logger.info(
            "circuit %r half-open: probing the provider",
            change.breaker,
            extra={"breaker": change.breaker, "state": change.new},
        )


@final
class LoggingHook:
    """An event hook that writes a policy's events as standard-library log records.

    Every :class:`anygate.Policy` has one unless told otherwise (``logging_hook=None``
    removes it, ``logging_hook=LoggingHook(logging.getLogger("myapp.llm"))`` or any other
    hook replaces it); it runs before the policy's ``hooks``. The records carry their facts
    in ``extra`` (``gate``, ``policy``, ``reason``, ``attempt``, ``delay_s``; ``breaker``,
    ``state``) for JSON handlers and structlog's stdlib bridge.

    Levels: a scheduled retry is INFO (one per failed attempt: in a storm, WARNING would
    flood the stderr of an application with no logging configured); a call given up is
    WARNING; a breaker opening is WARNING, half-open and closed INFO; the adaptive limit
    lowered after a burst-rate throttle is INFO, any other limit move DEBUG. Slot events
    (:class:`anygate.SlotWaiting`, :class:`anygate.SlotAdmitted`) are not logged, and a
    policy does not deliver them to this hook at all, so the uncontended call does not
    read the clock for it.

    This is not a place for slow work: it runs synchronously in the calling task, like
    every hook; a slow handler belongs behind a ``logging.handlers.QueueHandler``.

    Args:
        logger: where the records go; default the ``anygate`` logger.
    """

    __slots__ = ("_logger",)

    def __init__(self, logger: logging.Logger | None = None) -> None:
        given: object = logger  # checked at runtime: callers may not type-check
        if given is not None and not isinstance(given, logging.Logger):
            msg = f"logger must be a logging.Logger (got {logger!r})"
            raise TypeError(msg)
        self._logger = logging.getLogger("anygate") if logger is None else logger

    @property
    def logger(self) -> logging.Logger:
        """The logger the records go to."""
        return self._logger

    def __repr__(self) -> str:
        return f"LoggingHook(logger={self._logger.name!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LoggingHook):
            return NotImplemented
        return self._logger is other._logger

    def __hash__(self) -> int:
        return hash((LoggingHook, self._logger.name))

    def __call__(self, event: Event) -> None:
        """Write the record for ``event`` (nothing for slot events)."""
        if isinstance(event, RetryScheduled):
            self._retry(event)
        elif isinstance(event, GaveUp):
            self._gave_up(event)
        elif isinstance(event, BreakerStateChanged):
            log_breaker_change(self._logger, event)
        elif isinstance(event, LimitChanged):
            self._limit(event)

    def _retry(self, event: RetryScheduled) -> None:
        verdict = event.verdict
        self._logger.info(
            "%s: attempt %d/%d failed (%s); retrying in %dms: %s",
            event.policy,
            event.counted,
            event.max_attempts,
            verdict.reason.value,
            event.wait_ms,
            verdict.detail,
            extra={
                "gate": event.gate,
                "policy": event.policy,
                "reason": verdict.reason.value,
                "attempt": event.attempt,
                "delay_s": event.wait_s,
            },
        )

    def _gave_up(self, event: GaveUp) -> None:
        verdict = event.verdict
        # WARNING: the caller's call failed for good, which someone may need to act on
        # (and it is one line per failed call, not one per attempt).
        self._logger.warning(
            "%s: giving up after %d attempt(s) (%s, %s): %s",
            event.policy,
            event.attempts,
            event.why,
            verdict.reason.value,
            verdict.detail,
            extra={
                "gate": event.gate,
                "policy": event.policy,
                "reason": verdict.reason.value,
                "attempt": event.attempts,
            },
        )

    def _limit(self, event: LimitChanged) -> None:
        gate = event.gate
        extra = {"gate": gate, "policy": event.policy, "reason": event.reason}
        if event.reason == "burst_rate":
            self._logger.info(
                "gate %r: provider throttled the request burst rate; new attempts wait "
                "%.3gs and the concurrency limit goes %g -> %g (max %g)",
                gate,
                event.pause_s,
                event.old,
                event.new,
                event.max_concurrent_calls,
                extra=extra,
            )
        else:
            self._logger.debug(
                "gate %r: concurrency limit %g -> %g (max %g)",
                gate,
                event.old,
                event.new,
                event.max_concurrent_calls,
                extra=extra,
            )
