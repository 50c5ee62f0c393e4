"""Sends paced at the gate's request rate (``anygate._limits.pace``): GCRA arithmetic on
send instants, no clock. At 1,200 requests a minute with the default one-second burst,
20 sends go at one instant and then one every 0.05 s, as the gate admits them; but only
once a 429 for the requests turned away a send beyond that pace; until then the first
send beyond it is a test, and the others beyond it wait for its burst's answers."""

from __future__ import annotations

import pytest

from anygate import Rate
from anygate._config.limit_values import OVER_LIMIT_POLL_S, PROBE_GRACE_S
from anygate._gate.gate import Gate
from anygate._limits.adaptive import AdaptiveLimit
from anygate._limits.pace import SendPace
from anygate._limits.published import BIND
from anygate._limits.sends import Sends
from tests.policy_helpers import FakeClock, send_if_let


def paced(rate: Rate) -> SendPace:
    """A pace at ``rate`` that holds (as after a 429 beyond it)."""
    pace = SendPace()
    pace.follow(rate, 0.0)
    pace.holds = True
    return pace


def test_without_a_request_rate_nothing_is_paced() -> None:
    pace = SendPace()
    assert all(send_if_let(pace, 0.0) == 0.0 for _ in range(1000))
    pace.follow(Rate(tokens_per_minute=60_000), 0.0)
    assert all(send_if_let(pace, 0.0) == 0.0 for _ in range(1000))


def test_a_seconds_burst_goes_at_once_then_one_per_interval() -> None:
    """Full from the start: 20 at one instant, the 21st waits an interval (0.05 s), and
    the pace goes on at one per interval. Asking counts nothing."""
    pace = paced(Rate(requests_per_minute=1200))
    assert [send_if_let(pace, 0.0) for _ in range(20)] == [0.0] * 20
    assert pace.wait(0.0, 0.0, None) == pytest.approx(0.05)
    assert pace.wait(0.0, 0.0, None) == pytest.approx(0.05)  # still: asking spent nothing
    assert send_if_let(pace, 0.05) == 0.0
    assert send_if_let(pace, 0.05) == pytest.approx(0.05)
    # Idle for a second: the burst is back, no more.
    assert [send_if_let(pace, 2.0) for _ in range(20)] == [0.0] * 20
    assert send_if_let(pace, 2.0) == pytest.approx(0.05)


def test_a_rate_change_keeps_the_level_in_requests() -> None:
    """Ten of a 20-request burst spent at 1,200 a minute; at 600 (a burst of 10) the level
    is capped to the new burst: 10 go at once, then one per 0.1 s. A debt stays owed."""
    pace = paced(Rate(requests_per_minute=1200))
    for _ in range(10):
        assert send_if_let(pace, 0.0) == 0.0
    pace.follow(Rate(requests_per_minute=600), 0.0)
    assert [send_if_let(pace, 0.0) for _ in range(10)] == [0.0] * 10
    assert pace.wait(0.0, 0.0, None) == pytest.approx(0.1)
    # Empty at 600; at 6,000 (a burst of 100) the empty level stays empty.
    pace.follow(Rate(requests_per_minute=6000), 0.0)
    assert pace.wait(0.0, 0.0, None) == pytest.approx(0.01)
    pace.follow(None, 0.0)
    assert pace.wait(0.0, 0.0, None) == 0.0


def test_a_longer_burst_lets_more_go_at_once() -> None:
    pace = paced(Rate(requests_per_minute=600, burst_s=3.0))
    assert [send_if_let(pace, 0.0) for _ in range(30)] == [0.0] * 30
    assert pace.wait(0.0, 0.0, None) == pytest.approx(0.1)


def test_a_rate_below_one_per_burst_paces_one_at_a_time() -> None:
    """30 a minute with a one-second burst: one send, then one every 2 s."""
    pace = paced(Rate(requests_per_minute=30))
    assert send_if_let(pace, 0.0) == 0.0
    assert send_if_let(pace, 0.0) == pytest.approx(2.0)
    assert send_if_let(pace, 2.0) == 0.0


def unpaced(rate: Rate) -> SendPace:
    """A pace at ``rate`` as it starts: holding nothing until a test or a 429."""
    pace = SendPace()
    pace.follow(rate, 0.0)
    return pace


def burst(pace: SendPace, at: float, count: int) -> list[object]:
    """Send ``count`` at ``at`` (each must be let go); their callers."""
    callers = [object() for _ in range(count)]
    assert [send_if_let(pace, at, caller) for caller in callers] == [0.0] * count
    return callers


