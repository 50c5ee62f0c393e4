"""Settle charges on an idle token budget: a charge is never lost to the budget's cap.

A budget's level is capped at its burst: a ``tat`` far in the past means "full", however far.
A positive settle delta added to such a ``tat`` would vanish into that cap instead of
leaving the debt it stands for. Virtual time (trio ``MockClock``), exact assertions.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from anygate import Gate, Rate

from .conftest import mock_clock

VIRTUAL = [mock_clock()]


def _gate() -> Gate:
    # 10 tokens/s, burst 1 s = 10 tokens.
    return Gate(name="s", rate=Rate(tokens_per_minute=600), clock=anyio.current_time)


@pytest.mark.parametrize("anyio_backend", VIRTUAL)
@pytest.mark.parametrize("idle_s", [1.0, 5.0, 100.0])
async def test_settle_charge_after_idle_leaves_the_full_debt(
    anyio_backend: Any, idle_s: float
) -> None:
    """However long the budget sat full, a settle of 110 unstated tokens owes 100: 10 s."""
    gate = _gate()
    await anyio.sleep(idle_s)
    with await gate.acquire() as token:
        token.settle(tokens=110)
    rate = gate.statistics().rate
    assert rate is not None
    assert rate.tokens_available == pytest.approx(-100.0)
    start = anyio.current_time()
    async with gate.acquire():
        assert anyio.current_time() - start == pytest.approx(10.0)


@pytest.mark.parametrize("anyio_backend", VIRTUAL)
async def test_settle_charge_within_the_burst_is_not_lost(anyio_backend: Any) -> None:
    """A charge smaller than the burst still lowers a full budget (the level is not capped back)."""
    gate = _gate()
    await anyio.sleep(30)
    token = await gate.acquire()  # nothing stated: nothing charged yet
    token.release()
    token.settle(tokens=7)  # charged after the call: 10 - 7 = 3 left
    rate = gate.statistics().rate
    assert rate is not None
    assert rate.tokens_available == pytest.approx(3.0)


@pytest.mark.parametrize("anyio_backend", VIRTUAL)
async def test_settle_refund_then_charge_is_exact(anyio_backend: Any) -> None:
    """Refund and charge round-trip: settling back to the stated cost restores the level."""
    gate = _gate()
    await anyio.sleep(30)
    token = await gate.acquire(tokens=8)  # 2 left
    token.settle(tokens=3)  # 5 back: 7 left
    token.settle(tokens=8)  # 5 charged again: 2 left
    rate = gate.statistics().rate
    assert rate is not None
    assert rate.tokens_available == pytest.approx(2.0)
    token.release()
