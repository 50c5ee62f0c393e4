"""The latency limit for queueing servers (issue 30 item 5): pure arithmetic, then on an
adaptive limit driving a gate on a manual clock, then through real calls on trio's
MockClock against a fake local model server that queues what its slots cannot serve."""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING, Any

import anyio
import pytest

import anygate
from anygate import AdaptiveConfig, AdaptiveLimit, ConfigError, Gate, Policy
from anygate._config.limit_values import DEFAULT_HOLD_S
from anygate._limits.latency import PROBE_MULTIPLIER, TOLERANCE, LatencyLimit
from tests.conftest import mock_clock
from tests.policy_helpers import FakeClock

if TYPE_CHECKING:
    from collections.abc import Callable

# --------------------------------------------------------------------------- arithmetic


def _queued(slots: int, service: float, level: int) -> float:
    """A queueing server's latency at ``level`` calls in flight: the service time, and
    beyond the slots, the queue's share of it."""
    return service * max(1.0, level / slots)


def _drive(limit: LatencyLimit, slots: int, service: float, samples: int) -> list[float]:
    """A gate kept full at the estimate's limit in front of a queueing server; the limits
    it went through."""
    seen = []
    current = limit.limit
    assert current is not None
    for _ in range(samples):
        level = max(1, math.floor(current + 1e-9))
        new = limit.observe(_queued(slots, service, level), level)
        assert new is not None
        current = new
        seen.append(current)
    return seen


def _ramp(limit: LatencyLimit, slots: int, service: float, top: int = 20) -> None:
    """An uncapped fleet's start: one call sent at each level from 1 to ``top``."""
    for level in range(1, top + 1):
        limit.observe(_queued(slots, service, level), level)


def test_the_limit_rises_while_latency_stays_at_no_load() -> None:
    """Every call answered in the no-load time: each level served them all at once, so the
    limit stays over the calls in flight (1.5x, or one more)."""
    limit = LatencyLimit()
    assert limit.limit is None
    seen = [limit.observe(4.0, level) for level in range(1, 9)]
    assert seen == [max(TOLERANCE * n, n + 1) for n in range(1, 9)]
    assert limit.no_load_latency == 4.0
    assert limit.slots == 8


def test_latency_that_grows_with_in_flight_stops_the_limit_at_the_slots() -> None:
    """A server with 4 slots: from the fifth call in flight on, latency grows with the
    queue. The limit stops at 1.5 x 4 while the fleet's calls in flight reach 20."""
    limit = LatencyLimit()
    _ramp(limit, slots=4, service=4.0)
    assert limit.slots == pytest.approx(4.0)
    assert limit.limit == pytest.approx(TOLERANCE * 4)
    seen = _drive(limit, slots=4, service=4.0, samples=500)
    assert set(seen[-50:]) == {TOLERANCE * 4}


def test_a_one_slot_server_gets_one_call_queued_not_one_and_a_half() -> None:
    """At one slot the limit is the slots plus one (1.5 would floor to 1 and never look
    at a second slot)."""
    limit = LatencyLimit()
    _ramp(limit, slots=1, service=4.0, top=5)
    assert limit.limit == 2.0


def test_a_server_that_lost_slots_brings_the_limit_down() -> None:
    """4 slots, then 2: the level the gate sits at reads a longer queue, and once the
    levels of the old server are out of memory the limit is 1.5 x 2."""
    limit = LatencyLimit()
    _ramp(limit, slots=4, service=4.0)
    _drive(limit, slots=4, service=4.0, samples=300)
    seen = _drive(limit, slots=2, service=4.0, samples=1000)
    assert seen[-1] == pytest.approx(TOLERANCE * 2)
    assert limit.slots == pytest.approx(2.0)


def test_a_server_that_gained_slots_is_found() -> None:
    """4 slots, then 8: the level over the slots stops queueing, the limit climbs."""
    limit = LatencyLimit()
    _ramp(limit, slots=4, service=4.0)
    _drive(limit, slots=4, service=4.0, samples=300)
    seen = _drive(limit, slots=8, service=4.0, samples=1000)
    assert seen[-1] == pytest.approx(TOLERANCE * 8)


