"""The guarded private reads of the cancel point (``_cancel_state``), and their public fallback.

The uncontended acquire asks "is a cancellation pending?" from the runtime's own state when
the guard recognises it, and through the public APIs otherwise. Every behaviour below runs
on both paths (``path``), on every backend; the agreement matrix checks the private answer
against the public one scope by scope; the guard tests make it see a mismatch and check
that it falls back. ``nox -s oldest`` runs this module on the oldest anyio and trio the
project allows.
"""

from __future__ import annotations

import asyncio
import math
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
import pytest

from anygate import Gate
from anygate._gate import cancel_state as _cancel_state
from anygate._gate import waiters as _waiters

if TYPE_CHECKING:
    from collections.abc import Iterator

    from anygate import Token

pytestmark = pytest.mark.anyio


def _backend_name(anyio_backend: Any) -> str:
    name = anyio_backend if isinstance(anyio_backend, str) else anyio_backend[0]
    return "trio" if name == "trio" else "asyncio"


@pytest.fixture(params=["private", "public"])
def path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run the test on the guarded private path (probed afresh) and on the public one."""
    _cancel_state.use_public(request.param == "public")
    try:
        yield request.param
    finally:
        _cancel_state.use_public(False)


def _public_answer() -> bool:
    """What the public API says: is a cancellation pending for the running task?"""
    return bool(anyio.current_effective_deadline() == -math.inf)


async def _refused(gate: Gate) -> bool:
    """Whether ``acquire()`` raises the pending cancellation (the caller's scope is cancelled)."""
    try:
        token = await gate.acquire()
    except anyio.get_cancelled_exc_class():
        return True
    token.release()
    return False


@pytest.mark.parametrize("fast_acquire", [False, True])
async def test_cancelled_scope_refuses_a_free_slot(
    anyio_backend: Any, path: str, fast_acquire: bool
) -> None:
    gate = Gate(1, fast_acquire=fast_acquire)
    with anyio.CancelScope() as scope:
        scope.cancel()
        assert await _refused(gate)
    assert (gate.in_flight, gate.waiting) == (0, 0)
    async with gate.acquire():  # the next acquire, outside the scope, goes
        assert gate.in_flight == 1
    if fast_acquire:  # the default mode's free path awaits a full checkpoint instead
        assert _cancel_state.mode(_backend_name(anyio_backend)) == path


@pytest.mark.parametrize("fast_acquire", [False, True])
async def test_an_outer_cancelled_scope_refuses_through_inner_ones(
    anyio_backend: Any, path: str, fast_acquire: bool
) -> None:
    gate = Gate(1, fast_acquire=fast_acquire)
    with anyio.CancelScope() as outer:
        outer.cancel()
        with anyio.CancelScope(), anyio.CancelScope():
            refused = await _refused(gate)
    assert refused
    assert gate.in_flight == 0


@pytest.mark.parametrize("fast_acquire", [False, True])
async def test_a_shield_inside_a_cancelled_scope_admits(
    anyio_backend: Any, path: str, fast_acquire: bool
) -> None:
    gate = Gate(1, fast_acquire=fast_acquire)
    with anyio.CancelScope() as outer:
        outer.cancel()
        with anyio.CancelScope(shield=True):
            assert not await _refused(gate)
    assert gate.in_flight == 0


async def test_a_cancelled_scope_refuses_before_queueing(anyio_backend: Any, path: str) -> None:
    """Contended: the cancel point comes first, so the waiter never joins the queue."""
    gate = Gate(1, fast_acquire=True)
    holder = await gate.acquire()
    with anyio.CancelScope() as scope:
        scope.cancel()
        assert await _refused(gate)
    assert (gate.in_flight, gate.waiting) == (1, 0)
    holder.release()
    assert gate.statistics().cancelled == 0  # it never waited: nothing to withdraw


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_a_ctrl_c_pending_for_the_main_task_still_queues_another(
    anyio_backend: Any, path: str
) -> None:
    """Contended, trio: a Ctrl-C pending for the main task makes the private read answer
    "pending" for every task; trio's own check then passes in this one, and the acquire
    queues (once) and is admitted when the slot comes back."""
    import trio

    runner = trio.lowlevel.current_task()._runner
    gate = Gate(1, fast_acquire=True)
    holder = await gate.acquire()
    got: list[Token] = []

    async def contender() -> None:
        runner.ki_pending = True  # no yield until the park: nothing else sees it
        got.append(await gate.acquire())

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(contender)
            await anyio.wait_all_tasks_blocked()
            runner.ki_pending = False
            assert gate.waiting == 1
            holder.release()
    finally:
        runner.ki_pending = False
    assert len(got) == 1
    assert gate.in_flight == 1
    got[0].release()


async def test_a_deadline_that_passed_refuses(anyio_backend: Any, path: str) -> None:
    gate = Gate(1, fast_acquire=True)
    with anyio.move_on_after(0):  # anyio cancels a scope whose deadline passed on entry
        assert await _refused(gate)
    assert gate.in_flight == 0


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_task_anyio_never_saw_is_admitted(anyio_backend: Any, path: str) -> None:
    """A bare asyncio task has no anyio cancel scope: no state to read, nothing pending."""
    gate = Gate(1, fast_acquire=True)

    async def bare() -> bool:
        return await _refused(gate)

    assert not await asyncio.get_running_loop().create_task(bare())
    assert gate.in_flight == 0


async def test_the_private_answer_agrees_with_the_public_one(anyio_backend: Any) -> None:
    """Scope by scope, where the guard chose the private path, both answers agree."""
    _cancel_state.use_public(False)
    backend = _backend_name(anyio_backend)
    (await Gate(1, fast_acquire=True).acquire()).release()  # the first question: the guard decides
    assert _cancel_state.mode(backend) == "private"  # a supported version: noticed if not

    def private() -> bool:
        if backend == "trio":
            return _cancel_state.trio_pending()
        return _cancel_state.asyncio_pending(asyncio.get_running_loop())

    # The scopes hold no await on purpose: the test reads their state, it never checkpoints.
    seen = []
    assert private() == _public_answer() is False
    with anyio.CancelScope() as outer:  # noqa: ASYNC100
        seen.append((private(), _public_answer()))
        outer.cancel()
        seen.append((private(), _public_answer()))
        with anyio.CancelScope():  # noqa: ASYNC100
            seen.append((private(), _public_answer()))
            with anyio.CancelScope(shield=True):  # noqa: ASYNC100
                seen.append((private(), _public_answer()))
                with anyio.CancelScope() as inner:  # noqa: ASYNC100
                    inner.cancel()
                    seen.append((private(), _public_answer()))
    assert seen == [(False, False), (True, True), (True, True), (False, False), (True, True)]


async def test_the_guard_falls_back_when_the_answers_disagree(
    anyio_backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A private read that answers wrongly on the first question selects the public path."""
    _cancel_state.use_public(False)
    backend = _backend_name(anyio_backend)
    # A reader that never sees a cancellation: wrong exactly when one is pending.
    monkeypatch.setattr(_cancel_state, "_asyncio_private", lambda loop: False)
    monkeypatch.setattr(_cancel_state, "_trio_private", lambda: False)
    gate = Gate(1, fast_acquire=True)
    try:
        with anyio.CancelScope() as scope:
            scope.cancel()
            assert await _refused(gate)  # the first question, asked in a cancelled scope
        assert _cancel_state.mode(backend) == "public"
        with anyio.CancelScope() as scope:
            scope.cancel()
            assert await _refused(gate)  # and the public path keeps refusing
    finally:
        _cancel_state.use_public(False)
    assert gate.in_flight == 0


async def test_the_guard_falls_back_when_the_structure_is_unknown(
    anyio_backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _cancel_state.use_public(False)
    backend = _backend_name(anyio_backend)
    # What the guard inspects, replaced by something it does not recognise (the runtimes
    # themselves keep their real state).
    monkeypatch.setattr(_cancel_state, "_trio_run_context", lambda: object())
    monkeypatch.setattr(_cancel_state, "_anyio_asyncio", lambda: object())
    gate = Gate(1, fast_acquire=True)
    try:
        async with gate.acquire():
            pass
        assert _cancel_state.mode(backend) == "public"
        with anyio.CancelScope() as scope:
            scope.cancel()
            assert await _refused(gate)
    finally:
        _cancel_state.use_public(False)


async def test_no_check_is_awaited_when_nothing_is_pending(anyio_backend: Any, path: str) -> None:
    """The point of the private path: no coroutine to await on the uncontended acquire."""
    (await Gate(1, fast_acquire=True).acquire()).release()  # let the guard decide
    check = _waiters.cancellation_check()
    try:
        if path == "private":
            assert check is None
        elif _backend_name(anyio_backend) == "trio":
            assert check is not None  # the public path lets trio answer, every time
    finally:
        close = getattr(check, "close", None)
        if close is not None:
            close()


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_trio_still_counts_the_cancel_point(anyio_backend: Any, path: str) -> None:
    """trio.testing sees the fast acquire as the cancel point it is, on both paths."""
    import trio.testing

    gate = Gate(1, fast_acquire=True)
    (await gate.acquire()).release()  # let the guard decide first
    with pytest.raises(AssertionError, match="yielded"), trio.testing.assert_no_checkpoints():
        (await gate.acquire()).release()
