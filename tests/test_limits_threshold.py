"""The request limit's threshold (``anygate._limits.threshold``): pure arithmetic, no clock.

A send's count is the number of ours already in its window. Every expected number follows
from the rule in the module docstring: the threshold ``L`` held contradicts fewest answers
(a pass at ``n >= L``, a rejection at ``n < L``), and "no limit" (every rejection) must
contradict at least ``SUPPORT`` more.
"""

from __future__ import annotations

import math

import pytest

from anygate._gate.gate import Gate
from anygate._limits.adaptive import AdaptiveLimit
from anygate._limits.requests import RequestLimit
from anygate._limits.threshold import CONFIRM, MAX_ANSWERS, MEMORY_S, SUPPORT, CountLimit
from tests.policy_helpers import FakeClock, send_if_let


def test_one_rejection_holds_nothing_and_a_second_at_its_count_holds_it() -> None:
    limit = CountLimit()
    for i in range(100):
        limit.passed(i * 0.1, i)
    assert SUPPORT == 2
    assert not limit.rejected(10.0, 100, 10.05)
    assert limit.estimate(10.05) == math.inf
    assert limit.rejected(10.1, 101, 10.15)  # at or above 100: both fit a limit of 100
    assert limit.estimate(10.15) == 100
    assert limit.estimate(70.15) == pytest.approx(101)  # grows a request a window


def test_random_429s_among_passes_at_the_same_count_are_noise() -> None:
    """A steady flow at about 500 in the window, one send in twenty turned away at
    random: every rejection lands where the passes are, and each count's passes
    contradict a threshold there more than no limit is contradicted. Nothing is held."""
    limit = CountLimit()
    for i in range(2_000):
        at, count = i * 0.06, 495 + i % 10
        if i % 20 == 7:
            limit.rejected(at, count, at + 0.05)
        else:
            limit.passed(at, count)
        assert limit.estimate(at + 0.05) == math.inf, i


def test_a_real_limit_turns_away_every_send_at_and_above_it() -> None:
    """Passes below 500, every send at 500 or more turned away: held at 500; random 429s
    below it afterwards (among the hold's passes at 499) do not lower it, and a run of
    rejections at 499 with no pass there does (the limit came down a request)."""
    limit = CountLimit()
    for i in range(500):
        limit.passed(i * 0.1, i)
    for count in (500, 501, 502):
        limit.rejected(50.0, count, 50.05)
    assert limit.estimate(50.05) == 500
    for i in range(40):
        limit.passed(51.0 + i * 0.1, 499)
    limit.rejected(55.0, 499, 55.05)
    limit.rejected(55.1, 499, 55.15)
    assert limit.estimate(55.15) == pytest.approx(500 + 5.1 / 60)  # unmoved
    other = CountLimit()
    for count in (500, 501, 499, 499, 499):
        other.rejected(50.0, count, 50.05)
    assert other.estimate(50.05) == 499


def test_a_run_of_rejections_just_below_the_threshold_moves_it_down() -> None:
    """Held at 600 with the hold's passes at 595-599 in memory: the provider's window
    now holds a few more than our count of it (a send it counted and we did not), and
    turns away every send the hold lets go, at 596. Three in a row, nothing passed
    between, are outvoted by the passes (a shared pool's run, as likely); the fourth
    (``CONFIRM``) says the count moved: the passes at or above it are forgotten and the
    threshold comes down to it. Outvoted, a learned 597 turned away the hold's sends at
    594 for 20 s (hidden RPM 600 with plain 429s, seed 9: 331 429s)."""
    limit = CountLimit()
    for i in range(600):
        limit.passed(i * 0.1, i)
    for count in (600, 601):
        limit.rejected(60.0, count, 60.05)
    assert limit.estimate(60.05) == 600
    for i in range(100):
        limit.passed(61.0 + i * 0.1, 595 + i % 5)
    for i in range(CONFIRM - 1):
        limit.rejected(71.0 + i * 0.1, 596, 71.05 + i * 0.1)
    assert limit.estimate(71.3) == pytest.approx(600 + (71.3 - 60.05) / 60)  # unmoved
    limit.rejected(71.3, 596, 71.35)
    assert limit.estimate(71.35) == 596
    # A pass between starts the run again: runs of three are noise, however many.
    other = CountLimit()
    for i in range(600):
        other.passed(i * 0.1, i)
    for count in (600, 601):
        other.rejected(60.0, count, 60.05)
    for i in range(100):
        other.passed(61.0 + i * 0.1, 595 + i % 5)
    at = 71.0
    for _ in range(3):
        for _ in range(CONFIRM - 1):
            other.rejected(at, 596, at + 0.05)
            at += 0.1
        other.passed(at, 597)
        at += 0.1
    assert other.estimate(at) > 600


