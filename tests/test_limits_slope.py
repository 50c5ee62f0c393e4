"""The slope limit learned from counts (issue 30): pure arithmetic, then on an adaptive
limit driving a gate on a manual clock, then through real calls on trio's MockClock against
a provider that enforces a slope rule the way a burst limit does."""

from __future__ import annotations

import math
from typing import Any

import anyio
import pytest

from anygate import (
    AdaptiveConfig,
    AdaptiveLimit,
    Gate,
    Policy,
    ResponseError,
    RetryConfig,
)
from anygate._limits.slope import WINDOW_S, SlopeLimit
from anygate._limits.slope_fit import between
from anygate._limits.window import SentLog
from anygate._policy import admission
from tests.conftest import mock_clock
from tests.policy_helpers import FakeClock, burst

# --------------------------------------------------------------------------- the log


def _log(*times: float) -> SentLog:
    log = SentLog(60.0)
    for at in times:
        log.sent(at)
    return log


def test_count_is_the_sends_in_a_half_open_span_less_the_turned_away() -> None:
    log = _log(1.0, 2.0, 2.0, 3.0, 4.0)
    log.rejected(2.0)
    assert log.count(2.0, 4.0) == 2  # 2.0, 2.0 (one turned away), 3.0; not 4.0
    assert log.count(0.0, 10.0) == 4
    assert log.count(5.0, 9.0) == 0


def test_run_since_is_where_the_run_of_sends_one_rule_turned_away_began() -> None:
    log = _log(1.0, 2.0, 3.0, 3.0, 4.0, 5.0, 6.0)
    turned = [2.0, 3.0, 3.0, 4.0, 6.0]
    assert log.run_since(4.0, turned) == 2.0
    assert log.run_since(2.0, turned) == 2.0
    assert log.run_since(1.0, turned) is None  # not turned away (or in flight): no run
    assert log.run_since(5.0, turned) is None
    assert log.run_since(6.0, turned) == 6.0  # 5.0 broke the run
    assert log.run_since(4.0, [2.0, 3.0, 4.0]) == 4.0  # one of the two at 3.0 went through


def test_first_after_is_the_next_send_time() -> None:
    log = _log(1.0, 2.0, 3.0)
    assert log.first_after(1.0) == 2.0
    assert log.first_after(0.0) == 1.0
    assert log.first_after(3.0) is None


# --------------------------------------------------------------------------- learning


def _ramp(log: SentLog, counts: list[int], window: float = 10.0, start: float = 0.0) -> None:
    """``counts[k]`` sends spread evenly over window ``k`` (from ``start``)."""
    for k, count in enumerate(counts):
        for i in range(count):
            log.sent(start + k * window + (i + 0.5) * window / count)


def test_a_full_window_after_a_quiet_one_teaches_the_floor_not_a_growth() -> None:
    log = SentLog(60.0)
    _ramp(log, [60])
    slope = SlopeLimit(log)
    assert slope.edge(9.9, 10.0)
    assert (slope.growth, slope.floor) == (None, 60)
    # No growth known: nothing is held (the floor would be after a quiet stretch that
    # follows sends of ours, but a run's start is none).
    assert slope.wait(10.0) == 0.0


def test_the_floor_is_read_again_where_the_next_edge_pins_the_phase() -> None:
    """The first full window (60 sends in 0-10 s, after none) ends in (9.0, 10.0]: read
    at every phase that edge allows, the least count cuts the window's first sends off
    (a window ending at 10.0 s starts at 0 s, one ending at 9.1 s at -0.9 s: all 60 at
    10.0, fewer at a phase up to 0.9 s later, 10.9, which the first edge also allows as
    (9.0, 10.0] + 10 k). The next edge, in (19.9, 20.0], pins the phase to the window's
    end: the floor is then the 60 the provider's window held, not the least count of the
    first reading (kept, it started each ramp after a quiet stretch short)."""
    log = SentLog(60.0)
    _ramp(log, [60, 120])
    slope = SlopeLimit(log)
    slope.edge(9.0, 10.0)
    first = slope.floor
    assert 0 < first < 60
    slope.edge(19.9, 20.0)
    assert slope.growth is not None
    assert slope.floor == 60


def test_after_a_quiet_stretch_the_floor_holds_before_a_growth_is_known() -> None:
    """An outage from 10 s to 40 s counted none of ours: the provider's window after it
    follows a quiet one and holds the floor, whatever the growth (max(floor, growth x 0)),
    so the floor learned on the ramp holds the recovery's trailing window to it even with
    no growth known. Without it the herd waiting out the outage went at once and the
    first window turned the excess away."""
    log = SentLog(60.0)
    _ramp(log, [60])
    slope = SlopeLimit(log)
    slope.edge(9.9, 10.0)
    assert slope.growth is None
    for i in range(60):  # the herd: the floor's worth in 0.6 s
        assert slope.wait(40.0 + i * 0.01) == 0.0
        log.sent(40.0 + i * 0.01)
    assert slope.wait(40.7) == pytest.approx(9.3)  # until the first of them leaves
    assert slope.wait(50.0 + 1e-6) == 0.0
    # One send of ours counted in the stretch (at 15 s) and it is no quiet one: the
    # provider's window before may have held a busy count, and nothing is held.
    busy = SentLog(60.0)
    _ramp(busy, [60])
    busy.sent(15.0)
    held = SlopeLimit(busy)
    held.edge(9.9, 10.0)
    for i in range(60):
        busy.sent(40.0 + i * 0.01)
    assert held.wait(40.7) == 0.0


def test_after_a_quiet_stretch_the_providers_own_windows_are_counted() -> None:
    """Edges found in (9.9, 10.2] and (19.9, 20.2] pin the phase to 9.8-10.2 s (the span
    wraps the window's end). An outage keeps ours out until 62 s, when the breaker's late
    probe and the floor's worth go: the provider counts them in its window from 60.2 s at
    the latest, so the next one, from 70.2 s at the latest, may hold twice as many, and
    the herd goes then. A trailing window anchored at 62 s held everyone until 72 s. The
    current window counts the sends the slots refused too (the provider's rate limiter,
    in front of its slots, may have)."""
    log = SentLog(60.0)
    _ramp(log, [60, 120])
    slope = SlopeLimit(log)
    slope.edge(9.9, 10.2)
    slope.edge(19.9, 20.2)
    assert slope.growth is not None
    assert slope.floor == 60
    for i in range(60):
        log.sent(62.0 + i * 0.01)
    assert slope.wait(63.0) == pytest.approx(7.2)  # full at the floor: until its last edge
    assert slope.wait(70.1) == pytest.approx(0.1)  # its edge may not have come yet
    assert slope.wait(70.25) == 0.0
    allowed = math.floor(slope.growth * 60)  # the window before held the 60
    for i in range(allowed - 1):
        log.sent(70.25 + i * 0.0005)
    assert slope.wait(70.5) == 0.0
    log.sent(70.4)
    log.refused(70.4)  # the last the window allows: the slots turned it away
    assert slope.wait(70.5) == pytest.approx(9.7)


def test_a_full_window_after_a_busy_one_teaches_the_growth() -> None:
    log = SentLog(60.0)
    _ramp(log, [60, 120])
    slope = SlopeLimit(log)
    slope.edge(9.9, 10.0)
    assert slope.edge(19.9, 20.0)
    assert slope.growth == pytest.approx(2.0)
    assert slope.window_s == WINDOW_S


def test_with_no_floor_known_a_quiet_window_holds_nothing_back() -> None:
    """Growth 2 read off two busy windows, no floor (no full window followed a quiet
    one). After a quiet stretch the provider allows its floor, unknown, not nothing:
    ``growth x 0`` held every send until the rule was forgotten (an 8 % pool, seed 3:
    the run's last call went 82 s late). A window with a few of ours before says as
    little; one with enough says ``growth x`` it."""
    log = SentLog(60.0)
    _ramp(log, [30, 60, 120])
    slope = SlopeLimit(log)
    slope.edge(19.9, 20.0)
    slope.edge(29.9, 30.0)
    assert (slope.growth, slope.floor) == (pytest.approx(2.0), 0)
    assert slope.wait(100.0) == 0.0
    for i in range(3):
        log.sent(100.0 + i)
    assert slope.wait(111.0) == 0.0  # three before: too few to read
    for i in range(10):
        log.sent(111.0 + i / 10)
    for i in range(20):
        log.sent(120.5 + i / 10)
    assert slope.wait(122.6) > 0.0  # ten before, twenty now: held to growth x ten


