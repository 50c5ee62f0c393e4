"""The attempt loop: breaker -> slot -> (adaptive pause) -> attempt -> release -> classify -> sleep.

:class:`anygate.Policy` decides what surrounds a call (the deadline scope, the final
report); this module runs its attempts on an event loop or a plain thread, in two shapes
over the same steps:

* :meth:`Attempts.run` / :meth:`Attempts.run_sync` call a *step* with an :class:`Attempt`;
  the step takes its slot itself (``Policy.run``, the transports, which keep the slot until
  the response body is closed);
* :meth:`Attempts.call` / :meth:`Attempts.call_sync` are the same loop with the attempt
  written out (take the slot, call ``fn``, release), so ``Policy.call`` allocates no step
  per attempt.

The block form (:mod:`anygate._policy.blocks`) drives the same steps from an iterator. Each
attempt's slot is released before its failure is classified or the backoff sleep starts,
so other callers use the slot meanwhile. What is shared by all of them is written once
here (:meth:`Attempts.failed`, :meth:`~Attempts.pass_breaker`); taking the slot is
:mod:`~anygate._policy.admission`'s (:func:`~anygate._policy.admission.admit`), and the
decisions (classification, budgets, delays) are :mod:`~anygate._policy.decide`'s, acted on
by the :class:`Retrier`.

One concern: the loop, in its async and its blocking form. The two differ in how they wait
at every step (AnyIO's clock and scopes, or ``time.monotonic`` and a deadline), so each
step is written twice, side by side; the shared decisions and the slot's admission are not
here.
"""

from __future__ import annotations

import inspect
import math
import time
from typing import TYPE_CHECKING, Any, TypeVar, final

import anyio

from .._classify.facts import headers_of
from .._config.config import DEFAULT_BREAKER_MAX_WAIT_S
from .._errors import Busy, CircuitOpen
from .._events.events import emit
from .._limits.learn_from import learn_from_error, learn_from_headers
from .admission import admit, admit_sync
from .attempt import make_attempt
from .retrying import FAILURE, NEUTRAL, SUCCESS, Stop

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from .._events.events import Hook
    from .._gate.gate import Gate
    from .._limits.adaptive import AdaptiveLimit
    from .attempt import Attempt
    from .breaker import CircuitBreaker
    from .retrying import Retrier, Run
    from .testing_switch import TestingState

__all__ = ["Attempts", "NotAwaitable"]

#: A breaker wait left shorter than this counts as spent (a clock's resolution, with room).
_SPENT_S = 1e-6

T = TypeVar("T")


class NotAwaitable(TypeError):
    """``call()`` got a function that returns no awaitable (or ``call_sync()`` one that does)."""


