"""Issue 12: the policy steers by what the provider says.

Throttle kinds, concurrency learning (with and without a cap), separate throttle budgets,
the breaker's wait mode (one probe, many waiters, on trio's MockClock), and the default
slot wait bounded by the call's deadline.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import anyio
import pytest

import anygate
from anygate import (
    AdaptiveConfig,
    BreakerConfig,
    Busy,
    CallFailed,
    CircuitOpen,
    Gate,
    Policy,
    ResponseError,
    RetryConfig,
)
from anygate._classify.classify import classify
from anygate._classify.throttle import throttle_kind
from anygate._config.limit_values import DEFAULT_HOLD_S
from anygate._limits.adaptive import AdaptiveLimit
from tests.conftest import mock_clock
from tests.policy_helpers import FakeClock, burst, transient

if TYPE_CHECKING:
    from collections.abc import Callable

pytestmark = pytest.mark.anyio
virtual_time = pytest.mark.parametrize("anyio_backend", [mock_clock()])


def concurrency_429() -> ResponseError:
    return ResponseError(
        429,
        body={
            "error": {
                "code": "concurrency_limit_exceeded",
                "message": "Too many concurrent requests for this model.",
            }
        },
    )


def rpm_429(retry_after: str | None = None) -> ResponseError:
    headers = None if retry_after is None else {"retry-after": retry_after}
    return ResponseError(
        429,
        headers=headers,
        body={"error": {"code": "rate_limit_exceeded", "message": "Rate limit reached (RPM)"}},
    )


def queue_full_503(message: str = "maximum pending requests exceeded") -> ResponseError:
    """Ollama's answer beyond its queue bound (``OLLAMA_MAX_QUEUE``)."""
    return ResponseError(503, body={"error": f"server busy, please try again.  {message}"})


def overloaded_529() -> ResponseError:
    return ResponseError(
        529, body={"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    )


# --------------------------------------------------------------------------- kinds


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (concurrency_429(), "concurrency"),
        (rpm_429(), "rate"),
        (burst(), "burst"),
        (overloaded_529(), "overload"),
        (transient(retry_after="3"), "overload"),  # 503 asking to come back later
        (transient(), None),  # 503 without Retry-After: down, the breaker's business
        (queue_full_503(), "concurrency"),  # a full queue: the calls in flight filled it
        (queue_full_503("llm busy - no slots available"), "concurrency"),
        (ResponseError(503, body={"error": "server busy, please try again"}), None),
        (ResponseError(500, body={"error": {"message": "boom"}}), None),
    ],
)
def test_throttle_kind(error: ResponseError, kind: str | None) -> None:
    assert throttle_kind(classify(error)) == kind


# --------------------------------------------------------------------------- adaptive


def test_a_concurrency_throttle_sets_the_limit_below_the_calls_in_flight_uncapped() -> None:
    clock = FakeClock()
    gate = Gate()
    limit = AdaptiveLimit(gate, clock=clock)
    change = limit.on_concurrency(0, 33, exact=True)
    assert change is not None
    assert change.reason == "concurrency"
    assert gate.capacity == 32
    # Old news: an attempt admitted before the cut.
    assert limit.on_concurrency(0, 40, exact=True) is None
    assert gate.capacity == 32


def test_an_overshoots_later_429_does_not_tighten_below_what_got_through() -> None:
    """The same overshoot's 429s tighten the lesson to the least count, but a count below
    the most calls that got through at once is not believed: it is the least of the
    send's count and now's, and now comes after the lesson cut what went out (reject
    latency 1 s, seed 1: 34 tightened to 28 for 32 slots, 31 seen through, and the gate
    held at 28 for the lesson's 30 s)."""
    gate = Gate()
    limit = AdaptiveLimit(gate, clock=FakeClock())
    limit.passed(0.0, sending=31)
    before = limit.generation
    assert limit.on_concurrency(before, 35, exact=True) is not None
    assert gate.capacity == 34
    assert limit.on_concurrency(before, 33, exact=True) is not None
    assert gate.capacity == 32
    assert limit.on_concurrency(before, 29, exact=True) is None
    assert gate.capacity == 32
    assert limit.on_concurrency(before, 32, exact=True) is not None  # at it: believed
    assert gate.capacity == 31


