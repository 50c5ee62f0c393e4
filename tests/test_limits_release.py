"""The release after a pause that turned a herd away (issue 26 item 5): doubling waves at
the probe's round trip, not one instant. Pure arithmetic, then an adaptive limit on a
manual clock, then real calls on trio's MockClock."""

from __future__ import annotations

import collections
import itertools
from typing import Any

import anyio
import pytest

from anygate import AdaptiveLimit, Gate, Policy, RetryConfig
from anygate._limits.release import Release
from tests.conftest import mock_clock
from tests.policy_helpers import FakeClock, burst, send_if_let

# --------------------------------------------------------------------------- arithmetic


def test_the_allowance_doubles_every_round_trip() -> None:
    release = Release(10.0, 0.5)
    assert [release.allowance(10.0 + 0.5 * k) for k in range(5)] == [2, 4, 8, 16, 32]
    assert release.allowance(10.49) == 2
    assert release.allowance(9.0) == 2  # a clock read before the start: the first wave


def test_an_attempt_over_the_allowance_waits_for_the_next_doubling() -> None:
    release = Release(0.0, 0.2)
    assert [send_if_let(release, 0.0) for _ in range(2)] == [0.0, 0.0]
    assert send_if_let(release, 0.05) == pytest.approx(0.15)
    assert [send_if_let(release, 0.2) for _ in range(2)] == [0.0, 0.0]  # 4 in all by 0.2
    assert send_if_let(release, 0.2) == pytest.approx(0.2)


def test_asking_counts_nothing() -> None:
    """Only a send takes from the allowance: an attempt let go by the release but held by
    another limit (a full minute) leaves its place in the wave to the next."""
    release = Release(0.0, 0.2)
    assert [release.wait(0.0) for _ in range(5)] == [0.0] * 5
    release.sent(0.0)
    release.sent(0.0)
    assert release.wait(0.0) == pytest.approx(0.2)


def test_a_doubling_instant_is_not_lost_to_rounding() -> None:
    """(now - start) / round_trip can round below k at the k-th doubling's instant: an
    attempt asking then must go, not wait a minimal step again and again."""
    release = Release(29349.1, 0.1)
    for _ in range(2):
        assert send_if_let(release, 29349.1) == 0.0
    at = 29349.1 + 3 * 0.1
    for _ in range(14):  # 16 in all by the third doubling
        assert send_if_let(release, at) == 0.0


def test_the_release_is_over_once_its_allowance_covers_everyone_held() -> None:
    release = Release(0.0, 1.0)
    assert not release.over(0.0, 3)
    assert release.over(0.0, 2)
    send_if_let(release, 0.0)
    send_if_let(release, 0.0)
    assert not release.over(1.0, 3)  # 4 allowed, 2 sent: 2 more, 3 waiting
    assert release.over(2.0, 3)


def test_an_instant_round_trip_is_paced_by_a_millisecond() -> None:
    release = Release(0.0, 0.0)
    send_if_let(release, 0.0)
    send_if_let(release, 0.0)
    assert send_if_let(release, 0.0) == pytest.approx(1e-3)


# --------------------------------------------------------------------------- the limit


def _pause_and_probe(
    limit: AdaptiveLimit, clock: FakeClock, throttles: int, bystanders: int = 0
) -> list[object]:
    """``throttles`` calls turned away at once (a check starts on the first) and
    ``bystanders`` admitted during the check, then the check's probe is accepted 0.3 s
    after it was sent. The other calls, held, are returned."""
    callers = [object() for _ in range(throttles)]
    sent_in = limit.generation  # all were sent before the first 429 came back
    for caller in callers:
        limit.on_throttle(sent_in, None, admitted_at=clock.now - 0.1, caller=caller)
    probe = callers[0]
    assert limit.pass_pause(probe) == (0.0, True)
    assert limit.reserve_send(clock.now, probe) == 0.0
    held = callers[1:] + [object() for _ in range(bystanders)]
    for caller in held:
        assert limit.pass_pause(caller)[0] > 0
    clock.now += 0.3
    limit.on_success(probe=True)
    return held


