"""Split input/output token budgets (Anthropic's ITPM / OTPM) on a fleet gate.

Several fleet gates of one name act as several processes (see ``test_fleet``). The split
budgets live in the ``meta`` hash (``itat`` / ``otat``, ms of Redis ``TIME``); each test
seeds them 10 s into debt of their 60 s bucket, so the levels are known (500 input, 50
output tokens, plus what refills during the test) and every charge and refund moves a
``tat`` by exactly ``units x T`` (it stays ahead of Redis time): the assertions compare
those fields exactly, never a clock.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import pytest

import anygate
from anygate._gate.budgets import Budgets
from anygate.fleet import FleetUnavailable
from anygate.fleet._permits import POLL_S, FleetBudgets, Returned, rate_share
from anygate.fleet._redis import RATELESS, Link
from anygate.fleet._scripts import prefix_for

from .test_fleet import eventually, make

if TYPE_CHECKING:
    from collections.abc import Callable

    from anygate.fleet import FleetGate

    from .redis_proc import RedisProc

pytestmark = pytest.mark.anyio
__all__ = ["make"]  # the fixture, shared with test_fleet

# Input: 600 tokens/minute (T = 100 ms), output: 60 tokens/minute (T = 1000 ms); both
# hold a minute of refill (600 / 60 tokens).
SPLIT = anygate.Rate(input_tokens_per_minute=600, output_tokens_per_minute=60)
IN_T, OUT_T = 100, 1000
DEBT_MS = 10_000  # the seed: levels 500 input, 50 output


def _bulk(reply: bytes) -> list[str | None]:
    """The elements of a flat RESP array of bulk strings, ``None`` for a nil (``$-1``)."""
    lines = reply.split(b"\r\n")
    out: list[str | None] = []
    i = 1
    while i < len(lines) and lines[i].startswith(b"$"):
        if lines[i] == b"$-1":
            out.append(None)
            i += 1
        else:
            out.append(lines[i + 1].decode())
            i += 2
    return out


def redis_ms(server: RedisProc) -> int:
    sec, usec = _bulk(server.command("TIME"))
    assert sec is not None
    assert usec is not None
    return int(sec) * 1000 + int(usec) // 1000


def seed(server: RedisProc, name: str) -> int:
    """Put both split budgets ``DEBT_MS`` into debt now; returns the ``tat`` they got."""
    tat = redis_ms(server) + DEBT_MS
    server.command("HSET", prefix_for(name) + "meta", "itat", tat, "otat", tat)
    return tat


def tats(server: RedisProc, name: str) -> tuple[float | None, float | None]:
    """The split budgets' ``tat`` fields (``None``: not written)."""
    i, o = _bulk(server.command("HMGET", prefix_for(name) + "meta", "itat", "otat"))
    return (None if i is None else float(i)), (None if o is None else float(o))


def test_the_permit_pool_keeps_each_part() -> None:
    """The pool a process's local gate admits from covers a caller only if the permits'
    input and output parts do; a caller who never ran gives its parts back, settles are
    kept per part, and a call to Redis takes all of it (pure arithmetic, no Redis)."""
    pool = FleetBudgets(SPLIT)
    assert pool.split
    assert pool.max_tokens == 600  # a cost with no output part is all input
    pool.deposit(2, 150, -math.inf, 100, 50)  # two permits: 100 input, 50 output tokens
    assert not pool.try_take_split(0.0, 60, 55)  # 55 output > 50
    assert pool.when(0.0, 60, out=55) > 0.0
    assert pool.try_take_split(0.0, 100, 40)  # 60 input, 40 output
    stats = pool.statistics(0.0)
    assert (stats.input_tokens_available, stats.output_tokens_available) == (40, 10)
    assert pool.when(0.0, 50, out=10) == 0.0  # covered: 40 input, 10 output
    pool.refund(1, 100, 40)  # that caller never ran
    pool.settle(-30, None, -10, -20)  # a settle to 30 fewer: 10 input, 20 output
    assert pool.settled()
    returned = pool.withdraw()
    assert (returned.permits, returned.inputs, returned.outputs) == (2, 100, 50)
    # Refunds are > 0; no total-token budget, so nothing settles on one.
    assert (returned.adjust, returned.input_adjust, returned.output_adjust) == (0, 10, 20)
    assert not pool.settled()
    assert pool.withdraw() == Returned()


