"""Split token budgets (Anthropic's ITPM / OTPM): arithmetic, FIFO admission, settles, errors.

A call's cost is ``tokens`` (the total) of which ``output_tokens`` are output: the input
part is charged to ``input_tokens_per_minute``, the output part to
``output_tokens_per_minute``. Time is a hand-moved clock (``clock=lambda: now[0]``), as in
``test_gate_rate_runtimes``: waiters park on real timers that never fire within a test.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from anygate import Gate, LimitReport, Rate, RateLearner, ReportedLimit
from anygate._gate.budgets import SPLIT_BURST_S, Budgets
from anygate._gate.split import Bucket

# Full budgets after a minute of refill: 600 input tokens (10/s) and 60 output (1/s).
SPLIT = Rate(input_tokens_per_minute=600, output_tokens_per_minute=60)


def manual_clock(start: float = 0.0) -> tuple[list[float], Any]:
    now = [start]
    return now, lambda: now[0]


def split_gate(capacity: float = float("inf"), **kw: Any) -> Gate:
    now, clock = manual_clock()
    rate = Rate(input_tokens_per_minute=600, output_tokens_per_minute=60, **kw)
    gate = Gate(capacity, rate=rate, clock=clock)
    now[0] = SPLIT_BURST_S  # both budgets full
    return gate


def levels(gate: Gate) -> tuple[float | None, float | None]:
    rate = gate.statistics().rate
    assert rate is not None
    return rate.input_tokens_available, rate.output_tokens_available


# ---------------------------------------------------------------------- the value


def test_rate_takes_split_budgets_alone_and_says_so() -> None:
    """A Rate of only input/output budgets is valid; ``split`` tells it from a total budget."""
    assert SPLIT.split
    assert Rate(input_tokens_per_minute=1).split
    assert Rate(output_tokens_per_minute=1).split
    assert not Rate(tokens_per_minute=1).split
    same = Rate(output_tokens_per_minute=60.0, input_tokens_per_minute=600.0)
    assert same == SPLIT
    assert "input_tokens_per_minute=600" in repr(SPLIT)


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"input_tokens_per_minute": 0}, ValueError, "input_tokens_per_minute"),
        ({"output_tokens_per_minute": -5}, ValueError, "output_tokens_per_minute"),
        ({"output_tokens_per_minute": float("nan")}, ValueError, "output_tokens_per_minute"),
        ({"input_tokens_per_minute": "600"}, TypeError, "input_tokens_per_minute"),
        ({"output_tokens_per_minute": True}, TypeError, "output_tokens_per_minute"),
    ],
)
def test_bad_split_rates_name_the_parameter(
    kwargs: dict[str, Any], error: type, words: str
) -> None:
    """A bad split budget raises, naming the parameter and the value."""
    with pytest.raises(error, match=words):
        Rate(**kwargs)


# ---------------------------------------------------------------------- the arithmetic


def test_bucket_is_gcra_holding_its_burst() -> None:
    """A Bucket starts empty, refills at its rate up to ``tau`` seconds, pays and refunds;
    a provider's count sets it down always, up only within its first bucket of charges."""
    b = Bucket(60, 60.0, 0.0, None)  # 1 unit/s, holds 60
    assert b.left(0.0) == 0
    assert b.left(30.0) == 30
    assert b.left(100.0) == 60  # capped at the burst
    assert b.at(30.0, 10) == 30.0
    assert b.at(30.0, 40) == 40.0  # 10 more units of refill
    b.pay(30.0, 40)
    assert b.left(30.0) == -10  # a debt
    b.settle(-25, None)  # 25 refunded
    assert b.left(30.0) == 15
    assert (b.spent, b.back) == (40, 25)
    assert b.sync(30.0, left=5, since=0)  # a provider said 5: set down
    assert b.left(30.0) == 5
    assert b.sync(30.0, left=50, since=10)  # and up: 50 less our 10 since
    assert b.left(30.0) == 40
    assert b.sync(30.0, left=500, since=0)  # capped at the burst
    assert b.left(30.0) == 60
    assert not b.sync(30.0, left=500, since=0)  # already full
    b.pay(30.0, 100)  # net charges 115: past the first bucket (60 units)
    assert b.left(30.0) == -40
    assert not b.sync(30.0, left=50, since=0)  # no raise any more
    assert b.left(30.0) == -40
    assert b.sync(30.0, left=-50, since=0)  # lowering still applies
    assert b.left(30.0) == -50


