"""What only the attempt loop (``Policy.run``) and the block form (``policy.attempts()``) do.

The behaviours every entry point shares are one contract in
``tests/integrations/test_entry_contract.py``; these are the forms' own rules: the step's
slot, misuse of the block form, the block form's deadline and attempt timeout (one absolute
time applied to each phase, since no cancel scope can span two blocks), leaving early.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

import anygate
from anygate import AdaptiveConfig, CallFailed, Gate, Policy, RetryConfig
from tests.conftest import mock_clock
from tests.policy_helpers import transient

pytestmark = pytest.mark.anyio

INSTANT = RetryConfig(base_delay_ms=0, cap_delay_ms=0)


def _policy(**kwargs: Any) -> Policy:
    kwargs.setdefault("retry", INSTANT)
    kwargs.setdefault("gate", Gate(2, name="loop"))
    kwargs.setdefault("adaptive_concurrency", AdaptiveConfig(enabled=False))
    return Policy(name="loop", **kwargs)


async def test_the_step_sees_its_number_and_the_previous_verdict() -> None:
    """``attempt.number`` counts from 1; ``previous`` is the last failure's verdict."""
    policy = _policy()
    seen: list[tuple[int, object]] = []

    async def step(attempt: anygate.Attempt) -> str:
        seen.append((attempt.number, None if attempt.previous is None else attempt.previous.status))
        async with await attempt.acquire():
            if attempt.number < 3:
                raise transient()
            return "ok"

    assert await policy.run(step) == "ok"
    assert seen == [(1, None), (2, 503), (3, 503)]


async def test_a_slot_the_step_kept_stays_taken_after_success() -> None:
    """On success the token is the step's (a transport ties it to a body): not released."""
    policy = _policy()

    async def step(attempt: anygate.Attempt) -> anygate.Token:
        return await attempt.acquire()

    token = await policy.run(step)
    assert policy.gate.in_flight == 1
    token.release()
    assert policy.gate.in_flight == 0


async def test_slots_of_a_failed_step_are_released_for_it() -> None:
    """A step that raises while holding slots (two, on two gates) holds none in the backoff."""
    policy = _policy()
    other = Gate(1, name="other")
    during_retry: list[tuple[int, int]] = []

    async def step(attempt: anygate.Attempt) -> str:
        if attempt.number == 2:
            during_retry.append((policy.gate.in_flight, other.in_flight))
            return "ok"
        await attempt.acquire()
        await attempt.acquire(other, timeout=1)
        raise transient()

    assert await policy.run(step) == "ok"
    assert during_retry == [(0, 0)]


async def test_busy_from_the_steps_acquire_ends_the_call() -> None:
    """No slot within the acquire's timeout: Busy, not retried."""
    gate = Gate(1, name="full")
    policy = _policy(gate=gate)
    calls = 0

    async def step(attempt: anygate.Attempt) -> str:
        nonlocal calls
        calls += 1
        async with await attempt.acquire(timeout=0):
            return "never"

    with gate.acquire_nowait():
        with pytest.raises(anygate.Busy):
            await policy.run(step)
    assert calls == 1


async def test_a_blocking_step_is_refused_by_the_async_loop() -> None:
    """``run`` with a step that returns no awaitable: TypeError, not a retried failure."""
    policy = _policy()
    with pytest.raises(TypeError, match=r"run\(\) needs the step to return an awaitable"):
        await policy.run(lambda attempt: "sync")  # type: ignore[arg-type, return-value]


def test_attempts_have_no_public_constructor() -> None:
    """Attempt and AttemptBlock are handed out by the policy only."""
    with pytest.raises(TypeError, match="no public constructor"):
        anygate.Attempt()
    with pytest.raises(TypeError, match="no public constructor"):
        anygate.AttemptBlock()


def test_reraise_must_be_a_bool() -> None:
    """``reraise="yes"`` is refused naming the argument."""
    with pytest.raises(TypeError, match="reraise must be a bool"):
        _policy().attempts_sync(reraise="yes")  # type: ignore[arg-type]


async def test_a_block_that_raises_retriably_is_swallowed_and_retried() -> None:
    """The block runs again; the failure never reaches the caller."""
    policy = _policy()
    numbers = []
    async for attempt in policy.attempts():
        async with attempt:
            numbers.append(attempt.number)
            assert policy.gate.in_flight == 1  # the block holds the slot
            if attempt.number == 1:
                raise transient()
    assert numbers == [1, 2]
    assert policy.gate.in_flight == 0


