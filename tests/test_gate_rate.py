"""Rate admission: budgets, the slope bound, weighted permits, settle and priority classes.

Time-dependent tests run on trio's ``MockClock`` with the gate's clock injected as
``anyio.current_time``, so admission times are exact. The contract tests that need no
clock run on every backend; cross-runtime tests use real threads and loops and assert
order, never durations.
"""

from __future__ import annotations

import asyncio
import copy
import math
import pickle
import random
import threading
from collections import Counter
from typing import Any

import anyio
import pytest

from anygate import Busy, Gate, Rate, RateStatistics, Token
from anygate._gate.budgets import Budgets
from anygate._gate.ledger import OVERTAKES

from .conftest import mock_clock

VIRTUAL = [mock_clock()]


def virtual_gate(capacity: float = math.inf, **rate: Any) -> Gate:
    return Gate(capacity, name="r", rate=Rate(**rate), clock=anyio.current_time)


async def fleet_admission_times(gate: Gate, calls: int) -> list[float]:
    """When each of ``calls`` callers starting together was admitted, in seconds from now."""
    start = anyio.current_time()
    times: list[float] = []

    async def call() -> None:
        async with gate.acquire():
            times.append(anyio.current_time() - start)

    async with anyio.create_task_group() as tg:
        for _ in range(calls):
            tg.start_soon(call)
    return times


# ----------------------------------------------------------------------------- Rate values


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"requests_per_minute": -1}, ValueError, "requests_per_minute.*-1"),
        ({"requests_per_minute": 0}, ValueError, "requests_per_minute.*0"),
        ({"requests_per_minute": math.nan}, ValueError, "requests_per_minute.*nan"),
        ({"requests_per_minute": math.inf}, ValueError, "requests_per_minute.*inf"),
        ({"requests_per_minute": 10**400}, ValueError, "requests_per_minute.*1329 bits"),
        ({"requests_per_minute": "60"}, TypeError, "requests_per_minute.*'60'.*str"),
        ({"requests_per_minute": True}, TypeError, "requests_per_minute.*True"),
        ({"tokens_per_minute": -5.0}, ValueError, "tokens_per_minute.*-5"),
        ({"ramp": 1.0}, ValueError, "ramp.*> 1.*1.0"),
        ({"ramp": 0.5}, ValueError, "ramp.*0.5"),
        ({"ramp": 2, "window_s": 0}, ValueError, "window_s.*0"),
        ({"ramp": 2, "window_s": -1}, ValueError, "window_s.*-1"),
        ({"requests_per_minute": 1, "burst_s": 0}, ValueError, "burst_s.*0"),
        ({"requests_per_minute": 1, "burst_s": 61}, ValueError, "burst_s.*61"),
        ({"ramp": 2, "ramp_floor": 0}, ValueError, "ramp_floor.*0"),
        ({"ramp": 2, "ramp_floor": 1.5}, TypeError, "ramp_floor.*1.5"),
        ({}, ValueError, "none of them"),
    ],
)
def test_bad_rate_values_name_parameter_and_value(
    kwargs: dict[str, Any], error: type[Exception], words: str
) -> None:
    """Every bad Rate argument raises TypeError/ValueError naming the parameter and value."""
    with pytest.raises(error, match=words):
        Rate(**kwargs)


def test_rate_is_a_frozen_keyword_only_value() -> None:
    """Rate compares by value, is immutable, takes keywords only and shows its fields."""
    a = Rate(requests_per_minute=60, ramp=2)
    assert a == Rate(requests_per_minute=60.0, ramp=2.0)
    assert a != Rate(requests_per_minute=61, ramp=2)
    with pytest.raises(AttributeError):
        a.ramp = 3.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        Rate(60)  # type: ignore[misc]
    assert "requests_per_minute=60.0" in repr(a)
    assert a.floor == 10  # ceil(window_s): one request per second from idle