def test_the_first_send_beyond_the_pace_is_a_test_the_others_wait_for() -> None:
    """20 within a second's pace go, the 21st (beyond it) is the test; while it is out
    the others beyond the pace wait, asking again every poll, to the end of its grace.
    A send within the pace (refilled) still goes."""
    pace = unpaced(Rate(requests_per_minute=1200))
    burst(pace, 0.0, 21)
    assert pace.testing
    assert pace.wait(0.0, 0.0, object()) == pytest.approx(OVER_LIMIT_POLL_S)
    # 21 spent of 20: the next fits the pace at 0.1 s, within the poll from 0.095 s.
    assert pace.wait(0.095, 0.0, None) == pytest.approx(0.005)
    assert send_if_let(pace, 0.1) == 0.0
    assert not pace.holds
    assert not pace.taken


def test_a_burst_the_provider_took_beyond_the_pace_ends_the_tests() -> None:
    """The provider accepted all 21 of the test's burst, more than the 20 within the
    pace: it counts more than a second's pace, and sends beyond it go from now on,
    untested (a 429 for one of them still makes the pace hold)."""
    pace = unpaced(Rate(requests_per_minute=1200))
    callers = burst(pace, 0.0, 21)
    for caller in callers[:-1]:
        pace.answered(caller, taken=True)
    assert pace.testing  # 20 accepted: no more than the pace
    pace.answered(object(), taken=True)  # not of the burst: not counted
    assert pace.testing
    pace.answered(callers[-1], taken=True)
    assert pace.taken
    assert not pace.testing
    assert burst(pace, 0.1, 30)
    assert not pace.testing
    pace.rejected(0.1)
    assert pace.holds


def test_a_send_of_the_burst_turned_away_by_another_limit_leaves_it_untold() -> None:
    """One of the 20 within the pace turned away by the slots (the provider counted 20,
    the test among them): the test's acceptance does not show more than the pace. Once
    every answer came, the next send beyond the pace is a new test."""
    pace = unpaced(Rate(requests_per_minute=1200))
    callers = burst(pace, 0.0, 21)
    pace.answered(callers[3], taken=False)
    for caller in callers[:3] + callers[4:]:
        pace.answered(caller, taken=True)
    assert not pace.testing
    assert not pace.taken
    assert not pace.holds
    # 21 spent, 4 refilled: three go within the pace, the fourth is the new test.
    burst(pace, 0.2, 3)
    assert not pace.testing
    burst(pace, 0.2, 1)
    assert pace.testing
    assert pace.wait(0.2, 0.0, None) > 0.0


@pytest.mark.parametrize(("refused", "taken"), [(False, True), (True, False)])
def test_a_test_unanswered_through_its_grace(refused: bool, taken: bool) -> None:
    """Where nothing reports an answer's start, a test not turned away within its
    grace was taken, unless a send of its burst was turned away (then the next send
    beyond the pace is a new test)."""
    pace = unpaced(Rate(requests_per_minute=1200))
    callers = burst(pace, 0.0, 21)
    if refused:
        pace.answered(callers[0], taken=False)
    assert pace.wait(0.01, 0.0, None) > 0.0
    burst(pace, PROBE_GRACE_S, 1)  # within the pace again
    assert pace.taken is taken
    assert not pace.testing
    burst(pace, PROBE_GRACE_S, 19)  # the 19th beyond: tested again unless taken
    assert pace.testing is not taken


def test_a_429_for_a_send_beyond_the_pace_makes_it_hold() -> None:
    """A 429 for the test (not for one within the pace, nor for a time no send went)
    makes it hold, with what was sent already spent."""
    pace = unpaced(Rate(requests_per_minute=1200))
    burst(pace, 0.0, 21)  # the 21st beyond: the test
    pace.rejected(0.5)  # no send then
    assert not pace.holds
    assert send_if_let(pace, 1.0) == 0.0  # within: the 21 spent refilled to -1 + 20
    pace.rejected(1.0)
    assert not pace.holds
    pace.rejected(0.0)  # the test's instant
    assert pace.holds
    assert not pace.testing
    # Spent: 22 sent by 1.0 against 20 + 20 refilled: 18 left, then one per 0.05 s.
    assert [send_if_let(pace, 1.0) for _ in range(18)] == [0.0] * 18
    assert pace.wait(1.0, 0.0, None) == pytest.approx(0.05)