def test_a_full_windows_sends_the_slots_refused_count_in_its_growth() -> None:
    """The provider's rate limiter counted the 13 sends its slots refused (it sits in
    front of them): the full window held 120 after 60, a growth of 2, not 107 / 60."""
    log = SentLog(60.0)
    _ramp(log, [60, 120])
    for i in range(13):
        log.refused(10.0 + (i + 0.5) / 12)
    slope = SlopeLimit(log)
    slope.edge(9.9, 10.0)
    slope.edge(19.9, 20.0)
    assert slope.growth == pytest.approx(2.0)


def test_a_full_window_that_held_the_floor_teaches_no_growth() -> None:
    """The floor (60) is known from the first window. A full window of 60 after one of 40
    held the floor, ``max(floor, growth x 40)``: 1.5 is no growth reading (read as one,
    the least ratio kept it, and reject latency 1 s crawled at 1.4 where the provider
    allowed 2). The next full window, 120 after 60, is one."""
    log = SentLog(60.0)
    _ramp(log, [60, 40, 60, 120])
    slope = SlopeLimit(log)
    slope.edge(9.9, 10.0)
    assert (slope.growth, slope.floor) == (None, 60)
    slope.edge(29.9, 30.0)
    assert (slope.growth, slope.floor) == (None, 60)
    slope.edge(39.9, 40.0)
    assert slope.growth == pytest.approx(2.0)


def test_a_window_that_grew_by_a_handful_teaches_no_growth() -> None:
    """A flat rate turned away (a shared pool's repeated 429) is not a slope: 128 over 125
    would hold the fleet to 1.02x a window."""
    log = SentLog(60.0)
    _ramp(log, [125, 128])
    slope = SlopeLimit(log)
    slope.edge(19.9, 20.0)
    assert slope.growth is None


def test_an_edge_known_loosely_reads_the_least_growth_its_phases_allow() -> None:
    """After an edge at 10 s, the next lies somewhere in (15, 20]: of the windows that
    could have been full, the one that grew least sets the growth (the bound errs toward
    holding back)."""
    log = SentLog(60.0)
    _ramp(log, [60, 120])
    slope = SlopeLimit(log)
    slope.edge(9.9, 10.0)
    slope.edge(15.0, 20.0)
    assert slope.growth is not None
    assert 1.0 < slope.growth <= 2.0


def test_whole_second_neighbours_that_fit_alike_use_the_longer_until_an_edge_says() -> None:
    """Three full windows of a provider's 45 s window, each a ramp then a run turned away
    until the edge, read loosely (the first two within 5 s). The whole seconds between the
    first two edges fit 39-47 s; the third keeps 44 and 45 s, alike, and the longer is
    used (the shorter's edges come first: held to 44 s, a herd goes at 176 s into a window
    full until 180 s). An edge only 44 s puts where one is expected is no noise: another
    window that fits as well explains it, and it is used from then on."""
    log = SentLog(200.0)
    slope = SlopeLimit(log)

    def full_window(start: float, ramp: int, ramp_s: float, last: float, through: float) -> bool:
        for i in range(ramp):
            log.sent(start + (i + 0.5) * ramp_s / ramp)
        turned = [*(start + ramp_s + 0.5 + i for i in range(int(last - start - ramp_s))), last]
        for at in turned:
            log.sent(at)
            log.rejected(at)
            slope.turned(at)
        log.sent(through)
        return slope.edge(last, through)

    full_window(0.0, 60, 13.0, 43.5, 48.5)
    full_window(48.5, 120, 25.0, 86.9, 92.0)
    assert full_window(92.0, 240, 30.0, 134.2, 135.5)
    fitting = {window for window, fit in slope._fits.items() if fit.fits}
    assert (fitting, slope.window_s) == ({44.0, 45.0}, 45.0)
    assert full_window(135.5, 400, 30.0, 178.0, 178.6)
    assert slope.window_s == 44.0


def test_no_growth_is_read_while_a_longer_window_fits_and_read_a_floor() -> None:
    """One edge alone, at 20 s: read as 10 s windows the fleet's ramp shows a growth, but
    a 20 s window (or longer) fits it as well, and read that way its full window followed
    a quiet one and held the floor. A 15 s window taken for 10 s this way paced at a
    growth of 1.23 for a minute; no growth is taken until the windows are told apart."""
    log = SentLog(60.0)
    _ramp(log, [60, 120])
    slope = SlopeLimit(log)
    slope.edge(19.9, 20.0)
    assert slope.window_s == WINDOW_S
    assert slope.growth is None


def test_edges_fifteen_seconds_apart_rule_the_ten_second_window_out() -> None:
    """Edges at 15 and 30 fit no 10 s window (their phases differ by 5 s): the longest
    window that fits both is taken, 15 s (a 5 s window fits too but would overstate the
    growth per window)."""
    log = SentLog(60.0)
    _ramp(log, [40, 80, 160], window=15.0)
    slope = SlopeLimit(log)
    slope.edge(14.9, 15.0)
    assert slope.window_s == 10.0
    slope.edge(29.9, 30.0)
    assert slope.window_s == 15.0
    assert slope.growth == pytest.approx(2.0)


def _full_run(
    log: SentLog, slope: SlopeLimit, start: float, end: float, every: float = 1.0
) -> float:
    """Probes from ``start`` every ``every`` seconds to ``end``, each turned away by a
    burst 429; returns the last one's send time."""
    at = start
    while at <= end:
        log.sent(at)
        log.rejected(at)
        slope.turned(at)
        last, at = at, at + every
    return last


def test_a_run_turned_away_longer_than_a_window_rules_that_window_out() -> None:
    """A 30 s window spent 7 s in: probes turned away once a second until 29 s, the next
    through at 30 s. Edges at 30, 60, 90 s fit a 10 s window too; the run of 22 s fits no
    window shorter than itself, so the shortest longer one that fits is taken, 30 s, and
    it pins the next edge at 60 s (it stayed 10 s, probing at 40 and 50 s)."""
    log = SentLog(60.0)
    _ramp(log, [60], window=7.0)
    slope = SlopeLimit(log)
    last = _full_run(log, slope, 7.0, 29.0)
    slope.edge(last, 30.05)
    assert slope.window_s == 30.0
    assert slope.predicted(37.0) == pytest.approx(60.0 - 37.0, abs=0.7)


def test_a_run_another_limit_turned_away_rules_nothing_out() -> None:
    """The same sends, turned away by a per-minute limit (not a burst 429): an edge of the
    slope's window could have let them through that limit, so 10 s still fits."""
    log = SentLog(60.0)
    _ramp(log, [60], window=7.0)
    for at in range(7, 30):
        log.sent(float(at))
        log.rejected(float(at))
    slope = SlopeLimit(log)
    slope.edge(29.0, 30.05)
    assert slope.window_s == WINDOW_S


@pytest.mark.parametrize(
    ("retry_after", "window"),
    [(None, WINDOW_S), (23.0, 30.0), (22.95, 30.0), (2.0, WINDOW_S)],
    ids=["none", "whole-seconds", "fractional", "too-short-to-tell"],
)
def test_a_retry_after_says_no_edge_falls_before_it(
    retry_after: float | None, window: float
) -> None:
    """A 30 s window spent 7 s in, with Retry-After on: the 429 says when it frees, so the
    fleet holds until then and no probe runs to tell the window (one send turned away at
    7 s, the next through at 30 s). The provider's word is the run: no edge in (7, 30),
    which no 10 s window fits, and 30 s is taken. 23 whole seconds may be rounded up (an
    edge from 29 s on); without it, or with one too short to rule 10 s out, 10 s stays."""
    log = SentLog(60.0)
    _ramp(log, [60], window=7.0)
    slope = SlopeLimit(log)
    last = _full_run(log, slope, 7.0, 7.0)
    if retry_after is not None:
        slope.said_full(last, retry_after)
    log.sent(30.05)
    slope.edge(last, 30.05)
    assert slope.window_s == window


def test_a_retry_after_in_milliseconds_is_a_count_rounded_up_to_one() -> None:
    """A 10 s window's edges at 10 and 20 s. The second 429's ``retry-after-ms`` from
    17.31516 s said 2.685 s, 0.16 ms past the edge (rounded up to the millisecond): the
    edge at 20.0 s still fits, and the phase stays pinned there. Taken as exact, it
    refuted every window and the fit started over with the phase lost."""
    log = SentLog(60.0)
    _ramp(log, [60], window=7.0)
    slope = SlopeLimit(log)
    slope.said_full(_full_run(log, slope, 7.0, 7.0), 3.0)
    log.sent(10.03)
    slope.edge(7.0, 10.03)
    _ramp(log, [120], window=7.0, start=10.1)
    last = _full_run(log, slope, 17.31516, 17.31516)
    slope.said_full(last, 2.685)
    log.sent(20.059)
    slope.edge(last, 20.059)
    assert slope.window_s == WINDOW_S
    assert slope.predicted(21.0) == pytest.approx(9.0, abs=0.2)


