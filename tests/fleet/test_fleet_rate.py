"""The fleet rate and the bare local gate, in one test process (several fleet gates of
one name act as several processes; see ``test_fleet``)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import anyio
import pytest

import anygate
from anygate._gate.rate_math import TICKS
from anygate.fleet import FleetGate, FleetUnavailable
from anygate.fleet._scripts import KEY_NAMES, keys_for, prefix_for

from .test_fleet import eventually, make

if TYPE_CHECKING:
    from collections.abc import Callable

    from .redis_proc import RedisProc

pytestmark = pytest.mark.anyio
__all__ = ["make"]  # the fixture, shared with test_fleet


def _strings(reply: bytes) -> list[str]:
    lines = reply.split(b"\r\n")
    return [lines[i + 1].decode() for i, line in enumerate(lines[:-1]) if line.startswith(b"$")]


def _crc16(data: bytes) -> int:
    """CRC16-XMODEM, the checksum Redis Cluster maps keys to slots with."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def cluster_slot(key: str) -> int:
    """The Redis Cluster slot of ``key`` (the hash tag rule: the first ``{...}``)."""
    raw = key.encode()
    start = raw.find(b"{")
    if start >= 0:
        end = raw.find(b"}", start + 1)
        if end > start + 1:
            raw = raw[start + 1 : end]
    return _crc16(raw) % 16384


def test_every_key_of_a_gate_carries_one_hash_tag() -> None:
    """The declared keys and the hint lists all hash to the slot of the gate's name alone,
    and two gates' keys differ (so gates spread over shards)."""
    name = "llm-gpt"
    keys = [*keys_for(name), prefix_for(name) + "w:host:123:abcdef"]
    assert len(keys) == len(KEY_NAMES) + 1
    assert all(k.startswith("anygate:{llm-gpt}:") for k in keys)
    assert {cluster_slot(k) for k in keys} == {_crc16(b"llm-gpt") % 16384}
    assert cluster_slot(keys_for("other")[0]) != cluster_slot(keys[0])


async def test_every_key_a_gate_writes_is_under_its_hash_tag(
    redis_server: RedisProc, gate_name: str, make: Callable[..., FleetGate]
) -> None:
    """After leases, waiting, hints, a rate and a slope bound were used, every key Redis
    holds for the gate (SCAN over everything) carries the gate's one hash tag."""
    rate = anygate.Rate(requests_per_minute=6000, ramp=2.0, window_s=1.0)
    fleets = [make(gate_name, redis_server.url, capacity=2, rate=rate) for _ in range(2)]

    async def use(fleet: FleetGate) -> None:
        for _ in range(4):
            async with fleet.acquire(timeout=20):
                await anyio.sleep(0.01)

    async with anyio.create_task_group() as tg:
        for fleet in fleets:
            for _ in range(3):
                tg.start_soon(use, fleet)
    found: list[str] = []
    cursor = "0"
    while True:
        reply = _strings(redis_server.command("SCAN", cursor, "MATCH", f"*{gate_name}*"))
        cursor, batch = reply[0], reply[1:]
        found += batch
        if cursor == "0":
            break
    assert found
    assert all(k.startswith(prefix_for(gate_name)) for k in found), found
    assert any(k.endswith(":sl") for k in found)
    assert len({cluster_slot(k) for k in found}) == 1


async def test_bare_local_gate_fails_closed_with_fleet_unavailable(
    redis_factory: Callable[[], RedisProc], gate_name: str, make: Callable[..., FleetGate]
) -> None:
    """fleet.gate used bare (as Policy and the transports use it): when Redis goes away, a
    caller parked with no timeout, a parked thread and a newcomer all get FleetUnavailable
    (naming the fleet and the cause), not a connection error and not a hang."""
    server = redis_factory()
    fleet = make(gate_name, server.url, capacity=1)
    gate = fleet.gate
    holder = await gate.acquire(timeout=20)
    outcome: list[BaseException] = []
    thread_outcome: list[BaseException] = []

    async def parked() -> None:
        try:
            await gate.acquire()  # no timeout: only the fleet's outage can end this
        except FleetUnavailable as exc:
            outcome.append(exc)

    def parked_thread() -> None:
        try:
            gate.acquire_sync(timeout=60)
        except FleetUnavailable as exc:
            thread_outcome.append(exc)

    thread = threading.Thread(target=parked_thread)
    async with anyio.create_task_group() as tg:
        tg.start_soon(parked)
        thread.start()
        await eventually(lambda: gate.waiting == 2)
        server.stop()
        with anyio.fail_after(10):  # the parked callers have no (or a 60 s) timeout
            while not (outcome and thread_outcome):
                await anyio.sleep(0.01)
    await anyio.to_thread.run_sync(thread.join)
    for exc in (outcome[0], thread_outcome[0]):
        assert isinstance(exc, anygate.Busy)
        assert exc.fleet == gate_name
        assert "Redis at 127.0.0.1" in exc.cause
    with pytest.raises(FleetUnavailable):
        await gate.acquire(timeout=60)
    with pytest.raises(FleetUnavailable):
        gate.acquire_nowait()
    holder.release()
    assert gate.in_flight == 0
    server.start()
    with anyio.fail_after(15):
        while True:
            try:
                again = await gate.acquire(timeout=5)
                break
            except FleetUnavailable:
                await anyio.sleep(0.05)
    again.release()