def test_a_head_redis_did_not_time_is_asked_for_at_once() -> None:
    """Redis's "next permit at" is for the caller it stopped at: it bounds a head needing
    at least as much of every part, and callers behind; a head needing less of a part
    (all input after a refusal for output tokens) makes the agent ask at once, once per
    call (pure arithmetic, no Redis)."""
    pool = FleetBudgets(SPLIT)
    pool.withdraw([(30, 30)])  # the agent asks for one caller: 30 tokens, all output
    pool.deposit(0, 0, 25.0)  # none granted; it conforms at 25 s
    assert pool.when(0.0, 40, out=35) == 25.0  # more of every part
    assert not pool.retry
    assert pool.when(0.0, 30, 1, 30, out=0) == 25.0  # behind someone
    assert pool.when(0.0, 30, out=0) == POLL_S  # all input: not bounded
    assert pool.retry  # the agent asks now, not at 25 s
    pool.withdraw([(30, 0)])
    pool.deposit(0, 0, 5.0)  # the answer to that call
    assert not pool.retry
    assert pool.when(0.0, 1, out=0) == 5.0  # bounded until the next call
    assert not pool.retry


def test_open_mode_paces_each_process_to_its_share_of_every_budget() -> None:
    """Redis unreachable in ``open`` mode: a process paces to the fleet rate divided by the
    processes last seen, split budgets included, with the local gate's split arithmetic."""
    rate = anygate.Rate(requests_per_minute=60, burst_s=2.0, **_split_kw(600, 60))
    share = rate_share(rate, 3)
    assert share == anygate.Rate(requests_per_minute=20, burst_s=2.0, **_split_kw(200, 20))
    pool = FleetBudgets(SPLIT)
    pool.fallback = Budgets(rate_share(SPLIT, 2), 0.0)  # 300 input, 30 output a minute
    now = 60.0  # both full
    assert pool.try_take_split(now, 40, 30)  # the whole output share
    assert not pool.try_take_split(now, 1, 1)  # no output token left
    assert pool.try_take_split(now, 10, 0)  # all input: room
    stats = pool.statistics(now)
    assert (stats.input_tokens_available, stats.output_tokens_available) == (280, 0)
    pool.settle(-20, None, 0, -20)  # 20 output tokens refunded, locally
    assert pool.statistics(now).output_tokens_available == 20
    assert not pool.settled()  # nothing to send to Redis for it


def _split_kw(inputs: float, outputs: float) -> dict[str, float]:
    return {"input_tokens_per_minute": inputs, "output_tokens_per_minute": outputs}


async def refused(fleet: FleetGate, **kwargs: Any) -> anygate.Busy:
    """The :class:`anygate.Busy` (not an outage) an acquire that should not fit raises."""
    with pytest.raises(anygate.Busy) as info:
        (await fleet.acquire(timeout=5, **kwargs)).release()
    assert not isinstance(info.value, FleetUnavailable)
    return info.value


async def test_split_budgets_are_shared_by_the_fleet(
    redis_server: RedisProc, gate_name: str, make: Callable[..., FleetGate]
) -> None:
    """One process spends 45 of the fleet's 50 output tokens: another is refused a call
    needing 30 output tokens (with the fleet's estimate, about 25 s), yet admitted one of
    30 input tokens at once; Redis charged each part to its own budget, exactly."""
    start = seed(redis_server, gate_name)
    first, second = (make(gate_name, redis_server.url, capacity=4, rate=SPLIT) for _ in range(2))
    token = await first.acquire(timeout=20, tokens=100, output_tokens=45)
    assert tats(redis_server, gate_name) == (start + 55 * IN_T, start + 45 * OUT_T)

    busy = await refused(second, tokens=30, output_tokens=30)
    assert busy.retry_after_s is not None
    assert busy.retry_after_s > 10  # 25 output tokens short at 1 token/s, less the test's time
    assert tats(redis_server, gate_name) == (start + 55 * IN_T, start + 45 * OUT_T)

    # At once, as on a local gate: the output budget's wait does not bound an all-input
    # call (whether or not second's agent has called Redis since the refusal).
    async with second.acquire(timeout=20, tokens=30, output_tokens=0):
        pass
    assert tats(redis_server, gate_name) == (start + 85 * IN_T, start + 45 * OUT_T)
    token.release()