def test_the_whole_second_windows_two_edges_allow() -> None:
    # Edges in (42, 45.05] and (89, 90.05]: 43.95-48.05 s apart, or a whole number of
    # windows of a half, a third... of that, down to the shortest window (5 s).
    assert between((42.0, 45.05), (89.0, 90.05)) == [
        5.0, 6.0, 8.0, 9.0, 11.0, 12.0, 15.0, 16.0, 22.0, 23.0, 24.0,
        44.0, 45.0, 46.0, 47.0, 48.0,
    ]  # fmt: skip
    assert between((9.9, 10.0), (19.9, 20.0)) == [5.0, 10.0]
    assert between((0.0, 0.1), (100.0, 100.1)) == [5.0, 10.0, 20.0, 25.0, 50.0]


def test_a_window_none_of_the_listed_fits_is_found_from_its_edges() -> None:
    """A 45 s window, growth 2, floor 60: turned away from 10 s to 44 s (no window of
    34 s or less fits), through at 45.05 s: 60 s is the one listed that fits. The next
    edge, in (89, 90.05], fits no listed window; of the whole-second windows the two
    edges allow, only 45 s fits them and the first run, and its growth is read off the
    counts. It started over at 10 s before, and learned no growth for the whole run."""
    log = SentLog(60.0)
    _ramp(log, [60])
    slope = SlopeLimit(log)
    last = _full_run(log, slope, 10.0, 44.0)
    log.sent(45.05)
    slope.edge(last, 45.05)
    assert (slope.window_s, slope.growth, slope.floor) == (60.0, None, 60)
    _ramp(log, [119], window=40.0, start=45.1)
    last = _full_run(log, slope, 86.0, 89.0)
    log.sent(90.05)
    slope.edge(last, 90.05)
    assert slope.window_s == 45.0
    assert slope.growth == pytest.approx(2.0)
    assert slope.predicted(100.0) == pytest.approx(35.0, abs=45 / 10)


def test_a_short_run_leaves_the_assumed_window() -> None:
    """A run of 3 s says nothing against 10 s: it stays the window used."""
    log = SentLog(60.0)
    _ramp(log, [60], window=7.0)
    slope = SlopeLimit(log)
    last = _full_run(log, slope, 7.0, 9.0)
    slope.edge(last, 10.05)
    assert slope.window_s == WINDOW_S


def test_a_hold_tries_the_next_window_that_fits_when_a_predicted_edge_was_not_one() -> None:
    """A 20 s window: the first run (7-19 s) rules out 10 s, and its edge at 20 s fits
    15 s (phase 5) as well as 20, 30 and 60 s. 15 s is used: the next full window holds
    until 35 s. The probe there is turned away, and the run since (27.6-35.5 s) rules
    15 s out: the hold now lasts to 20 s's edge, 40 s, not to 15 s's next (50 s)."""
    log = SentLog(60.0)
    _ramp(log, [60], window=7.0)
    slope = SlopeLimit(log)
    last = _full_run(log, slope, 7.0, 19.0)
    slope.edge(last, 20.05)
    assert slope.window_s == 15.0
    for i in range(60):  # the next window fills by 27.6 s
        log.sent(20.05 + i * 0.12)
    turned = _full_run(log, slope, 27.6, 27.6)
    assert 27.6 + slope.hold(27.6, turned) == pytest.approx(35.0, abs=0.5)
    probe = _full_run(log, slope, 35.5, 35.5)
    assert 35.5 + slope.hold(35.5, probe) == pytest.approx(40.0, abs=0.5)


def test_a_hold_probes_a_shorter_windows_edge_once_one_was_read_at_it() -> None:
    """An edge at 10 s fits 10 s (the window used) and 5 s alike. A full window at 12 s
    holds to the first edge either asks for: 5 s's at 15 s, not 10 s's at 20 s. Held to
    the longer one only, the peak x10 with a 5 s window spent the provider's next window
    idle (seed 3: 1.049x the oracle; 1.009x probing both)."""
    log = SentLog(60.0)
    _ramp(log, [60, 120])
    slope = SlopeLimit(log)
    slope.edge(9.9, 10.0)
    assert slope.window_s == WINDOW_S
    turned = _full_run(log, slope, 12.0, 12.0)
    assert 12.0 + slope.hold(12.0, turned) == pytest.approx(15.0, abs=0.21)


def test_the_phase_pins_the_next_edge_and_the_hold_lasts_until_it() -> None:
    log = SentLog(60.0)
    _ramp(log, [60, 120, 240])
    slope = SlopeLimit(log)
    assert slope.predicted(5.0) is None  # nothing seen: no phase
    assert slope.hold(5.0) == WINDOW_S / 10  # probe again in a tenth of a window
    slope.edge(9.9, 10.0)
    assert slope.predicted(25.0) == pytest.approx(5.0)
    # One edge fits a 15 s window too (edges at 10, 25, 40 s): its edge at 25 s is probed
    # first, as the one probe that tells the two apart.
    assert 25.0 + slope.hold(25.0) == pytest.approx(25.0, abs=0.21)
    slope.edge(19.9, 20.0)  # a second edge 10 s on: no longer window fits both
    assert slope.hold(25.0) == pytest.approx(5.0)


def test_sends_are_held_to_the_learned_growth_over_the_providers_windows() -> None:
    """Growth 2 learned at 20 s, the phase pinned by edges at 10 and 20 s to the bin
    (19.8, 20]: the provider's window from then may hold 2 x the 118 sends surely before
    it, and the 2 sends inside the bin count as the current window's. Filled to that at
    25 s, the next send waits for the next window, at 30 s (counted over trailing
    windows, it waited for the window's oldest send to leave it, and the fleet's next
    burst a window's sends late)."""
    log = SentLog(60.0)
    _ramp(log, [60, 120])
    slope = SlopeLimit(log)
    slope.edge(9.9, 10.0)
    slope.edge(19.9, 20.0)
    assert slope.growth == pytest.approx(2.0)
    assert slope.wait(20.0) == 0.0
    for _ in range(233):
        log.sent(25.0)
    assert slope.wait(25.0) == 0.0  # the 236th in the window fits
    log.sent(25.0)
    assert 25.0 + slope.wait(25.0) == pytest.approx(30.0)
    assert slope.wait(30.0 + 1e-6) == 0.0


def test_each_phase_the_edges_allow_counts_its_own_windows() -> None:
    """Edges at 10 and 20 s known to three bins, (9.4, 10.0]: growth 2. The window from
    about 20 s holds 50 sends spread over 20-29.4 s and a burst of 100 at 29.45 s, inside
    the first bin. At 30.05 s every phase's window has begun. If the phase is 9.6 the
    burst is that window's, whose window before held the 55 sends from 19.6 s: room for
    10 more, then the send waits for that phase's next edge, 39.6 s; at 9.8 or 10.0 the
    burst was the window before's, and 300 fit. Counted across the whole span at once,
    the burst was the current window's and not the previous one's: held to 2 x 50 with
    100 sent, nothing went until 40 s."""
    log, slope = _growth_two_learned(after=(9.2, 19.4))
    assert slope.growth == pytest.approx(2.0)
    for i in range(50):
        log.sent(20.0 + i * 9.4 / 50)
    for _ in range(100):
        log.sent(29.45)
    sent = 0
    while slope.wait(30.05) == 0.0:
        log.sent(30.05)
        sent += 1
    assert sent == 10
    assert 30.05 + slope.wait(30.05) == pytest.approx(39.6)