def test_budgets_charge_the_input_and_output_parts_separately() -> None:
    """``tokens - out`` goes to the input budget, ``out`` to the output budget; the next
    cost waits for whichever budget is short."""
    budgets = Budgets(SPLIT, 0.0)
    now = SPLIT_BURST_S
    assert budgets.try_take_split(now, 150, 50)
    stats = budgets.statistics(now)
    assert (stats.input_tokens_available, stats.output_tokens_available) == (500, 10)
    assert stats.tokens_available is None
    assert not budgets.try_take_split(now, 30, 20)  # 10 output units short
    assert budgets.when(now, 30, out=20) == pytest.approx(now + 10.0)
    assert budgets.when(now, 30, out=0) == now  # all input: room now
    budgets.settle(-40, None, 0, -40)  # the answer used 10 of the 50 output tokens
    assert budgets.statistics(now).output_tokens_available == 50
    assert budgets.try_take_split(now, 30, 20)


def test_split_budgets_sit_beside_a_total_budget() -> None:
    """With tokens_per_minute as well, a cost must fit all three budgets."""
    budgets = Budgets(Rate(tokens_per_minute=6_000, output_tokens_per_minute=60), 0.0)
    now = SPLIT_BURST_S
    assert budgets.try_take_split(now, 100, 50)
    stats = budgets.statistics(now)
    assert stats.output_tokens_available == 10
    assert stats.tokens_available == 0  # a second's burst: 100 tokens
    assert stats.input_tokens_available is None
    assert budgets.when(now, 10, out=10) == pytest.approx(now + 0.1)  # the total's refill
    assert budgets.when(now, 30, out=30) == pytest.approx(now + 20.0)  # the output's


def test_mark_and_sync_count_our_net_charges_since() -> None:
    """A provider's ``remaining`` for each split kind sets that budget to it, less what this
    gate charged (net of settle refunds) after the mark."""
    budgets = Budgets(SPLIT, 0.0)
    now = SPLIT_BURST_S
    mark = budgets.mark(now)
    assert budgets.try_take_split(now, 120, 20)  # 100 input, 20 output since the mark
    budgets.settle(-10, None, 0, -10)  # 10 output back: net 10 output since
    assert budgets.lower_since(now, mark, None, None, input_tokens=300, output_tokens=55)
    stats = budgets.statistics(now)
    assert stats.input_tokens_available == pytest.approx(200)
    assert stats.output_tokens_available == pytest.approx(45)


# ---------------------------------------------------------------------- the gate


@pytest.mark.anyio
async def test_waiters_go_in_fifo_order_under_both_budgets(anyio_backend: Any) -> None:
    """A caller held by the output budget keeps later callers that need only input budget
    behind it (strict FIFO); a settle refund of the output part admits them in order.

    Two slots, one held by ``big``: each admission waits for the previous caller's
    release, so the order the callers resume in is the order they were admitted in."""
    gate = split_gate(2)
    big = gate.acquire_nowait(tokens=100, output_tokens=60)  # drains the output budget
    assert levels(gate) == (560, 0)
    admitted: list[str] = []

    async def call(name: str, tokens: int, out: int) -> None:
        async with gate.acquire(tokens=tokens, output_tokens=out):
            admitted.append(name)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            for name, tokens, out in (("a", 30, 20), ("b", 10, 0), ("c", 40, 30)):
                tg.start_soon(call, name, tokens, out)
                await anyio.wait_all_tasks_blocked()
            assert gate.waiting == 3  # b fits the budgets, but a is ahead
            assert admitted == []
            big.settle(tokens=45, output_tokens=5)  # 55 output tokens back
    assert admitted == ["a", "b", "c"]
    assert levels(gate) == (560 - 10 - 10 - 10, 55 - 20 - 30)
    big.release()