def test_bad_gate_arguments_leave_the_gate_unchanged() -> None:
    """Bad rate, clock, tokens, priority and settle values raise and change nothing."""
    with pytest.raises(TypeError, match=r"rate must be an anygate.Rate"):
        Gate(rate=60)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"clock must be a callable"):
        Gate(clock=5)  # type: ignore[arg-type]
    gate = Gate(2, rate=Rate(tokens_per_minute=1000, burst_s=60))
    with pytest.raises(ValueError, match=r"tokens must be <= .*tokens_per_minute \(1000\).*1001"):
        gate.acquire_nowait(tokens=1001)
    with pytest.raises(ValueError, match=r"tokens must be >= 0.*-1"):
        gate.acquire_nowait(tokens=-1)
    with pytest.raises(TypeError, match=r"tokens must be an int.*1.5"):
        gate.acquire_nowait(tokens=1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"priority must be an int.*True"):
        gate.acquire_nowait(priority=True)
    with pytest.raises(TypeError, match=r"priority must be an int.*'high'"):
        gate.acquire(priority="high")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"priority must be between.*10000000000"):
        gate.acquire_sync(priority=10**10)
    with pytest.raises(TypeError, match=r"rate must be"):
        gate.rate = "fast"  # type: ignore[assignment]
    stats = gate.statistics()
    assert (stats.in_flight, stats.admitted, stats.rejected) == (0, 0, 0)
    assert gate.rate == Rate(tokens_per_minute=1000, burst_s=60)
    token = Gate(1).acquire_nowait()
    token.release()
    for bad, error in ((-3, ValueError), (2**60, ValueError), ("9", TypeError), (None, TypeError)):
        with pytest.raises(error, match="tokens must be"):
            token.settle(tokens=bad)  # type: ignore[arg-type]
    assert token.tokens == 0


def test_acquire_tokens_limit_is_a_minute_of_budget_rounded_down() -> None:
    """acquire()'s quick int check accepts exactly what the full check accepts: a whole
    minute of the token (and input-token) budget rounded down, 2**53 without a rate, and
    it follows a live rate change."""
    gate = Gate(rate=Rate(tokens_per_minute=1000.5, input_tokens_per_minute=700.9))
    gate.acquire(tokens=700)
    with pytest.raises(ValueError, match=r"input_tokens_per_minute \(700\.9\).*701"):
        gate.acquire(tokens=701)
    gate.acquire(tokens=1000, output_tokens=300)
    gate.rate = Rate(tokens_per_minute=1000.5)
    gate.acquire(tokens=1000)
    with pytest.raises(ValueError, match=r"tokens_per_minute \(1000\.5\).*1001"):
        gate.acquire(tokens=1001)
    gate.rate = None
    gate.acquire(tokens=2**53)
    with pytest.raises(ValueError, match=r"tokens must be >= 0 and <= 2\*\*53"):
        gate.acquire(tokens=2**53 + 1)
    assert gate.statistics().admitted == 0


def test_busy_carries_retry_after_and_pickles() -> None:
    """Busy keeps retry_after_s through pickling and says it in the message."""
    busy = Busy(gate="g", capacity=4, in_flight=1, waited=2.0, retry_after_s=7.5)
    again = pickle.loads(pickle.dumps(busy))
    assert again.retry_after_s == 7.5
    assert str(again) == str(busy)
    assert "7.5s" in str(busy)
    assert Busy(gate="g", capacity=4, in_flight=4, waited=0).retry_after_s is None


# ----------------------------------------------------------------------------- budgets


def _budget_fields(budgets: Budgets, now: float) -> dict[str, object]:
    """Every field of ``budgets`` as seen at ``now`` (the tick ring rolled on a copy: the
    paths roll it at different steps, to the same ring)."""
    budgets = copy.deepcopy(budgets)
    budgets._roll(now)
    fields: dict[str, object] = {}
    for cls in type(budgets).__mro__:
        for name in getattr(cls, "__slots__", ()):
            if name == "_allow" and not budgets._ramp:
                continue  # read only with a ramp; the fast path does not keep it without
            value = getattr(budgets, name)
            fields[name] = tuple(value) if isinstance(value, list) else value
    return fields