@pytest.mark.parametrize("service", [8.0, 2.0])
def test_a_changed_no_load_latency_is_relearned(service: float) -> None:
    """The server got twice as slow (or fast) with the same 4 slots: the probe down
    samples an unqueued level again, the no-load latency follows, and the limit goes
    back to 1.5 x 4."""
    limit = LatencyLimit()
    _ramp(limit, slots=4, service=4.0)
    _drive(limit, slots=4, service=4.0, samples=300)
    seen = _drive(limit, slots=4, service=service, samples=2000)
    assert limit.no_load_latency == pytest.approx(service)
    assert seen[-1] == pytest.approx(TOLERANCE * 4)


def test_the_limit_probes_down_once_per_memory() -> None:
    """Once per memory (30 x the limit's samples) the limit drops to two thirds of the
    slots until a call sent at that level answers, then returns."""
    limit = LatencyLimit()
    _ramp(limit, slots=6, service=4.0)
    seen = _drive(limit, slots=6, service=4.0, samples=2000)
    dips = [i for i, value in enumerate(seen) if value < TOLERANCE * 6]
    assert dips
    assert {seen[i] for i in dips} == {6 / TOLERANCE}
    assert seen[-1] == TOLERANCE * 6 or limit.probing
    # At most one dip per memory, each ended by one answer at the lower level.
    assert len(dips) <= len(seen) / (PROBE_MULTIPLIER * TOLERANCE * 6) + 1


def test_floor_and_ceiling_bound_the_limit() -> None:
    """Never above the ceiling however fast the answers, never below the floor however
    long the queue; new bounds apply at the next sample."""
    limit = LatencyLimit(ceiling=5, floor=3)
    for level in range(1, 11):
        limit.observe(4.0, level)
    assert limit.limit == 5
    queued = LatencyLimit(ceiling=5, floor=3)
    _ramp(queued, slots=1, service=4.0, top=8)
    assert queued.limit == 3
    queued.bound(ceiling=5, floor=1)
    queued.observe(8.0, 2)
    assert queued.limit == 2


def test_a_probe_down_goes_no_lower_than_the_floor() -> None:
    """A floor above two thirds of the slots (a published count the latencies never take
    the gate below): the probe waits for an answer at the floor, the least level the
    gate still sends at, not for one below it that never comes (a published 16 waited
    90 s at 16 of 32 slots for an answer at 13)."""
    limit = LatencyLimit(floor=16)
    _ramp(limit, slots=32, service=4.0, top=48)
    seen = _drive(limit, slots=32, service=4.0, samples=3000)
    dips = [i for i, value in enumerate(seen) if value < TOLERANCE * 32]
    assert dips
    assert {seen[i] for i in dips} == {math.floor(32 / TOLERANCE)}  # above the floor
    floored = LatencyLimit(floor=24)
    _ramp(floored, slots=32, service=4.0, top=48)
    seen = _drive(floored, slots=32, service=4.0, samples=3000)
    dips = [i for i, value in enumerate(seen) if value < TOLERANCE * 32]
    assert dips
    assert {seen[i] for i in dips} == {24}  # the floor, and each ends at its first answer
    assert all(b != a + 1 for a, b in itertools.pairwise(dips))


@pytest.mark.parametrize(
    ("latency", "in_flight"), [(0.0, 1), (-1.0, 1), (math.nan, 1), (math.inf, 1), (1.0, 0)]
)
def test_samples_that_say_nothing_are_ignored(latency: float, in_flight: int) -> None:
    """A latency that is not positive and finite, or no call in flight, changes nothing."""
    limit = LatencyLimit()
    assert limit.observe(latency, in_flight) is None
    limit.observe(4.0, 1)
    assert limit.observe(latency, in_flight) == 2.0
    assert limit.no_load_latency == 4.0


# --------------------------------------------------------------------------- on a gate


def _success(limit: AdaptiveLimit, clock: FakeClock, latency: float, in_flight: int) -> None:
    sent = clock.now
    clock.now += latency
    limit.on_success(saturated=True, sent_at=sent, in_flight=in_flight)