def test_passes_above_the_threshold_lift_it() -> None:
    limit = CountLimit()
    for count in (50, 51, 51):
        limit.rejected(1.0, count, 1.05)
    assert limit.estimate(1.05) == 50
    limit.passed(1.0, 52)  # sent in the same wave, answered later: above it
    assert math.floor(limit.estimate(2.0)) == 50  # three rejections fit it, one pass not
    limit.passed(1.0, 53)
    assert limit.estimate(2.0) == math.inf  # no limit fits as well: none held


def test_a_rejection_at_the_threshold_starts_its_regrowth_again() -> None:
    limit = CountLimit()
    limit.rejected(0.0, 60, 0.0)
    limit.rejected(0.0, 60, 0.0)
    assert limit.estimate(60.0) == pytest.approx(61)
    limit.rejected(60.0, 60, 60.0)  # the regrowth's send turned away at 60
    assert limit.estimate(60.0) == 60
    assert limit.estimate(120.0) == pytest.approx(61)


def test_answers_are_forgotten_after_the_memory_and_only_a_pass_lifts_a_threshold() -> None:
    """A hold that works draws no 429s: its threshold stands when they age out, and a
    pass above it then raises it only as far as the passes go (to no limit, one pass by
    the count's error let the gate's whole pace into the provider's full window). Two
    rejections older than the memory count for nothing."""
    limit = CountLimit()
    limit.rejected(0.0, 60, 0.05)
    limit.rejected(0.1, 60, 0.15)
    assert limit.estimate(0.15) == 60
    later = MEMORY_S + 1.0
    limit.passed(later, 59)  # both rejections are older than the memory now
    limit.rejected(later, 30, later + 0.05)  # one word, against no limit: not held
    assert math.floor(limit.estimate(later + 0.05)) == 62  # 60, grown two windows
    limit.passed(later + 0.1, 64)  # above it: raised to what passed, growing on
    assert limit.estimate(later + 0.1) == 65
    assert limit.estimate(later + 60.1) == pytest.approx(66)
    young = CountLimit()  # a threshold whose 429s are still remembered: lifted outright
    young.rejected(0.0, 60, 0.05)
    young.rejected(0.1, 60, 0.15)
    young.passed(0.2, 61)
    assert young.estimate(0.2) == math.inf


def test_a_window_with_none_of_ours_teaches_nothing() -> None:
    limit = CountLimit()
    assert not limit.rejected(0.0, 0, 0.0)
    assert not limit.rejected(0.0, 0, 0.0)
    assert limit.estimate(0.0) == math.inf


def test_an_answers_pass_told_at_acceptance_is_not_counted_again_at_its_end() -> None:
    """Three sends of one instant turned away with 100 others in the window hold the
    estimate at 100; one pass at 100 or more leaves it (two more rejections fit it than
    fit no limit), a second lifts it. The same attempt's pass, told when the provider
    accepted it (``accepted``) and again when it succeeded (``passed``), is one pass."""
    clock = FakeClock()
    gate = Gate(256, name="threshold", clock=clock)
    limit = AdaptiveLimit(gate, clock=clock, pace_burst_rate=True)
    for at in [i * 0.01 for i in range(100)] + [1.0, 1.0, 1.0, 1.05, 1.05]:
        clock.now = at
        assert limit.reserve_send(at) == 0.0
    clock.now = 1.1
    for _ in range(3):  # the three sends at 1.0
        limit.on_rate("requests", 1.0)
    assert limit.statistics().requests_per_minute_estimate == 100
    caller = object()
    clock.now = 1.2
    limit.accepted(1.05, caller)  # 101 others at its send (the other one at 1.05 too)
    limit.passed(1.05, caller=caller)
    limit.accepted(1.05, caller)
    estimate = limit.statistics().requests_per_minute_estimate
    assert estimate is not None
    assert math.floor(estimate) == 100
    limit.passed(1.05)  # the other send at 1.05 passed too: a second
    assert limit.statistics().requests_per_minute_estimate is None