async def test_settles_move_each_part_fleet_wide(
    redis_server: RedisProc, gate_name: str, make: Callable[..., FleetGate]
) -> None:
    """A settle to fewer output tokens refunds them to the fleet (another process's call
    that did not fit then fits); a settle to more charges them, into debt, so the other
    process is refused again; the input part moves only by its own difference; a settle
    after the release (no lease left to renew) still reaches the fleet."""
    start = seed(redis_server, gate_name)
    first, second = (make(gate_name, redis_server.url, capacity=4, rate=SPLIT) for _ in range(2))
    token = await first.acquire(timeout=20, tokens=100, output_tokens=50)
    await refused(second, tokens=40, output_tokens=35)  # ~0 output tokens left
    # Its lease went back: that call also told the pool nobody waits on a permit now.
    await eventually(lambda: second.statistics().held == 0)

    token.settle(tokens=60, output_tokens=10)  # input part 50 -> 50, output 50 -> 10
    assert token.tokens == 60
    expected = (start + 50 * IN_T, start + 10 * OUT_T)
    await eventually(lambda: tats(redis_server, gate_name) == expected)

    late = await second.acquire(timeout=20, tokens=40, output_tokens=35)  # the 40 refunded
    late.release()
    expected = (start + 55 * IN_T, start + 45 * OUT_T)
    assert tats(redis_server, gate_name) == expected

    token.settle(tokens=200, output_tokens=150)  # input 50 -> 50, output 10 -> 150
    expected = (start + 55 * IN_T, start + 185 * OUT_T)
    await eventually(lambda: tats(redis_server, gate_name) == expected)
    busy = await refused(second, tokens=1, output_tokens=1)
    assert busy.retry_after_s is not None
    assert busy.retry_after_s > 60  # ~135 output tokens of debt at 1 token/s

    token.settle(tokens=300)  # the output part stays 150: input 50 -> 150
    expected = (start + 155 * IN_T, start + 185 * OUT_T)
    await eventually(lambda: tats(redis_server, gate_name) == expected)

    token.release()  # usage often arrives after the slot went back
    await eventually(lambda: first.statistics().held == 0)  # no heartbeat carries it now
    token.settle(tokens=100, output_tokens=100)  # input 150 -> 0, output 150 -> 100
    expected = (start + 5 * IN_T, start + 135 * OUT_T)
    await eventually(lambda: tats(redis_server, gate_name) == expected)


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        (
            {"tokens": 10, "output_tokens": 11},
            ValueError,
            r"output_tokens must be <= tokens.*\(got output_tokens=11, tokens=10\)",
        ),
        ({"tokens": 10, "output_tokens": -1}, ValueError, r"output_tokens must be >= 0.*-1"),
        ({"tokens": 10, "output_tokens": "5"}, TypeError, "output_tokens must be an int"),
        (
            {"tokens": 100, "output_tokens": 61},
            ValueError,
            r"output_tokens must be <= the gate's output_tokens_per_minute \(60\).*got 61",
        ),
        (
            {"tokens": 700, "output_tokens": 50},
            ValueError,
            r"input part .* must be <= the gate's input_tokens_per_minute \(600\).*got 650",
        ),
        ({"tokens": 601}, ValueError, r"input_tokens_per_minute \(600\).*got 601"),
    ],
)
async def test_bad_split_costs_are_refused_and_change_nothing(
    redis_server: RedisProc,
    gate_name: str,
    make: Callable[..., FleetGate],
    kwargs: dict[str, Any],
    error: type[Exception],
    words: str,
) -> None:
    """A bad cost raises from every acquire method, naming the parameter, the constraint
    and the value, as the local gate does; nothing is queued, admitted or charged, on the
    local pool or on Redis (checked after the agent's next call)."""
    start = seed(redis_server, gate_name)
    fleet = make(gate_name, redis_server.url, capacity=2, rate=SPLIT)
    (await fleet.acquire(timeout=20, tokens=10, output_tokens=5)).release()
    await eventually(lambda: fleet.statistics().held == 0)  # linger 0: the lease went back
    before = tats(redis_server, gate_name)
    assert before == (start + 5 * IN_T, start + 5 * OUT_T)
    rate_before = fleet.gate.statistics().rate
    with pytest.raises(error, match=words):
        fleet.acquire(**kwargs)
    with pytest.raises(error, match=words):
        fleet.acquire_nowait(**kwargs)
    with pytest.raises(error, match=words):
        fleet.acquire_sync(**kwargs)  # refused before it could block the loop
    assert (fleet.gate.in_flight, fleet.gate.waiting) == (0, 0)
    assert fleet.gate.statistics().rate == rate_before
    calls = fleet.statistics().redis_calls
    async with fleet.acquire(timeout=20):  # a call to Redis after the bad ones
        pass
    await eventually(lambda: fleet.statistics().redis_calls > calls + 1)
    assert tats(redis_server, gate_name) == before