def test_an_uncapped_gate_follows_the_latency_estimate() -> None:
    """With the option on, an uncapped gate gets the estimate as its capacity; the
    statistics say what was learned."""
    clock = FakeClock()
    gate = Gate(math.inf, name="lat-uncapped", clock=clock)
    limit = AdaptiveLimit(gate, clock=clock, latency=True)
    assert limit.latency
    for level in range(1, 9):
        _success(limit, clock, _queued(2, 4.0, level), level)
    assert gate.capacity == 3  # 1.5 x 2 slots
    stats = limit.statistics()
    assert stats.latency
    assert stats.latency_limit == pytest.approx(3.0)
    assert stats.no_load_latency_s == pytest.approx(4.0)


def test_the_option_is_off_by_default() -> None:
    """Off, the same answers change nothing: the gate stays uncapped."""
    clock = FakeClock()
    gate = Gate(math.inf, name="lat-off", clock=clock)
    limit = AdaptiveLimit(gate, clock=clock)
    for level in range(1, 9):
        _success(limit, clock, _queued(2, 4.0, level), level)
    assert gate.capacity == math.inf
    stats = limit.statistics()
    assert not stats.latency
    assert stats.latency_limit is None


def test_the_estimate_never_lifts_the_gate_past_its_maximum_or_a_throttle() -> None:
    """The estimate is a second ceiling: under the configured maximum, and under what a
    concurrency 429 taught; never below min_concurrent_calls."""
    clock = FakeClock()
    gate = Gate(4, name="lat-capped", clock=clock)
    limit = AdaptiveLimit(gate, clock=clock, latency=True)
    for level in range(1, 5):
        _success(limit, clock, 4.0, level)  # no queue: the estimate is 6
    assert limit.statistics().latency_limit == 4  # bounded by the maximum
    assert gate.capacity == 4
    change = limit.on_concurrency(limit.generation, 4, exact=True)
    assert change is not None
    assert gate.capacity == 3
    _success(limit, clock, 4.0, 3)
    assert gate.capacity == 3  # the throttle's limit, not the latency, decides
    floored = Gate(8, name="lat-floor", clock=clock)
    limit = AdaptiveLimit(floored, clock=clock, latency=True, min_concurrent_calls=3)
    for level in range(1, 9):
        _success(limit, clock, _queued(1, 4.0, level), level)  # one slot: 2 would do
    assert floored.capacity == 3


def test_turning_it_on_and_off_live() -> None:
    """configure(latency=...) applies at once; off gives the gate its limit back."""
    clock = FakeClock()
    gate = Gate(math.inf, name="lat-live", clock=clock)
    limit = AdaptiveLimit(gate, clock=clock)
    limit.configure(latency=True)
    for level in range(1, 6):
        _success(limit, clock, _queued(1, 4.0, level), level)
    assert gate.capacity == 2
    limit.configure(latency=False)
    assert gate.capacity == math.inf
    assert limit.statistics().latency_limit is None


# --------------------------------------------------------------------------- settings


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_latency_must_be_a_bool(value: object) -> None:
    """A non-bool is a TypeError naming the setting and the value."""
    gate = Gate(4)
    with pytest.raises(TypeError, match=r"latency must be a bool \(got"):
        AdaptiveLimit(gate, latency=value)  # type: ignore[arg-type]
    limit = AdaptiveLimit(gate)
    if value is not None:
        with pytest.raises(TypeError, match="latency must be a bool or None"):
            limit.configure(latency=value)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["on", 1, [True]])
def test_the_setting_loads_from_yaml_and_is_checked(value: object) -> None:
    """llm_call.adaptive_concurrency.latency: a bool; anything else names the key."""
    config = anygate.load_config({"llm_call": {"adaptive_concurrency": {"latency": True}}})
    assert config.adaptive_concurrency.latency is True
    assert config.adaptive_concurrency.effective()["latency"] is True
    assert config.to_mapping()["llm_call"]["adaptive_concurrency"]["latency"] is True
    assert anygate.load_config({}).adaptive_concurrency.effective()["latency"] is False
    with pytest.raises(ConfigError, match=r"llm_call\.adaptive_concurrency\.latency"):
        anygate.load_config({"llm_call": {"adaptive_concurrency": {"latency": value}}})
    with pytest.raises(TypeError, match="latency"):
        AdaptiveConfig(latency=value)  # type: ignore[arg-type]


