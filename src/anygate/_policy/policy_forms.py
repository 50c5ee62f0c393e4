"""Policy's forms for work that is more than one function call: the step, the block, the slot.

:meth:`~anygate.Policy.run` and :meth:`~anygate.Policy.run_sync` (a step per attempt),
:meth:`~anygate.Policy.attempts` and :meth:`~anygate.Policy.attempts_sync` (a block per
attempt) and :meth:`~anygate.Policy.acquire` and :meth:`~anygate.Policy.acquire_sync` (one
slot taken the way an attempt takes it, not retried), each a few lines over the loop in
:mod:`anygate._policy.attempts`. :class:`anygate.Policy` inherits them, as the adaptive
limit inherits its chain (docs/design.md, "Layout").

Not for: the policy's construction, its settings and the one-call forms (``call``,
``call_sync``, ``@policy.retry``), which are :mod:`anygate._policy.policy`'s; nor the loop
itself. The class holds no state of its own: its fields are the policy's slots.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, TypeVar

import anyio

from .._validation import check_flag
from .attempt import make_attempt
from .blocks import AsyncBlocks, SyncBlocks, monotonic_deadline, refuse_event_loop
from .retrying import Run, check_deadline
from .run import hand_on_probe
from .testing_switch import testing_state

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

    from .._config.policy_config import PolicyConfig
    from .._events.events import Hook
    from .._gate.gate import Gate
    from .._gate.token import Token
    from .._limits.adaptive import AdaptiveLimit
    from .attempt import Attempt
    from .attempts import Attempts
    from .blocks import AttemptBlock
    from .breaker import CircuitBreaker
    from .retrying import Retrier

__all__ = ["PolicyForms"]

T = TypeVar("T")


class PolicyForms:
    """The step, block and slot forms of :class:`anygate.Policy`, which inherits them.

    Not for use on its own: it has no constructor and no fields; ``Policy`` sets the ones
    declared here.
    """

    __slots__ = ()

    _adaptive: AdaptiveLimit
    _breaker: CircuitBreaker | None
    _config: PolicyConfig
    _hooks: tuple[Hook, ...]
    _loop: Attempts
    _retrier: Retrier

    def _reraise(self, given: bool | None) -> bool:
        """A form's ``reraise=``: the policy's own when not given."""
        return self._config.reraise if given is None else check_flag("reraise", given)

    async def run(
        self,
        step: Callable[[Attempt], Awaitable[T]],
        /,
        *,
        deadline: float | None = None,
        reraise: bool | None = None,
    ) -> T:
        """Run ``await step(attempt)`` once per attempt until it returns or the policy gives up.

        The loop under every form of the policy, public for code whose attempt is more
        than one function call: a transport that keeps the slot until the response body
        is closed, a step that picks its gate or its arguments per attempt. The step gets
        an :class:`anygate.Attempt` (``number``, the ``previous`` verdict) and takes its
        slot with ``await attempt.acquire()``; everything else is :meth:`call`'s: the
        breaker permit per attempt, classification of what the step raises, budgets,
        jitter or ``Retry-After``, a backoff sleep holding no slot, the deadline, events.

        What differs from :meth:`call`: the slot is the step's (release it, or hand it on;
        whatever the step took is released for it when it raises); ``attempt_timeout_s``
        does not apply (only the step knows where its attempt's work starts); and the
        provider's rate-limit headers are not read from what the step raises or returns
        (call :func:`anygate.learn_from_headers` where it sees responses).

        Args:
            step: an async callable taking the :class:`anygate.Attempt`.
            deadline: as for :meth:`call`.
            reraise: after giving up, raise the last provider exception itself instead of
                :class:`anygate.CallFailed` (logged and reported alike, ``GaveUp``
                included), for callers that must keep a library's own error types;
                ``None`` (the default) takes the policy's ``reraise``.

        Raises:
            CallFailed: the call failed for good (not with ``reraise``).
            CircuitOpen, Busy: as for :meth:`call` (a ``Busy`` raised by the step ends the
                call; it is not retried).
            TypeError: ``step`` did not return an awaitable.
            Cancellation and control-flow exceptions propagate unchanged.
        """
        seconds = check_deadline(deadline)
        testing = testing_state()
        retrier = self._retrier
        run = Run()
        run.reraise = self._reraise(reraise)
        try:
            if seconds is None:
                return await self._loop.run(run, testing, step, timed=False)
            with anyio.CancelScope(deadline=anyio.current_time() + seconds):
                return await self._loop.run(run, testing, step, timed=True)
            retrier.deadline_failure(
                run, seconds, anyio.current_time() - run.slot_started, self._breaker
            )
        finally:
            retrier.settle(run)

    def run_sync(
        self,
        step: Callable[[Attempt], T],
        /,
        *,
        deadline: float | None = None,
        reraise: bool | None = None,
    ) -> T:
        """The blocking twin of :meth:`run`: ``step(attempt)`` in this (non-async) thread.

        The step takes its slot with ``attempt.acquire_sync()``. Waits block the thread;
        ``deadline`` bounds slot waits and sleeps and is checked between attempts, as for
        :meth:`call_sync`.

        Raises:
            CallFailed, CircuitOpen, Busy: as for :meth:`run`.
            RuntimeError: called on a thread running an event loop (use ``await run``).
            TypeError: ``step`` returned an awaitable (use :meth:`run`).
        """
        seconds = check_deadline(deadline)
        refuse_event_loop("run_sync", "run")
        testing = testing_state()
        retrier = self._retrier
        run = Run()
        run.reraise = self._reraise(reraise)
        try:
            return self._loop.run_sync(run, testing, monotonic_deadline(seconds), step)
        finally:
            retrier.settle(run)

    def attempts(
        self, *, deadline: float | None = None, reraise: bool | None = None
    ) -> AsyncIterator[AttemptBlock]:
        """The block form: retry a block of code as a whole (``async for`` / ``async with``).

        For work that is not one function call, such as consuming a streamed answer::

            async for attempt in policy.attempts():
                async with attempt:
                    async with client.stream(...) as response:
                        text = [chunk async for chunk in response.aiter_text()]

        Each ``async with attempt`` is one attempt on the same loop as :meth:`call`: it
        takes the breaker permit and one slot of the policy's gate when the block is
        entered and releases the slot when it is left; an exception in the block is
        classified, and a retriable one is swallowed and the loop goes round again after
        the backoff sleep (holding no slot). A block that ends normally ends the loop; so
        does ``break`` or ``return``. When the policy gives up, the ``async with``
        raises :class:`anygate.CallFailed` (or, with ``reraise``, the block's exception).
        ``attempt_timeout_s`` bounds each block after its slot is taken.

        Args:
            deadline: seconds from the first attempt bounding them all (slot waits,
                blocks, sleeps), as for :meth:`call`.
            reraise: as for :meth:`run`.

        Raises:
            CallFailed, CircuitOpen, Busy: as for :meth:`call`, from ``async with``.
        """
        return AsyncBlocks(self._loop, check_deadline(deadline), self._reraise(reraise))

    def attempts_sync(
        self, *, deadline: float | None = None, reraise: bool | None = None
    ) -> Iterator[AttemptBlock]:
        """The blocking twin of :meth:`attempts`: ``for attempt in ...: with attempt: ...``.

        Waits block the thread; ``deadline`` bounds slot waits and sleeps and is checked
        between attempts; ``attempt_timeout_s`` does not apply (as for :meth:`call_sync`).

        Raises:
            CallFailed, CircuitOpen, Busy: as for :meth:`call_sync`, from ``with``.
            RuntimeError: entered on a thread running an event loop.
        """
        return SyncBlocks(self._loop, check_deadline(deadline), self._reraise(reraise))

    async def acquire(
        self,
        gate: Gate | None = None,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - Gate.acquire's own, passed on
    ) -> Token:
        """Take one slot the way an attempt does, for work that is not retried.

        The policy's slot-wait budget, the adaptive limit's pause sat out holding the
        slot, the slot events; no breaker, no classification, no retries. For a request
        that can be sent only once (a transport's streamed upload); the token is the
        caller's to release.

        Args:
            gate, timeout: as for :meth:`anygate.Attempt.acquire`.

        Raises:
            Busy: no slot within the timeout.
        """
        run = Run()
        run.attempt = 1
        attempt = make_attempt(self._loop, run, testing_state(), bool(self._hooks), math.inf)
        token = await attempt.acquire(gate, timeout=timeout)
        hand_on_probe(run, self._adaptive)  # a slot outside the loop is never classified
        return token

    def acquire_sync(self, gate: Gate | None = None, *, timeout: float | None = None) -> Token:
        """The blocking twin of :meth:`acquire`.

        Raises:
            Busy: no slot within the timeout.
            RuntimeError: called on a thread running an event loop.
        """
        run = Run()
        run.attempt = 1
        attempt = make_attempt(self._loop, run, testing_state(), True, math.inf)
        token = attempt.acquire_sync(gate, timeout=timeout)
        hand_on_probe(run, self._adaptive)  # a slot outside the loop is never classified
        return token
