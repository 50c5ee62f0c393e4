"""The block form: ``async for attempt in policy.attempts(): async with attempt: ...``.

For code that must be retried as a whole and is not one function call (consuming a
streamed answer, a few calls that belong together). stamina's ``retry_context`` is the
model of the shape; the behaviour is :meth:`anygate.Policy.call`'s, from the same steps
of :class:`~anygate._policy.attempts.Attempts` (breaker permit, slot admission, classification
and budgets, events), spread over the iterator protocol:

* ``__anext__`` sleeps the backoff of the previous failure (holding no slot) and hands out
  the next :class:`AttemptBlock`; after a block that succeeded it stops;
* ``__aenter__`` takes the breaker permit and the slot, and enters the deadline's (or
  ``attempt_timeout_s``'s) cancel scope around the block;
* ``__aexit__`` leaves the scope, releases the slot, and reports: a success settles the
  call; a retriable failure is swallowed (the loop goes round); giving up raises.

Everything a block holds is taken in ``__aenter__`` and given back in ``__aexit__``, which
the ``async with`` statement pairs: a caller who ``break``\\ s out, returns, or abandons
the iterator between blocks strands nothing. No cancel scope spans two blocks (AnyIO's
scopes must be left in the task and order they were entered; a user's ``break`` would
leave one open), so the deadline is one absolute time applied to each phase.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Literal, final

import anyio

from .._gate import waiters as _waiters
from .admission import admit, admit_sync
from .retrying import SUCCESS, Run
from .run import accept
from .testing_switch import testing_state

if TYPE_CHECKING:
    from types import TracebackType

    from .._classify.classify import Verdict
    from .._gate.token import Token
    from .attempts import Attempts
    from .permit import Permit
    from .testing_switch import TestingState

__all__ = ["AsyncBlocks", "AttemptBlock", "SyncBlocks", "monotonic_deadline", "refuse_event_loop"]

_State = Literal["next", "open", "entered", "retry", "done"]


def monotonic_deadline(seconds: float | None) -> float:
    """``seconds`` from now on ``time.monotonic``; infinity for none."""
    return math.inf if seconds is None else time.monotonic() + seconds


def refuse_event_loop(name: str, instead: str) -> None:
    """Refuse a blocking entry point on a thread running an event loop (it would freeze it).

    Raises:
        RuntimeError: naming the loop and the async entry point to use instead.
    """
    running = _waiters.event_loop_running()
    if running is not None:
        msg = (
            f"Policy.{name}() called on a thread running a {running} event loop; it "
            f"would block the loop. Use `await policy.{instead}(...)` instead"
        )
        raise RuntimeError(msg)


@final
class AttemptBlock:
    """One attempt of the block form (:meth:`anygate.Policy.attempts`): use it as
    ``async with attempt:`` (or ``with attempt:`` from :meth:`~anygate.Policy.attempts_sync`).

    Entering takes the breaker permit and one slot of the policy's gate; leaving releases
    the slot and reports how the block ended. A retriable exception is swallowed there
    (the loop goes round again after the backoff); any other ends the loop, as
    :class:`anygate.CallFailed` (or the exception itself with ``reraise=True``). Each block
    is entered once; the iterator refuses to go on past a block that was not.

    Not constructed by users. Not the step's object of :meth:`anygate.Policy.run` (that
    is :class:`anygate.Attempt`).

    Attributes:
        number: 1 for the first attempt, 2 for the first retry, ...
        previous: the verdict on the previous attempt's failure; ``None`` on the first.
    """

    __slots__ = ("_blocks", "_cut", "_permit", "_scope", "_token", "number", "previous")

    number: int
    previous: Verdict | None

    _blocks: _Blocks
    _permit: Permit | None
    _token: Token | None
    _scope: anyio.CancelScope | None
    _cut: bool  # the scope's deadline is attempt_timeout_s's, not the call's

    # Annotated None, not NoReturn (see Token.__init__).
    def __init__(self, *args: object, **kwargs: object) -> None:
        msg = "AttemptBlock has no public constructor; iterate over policy.attempts()"
        raise TypeError(msg)

    def __repr__(self) -> str:
        previous = "" if self.previous is None else f", after {self.previous.reason.value}"
        return f"<anygate.AttemptBlock {self.number} of {self._blocks.loop.name!r}{previous}>"

    def accepted(self) -> None:
        """Say that the provider has accepted this attempt (a success status and headers
        arrived, or the first streamed bytes) while the block goes on reading: the
        breaker's probe and a burst pause's probe count as successes now, as for
        :meth:`anygate.Attempt.accepted`. How the block ends is still the outcome.

        Idempotent, a no-op before the block is entered or when nothing waits on it, and
        safe from any thread."""
        accept(self._blocks.run, self.number, self._permit, self._blocks.loop)

    async def __aenter__(self) -> AttemptBlock:
        blocks = self._blocks
        if not isinstance(blocks, AsyncBlocks):
            msg = "an attempt of policy.attempts_sync() is entered with `with attempt:`"
            raise TypeError(msg)
        await blocks.enter(self)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        blocks = self._blocks
        assert isinstance(blocks, AsyncBlocks)
        return blocks.leave(self, exc)

    def __enter__(self) -> AttemptBlock:
        blocks = self._blocks
        if not isinstance(blocks, SyncBlocks):
            msg = "an attempt of policy.attempts() is entered with `async with attempt:`"
            raise TypeError(msg)
        blocks.enter(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        blocks = self._blocks
        assert isinstance(blocks, SyncBlocks)
        return blocks.leave(self, exc)


_new_block = object.__new__


def _make_block(blocks: _Blocks, run: Run) -> AttemptBlock:
    block: AttemptBlock = _new_block(AttemptBlock)
    block._blocks = blocks
    block._token = None
    block._permit = None  # set on entry, once the breaker has admitted the attempt
    block._scope = None
    block._cut = False
    block.number = run.attempt
    block.previous = run.verdict
    return block


class _Blocks:
    """What both block iterators share: the call's state and the checks on its order."""

    __slots__ = ("current", "deadline", "loop", "run", "seconds", "state", "testing", "wait")

    def __init__(self, loop: Attempts, seconds: float | None, reraise: bool) -> None:
        self.loop = loop
        self.seconds = seconds
        self.deadline = math.inf  # absolute, on the form's clock, from the first attempt
        self.run = Run()
        self.run.reraise = reraise
        self.testing: TestingState | None = None
        self.state: _State = "next"
        self.wait = 0.0
        self.current: AttemptBlock | None = None

    def next_block(self) -> AttemptBlock | None:
        """The next attempt, or ``None`` when the loop is over."""
        state = self.state
        if state == "done":
            return None
        if state in ("open", "entered"):
            msg = (
                "each attempt of policy.attempts() must be used as `async with attempt:` "
                "(`with attempt:` for attempts_sync()) before the next one"
            )
            raise RuntimeError(msg)
        self.run.attempt += 1
        self.state = "open"
        block = self.current = _make_block(self, self.run)
        return block

    def check_enter(self, block: AttemptBlock) -> None:
        if block is not self.current or self.state != "open":
            msg = f"{block!r} was already entered, or is not the current attempt"
            raise RuntimeError(msg)
        self.state = "entered"

    def outcome(self, exc: BaseException | None, now: float) -> bool:
        """Report how the current block ended (its slot already released); whether to
        swallow ``exc`` and go round again. The call is settled when it does not.

        Raises:
            CallFailed: the policy gives up (with ``reraise``: ``exc`` itself).
        """
        loop, run = self.loop, self.run
        self.state = "done"
        if exc is None or loop.passes_through(run, exc):
            if exc is None:
                run.outcome = SUCCESS
            loop.retrier.settle(run)
            return False
        assert isinstance(exc, Exception)
        assert self.testing is not None
        try:
            self.wait = loop.failed(run, exc, now, self.plan_deadline(), self.testing, learn=True)
        except BaseException:
            loop.retrier.settle(run)
            raise
        self.state = "retry"
        return True

    def plan_deadline(self) -> float:
        """The deadline a retry's sleep must end before, on the form's clock."""
        return self.deadline