async def test_settle_reaches_the_fleet_token_budget(
    redis_server: RedisProc, gate_name: str, make: Callable[..., FleetGate]
) -> None:
    """A settle in one process charges the fleet: another process's next caller is refused
    with the fleet's estimate (a debt of about 50 s at 1000 tokens/s)."""
    rate = anygate.Rate(tokens_per_minute=60_000, burst_s=1.0)
    first, second = (make(gate_name, redis_server.url, capacity=4, rate=rate) for _ in range(2))
    token = await first.acquire(timeout=20, tokens=10)
    token.settle(tokens=50_000)
    assert token.tokens == 50_000
    token.release()

    async def refused() -> float:
        try:
            (await second.acquire(timeout=1, tokens=1)).release()
        except FleetUnavailable:
            raise
        except anygate.Busy as exc:
            return -1.0 if exc.retry_after_s is None else exc.retry_after_s
        return 0.0

    with anyio.fail_after(20):
        while (wait := await refused()) < 10:  # until first's agent sent the settle
            await anyio.sleep(0.01)
    assert wait < 60


async def test_slope_bound_counts_on_redis_satisfy_the_bound(
    redis_server: RedisProc, gate_name: str, make: Callable[..., FleetGate]
) -> None:
    """With a ramp, the admissions the script counts per tick of Redis time satisfy
    count(window) <= ramp x count(previous window) + floor for every window of whole
    ticks (the script keeps the last two windows), over two processes; the slope, not the
    budget, bounds the admissions."""
    rate = anygate.Rate(requests_per_minute=600_000, ramp=2.0, window_s=0.5, ramp_floor=2)
    fleets = [make(gate_name, redis_server.url, capacity=8, rate=rate) for _ in range(2)]
    admitted = 0

    async def use(fleet: FleetGate) -> None:
        nonlocal admitted
        with anyio.move_on_after(2.0):
            while True:
                async with fleet.acquire(timeout=20):
                    admitted += 1

    history: dict[int, int] = {}

    def sample() -> None:
        flat = _strings(redis_server.command("HGETALL", prefix_for(gate_name) + "sl"))
        history.update({int(flat[i]): int(flat[i + 1]) for i in range(0, len(flat), 2)})

    async def sampler() -> None:
        # The script keeps two windows of ticks; sampling well within that keeps them all.
        while True:
            sample()
            await anyio.sleep(0.05)

    async with anyio.create_task_group() as tg:
        tg.start_soon(sampler)
        async with anyio.create_task_group() as users:
            for fleet in fleets:
                for _ in range(4):
                    users.start_soon(use, fleet)
        sample()
        tg.cancel_scope.cancel()
    assert history
    assert sum(history.values()) >= admitted  # permits given back unused stay counted
    # Every window of whole ticks ends at some tick: check each against the one before.
    for end in range(min(history), max(history) + 1):
        ring = [history.get(i, 0) for i in range(end - 2 * TICKS + 1, end + 1)]
        current, previous = sum(ring[TICKS:]), sum(ring[:TICKS])
        assert current <= 2.0 * previous + 2, (end, ring)
    assert 0 < admitted < 600_000 / 60 * 2.0 / 10  # the slope, not the budget, binds