def test_a_rule_that_holds_sends_for_six_windows_with_no_429_is_forgotten() -> None:
    """Growth 1.1 and floor 3, learned wrong (a shared pool's 429s taught the peak x10 such
    a rule): held to ``max(3, 1.1 x the window before)``, sends never grow. After six
    windows in a row that each held a send, with no burst 429 meanwhile, the rule is
    forgotten and sends go until the provider says otherwise. A burst 429 within the
    stretch, or a window with nothing held, starts it over."""
    log = SentLog(60.0)
    _ramp(log, [30, 33])
    slope = SlopeLimit(log)
    slope.edge(9.9, 10.0)
    slope.edge(19.9, 20.0)
    slope.growth, slope.floor = 1.1, 3
    at = 20.0
    held_at = []
    while at < 200.0 and slope.growth is not None:
        wait = slope.wait(at)
        if wait == 0.0:
            log.sent(at)
            at += 0.01
        else:
            held_at.append(at)
            at += wait
    assert slope.growth is None
    assert slope.floor == 0
    assert held_at[0] < 21.0  # held from the start
    assert held_at[0] + 6 * 10.0 <= at <= held_at[0] + 7 * 10.0  # forgotten six windows on
    assert slope.wait(at) == 0.0
    # A burst 429 within the stretch keeps the rule.
    kept = SlopeLimit(log)
    kept.edge(9.9, 10.0)
    kept.edge(19.9, 20.0)
    kept.growth, kept.floor = 1.1, 3
    for k in range(12):
        now = 200.0 + k * 10.0
        kept.turned(now)  # the provider turns one away each window
        for i in range(40):
            if kept.wait(now + i * 0.01) == 0.0:
                log.sent(now + i * 0.01)
    assert kept.growth == 1.1


def test_sends_are_held_over_trailing_windows_while_the_phase_is_loose() -> None:
    """Edges known only to within 5 s: the trailing window counts. Right after the edge it
    is the full one (120 of 2 x 60): a send waits until its oldest send leaves it."""
    log = SentLog(60.0)
    _ramp(log, [60, 120])
    slope = SlopeLimit(log)
    slope.edge(5.0, 10.0)
    slope.edge(15.0, 20.0)
    oldest = log.first_after(10.0)
    assert oldest is not None
    assert slope.growth is not None
    assert slope.wait(20.0) == pytest.approx(oldest + 10.0 - 20.0)


def _growth_two_learned(after: tuple[float, float] = (9.9, 19.9)) -> tuple[SentLog, SlopeLimit]:
    """Windows of 60 and 120 sends, edges at 10 and 20 s (each after the send at
    ``after``'s): a 10 s window, growth 2."""
    log = SentLog(60.0)
    _ramp(log, [60, 120])
    slope = SlopeLimit(log)
    slope.edge(after[0], 10.0)
    slope.edge(after[1], 20.0)
    return log, slope


def test_an_edge_well_inside_the_allowance_teaches_nothing_until_it_repeats() -> None:
    """Growth 2 learned. At 25 s the window from 20 s holds 100 of its 236 allowed, and a
    shared pool's 429 (confirmed by a second) ends in an "edge" at 25.5 s: read as one, it
    would move the phase and teach the steady rate around it as a growth. It is ignored;
    another such edge within two windows is taken (the provider may have lowered its rule)."""
    log, slope = _growth_two_learned()
    for i in range(100):
        log.sent(20.0 + i * 0.05)
    assert slope.inside(25.0)
    assert not slope.edge(25.0, 25.5)
    assert slope.growth == pytest.approx(2.0)
    assert slope.predicted(26.0) == pytest.approx(4.0)  # the phase at 0 s stands
    slope.edge(25.5, 26.0)  # the second word: taken, and no window fits phase 0 with it
    assert slope.predicted(26.5) != pytest.approx(3.5)


@pytest.mark.parametrize("run", [False, True], ids=["lone", "a-run"])
def test_a_lone_429_that_ends_a_window_tells_its_edge_not_its_count(run: bool) -> None:
    """Growth 2 learned. The window from 20 s holds 230 of its 240 allowed by 24.6 s, a
    send at 25 s is turned away, and the probe at 30 s gets through. If the send before
    it got through, the 429 was lone: a shared pool's as likely as a full window's (at
    90-100 % of the allowance it is not told apart), so the edge pins the phase but
    teaches no growth. Read as full, such windows taught ever lower growths (the least
    ratio is kept): 2.0, 1.87, 1.69, ... 1.00 in ten windows at the peak x10 with a 5 %
    pool. A run turned away is a full window's: 230 / 120 is learned."""
    log, slope = _growth_two_learned()
    for i in range(230):
        log.sent(20.0 + i * 0.02)
    turned = [25.0, 25.01] if run else [25.0]
    for at in turned:
        log.sent(at)
        log.rejected(at)
        slope.turned(at)
    assert not slope.inside(turned[0])
    slope.edge(turned[-1], 30.0)
    assert slope.growth == pytest.approx(230 / 120 if run else 2.0)
    assert slope.predicted(31.0) == pytest.approx(9.0)  # the phase at 0 s stands


def _pinned_at_its_allowance() -> tuple[SentLog, SlopeLimit]:
    """Growth 2 learned from edges at 10 and 20 s; the window from 20 s holds 238 of its
    240 allowed by 21.7 s: a 429 then is not inside the allowance."""
    log, slope = _growth_two_learned()
    for i in range(238):
        log.sent(20.0 + i * 0.007)
    assert not slope.inside(21.7)
    return log, slope


def test_an_edge_against_a_pinned_window_waits_for_a_second_within_two_windows() -> None:
    """At its allowance, a shared pool's 429 at 21.7 s and a probe through at 26.8 s put an
    "edge" where the 10 s window (pinned by two full windows) has none. Taken at once, the
    peak x10 with a 5 % pool moved to an 8 s window there and let a herd go into the
    provider's full one. It is held as a suspect: a second such edge within two windows
    is taken with it."""
    log, slope = _pinned_at_its_allowance()
    assert not slope.edge(21.7, 26.8)
    assert (slope.window_s, slope.growth) == (10.0, pytest.approx(2.0))
    assert slope.predicted(27.0) == pytest.approx(3.0)  # the phase at 0 s stands
    for i in range(30):
        log.sent(27.0 + i * 0.1)
    for i in range(520):  # 536 allowed from 30 s (2 x 268)
        log.sent(30.0 + i * 0.005)
    assert not slope.inside(32.6)
    assert slope.edge(32.6, 37.6)  # the second word: no 10 s phase fits both
    assert slope.window_s != 10.0


def test_a_suspect_edge_is_forgotten_after_two_windows() -> None:
    _, slope = _pinned_at_its_allowance()
    assert not slope.edge(21.7, 26.8)
    assert not slope.edge(53.6, 57.6)  # more than two windows on: a suspect of its own
    assert slope.window_s == 10.0


def test_a_rejection_well_inside_the_allowance_is_told_apart() -> None:
    log = SentLog(60.0)
    _ramp(log, [60, 120])
    slope = SlopeLimit(log)
    assert not slope.inside(20.0)  # nothing learned: nothing is noise
    slope.edge(9.9, 10.0)
    slope.edge(19.9, 20.0)
    assert slope.inside(25.0)  # the window from 20 s holds none of an allowance of 2 x 120
    for _ in range(216):
        log.sent(25.0)
    assert not slope.inside(25.0 + 1e-6)  # at 90 % of the allowance: a full window


# --------------------------------------------------------------------------- on a gate


def _learned(clock: FakeClock) -> tuple[Gate, AdaptiveLimit]:
    """A paced limit that learned growth 2 (windows of 60 and 120 sends, edges at 10
    and 20 s), then sent 50 in 20-25 s: well inside the 240 the window from 20 s allows."""
    gate = Gate(32, name="noise", clock=clock)
    limit = AdaptiveLimit(gate, clock=clock, pace_burst_rate=True)
    slope = limit._sends.slope
    for at in [i / 6 for i in range(60)] + [10 + i / 12 for i in range(120)]:
        clock.now = at
        assert limit.reserve_send(at) == 0.0
    slope.edge(9.9, 10.0)
    slope.edge(19.9, 20.0)
    assert slope.growth == pytest.approx(2.0)
    for i in range(50):
        clock.now = 20.0 + i * 0.1
        assert limit.reserve_send(clock.now) == 0.0
    return gate, limit  # the limit holds its gate weakly


def test_a_shared_pools_429s_well_inside_the_slope_are_noise_unless_they_run() -> None:
    """Growth 2 learned, the window well inside its allowance. A 429 whose send came
    right after one that got through (or is still out) is a shared pool's: ignored, however
    many come within a window (each one checked held the fleet its grace: shared pool 8 %,
    1.018x the oracle). Two sends in a row turned away are a full window's sign: checked."""
    clock = FakeClock()
    _gate, limit = _learned(clock)
    for sent in (25.0, 25.05, 25.1):  # 25.05 is still out
        assert limit.reserve_send(sent) == 0.0
    for sent in (25.0, 25.1):
        clock.now = sent + 0.1
        limit.rejected(sent)
        assert limit.on_throttle(limit.generation, None, admitted_at=sent) is None
    assert limit.statistics().checked_throttles == 0
    assert limit.pause_left() == 0.0
    for sent in (25.15, 25.2, 25.25):  # 25.15 got through
        assert limit.reserve_send(sent) == 0.0
    clock.now = 25.3
    limit.rejected(25.2)
    assert limit.on_throttle(limit.generation, None, admitted_at=25.2) is None
    assert limit.statistics().checked_throttles == 0  # the one before it got through
    limit.rejected(25.25)
    assert limit.on_throttle(limit.generation, None, admitted_at=25.25) is None
    assert limit.statistics().checked_throttles == 1  # two in a row: checked


