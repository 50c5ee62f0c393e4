"""The adaptive limit on its own: AIMD arithmetic, pauses, episodes, resizing, threads.

Driven by a manual clock, so every number is exact; the policy wiring is in
``test_policy_adaptive.py``.
"""

from __future__ import annotations

import functools
import gc
import math
import threading
import weakref

import pytest

from anygate import AdaptiveLimit, Gate
from anygate._config.limit_values import capacity_for, lowered_limit, raised_limit
from anygate._limits.slope_fit import MIN_PREVIOUS
from anygate._policy.sharing import adaptive_limit_for
from tests.policy_helpers import FakeClock


def _limit(capacity: float = 32, **kwargs: object) -> tuple[AdaptiveLimit, Gate, FakeClock]:
    gate = Gate(capacity, name="llm")
    clock = FakeClock()
    # The limits these tests expect are worked out for a factor of 0.7: the mechanism is
    # under test here, not the default (test_the_defaults_are_documented pins that).
    kwargs.setdefault("decrease_factor", 0.7)
    limit = AdaptiveLimit(gate, clock=clock, **kwargs)  # type: ignore[arg-type]
    # The limit holds the gate weakly; the tests keep it alive through the tuple.
    return limit, gate, clock


# --------------------------------------------------------------------------- arithmetic


def test_lowered_limit_multiplies_and_stops_at_the_floor() -> None:
    """max(floor, limit * factor): 32 -> 22.4 -> 15.68, and never below the floor."""
    assert lowered_limit(32, factor=0.7, floor=1) == pytest.approx(22.4)
    assert lowered_limit(22.4, factor=0.7, floor=1) == pytest.approx(15.68)
    assert lowered_limit(3, factor=0.5, floor=2) == 2
    assert lowered_limit(1, factor=0.7, floor=1) == 1


def test_raised_limit_adds_one_over_the_limit_up_to_the_ceiling() -> None:
    """min(ceiling, limit + 1/limit); a closed limit (0) stays closed."""
    assert raised_limit(4, ceiling=32) == 4.25
    assert raised_limit(31.99, ceiling=32) == 32
    assert raised_limit(1, ceiling=32) == 2
    assert raised_limit(0, ceiling=32) == 0


def test_capacity_for_floors_the_limit_and_forgives_float_noise() -> None:
    """The gate gets whole slots; 6.9999999999 (from 10 * 0.7) counts as 7; inf stays."""
    assert capacity_for(22.4, floor=1) == 22
    assert capacity_for(6.9999999999, floor=1) == 7
    assert capacity_for(0.5, floor=1) == 1
    assert capacity_for(math.inf, floor=1) == math.inf


def test_about_one_slot_per_limits_worth_of_successes() -> None:
    """Recovering from 22.4 to 32 takes roughly (32^2 - 22.4^2) / 2 = 261 successes."""
    limit, n = 22.4, 0
    while limit < 32:
        limit = raised_limit(limit, ceiling=32)
        n += 1
    assert 255 <= n <= 265


# --------------------------------------------------------------------------- throttles


def test_a_throttle_lowers_the_gate_pauses_and_bumps_the_generation() -> None:
    """32 -> 22 slots, a 5 s pause counted down by the clock, generation 0 -> 1."""
    limit, gate, clock = _limit()
    change = limit.on_throttle(0, None)
    assert change is not None
    assert (change.old, change.new, change.maximum, change.reason, change.pause_s) == (
        32,
        22,
        32,
        "burst_rate",
        5.0,
    )
    assert gate.capacity == 22
    assert limit.limit == 22
    assert limit.generation == 1
    assert limit.pause_left() == 5.0
    clock.now = 3.5
    assert limit.pause_left() == 1.5
    clock.now = 5.0
    assert limit.pause_left() == 0.0
    assert limit.max_concurrent_calls == 32


def test_throttles_from_an_older_generation_are_old_news() -> None:
    """Attempts admitted before the cut were sent under the old limit: no second cut."""
    limit, gate, clock = _limit()
    assert limit.on_throttle(0, None) is not None
    for _ in range(5):
        assert limit.on_throttle(0, None) is None
    assert gate.capacity == 22
    clock.now = 10.0  # long after the pause, the stale attempt's news is still stale
    assert limit.on_throttle(0, None) is None
    stats = limit.statistics()
    assert (stats.throttles, stats.stale_throttles) == (1, 6)
    # An attempt admitted after the cut that is throttled again starts a new episode.
    change = limit.on_throttle(1, None)
    assert change is not None
    assert (change.old, change.new) == (22, 15)
    assert limit.generation == 2


