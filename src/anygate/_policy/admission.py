"""Taking an attempt's slot: the gate's token, the probe's priority, the adaptive pause.

Every form of the attempt loop (:class:`~anygate._policy.attempts.Attempts`' drivers, the
block form, :meth:`anygate.Attempt.acquire` in a step) takes its slot here, on an event
loop (:func:`admit`) or in a blocking thread (:func:`admit_sync`): the slot events, the
breaker's half-open probe ahead of the gate's queue, the in-flight count as admitted, the
adaptive limit's pause and the per-minute estimate's window sat out *holding* the slot,
and the send time recorded for the estimate. What happens around the slot (the breaker
permit before it, the attempt, classifying a failure, the backoff sleep after it) is the
loop's, in :mod:`anygate._policy.attempts`.

Split out of ``attempts`` as its own concern: admission is the one step the loop shares
with a step's own :class:`anygate.Attempt`, and its pauses are the loop's only waits while
holding a slot. Its invariant, kept in both functions: from the moment the gate hands a
token over until the caller has it, the slot (and a probe role this attempt claimed) is
ours to give back, so any ``BaseException`` in between releases it before propagating;
after the return, nothing may run before the caller's ``try`` that releases it.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

import anyio

from .._errors import Busy
from .._events.events import SlotAdmitted, SlotWaiting, emit
from .._limits.pause import YIELD
from .run import hand_on_probe

if TYPE_CHECKING:
    from .._gate.gate import Gate
    from .._gate.token import Token
    from .._limits.adaptive import AdaptiveLimit
    from .attempts import Attempts
    from .retrying import Run
    from .testing_switch import TestingState

__all__ = ["admit", "admit_sync", "check_pause"]

#: The gate priority ahead of fresh calls (0): the breaker's half-open probe, the retry a
#: burst pause's probe is kept for, and a caller that yielded its slot to that retry.
_AHEAD = 1


async def admit(
    loop: Attempts,
    run: Run,
    testing: TestingState,
    timed: bool,
    gate: Gate,
    busy_wait: float | None,
    tokens: int | None = None,
    output_tokens: int | None = None,
) -> Token:
    """Take a slot of ``gate`` (the policy's, or a step's choice) within ``busy_wait``
    for the next attempt, with ``tokens`` of its token budget; sit out an adaptive
    pause holding it.

    The pause is always that of the policy's adaptive limit (the one its throttles are
    reported to). Both passed explicitly, not defaulted: this is the per-call path.
    """
    hooks, adaptive = loop.hooks, loop.adaptive
    run.phase = "slot"
    if timed:
        run.slot_started = anyio.current_time()
    if hooks and (gate.waiting or gate.in_flight >= gate.capacity):
        emit(
            hooks,
            SlotWaiting(
                loop.name, gate.name, run.attempt, gate.in_flight, gate.waiting, gate.capacity
            ),
        )
    permit = run.permit
    own_gate = gate is loop.gate  # the adaptive limit's: its held slots may be handed over
    if own_gate and adaptive.owns_probe(run):
        # A burst pause's probe is kept for this call: a caller the pause holds back
        # hands it a slot (anygate._limits.handoff).
        token = await _probe_slot(gate, run, adaptive, busy_wait, tokens, output_tokens)
    elif (
        (permit is not None and permit._probe)
        or adaptive.owns_probe(run)
        or adaptive.goes_ahead(run)
    ):
        # The breaker's half-open probe decides for every caller waiting on the
        # breaker: it goes ahead of the gate's queue (issue 30: queued behind a
        # token-paced backlog of ~2 minutes, it held the breaker half-open so long
        # that callers gave up as circuit_open). So does the retry of a call turned away
        # by a burst 429: the next probe is kept for it (anygate._limits.pause), or the
        # 429 was a shared pool's noise (goes_ahead).
        token = await gate.acquire(
            timeout=busy_wait, tokens=tokens, output_tokens=output_tokens, priority=_AHEAD
        )
    elif output_tokens is None:
        token = await gate.acquire(timeout=busy_wait, tokens=tokens)
    else:
        token = await gate.acquire(timeout=busy_wait, tokens=tokens, output_tokens=output_tokens)
    held: Token | None = token  # ours to give back (not once handed to the probe's owner)
    try:
        # As admitted, not as now: the acquire's schedule point comes after admission
        # (issue 26), and peers admitted during it are no part of this attempt's count.
        run.in_flight = in_flight = token.in_flight_at_admission
        run.saturated = in_flight >= gate.capacity or gate.waiting > 0
        at = adaptive.clock()
        while not testing.enabled:
            # Holding the slot while paused is the point: when the pause ends, one probe
            # goes, and after its success at most the capacity's worth at once.
            while True:
                pause, run.burst_probe = adaptive.pass_pause(run, can_yield=own_gate)
                if pause == YIELD:
                    if adaptive.hand_slot(token):  # the probe's owner's now
                        held = None
                        token = held = await gate.acquire(
                            timeout=busy_wait,
                            tokens=tokens,
                            output_tokens=output_tokens,
                            priority=_AHEAD,
                        )
                    continue
                if pause <= 0:
                    break
                check_pause(gate, pause, busy_wait)
                await adaptive.wait_pause(pause)
            if (change := adaptive.take_change()) is not None:
                loop.retrier.report_change(change)
            # The send time the per-minute estimate counted is the attempt's.
            run.tokens = tokens
            while (wait := adaptive.reserve_send(at := adaptive.clock(), run, tokens)) > 0:
                # The estimate's window is full (issue 30): wait for its first slot
                # to free, holding ours as in a pause.
                check_pause(gate, wait, busy_wait)
                await anyio.sleep(wait)
                if adaptive.paused_for(run):
                    break  # a burst pause (or check) began meanwhile: pass it first
            else:
                break  # counted as sent at ``at``
        run.generation = adaptive.generation
        run.admitted_at = at
        run.sending = adaptive.sending(gate.in_flight)
        if hooks:
            waited = anyio.current_time() - run.slot_started
            emit(hooks, SlotAdmitted(loop.name, gate.name, run.attempt, waited))
        run.phase = "attempt"
    except BaseException:
        # Cancellation in the pause, Busy, or a hook raising KeyboardInterrupt: the
        # slot is ours until the caller has it, so it is ours to give back (and the
        # probe role, if this attempt had claimed it).
        if held is not None:
            held.release()
        hand_on_probe(run, adaptive)
        raise
    return token


async def _probe_slot(
    gate: Gate,
    run: Run,
    adaptive: AdaptiveLimit,
    busy_wait: float | None,
    tokens: int | None,
    output_tokens: int | None,
) -> Token:
    """The slot of the attempt a burst pause's probe is kept for: a free one, else one
    a caller the pause holds back hands over once the probe is due, else one taken ahead
    of the gate's queue."""
    try:
        token = _free(gate, tokens, output_tokens)
        if token is not None:
            return token
        seconds = adaptive.ask_for_slot(run)
        if seconds is not None:
            check_pause(gate, seconds, busy_wait)
            token = await adaptive.slot_handed(run, seconds)
        if token is None:
            return await gate.acquire(
                timeout=busy_wait, tokens=tokens, output_tokens=output_tokens, priority=_AHEAD
            )
        _charge(token, tokens, output_tokens)
    except BaseException:
        adaptive.disown(run)  # the probe goes to the first to ask, and a handed slot back
        raise
    return token