def test_a_new_threshold_is_checked_one_send_at_a_time_until_confirmed() -> None:
    """Two rejections set a threshold (support 2); one send at a time goes above it, the
    first a second after it was set, until a check sent a slope window after it is turned
    away and the support reaches CONFIRM; then every send is held. Worded 429s too: a
    provider that enforces its per-minute limit per second (OpenAI: "60,000 requests a
    minute may be enforced as 1,000 a second") answers "requests per minute" at whatever
    count the minute held then, and confirmed at once by a burst of them, 84 a minute
    held a fleet paced at 1,200 for a minute, again and again (morning peak: 5.4x the
    oracle)."""
    assert CONFIRM == 4
    requests = RequestLimit()
    for i in range(12):
        assert send_if_let(requests, float(i)) == 0.0
    requests.rejected(10.0, 10.05)  # 10 others (11 is still out)
    requests.rejected(11.0, 11.05)  # 10 others (10 turned away)
    limit = requests.limit
    assert limit is not None
    assert (limit.high, limit.support, limit.held_since) == (10, 2, 11.05)
    assert requests.wait(11.1) == pytest.approx(0.95)  # the first check a second after
    assert send_if_let(requests, 12.05) == 0.0  # the first check
    assert requests.wait(12.1) == pytest.approx(0.5)  # one at a time: its answer is out
    requests.rejected(12.05, 12.1)
    assert (limit.support, limit.tested) == (3, False)  # a second after: not a test
    assert requests.wait(12.2) == pytest.approx(21.05 - 12.2)  # a slope window after
    assert send_if_let(requests, 21.05) == 0.0
    requests.rejected(21.05, 21.1)
    assert (limit.support, limit.tested) == (CONFIRM, True)
    assert requests.wait(21.2) > 30.0  # confirmed: held until the window has room


def test_a_check_that_passes_lifts_a_pools_threshold() -> None:
    """A threshold two random 429s set: its check passes above it, and it no longer fits
    two answers more than no limit: nothing is held."""
    requests = RequestLimit()
    for i in range(12):
        assert send_if_let(requests, float(i)) == 0.0
    requests.rejected(10.0, 10.05)
    requests.rejected(11.0, 11.05)
    assert requests.estimate(11.05) == 10
    assert send_if_let(requests, 12.05) == 0.0  # the check
    requests.passed(12.05)  # accepted with 10 others in its window
    assert requests.estimate(12.1) is None
    assert requests.wait(12.1) == 0.0


def test_a_check_the_slots_refused_is_sent_again() -> None:
    """A check a concurrency 429 turned away says nothing of the request limit: the next
    send checks again."""
    requests = RequestLimit()
    for i in range(12):
        assert send_if_let(requests, float(i)) == 0.0
    requests.rejected(10.0, 10.05)
    requests.rejected(11.0, 11.05)
    assert send_if_let(requests, 12.05) == 0.0
    assert requests.wait(12.1) > 0
    requests.turned_away(12.05, refused=True)
    assert send_if_let(requests, 12.1) == 0.0  # checks again


def test_at_most_max_answers_are_kept() -> None:
    """A fast flow: the oldest answers go first once MAX_ANSWERS are kept, so what an
    answer costs stays bounded; two rejections among the newest still hold."""
    limit = CountLimit()
    for i in range(MAX_ANSWERS + 100):
        limit.passed(i * 0.001, i % 50)
    assert repr(limit) == f"CountLimit(high=inf, answers={MAX_ANSWERS}, rejections=0)"
    limit.rejected(5.0, 60, 5.0)
    limit.rejected(5.0, 60, 5.0)
    assert limit.estimate(5.0) == 60


def test_a_429_at_the_paced_rate_is_a_word_for_a_threshold_there() -> None:
    """Sends paced at 1,200 a minute: a first 429 at 1,203 (within the count's error of
    the pace) holds sends there at once; a first 429 well below it still holds nothing
    (a pool's at the top of a ramp), and the pace adds nothing to a threshold there."""
    limit = CountLimit()
    limit.paced = 1200.0
    assert limit.rejected(72.0, 1203, 72.05)
    assert limit.estimate(72.05) == 1203
    assert limit.support == SUPPORT
    low = CountLimit()
    low.paced = 1200.0
    assert not low.rejected(30.0, 500, 30.05)
    assert low.estimate(30.05) == math.inf
    assert low.rejected(30.1, 500, 30.15)  # a second word at 500: held on its own two
    assert (low.estimate(30.15), low.support) == (500, SUPPORT)