def test_an_overload_answer_cuts_by_the_factor_and_a_lone_call_teaches_nothing() -> None:
    gate = Gate(20)
    limit = AdaptiveLimit(gate, clock=FakeClock(), decrease_factor=0.5)
    assert limit.on_concurrency(0, 1, exact=False) is None
    assert limit.on_concurrency(0, 10, exact=False) is not None
    assert gate.capacity == 5


def test_the_limit_holds_after_a_cut_then_grows_back_on_a_full_gate() -> None:
    clock = FakeClock()
    gate = Gate(40)
    limit = AdaptiveLimit(gate, clock=clock)
    assert limit.on_concurrency(0, 31, exact=True) is not None
    assert gate.capacity == 30
    for _ in range(100):
        assert limit.on_success(saturated=True) is None  # held
    clock.now += DEFAULT_HOLD_S
    assert all(limit.on_success(saturated=False) is None for _ in range(100))  # not full
    grown = [limit.on_success(saturated=True) for _ in range(31)]
    assert any(change is not None for change in grown)
    assert gate.capacity == 31


def test_a_probe_that_finds_the_same_limit_holds_longer() -> None:
    clock = FakeClock()
    gate = Gate()
    limit = AdaptiveLimit(gate, clock=clock)
    limit.on_concurrency(limit.generation, 33, exact=True)
    clock.now += DEFAULT_HOLD_S
    for _ in range(40):
        limit.on_success(saturated=True)
    assert gate.capacity == 33
    limit.on_concurrency(limit.generation, 34, exact=True)  # the same lesson again
    assert gate.capacity == 33
    clock.now += DEFAULT_HOLD_S  # the first hold's length is not enough any more
    assert all(limit.on_success(saturated=True) is None for _ in range(40))
    clock.now += DEFAULT_HOLD_S
    assert any(limit.on_success(saturated=True) is not None for _ in range(40))


def test_a_lesson_above_the_last_one_is_a_first_lesson_not_a_longer_hold() -> None:
    """32 learned, then the limit grew back past it (calls got through at 36): a 429 at
    37 is a lesson at a new level, held as a first one is. Taken for the last lesson's
    probe, each such 429 doubled the hold (a shared pool's bare 429s at the morning
    peak's top: 30 s, 60 s, 120 s, 240 s at 24-28 of 32 slots, seed 1 1.36x the lower
    bound). A plain one there is tentative: a pass above it undoes it."""
    clock = FakeClock()
    gate = Gate()
    limit = AdaptiveLimit(gate, clock=clock)
    limit.on_concurrency(limit.generation, 33, exact=True)
    clock.now += DEFAULT_HOLD_S
    while gate.capacity < 36:
        limit.on_success(saturated=True)
    limit.on_concurrency(limit.generation, 37, exact=True)
    assert gate.capacity == 36
    clock.now += DEFAULT_HOLD_S  # the first hold's length, not twice it
    assert any(limit.on_success(saturated=True) is not None for _ in range(40))
    # Plain, and above the last lesson (36) again: tentative.
    while gate.capacity < 40:
        limit.on_success(saturated=True)
    limit.on_concurrency(limit.generation, 41, exact=True, tentative=True)
    assert gate.capacity == 40
    assert not limit._slots.holding(clock.now)  # grows back at once


def _taught(in_flight: int) -> tuple[FakeClock, Gate, AdaptiveLimit]:
    """An uncapped limit at 10 s that a concurrency 429 with ``in_flight`` calls out has
    just taught ``in_flight - 1`` slots."""
    clock = FakeClock()
    clock.now = 10.0
    gate = Gate()
    limit = AdaptiveLimit(gate, clock=clock)
    limit.on_concurrency(limit.generation, in_flight, exact=True)
    assert gate.capacity == in_flight - 1
    return clock, gate, limit