@final
class AsyncBlocks(_Blocks):
    """The async iterator behind :meth:`anygate.Policy.attempts`."""

    __slots__ = ()

    def __aiter__(self) -> AsyncBlocks:
        return self

    async def __anext__(self) -> AttemptBlock:
        if self.testing is None:
            self.testing = testing_state()
            if self.seconds is not None:
                self.deadline = anyio.current_time() + self.seconds
        elif self.state == "retry":
            self.run.phase = "sleep"
            await anyio.sleep(self.wait)  # no slot held; planned to end before the deadline
        block = self.next_block()
        if block is None:
            raise StopAsyncIteration
        return block

    async def enter(self, block: AttemptBlock) -> None:
        self.check_enter(block)
        loop, run = self.loop, self.run
        assert self.testing is not None
        scope = None
        if self.deadline != math.inf or loop.attempt_timeout is not None:
            scope = anyio.CancelScope(deadline=self.deadline)
            scope.__enter__()
        try:
            if loop.breaker is not None:
                await loop.pass_breaker(run)
                block._permit = run.permit
            timed = self.deadline != math.inf or bool(loop.hooks)
            block._token = await admit(loop, run, self.testing, timed, loop.gate, loop.busy_wait)
        except BaseException as exc:
            self.state = "done"
            try:
                if scope is not None:
                    scope.__exit__(type(exc), exc, exc.__traceback__)
                if scope is not None and scope.cancelled_caught:
                    # Only our deadline lands here: the scope swallowed its cancellation.
                    assert self.seconds is not None
                    waited = anyio.current_time() - run.slot_started
                    loop.retrier.deadline_failure(run, self.seconds, waited, loop.breaker)
                raise
            finally:
                loop.retrier.settle(run)
        if scope is not None:
            timeout = loop.attempt_timeout
            if timeout is not None:
                cut = anyio.current_time() + timeout
                if cut < self.deadline:
                    scope.deadline = cut
                    block._cut = True
            block._scope = scope

    def leave(self, block: AttemptBlock, exc: BaseException | None) -> bool:
        token, block._token = block._token, None
        assert token is not None
        token.release()  # before classifying or sleeping: the slot is not ours
        scope, block._scope = block._scope, None
        run = self.run
        if scope is not None:
            # Not its return value: trio's __exit__ returns True when there was nothing to
            # swallow at all.
            scope.__exit__(
                None if exc is None else type(exc), exc, None if exc is None else exc.__traceback__
            )
        if scope is not None and scope.cancelled_caught:
            # Our scope cut the block off: attempt_timeout_s (a transient failure, as in
            # Policy.call) or the call's deadline (what deadline_failure says it cut).
            if not block._cut:
                self.state = "done"
                try:
                    assert self.seconds is not None
                    waited = anyio.current_time() - run.slot_started
                    self.loop.retrier.deadline_failure(run, self.seconds, waited, self.loop.breaker)
                finally:
                    self.loop.retrier.settle(run)
            timeout = self.loop.attempt_timeout
            assert timeout is not None
            exc = TimeoutError(f"attempt {run.attempt} timed out after {timeout:g}s")
        return self.outcome(exc, anyio.current_time())

    def plan_deadline(self) -> float:
        return min(self.deadline, anyio.current_effective_deadline())