# --------------------------------------------------------------------------- inferred


def test_an_inferred_thresholds_wave_is_one_answer_at_its_lowest_count() -> None:
    """Bare 429s (``stated=False``) for 26 sends that went at one instant, before the
    first of them was answered: one answer, at the wave's lowest count (each answered one
    left our count), so no threshold holds. A send after that answer is a second answer:
    held there. Worded, the same wave holds at once (the provider said what it counted)."""
    inferred, worded = CountLimit(stated=False), CountLimit()
    for limit in (inferred, worded):
        for i in range(60):
            limit.passed(i * 0.1, i)
    for count in range(85, 59, -1):
        now = 10.05 + (85 - count) * 0.001
        inferred.rejected(10.0, count, now, stated=False)
        worded.rejected(10.0, count, now)
    assert (inferred.estimate(10.1), inferred.support) == (math.inf, 0)
    assert worded.high == 60
    assert repr(inferred) == "CountLimit(high=inf, answers=61, rejections=1)"
    assert inferred.rejected(10.2, 60, 10.25, stated=False)  # sent after 10.05
    assert (inferred.high, inferred.support) == (60, SUPPORT)
    assert not inferred.tested  # its checks still go (RequestLimit)


def test_a_worded_429_makes_an_inferred_threshold_stated() -> None:
    """Stated, its waves count one answer each again; it still needs its test."""
    limit = CountLimit(stated=False)
    limit.rejected(10.0, 50, 10.05, stated=False)
    limit.rejected(10.1, 50, 10.15, stated=False)
    assert (limit.high, limit.stated, limit.tested) == (50, False, False)
    limit.rejected(10.2, 50, 10.25)
    assert (limit.high, limit.stated, limit.tested) == (50, True, False)


def _inferred_at_10() -> RequestLimit:
    """Sends at 0..11 s; bare 429s for those at 10 and 11 s, each taken for the request
    limit's by its count (10 of ours in the minute, twice: the second is told to it)."""
    requests = RequestLimit()
    for i in range(12):
        assert send_if_let(requests, float(i)) == 0.0
    assert not requests.unexplained(10.0, 10.05)  # one answer: held nowhere yet
    requests.turned_away(10.0)
    assert requests.unexplained(11.0, 11.05)
    requests.rejected(11.0, 11.05, stated=False)
    limit = requests.limit
    assert limit is not None
    assert (limit.high, limit.support, limit.tested, limit.held_since) == (10, 2, False, 11.05)
    return requests


def test_an_inferred_threshold_is_tested_by_a_check_a_slope_window_after_it() -> None:
    """Its first check goes a second after it was set (sent at once, it met what its
    429s met); turned away then, it may still be the slots' or a slope window's end:
    the next goes once a slope window has passed, and only that one turned away confirms
    it. While a check is out, a held send asks again within half a second."""
    requests = _inferred_at_10()
    limit = requests.limit
    assert limit is not None
    assert requests.wait(11.1) == pytest.approx(0.95)  # the first check at 12.05
    assert send_if_let(requests, 12.05) == 0.0
    assert requests.wait(12.1) == pytest.approx(0.5)  # its answer may lift it
    requests.rejected(12.05, 12.1, stated=False)
    assert (limit.support, limit.tested) == (3, False)
    assert requests.slope_window_s == 10.0
    assert requests.wait(12.2) == pytest.approx(21.05 - 12.2)  # a slope window after
    assert send_if_let(requests, 21.05) == 0.0
    requests.rejected(21.05, 21.1, stated=False)
    assert (limit.support, limit.tested) == (CONFIRM, True)
    assert requests.wait(21.2) > 30.0  # confirmed: held until the window frees


def test_an_inferred_thresholds_passing_check_lifts_it() -> None:
    requests = _inferred_at_10()
    assert send_if_let(requests, 12.05) == 0.0
    requests.passed(12.05)  # 11 of ours in its window, above the threshold
    assert requests.estimate(12.1) is None
    assert requests.wait(12.1) == 0.0