def test_policies_on_one_gate_must_agree_about_latency() -> None:
    """A second policy stating the other value fails unless reconfigure=True."""
    gate = Gate(4, name="latency-agree")
    Policy(gate=gate, adaptive_concurrency=AdaptiveConfig(latency=True))
    with pytest.raises(ConfigError, match="latency"):
        Policy(gate=gate, adaptive_concurrency=AdaptiveConfig(latency=False))
    policy = Policy(gate=gate, adaptive_concurrency=AdaptiveConfig(latency=False), reconfigure=True)
    assert not policy.adaptive_limit.latency


# --------------------------------------------------------------------------- a policy


class _LocalServer:
    """A local model server with ``slots`` that queues the rest, each call taking
    ``service(done)`` seconds; it records the calls at it on each arrival (with the calls
    done by then)."""

    def __init__(self, slots: int, service: Any) -> None:
        self._slots = anyio.Semaphore(slots)
        self._service = service
        self.at_server = 0
        self.arrivals: list[tuple[int, int]] = []  # (calls done, calls at the server)
        self.done = 0

    async def __call__(self) -> str:
        self.at_server += 1
        self.arrivals.append((self.done, self.at_server))
        try:
            async with self._slots:
                await anyio.sleep(self._service(self.done))
        finally:
            self.at_server -= 1
        self.done += 1
        return "ok"


async def _agents(policy: Policy, server: Any, agents: int, calls: int) -> float:
    """``agents`` agents each making ``calls`` calls back to back; the virtual seconds
    the run took (trio's MockClock). Agents log on 10 ms apart: started in one tick, trio
    would run them (and reach the server) in random order, and the calls in flight at
    each one's admission would not be the queue ahead of it (the estimate's premise)."""

    async def agent() -> None:
        for _ in range(calls):
            assert await policy.call(server) == "ok"

    start = anyio.current_time()
    async with anyio.create_task_group() as tg:
        for _ in range(agents):
            tg.start_soon(agent)
            await anyio.sleep(0.01)
    return anyio.current_time() - start


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", [mock_clock()])
@pytest.mark.parametrize("latency", [True, False])
async def test_a_policy_settles_near_a_queueing_servers_slots(latency: bool) -> None:
    """24 agents, each making 20 calls back to back, against a local model server with 4
    slots that queues the rest (a semaphore in front of a 1.6-2.4 s service time). With the
    option on, at most 1.5 x 4 (+1) calls are at the server once learned, and it never
    idles; off, all 24 are there (the server's queue holds 20)."""
    # 1.6 to 2.4 s, 2 s on average: calls that all took one time would finish (and be
    # replaced) in lockstep batches of 4.
    server = _LocalServer(4, lambda done: 2.0 * (0.8 + 0.1 * (done % 5)))

    policy = Policy(
        name=f"latency-{latency}",
        gate=Gate(math.inf, name=f"local-{latency}", clock=anyio.current_time),
        clock=anyio.current_time,
        adaptive_concurrency=AdaptiveConfig(latency=latency),
    )

    virtual_s = await _agents(policy, server, agents=24, calls=20)
    assert server.done == 24 * 20
    late = [n for done, n in server.arrivals if done >= 24 * 10]  # the second half
    assert late
    if latency:
        # At most 1.5 x 4 at the server in the end (7 as the estimate moves; up to 3 x 4
        # on the way, while transients after a probe read as slots), and never fewer than
        # its slots for long: the run takes the server's own time, 480 calls / 4 x 2 s.
        assert max(late[-100:]) <= TOLERANCE * 4 + 1
        assert max(late) <= 3 * 4
        assert virtual_s <= 1.05 * 480 / 4 * 2.0  # trio MockClock
        stats = policy.adaptive_limit.statistics()
        assert stats.no_load_latency_s == pytest.approx(2.0, rel=0.21)  # 1.6 to 2.4
        assert stats.latency_limit is not None
        assert stats.latency_limit <= TOLERANCE * 4 + 1  # (2 while it probes down)
    else:
        assert max(late) == 24


# --------------------------------------------------------------------------- published slots


def _served(limit: AdaptiveLimit, clock: FakeClock, latency: float, in_flight: int) -> None:
    """A success as a policy reports it: got through with ``in_flight`` at the server
    (the most that got through), then its latency."""
    limit.passed(clock.now, in_flight)
    _success(limit, clock, latency, in_flight)