def test_a_pass_above_a_held_lesson_ends_its_hold() -> None:
    """A concurrency 429 taught 8 and holds it; a call sent before it, with 10 at the
    provider, then ends well: the slots hold more than 8. The hold ends, the limit goes
    to the most seen through, and it grows from there at once."""
    clock, gate, limit = _taught(9)
    assert limit._slots.holding(clock.now)
    clock.now = 12.0
    limit.passed(9.5, sending=10)
    assert not limit._slots.holding(clock.now)
    assert gate.capacity == 10
    assert any(limit.on_success(saturated=True) is not None for _ in range(20))
    # An overload answer's lesson is a cut by a factor, not a count: calls above it
    # get through as a matter of course, and its hold stands.
    busy = AdaptiveLimit(Gate(), clock=clock)
    busy.on_concurrency(busy.generation, 20, exact=False)
    busy.passed(11.9, sending=19)
    assert busy._slots.holding(clock.now)


def test_a_lesson_more_got_through_than_is_not_probed_again_below_a_new_level() -> None:
    """8 served at once after a lesson of 7 (its hold over): the lesson is refuted. A
    429 at 9 then teaches 8, a first lesson held for the first hold's length, not the
    old lesson's regrowth probe with its hold doubled (a 10 % pool's plain 429 at 9,
    with plain 429s: seed 4 held 32 slots at 8 for the whole run)."""
    clock, gate, limit = _taught(8)
    clock.now += DEFAULT_HOLD_S
    while gate.capacity < 9:
        limit.on_success(saturated=True)
    limit.passed(clock.now, sending=8)
    limit.on_concurrency(limit.generation, 9, exact=True)
    assert gate.capacity == 8
    clock.now += DEFAULT_HOLD_S  # the first hold's length is enough
    assert any(limit.on_success(saturated=True) is not None for _ in range(20))


# --------------------------------------------------------------------------- policy


class SlotsProvider:
    """A provider serving ``slots`` calls at once with ``queue`` more waiting in order for
    a slot (none: a hosted API), and ``refusal()`` for any call beyond: a concurrency 429,
    or a local model server's full-queue 503."""

    def __init__(
        self,
        slots: int,
        service_s: float = 1.0,
        *,
        queue: int = 0,
        refusal: Callable[[], ResponseError] = concurrency_429,
    ) -> None:
        self.slots = anyio.Semaphore(slots)
        self.bound = slots + queue
        self.service_s = service_s
        self.refusal = refusal
        self.present = 0
        self.rejected = 0
        self.served = 0

    async def __call__(self) -> str:
        if self.present >= self.bound:
            self.rejected += 1
            await anyio.sleep(0.01)
            raise self.refusal()
        self.present += 1
        try:
            async with self.slots:
                await anyio.sleep(self.service_s)
        finally:
            self.present -= 1
        self.served += 1
        return "ok"


@virtual_time
async def test_an_uncapped_policy_learns_the_providers_slots_and_loses_nothing() -> None:
    provider = SlotsProvider(8)
    policy = Policy(name="learns", gate_name="learns-gate", circuit_breaker=False)
    assert math.isinf(policy.gate.capacity)
    async with anyio.create_task_group() as tg:
        for _ in range(60):
            tg.start_soon(policy.call, provider)
    assert provider.served == 60
    assert policy.gate.capacity <= 8
    # Few lessons, never one per 429: the calls rejected together with each lesson are old
    # news. How many depends on trio's scheduling order, which varies from run to run (an
    # estimate counts calls still on their way back, and growth probes again): 1-14
    # lessons for 52-145 rejections in 80 runs, always more than 5 rejections a lesson.
    stats = policy.adaptive_limit.statistics()
    assert stats.throttles >= 1
    assert stats.throttles * 5 < provider.rejected