@pytest.mark.parametrize("noise", [False, True], ids=["quiet", "after-noise"])
def test_a_lone_429_at_the_allowance_is_noise_after_noise_within_a_window(noise: bool) -> None:
    """Growth 2 learned, the window from 20 s filled to its allowance, and a lone 429 (the
    send before it got through) at its end. With no noise seen it is the window's: the
    fleet holds to the edge. After a 429 well inside the allowance within a window (a
    shared pool's), it is as likely the pool's, and goes ahead as noise: at the peak x10
    a 5 % pool's 429 lands in the last tenth of nearly every window's allowance, and each
    held the fleet to the edge (seed 2: 1.45x the oracle). A full window's run still
    holds (test above)."""
    clock = FakeClock()
    _gate, limit = _learned(clock)
    if noise:
        clock.now = 24.95
        limit.rejected(24.9)
        assert limit.on_throttle(limit.generation, None, admitted_at=24.9) is None
    at = 25.0
    while limit.reserve_send(at) == 0.0:  # up to the window's allowance
        last, at = at, at + 0.01
        clock.now = at
    call = object()
    clock.now = at + 0.05
    limit.rejected(last)
    change = limit.on_throttle(limit.generation, None, admitted_at=last, caller=call)
    assert limit.statistics().checked_throttles == 0
    if noise:
        assert change is None
        assert limit.pause_left() == 0.0
        assert limit.goes_ahead(call)
    else:
        assert change is not None  # held to the predicted edge, 30 s
        assert clock.now + limit.pause_left() == pytest.approx(30.0, abs=0.2)


@pytest.mark.parametrize("late", [False, True], ids=["within-grace", "after-grace"])
def test_a_checks_probe_turned_away_well_inside_the_slope_is_checked_again(late: bool) -> None:
    """Two sends in a row turned away well inside the learned slope start a check. Its
    probe, turned away too, is as likely a shared pool's: checked once more, no pause.
    Within its grace that is the strike rule; after it (the check ended, the fleet went
    on), a late answer is a first throttle again. Either one taken as a pause held the
    fleet 5 s with the slots idle (shared pool 5 %, seeds 6-10: 1.027x the oracle;
    checked, 1.007x)."""
    clock = FakeClock()
    _gate, limit = _learned(clock)
    first, second = object(), object()
    for sent in (25.0, 25.2):
        assert limit.reserve_send(sent) == 0.0
    clock.now = 25.25
    limit.rejected(25.0)
    assert limit.on_throttle(limit.generation, None, admitted_at=25.0, caller=first) is None
    assert limit.statistics().checked_throttles == 0  # alone so far
    limit.rejected(25.2)
    assert limit.on_throttle(limit.generation, None, admitted_at=25.2, caller=second) is None
    assert limit.statistics().checked_throttles == 1
    clock.now = 25.3
    assert limit.pass_pause(second) == (0.0, True)  # the check's probe: the call's retry
    assert limit.reserve_send(25.3) == 0.0
    if late:
        clock.now = 26.0  # its grace is over: the next to ask ends the check
        assert limit.pass_pause(first) == (0.0, False)
    clock.now = 26.1
    limit.rejected(25.3)
    change = limit.on_throttle(limit.generation, None, probe=True, admitted_at=25.3, caller=second)
    assert change is None
    assert limit.pause_left() == 0.0
    assert limit.statistics().checked_throttles == 2
    assert limit.pass_pause(second) == (0.0, True)  # checked again, by the same call


def test_a_429_taken_for_noise_sends_its_call_ahead_of_fresh_calls_once() -> None:
    """A burst 429 well inside the learned slope, its send's predecessor not turned
    away: noise, no check. The provider would have served the call: its retry queues ahead of fresh
    calls, once (a check's probe, the throttled call's retry, always did). The mark goes
    with the call's end, retried or not."""
    clock = FakeClock()
    _gate, limit = _learned(clock)
    noisy, other = object(), object()
    assert limit.reserve_send(25.0) == 0.0
    clock.now = 25.1
    limit.rejected(25.0)
    assert limit.on_throttle(limit.generation, None, admitted_at=25.0, caller=noisy) is None
    assert limit.statistics().checked_throttles == 0
    assert not limit.goes_ahead(other)
    assert limit.goes_ahead(noisy)
    assert not limit.goes_ahead(noisy)  # once
    assert limit.reserve_send(39.9) == 0.0
    clock.now = 40.0  # another: noise again
    limit.rejected(39.9)
    assert limit.on_throttle(limit.generation, None, admitted_at=39.9, caller=noisy) is None
    limit.disown(noisy)  # the call ended (out of attempts, or its 429 handed back)
    assert not limit.goes_ahead(noisy)


def test_a_burst_throttle_holds_a_tenth_of_a_window_and_cuts_nothing() -> None:
    """A confirmed burst 429 on a paced gate: no concurrency cut, a pause of a tenth of a
    window (the next probe), and the probe getting through marks the window's edge."""
    clock = FakeClock()
    gate = Gate(32, name="slope", clock=clock)
    limit = AdaptiveLimit(gate, clock=clock, pace_burst_rate=True)
    log = limit._sends.requests.log  # the sends the adaptive limit counted
    for i in range(60):
        clock.now = i * 0.1
        assert limit.reserve_send(clock.now) == 0.0
    clock.now = 6.0
    assert limit.on_throttle(limit.generation, None, admitted_at=5.99) is None  # checked
    assert limit.pass_pause() == (0.0, True)
    change = limit.on_throttle(limit.generation, None, probe=True, admitted_at=6.0)
    assert change is not None
    assert (change.old, change.new) == (32, 32)
    assert limit.pause_left() == pytest.approx(WINDOW_S / 10)
    clock.now = 10.05
    assert limit.pass_pause() == (0.0, True)  # the probe, sent at 10.05
    assert limit.reserve_send(10.05) == 0.0
    limit.on_success(probe=True)
    stats = limit.statistics()
    # The full window ended in (6.0, 10.05]: it held the 58 sends not turned away (or 59
    # and 60 for a window reaching back before the first send).
    assert log.count(0.0, 6.0) <= stats.slope_floor <= log.count(0.0, 10.05)
    assert stats.slope_floor > 0
    assert stats.slope_growth is None
    assert gate.capacity == 32


def _paused(clock: FakeClock) -> tuple[Gate, AdaptiveLimit, object]:
    """60 sends in 0-6 s, then a burst 429 at 6 s confirmed by its check's probe: a pause
    of a tenth of a window, its probe kept for the throttled call (returned)."""
    gate = Gate(32, name="slope", clock=clock)
    limit = AdaptiveLimit(gate, clock=clock, pace_burst_rate=True)
    call = object()
    for i in range(60):
        clock.now = i * 0.1
        assert limit.reserve_send(clock.now) == 0.0
    clock.now = 6.0
    limit.rejected(5.9)
    assert limit.on_throttle(limit.generation, None, admitted_at=5.9, caller=call) is None
    assert limit.pass_pause(call) == (0.0, True)  # the check's probe
    assert limit.reserve_send(6.0, call) == 0.0
    limit.rejected(6.0)
    assert limit.on_throttle(None, None, probe=True, admitted_at=6.0, caller=call) is not None
    assert limit.pause_left() == pytest.approx(WINDOW_S / 10)
    return gate, limit, call


def test_a_pauses_probe_finds_the_edge_where_it_went_not_where_it_got_the_role() -> None:
    """The pause's probe is given its role at 7 s and held (by the slope, the slots) until
    7.5 s: the window's edge lies before 7.5 s, not 7 s. Taken from the role, a probe
    held 2.6 s put the edge 0.2 s before the provider's, and the herd aligned to it went
    into the full window (the peak x10 with a 5 s window, seed 3: 486 calls turned
    away)."""
    clock = FakeClock()
    _gate, limit, call = _paused(clock)
    clock.now = 7.0
    assert limit.pass_pause(call) == (0.0, True)
    other = object()
    clock.now = 7.5
    assert limit.pass_pause(other)[0] > 0  # the grace runs from the probe's send
    assert limit.reserve_send(7.5, call) == 0.0
    clock.now = 8.0
    limit.on_success(probe=True, caller=call)
    assert limit._sends.slope._edges[-1][:2] == (6.0, 7.5)