def test_a_published_slot_count_is_raised_by_latencies_that_show_no_queue() -> None:
    """``concurrency_is_ceiling=False``: the gate starts one past the maximum (the
    known-good level); answers that queued nothing take it up to the estimate (1.5 x the
    slots shown), past the maximum, which the configuration keeps."""
    clock = FakeClock()
    gate = Gate(1, name="pub-slots", clock=clock)
    limit = AdaptiveLimit(gate, clock=clock)
    assert not limit.probes_published_slots
    limit._probe_published_slots(True)
    assert limit.probes_published_slots
    assert gate.capacity == 2  # nothing answered yet: one past the published count
    level = 1
    for _ in range(8):  # a server with 8 slots: no queue at any of these levels
        _served(limit, clock, 4.0, level)
        level = int(gate.capacity)
    assert gate.capacity > 8
    assert limit.max_concurrent_calls == 1  # the statement stands
    limit._probe_published_slots(False)
    assert gate.capacity == 1  # a ceiling again


def test_a_one_slot_server_keeps_one_call_queued_over_its_published_slot() -> None:
    clock = FakeClock()
    gate = Gate(1, name="pub-one", clock=clock)
    limit = AdaptiveLimit(gate, clock=clock)
    limit._probe_published_slots(True)
    assert gate.capacity == 2  # one past the count from the start
    level = 1  # the first call went alone, and a queue answers it first
    for _ in range(20):
        _served(limit, clock, _queued(1, 4.0, level), level)
        level = int(gate.capacity)
    assert gate.capacity == 2  # max(1.5 x 1, 1 + 1): one serving, one queued


@pytest.mark.parametrize("refusal", ["concurrency 429", "busy 503"])
def test_a_refusal_caps_the_raise_at_the_calls_in_flight_less_one(refusal: str) -> None:
    """A hosted API's latency says nothing of its slots: the raise goes until the
    provider refuses, and from then on stays under the calls in flight at the refusal
    less one; a refusal within the published count says nothing of the slots above."""
    clock = FakeClock()
    gate = Gate(4, name=f"pub-cap-{refusal}", clock=clock)
    limit = AdaptiveLimit(gate, clock=clock)
    limit._probe_published_slots(True)
    for level in range(4, 7):
        _served(limit, clock, 4.0, level)
    assert gate.capacity > 6
    if refusal == "concurrency 429":
        limit.on_concurrency(limit.generation, 7, exact=True)
    else:
        limit.on_refusal(7, slots=True)
    assert gate.capacity == 6
    for level in range(6, 12):
        _served(limit, clock, 4.0, level)
    assert gate.capacity == 6  # the latencies go no higher than the refusal allowed
    limit.on_refusal(3)  # a refusal within the published count: nothing about the slots above
    assert gate.capacity == 6


def test_a_concurrency_429_above_the_count_keeps_the_gate_at_the_slots() -> None:
    """A provider that refuses at its slots queues nothing: once a concurrency 429 above
    the published count says where they are, answers that look queued (their own
    lengths) no longer take the gate below them. They held a published 16 with 32 real
    slots at 18-25 for two minutes (morning peak, seed 5: 1.36x the oracle)."""
    clock, gate, limit = _raised("pub-found", top=9)
    limit.on_concurrency(limit.generation, 8, exact=True)
    assert gate.capacity == 7
    for _ in range(10):
        for level in range(4, 10):
            _success(limit, clock, 4.0 * level, level)  # longer answers at each level
    assert limit.statistics().latency_limit is not None
    assert limit.statistics().latency_limit < 7  # read as a queue...
    assert gate.capacity == 7  # ...which a refusing provider does not have
    limit.on_concurrency(limit.generation, 7, exact=True)
    assert gate.capacity == 6  # a lower refusal still lowers it
    limit._probe_published_slots(False)
    assert gate.capacity == 4  # a ceiling again: the count


def _raised(name: str, *, top: int) -> tuple[FakeClock, Gate, AdaptiveLimit]:
    """A published 4 raised by answers that queued nothing, at every level up to ``top``."""
    clock = FakeClock()
    gate = Gate(4, name=name, clock=clock)
    limit = AdaptiveLimit(gate, clock=clock)
    limit._probe_published_slots(True)
    for level in range(4, top + 1):
        _served(limit, clock, 4.0, level)
    return clock, gate, limit


