"""``gate.acquire()`` returns the token to be: one object from request to release.

What that changes for a caller who holds on to the acquisition: awaiting or entering it
again gives back the same token (never a second slot behind one token), a second wait
while the first is running (or after it failed) is an error, and a token not admitted yet
says so.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from anygate import Busy, Gate, Token

pytestmark = pytest.mark.anyio


async def test_awaiting_an_acquisition_again_gives_the_same_token(anyio_backend: Any) -> None:
    gate = Gate(2, fast_acquire=True)
    acquisition = gate.acquire()
    first = await acquisition
    assert await acquisition is first
    async with acquisition as entered:
        assert entered is first
        assert gate.in_flight == 1  # one slot, whatever the caller did with the object
    assert first.released
    assert gate.in_flight == 0


async def test_a_second_wait_on_a_queued_acquisition_is_refused(anyio_backend: Any) -> None:
    gate = Gate(1)
    holder = gate.acquire_nowait()
    acquisition = gate.acquire()
    got: list[Token] = []

    async def wait() -> None:
        got.append(await acquisition)

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        await anyio.wait_all_tasks_blocked()
        with pytest.raises(RuntimeError, match="already being awaited"):
            await acquisition
        assert (gate.in_flight, gate.waiting) == (1, 1)  # the refusal changed nothing
        holder.release()
    (token,) = got
    assert gate.in_flight == 1
    token.release()
    assert gate.in_flight == 0


async def test_an_acquisition_whose_wait_failed_cannot_be_awaited_again(anyio_backend: Any) -> None:
    gate = Gate(1)
    holder = gate.acquire_nowait()
    acquisition = gate.acquire(timeout=0)
    with pytest.raises(Busy):
        await acquisition
    with pytest.raises(RuntimeError, match=r"call gate\.acquire\(\) again"):
        await acquisition
    holder.release()
    assert (gate.in_flight, gate.waiting) == (0, 0)


async def test_a_token_not_admitted_yet_is_neither_held_nor_released(anyio_backend: Any) -> None:
    gate = Gate(1, name="g")
    acquisition: Any = gate.acquire()
    assert isinstance(acquisition, Token)
    assert not acquisition.released
    assert "not admitted yet on gate 'g'" in repr(acquisition)
    with pytest.raises(RuntimeError, match="needs an admitted token"):
        acquisition.settle(tokens=1)
    assert gate.holders() == ()  # it holds nothing, and dropping it leaks nothing
    del acquisition
    token = await gate.acquire()
    assert "held on gate 'g'" in repr(token)
    token.release()
    assert "released" in repr(token)