def test_a_concurrency_lesson_does_not_make_a_burst_throttle_old_news() -> None:
    """A slots' 429 bumps the generation, but holds nothing back from a spent window: a
    burst 429 of an attempt admitted before that lesson (and after the latest burst
    answer) is still a throttle, answered with a pause; one admitted before that pause is
    old news."""
    limit, gate, _ = _limit()
    assert limit.on_concurrency(0, 20, exact=True) is not None  # the slots: 19
    assert gate.capacity == 19
    assert limit.generation == 1
    change = limit.on_throttle(0, None)  # admitted before the slots' lesson
    assert change is not None
    assert change.reason == "burst_rate"
    assert limit.pause_left() == 5.0
    assert limit.generation == 2
    assert limit.on_throttle(1, None) is None  # admitted before the pause
    assert limit.statistics().stale_throttles == 1


def test_without_a_generation_only_throttles_outside_a_pause_count() -> None:
    """Callers that do not track generations: a throttle during the pause is ignored."""
    limit, gate, clock = _limit()
    assert limit.on_throttle(None, None) is not None
    clock.now = 4.9
    assert limit.on_throttle(None, None) is None
    clock.now = 5.0
    assert limit.on_throttle(None, None) is not None
    assert gate.capacity == 15


def test_retry_after_sets_the_pause() -> None:
    """The provider's Retry-After replaces the configured pause, longer or shorter."""
    limit, _, clock = _limit()
    change = limit.on_throttle(0, 12.5)
    assert change is not None
    assert change.pause_s == 12.5
    clock.now = 12.0
    assert limit.pause_left() == 0.5


def test_a_zero_pause_lowers_without_pausing() -> None:
    """pause_s 0: the cut alone."""
    limit, gate, _ = _limit(pause_s=0.0)
    change = limit.on_throttle(0, None)
    assert change is not None
    assert change.pause_s == 0
    assert limit.pause_left() == 0
    assert gate.capacity == 22


def test_the_floor_holds_and_a_throttle_there_still_pauses() -> None:
    """Repeated throttles stop at min_concurrent_calls; at the floor old == new."""
    limit, gate, clock = _limit(8, min_concurrent_calls=3)
    seen = []
    for generation in range(6):
        clock.now += 10
        change = limit.on_throttle(generation, None)
        assert change is not None
        seen.append((change.old, change.new))
    assert seen == [(8, 5), (5, 3), (3, 3), (3, 3), (3, 3), (3, 3)]
    assert gate.capacity == 3
    assert limit.pause_left() == 5.0


def test_a_floor_above_the_cap_never_raises_the_cap() -> None:
    """min_concurrent_calls 4 on a 2-slot gate: the cap wins, the limit stays at 2."""
    limit, gate, _ = _limit(2, min_concurrent_calls=4)
    change = limit.on_throttle(0, None)
    assert change is not None
    assert (change.old, change.new) == (2, 2)
    assert gate.capacity == 2


# --------------------------------------------------------------------------- recovery


def test_successes_grow_the_gate_back_one_slot_at_a_time() -> None:
    """After a cut, successes report each whole-slot step until the maximum."""
    limit, gate, _ = _limit(10)
    assert limit.on_throttle(0, None) is not None
    assert gate.capacity == 7
    steps = []
    successes = 0
    while gate.capacity < 10:
        successes += 1
        change = limit.on_success()
        if change is not None:
            assert change.reason == "recovered"
            assert change.pause_s == 0
            steps.append((change.old, change.new))
    assert steps == [(7, 8), (8, 9), (9, 10)]
    assert 20 <= successes <= 27  # about 7 + 8 + 9
    assert limit.on_success() is None  # at the maximum: nothing to do


def test_a_success_at_the_maximum_changes_nothing() -> None:
    """The common case: no cut, no change, the gate untouched."""
    limit, gate, _ = _limit()
    assert limit.on_success() is None
    assert gate.capacity == 32


# --------------------------------------------------------------------------- configuration


def test_no_cap_pauses_and_takes_the_calls_in_flight_as_its_limit() -> None:
    """An uncapped gate: a burst throttle pauses it and makes the calls in flight its limit
    (so the pause does not end in a herd); without that count, it only pauses. Nor with
    a handful out (fewer than MIN_PREVIOUS): a full window that small says little, and a
    shared pool's two 429s 0.1 s into the peak x10 held it to 4 calls for a window (its
    ramp a window behind the oracle's: 1.043x)."""
    limit, gate, _ = _limit(math.inf)
    assert "no cap" in repr(limit)
    change = limit.on_throttle(0, None)
    assert change is not None
    assert limit.pause_left() > 0
    assert gate.capacity == math.inf
    other, gate2, _ = _limit(math.inf)
    assert other.on_throttle(0, None, in_flight=12) is not None
    assert gate2.capacity == 12
    few, gate3, _ = _limit(math.inf)
    assert few.on_throttle(0, None, in_flight=MIN_PREVIOUS - 1) is not None
    assert few.pause_left() > 0
    assert gate3.capacity == math.inf