def test_fast_admission_decides_and_charges_as_the_general_path() -> None:
    """Budgets.try_take (the uncontended path, spelled out inline) admits exactly when
    when() says now and charges exactly what take() charges, over random rates, costs,
    gaps and settles: the inline arithmetic is the general path's, reordered."""
    rng = random.Random(20261205)
    for _ in range(60):
        kwargs: dict[str, float] = {}
        if rng.random() < 0.7:
            kwargs["requests_per_minute"] = rng.choice([1, 6, 60, 600, 6000, 1e6])
        if rng.random() < 0.7:
            kwargs["tokens_per_minute"] = rng.choice([100, 1000, 1e5, 1e7])
        if rng.random() < 0.4:
            kwargs["ramp"] = rng.choice([1.5, 2.0, 3.0])
        if rng.random() < 0.5:
            kwargs["burst_s"] = rng.choice([0.1, 1.0, 10.0, 60.0])
        if not kwargs.keys() & {"requests_per_minute", "tokens_per_minute", "ramp"}:
            kwargs["requests_per_minute"] = 60
        now = rng.choice([0.0, 12345.678])
        budgets = Budgets(Rate(**kwargs), now)
        for _ in range(200):
            now += rng.choice([0.0, 1e-6, 1e-3, 0.01, 0.1, 0.5, 1.0, rng.random()])
            most = min(budgets.max_tokens, 10**5)
            tokens = min(rng.choice([0, 1, 10, 100, rng.randint(0, most)]), most)
            general = copy.deepcopy(budgets)
            admitted = budgets.try_take(now, tokens)
            assert admitted == (general.when(now, tokens) <= now + 1e-9)
            if admitted:
                general.take(now, tokens)
            assert _budget_fields(budgets, now) == _budget_fields(general, now)
            if rng.random() < 0.1:
                budgets.settle(rng.randint(-50, 50), now)


@pytest.mark.parametrize("anyio_backend", VIRTUAL)
async def test_budget_starts_empty_and_refills_continuously(anyio_backend: Any) -> None:
    """60 rpm admits a fleet that starts at once at 1 s, 2 s, 3 s...: no full-bucket start."""
    gate = virtual_gate(requests_per_minute=60)
    times = await fleet_admission_times(gate, 5)
    assert times == pytest.approx([1.0, 2.0, 3.0, 4.0, 5.0])


@pytest.mark.parametrize("anyio_backend", VIRTUAL)
async def test_no_first_second_spike(anyio_backend: Any) -> None:
    """1200 rpm with the default 1 s burst admits 20 in the first second, not 1200."""
    gate = virtual_gate(requests_per_minute=1200)
    times = await fleet_admission_times(gate, 200)
    assert sum(1 for t in times if t <= 1.0 + 1e-9) == 20
    assert max(times) == pytest.approx(10.0)  # 200 requests at 20 per second


@pytest.mark.parametrize("anyio_backend", VIRTUAL)
async def test_cheap_request_never_overtakes_an_expensive_head(anyio_backend: Any) -> None:
    """FIFO for budget: a 1-token call queued behind a 600-token head goes after it."""
    gate = virtual_gate(tokens_per_minute=6000)  # 100 tokens/s, burst 100
    order: list[str] = []

    async def call(name: str, tokens: int) -> None:
        async with gate.acquire(tokens=tokens):
            order.append(name)

    async with anyio.create_task_group() as tg:
        tg.start_soon(call, "expensive", 600)
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(call, "cheap", 1)
        await anyio.wait_all_tasks_blocked()
        assert gate.waiting == 2
    assert order == ["expensive", "cheap"]


@pytest.mark.parametrize("anyio_backend", VIRTUAL)
async def test_settle_refund_wakes_the_next_waiter_once(anyio_backend: Any) -> None:
    """A settle that refunds admits the budget-bound head at once; settling again is a no-op."""
    gate = virtual_gate(tokens_per_minute=600, burst_s=60)  # 10 tokens/s, burst 600
    await anyio.sleep(60)  # fill the budget: 600 tokens
    start = anyio.current_time()
    big = await gate.acquire(tokens=600)
    admitted: list[float] = []

    async def second() -> None:
        async with gate.acquire(tokens=300):
            admitted.append(anyio.current_time() - start)

    async with anyio.create_task_group() as tg:
        tg.start_soon(second)
        await anyio.wait_all_tasks_blocked()
        assert gate.waiting == 1
        big.settle(tokens=200)  # used 200 of 600: 400 back, the waiter's 300 fit now
        await anyio.wait_all_tasks_blocked()
        assert admitted == [0.0]
        big.settle(tokens=200)  # the same value again: nothing more refunded
        big.release()
        big.settle(tokens=200)  # after release: still defined, still nothing refunded
    rate = gate.statistics().rate
    assert rate is not None
    assert rate.tokens_available == pytest.approx(600 - 200 - 300)