def _probe_named_at_the_edge(clock: FakeClock) -> tuple[Gate, AdaptiveLimit, object]:
    """Growth 2 learned (:func:`_learned`), the window from 20 s filled to its allowance
    and a burst 429 at its end: the pause holds to the predicted edge (30 s), where the
    throttled call (returned) is named the probe, not yet sent. The gate is returned to
    keep it alive (the limit holds it weakly)."""
    gate, limit = _learned(clock)
    call = object()
    at = 25.0
    while limit.reserve_send(at) == 0.0:  # up to the window's allowance
        at += 0.025
        clock.now = at
    clock.now = 29.95
    limit.rejected(29.9)
    assert limit.on_throttle(limit.generation, None, admitted_at=29.9, caller=call) is not None
    clock.now = 30.0
    assert limit.pass_pause(call) == (0.0, True)
    return gate, limit, call


@pytest.mark.parametrize("through", [True, False])
def test_a_probe_its_grace_outlasted_is_an_edge_only_once_it_got_through(through: bool) -> None:
    """Slope learned, a window filled to its allowance and a 429 at its end: the pause
    holds to the predicted edge (30 s). Its probe unanswered for its grace (1 s), the
    others go; the window's edge is the probe's send only once it gets through. Turned
    away after its grace, its send was inside the full window: taken as the edge, the
    window's phase would be off by that much."""
    clock = FakeClock()
    _gate, limit, call = _probe_named_at_the_edge(clock)
    slope = limit._sends.slope
    assert limit.reserve_send(30.0, call) == 0.0
    before = list(slope._edges)
    clock.now = 31.0
    assert limit.pass_pause(object()) == (0.0, False)  # the grace is over: everyone goes
    assert slope._edges == before
    clock.now = 31.2
    if through:
        limit.on_success(probe=True, caller=call)
        assert slope._edges[-1][:2] == (29.9, 30.0)
    else:
        limit.rejected(30.0)
        limit.on_throttle(None, None, probe=True, admitted_at=30.0, caller=call)
        assert slope._edges == before
        limit.on_success(probe=True, caller=call)  # its retry got through: no late edge
        assert all(edge[1] != 30.0 for edge in slope._edges)


def test_a_probe_that_goes_after_its_grace_let_the_others_go_finds_the_edge_there() -> None:
    """Named the probe at 30 s and held (by the slope, the slots) past its grace: the
    others go at 31 s, the probe at 31.5 s, and once it gets through the edge is there."""
    clock = FakeClock()
    _gate, limit, call = _probe_named_at_the_edge(clock)
    slope = limit._sends.slope
    clock.now = 31.0
    assert limit.pass_pause(object()) == (0.0, False)  # its grace is over: everyone goes
    clock.now = 31.5
    assert limit.reserve_send(31.5, call) == 0.0
    clock.now = 32.0
    limit.on_success(probe=True, caller=call)
    assert slope._edges[-1][:2] == (29.9, 31.5)


@pytest.mark.parametrize("late", [False, True], ids=["within-grace", "after-grace"])
@pytest.mark.parametrize("case", ["a-run-at-an-edge-that-fits", "alone", "a-run-elsewhere"])
def test_a_checks_probe_through_after_a_run_found_an_edge_where_one_fits(
    case: str, late: bool
) -> None:
    """60 sends in 5-10 s and an edge at 10 s, then 120 in the next 5 s. A check's probe
    that got through says the 429 was noise, or that the window ended between the two.
    A full window turns away every send after it filled, a shared pool's 429s come alone:
    after a run of two or more of ours turned away, and where a window that fits the
    edges seen puts one, the probe's send is an edge (within its grace or accepted after
    it): here at 15 s, and the 5 s window with growth 2 is learned. Read as noise, the
    peak x10 with a 5 s window missed the edge a probe crossed at 10.0 s and learned the
    window only at 17.7 s (as 15 s), its herd held to 48 calls meanwhile (seed 1: 1.046x
    the oracle). A lone 429 is noise; so is a run where no window puts an edge (a shared
    pool's runs of two fall anywhere)."""
    clock = FakeClock()
    gate = Gate(32, name="slope", clock=clock)
    limit = AdaptiveLimit(gate, clock=clock, pace_burst_rate=True)
    slope = limit._sends.slope
    end = 12.5 if case == "a-run-elsewhere" else 15.0
    sends = [5 + i / 12 for i in range(60)] + [10 + i / 24 for i in range(int((end - 10.05) * 24))]
    for at in [*sends, end - 0.05, end - 0.03]:
        clock.now = at
        assert limit.reserve_send(at) == 0.0
    slope.edge(9.9, 10.0)
    edges = list(slope._edges)
    call, other = object(), object()
    clock.now = end
    limit.rejected(end - 0.05)
    assert limit.on_throttle(limit.generation, None, admitted_at=end - 0.05, caller=call) is None
    assert limit.pass_pause(call) == (0.0, True)  # the check's probe
    assert limit.reserve_send(end, call) == 0.0
    if case != "alone":  # the send after it was turned away too: its 429 comes meanwhile
        clock.now = end + 0.02
        limit.rejected(end - 0.03)
        assert (
            limit.on_throttle(limit.generation, None, admitted_at=end - 0.03, caller=other) is None
        )
    if late:
        clock.now = end + 0.2  # the check's grace (0.1 s) is over: the next to ask ends it
        assert limit.pass_pause(object()) == (0.0, False)
    assert slope._edges == edges
    clock.now = end + 0.3
    limit.on_success(probe=True, caller=call)
    assert limit.statistics().throttles == 0
    if case == "a-run-at-an-edge-that-fits":
        assert slope._edges[-1][:2] == (end - 0.03, end)
        assert (slope.window_s, slope.growth) == (5.0, pytest.approx(2.0, rel=0.05))
    else:
        assert slope._edges == edges


# --------------------------------------------------------------------------- a policy


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", [mock_clock()])
async def test_a_policy_learns_a_slope_rule_and_keeps_to_it() -> None:
    """A provider that lets each 10 s window hold max(20, 2 x the previous one) and turns
    the rest away with a burst 429 (aligned to its own clock, 3 s off ours). 400 calls
    arrive at once: every call succeeds, the policy learns growth 2 and the 10 s window,
    and once learned (from the third window on) almost nothing is turned away."""
    start = anyio.current_time()
    counts: dict[int, int] = {}
    turned: list[float] = []

    def allowed(index: int) -> int:
        return max(20, math.floor(2 * counts.get(index - 1, 0)))

    async def provider() -> str:
        now = anyio.current_time() - start + 3.0
        index = math.floor(now / 10.0)
        if counts.get(index, 0) >= allowed(index):
            turned.append(now)
            await anyio.sleep(0.05)
            raise burst()
        counts[index] = counts.get(index, 0) + 1
        await anyio.sleep(1.0)
        return "ok"

    policy = Policy(
        name="slope-policy",
        max_concurrent_calls=64,
        retry=RetryConfig(throttle_attempts=50, max_attempts=50),
        clock=anyio.current_time,
        adaptive_concurrency=AdaptiveConfig(pace_burst_rate=True),
    )
    results: list[Any] = []

    async def one() -> None:
        results.append(await policy.call(provider))

    async with anyio.create_task_group() as tg:
        for _ in range(400):
            tg.start_soon(one)
    assert results == ["ok"] * 400
    stats = policy.adaptive_limit.statistics()
    assert stats.slope_window_s == 10.0
    assert stats.slope_growth == pytest.approx(2.0, rel=0.1)
    late = [t for t in turned if t >= 30.0]
    assert len(late) <= 4, turned


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", [mock_clock()])
async def test_an_attempt_the_slope_holds_waits_for_a_pause_that_began_meanwhile() -> None:
    """Growth 2 learned (edges at -10 s and 0 s) and the window from 0 s filled to its
    allowance: a call at 1 s is held by the slope until the next edge, 10 s. At 2 s a 429
    with Retry-After 20 s pauses the fleet until 22 s. The held call's wait ends during
    the pause: it passes the pause as everyone does, and goes (as its probe) at 22 s.
    Before, it went at 10 s, into the window the provider said stayed spent (a release's
    waves did the same: 21 sends turned away at once, reject latency 0.6 s, seed 1)."""
    policy = Policy(
        name="held-then-paused",
        max_concurrent_calls=8,
        clock=anyio.current_time,
        adaptive_concurrency=AdaptiveConfig(pace_burst_rate=True),
    )
    limit = policy.adaptive_limit
    slope = limit._sends.slope
    t0 = anyio.current_time()
    for at in [t0 - 20 + i / 6 for i in range(60)] + [t0 - 10 + i / 12 for i in range(120)]:
        assert limit.reserve_send(at) == 0.0
    slope.edge(t0 - 10.1, t0 - 10.0)
    slope.edge(t0 - 0.1, t0)
    assert slope.growth == pytest.approx(2.0)
    at = t0
    while limit.reserve_send(at) == 0.0:  # the window from 0 s, to its allowance
        at += 0.001
    sent: list[float] = []

    async def provider() -> str:
        sent.append(anyio.current_time() - t0)
        return "ok"

    await anyio.sleep(1.0)
    async with anyio.create_task_group() as tg:
        tg.start_soon(policy.call, provider)
        await anyio.sleep(1.0)
        assert sent == []  # held by the slope
        change = limit.on_throttle(limit.generation, 20.0, admitted_at=at)
        assert change is not None
        assert limit.pause_left() == pytest.approx(20.0)
    assert sent == [pytest.approx(22.0)]


