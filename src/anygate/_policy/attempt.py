"""The step's handle on its attempt (:meth:`anygate.Policy.run`): take the slot, read the
number and the previous verdict. The loop it belongs to is :mod:`anygate._policy.attempts`;
its slot is taken as the loop's is (:mod:`anygate._policy.admission`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, final

from .._gate.gate import Gate
from .._validation import check_wait
from .admission import admit, admit_sync
from .run import accept

if TYPE_CHECKING:
    from .._classify.classify import Verdict
    from .._gate.token import Token
    from .attempts import Attempts
    from .permit import Permit
    from .run import Run
    from .testing_switch import TestingState

__all__ = ["Attempt", "make_attempt"]


@final
class Attempt:
    """One attempt of :meth:`anygate.Policy.run` / :meth:`~anygate.Policy.run_sync`.

    The policy hands one to the step for each attempt. The step takes its slot with
    :meth:`acquire` (or :meth:`acquire_sync`), exactly as :meth:`anygate.Policy.call`
    takes one: the policy's slot-wait budget, the adaptive limit's pause sat out holding
    the slot, the slot events. The token is the step's: release it (``async with`` it)
    when the provider call is done, or hand it on (a transport ties it to the response
    body). Tokens it took are released for it when the step raises, so the backoff sleep
    never holds one.

    Not constructed by users; not the block form's object (that is
    :class:`anygate.AttemptBlock`).

    Attributes:
        number: 1 for the first attempt, 2 for the first retry, ...
        previous: the verdict on the previous attempt's failure; ``None`` on the first.
    """

    __slots__ = (
        "_deadline",
        "_loop",
        "_permit",
        "_run",
        "_testing",
        "_timed",
        "_tokens",
        "number",
        "previous",
    )

    number: int
    previous: Verdict | None

    _loop: Attempts
    _permit: Permit | None
    _run: Run
    _testing: TestingState
    _timed: bool
    _deadline: float
    _tokens: list[Token] | None

    # Annotated None, not NoReturn (see Token.__init__).
    def __init__(self, *args: object, **kwargs: object) -> None:
        msg = "Attempt has no public constructor; the policy hands one to each step"
        raise TypeError(msg)

    def __repr__(self) -> str:
        previous = "" if self.previous is None else f", after {self.previous.reason.value}"
        return f"<anygate.Attempt {self.number} of {self._loop.name!r}{previous}>"

    async def acquire(
        self,
        gate: Gate | None = None,
        *,
        timeout: float | None = None,
        tokens: int | None = None,
        output_tokens: int | None = None,
    ) -> Token:
        """Take the slot for this attempt, as :meth:`anygate.Policy.call` would.

        Args:
            gate: the gate to take it from; default the policy's. The adaptive pause
                honoured is the policy's (its throttles are reported there).
            timeout: the longest wait for the slot, in seconds; ``None``: the policy's
                ``busy_wait_s``.
            tokens: the attempt's token estimate, as for :meth:`anygate.Gate.acquire`:
                admitted only when the gate's token budget has room for it (settle the
                real cost with :meth:`anygate.Token.settle`). ``None`` charges nothing
                now, so that attempts admitted together can overdraw the budget and later
                callers wait out the debt.
            output_tokens: the output part of ``tokens`` (the request's ``max_tokens``),
                for a gate with split input/output budgets, as for
                :meth:`anygate.Gate.acquire`.

        Raises:
            Busy: no slot within the timeout. It ends the call (it is not retried).
            TypeError, ValueError: a bad ``tokens`` or ``output_tokens`` (as for
                :meth:`anygate.Gate.acquire`); the call ends, nothing is taken.
        """
        loop = self._loop
        gate, busy_wait = self._where(gate, timeout)
        token = await admit(
            loop, self._run, self._testing, self._timed, gate, busy_wait, tokens, output_tokens
        )
        self._keep(token)
        return token

    def acquire_sync(
        self,
        gate: Gate | None = None,
        *,
        timeout: float | None = None,
        tokens: int | None = None,
        output_tokens: int | None = None,
    ) -> Token:
        """The blocking twin of :meth:`acquire`, for :meth:`anygate.Policy.run_sync`.

        Also bounded by the call's ``deadline``.

        Raises:
            Busy: as for :meth:`acquire`.
            TypeError, ValueError: a bad ``tokens`` or ``output_tokens``, as for
                :meth:`acquire`.
            RuntimeError: called on a thread running an event loop.
        """
        gate, busy_wait = self._where(gate, timeout)
        token = admit_sync(
            self._loop,
            self._run,
            self._testing,
            self._deadline,
            gate,
            busy_wait,
            tokens,
            output_tokens,
        )
        self._keep(token)
        return token

    def accepted(self) -> None:
        """Say that the provider has accepted this attempt, before it ends.

        Call it when the answer's status and headers have arrived with a success status
        (2xx), or the first streamed bytes, while the body or the generation is still to
        come. It is the answer a recovering provider is waited for with, so it counts as a
        success at this moment: the circuit breaker's half-open probe closes the breaker
        and every caller waiting for it goes; a burst-rate pause's probe ends the pause.
        Without it, they wait for the whole call (an LLM generation, seconds).

        It is not the attempt's outcome: the step's return or exception still decides
        that, and a failure after acceptance (a stream that breaks) is a failed attempt
        as before, retried under the policy's budgets and counted once towards the
        breaker's ``failure_threshold``; it never reopens the breaker on its own (see
        :class:`anygate.CircuitBreaker`), so the callers already released go on.

        Idempotent, a no-op when nothing waits on this attempt (it was no probe, the
        breaker is closed) or once the attempt has ended, and safe from any thread (a
        streamed body may be read by another task or thread). The gated transports call
        it for their responses; call it in a step that reads answers itself.
        """
        accept(self._run, self.number, self._permit, self._loop)

    def _where(self, gate: object, timeout: object) -> tuple[Gate, float | None]:
        """The gate and slot-wait budget an acquire asked for (``None``: the policy's)."""
        loop = self._loop
        if gate is None:
            gate = loop.gate
        elif not isinstance(gate, Gate):
            msg = f"gate must be an anygate.Gate (got {gate!r} of type {type(gate).__name__})"
            raise TypeError(msg)
        busy_wait = loop.busy_wait if timeout is None else check_wait("timeout", timeout)
        return gate, busy_wait

    def _keep(self, token: Token) -> None:
        if self._tokens is None:
            self._tokens = [token]
        else:
            self._tokens.append(token)

    def release_all(self) -> None:
        """Give back every slot this attempt took (idempotent; the step has failed)."""
        tokens, self._tokens = self._tokens, None
        if tokens is not None:
            for token in tokens:
                token.release()


_new_attempt = object.__new__


def make_attempt(
    loop: Attempts, run: Run, testing: TestingState, timed: bool, deadline: float
) -> Attempt:
    """The :class:`Attempt` for ``run``'s current attempt; only the loop (and
    :meth:`anygate.Policy.acquire`) call this."""
    attempt: Attempt = _new_attempt(Attempt)
    attempt._loop = loop
    attempt._run = run
    attempt._testing = testing
    attempt._timed = timed
    attempt._deadline = deadline
    attempt._tokens = None
    # The permit this attempt was admitted with (taken before the attempt is made): kept
    # here, not read from ``run`` later, which the loop clears and refills per attempt.
    attempt._permit = run.permit
    attempt.number = run.attempt
    attempt.previous = run.verdict
    return attempt