def test_a_herd_turned_away_is_released_in_waves_at_the_probes_round_trip() -> None:
    clock = FakeClock()
    clock.now = 100.0
    gate = Gate(64, name="herd", clock=clock)  # held: the limit keeps it weakly
    limit = AdaptiveLimit(gate, clock=clock)
    held = _pause_and_probe(limit, clock, 20)
    waves: list[int] = []
    while held:
        for caller in held:
            assert limit.pass_pause(caller) == (0.0, False)  # the pause is over
        gone = [c for c in held if limit.reserve_send(clock.now, c) == 0.0]
        waves.append(len(gone))
        held = [c for c in held if c not in gone]
        clock.now += 0.3
    assert waves == [2, 2, 4, 8, 3]  # 19 held: the allowance 2, 4, 8, 16, then all


def test_a_lone_throttle_releases_everyone_held_at_once() -> None:
    """One 429 (a shared pool's noise, most likely): its check ends as before."""
    clock = FakeClock()
    gate = Gate(64, name="lone", clock=clock)  # held: the limit keeps it weakly
    limit = AdaptiveLimit(gate, clock=clock)
    assert limit.on_throttle(limit.generation, None, admitted_at=-0.1, caller="p") is None
    assert limit.pass_pause("p") == (0.0, True)
    assert limit.reserve_send(clock.now, "p") == 0.0
    others = [object() for _ in range(10)]
    for caller in others:
        assert limit.pass_pause(caller)[0] > 0
    clock.now += 0.3
    limit.on_success(probe=True)
    assert [limit.reserve_send(clock.now, c) for c in others] == [0.0] * 10


def test_a_few_429s_among_many_held_release_everyone_at_once() -> None:
    """Three 429s while twenty calls wait out the check (a shared pool's noise): no herd."""
    clock = FakeClock()
    clock.now = 100.0
    gate = Gate(64, name="few", clock=clock)
    limit = AdaptiveLimit(gate, clock=clock)
    held = _pause_and_probe(limit, clock, 3, bystanders=20)
    assert [limit.reserve_send(clock.now, c) for c in held] == [0.0] * 22


def test_a_throttle_during_the_release_ends_it() -> None:
    clock = FakeClock()
    clock.now = 100.0
    gate = Gate(64, name="again", clock=clock)  # held: the limit keeps it weakly
    limit = AdaptiveLimit(gate, clock=clock)
    held = _pause_and_probe(limit, clock, 10)
    assert [limit.reserve_send(clock.now, c) for c in held[:3]][2] > 0  # the first wave
    limit.on_throttle(limit.generation, None, admitted_at=clock.now - 0.1, caller=held[0])
    assert limit._sends.release is None  # the new check holds everyone; its end decides again


# --------------------------------------------------------------------------- real calls


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", [mock_clock()])
async def test_forty_calls_throttled_once_retry_in_waves_not_in_lockstep() -> None:
    """The issue's case: 40 calls, each turned away once by a burst 429 (200 ms answers),
    then accepted. Before, the retries went at two instants (the probe's and everyone
    else's); now in doubling waves a round trip apart, and every call succeeds."""
    start = anyio.current_time()
    retries: list[float] = []

    def fn_for() -> Any:
        first: list[bool] = []

        async def fn() -> str:
            if first:
                retries.append(round(anyio.current_time() - start, 6))
            await anyio.sleep(0.2)
            if not first:
                first.append(True)
                raise burst()
            return "ok"

        return fn

    policy = Policy(name="herd", clock=anyio.current_time, retry=RetryConfig(throttle_attempts=5))
    results: list[str] = []

    async def one() -> None:
        results.append(await policy.call(fn_for()))

    async with anyio.create_task_group() as tg:
        for _ in range(40):
            tg.start_soon(one)
    assert results == ["ok"] * 40
    waves = sorted(collections.Counter(retries).items())
    assert len(waves) >= 6, waves
    sizes = [n for _, n in waves]
    assert sizes[0] == 1  # the probe
    assert max(sizes) <= 16, waves  # the largest wave is half the herd at most
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(waves)]
    assert min(gaps) >= 0.2 - 1e-6, waves  # a round trip apart (the probe's 200 ms)