def test_a_blocking_attempt_the_slope_holds_waits_for_a_pause_that_began_meanwhile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The test above on the blocking path (``call_sync``), whose waits are the thread's
    sleeps: here they move the policy's clock instead, and the first (the slope's hold,
    from 1 s to 10 s) is where a 429 with Retry-After 20 s arrives, at 2 s. The held call
    passes that pause when its hold ends and goes at 22 s, not into the spent window at
    10 s."""
    clock = FakeClock()
    clock.now = 100.0
    policy = Policy(
        name="held-then-paused-sync",
        max_concurrent_calls=8,
        clock=clock,
        adaptive_concurrency=AdaptiveConfig(pace_burst_rate=True),
    )
    limit = policy.adaptive_limit
    assert limit is not None
    slope = limit._sends.slope
    t0 = clock.now
    for at in [t0 - 20 + i / 6 for i in range(60)] + [t0 - 10 + i / 12 for i in range(120)]:
        assert limit.reserve_send(at) == 0.0
    slope.edge(t0 - 10.1, t0 - 10.0)
    slope.edge(t0 - 0.1, t0)
    at = t0
    while limit.reserve_send(at) == 0.0:  # the window from 0 s, to its allowance
        at += 0.001
    sleeps: list[tuple[float, float]] = []

    def sleep(seconds: float) -> None:
        sleeps.append((clock.now - t0, seconds))
        if len(sleeps) == 1:  # the slope's hold: a 429 comes back 1 s into it
            clock.now += 1.0
            assert limit.on_throttle(limit.generation, 20.0, admitted_at=at) is not None
            seconds -= 1.0
        clock.now += seconds

    sent: list[float] = []

    def provider() -> str:
        sent.append(clock.now - t0)
        return "ok"

    monkeypatch.setattr(admission.time, "sleep", sleep)
    clock.now = t0 + 1.0
    assert policy.call_sync(provider) == "ok"
    assert sleeps[0] == (1.0, pytest.approx(9.0))  # held by the slope until 10 s
    assert sent == [pytest.approx(22.0)]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", [mock_clock()])
async def test_sends_an_outage_answered_fill_no_window() -> None:
    """The slope provider above, down from 30 s to 50 s (every request answered 503,
    counted nowhere). Counted as sent, the outage's attempts made the window before the
    recovery look busy: the learned rule then let the waiting herd go at twice that, and
    the first window after the quiet one (20 allowed) turned most of it away. Not
    counted, the recovery keeps to the floor: nothing in it is turned away."""
    start = anyio.current_time()
    counts: dict[int, int] = {}
    turned: list[float] = []

    async def provider() -> str:
        now = anyio.current_time() - start
        if 30.0 <= now < 50.0:
            await anyio.sleep(0.05)
            raise ResponseError(503, body={"error": {"message": "The server is overloaded."}})
        index = math.floor(now / 10.0)
        if counts.get(index, 0) >= max(20, math.floor(2 * counts.get(index - 1, 0))):
            turned.append(now)
            await anyio.sleep(0.05)
            raise burst()
        counts[index] = counts.get(index, 0) + 1
        await anyio.sleep(1.0)
        return "ok"

    policy = Policy(
        name="slope-outage",
        max_concurrent_calls=16,
        retry=RetryConfig(max_attempts=100, throttle_attempts=50, cap_delay_ms=2000),
        circuit_breaker=False,
        clock=anyio.current_time,
    )
    results: list[Any] = []

    async def one() -> None:
        results.append(await policy.call(provider))

    async with anyio.create_task_group() as tg:
        for _ in range(300):
            tg.start_soon(one)
            await anyio.sleep(0.25)
    assert results == ["ok"] * 300
    assert policy.adaptive_limit.statistics().slope_growth is not None
    after = [t for t in turned if t >= 50.0]
    assert len(after) <= 2, turned


def test_slot_holders_held_back_are_not_counted_at_the_provider() -> None:
    """A concurrency 429 is counted against the calls at the provider: an attempt waiting
    out a check's grace (or a window's hold) holds a slot but is not there. It counts again
    once it is let go, or when it leaves the hold without sending."""
    clock = FakeClock()
    gate = Gate(32, name="held", clock=clock)
    limit = AdaptiveLimit(gate, clock=clock, pace_burst_rate=True)
    assert limit.sending(10) == 10
    assert limit.on_throttle(limit.generation, None, admitted_at=0.0) is None  # a check
    first, second = object(), object()
    assert limit.pass_pause(first) == (0.0, True)  # the check's probe: at the provider
    wait, probe = limit.pass_pause(second)
    assert wait > 0
    assert not probe
    assert limit.sending(10) == 9  # the second waits out the grace, holding its slot
    limit.unhold(second)  # it left (cancelled) without sending
    assert limit.sending(10) == 10
    assert limit.pass_pause(second)[0] > 0
    assert limit.sending(10) == 9
    clock.now += wait
    assert limit.pass_pause(second) == (0.0, False)  # the grace is over
    assert limit.reserve_send(clock.now, second) == 0.0  # sent
    assert limit.sending(10) == 10


def test_a_pass_counts_the_calls_sent_before_it_not_the_holders_yet_to_ask() -> None:
    """The most in service that got through is counted at a pass's send, in send order:
    of 56 slot holders the gate admitted at once, 21 went (the others had not asked yet,
    then waited); a pass among them read 56 holders not held back, and the old count took
    it for the most in service (42 in the outage scenario with plain 429s, seed 9). Then
    40 sent at one instant, the last 8 turned away: the 32nd's pass counts 32, the 429s
    of those sent after it in that instant not subtracted from it."""
    clock = FakeClock()
    gate = Gate(math.inf, name="order", clock=clock)
    limit = AdaptiveLimit(gate, clock=clock, pace_burst_rate=True)
    batch = [object() for _ in range(56)]
    went = batch[:21]
    assert [limit.reserve_send(0.0, caller) for caller in went] == [0.0] * 21
    clock.now = 2.0
    limit.passed(0.0, 56, caller=went[-1])  # the policy's count: 56 holders, none held
    assert limit.statistics().most_in_service == 21
    for caller in went[:-1]:
        limit.passed(0.0, 56, caller=caller)
    assert limit.statistics().most_in_service == 21
    wave = [object() for _ in range(40)]
    clock.now = 10.0
    assert [limit.reserve_send(10.0, caller) for caller in wave] == [0.0] * 40
    clock.now = 10.05
    for caller in wave[32:]:
        limit.rejected(10.0, caller)
    clock.now = 12.0
    for caller in wave[:32]:
        limit.passed(10.0, 40, caller=caller)
    assert limit.statistics().most_in_service == 32


def test_an_accepted_call_counts_in_service_at_once_counted_low() -> None:
    """An attempt the provider accepted (its answer started) holds a slot now: the most in
    service hears of it then, not when its generation ends seconds later. Counted low: of
    the calls at the provider at its send, those sent before it that are still unanswered
    and not accepted may yet be turned away. A 429 already heard is subtracted as at a
    pass. Then the pass at the call's end counts what is known by then."""
    clock = FakeClock()
    gate = Gate(math.inf, name="accepted", clock=clock)
    limit = AdaptiveLimit(gate, clock=clock, pace_burst_rate=True)
    batch = [object() for _ in range(10)]
    assert [limit.reserve_send(0.0, caller) for caller in batch] == [0.0] * 10
    clock.now = 0.05
    limit.accepted(0.0, batch[-1])  # nine sent before it, none answered yet
    assert limit.statistics().most_in_service == 1
    for caller in batch[:-1]:
        limit.accepted(0.0, caller)
    assert limit.statistics().most_in_service == 9  # the ninth: eight before it, taken
    wave = [object() for _ in range(5)]
    clock.now = 1.0
    assert [limit.reserve_send(1.0, caller) for caller in wave] == [0.0] * 5
    clock.now = 1.05
    limit.rejected(1.0, wave[0])
    limit.accepted(1.0, wave[-1])  # 15 at its send: three unsure, one turned away
    assert limit.statistics().most_in_service == 11
    for caller in wave[1:-1]:
        limit.accepted(1.0, caller)
    assert limit.statistics().most_in_service == 13  # the 14th: 10 + two, not the 429
    clock.now = 3.0
    limit.passed(0.0, 10, caller=batch[-1])  # its end: nothing new
    assert limit.statistics().most_in_service == 13
    limit.passed(1.0, 15, caller=wave[-1])
    assert limit.statistics().most_in_service == 14  # the three before it were taken


