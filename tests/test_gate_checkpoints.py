"""``fast_acquire``: the checkpointing default (trio's rule, anyio's default) and the opt-in fast path."""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import pytest

import anygate
from anygate import Gate

pytestmark = pytest.mark.anyio

PAIRS = 50


async def _pairs(gate: Gate, style: str) -> None:
    for _ in range(PAIRS):
        if style == "await":
            (await gate.acquire()).release()
        else:
            async with gate.acquire():
                pass


async def _peer_runs_during(gate: Gate, style: str) -> int:
    """How often a busy peer task ran while this task did PAIRS uncontended acquire/release."""
    runs = 0
    started = anyio.Event()

    async def peer() -> None:
        nonlocal runs
        started.set()
        while True:
            runs += 1
            await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tg:
        tg.start_soon(peer)
        await started.wait()
        before = runs
        await _pairs(gate, style)
        during = runs - before
        tg.cancel_scope.cancel()
    return during


@pytest.mark.parametrize("style", ["await", "async with"])
async def test_default_acquire_loop_lets_peers_run(anyio_backend: Any, style: str) -> None:
    """Under the default, each uncontended acquire is a schedule point: a peer runs every time.

    A task acquiring and releasing in a loop with no other await must not starve the
    other tasks of its loop (anyio's ``Semaphore`` default, trio's checkpoint rule).
    """
    gate = Gate(1)
    assert not gate.fast_acquire
    assert await _peer_runs_during(gate, style) >= PAIRS * 4 // 5
    assert gate.statistics().admitted == PAIRS


@pytest.mark.parametrize("style", ["await", "async with"])
async def test_fast_acquire_loop_never_yields(anyio_backend: Any, style: str) -> None:
    """``fast_acquire=True`` is the documented opt-out: an uncontended acquire never yields."""
    gate = Gate(1, fast_acquire=True)
    assert await _peer_runs_during(gate, style) == 0
    assert gate.statistics().admitted == PAIRS


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_trio_assert_checkpoints_passes_with_the_default(anyio_backend: Any) -> None:
    """trio's ``assert_checkpoints()``: the default acquire is a cancel point and a schedule point."""
    import trio.testing

    gate = Gate(2)
    with trio.testing.assert_checkpoints():
        token = await gate.acquire()
    token.release()
    with trio.testing.assert_checkpoints():
        async with gate.acquire():
            pass
    # A rated gate with budget to spare takes the same path.
    rated = Gate(2, rate=anygate.Rate(requests_per_minute=1e9, burst_s=60))
    with trio.testing.assert_checkpoints():
        (await rated.acquire()).release()


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_trio_assert_checkpoints_when_waiting(anyio_backend: Any) -> None:
    """A contended acquire parks, which is a full checkpoint in either mode."""
    import trio.testing

    for fast in (False, True):
        gate = Gate(1, fast_acquire=fast)
        holder = gate.acquire_nowait()

        async def waiter(gate: Gate = gate) -> None:
            with trio.testing.assert_checkpoints():
                (await gate.acquire()).release()

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            holder.release()


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_trio_fast_acquire_is_a_cancel_point_only(anyio_backend: Any) -> None:
    """With ``fast_acquire=True`` the uncontended acquire is no schedule point (the opt-out)."""
    import trio.testing

    gate = Gate(1, fast_acquire=True)
    with pytest.raises(AssertionError, match="did not yield"), trio.testing.assert_checkpoints():
        (await gate.acquire()).release()


@pytest.mark.parametrize("fast_acquire", [False, True])
async def test_cancelled_scope_refuses_a_free_slot_in_both_modes(
    anyio_backend: Any, fast_acquire: bool
) -> None:
    """Both modes are cancel points: an already-cancelled scope gets no slot, even a free one."""
    gate = Gate(1, fast_acquire=fast_acquire)
    with anyio.CancelScope() as scope:
        scope.cancel()
        async with gate.acquire():
            pytest.fail("admitted in a cancelled scope")
    assert scope.cancelled_caught
    assert (gate.in_flight, gate.statistics().admitted) == (0, 0)


async def test_cancellation_at_the_schedule_point_keeps_no_slot(anyio_backend: Any) -> None:
    """A peer cancelling our scope while the default acquire yields: we leave holding nothing.

    The schedule point comes after admission (issue 26, item 3), so that is where the
    peer runs. On trio it is cancel-shielded: the body runs, and the cancellation lands at
    the next acquire's cancel point, before any slot is taken. On asyncio it is a bare
    yield, where anyio's cancel scope delivers the cancellation at once: that acquire
    gives its slot back and raises, its body never runs.
    """
    gate = Gate(1)
    bodies = 0
    async with anyio.create_task_group() as tg:
        with anyio.CancelScope() as scope:

            async def canceller() -> None:
                scope.cancel()

            tg.start_soon(canceller)
            while True:
                async with gate.acquire():
                    bodies += 1
    assert scope.cancelled_caught
    given_back = 0 if anyio_backend == "trio" else 1
    assert (gate.in_flight, gate.statistics().admitted) == (0, bodies + given_back)
    async with gate.acquire():  # the slot is still there
        assert gate.in_flight == 1


async def test_slot_freed_before_queueing_still_yields(
    anyio_backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rare admission inside the queueing step (a slot freed after the fast path looked)
    is also a schedule point under the default: on asyncio a peer queued earlier has run,
    on trio (random batch order) ``assert_checkpoints`` counts it."""
    gate = Gate(1)
    holder = gate.acquire_nowait()
    ran: list[str] = []

    async def peer() -> None:
        ran.append("peer")

    real_enqueue = Gate._enqueue

    def enqueue(self: Gate, waiter: Any, limit: float | None = None) -> bool:
        holder.release()  # the slot frees between the fast path's look and queueing
        return real_enqueue(self, waiter, limit)

    monkeypatch.setattr(Gate, "_enqueue", enqueue)
    if anyio_backend == "trio":
        import trio.testing

        with trio.testing.assert_checkpoints():
            token = await gate.acquire()
    else:
        async with anyio.create_task_group() as tg:
            tg.start_soon(peer)
            token = await gate.acquire()
            assert ran == ["peer"]
    assert holder.released
    token.release()


def test_shared_gate_fast_acquire_is_set_at_creation_and_conflicts_raise() -> None:
    """``shared_gate(fast_acquire=)`` applies on creation; a later different value is refused."""
    gate = anygate.shared_gate("fast", capacity=2, fast_acquire=True)
    assert gate.fast_acquire
    assert anygate.shared_gate("fast") is gate
    assert anygate.shared_gate("fast", fast_acquire=True) is gate
    with pytest.raises(ValueError, match=r"fast_acquire=True; got fast_acquire=False"):
        anygate.shared_gate("fast", fast_acquire=False)
    assert not anygate.shared_gate("default").fast_acquire


@pytest.mark.parametrize("value", [1, "yes", None])
def test_fast_acquire_must_be_a_bool(value: Any) -> None:
    """A truthy stand-in is refused with the parameter's name, on the gate and by name."""
    with pytest.raises(TypeError, match=r"fast_acquire must be a bool \(got"):
        Gate(1, fast_acquire=value)
    if value is not None:  # None means "unstated" for shared_gate
        with pytest.raises(TypeError, match="fast_acquire must be a bool"):
            anygate.shared_gate("typed", fast_acquire=value)