async def test_breaking_out_after_a_failure_strands_nothing() -> None:
    """Leaving the loop between blocks: no slot, no breaker permit left behind."""
    policy = _policy()
    async for attempt in policy.attempts():
        async with attempt:
            raise transient()
        break  # after the swallowed failure
    assert policy.gate.in_flight == 0
    assert policy.breaker is not None
    assert policy.breaker.statistics().failures == 1


async def test_the_next_attempt_needs_the_previous_block_entered() -> None:
    """Skipping ``async with attempt`` is a mistake the iterator names."""
    policy = _policy()
    attempts = policy.attempts()
    await attempts.__anext__()
    with pytest.raises(RuntimeError, match="must be used as `async with attempt:`"):
        await attempts.__anext__()


async def test_a_block_is_entered_once() -> None:
    """Entering the same attempt twice is refused; the first use is unharmed."""
    policy = _policy()
    async for attempt in policy.attempts():
        async with attempt:
            with pytest.raises(RuntimeError, match="already entered"):
                await attempt.__aenter__()
    assert policy.gate.in_flight == 0


def test_a_sync_block_is_entered_with_with() -> None:
    """The blocking form's attempt refuses ``async with`` and works with ``with``."""
    policy = _policy()
    for attempt in policy.attempts_sync():
        with pytest.raises(TypeError, match="entered with `with attempt:`"):
            anyio.run(attempt.__aenter__)
        with attempt:
            pass
    assert policy.gate.in_flight == 0


async def test_attempts_sync_refuses_an_event_loop_thread() -> None:
    """A blocking block form on the loop's thread would freeze it."""
    with pytest.raises(RuntimeError, match=r"attempts_sync\(\) called on a thread running"):
        next(iter(_policy().attempts_sync()))


@pytest.mark.parametrize("anyio_backend", [mock_clock()])
async def test_the_deadline_cuts_a_hung_block(anyio_backend: Any) -> None:
    """A block still running at the deadline is cancelled: CallFailed ``deadline`` at
    exactly the deadline, slot free."""
    policy = _policy()
    started = anyio.current_time()

    async def hang() -> None:
        async for attempt in policy.attempts(deadline=7):
            async with attempt:
                await anyio.sleep_forever()

    with pytest.raises(CallFailed, match="deadline") as info:
        await hang()
    assert anyio.current_time() - started == pytest.approx(7)
    assert isinstance(info.value.__cause__, TimeoutError)
    assert policy.gate.in_flight == 0


@pytest.mark.parametrize("anyio_backend", [mock_clock()])
async def test_the_attempt_timeout_cuts_one_block_and_it_is_retried(anyio_backend: Any) -> None:
    """``attempt_timeout_s`` ends a hung block as a transient failure; the next one runs."""
    events: list[Any] = []
    policy = _policy(attempt_timeout_s=2, hooks=[events.append])
    started = anyio.current_time()
    async for attempt in policy.attempts(deadline=60):
        async with attempt:
            if attempt.number == 1:
                await anyio.sleep_forever()
    assert anyio.current_time() - started == pytest.approx(2)
    (retry,) = [e for e in events if isinstance(e, anygate.RetryScheduled)]
    assert "timed out after 2s" in retry.verdict.detail


@pytest.mark.parametrize("anyio_backend", [mock_clock()])
async def test_the_deadline_bounds_the_wait_for_a_slot_in_a_block(anyio_backend: Any) -> None:
    """No slot before the deadline, nothing attempted yet: Busy, as from ``call``."""
    gate = Gate(1, name="full")
    policy = _policy(gate=gate)

    async def wait_for_a_slot() -> None:
        async for attempt in policy.attempts(deadline=3):
            async with attempt:
                raise AssertionError("never admitted")

    with gate.acquire_nowait(), pytest.raises(anygate.Busy):
        await wait_for_a_slot()
    assert gate.in_flight == 0


async def test_acquire_takes_a_slot_outside_the_loop() -> None:
    """``policy.acquire()`` is one slot, the caller's to release; no breaker involved."""
    policy = _policy()
    token = await policy.acquire()
    assert policy.gate.in_flight == 1
    token.release()
    with pytest.raises(TypeError, match=r"gate must be an anygate\.Gate"):
        await policy.acquire("llm")  # type: ignore[arg-type]