@pytest.mark.anyio
async def test_a_raise_from_headers_admits_the_waiting_head(anyio_backend: Any) -> None:
    """A provider's ``remaining`` above the gate's level raises a split budget and admits
    the waiter it was holding (nobody sleeps to its old timer)."""
    gate = split_gate()
    gate.acquire_nowait(tokens=60, output_tokens=60).release()  # output budget empty
    mark = gate.budget_mark()
    assert mark is not None
    admitted = anyio.Event()

    async def waiter() -> None:
        async with gate.acquire(tokens=30, output_tokens=30):
            admitted.set()

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            assert gate.waiting == 1
            learner = RateLearner(gate, ceiling=None, confirm=1, headroom=0.0)
            # The provider says 50 were left when the last request went (its bucket
            # started full, ours empty): the budget is set to 50.
            report = LimitReport(output_tokens=ReportedLimit(60, 50, 10.0, 60.0))
            assert learner.observe(report, sent=mark)
            await admitted.wait()


def test_settle_moves_the_output_part_once() -> None:
    """``settle(output_tokens=)`` charges or refunds only the difference; settling twice
    changes nothing; ``output_tokens=None`` keeps the part (capped at ``tokens``)."""
    gate = split_gate()
    token = gate.acquire_nowait(tokens=300, output_tokens=50)
    assert levels(gate) == (350, 10)
    token.settle(tokens=280, output_tokens=30)
    assert levels(gate) == (350, 30)
    token.settle(tokens=280, output_tokens=30)
    assert levels(gate) == (350, 30)
    token.settle(tokens=300)  # output part stays 30: the input part grows by 20
    assert levels(gate) == (330, 30)
    token.settle(tokens=20)  # output part capped at 20: input part 0
    assert levels(gate) == (600, 40)
    assert token.tokens == 20
    token.release()


def test_a_cost_without_output_tokens_is_all_input() -> None:
    """``acquire(tokens=)`` alone charges the input budget; the output part is settled later."""
    gate = split_gate()
    token = gate.acquire_nowait(tokens=200)
    assert levels(gate) == (400, 60)
    token.settle(tokens=250, output_tokens=50)
    assert levels(gate) == (400, 10)
    token.release()


def test_output_tokens_alone_are_the_total() -> None:
    """``acquire(output_tokens=)`` with ``tokens=None`` states no input part."""
    gate = split_gate()
    token = gate.acquire_nowait(output_tokens=25)
    assert token.tokens == 25
    assert levels(gate) == (600, 35)
    token.release()


def test_sync_acquire_states_the_output_part() -> None:
    """``acquire_sync(output_tokens=)`` charges as the async path does."""
    gate = split_gate()
    with gate.acquire_sync(tokens=100, output_tokens=40):
        assert levels(gate) == (540, 20)


def test_a_gate_without_split_budgets_ignores_the_output_part() -> None:
    """On a total-token budget, ``output_tokens`` only describes the cost: the total is charged."""
    now, clock = manual_clock()
    gate = Gate(rate=Rate(tokens_per_minute=600, burst_s=60), clock=clock)
    now[0] = 60.0
    token = gate.acquire_nowait(tokens=100, output_tokens=40)
    rate = gate.statistics().rate
    assert rate is not None
    assert rate.tokens_available == 500
    assert rate.output_tokens_available is None
    token.settle(tokens=50, output_tokens=10)
    rate = gate.statistics().rate
    assert rate is not None
    assert rate.tokens_available == 550
    token.release()