def test_the_herds_limit_grows_from_acceptances_before_any_call_ends() -> None:
    """With the slope known the herd's limit grows up to a tenth above the most in service,
    and an acceptance raises that at once: a ramp's round trip is a time to first byte,
    not a whole generation (the morning peak with 96 slots took 24 s to grow from 30 to
    its slots, 1.1x per 2 s answer; its sliding minute replayed that ramp every minute)."""
    clock = FakeClock()
    gate, limit = _herd(clock)
    limit._sends.slope.growth = 2.0
    clock.now = 5.0
    wave = [object() for _ in range(20)]
    assert [limit.reserve_send(5.0, caller) for caller in wave] == [0.0] * 20
    clock.now = 5.05
    for caller in wave:
        limit.accepted(5.0, caller)
    limit.on_success(saturated=True)  # an older call's end
    limit.on_success(saturated=True)
    assert gate.capacity == 22  # 1.1 x the 20 accepted, none of them ended


def test_a_call_that_ended_unanswered_is_no_longer_counted_at_the_provider() -> None:
    """An attempt sent whose call ended without an answer the limit hears (a transport
    error, then no retry) leaves the calls at the provider when its call ends: the next
    send counts one, not two (and the ended call is not kept)."""
    clock = FakeClock()
    gate = Gate(math.inf, name="ended", clock=clock)
    limit = AdaptiveLimit(gate, clock=clock, pace_burst_rate=True)
    lost, later = object(), object()
    assert limit.reserve_send(0.0, lost) == 0.0
    limit.disown(lost)  # its call ended: out of attempts after a connection error
    clock.now = 1.0
    assert limit.reserve_send(1.0, later) == 0.0
    clock.now = 3.0
    limit.passed(1.0, 2, caller=later)  # two slot holders at its send, by the old count
    assert limit.statistics().most_in_service == 1


def _herd(clock: FakeClock) -> tuple[Gate, AdaptiveLimit]:
    """An uncapped gate whose first confirmed slope throttle found 20 in flight."""
    gate = Gate(math.inf, name="herd", clock=clock)
    limit = AdaptiveLimit(gate, clock=clock, pace_burst_rate=True)
    for i in range(40):
        clock.now = i * 0.1
        assert limit.reserve_send(clock.now) == 0.0
    assert limit.on_throttle(limit.generation, None, 20, admitted_at=3.9) is None  # checked
    assert limit.pass_pause() == (0.0, True)
    change = limit.on_throttle(limit.generation, None, 20, probe=True, admitted_at=4.0)
    assert change is not None
    assert gate.capacity == 20  # the herd's limit: what was in flight
    return gate, limit


def test_the_herds_limit_grows_a_tenth_above_what_got_through_once_the_slope_is_known() -> None:
    """The herd's limit is no lesson about the slots: with the slope rule holding the rate,
    each saturated success raises it by one up to 1.1 x the most calls in service that got
    through (a round trip doubles it up to there), not by 1 / limit (the morning peak x10
    stayed near 244 of its 320 slots to the end that way). Not in one step: a limit that
    jumped a tenth above met 96 slots with up to ten calls in flight beyond them."""
    clock = FakeClock()
    gate, limit = _herd(clock)
    limit._sends.slope.growth = 2.0  # learned (as the slope tests above learn it)
    limit.passed(5.0, sending=20)
    limit.on_success(saturated=True)
    assert gate.capacity == 21  # one more, within 1.1 x 20
    limit.on_success(saturated=True)
    assert gate.capacity == 22  # 1.1 x 20
    for _ in range(5):
        limit.on_success(saturated=True)
    assert gate.capacity == 22  # no further than a tenth above what got through
    limit.passed(6.0, sending=22)
    limit.on_success(saturated=True)
    limit.on_success(saturated=True)
    assert gate.capacity == 24  # floor(1.1 x 22)
    limit.on_success(saturated=False)  # slots stood free: no evidence
    assert gate.capacity == 24


def test_the_herds_limit_doubles_each_round_trip_once_no_throttle_came_for_a_window() -> None:
    """With no slope rule learned nothing holds the rate and nothing said the slots were
    full: once no burst throttle came for a window, each saturated success raises the
    herd's limit by one, so a round trip of successes doubles it (slow start). By 1 / limit
    instead, a herd of 4 taken at a shared pool's 429 was 101 of 320 slots four minutes on
    (the morning peak x10). Sooner it is 1 / limit: a ramp's next edge is near."""
    clock = FakeClock()
    gate, limit = _herd(clock)  # the throttle was confirmed at 3.9 s
    assert not limit._sends.slope.known
    clock.now = 13.8  # not a window yet
    for _ in range(10):
        limit.on_success(saturated=True)
    assert gate.capacity == 20  # 20 + 10 x ~1/20
    clock.now = 13.9
    for _ in range(20):  # one round trip: the 20 admitted on the full gate come back
        limit.on_success(saturated=True)
    assert gate.capacity == 40
    limit.on_success(saturated=False)  # slots stood free: no evidence
    assert gate.capacity == 40
    limit.passed(9.0, sending=40)
    assert limit.on_concurrency(limit.generation, 40, exact=True) is not None
    assert gate.capacity == 39  # the slots: in flight less one
    for _ in range(10):  # a lesson about the slots: additive again, after its hold
        clock.now += 3600.0
        limit.on_success(saturated=True)
    assert gate.capacity == 39  # 39 + 10 x ~1/39


def test_the_herds_slow_start_stops_a_tenth_above_what_got_through() -> None:
    """Past the most calls seen in service at once, slow start goes no further than a
    tenth above it (or one call): a 429 comes back a reject latency after the send, and
    meanwhile each success raised the limit by one. At a reject latency of 0.6 s the
    peak's herd limit went from 31 (the most seen through, one under its 32 slots) to 41
    before the first concurrency 429 came back: nine calls turned away (seed 1). Each
    success seen through at a new high moves the bound up."""
    clock = FakeClock()
    gate, limit = _herd(clock)  # the throttle was confirmed at 3.9 s
    limit.passed(3.0, sending=20)
    clock.now = 13.9  # a window on, no throttle: slow start
    for _ in range(20):
        limit.on_success(saturated=True)
    assert gate.capacity == 22  # 1.1 x 20, not 40
    limit.passed(14.0, sending=22)
    for _ in range(20):
        limit.on_success(saturated=True)
    assert gate.capacity == 24  # floor(1.1 x 22)
    # A handful seen through: one call above it.
    clock2 = FakeClock()
    gate2, limit2 = _herd(clock2)
    limit2.passed(3.0, sending=3)
    clock2.now = 13.9
    for _ in range(20):
        limit2.on_success(saturated=True)
    assert gate2.capacity == 20  # the herd's own limit stands; never lowered


def test_a_concurrency_lesson_ends_the_herds_growth() -> None:
    clock = FakeClock()
    gate, limit = _herd(clock)
    limit._sends.slope.growth = 2.0
    limit.passed(5.0, sending=20)
    assert limit.on_concurrency(limit.generation, 20, exact=True) is not None
    assert gate.capacity == 19  # the slots: in flight less one
    clock.now += 3600.0  # long after the hold
    limit.on_success(saturated=True)
    assert gate.capacity == 19  # 19 + 1/19: additive again