@virtual_time
async def test_a_full_queues_503s_teach_an_uncapped_policy_what_the_server_holds() -> None:
    """24 callers at once on a 1-slot server with a 4-deep queue: the calls beyond its
    5 get its "maximum pending requests exceeded" 503. Each is a concurrency answer (the
    slots and the queue were full), not an outage's 503: the gate learns to hold 5 at
    the server, the breaker stays closed, and no call is lost (read as an outage's, 24
    agents lost 135 of 360 calls in ``anygate simulate``, seeds 1-3)."""
    server = SlotsProvider(1, 4.0, queue=4, refusal=queue_full_503)
    policy = Policy(name="queue", gate_name="queue-gate")
    assert math.isinf(policy.gate.capacity)
    async with anyio.create_task_group() as tg:
        for _ in range(24):
            tg.start_soon(policy.call, server)
    assert server.served == 24
    assert server.rejected >= 1
    assert policy.gate.capacity <= 5
    assert policy.breaker is not None
    assert policy.breaker.statistics().opened == 0


async def test_throttles_use_their_own_budget() -> None:
    errors = [rpm_429() for _ in range(5)] + [transient(), transient()]
    script = iter(errors)

    async def call() -> str:
        error = next(script, None)
        if error is not None:
            raise error
        return "ok"

    policy = Policy(
        retry=RetryConfig(max_attempts=3, throttle_attempts=6, base_delay_ms=0, cap_delay_ms=0),
        circuit_breaker=False,
    )
    assert await policy.call(call) == "ok"  # 5 throttles and 2 failures: both within budget


async def test_the_throttle_budget_runs_out() -> None:
    policy = Policy(
        retry=RetryConfig(throttle_attempts=2, base_delay_ms=0, cap_delay_ms=0),
        circuit_breaker=False,
    )
    calls = 0

    async def call() -> str:
        nonlocal calls
        calls += 1
        raise rpm_429()

    with pytest.raises(CallFailed):
        await policy.call(call)
    assert calls == 2


async def test_throttles_never_open_the_breaker() -> None:
    policy = Policy(
        circuit_breaker=BreakerConfig(failure_threshold=1, when_open="fail"),
        retry=RetryConfig(throttle_attempts=4, base_delay_ms=0, cap_delay_ms=0),
        # The burst throttle's pause is real time on asyncio; it is not what is tested.
        adaptive_concurrency=AdaptiveConfig(pause_ms=1),
    )
    failures = iter([concurrency_429(), rpm_429(), burst()])

    async def call() -> str:
        error = next(failures, None)
        if error is not None:
            raise error
        return "ok"

    assert await policy.call(call) == "ok"
    assert policy.breaker is not None
    assert policy.breaker.state == "closed"


# --------------------------------------------------------------------------- breaker waits


class Outage:
    """Fails with 503 until ``until`` (virtual time), then serves; counts attempts."""

    def __init__(self, until: float) -> None:
        self.until = until
        self.attempts = 0
        self.during = 0

    async def __call__(self) -> str:
        self.attempts += 1
        if anyio.current_time() < self.until:
            self.during += 1
            await anyio.sleep(0.01)
            raise transient()
        await anyio.sleep(0.5)
        return "ok"


@virtual_time
async def test_wait_mode_callers_wait_for_one_probe_and_all_succeed() -> None:
    start = anyio.current_time()
    outage = Outage(until=start + 30.0)
    policy = Policy(
        name="waits",
        circuit_breaker=BreakerConfig(failure_threshold=3, recovery_timeout_sec=5),
        retry=RetryConfig(max_attempts=3, base_delay_ms=10, cap_delay_ms=20),
        clock=anyio.current_time,
    )
    results: list[str] = []

    async def one() -> None:
        results.append(await policy.call(outage))

    async with anyio.create_task_group() as tg:
        for _ in range(50):
            tg.start_soon(one)
    assert results == ["ok"] * 50
    # The first wave (all 50 sent before any answer) fails; after that, while open, only
    # probes reach the provider: one per recovery interval, not a retry storm.
    assert outage.during <= 50 + math.ceil(30 / 5) + 1
    assert anyio.current_time() - start < 30.0 + 5.0 + 2.0