def test_disabled_does_nothing_and_disabling_restores_the_maximum() -> None:
    """enabled=False ignores throttles; turning it off mid-episode ends the pause."""
    off, gate, _ = _limit(enabled=False)
    assert off.on_throttle(0, None) is None
    assert gate.capacity == 32
    assert "off" in repr(off)

    limit, gate, _ = _limit()
    assert limit.on_throttle(0, None) is not None
    limit.configure(enabled=False)
    assert gate.capacity == 32
    assert limit.pause_left() == 0
    limit.configure(enabled=True, decrease_factor=0.5, min_concurrent_calls=2, pause_s=1.0)
    assert limit.settings() == (True, 2, 0.5, 1.0)
    change = limit.on_throttle(limit.generation, None)
    assert change is not None
    assert (change.new, change.pause_s) == (16, 1.0)


def test_resizing_caps_a_lowered_limit_and_moves_an_unlowered_one() -> None:
    """At the maximum the limit follows a resize; after a cut it stays down, capped."""
    limit, gate, _ = _limit()
    limit.resize(40)
    assert (gate.capacity, limit.max_concurrent_calls) == (40, 40)
    assert limit.on_throttle(0, None) is not None  # 40 -> 28
    assert gate.capacity == 28
    limit.resize(64)
    assert (gate.capacity, limit.max_concurrent_calls) == (28, 64)
    limit.resize(10)
    assert (gate.capacity, limit.max_concurrent_calls) == (10, 10)
    limit.resize(math.inf)
    assert gate.capacity == math.inf


def test_a_direct_gate_resize_becomes_the_new_maximum() -> None:
    """Someone sets gate.capacity themselves: the limit adopts it instead of undoing it."""
    limit, gate, _ = _limit()
    assert limit.on_throttle(0, None) is not None
    gate.capacity = 12
    assert limit.max_concurrent_calls == 12
    assert limit.on_success() is None
    assert gate.capacity == 12
    change = limit.on_throttle(limit.generation, None)
    assert change is not None
    assert (change.old, change.new, change.maximum) == (12, 8, 12)


def test_statistics_and_repr_show_the_state() -> None:
    """A snapshot with every setting and counter; the repr shows limit/max and the pause."""
    limit, _, clock = _limit()
    assert repr(limit) == "<anygate.AdaptiveLimit gate 'llm' 32/32>"
    limit.on_throttle(0, None)
    clock.now = 1.0
    stats = limit.statistics()
    assert (stats.gate, stats.enabled, stats.limit, stats.max_concurrent_calls) == (
        "llm",
        True,
        22,
        32,
    )
    assert (stats.min_concurrent_calls, stats.decrease_factor, stats.pause_s) == (1, 0.7, 5.0)
    assert (stats.paused_for, stats.throttles, stats.stale_throttles) == (4.0, 1, 0)
    assert repr(limit) == "<anygate.AdaptiveLimit gate 'llm' 22/32, paused 4s>"


def test_the_per_gate_table_does_not_keep_gates_alive() -> None:
    """Limits are found by gate but hold it weakly: a dropped gate is collected, and the
    limit's methods then have nothing to resize."""
    gate = Gate(4, name="short-lived")
    limit, created = adaptive_limit_for(gate, functools.partial(AdaptiveLimit, gate))
    assert created
    assert adaptive_limit_for(gate, functools.partial(AdaptiveLimit, gate)) == (limit, False)
    ref = weakref.ref(gate)
    del gate
    gc.collect()
    assert ref() is None
    limit.resize(8)  # no gate to apply it to: no error
    assert limit.statistics().gate == "short-lived"


# --------------------------------------------------------------------------- threads


def test_concurrent_throttles_and_successes_keep_the_gate_consistent() -> None:
    """Eight threads hammering one limit: one cut per generation, the gate always within
    [floor, maximum], and the gate's capacity equal to the limit's at the end."""
    limit, gate, clock = _limit(32, min_concurrent_calls=2)
    start = threading.Barrier(8)
    seen: list[float] = []

    def worker(seed: int) -> None:
        start.wait()
        for i in range(2000):
            if (i + seed) % 50 == 0:
                limit.on_throttle(limit.generation, None)
            else:
                limit.on_success()
            seen.append(gate.capacity)
            if i % 100 == 0:
                clock.now += 1.0

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(2 <= c <= 32 for c in seen)
    stats = limit.statistics()
    assert stats.throttles == limit.generation
    assert stats.throttles + stats.stale_throttles == 8 * 40
    assert gate.capacity == stats.limit