def test_the_adaptive_limit_paces_sends_at_its_gates_rate() -> None:
    """The send path tells the pace each request 429 and, once it holds, asks it last, at
    the gate's rate as it is when asked: sends a hold lets go together go a second's
    burst at a time (the morning peak with its RPM enforced per second: 0.3-1.2 % of
    calls with a 429 -> 0.1-0.3 %, seeds 1-5)."""
    clock = FakeClock()
    gate = Gate(256, name="pace", clock=clock, rate=Rate(requests_per_minute=1200))
    limit = AdaptiveLimit(gate, clock=clock, pace_burst_rate=True)
    callers = [object() for _ in range(45)]
    assert [limit.reserve_send(0.0, caller) for caller in callers[:21]] == [0.0] * 21
    # The 21st is the test: the 22nd waits for it.
    assert limit.reserve_send(0.0, callers[21]) == pytest.approx(OVER_LIMIT_POLL_S)
    clock.now = 0.1
    limit.rejected(0.0, callers[20])
    limit.on_rate("requests", 0.0, caller=callers[20])
    clock.now = 1.0
    # 21 sent by 0.0, refilled 20 by 1.0: 19 go, then one per 0.05 s.
    assert [limit.reserve_send(1.0, caller) for caller in callers[21:40]] == [0.0] * 19
    assert limit.reserve_send(1.0, callers[40]) == pytest.approx(0.05)
    assert limit.reserve_send(1.05, callers[40]) == 0.0
    gate.rate = Rate(requests_per_minute=60)  # one a second, from an empty level
    assert limit.reserve_send(1.05, callers[41]) == pytest.approx(1.0)
    gate.rate = None
    assert limit.reserve_send(1.05, callers[41]) == 0.0


@pytest.mark.parametrize("answer", ["accepted", "passed", "throttled", "failed"])
def test_the_send_path_tells_the_test_its_bursts_answers(answer: str) -> None:
    """Accepted (status and headers) or passed (the success) counts as taken; a 429 of
    any kind, or a server error (``turned_away``), as turned away."""
    clock = FakeClock()
    gate = Gate(256, name="test", clock=clock, rate=Rate(requests_per_minute=1200))
    limit = AdaptiveLimit(gate, clock=clock, pace_burst_rate=True)
    callers = [object() for _ in range(21)]
    assert [limit.reserve_send(0.0, caller) for caller in callers] == [0.0] * 21
    pace = limit._sends.pace
    for caller in callers[1:]:
        limit.accepted(0.0, caller)
    clock.now = 0.1
    if answer == "accepted":
        limit.accepted(0.0, callers[0])
    elif answer == "passed":
        limit.passed(0.0, 21, caller=callers[0])
    elif answer == "throttled":
        limit.rejected(0.0, callers[0])
    else:
        limit.turned_away(0.0, caller=callers[0])
    assert pace.taken is (answer in ("accepted", "passed"))
    assert not pace.testing


def test_without_pacing_the_send_path_holds_nothing() -> None:
    clock = FakeClock()
    gate = Gate(256, name="unpaced", clock=clock, rate=Rate(requests_per_minute=1200))
    limit = AdaptiveLimit(gate, clock=clock, pace_burst_rate=False)
    assert all(limit.reserve_send(0.0, object()) == 0.0 for _ in range(100))


@pytest.mark.parametrize(("paced", "holds"), [(1200.0, False), (2400.0, True), (None, True)])
def test_a_429_of_a_full_minute_is_the_minutes(paced: float | None, holds: bool) -> None:
    """1,150 sends over a minute (more than ``BIND`` of a 1,200 pace), then 21 at one
    instant, the last beyond the pace: a 429 for it is a full minute's at a pace of
    1,200 (the pace stays off), not at 2,400 or at no request pace (it holds)."""
    sends = Sends()
    sends.pace.follow(Rate(requests_per_minute=1200), 0.0)
    for at in [i * 0.05 for i in range(1150)] + [59.9] * 21:
        assert sends.wait(at, 0.0, None, 0) == 0.0
        sends.sent(at, 0.0, None)
    assert sends.requests_in_minute(59.9) >= BIND * 1200
    sends.rejected("requests", 59.9, 0.0, 60.0, object(), paced)
    assert sends.pace.holds is holds


def test_by_the_minute_each_trailing_minute_of_sends_holds_the_rate() -> None:
    """Where the gate's request budget holds a minute (a published rate), the pace holds
    every trailing minute of sends to the rate: at 120 a minute, once the provider took
    more than a second's pace (the test's burst all accepted), the minute's 120 go at
    once and the 121st waits for the first to leave the minute. Without the minute, a
    second's pace is all it would hold."""
    sends = Sends()
    pace = sends.pace
    pace.follow(Rate(requests_per_minute=120), 0.0)
    pace.by_minute(sends.requests.log)
    callers = [object() for _ in range(3)]
    for caller in callers:  # two within a second's pace, the third the test
        assert sends.wait(0.0, 0.0, caller, 0) == 0.0
        sends.sent(0.0, 0.0, caller)
    for caller in callers:
        pace.answered(caller, taken=True)
    assert pace.taken
    for _ in range(117):
        assert sends.wait(0.1, 0.0, None, 0) == 0.0
        sends.sent(0.1, 0.0, None)
    assert sends.wait(0.1, 0.0, None, 0) == pytest.approx(59.9)
    assert sends.wait(60.0, 0.0, None, 0) == 0.0
    pace.by_minute(None)
    assert not pace.minute
    assert sends.wait(0.1, 0.0, None, 0) == 0.0  # not holding: the test was taken