def test_a_refusal_that_need_not_be_the_slots_caps_the_raise_for_a_hold() -> None:
    """A refusal the slots are only suspected of (a plain 429) above the published
    count and above the most that got through at once: the raise stays under the calls
    in flight less one for a hold, then goes on one past the most seen through; refused
    there again, for twice as long. For good, the morning peak's ramp held a published
    16 with 32 real slots near 20 for the run (1.61x the oracle)."""
    clock, gate, limit = _raised("pub-held", top=6)
    assert gate.capacity > 7
    limit.on_refusal(8)
    assert gate.capacity == 7
    _served(limit, clock, 4.0, 6)
    assert gate.capacity == 7  # held
    clock.now += DEFAULT_HOLD_S
    _served(limit, clock, 4.0, 7)
    assert gate.capacity == 8  # the hold is over: one past the most seen through
    limit.on_refusal(8)  # refused there again: twice the hold
    assert gate.capacity == 7
    clock.now += DEFAULT_HOLD_S
    _served(limit, clock, 4.0, 6)
    assert gate.capacity == 7
    clock.now += DEFAULT_HOLD_S
    _served(limit, clock, 4.0, 6)
    assert gate.capacity == 8


@pytest.mark.parametrize("busy", [False, True])
def test_a_refusal_at_a_count_that_got_through_before_is_not_the_slots(busy: bool) -> None:
    """A refusal with no more calls at the provider than once got through together says
    nothing of the slots (a slope rule's plain 429, a shared pool's, an outage's 503):
    the raise goes on. A slope rule's plain 429 at 17, after 29 had got through, held a
    published 16 with 32 real slots at 16 for 30 s (plain 429s, seed 2); an outage's
    "overloaded" 503s, read as a full queue's "busy", held it at 16 for good."""
    _, gate, limit = _raised(f"pub-seen-{busy}", top=9)
    before = gate.capacity
    assert before > 9
    limit.on_refusal(9, slots=busy)
    assert gate.capacity == before


def test_a_window_429_shows_a_server_that_refuses_and_the_raise_goes_one_past() -> None:
    """A 429 naming the slope's or a minute's window holds nothing, but only a hosted
    API sends one: the latencies (its answers' lengths) no longer set the raise, which
    goes one past the most seen through instead of the estimate's jump. Jumping, a
    published 16 with 32 real slots went to 51 and sent 13 calls past the slots at once
    (morning peak, seed 1); held to the latencies, the outage scenario's ramp stayed at
    16 (seeds 3-4: 1.15x the oracle)."""
    clock, gate, limit = _raised("pub-window", top=6)
    assert gate.capacity == 9  # the estimate's jump: 1.5 x 6
    limit.on_refusal(3, window=True)  # at any count
    assert gate.capacity == 7  # one past the most seen through (6)
    _served(limit, clock, 4.0, 7)
    assert gate.capacity == 8
    for _ in range(10):
        for level in range(4, 9):
            _success(limit, clock, 4.0 * level, level)  # read as a queue
    assert limit.statistics().latency_limit < 8
    assert gate.capacity == 8  # not by the latencies' word


def test_after_a_plain_429_above_the_count_the_latencies_no_longer_set_the_raise() -> None:
    """A server that answered a 429 above the count refuses what its slots cannot take
    and queues nothing: answers that look queued (their own lengths) no longer lower the
    raise. Read as a queue on a hosted API, they held a published 16 with 32 real slots
    at 16 for minutes (plain 429s, seed 4: 1.79x the oracle)."""
    clock, gate, limit = _raised("pub-refuses", top=6)
    limit.on_refusal(8)
    assert gate.capacity == 7
    for _ in range(10):
        for level in range(4, 8):
            # Longer answers at each level (the hold ends meanwhile).
            _success(limit, clock, 4.0 * level, level)
    assert clock.now > DEFAULT_HOLD_S
    assert limit.statistics().latency_limit < 7  # read as a queue...
    assert gate.capacity == 8  # ...which a refusing server does not have: one past the hold