@virtual_time
async def test_wait_mode_is_bounded_by_the_deadline() -> None:
    outage = Outage(until=anyio.current_time() + 1000.0)
    policy = Policy(
        name="waits-deadline",
        circuit_breaker=BreakerConfig(failure_threshold=1, recovery_timeout_sec=50),
        retry=RetryConfig(max_attempts=5, base_delay_ms=10, cap_delay_ms=20),
        clock=anyio.current_time,
    )
    with pytest.raises(CallFailed):
        await policy.call(outage, deadline=20)
    started = anyio.current_time()
    with pytest.raises(CircuitOpen):  # waited its whole deadline, attempted nothing
        await policy.call(outage, deadline=10)
    assert anyio.current_time() - started == pytest.approx(10.0)


@virtual_time
async def test_fail_mode_fails_fast() -> None:
    outage = Outage(until=anyio.current_time() + 1000.0)
    policy = Policy(
        name="fails-fast",
        circuit_breaker=BreakerConfig(
            failure_threshold=1, recovery_timeout_sec=50, when_open="fail"
        ),
        retry=RetryConfig(max_attempts=5, base_delay_ms=10, cap_delay_ms=20),
        clock=anyio.current_time,
    )
    with pytest.raises(CallFailed):
        await policy.call(outage)
    started = anyio.current_time()
    with pytest.raises(CircuitOpen):
        await policy.call(outage)
    assert anyio.current_time() == started


@virtual_time
async def test_wait_mode_without_a_deadline_ends_after_max_wait() -> None:
    """Issue 26: a call with no deadline against a provider that only answers 503 used to
    wait for ever (probe fails, breaker reopens, wait again). Now its waits for the
    breaker add up to at most ``max_wait_sec`` (600 s by default); then it gives up."""
    outage = Outage(until=math.inf)
    policy = Policy(
        name="waits-endless",
        circuit_breaker=BreakerConfig(failure_threshold=2, recovery_timeout_sec=1),
        retry=RetryConfig(max_attempts=1),
        clock=anyio.current_time,
    )
    assert policy.config.circuit_breaker.max_wait_sec == 600.0
    for _ in range(2):
        with pytest.raises(CallFailed):
            await policy.call(outage)
    started = anyio.current_time()
    with anyio.fail_after(3600):  # before the fix: still waiting an hour later
        with pytest.raises(CallFailed, match="circuit_open"):  # it was each probe itself
            await policy.call(outage)
    # 600 s of waits, one per recovery interval, each followed by a 10 ms failed probe.
    assert anyio.current_time() - started == pytest.approx(600.0 + 600 * 0.01)


@virtual_time
async def test_the_breaker_wait_ceiling_sums_the_waits_of_every_attempt() -> None:
    """``max_wait_sec`` bounds the call's waits summed over its attempts; a call that had
    attempted gives up with CallFailed ("circuit_open"), and each wait is cut to what is
    left of the ceiling."""
    outage = Outage(until=math.inf)
    policy = Policy(
        name="waits-ceiling",
        circuit_breaker=BreakerConfig(
            failure_threshold=1, recovery_timeout_sec=10, max_wait_sec=25
        ),
        retry=RetryConfig(max_attempts=10, base_delay_ms=0, cap_delay_ms=0),
        clock=anyio.current_time,
    )
    started = anyio.current_time()
    with anyio.fail_after(3600), pytest.raises(CallFailed, match="circuit_open"):
        await policy.call(outage)
    # Three 10 ms attempts (the first opens the breaker, two probes) and waits of 10, 10
    # and the 5 s left of the 25.
    assert anyio.current_time() - started == pytest.approx(25.03)
    assert outage.attempts == 3


def test_wait_mode_in_threads_ends_after_max_wait() -> None:
    """Issue 26, call_sync: a thread's wait on a breaker that never closes ends after
    ``max_wait_sec`` (50 ms of real time here) with no deadline."""
    policy = Policy(
        name="waits-sync-endless",
        circuit_breaker=BreakerConfig(
            failure_threshold=1, recovery_timeout_sec=0.01, max_wait_sec=0.05
        ),
        retry=RetryConfig(max_attempts=1000, base_delay_ms=0, cap_delay_ms=0),
    )

    def call() -> str:
        raise transient()

    with pytest.raises(CallFailed, match="circuit_open"):
        policy.call_sync(call)