def test_the_local_gate_rate_belongs_to_the_fleet(redis_server: RedisProc) -> None:
    """fleet.gate.rate shows the fleet rate and refuses to be set; bad rates name `rate`."""
    rate = anygate.Rate(requests_per_minute=60)
    fleet = FleetGate("t-rate-owned", capacity=1, url=redis_server.url, rate=rate)
    try:
        assert fleet.gate.rate == rate
        with pytest.raises(AttributeError, match="FleetGate"):
            fleet.gate.rate = anygate.Rate(requests_per_minute=120)
        stats = fleet.gate.statistics().rate
        assert stats is not None
        assert stats.rate == rate
    finally:
        fleet.close()
    bad: Any = "60/min"
    with pytest.raises(TypeError, match="rate"):
        FleetGate("t-rate-bad", capacity=1, rate=bad)


_DRAINED = {
    "x-ratelimit-limit-requests": "600",
    "x-ratelimit-remaining-requests": "0",
    "x-ratelimit-reset-requests": "20s",
    "x-ratelimit-limit-tokens": "100000",
    "x-ratelimit-remaining-tokens": "50000",
    "x-ratelimit-reset-tokens": "1s",
}


async def test_headers_teach_the_whole_fleet(
    redis_server: RedisProc, gate_name: str, make: Callable[..., FleetGate]
) -> None:
    """A drained report seen by one process: the limit it states is the fleet's rate (at
    the learner's headroom, under the fleet's own rate as the ceiling) in every process,
    and its hold holds the other process's callers too (its estimate: the 20 s reset).
    Nothing is synced to ``remaining`` (a fleet gate has no budget mark)."""
    rate = anygate.Rate(requests_per_minute=600, tokens_per_minute=100_000)
    first, second = (make(gate_name, redis_server.url, capacity=4, rate=rate) for _ in range(2))
    (await second.acquire(timeout=5)).release()
    assert first.gate.budget_mark() is None
    assert anygate.learn_from_headers(first.gate, _DRAINED) is True
    learned = anygate.Rate(requests_per_minute=540, tokens_per_minute=100_000)
    await eventually(lambda: first.rate == learned and second.rate == learned)
    assert second.gate.rate == learned
    with pytest.raises(anygate.Busy) as caught:
        (await second.acquire(timeout=1)).release()
    assert caught.value.retry_after_s is not None
    assert caught.value.retry_after_s > 10


async def test_an_answer_after_the_fleet_closed_raises_nothing(
    redis_server: RedisProc, gate_name: str, make: Callable[..., FleetGate]
) -> None:
    """A call in flight when its process closed the fleet gate still has its answer
    learned from (a transport does, in the response path): nothing changes, nothing
    raises, and the learner says so (it queued the change to the stopped agent and said
    the rate changed)."""
    rate = anygate.Rate(requests_per_minute=600, tokens_per_minute=100_000)
    fleet = make(gate_name, redis_server.url, capacity=2, rate=rate)
    (await fleet.acquire(timeout=5)).release()
    fleet.close()
    assert anygate.learn_from_headers(fleet.gate, _DRAINED) is False
    assert fleet.rate == rate


async def test_a_limit_stated_twice_paces_the_fleet_without_holding_it(
    redis_server: RedisProc, gate_name: str, make: Callable[..., FleetGate]
) -> None:
    """Two reports stating a limit with something used (the learner's ``confirm``): the
    fleet paces at 90 % of it in every process, and nothing holds its callers."""
    rate = anygate.Rate(requests_per_minute=100_000)
    first, second = (make(gate_name, redis_server.url, capacity=4, rate=rate) for _ in range(2))
    report = {
        "x-ratelimit-limit-requests": "6000",
        "x-ratelimit-remaining-requests": "5000",
        "x-ratelimit-reset-requests": "1s",
    }
    (await second.acquire(timeout=5)).release()  # its agent runs (from its first use)
    assert anygate.learn_from_headers(first.gate, report) is False  # one report: a streak
    assert anygate.learn_from_headers(first.gate, report) is True
    learned = anygate.Rate(requests_per_minute=5_400)
    await eventually(lambda: first.rate == learned and second.rate == learned)
    assert anygate.learn_from_headers(first.gate, report) is False  # the fleet's already
    for fleet in (first, second):
        (await fleet.acquire(timeout=5)).release()


