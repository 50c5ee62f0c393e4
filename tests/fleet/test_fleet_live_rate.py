"""A live fleet rate (``FleetGate.set_rate``): one process changes the rate, Redis charges
every process's permits at it from then on, and each process adopts it (several fleet
gates of one name act as several processes; see ``test_fleet``)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import anyio
import pytest

import anygate
from anygate.fleet import FleetGate
from anygate.fleet._ratescript import parse_rate_wire, rate_wire

from .test_fleet import eventually, make

if TYPE_CHECKING:
    from collections.abc import Callable

    from .redis_proc import RedisProc

pytestmark = pytest.mark.anyio
__all__ = ["make"]  # the fixture, shared with test_fleet

#: A request a minute: at it, a second admission waits about a minute (budgets hold one
#: second of refill and start empty), far beyond any wait below.
SLOW = anygate.Rate(requests_per_minute=1)
FAST = anygate.Rate(requests_per_minute=600_000)


async def refusal(fleet: FleetGate, within: float) -> anygate.Busy | None:
    """One acquire (released at once); its refusal, or ``None`` when admitted."""
    try:
        token = await fleet.acquire(timeout=within)
    except anygate.Busy as exc:
        return exc
    token.release()
    return None


async def admitted(fleet: FleetGate, n: int, *, within: float = 0.5) -> int:
    """How many of ``n`` acquires in a row get a permit within ``within`` seconds each."""
    return sum([await refusal(fleet, within) is None for _ in range(n)])


@pytest.mark.parametrize(
    "rate",
    [
        SLOW,
        anygate.Rate(requests_per_minute=600, tokens_per_minute=90_000.5, burst_s=2.5),
        anygate.Rate(requests_per_minute=60, ramp=1.5, window_s=30),
        anygate.Rate(ramp=3, window_s=0.5, ramp_floor=7),
        anygate.Rate(input_tokens_per_minute=1e6, output_tokens_per_minute=1.5e5),
        anygate.Rate.per(1, requests=3),
    ],
)
def test_a_live_rate_travels_through_redis_unchanged(rate: anygate.Rate) -> None:
    """The layout the script keeps (and reads the slope's floor from) reads back equal."""
    wire = rate_wire(rate)
    assert parse_rate_wire(wire) == rate
    assert wire.split(",")[8] == str(rate.floor)


@pytest.mark.parametrize("wire", ["", "1,2,3", "x,,,,1.0,,10.0,,10", ",,,,1.0,,10.0,,10"])
def test_a_live_rate_no_rate_could_have_written_is_refused(wire: str) -> None:
    with pytest.raises((TypeError, ValueError)):
        parse_rate_wire(wire)


async def test_a_live_rate_reaches_every_process(
    redis_server: RedisProc, gate_name: str, make: Callable[..., FleetGate]
) -> None:
    """At a request a minute the second process gets one permit at most; once the first
    set the fleet rate fast, Redis grants the second process's callers at once (its own
    ``rate=`` is still the slow one when it asks) and the second adopts the rate from
    that reply. A process started afterwards with the slow ``rate=`` adopts it too."""
    first, second = (make(gate_name, redis_server.url, capacity=2, rate=SLOW) for _ in range(2))
    assert await admitted(second, 3) <= 1
    await first.set_rate(FAST)
    assert first.rate == FAST  # its own call's reply carried it
    assert first.gate.rate == FAST
    # Idle (it holds no lease), the second is woken to hear it: its estimate of the
    # next permit (a minute away at the old rate) goes with it.
    await eventually(lambda: second.rate == FAST)
    assert await admitted(second, 20, within=5) == 20
    assert second.rate == FAST
    assert second.statistics().rate == FAST
    assert second.statistics().rate_version == 1
    stats = second.gate.statistics().rate
    assert stats is not None
    assert stats.rate == FAST
    later = make(gate_name, redis_server.url, capacity=2, rate=SLOW)
    assert await admitted(later, 20, within=5) == 20
    assert later.rate == FAST


async def test_a_lower_live_rate_holds_every_process(
    redis_server: RedisProc, gate_name: str, make: Callable[..., FleetGate]
) -> None:
    """The other way: after a fast start, a rate of one a minute set from one process
    holds the other's callers at once, with the fleet's estimate of the wait."""
    first, second = (make(gate_name, redis_server.url, capacity=2, rate=FAST) for _ in range(2))
    assert await admitted(second, 5, within=5) == 5
    await anyio.to_thread.run_sync(lambda: first.set_rate_sync(SLOW))
    assert first.rate == SLOW
    # A budget keeps its level in units, capped at what the new one holds: the fast one
    # was full, so the slow one holds its second of refill (a 60th of a request), admits
    # one request within a second (the budgets' burst), then none for a minute.
    refused = await refusal(second, 3) or await refusal(second, 3)
    assert refused is not None
    assert second.rate == SLOW
    assert refused.retry_after_s is not None
    assert refused.retry_after_s > 10


async def test_a_process_keeps_the_live_rate_when_redis_loses_it(
    redis_server: RedisProc, gate_name: str, make: Callable[..., FleetGate]
) -> None:
    """Redis flushed: the version goes back to none, and each process keeps the rate it
    adopted (nothing raises, admissions go on at it)."""
    first, second = (make(gate_name, redis_server.url, capacity=2, rate=SLOW) for _ in range(2))
    await first.set_rate(FAST)
    assert await admitted(second, 2, within=5) == 2
    redis_server.command("FLUSHALL")
    assert await admitted(second, 5, within=5) == 5
    assert second.rate == FAST
    assert second._ensure_agent().rate_version == 0


def test_a_bad_live_rate_names_the_parameter_and_changes_nothing(redis_server: RedisProc) -> None:
    """Refused before anything reaches Redis, the rate left as it was."""
    split = anygate.Rate(input_tokens_per_minute=1000, output_tokens_per_minute=100)
    plain = FleetGate("t-live-bad", capacity=1, url=redis_server.url, rate=SLOW)
    rateless = FleetGate("t-live-none", capacity=1, url=redis_server.url)
    try:
        bad: Any = "60/min"
        cases: list[tuple[FleetGate, Any, dict[str, Any], type[Exception], str]] = [
            (plain, None, {}, TypeError, "rate must be an anygate.Rate"),
            (plain, bad, {}, TypeError, "rate"),
            (plain, split, {}, ValueError, "split"),
            (plain, FAST, {"timeout": 0}, ValueError, "timeout"),
            (plain, FAST, {"timeout": "5"}, TypeError, "timeout"),
            (rateless, FAST, {}, ValueError, "has no rate"),
        ]
        for fleet, value, kwargs, error, words in cases:
            with pytest.raises(error, match=words):
                fleet.set_rate_sync(value, **kwargs)
        assert plain.rate == SLOW
        assert rateless.rate is None
        plain.close()
        with pytest.raises(RuntimeError, match="closed"):
            plain.set_rate_sync(FAST)
        with pytest.raises(RuntimeError, match="closed"):
            plain.set_capacity_sync(3)
    finally:
        plain.close()
        rateless.close()


async def test_set_rate_from_threads_and_loops_at_once(
    redis_server: RedisProc, gate_name: str, make: Callable[..., FleetGate]
) -> None:
    """Two threads and a task set rates at once: each call returns once Redis applied
    its rate, and every process ends on the same one, the last Redis applied."""
    first, second = (make(gate_name, redis_server.url, capacity=2, rate=SLOW) for _ in range(2))
    rates = [anygate.Rate(requests_per_minute=600_000 + i) for i in range(3)]
    threads = [
        threading.Thread(target=first.set_rate_sync, args=(rates[i],), kwargs={"timeout": 10})
        for i in (0, 1)
    ]
    for thread in threads:
        thread.start()
    await second.set_rate(rates[2], timeout=10)
    for thread in threads:
        await anyio.to_thread.run_sync(thread.join)
    assert await admitted(first, 2, within=5) == 2
    assert await admitted(second, 2, within=5) == 2
    assert first.rate == second.rate
    assert first.rate in rates


async def test_a_process_of_another_shape_keeps_its_estimates(
    redis_server: RedisProc,
    gate_name: str,
    make: Callable[..., FleetGate],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Processes given different budgets (a misconfiguration): a live rate with split
    budgets set by one is not adopted by one without them, which says why in the log
    and goes on admitting (the script charges it the budgets it has)."""
    split = anygate.Rate(
        requests_per_minute=600_000, input_tokens_per_minute=1e7, output_tokens_per_minute=1e6
    )
    plain = make(gate_name, redis_server.url, capacity=2, rate=FAST)
    other = make(gate_name, redis_server.url, capacity=2, rate=split)
    assert await admitted(plain, 1, within=5) == 1
    caplog.set_level("WARNING", logger="anygate.fleet")
    await other.set_rate(
        anygate.Rate(
            requests_per_minute=600_001, input_tokens_per_minute=2e7, output_tokens_per_minute=1e6
        )
    )
    await eventually(lambda: "split input/output budgets" in caplog.text)
    assert plain.rate == FAST
    assert await admitted(plain, 3, within=5) == 3
