"""The per-window limit estimate (``anygate._limits.window``): pure arithmetic, no clock.

Times are plain floats; every expected number is worked out from the rule in the
docstring of the thing under test.
"""

from __future__ import annotations

import math

import pytest

from anygate._limits.requests import RequestLimit
from anygate._limits.window import SentLog, WindowLimit
from tests.policy_helpers import send_if_let


def test_the_log_counts_sends_less_rejections_in_the_window_before() -> None:
    """``accepted(t)`` counts sends in ``(t - 60, t)`` less those reported turned away:
    what a send at ``t`` surely found in the provider's window (a pass's count)."""
    log = SentLog(60.0)
    for at in (0.0, 10.0, 20.0, 30.0):
        log.sent(at)
    log.rejected(20.0)
    assert log.accepted(30.0) == 2  # 0 and 10; 20 was turned away; 30 is not before 30
    assert log.accepted(30.5) == 3
    assert log.accepted(70.5) == 1  # 0 and 10 have left the window; 20 rejected; 30 stays
    assert log.accepted(60.0) == 2  # 0 has left a sliding window at 60: open there
    # Asked out of time order (answers come back out of send order): still exact.
    assert log.accepted(30.5) == 3


def test_a_rejections_count_takes_in_the_sends_of_its_own_instant() -> None:
    """``held(t)`` counts sends in ``(t - 60, t]``: a wave sends several at one instant,
    and the provider counted those before the rejected one (the most it can have held)."""
    log = SentLog(60.0)
    for at in (0.0, 10.0, 30.0, 30.0, 30.0):
        log.sent(at)
    log.rejected(30.0)  # the third send at 30 was turned away
    assert log.held(30.0) == 4  # 0, 10 and two of the three at 30 ...
    assert log.accepted(30.0) == 2  # ... but a pass at 30 surely found only 0 and 10
    assert log.held(60.0) == 3  # 0 has left; 10 and the two accepted at 30 stay
    assert log.held(90.0) == 0


def test_free_at_is_when_the_kth_accepted_send_leaves_the_window() -> None:
    """Four sends (one rejected) hold three; with a limit of 2, the window has room once
    the first accepted send leaves it, 60 s after it went (plus a microsecond)."""
    log = SentLog(60.0)
    for at in (1.0, 2.0, 3.0, 4.0):
        log.sent(at)
    log.rejected(1.0)
    assert log.free_at(4.0, 4) is None  # 3 < 4: room now
    assert log.free_at(4.0, 3) == pytest.approx(62.0, abs=1e-5)  # 2.0 leaves: 2 < 3
    assert log.free_at(4.0, 2) == pytest.approx(63.0, abs=1e-5)  # 2.0 and 3.0 must leave
    assert log.free_at(4.0, math.inf) is None
    assert log.free_at(62.0 + 1e-5, 3) is None  # asked again when it said: room


def test_the_log_forgets_old_sends() -> None:
    """A long run keeps only about two windows of sends (the list is compacted)."""
    log = SentLog(60.0)
    for i in range(20_000):
        log.sent(i * 0.1)
    assert log.accepted(2000.0) == 599  # (1940, 2000): 1940.0 has left
    assert log.held(1999.95) == 600
    assert len(log._sent) < 2 * 600 + 300


def test_a_first_rejection_holds_tentatively_and_a_second_confirms() -> None:
    """The first word sets the estimate to the count; a second within a window confirms
    it (and a lower count lowers it)."""
    limit = WindowLimit(60.0)
    assert limit.estimate(0.0) == math.inf
    assert limit.rejected(600, 10.0)
    assert (limit.estimate(10.0), limit.confirmed) == (600, False)
    assert limit.rejected(590, 20.0)
    assert limit.confirmed
    assert limit.estimate(20.0) == 590


def test_an_unconfirmed_estimate_stands_after_a_window() -> None:
    """No second word and no pass above it within a window: the one rejection stands
    (a token limit's check rarely repeats its count) and is confirmed."""
    limit = WindowLimit(60.0)
    limit.rejected(600, 10.0)
    assert not limit.confirmed
    assert limit.estimate(70.5) == pytest.approx(600 + 60.5 / 60.0)
    assert limit.confirmed