def test_max_wait_sec_loads_from_yaml_and_is_checked() -> None:
    """The setting's YAML key, its round trip, and errors that name it, the bound and
    the value."""
    config = anygate.load_config({"circuit_breaker": {"max_wait_sec": 30}})
    assert config.circuit_breaker.max_wait_sec == 30.0
    assert config.to_mapping()["circuit_breaker"]["max_wait_sec"] == 30.0
    with pytest.raises(
        anygate.ConfigError, match=r"circuit_breaker\.max_wait_sec must be .*> 0 \(got 0\)"
    ):
        anygate.load_config({"circuit_breaker": {"max_wait_sec": 0}})
    with pytest.raises(anygate.ConfigError, match=r"max_wait_sec must be .*> 0 \(got -1\)"):
        BreakerConfig(max_wait_sec=-1)
    with pytest.raises((TypeError, anygate.ConfigError), match="max_wait_sec"):
        BreakerConfig(max_wait_sec="soon")  # type: ignore[arg-type]


def test_wait_mode_in_threads_waits_for_the_probe() -> None:
    policy = Policy(
        name="waits-sync",
        circuit_breaker=BreakerConfig(failure_threshold=1, recovery_timeout_sec=0.05),
        retry=RetryConfig(max_attempts=2, base_delay_ms=0, cap_delay_ms=0),
    )
    state = {"fail": 2}

    def call() -> str:
        if state["fail"]:
            state["fail"] -= 1
            raise transient()
        return "ok"

    # Fails, opens the breaker (probe after 50 ms of real time), the probe succeeds.
    assert policy.call_sync(call, deadline=5) == "ok"
    assert policy.breaker is not None
    assert policy.breaker.state == "closed"


# --------------------------------------------------------------------------- slot wait


@virtual_time
async def test_the_default_slot_wait_is_the_deadline_not_a_fixed_timeout() -> None:
    policy = Policy(name="slot-wait", max_concurrent_calls=1, circuit_breaker=False)
    assert policy.config.busy_wait_s is None
    release = anyio.Event()

    async def hold() -> str:
        await release.wait()
        return "held"

    async def quick() -> str:
        return "quick"

    async with anyio.create_task_group() as tg:
        tg.start_soon(policy.call, hold)
        await anyio.wait_all_tasks_blocked()
        started = anyio.current_time()
        with anyio.move_on_after(500) as scope:  # far past the old fixed 60 s: no Busy
            await policy.call(quick)
        assert scope.cancelled_caught
        assert anyio.current_time() - started == pytest.approx(500)
        started = anyio.current_time()
        with pytest.raises(Busy):  # the call's own deadline bounds the wait
            await policy.call(quick, deadline=100)
        assert anyio.current_time() - started == pytest.approx(100)
        release.set()
    assert await policy.call(quick) == "quick"


async def test_policy_call_learns_the_rate_from_error_responses() -> None:
    """Two error responses reporting the same RPM limit: the gate paces to 90 % of it."""
    headers = {
        "x-ratelimit-limit-requests": "600",
        "x-ratelimit-remaining-requests": "10",
        "x-ratelimit-reset-requests": "6s",
    }
    answers = [rpm_429_with(headers), rpm_429_with(headers)]

    async def call() -> str:
        if answers:
            raise answers.pop(0)
        return "ok"

    gate = Gate(name="learns-rate")
    policy = Policy(
        gate=gate,
        retry=RetryConfig(base_delay_ms=0, cap_delay_ms=0),
        circuit_breaker=False,
    )
    assert gate.rate is None
    with anygate.set_testing(True):
        assert await policy.call(call) == "ok"
    assert gate.rate is not None
    assert gate.rate.requests_per_minute == pytest.approx(540)


def rpm_429_with(headers: dict[str, str]) -> ResponseError:
    return ResponseError(
        429,
        headers=headers,
        body={"error": {"code": "rate_limit_exceeded", "message": "Rate limit reached (RPM)"}},
    )