@final
class Attempts:
    """One policy's attempt loop and the parts it needs (no state of its own per call)."""

    __slots__ = (
        "adaptive",
        "attempt_timeout",
        "breaker",
        "breaker_max_wait",
        "busy_wait",
        "gate",
        "hooks",
        "max_attempts",
        "name",
        "retrier",
        "wait_when_open",
    )

    def __init__(
        self,
        *,
        name: str,
        gate: Gate,
        adaptive: AdaptiveLimit,
        hooks: tuple[Hook, ...],
        busy_wait: float | None,
        attempt_timeout: float | None,
        max_attempts: int,
        retrier: Retrier,
        breaker: CircuitBreaker | None = None,
        wait_when_open: bool = True,
        breaker_max_wait: float = DEFAULT_BREAKER_MAX_WAIT_S,
    ) -> None:
        self.name = name
        self.breaker = breaker
        self.wait_when_open = wait_when_open
        # No default hangs (issue 26): without it a call with no deadline waited for ever
        # on a provider that stayed down (the probe failed, the breaker reopened, ...).
        self.breaker_max_wait = breaker_max_wait
        self.gate = gate
        self.adaptive = adaptive
        self.hooks = hooks
        self.busy_wait = busy_wait
        self.attempt_timeout = attempt_timeout
        self.max_attempts = max_attempts
        self.retrier = retrier

    # ------------------------------------------------------------------ decisions

    def failed(
        self,
        run: Run,
        exc: Exception,
        now: float,
        deadline: float,
        testing: TestingState,
        *,
        learn: bool,
    ) -> float:
        """A failed attempt, in every form: seconds to wait (without a slot) before the next.

        ``learn``: the provider's limits in ``exc`` (its headers, and those its words
        state) pace the gate; ``False`` where a transport or the step learns them itself.

        Raises:
            CallFailed: the policy gives up (``run.reraise``: ``exc`` itself, reported alike).
        """
        retrier = self.retrier
        if learn:
            learn_from_error(self.gate, exc)
        wait = retrier.failed(run, exc, now, deadline, testing)
        failure = run.outcome == FAILURE  # what the breaker hears next (then neutral)
        retrier.attempt_ended(run)
        if isinstance(wait, Stop):
            if not (failure and self._defer_to_breaker(run, wait, testing)):
                retrier.fail(run, wait.why, wait.max_attempts, exc)
            wait = 0.0
        run.phase = "sleep"
        return wait

    def _defer_to_breaker(self, run: Run, stop: Stop, testing: TestingState) -> bool:
        """Whether a call out of attempts on provider failures waits for the breaker, and
        then gets one more attempt, instead of giving up now.

        In wait mode a call that finds the breaker open waits for the provider's recovery
        (bounded by ``max_wait_sec``); one whose own failures led up to the opening was
        the only call that gave up. So a call whose whole budget (two attempts or more)
        failed in a row asks the breaker first (:meth:`CircuitBreaker._judge_give_up`):
        open, or opened now by those failures, it waits like the calls behind it. Not in
        fail mode (the breaker fails calls fast there), nor under the testing switch
        (tests fail fast), nor once the breaker waits are spent."""
        breaker = self.breaker
        if (
            breaker is None
            or not self.wait_when_open
            or testing.enabled
            or stop.why != "budget"
            or stop.max_attempts < 2
            or self.breaker_max_wait - run.breaker_waited <= _SPENT_S
        ):
            return False
        waits, change = breaker._judge_give_up(stop.max_attempts)
        if change is not None and self.hooks:
            emit(self.hooks, change)
        if waits:
            run.failures = stop.max_attempts - 1  # one attempt once the breaker lets it go
        return waits

    def failed_on_loop(
        self, run: Run, exc: Exception, testing: TestingState, *, learn: bool
    ) -> float:
        """:meth:`failed` on the event loop: AnyIO's clock, the enclosing scopes' deadline."""
        now, deadline = anyio.current_time(), anyio.current_effective_deadline()
        return self.failed(run, exc, now, deadline, testing, learn=learn)

    def passes_through(self, run: Run, exc: BaseException) -> bool:
        """Whether ``exc`` ends the call unchanged (not an Exception, or control flow);
        the breaker then hears nothing of the attempt."""
        if isinstance(exc, Exception) and not self.retrier.is_control_flow(exc):
            return False
        run.outcome = NEUTRAL
        return True

    # ------------------------------------------------------------------ async drivers

    async def call(
        self,
        run: Run,
        testing: TestingState,
        fn: Callable[..., Awaitable[T]],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        timed: bool,
    ) -> T:
        """Attempt ``await fn(*args, **kwargs)`` until it succeeds or the retrier gives up.

        :meth:`run` with the attempt written out (take the slot, call, release), so that
        :meth:`Policy.call` pays for no step object per attempt. ``timed``: measure slot
        waits (the caller has a deadline to report against).
        """
        attempt_timeout = self.attempt_timeout
        timed = timed or bool(self.hooks)  # the slot wait is measured only when someone reads it
        while True:
            run.attempt += 1
            if self.breaker is not None:
                await self.pass_breaker(run)
            # admit() hands the token over only once it is safe to (it releases it itself
            # on any BaseException until then), and the try that releases it starts at once:
            # nothing runs between the two that could raise.
            token = await admit(self, run, testing, timed, self.gate, self.busy_wait)
            try:
                try:
                    if attempt_timeout is None:
                        result = await _invoke(fn, args, kwargs)
                    else:
                        result = await _invoke_within(
                            attempt_timeout, run.attempt, fn, args, kwargs
                        )
                finally:
                    token.release()  # before classifying or sleeping: the slot is not ours
            except NotAwaitable:
                raise
            except Exception as exc:
                if self.passes_through(run, exc):
                    raise
                wait = self.failed_on_loop(run, exc, testing, learn=True)
                await anyio.sleep(wait)
            else:
                run.outcome = SUCCESS
                headers = headers_of(result)  # raw responses carry the provider's limits
                if headers is not None:
                    learn_from_headers(self.gate, headers)
                return result

    async def run(
        self,
        run: Run,
        testing: TestingState,
        step: Callable[[Attempt], Awaitable[T]],
        *,
        timed: bool,
    ) -> T:
        """Attempt ``await step(attempt)`` until it returns or the retrier gives up.

        The step takes its slot itself (:meth:`Attempt.acquire`); whatever it took is
        released when it raises, and stays the step's when it returns (a transport's
        response body holds it). A refusal of its acquire (``Busy``) ends the call.
        """
        timed = timed or bool(self.hooks)
        while True:
            run.attempt += 1
            if self.breaker is not None:
                await self.pass_breaker(run)
            attempt = make_attempt(self, run, testing, timed, math.inf)
            run.phase = "attempt"
            try:
                awaitable: object = step(attempt)
                if not inspect.isawaitable(awaitable):
                    msg = (
                        f"Policy.run() needs the step to return an awaitable ({step!r} "
                        f"returned {type(awaitable).__name__}); use Policy.run_sync() for "
                        "blocking steps"
                    )
                    raise NotAwaitable(msg)
                result: T = await awaitable
            except BaseException as exc:
                attempt.release_all()
                if isinstance(exc, (NotAwaitable, Busy)) or run.phase == "slot":
                    raise  # a refused slot (or a wrong step) is no provider's answer
                if self.passes_through(run, exc):
                    raise
                assert isinstance(exc, Exception)  # noqa: PT017 - for the type checker
                wait = self.failed_on_loop(run, exc, testing, learn=False)
            else:
                run.outcome = SUCCESS
                return result
            await anyio.sleep(wait)

    async def pass_breaker(self, run: Run) -> None:
        """Take the breaker's permit for the next attempt, waiting while it is open.

        In wait mode (the default) the call waits for the probe's outcome or its own turn
        to probe, bounded by its deadline, enclosing cancel scopes and ``max_wait_sec`` in
        all; in fail mode (or once ``max_wait_sec`` is spent) the first attempt raises
        :class:`anygate.CircuitOpen` and a retry gives up.
        """
        breaker = self.breaker
        assert breaker is not None
        while True:
            try:
                self.retrier.admit(breaker, run)
            except CircuitOpen as exc:  # noqa: PERF203 - the loop is the wait for the breaker
                left = self.breaker_max_wait - run.breaker_waited
                # A remainder below the clock's resolution is spent: waiting it would not
                # move a virtual clock, and the loop would spin at one instant.
                if not self.wait_when_open or left <= _SPENT_S:
                    if run.verdict is None:
                        raise
                    self.retrier.fail(run, "circuit_open", self.max_attempts, run.exc or exc)
                run.phase = "breaker"
                started = anyio.current_time()
                try:
                    await breaker.wait(left)
                finally:
                    run.breaker_waited += anyio.current_time() - started
            else:
                return

    # ------------------------------------------------------------------ sync drivers

    def call_sync(
        self,
        run: Run,
        testing: TestingState,
        deadline: float,
        fn: Callable[..., T],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> T:
        """The blocking twin of :meth:`call`; ``deadline`` is on ``time.monotonic``."""
        while True:
            run.attempt += 1
            if self.breaker is not None:
                self.pass_breaker_sync(run, deadline)
            # See call(): no gap before the try.
            token = admit_sync(self, run, testing, deadline, self.gate, self.busy_wait)
            try:
                try:
                    result = fn(*args, **kwargs)
                finally:
                    token.release()
                if inspect.isawaitable(result):
                    _close(result)
                    msg = f"Policy.call_sync() got an awaitable from {fn!r}; use `await policy.call(...)`"
                    raise NotAwaitable(msg)
            except NotAwaitable:
                raise
            except Exception as exc:
                if self.passes_through(run, exc):
                    raise
                wait = self.failed(run, exc, time.monotonic(), deadline, testing, learn=True)
                if wait > 0:
                    time.sleep(wait)
            else:
                run.outcome = SUCCESS
                headers = headers_of(result)  # raw responses carry the provider's limits
                if headers is not None:
                    learn_from_headers(self.gate, headers)
                return result

    def run_sync(
        self,
        run: Run,
        testing: TestingState,
        deadline: float,
        step: Callable[[Attempt], T],
    ) -> T:
        """The blocking twin of :meth:`run`; ``deadline`` is on ``time.monotonic``."""
        while True:
            run.attempt += 1
            if self.breaker is not None:
                self.pass_breaker_sync(run, deadline)
            attempt = make_attempt(self, run, testing, True, deadline)
            run.phase = "attempt"
            try:
                result = step(attempt)
                if inspect.isawaitable(result):
                    _close(result)
                    msg = f"Policy.run_sync() got an awaitable from {step!r}; use `await policy.run(...)`"
                    raise NotAwaitable(msg)
            except BaseException as exc:
                attempt.release_all()
                if isinstance(exc, (NotAwaitable, Busy)) or run.phase == "slot":
                    raise
                if self.passes_through(run, exc):
                    raise
                assert isinstance(exc, Exception)  # noqa: PT017 - for the type checker
                wait = self.failed(run, exc, time.monotonic(), deadline, testing, learn=False)
            else:
                run.outcome = SUCCESS
                return result
            if wait > 0:
                time.sleep(wait)

    def pass_breaker_sync(self, run: Run, deadline: float) -> None:
        """The blocking twin of :meth:`pass_breaker`; ``deadline`` is on ``time.monotonic``."""
        breaker = self.breaker
        assert breaker is not None
        while True:
            try:
                self.retrier.admit(breaker, run)
            except CircuitOpen as exc:  # noqa: PERF203 - the loop is the wait for the breaker
                now = time.monotonic()
                left = min(deadline - now, self.breaker_max_wait - run.breaker_waited)
                if not self.wait_when_open or left <= _SPENT_S:
                    if run.verdict is None:
                        raise
                    self.retrier.fail(run, "circuit_open", self.max_attempts, run.exc or exc)
                run.phase = "breaker"
                try:
                    breaker.wait_sync(left)
                finally:
                    run.breaker_waited += time.monotonic() - now
            else:
                return


async def _invoke(
    fn: Callable[..., Awaitable[T]], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> T:
    awaitable: object = fn(*args, **kwargs)
    if not inspect.isawaitable(awaitable):
        msg = (
            f"Policy.call() needs fn to return an awaitable ({fn!r} returned "
            f"{type(awaitable).__name__}); use Policy.call_sync() for blocking functions"
        )
        raise NotAwaitable(msg)
    result: T = await awaitable
    return result


async def _invoke_within(
    seconds: float,
    attempt: int,
    fn: Callable[..., Awaitable[T]],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> T:
    """:func:`_invoke` cut off after ``seconds``; a hung attempt becomes a TimeoutError."""
    with anyio.move_on_after(seconds):
        return await _invoke(fn, args, kwargs)
    # Only our own timeout lands here: the scope swallowed its cancellation.
    msg = f"attempt {attempt} timed out after {seconds:g}s"
    raise TimeoutError(msg)


def _close(awaitable: object) -> None:
    close = getattr(awaitable, "close", None)
    if close is not None:
        close()  # avoid "coroutine was never awaited" noise