@final
class SyncBlocks(_Blocks):
    """The iterator behind :meth:`anygate.Policy.attempts_sync`."""

    __slots__ = ()

    def __iter__(self) -> SyncBlocks:
        return self

    def __next__(self) -> AttemptBlock:
        if self.testing is None:
            refuse_event_loop("attempts_sync", "attempts")
            self.testing = testing_state()
            self.deadline = monotonic_deadline(self.seconds)
        elif self.state == "retry" and self.wait > 0:
            self.run.phase = "sleep"
            time.sleep(self.wait)
        block = self.next_block()
        if block is None:
            raise StopIteration
        return block

    def enter(self, block: AttemptBlock) -> None:
        self.check_enter(block)
        loop, run = self.loop, self.run
        assert self.testing is not None
        try:
            if loop.breaker is not None:
                loop.pass_breaker_sync(run, self.deadline)
                block._permit = run.permit
            block._token = admit_sync(
                loop, run, self.testing, self.deadline, loop.gate, loop.busy_wait
            )
        except BaseException:
            self.state = "done"
            loop.retrier.settle(run)
            raise

    def leave(self, block: AttemptBlock, exc: BaseException | None) -> bool:
        token, block._token = block._token, None
        assert token is not None
        token.release()
        return self.outcome(exc, time.monotonic())