def test_a_pass_at_the_rejected_count_disproves_it() -> None:
    """The rejected call's retry passes with as many in the window: it was noise, and the
    estimate goes back to what it was."""
    limit = WindowLimit(60.0)
    limit.rejected(500, 0.0)
    limit.rejected(500, 1.0)  # confirmed at 500
    limit.passed(400)
    limit.rejected(300, 100.0)  # below what passed: tentative
    assert limit.estimate(100.0) == 300
    limit.passed(300)
    assert limit.confirmed
    assert limit.estimate(100.0) == pytest.approx(500 + 99.0 / 60.0)  # set at 1.0


def test_the_estimate_grows_one_request_per_window_up_to_the_ceiling() -> None:
    """A raised limit is found again at a bounded rate: +1 per window, never above the
    ceiling."""
    limit = WindowLimit(60.0, ceiling=103.0)
    limit.rejected(100, 0.0)
    limit.rejected(100, 0.0)
    assert limit.estimate(120.0) == pytest.approx(102.0)
    assert limit.estimate(6000.0) == 103.0


def test_a_window_with_none_of_ours_teaches_nothing() -> None:
    """A 429 while none of this client's requests are in the window: someone else filled
    it, and no estimate follows."""
    limit = WindowLimit(60.0)
    assert not limit.rejected(0, 5.0)
    assert limit.estimate(5.0) == math.inf


def test_the_request_limit_holds_sends_once_two_rejections_agree() -> None:
    """One per-minute 429 holds nothing (a shared pool's as often as a limit's); a second
    at the same count holds every send but one, the check above the new threshold, until
    the window has room (asking again every half second while the check is out)."""
    requests = RequestLimit()
    caller, other = object(), object()
    for i in range(11):
        assert send_if_let(requests, float(i)) == 0.0
    # The send at 10 was turned away: 10 others in the window.
    assert not requests.rejected(10.0, 10.0, caller)
    assert requests.estimate(10.0) is None
    assert send_if_let(requests, 10.2, caller) == 0.0  # its retry goes: nothing is held
    assert requests.rejected(10.2, 10.3, caller)  # 10 others again: the limit
    assert requests.estimate(10.3) == 10
    assert requests.wait(10.4, 1.0, other) == pytest.approx(0.9)  # its check at 11.3
    assert requests.wait(10.4, 1.0, other) == pytest.approx(0.9)  # asking counts nothing
    assert send_if_let(requests, 11.3, other) == 0.0  # the check: one send above it
    # Held; while the check is out it asks again soon (the answer may lift the hold).
    assert send_if_let(requests, 11.4, caller) == pytest.approx(0.5)
    requests.rejected(11.3, 11.35, other)  # the check turned away: support 3
    # The next check once a slope window has passed since the threshold was set.
    assert send_if_let(requests, 11.4, caller) == pytest.approx(20.3 - 11.4)
    assert send_if_let(requests, 20.3, caller) == 0.0  # the second check
    requests.rejected(20.3, 20.35, caller)  # confirmed: no check any more
    wait = send_if_let(requests, 20.4, other)
    assert wait == pytest.approx(60.0 - 20.4, abs=1e-5)  # 10 accepted: 0 leaves at 60
    assert requests.wait(20.5, 1.0, caller) > 0  # still held