def test_after_a_refusal_the_raise_goes_one_past_the_most_seen_through() -> None:
    """Once refused above the count, the raise past the refusal's ceiling is one call past
    the most that got through at once, not the estimate's jump: at each hold's end the
    jump sent ten calls past a published 16's 32 plain slots (2.5 % of calls a 429)."""
    clock, gate, limit = _raised("pub-one-past-refusal", top=8)
    assert gate.capacity > 9  # the estimate's jump
    limit.on_refusal(10)
    assert gate.capacity == 9
    clock.now += DEFAULT_HOLD_S
    _served(limit, clock, 4.0, 9)
    assert gate.capacity == 10  # one past the most seen through (9)
    _served(limit, clock, 4.0, 10)
    assert gate.capacity == 11


def test_the_first_raise_is_one_slot_until_a_call_got_through_there() -> None:
    """A hosted API's latency says nothing of its slots: from a stated 32 the estimate
    read 48, and the 16 calls sent past 32 at once were 429s. One past the count first;
    the estimate's jump once a call got through with 33 at the provider."""
    clock = FakeClock()
    gate = Gate(4, name="pub-one-past", clock=clock)
    limit = AdaptiveLimit(gate, clock=clock)
    limit._probe_published_slots(True)
    for _ in range(4):
        _success(limit, clock, 4.0, 4)  # no queue at 4: the estimate says 6
    assert limit.statistics().latency_limit == pytest.approx(6)
    assert gate.capacity == 5
    limit.passed(clock.now, 5)  # one got through with 5 at the provider
    _success(limit, clock, 4.0, 5)
    assert gate.capacity > 6


def test_a_ceiling_is_never_raised_by_latencies() -> None:
    clock = FakeClock()
    gate = Gate(2, name="pub-ceiling", clock=clock)
    limit = AdaptiveLimit(gate, clock=clock)
    for level in range(1, 9):
        _served(limit, clock, 4.0, level)
    limit.on_refusal(5)  # not probing: nothing to cap
    assert gate.capacity == 2
    assert limit.statistics().latency_limit is None  # nothing fed


def test_a_policy_states_its_slot_count_as_published() -> None:
    published = Policy(name="pub-policy", max_concurrent_calls=2, concurrency_is_ceiling=False)
    assert published.adaptive_limit.probes_published_slots
    assert published.config.to_mapping()["llm_call"]["concurrency_is_ceiling"] is False
    # A policy that states no count leaves the gate's statement alone.
    same_gate = Policy(name="pub-policy-2", gate=published.gate)
    assert same_gate.adaptive_limit.probes_published_slots
    ceiling = Policy(name="pub-policy-3", gate=published.gate, max_concurrent_calls=2)
    assert not ceiling.adaptive_limit.probes_published_slots  # the last statement decides
    config = anygate.load_config(
        {
            "llm_call": {
                "name": "pub-yaml",
                "max_concurrent_calls": 1,
                "concurrency_is_ceiling": False,
            }
        }
    )
    assert Policy.from_config(config).adaptive_limit.probes_published_slots


@pytest.mark.parametrize("value", ["no", 0, None])
def test_concurrency_is_ceiling_must_be_a_bool(value: object) -> None:
    with pytest.raises(TypeError, match=r"concurrency_is_ceiling must be .*"):
        Policy(name="pub-bad", concurrency_is_ceiling=value)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"llm_call.concurrency_is_ceiling"):
        anygate.load_config({"llm_call": {"concurrency_is_ceiling": value}})


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", [mock_clock()])
async def test_a_policy_finds_a_local_server_with_more_slots_than_published() -> None:
    """A server with 4 slots behind a published 1 (its queue holds the rest): the gate
    leaves the published count and ends near the slots, and the run takes about the
    server's own time for 4 slots, not 4 times it."""
    server = _LocalServer(4, lambda done: 2.0 * (0.9 + 0.05 * (done % 5)))

    policy = Policy(
        name="published-local",
        gate=Gate(1, name="published-local", clock=anyio.current_time),
        max_concurrent_calls=1,
        concurrency_is_ceiling=False,
        clock=anyio.current_time,
    )

    virtual_s = await _agents(policy, server, agents=8, calls=20)
    assert server.done == 8 * 20
    seen = [n for _, n in server.arrivals]
    assert max(seen) >= 4  # left the published count
    assert max(seen[-60:]) <= TOLERANCE * 4 + 1  # near the slots once learned
    # On trio's MockClock: capped at 1 the run takes 4x the server's own time.
    assert virtual_s <= 1.25 * 160 / 4 * 2.0