@pytest.mark.parametrize("anyio_backend", [mock_clock()])
async def test_a_slot_taken_outside_the_loop_hands_the_burst_probe_on(
    anyio_backend: Any,
) -> None:
    """After a burst pause, ``policy.acquire()`` may be the first to ask and so claim the
    probe role; its slot is never classified, so it hands the role on at once (kept, the
    pause would never end for anyone on the gate)."""
    policy = _policy(
        gate=Gate(4, name="burst"),
        max_concurrent_calls=None,
        adaptive_concurrency=AdaptiveConfig(pause_ms=1000),
        clock=anyio.current_time,
    )
    adaptive = policy.adaptive_limit
    adaptive.on_throttle(None, None, 1)
    assert adaptive.pass_pause()[0] > 0  # pausing
    await anyio.sleep(1.5)  # the pause is over: the next to ask is the probe
    token = await policy.acquire()
    token.release()
    assert adaptive.pass_pause() == (0.0, True)  # the role came back for the next caller


@pytest.mark.parametrize("anyio_backend", [mock_clock()])
async def test_the_deadline_cuts_a_hung_step_and_reraise_gives_its_cause(
    anyio_backend: Any,
) -> None:
    """``run(deadline=)`` cuts a step that hangs after a failure: CallFailed ``deadline``
    with the last provider error as cause, or that error itself with ``reraise``."""
    policy = _policy(retry=RetryConfig(base_delay_ms=1000, cap_delay_ms=1000))
    first = transient()

    async def step(attempt: anygate.Attempt) -> str:
        async with await attempt.acquire():
            if attempt.number == 1:
                raise first
            await anyio.sleep_forever()
        raise AssertionError("unreachable")

    with pytest.raises(CallFailed, match="deadline") as info:
        await policy.run(step, deadline=10)
    assert info.value.__cause__ is first
    first = transient()
    with pytest.raises(anygate.ResponseError) as raw:
        await policy.run(step, deadline=10, reraise=True)
    assert raw.value is first
    assert policy.gate.in_flight == 0


async def test_attempt_tokens_wait_for_room_in_the_token_budget() -> None:
    """Issue 30: ``attempt.acquire(tokens=)`` admits an attempt only when the gate's token
    budget has room for its estimate, so attempts started together cannot overdraw it; a
    settle's refund lets the next one go. (Charged only after admission, the second would
    have been admitted at once.)"""
    clock = [1000.0]
    gate = Gate(
        4,
        name="tokens",
        rate=anygate.Rate(tokens_per_minute=600, burst_s=60),
        clock=lambda: clock[0],
    )
    clock[0] += 60  # a full budget: 600 tokens, and the clock then stands still
    policy = _policy(gate=gate)
    sent: list[int] = []
    finish = anyio.Event()

    async def step(attempt: anygate.Attempt, number: int) -> None:
        async with await attempt.acquire(tokens=400) as token:
            sent.append(number)
            await finish.wait()
            token.settle(tokens=100)  # the usage: a refund of 300

    async with anyio.create_task_group() as tg:
        tg.start_soon(policy.run, lambda a: step(a, 1))
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(policy.run, lambda a: step(a, 2))
        await anyio.wait_all_tasks_blocked()
        assert sent == [1]  # 200 tokens left: the second waits for room, holding no slot
        assert (gate.in_flight, gate.waiting) == (1, 1)
        finish.set()
    assert sent == [1, 2]
    rate = gate.statistics().rate
    assert rate is not None
    assert rate.tokens_available == pytest.approx(400.0)  # 600 - 100 - 100


async def test_attempt_tokens_above_a_minute_of_budget_end_the_call() -> None:
    """A cost the budget can never admit is the caller's error: ValueError naming the
    budget, raised unchanged from the first attempt (not retried), nothing taken."""
    gate = Gate(2, name="tokens", rate=anygate.Rate(tokens_per_minute=600))
    policy = _policy(gate=gate)
    attempts: list[int] = []

    async def step(attempt: anygate.Attempt) -> None:
        attempts.append(attempt.number)
        await attempt.acquire(tokens=601)

    with pytest.raises(ValueError, match=r"tokens must be <= the gate's tokens_per_minute \(600\)"):
        await policy.run(step)
    assert attempts == [1]
    assert gate.in_flight == 0