def test_a_rejection_within_the_counts_error_of_what_passed_is_the_limit() -> None:
    """Passes up to 600 in a window, then a rejection counted at 599 (one short: a send
    in flight, or one of the same instant): the same limit, not noise. It holds at 599
    and the retry's pass at that count does not undo it. Taken for noise, the pass put
    the estimate back above the limit and the next send was the next 429 (a loop)."""
    limit = WindowLimit(60.0)
    limit.rejected(600, 10.0)
    limit.rejected(600, 20.0)  # confirmed
    limit.passed(599)  # 599 of ours, and this one: 600 got through
    assert limit.low == 600
    assert limit.estimate(80.0) == pytest.approx(601)  # grown a request in a minute
    assert limit.rejected(599, 80.0)
    assert limit.confirmed
    assert (limit.estimate(80.0), limit.low) == (599, 599)
    limit.passed(599)  # the rejected call's retry
    assert limit.estimate(80.0) == 599
    # Well below what passed (more than 1 %, at least one request): noise until it repeats.
    other = WindowLimit(60.0)
    other.rejected(600, 10.0)
    other.rejected(600, 20.0)
    other.passed(599)
    assert other.rejected(500, 80.0)
    assert not other.confirmed
    other.passed(500)  # its retry passes at that count: disproved
    assert other.estimate(80.0) == pytest.approx(601)


def test_a_send_the_slots_refused_counts_for_a_rejection_and_the_hold_only() -> None:
    """A concurrency 429's send may have filled the provider's request window (its rate
    limiter sits before the slots): a rejection's bound and the hold count it, a pass's
    lower bound and the plain count do not. Taken as rejected everywhere, a rejection
    read one short of the limit for each refusal in its window."""
    log = SentLog(60.0)
    for at in (0.0, 10.0, 20.0, 30.0):
        log.sent(at)
    log.refused(10.0)
    log.rejected(20.0)
    assert log.held(30.0) == 3  # 0, 10 (refused: maybe counted) and 30; 20 was not
    assert log.accepted(30.5) == 2  # surely accepted: 0 and 30
    assert log.count(0.0, 31.0) == 2
    assert log.free_at(30.0, 3) == pytest.approx(60.0, abs=1e-5)  # room once 0 leaves
    assert log.free_at(30.0, 4) is None
    log.rejected(10.0)  # the same time as a rule's rejection: both kept apart
    assert log.held(30.0) == 2


def test_each_regrowth_turned_away_at_the_same_count_doubles_the_next_ones_time() -> None:
    """The request estimate grows a request a minute to find a raised limit; grown back
    and turned away at the count it grew from, the limit held: the next request of growth
    takes two minutes. One at the same count before any regrowth (sent with the one
    before it) changes nothing; one at another count starts again at a minute."""
    requests = RequestLimit()
    for i in range(120):  # one a second: a window at a send holds 60
        requests.sent(float(i))
    requests.rejected(119.0, 119.05)  # 59 others in its window: tentative
    requests.rejected(118.0, 119.06)  # 59 again: confirmed
    assert requests.estimate(119.06) == 59
    assert requests.estimate(179.06) == pytest.approx(60)  # a request a minute
    for i in range(120, 180):
        requests.sent(float(i))
    requests.rejected(179.0, 179.1)  # grown to 60, turned away at 59: the limit held
    assert requests.estimate(299.1) == pytest.approx(60)  # a request in two minutes
    requests.rejected(178.0, 179.2)  # 58 (119 and 178 turned away): in flight with it
    assert requests.estimate(299.2) == pytest.approx(59)  # still two minutes
    for i in range(180, 260):
        requests.sent(float(i))
    requests.sent(299.0)
    requests.rejected(299.0, 299.5)  # 20 (240 to 259): another count (lowered)
    assert requests.estimate(359.5) == pytest.approx(21)  # a request a minute again


def test_a_rejection_with_only_refused_sends_in_its_window_teaches_nothing() -> None:
    """The slots refused the only other send in the window: the provider may have held
    none of ours, so no estimate follows (a limit of one would hold the next send a
    minute). One surely accepted send besides makes the count two."""
    requests = RequestLimit()
    requests.sent(0.0)
    requests.turned_away(0.0, refused=True)
    requests.sent(0.5)
    assert not requests.rejected(0.5, 0.6)
    assert requests.estimate(0.6) is None
    assert requests.wait(0.7) == 0.0
    requests.sent(1.0)
    requests.sent(1.5)
    requests.sent(1.6)
    requests.rejected(1.5, 1.6)
    requests.rejected(1.6, 1.7)
    assert requests.estimate(1.7) == 2  # the refused one and the one at 1.0