@pytest.mark.parametrize("anyio_backend", VIRTUAL)
async def test_settle_charge_creates_debt_that_later_callers_wait_out(anyio_backend: Any) -> None:
    """Unstated tokens cost 0 now; a settle charges after, and the next caller waits the debt."""
    gate = virtual_gate(tokens_per_minute=600)  # 10 tokens/s, burst 10
    await anyio.sleep(1)  # a full budget of 10
    with await gate.acquire() as token:
        assert token.tokens == 0
        token.settle(tokens=110)  # 10 in the budget, 100 owed: 10 s of refill
    start = anyio.current_time()
    async with gate.acquire():
        assert anyio.current_time() - start == pytest.approx(10.0)


@pytest.mark.parametrize("anyio_backend", VIRTUAL)
async def test_busy_at_once_when_admission_lies_beyond_timeout(anyio_backend: Any) -> None:
    """A wait that cannot be served in time fails immediately with the honest estimate."""
    gate = virtual_gate(requests_per_minute=6, burst_s=60)  # one per 10 s; first at 10 s
    start = anyio.current_time()
    with pytest.raises(Busy) as caught:
        await gate.acquire(timeout=1)
    assert anyio.current_time() == start  # at once, not after the timeout
    assert caught.value.retry_after_s == pytest.approx(10.0)
    with pytest.raises(Busy) as nowait:
        gate.acquire_nowait()
    assert nowait.value.retry_after_s == pytest.approx(10.0)
    stats = gate.statistics()
    assert (stats.timed_out, stats.rejected, stats.waiting) == (1, 1, 0)
    async with gate.acquire(timeout=10):
        assert anyio.current_time() - start == pytest.approx(10.0)


@pytest.mark.parametrize("anyio_backend", VIRTUAL)
async def test_live_rate_change_wakes_the_budget_bound_head(anyio_backend: Any) -> None:
    """Raising the rate while the head sleeps for budget admits it at the new, earlier time."""
    gate = virtual_gate(requests_per_minute=1, burst_s=60)  # first admission at 60 s
    start = anyio.current_time()
    admitted: list[float] = []

    async def call() -> None:
        async with gate.acquire():
            admitted.append(anyio.current_time() - start)

    async with anyio.create_task_group() as tg:
        tg.start_soon(call)
        await anyio.sleep(5)
        assert admitted == []
        # The budget keeps its level (5/60 of a request); at 600 rpm the rest takes 92 ms.
        gate.rate = Rate(requests_per_minute=600)
    assert admitted
    assert 5.0 <= admitted[0] < 5.1
    gate.rate = None
    assert gate.statistics().rate is None
    gate.acquire_nowait().release()  # no rate: no budget to wait for


@pytest.mark.parametrize("anyio_backend", VIRTUAL)
async def test_cancelled_budget_head_passes_its_turn_on(anyio_backend: Any) -> None:
    """Cancelling the head that sleeps for budget lets the next one set its own timer."""
    gate = virtual_gate(requests_per_minute=60)
    start = anyio.current_time()
    admitted: list[float] = []

    async def call() -> None:
        async with gate.acquire():
            admitted.append(anyio.current_time() - start)

    head = anyio.CancelScope()

    async def cancellable() -> None:
        with head:
            await call()

    async with anyio.create_task_group() as tg:
        tg.start_soon(cancellable)
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(call)
        await anyio.wait_all_tasks_blocked()
        assert gate.waiting == 2
        head.cancel()
    assert admitted == pytest.approx([1.0])
    assert gate.statistics().cancelled == 1


# ----------------------------------------------------------------------------- slope bound