def _free(gate: Gate, tokens: int | None, output_tokens: int | None) -> Token | None:
    """A slot free now, ahead of the gate's queue (``None``: none)."""
    try:
        return gate.acquire_nowait(tokens=tokens, output_tokens=output_tokens, priority=_AHEAD)
    except Busy:
        return None


def _charge(token: Token, tokens: int | None, output_tokens: int | None) -> None:
    """A handed slot was charged for the caller that yielded it: charge it for this
    attempt's tokens instead (that caller's new slot is charged for its own). Settled, not
    waited for: at most one call's estimate a pause may run over the token budget."""
    if tokens is None:
        return
    try:
        token.settle(tokens=tokens, output_tokens=output_tokens)
    except BaseException:
        token.release()
        raise


def admit_sync(
    loop: Attempts,
    run: Run,
    testing: TestingState,
    deadline: float,
    gate: Gate,
    busy_wait: float | None,
    tokens: int | None = None,
    output_tokens: int | None = None,
) -> Token:
    """The blocking twin of :func:`admit`; ``deadline`` is on ``time.monotonic``."""
    hooks, adaptive = loop.hooks, loop.adaptive
    run.phase = "slot"
    now = run.slot_started = time.monotonic()
    if now >= deadline and run.verdict is not None:
        loop.retrier.fail(run, "deadline", loop.max_attempts, run.exc)
    timeout = _left(deadline, busy_wait)
    if hooks and (gate.waiting or gate.in_flight >= gate.capacity):
        emit(
            hooks,
            SlotWaiting(
                loop.name, gate.name, run.attempt, gate.in_flight, gate.waiting, gate.capacity
            ),
        )
    permit = run.permit
    own_gate = gate is loop.gate
    try:
        if own_gate and adaptive.owns_probe(run):  # a held caller hands it a slot (see admit)
            token = _probe_slot_sync(gate, run, adaptive, timeout, tokens, output_tokens)
        else:
            # The breaker's half-open probe, and a burst pause's kept for this call, go
            # ahead of the gate's queue (see admit).
            ahead = (
                (permit is not None and permit._probe)
                or adaptive.owns_probe(run)
                or adaptive.goes_ahead(run)
            )
            token = gate.acquire_sync(
                timeout=timeout,
                tokens=tokens,
                output_tokens=output_tokens,
                priority=_AHEAD if ahead else 0,
            )
    except Busy:
        # A retry the gate cannot admit before the deadline (its rate budget admits it
        # later): the call fails as "deadline" with its last error, as its async twin
        # does when the deadline's scope ends the wait.
        deadline_bound = busy_wait is None or deadline - now <= busy_wait
        if run.verdict is not None and deadline != math.inf and deadline_bound:
            loop.retrier.fail(run, "deadline", loop.max_attempts, run.exc)
        raise
    held: Token | None = token
    try:
        run.in_flight = in_flight = gate.in_flight
        run.saturated = in_flight >= gate.capacity or gate.waiting > 0
        at = adaptive.clock()
        while not testing.enabled:
            while True:
                pause, run.burst_probe = adaptive.pass_pause(run, can_yield=own_gate)
                if pause == YIELD:
                    if adaptive.hand_slot(token):  # the probe's owner's now (see admit)
                        held = None
                        token = held = gate.acquire_sync(
                            timeout=_left(deadline, busy_wait),
                            tokens=tokens,
                            output_tokens=output_tokens,
                            priority=_AHEAD,
                        )
                    continue
                if pause <= 0:
                    break
                check_pause(gate, pause, busy_wait)
                if time.monotonic() + pause >= deadline:
                    raise _past_deadline(loop, run, gate, now)
                # A thread sleeps (and asks again): the pause is measured on the policy's
                # clock, and a probe's success is noticed within one pause_s.
                time.sleep(pause)
            if (change := adaptive.take_change()) is not None:
                loop.retrier.report_change(change)
            at = adaptive.clock()
            # The send time the per-minute estimate counted is the attempt's (see admit).
            run.tokens = tokens
            while (wait := adaptive.reserve_send(at, run, tokens)) > 0:
                check_pause(gate, wait, busy_wait)
                if time.monotonic() + wait >= deadline:
                    raise _past_deadline(loop, run, gate, now)
                time.sleep(wait)
                at = adaptive.clock()
                if adaptive.paused_for(run):
                    break  # a burst pause (or check) began meanwhile (see admit)
            else:
                break  # counted as sent at ``at``
        run.generation = adaptive.generation
        run.admitted_at = at
        run.sending = adaptive.sending(gate.in_flight)
        if hooks:
            waited = time.monotonic() - now
            emit(hooks, SlotAdmitted(loop.name, gate.name, run.attempt, waited))
        run.phase = "attempt"
    except BaseException:
        if held is not None:
            held.release()
        hand_on_probe(run, adaptive)
        raise
    return token