def test_an_adopted_threshold_hears_the_later_bare_429s_itself() -> None:
    """After the threshold lifted, the window held up to 39 of ours and passed; a minute
    later bare 429s come at 5 and 4. The adopted threshold remembers the passes above 5: not
    the request limit's. (A fresh threshold beside it knew none of them, took two such
    429s for a limit there that nothing held, and every 429 after was taken for it.)"""
    requests = _inferred_at_10()
    assert send_if_let(requests, 12.05) == 0.0
    requests.passed(12.05)
    for i in range(13, 41):
        assert send_if_let(requests, float(i)) == 0.0
        requests.passed(float(i))
    for at, count in ((95.0, 5), (96.0, 4)):  # 36..40 s leave the window by then
        assert send_if_let(requests, at) == 0.0
        assert requests.count(at) == count
        assert not requests.unexplained(at, at + 0.05)
        requests.turned_away(at)
    assert requests.estimate(96.1) is None


@pytest.mark.parametrize(
    ("tested", "top", "high"), [(True, 598, 599), (False, 598, math.inf), (True, 700, math.inf)]
)
def test_a_tested_inferred_threshold_passed_just_above_moves_up(
    tested: bool, top: int, high: float
) -> None:
    """Four waves of bare 429s at 597 (a real 600, counted a few short), its check turned
    away a slope window later (tested); then regrowth passes at 597 and ``top``. Just
    above (within the count's error) the limit is a little higher: the threshold moves
    up past the most that passed, not away (lifted, the gate's pace went through: 5.9 %
    of calls with a 429). Untested, or passed well above, it is lifted."""
    limit = CountLimit(stated=False)
    for i in range(597):
        limit.passed(i * 0.05, i)
    for at in (30.0, 30.1, 31.0, 40.0):
        limit.rejected(at, 597, at + 0.05, stated=False)
    limit.tested = tested
    assert (limit.high, limit.support) == (597, 4)
    for at, count in ((90.0, 597), (90.1, 597), (90.2, top)):
        limit.passed(at, count)
    assert limit.high == high
    if high != math.inf:
        assert limit.support == CONFIRM


@pytest.mark.parametrize(("quoted", "checked"), [(10.0, False), (1200.0, True), (None, True)])
def test_a_threshold_the_provider_quoted_is_not_checked(
    quoted: float | None, checked: bool
) -> None:
    """Two 429s quoting "Limit 10, Used 10" at 10 of ours in the window: the provider's
    own number where our count agrees, held with no check above it until the window
    frees (a minute after the first sends). A quote our count does not agree with (a
    minute enforced per second: "Limit 1200") or none: checked a second after it was set,
    as every threshold is."""
    requests = RequestLimit()
    for i in range(12):
        assert send_if_let(requests, float(i)) == 0.0
    requests.rejected(10.0, 10.05, quoted=quoted)  # 10 others (11 is still out)
    requests.rejected(11.0, 11.05, quoted=quoted)
    limit = requests.limit
    assert limit is not None
    assert (limit.high, limit.support) == (10, 2)
    assert limit.agrees is not checked
    # Regrown at the slowest period (a request each ten minutes), or a request a minute.
    assert limit.growth == pytest.approx(1.0 if checked else 0.1)
    wait = requests.wait(11.1)
    if checked:
        assert wait == pytest.approx(0.95)  # the first check a second after
    else:
        assert wait == pytest.approx(60.0 - 11.1)  # held until the first send leaves


@pytest.mark.parametrize(
    ("quoted", "error"),
    [
        (-1.0, ValueError),
        (0, ValueError),
        (math.nan, ValueError),
        ("600", TypeError),
        (True, TypeError),
    ],
)
def test_a_quoted_limit_must_be_a_positive_number(quoted: object, error: type[Exception]) -> None:
    """The error names the parameter and the value, and nothing is learned."""
    clock = FakeClock()
    gate = Gate(8, name="quoted", clock=clock)
    limit = AdaptiveLimit(gate, clock=clock, pace_burst_rate=True)
    with pytest.raises(error, match="quoted"):
        limit.on_rate("requests", 0.0, quoted=quoted)  # type: ignore[arg-type]
    assert limit.statistics().requests_per_minute_estimate is None