class _RefusingServer:
    """A server whose calls take 2 s, refusing with ``refusal(at_server, refused)`` when
    that names an error; it records the calls at it on each arrival after a refusal."""

    def __init__(self, refusal: Callable[[int, int], Exception | None]) -> None:
        self._refusal = refusal
        self.at_server = 0
        self.refused = 0
        self.after: list[int] = []

    async def __call__(self) -> str:
        error = self._refusal(self.at_server, self.refused)
        if error is not None:
            self.refused += 1
            raise error
        self.at_server += 1
        if self.refused:
            self.after.append(self.at_server)
        try:
            await anyio.sleep(2.0)
        finally:
            self.at_server -= 1
        return "ok"


def _published_two(name: str) -> Policy:
    """A policy stating a published slot count of 2, on the run's clock, retrying soon."""
    return Policy(
        name=name,
        gate=Gate(2, name=name, clock=anyio.current_time),
        max_concurrent_calls=2,
        concurrency_is_ceiling=False,
        clock=anyio.current_time,
        retry=anygate.RetryConfig(base_delay_ms=10, cap_delay_ms=100),
    )


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", [mock_clock()])
@pytest.mark.parametrize("refusal", ["busy 503", "plain 429", "full queue 503"])
async def test_a_refusal_caps_the_raise_through_a_policy(refusal: str) -> None:
    """A server with 4 slots and no queue refuses a fifth call (503 "busy", a 429 that
    names no limit, or Ollama's full queue): the policy's retrier reports it
    (``AdaptiveLimit.on_refusal``), and the raise stays at 4 from then on, however little
    the latencies show queued."""

    def full(at_server: int, refused: int) -> Exception | None:
        if at_server < 4:
            return None
        if refusal == "plain 429":
            return anygate.ResponseError(429)
        if refusal == "full queue 503":
            return anygate.ResponseError(
                503, body={"error": "server busy, please try again. maximum pending requests"}
            )
        return anygate.ResponseError(
            503, body={"error": {"code": "server_busy", "message": "server busy"}}
        )

    server = _RefusingServer(full)
    policy = _published_two(f"published-{refusal}")
    await _agents(policy, server, agents=8, calls=10)
    assert server.refused >= 1  # the raise went past the slots once
    assert server.after
    assert policy.gate.capacity == 4
    assert max(server.after) <= 4


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", [mock_clock()])
async def test_a_429_that_names_a_window_does_not_stop_the_raise() -> None:
    """A slope rule's 429 (``limit_burst_rate``) says the provider's window was full, not
    its slots: the raise above a published count goes on. Taken as a refusal that need
    not be the slots', it held a published 16 with 32 real slots at 16 for 30 s in the
    morning peak's ramp (1.09x the oracle, seeds 1-5; 1.004x without)."""

    def once(at_server: int, refused: int) -> Exception | None:
        if at_server != 4 or refused:
            return None
        return anygate.ResponseError(
            429, body={"error": {"code": "limit_burst_rate", "message": "burst rate"}}
        )

    server = _RefusingServer(once)
    policy = _published_two("published-window")
    await _agents(policy, server, agents=8, calls=6)
    assert server.refused
    assert max(server.after) > 4  # a hold would have kept it at 4 for the whole run


def test_no_raise_while_a_throttle_holds_the_limit_below_the_published_count() -> None:
    """16 slots behind a published 32: the concurrency 429s teach 16, and latencies that
    show no queue (the provider refuses instead of queueing) must not take the gate back
    up (58 % of calls got a 429 and calls were lost in the morning peak when they did)."""
    clock = FakeClock()
    gate = Gate(32, name="pub-below", clock=clock)
    limit = AdaptiveLimit(gate, clock=clock)
    limit._probe_published_slots(True)
    limit.on_concurrency(limit.generation, 17, exact=True)
    assert gate.capacity == 16
    for _ in range(10):
        _served(limit, clock, 4.0, 16)
    assert gate.capacity == 16