@pytest.mark.parametrize("anyio_backend", VIRTUAL)
async def test_slope_bound_spreads_a_fleet_into_a_ramp_and_decays_after_idle(
    anyio_backend: Any,
) -> None:
    """Per window: at most ramp x previous + floor; after idle the ramp starts over."""
    gate = virtual_gate(requests_per_minute=6000, ramp=2.0, window_s=10, ramp_floor=5)
    start = anyio.current_time()
    times: list[float] = []

    async def call() -> None:
        async with gate.acquire():
            times.append(anyio.current_time() - start)

    async def fleet(n: int) -> None:
        async with anyio.create_task_group() as tg:
            for _ in range(n):
                tg.start_soon(call)

    await fleet(100)
    # Rounded: differences of virtual times carry float noise at window edges.
    per_window = Counter(int(round(t, 6) // 10) for t in times)
    assert [per_window[w] for w in range(4)] == [5, 15, 35, 45]
    await anyio.sleep(100)  # idle: the allowance decays back to the floor
    times.clear()
    restart = anyio.current_time() - start
    await fleet(20)
    assert sum(1 for t in times if t < restart + 10) == 5


# ----------------------------------------------------------------------------- priorities


@pytest.mark.parametrize("anyio_backend", VIRTUAL)
async def test_higher_class_first_but_lower_class_not_starved(anyio_backend: Any) -> None:
    """High-priority callers go first; the oldest low one goes after at most OVERTAKES of them."""
    gate = virtual_gate(1, requests_per_minute=60)
    order: list[str] = []
    holder = await gate.acquire()  # waits 1 s for the budget; now the gate is full

    async def call(name: str, priority: int) -> None:
        async with gate.acquire(priority=priority):
            order.append(name)

    async with anyio.create_task_group() as tg:
        tg.start_soon(call, "low", 0)
        await anyio.wait_all_tasks_blocked()
        for i in range(6):
            tg.start_soon(call, f"high{i}", 1)
            await anyio.wait_all_tasks_blocked()
        holder.release()
    assert order == [f"high{i}" for i in range(OVERTAKES)] + ["low"] + [
        f"high{i}" for i in range(OVERTAKES, 6)
    ]


async def test_priority_order_without_rate_on_every_backend(anyio_backend: Any) -> None:
    """Without a rate, a freed slot goes to the highest class, FIFO within it."""
    gate = Gate(1)
    holder = gate.acquire_nowait()
    order: list[str] = []

    async def call(name: str, priority: int) -> None:
        async with gate.acquire(priority=priority):
            order.append(name)

    async with anyio.create_task_group() as tg:
        for name, priority in (("a0", 0), ("b2", 2), ("c1", 1), ("d2", 2)):
            tg.start_soon(call, name, priority)
            await anyio.wait_all_tasks_blocked()
        holder.release()
    assert order == ["b2", "d2", "c1", "a0"]
    assert gate.statistics().waiting == 0


async def test_statistics_rate_view(anyio_backend: Any) -> None:
    """statistics().rate shows budget left, the next admission and admissions per window."""
    gate = Gate(rate=Rate(requests_per_minute=60, tokens_per_minute=1e6, burst_s=60))
    assert gate.statistics().rate is not None
    first = gate.statistics().rate
    assert isinstance(first, RateStatistics)
    assert first.requests_available is not None
    assert first.requests_available < 1
    assert first.next_admission_s > 0
    assert first.admitted_this_window == 0
    assert Gate(3).statistics().rate is None


# ----------------------------------------------------------------------------- runtimes


def test_budget_waiters_across_threads_and_loops_keep_fifo() -> None:
    """A thread, an asyncio loop and a trio run queue on one budget; they go in arrival order."""
    gate = Gate(rate=Rate(requests_per_minute=1200))  # one per 50 ms, real clock
    order: list[str] = []
    lock = threading.Lock()

    def record(name: str, token: Token) -> None:
        with lock:
            order.append(name)
        token.release()

    def in_thread() -> None:
        record("thread", gate.acquire_sync(timeout=30))

    async def in_loop(name: str) -> None:
        record(name, await gate.acquire(timeout=30))

    def run_asyncio() -> None:
        asyncio.run(in_loop("asyncio"))

    def run_trio() -> None:
        anyio.run(in_loop, "trio", backend="trio")

    threads = []
    for target, expected in ((in_thread, 1), (run_asyncio, 2), (run_trio, 3)):
        thread = threading.Thread(target=target)
        thread.start()
        threads.append(thread)
        while gate.waiting < expected and not order:
            threading.Event().wait(0.001)
    for thread in threads:
        thread.join(30)
    assert order == ["thread", "asyncio", "trio"]
    stats = gate.statistics()
    assert (stats.admitted, stats.in_flight, stats.waiting) == (3, 0, 0)


def test_acquire_sync_fails_at_once_when_budget_lies_beyond_timeout() -> None:
    """A blocking caller is refused without blocking when its admission is too far away."""
    gate = Gate(rate=Rate(requests_per_minute=1, burst_s=60))  # first admission in 60 s
    with pytest.raises(Busy) as caught:
        gate.acquire_sync(timeout=0.5)
    assert caught.value.retry_after_s is not None
    assert 59 < caught.value.retry_after_s <= 60
    assert gate.waiting == 0


# ----------------------------------------------------------------------------- config


def test_config_keys_build_the_rate_and_the_policy_passes_it_to_its_gate() -> None:
    """llm_call rate keys load into a Rate; the policy's shared gate gets it."""
    from anygate import Policy, load_config

    config = load_config(
        {
            "llm_call": {
                "gate_name": "rated",
                "requests_per_minute": 1200,
                "tokens_per_minute": 400_000,
                "ramp": 2,
                "ramp_window_s": 5,
            }
        }
    )
    rate = Rate(requests_per_minute=1200, tokens_per_minute=400_000, ramp=2, window_s=5)
    assert config.rate == rate
    assert config.to_mapping()["llm_call"]["ramp_window_s"] == 5
    policy = Policy.from_config(config)
    assert policy.gate.rate == rate
    from anygate import ConfigError

    with pytest.raises(ConfigError, match="already has rate"):
        Policy(gate_name="rated", rate=Rate(requests_per_minute=1))
    Policy(gate_name="rated", rate=Rate(requests_per_minute=1), reconfigure=True)
    assert policy.gate.rate == Rate(requests_per_minute=1)


def test_a_policy_is_compared_with_the_rate_its_gate_was_stated_not_the_live_one() -> None:
    """The live rate moves on its own (headers lower it, a published rate is stepped up):
    a policy made after that with the same settings is the same configuration (it once
    raised ConfigError, as every per-request ``Policy(...)`` of a web handler then did)."""
    import dataclasses

    from anygate import ConfigError, Policy

    stated = Rate(requests_per_minute=1200)
    first = Policy(name="stated", rate=stated, rate_is_ceiling=False)
    stepped = dataclasses.replace(stated, requests_per_minute=2400)
    first.gate.rate = stepped  # as the published rate's probe steps it
    again = Policy(name="stated", rate=stated, rate_is_ceiling=False)
    assert again.gate is first.gate
    assert again.gate.rate == stepped  # not set back: the gate's lesson stands
    with pytest.raises(ConfigError, match="already has rate") as info:
        Policy(name="stated", rate=Rate(requests_per_minute=600))
    assert "requests_per_minute=1200" in str(info.value)  # the stated rate is named
    Policy(name="stated", rate=Rate(requests_per_minute=600), reconfigure=True)
    assert first.gate.rate == Rate(requests_per_minute=600)
    Policy(name="stated", rate=Rate(requests_per_minute=600))  # the new statement


@pytest.mark.parametrize(
    ("llm", "words"),
    [
        ({"requests_per_minute": -1}, r"llm_call.requests_per_minute must be .*\(got -1\)"),
        ({"tokens_per_minute": "many"}, r"llm_call.tokens_per_minute must be .*'many'"),
        ({"ramp": 1}, r"llm_call.ramp must be a finite number > 1 .*\(got 1\)"),
        ({"ramp": 2, "ramp_window_s": 0}, r"llm_call.ramp_window_s must be .*\(got 0\)"),
        ({"ramp_window_s": 10}, "ramp_window_s needs llm_call.ramp"),
        ({"requests_per_minute": 10**13}, r"llm_call.requests_per_minute must be .*10000000000000"),
    ],
)
def test_bad_rate_config_names_the_key(llm: dict[str, Any], words: str) -> None:
    """Every bad rate key raises ConfigError naming the key path and the value."""
    from anygate import ConfigError, load_config

    with pytest.raises(ConfigError, match=words):
        load_config({"llm_call": llm})


def test_a_virtual_clock_gate_made_outside_its_run_and_leaked_after_it() -> None:
    """A gate on anyio.current_time may be built before the run (budgets start empty at
    first use) and a token leaked after the run ended is still reclaimed."""
    import gc
    import warnings

    import trio.testing

    gate = Gate(1, rate=Rate(requests_per_minute=60), clock=anyio.current_time)

    async def run() -> float:
        start = anyio.current_time()
        with await gate.acquire():  # the budget starts empty here: one request in 1 s
            pass
        await gate.acquire()  # dropped on the floor: a leak, collected after the run
        return anyio.current_time() - start

    clock = trio.testing.MockClock(autojump_threshold=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        took = anyio.run(run, backend="trio", backend_options={"clock": clock})
        gc.collect()
    assert took == pytest.approx(2.0)
    assert gate.in_flight == 0
    assert gate._leaked == 1


@pytest.mark.parametrize("anyio_backend", VIRTUAL)
async def test_budget_timer_that_finds_no_slot_keeps_waiting(anyio_backend: Any) -> None:
    """A head whose budget timer fires while capacity is 0 waits on; it is not Busy."""
    gate = virtual_gate(1, requests_per_minute=60)  # the first admission at 1 s
    start = anyio.current_time()
    admitted: list[float] = []

    async def call() -> None:
        async with gate.acquire(timeout=100):
            admitted.append(anyio.current_time() - start)

    async with anyio.create_task_group() as tg:
        tg.start_soon(call)
        await anyio.wait_all_tasks_blocked()
        gate.capacity = 0  # while it sleeps for the budget
        await anyio.sleep(5)  # its timer fired at 1 s and found no slot
        assert gate.waiting == 1
        gate.capacity = 1
    assert admitted == pytest.approx([5.0])
    assert gate.statistics().timed_out == 0


# ----------------------------------------------------------------------------- any period


def test_rate_per_any_period_is_the_per_minute_rate() -> None:
    """``Rate.per(T, requests=N, tokens=M)`` equals the per-minute spelling, any T."""
    assert Rate.per(1, requests=5) == Rate(requests_per_minute=300)
    assert Rate.per(30, requests=100, tokens=50_000) == Rate(
        requests_per_minute=200, tokens_per_minute=100_000
    )
    assert Rate.per(3600, requests=600, ramp=2, burst_s=60) == Rate(
        requests_per_minute=10, ramp=2, burst_s=60
    )
    assert Rate.per(10, ramp=1.5) == Rate(ramp=1.5)


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"seconds": 0, "requests": 1}, ValueError, r"seconds must be > 0 \(got 0\)"),
        ({"seconds": -2, "requests": 1}, ValueError, r"seconds.*-2"),
        ({"seconds": math.nan, "requests": 1}, ValueError, r"seconds.*nan"),
        ({"seconds": 86_401, "requests": 1}, ValueError, r"seconds.*86401"),
        ({"seconds": "1", "requests": 1}, TypeError, r"seconds.*'1'.*str"),
        ({"seconds": 1, "requests": 0}, ValueError, r"requests must be > 0 \(got 0\)"),
        ({"seconds": 1, "tokens": True}, TypeError, r"tokens.*True"),
        ({"seconds": 1e-300, "requests": 1e11}, ValueError, r"requests per seconds.*1e-300"),
        ({"seconds": 1}, ValueError, "Rate.per needs requests, tokens or ramp"),
        ({"seconds": 1, "requests": 1, "burst_s": 0}, ValueError, r"burst_s.*0"),
    ],
)
def test_bad_rate_per_values_name_parameter_and_value(
    kwargs: dict[str, Any], error: type[Exception], words: str
) -> None:
    """Every bad ``Rate.per`` argument names the parameter (as the caller spelled it)."""
    with pytest.raises(error, match=words):
        Rate.per(**kwargs)


@pytest.mark.parametrize("anyio_backend", VIRTUAL)
async def test_rate_per_second_paces_a_fleet(anyio_backend: Any) -> None:
    """2 requests per 5 s admits a fleet that starts at once every 2.5 s.

    The first waits the 1 s default ``burst_s`` (a request costs more than 1 s of refill,
    so it needs a full budget), each next one a request's 2.5 s of refill.
    """
    gate = Gate(name="r", rate=Rate.per(5, requests=2), clock=anyio.current_time)
    times = await fleet_admission_times(gate, 4)
    assert times == pytest.approx([1.0, 3.5, 6.0, 8.5])