def _probe_slot_sync(
    gate: Gate,
    run: Run,
    adaptive: AdaptiveLimit,
    timeout: float | None,
    tokens: int | None,
    output_tokens: int | None,
) -> Token:
    """The blocking twin of :func:`_probe_slot`; ``timeout`` bounds the whole wait."""
    try:
        token = _free(gate, tokens, output_tokens)
        if token is not None:
            return token
        seconds = adaptive.ask_for_slot(run)
        if seconds is not None:
            check_pause(gate, seconds, timeout)
            started = time.monotonic()
            token = adaptive.slot_handed_sync(run, seconds)
            if timeout is not None:
                timeout = max(0.0, timeout - (time.monotonic() - started))
        if token is None:
            return gate.acquire_sync(
                timeout=timeout, tokens=tokens, output_tokens=output_tokens, priority=_AHEAD
            )
        _charge(token, tokens, output_tokens)
    except BaseException:
        adaptive.disown(run)
        raise
    return token


def _left(deadline: float, busy_wait: float | None) -> float | None:
    """A blocking slot wait's bound: the deadline's time left, within ``busy_wait``."""
    if deadline == math.inf:
        return busy_wait
    left = max(0.0, deadline - time.monotonic())
    return left if busy_wait is None else min(busy_wait, left)


def _past_deadline(loop: Attempts, run: Run, gate: Gate, since: float) -> Busy:
    """A blocking attempt's hold (a burst pause, a window's hold) would outlast the
    deadline. A retry fails the call as ``"deadline"`` with its last error, as a
    backoff past the deadline does; a first attempt is ``Busy``, as a slot wait is."""
    if run.verdict is not None:
        loop.retrier.fail(run, "deadline", loop.max_attempts, run.exc)
    return _busy(gate, since)


def check_pause(gate: Gate, pause: float, busy_wait: float | None) -> None:
    """A pause longer than the slot-wait budget is Busy now, not a long wait."""
    if busy_wait is not None and pause > busy_wait:
        raise Busy(
            gate=gate.name, capacity=gate.capacity, in_flight=gate.in_flight, waited=busy_wait
        )


def _busy(gate: Gate, since: float) -> Busy:
    """A blocking attempt's hold would outlast its deadline: ``Busy`` with the gate's state
    and the time waited since ``since`` (``time.monotonic``)."""
    return Busy(
        gate=gate.name,
        capacity=gate.capacity,
        in_flight=gate.in_flight,
        waited=time.monotonic() - since,
    )