async def test_a_bad_settle_changes_nothing_fleet_wide(
    redis_server: RedisProc, gate_name: str, make: Callable[..., FleetGate]
) -> None:
    """A settle with output_tokens above tokens, negative, or not an int raises naming
    them; the token's charge and the fleet's budgets are unchanged."""
    start = seed(redis_server, gate_name)
    fleet = make(gate_name, redis_server.url, capacity=2, rate=SPLIT)
    token = await fleet.acquire(timeout=20, tokens=100, output_tokens=40)
    before = tats(redis_server, gate_name)
    assert before == (start + 60 * IN_T, start + 40 * OUT_T)
    with pytest.raises(ValueError, match=r"output_tokens must be <= tokens.*50.*20"):
        token.settle(tokens=20, output_tokens=50)
    with pytest.raises(ValueError, match=r"output_tokens must be >= 0.*-1"):
        token.settle(tokens=20, output_tokens=-1)
    with pytest.raises(TypeError, match="output_tokens must be an int"):
        token.settle(tokens=20, output_tokens="1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"tokens must be >= 0.*-5"):
        token.settle(tokens=-5, output_tokens=0)
    assert token.tokens == 100
    token.release()
    await eventually(lambda: fleet.statistics().held == 0)  # the agent called Redis since
    assert tats(redis_server, gate_name) == before


async def test_a_fleet_without_split_budgets_leaves_meta_as_before(
    redis_server: RedisProc, gate_name: str, make: Callable[..., FleetGate]
) -> None:
    """A total-token fleet rate writes no split field: the ``meta`` hash holds what older
    agents wrote, so they and this version share the keys unchanged."""
    rate = anygate.Rate(requests_per_minute=6000, tokens_per_minute=600_000)
    fleet = make(gate_name, redis_server.url, capacity=2, rate=rate)
    async with fleet.acquire(timeout=20, tokens=10) as token:
        token.settle(tokens=5)
    await eventually(lambda: fleet.statistics().held == 0)
    fields = _bulk(redis_server.command("HKEYS", prefix_for(gate_name) + "meta"))
    assert {"cap", "epoch", "rtat", "ttat"} <= set(fields)  # type: ignore[operator]
    assert not {"itat", "otat"} & set(fields)  # type: ignore[operator]


async def test_the_script_takes_an_older_agents_arguments(
    redis_server: RedisProc, gate_name: str
) -> None:
    """An agent of the previous version sends 25 arguments (no split part): the script
    grants it leases and runs its request budget as before, and writes no split field."""
    link = Link(redis_server.url, gate_name, op_timeout=2.0)
    rate = list(RATELESS)
    rate[0] = repr(6000.0)  # requests/minute
    rate[2] = repr(1000.0)  # burst ms
    rate[4] = "0,0"  # two queued callers
    async with link.session() as session:
        reply = await session.call(
            "old:1:abcdef",
            keep=0,
            demand=2,
            wantmax=2,
            want=2,
            cap=2,
            lease_ms=2000,
            ticket_ms=500,
            grace_ms=0,
            newcomer_ms=0,
            rate=rate,
            split=(),
        )
    assert reply.held == 2
    fields = _bulk(redis_server.command("HKEYS", prefix_for(gate_name) + "meta"))
    assert "rtat" in fields
    assert tats(redis_server, gate_name) == (None, None)