# ---------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        (
            {"tokens": 10, "output_tokens": 11},
            ValueError,
            r"output_tokens must be <= tokens.*11.*10",
        ),
        ({"tokens": 10, "output_tokens": -1}, ValueError, r"output_tokens must be >= 0.*-1"),
        ({"tokens": 10, "output_tokens": True}, TypeError, "output_tokens must be an int"),
        ({"tokens": 10, "output_tokens": 2.0}, TypeError, "output_tokens must be an int"),
        ({"tokens": 700}, ValueError, r"input_tokens_per_minute \(600\).*700"),
        (
            {"tokens": 800, "output_tokens": 100},
            ValueError,
            r"input part.*input_tokens_per_minute \(600\).*700",
        ),
        ({"tokens": 100, "output_tokens": 61}, ValueError, r"output_tokens_per_minute \(60\).*61"),
        ({"tokens": "5", "output_tokens": 1}, TypeError, "tokens must be an int"),
    ],
)
def test_bad_costs_are_refused_naming_the_constraint(
    kwargs: dict[str, Any], error: type, words: str
) -> None:
    """Every acquire variant refuses a bad cost, naming parameter, constraint and value;
    nothing is charged."""
    gate = split_gate()
    with pytest.raises(error, match=words):
        gate.acquire_nowait(**kwargs)
    with pytest.raises(error, match=words):
        gate.acquire_sync(**kwargs)
    with pytest.raises(error, match=words):
        gate.acquire(**kwargs)
    assert levels(gate) == (600, 60)
    assert gate.in_flight == 0


def test_a_bad_settle_changes_nothing() -> None:
    """``settle(output_tokens=)`` above ``tokens``, negative or not an int raises; the
    gate's budgets and the token's charge are unchanged."""
    gate = split_gate()
    token = gate.acquire_nowait(tokens=100, output_tokens=40)
    with pytest.raises(ValueError, match=r"output_tokens must be <= tokens.*50.*20"):
        token.settle(tokens=20, output_tokens=50)
    with pytest.raises(ValueError, match="output_tokens must be >= 0"):
        token.settle(tokens=20, output_tokens=-1)
    with pytest.raises(TypeError, match="output_tokens must be an int"):
        token.settle(tokens=20, output_tokens="1")  # type: ignore[arg-type]
    assert levels(gate) == (540, 20)
    assert token.tokens == 100
    token.release()


# ---------------------------------------------------------------------- headers


def test_headers_sync_both_split_budgets() -> None:
    """Anthropic's input- and output-token ``remaining`` set the split budgets, less this
    gate's charges since the request was sent; the total ``tokens-*`` sets no budget."""
    gate = split_gate()
    mark = gate.budget_mark()
    assert mark is not None
    gate.acquire_nowait(tokens=100, output_tokens=20).release()
    headers = {
        "anthropic-ratelimit-tokens-limit": "660",
        "anthropic-ratelimit-tokens-remaining": "300",
        "anthropic-ratelimit-input-tokens-limit": "600",
        "anthropic-ratelimit-input-tokens-remaining": "250",
        "anthropic-ratelimit-output-tokens-limit": "60",
        "anthropic-ratelimit-output-tokens-remaining": "50",
    }
    learner = RateLearner(gate, ceiling=None, confirm=1, headroom=0.0)
    assert learner.observe_headers(headers, sent=mark)
    assert levels(gate) == (250 - 80, 50 - 20)
    assert gate.rate is not None
    assert gate.rate.tokens_per_minute is None


def test_a_drained_split_limit_the_gate_paces_sets_its_level_without_a_hold() -> None:
    """A drained input limit on a gate with an input budget sets that budget to 0 (it
    refills continuously) instead of holding the gate until the reported reset, the time
    of a full refill; the request budget is not held either."""
    gate = split_gate(requests_per_minute=600)
    mark = gate.budget_mark()
    assert mark is not None
    learner = RateLearner(gate, ceiling=None, confirm=1, headroom=0.0)
    drained = LimitReport(input_tokens=ReportedLimit(600, 0, 60.0, 60.0))
    assert learner.observe(drained, sent=mark)
    assert learner.limits.holds == 0
    assert levels(gate) == (0, 60)
    rate = gate.statistics().rate
    assert rate is not None
    assert rate.next_admission_s < 1.0  # a call stating no tokens is not held