async def test_a_rate_raised_live_is_not_learned_back_down(
    redis_server: RedisProc, gate_name: str, make: Callable[..., FleetGate]
) -> None:
    """A learner made while the fleet's rate was 600 a minute (its ceiling) in one
    process; a user raises the fleet's rate to 6,000 from another: the first process's
    learner then paces the fleet at what the provider states (4,500), not at its old
    ceiling of 600 (which set the whole fleet back to 600)."""
    rate = anygate.Rate(requests_per_minute=600)
    first, second = (make(gate_name, redis_server.url, capacity=4, rate=rate) for _ in range(2))
    (await first.acquire(timeout=5)).release()
    learner = anygate.RateLearner.of(first.gate)
    assert learner.ceiling == rate
    await second.set_rate(anygate.Rate(requests_per_minute=6_000))
    await eventually(lambda: first.rate == anygate.Rate(requests_per_minute=6_000))
    assert learner.ceiling == anygate.Rate(requests_per_minute=6_000)
    report = {
        "x-ratelimit-limit-requests": "5000",
        "x-ratelimit-remaining-requests": "4000",
        "x-ratelimit-reset-requests": "1s",
    }
    anygate.learn_from_headers(first.gate, report)
    assert anygate.learn_from_headers(first.gate, report) is True
    learned = anygate.Rate(requests_per_minute=4_500)
    await eventually(lambda: first.rate == learned and second.rate == learned)


async def test_a_drained_report_holds_a_fleet_failing_open_while_redis_is_down(
    redis_factory: Callable[[], RedisProc], gate_name: str, make: Callable[..., FleetGate]
) -> None:
    """Redis down, the gate failing open (each process paces to its share of the rate,
    locally): a drained report holds that local share until the reset too, not only the
    fleet's budgets once Redis answers again (before, this process went on admitting)."""
    server = redis_factory()
    rate = anygate.Rate(requests_per_minute=600_000)
    fleet = make(
        gate_name, server.url, capacity=4, rate=rate, on_unavailable="open", fallback_capacity=2
    )
    (await fleet.acquire(timeout=5)).release()
    server.stop()
    await eventually(lambda: fleet.statistics().unavailable is not None)
    await eventually(lambda: fleet.gate.capacity == 2)
    (await fleet.acquire(timeout=5)).release()  # the local share admits
    assert anygate.learn_from_headers(fleet.gate, _DRAINED) is True
    with pytest.raises(anygate.Busy) as caught:
        (await fleet.acquire(timeout=1)).release()
    assert not isinstance(caught.value, FleetUnavailable)
    assert caught.value.retry_after_s is not None
    assert caught.value.retry_after_s > 10


async def test_a_policys_call_through_a_drained_fleet_goes_on(
    redis_server: RedisProc, gate_name: str, make: Callable[..., FleetGate]
) -> None:
    """A policy on ``fleet.gate`` whose call gets a 429 saying the bucket is drained for
    a second: the fleet holds, and the retry goes through after it (before, learning on
    a fleet gate raised AttributeError in the transports' path)."""
    rate = anygate.Rate(requests_per_minute=600, tokens_per_minute=100_000)
    fleet = make(gate_name, redis_server.url, capacity=4, rate=rate)
    gate = fleet.gate
    policy = anygate.Policy(
        gate=gate, retry=anygate.RetryConfig(throttle_attempts=3), adaptive_concurrency=False
    )
    answers = [
        anygate.ResponseError(429, headers={**_DRAINED, "x-ratelimit-reset-requests": "1s"}),
        None,
    ]

    async def provider() -> str:
        answer = answers.pop(0)
        if answer is not None:
            raise answer
        return "ok"

    with anygate.set_testing(True), anyio.fail_after(20):
        assert await policy.call(provider) == "ok"
    assert not answers


async def test_a_fleet_gates_rate_is_never_probed(
    redis_server: RedisProc, gate_name: str, make: Callable[..., FleetGate]
) -> None:
    """A policy stating the fleet's rate as published (``rate_is_ceiling=False``) on
    ``fleet.gate``: the rate is every process's, so its adaptive limit does not probe it
    (a step would set a rate the local gate refuses, in a call's success path), and calls
    go through with the rate as it was."""
    rate = anygate.Rate(requests_per_minute=600)
    fleet = make(gate_name, redis_server.url, capacity=4, rate=rate)
    gate = fleet.gate
    policy = anygate.Policy(gate=gate, rate=rate, rate_is_ceiling=False)
    assert not policy.adaptive_limit.probes_published_rate

    async def provider() -> str:
        return "ok"

    with anyio.fail_after(20):
        assert await policy.call(provider) == "ok"
    assert gate.rate == rate
