"""Lowering a gate's rate budgets to what a provider says is left (``Gate._lower_budgets``).

The hook header learning uses for a provider's ``remaining``: the level becomes what was
left at a mark, less this gate's own charges since the mark; it never rises. Pure
arithmetic on ``Budgets`` first, then the contract on every backend with a clock the test
moves by hand, then a queued waiter on trio's ``MockClock`` (exact times).
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from anygate import Busy, Gate, Rate
from anygate._gate.budgets import Budgets
from anygate._gate.rate import BudgetMark

from .conftest import mock_clock

VIRTUAL = [mock_clock()]

# 1,000 tokens/s and 10 requests/s, holding 10 s of refill (10,000 tokens, 100 requests):
# levels large enough to see a sync move them.
RATE = Rate(tokens_per_minute=60_000, requests_per_minute=600, burst_s=10)


def full_budgets(now: float = 100.0) -> Budgets:
    budgets = Budgets(RATE, 0.0)
    assert budgets.tokens_left(now) == pytest.approx(10_000)  # refilled from empty
    return budgets


# ----------------------------------------------------------------------------- arithmetic


def test_level_becomes_what_was_left_less_what_we_charged_since() -> None:
    """Left 4,000 at the mark, 1,500 tokens and 3 requests charged since: 2,500 and 7 left."""
    budgets = full_budgets()
    budgets.take(100.0, 500)
    mark = budgets.mark(100.0)
    assert mark == BudgetMark(100.0, 1, 500)
    for cost in (1000, 300, 200):
        budgets.take(100.5, cost)
    assert budgets.lower_since(101.0, mark, requests=10, tokens=4000)
    assert budgets.tokens_left(101.0) == pytest.approx(2500)
    assert budgets.requests_left(101.0) == pytest.approx(7)
    # The usual refill follows: 1,000 tokens a second, up to the burst.
    assert budgets.tokens_left(103.0) == pytest.approx(4500)


def test_a_sync_only_ever_lowers_and_may_leave_a_debt() -> None:
    """A report above the level changes nothing; one below what we spent since is a debt."""
    budgets = full_budgets()
    mark = budgets.mark(100.0)
    budgets.take(100.0, 2000)  # level 8,000
    assert not budgets.lower_since(100.0, mark, requests=None, tokens=50_000)
    assert not budgets.lower_since(100.0, mark, requests=None, tokens=None)
    assert budgets.tokens_left(100.0) == pytest.approx(8000)
    assert budgets.lower_since(100.0, mark, requests=None, tokens=500)  # 500 - 2,000
    assert budgets.tokens_left(100.0) == pytest.approx(-1500)
    assert budgets.next_admission(100.0) == pytest.approx(1.5)  # a debt is waited out
    assert budgets.when(100.0, 1) == pytest.approx(101.5 + 0.001)  # then 1 token's refill


def test_settle_charges_count_as_spent_and_refunds_do_not() -> None:
    """Spent only grows: a refund may not be given back by the provider (OpenAI's TPM)."""
    budgets = full_budgets()
    budgets.take(100.0, 1000)
    mark = budgets.mark(100.0)
    budgets.settle(+400, 100.0)
    budgets.settle(-900, None)
    assert budgets.mark(100.0).tokens - mark.tokens == 400
    assert budgets.mark(100.0).tokens_back - mark.tokens_back == 900  # for the share's units
    assert budgets.lower_since(100.0, mark, requests=None, tokens=1000)
    assert budgets.tokens_left(100.0) == pytest.approx(600)


def test_spent_carries_over_a_rate_change() -> None:
    """A mark taken before a live rate change still counts the admissions after it."""
    budgets = full_budgets()
    mark = budgets.mark(100.0)
    budgets.take(100.0, 700)
    changed = Budgets(Rate(tokens_per_minute=120_000, burst_s=10), 100.0, budgets)
    assert changed.lower_since(100.0, mark, requests=None, tokens=1000)
    assert changed.tokens_left(100.0) == pytest.approx(300)


# ----------------------------------------------------------------------------- runtimes


async def test_lowered_gate_refuses_until_the_debt_is_refilled(anyio_backend: Any) -> None:
    """On asyncio, uvloop and trio: lowered into debt means Busy for exactly its refill time."""
    now = [1000.0]
    gate = Gate(name="llm", rate=RATE, clock=lambda: now[0])
    assert gate.budget_mark() == BudgetMark(1000.0, 0, 0)
    now[0] += 10  # full: 10,000 tokens
    token = await gate.acquire(timeout=0, tokens=3000)
    mark = gate.budget_mark()
    assert mark is not None
    other = await gate.acquire(timeout=0, tokens=2000)
    assert gate._lower_budgets(mark, None, 1000)  # 1,000 left, 2,000 of ours since: -1,000
    with pytest.raises(Busy) as caught:
        await gate.acquire(timeout=0, tokens=500)
    assert caught.value.retry_after_s == pytest.approx(1.5)
    assert not gate._lower_budgets(mark, None, 5000)  # never raised
    now[0] += 1.5
    third = await gate.acquire(timeout=0, tokens=500)
    for t in (token, other, third):
        t.release()


def test_no_budget_or_no_clock_lowers_nothing() -> None:
    """A gate without a rate, or a virtual clock read outside its run, changes nothing."""
    assert Gate(name="bare").budget_mark() is None
    assert not Gate(name="bare")._lower_budgets(BudgetMark(0.0, 0, 0), 0, 0)
    outside = Gate(name="v", rate=RATE, clock=anyio.current_time)  # raises outside a run
    assert outside.budget_mark() is None
    assert not outside._lower_budgets(BudgetMark(0.0, 0, 0), 0, 0)


@pytest.mark.parametrize("anyio_backend", VIRTUAL)
async def test_a_queued_waiter_waits_for_the_lowered_level(anyio_backend: Any) -> None:
    """A waiter already timed for the old level is admitted only when the new one allows."""
    gate = Gate(name="llm", rate=Rate(tokens_per_minute=60_000), clock=anyio.current_time)
    start = anyio.current_time()
    admitted: list[float] = []

    async def call() -> None:
        async with gate.acquire(tokens=1000):  # the empty 1 s budget: due at 1 s
            admitted.append(anyio.current_time() - start)

    async with anyio.create_task_group() as tg:
        tg.start_soon(call)
        await anyio.wait_all_tasks_blocked()
        mark = gate.budget_mark()
        assert mark is not None
        assert gate._lower_budgets(mark, None, -4000)  # (a provider 4,000 in debt to us)
    assert admitted == [pytest.approx(5.0)]
