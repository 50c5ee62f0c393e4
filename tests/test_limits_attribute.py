"""A plain 429 (no code, no wording, no headers) is taken for the limit our counts say was
full (issue 30 item 3): the pure rule, the in-service count it rests on, and a policy on
trio's MockClock learning a provider's slots from bare 429s alone; a suspect 429 (one at a new
high during a ramp) checked once a call has left."""

from __future__ import annotations

import math
from typing import Any

import anyio
import pytest

from anygate import AdaptiveLimit, Gate, LimitChanged, Policy, Rate, ResponseError, RetryConfig
from anygate._config.limit_values import OVER_LIMIT_POLL_S
from anygate._limits.attribute import NEAR, attribute
from tests.conftest import mock_clock
from tests.policy_helpers import FakeClock


def _attribute(**kwargs: Any) -> object:
    facts: dict[str, Any] = {
        "sending": 10,
        "most_passed": 10,
        "requests": 0,
        "requests_estimate": None,
        "steep": False,
    }
    facts.update(kwargs)
    return attribute(**facts)


# --------------------------------------------------------------------------- the rule


def test_a_new_high_in_service_at_a_steady_rate_is_the_slots() -> None:
    assert _attribute(sending=33, most_passed=32) == "concurrency"


def test_a_new_high_while_the_rate_grew_steeply_is_no_evidence_of_slots() -> None:
    """During a ramp the concurrency rises with the rate: a slope rule's 429 then lands at
    a new high too."""
    assert _attribute(sending=33, most_passed=32, steep=True) == "burst"


def test_a_count_that_got_through_before_is_not_the_slots() -> None:
    assert _attribute(sending=20, most_passed=32) == "burst"
    assert _attribute(sending=32, most_passed=32) == "burst"


def test_before_anything_got_through_nothing_is_a_new_high() -> None:
    assert _attribute(sending=1, most_passed=0) == "burst"
    assert _attribute(sending=5, most_passed=0) == "burst"


def test_a_minute_near_its_estimate_is_the_per_minute_limit() -> None:
    assert _attribute(requests=1100, requests_estimate=1200) == "requests"
    assert _attribute(requests=round(NEAR * 1000), requests_estimate=1000) == "requests"
    assert _attribute(requests=800, requests_estimate=1200) == "burst"
    assert _attribute(requests=5000, requests_estimate=None) == "burst"  # nothing to be near


def test_when_both_are_full_the_nearer_estimate_wins() -> None:
    # 33 / 32 in service against 1,250 / 1,200 requests: the minute is fuller.
    assert _attribute(sending=33, most_passed=32, requests=1250, requests_estimate=1200) == (
        "requests"
    )
    # 40 / 20 in service against 1,100 / 1,200: the slots are.
    assert _attribute(sending=40, most_passed=20, requests=1100, requests_estimate=1200) == (
        "concurrency"
    )


def test_the_token_minute_is_a_per_minute_count_too() -> None:
    """Tokens near their estimate, and fuller than the requests: the token limit. Tokens
    far from it: a short window's (the burst pacer paced the request rate here before)."""
    facts = {"requests": 500, "requests_estimate": 1000, "tokens_estimate": 100_000.0}
    assert _attribute(tokens=95_000.0, **facts) == "tokens"
    assert _attribute(tokens=40_000.0, **facts) == "burst"
    # Both near: the fuller one.
    assert _attribute(tokens=92_000.0, requests=990, requests_estimate=1000) == "requests"
    # No token estimate (the attempt was charged none): tokens are never the answer.
    assert _attribute(tokens=95_000.0, tokens_estimate=None) == "burst"
    # The slots still beat a fuller minute only when further past their high.
    assert _attribute(sending=33, most_passed=32, tokens=95_000.0, **facts) == "concurrency"


def test_a_code_naming_a_per_minute_limit_is_requests_or_tokens() -> None:
    """OpenAI's ``rate_limit_exceeded`` without its wording: never the slots or a slope,
    the fuller of the two counts, even far from both estimates."""
    facts = {"sending": 40, "most_passed": 20, "per_minute": True}
    assert _attribute(requests=100, requests_estimate=1000, **facts) == "requests"
    assert (
        _attribute(
            requests=100,
            requests_estimate=1000,
            tokens=50_000.0,
            tokens_estimate=100_000.0,
            **facts,
        )
        == "tokens"
    )
    assert _attribute(**facts) == "requests"  # nothing known: the count every call has


# --------------------------------------------------------------------------- the counts


def test_the_most_in_service_leaves_out_calls_turned_away_after_it_was_sent() -> None:
    """27 slot holders at a send, three of them 429s still on their way back (one sent at
    the same instant): 24 were in service. Counted with them, a 24-slot provider read 27,
    and the slots' later 429s were taken for a rate rule's."""
    clock = FakeClock()
    gate = Gate(64, name="counts", clock=clock)
    limit = AdaptiveLimit(gate, clock=clock)
    clock.now = 10.05
    limit.rejected(9.98)  # sent before, answered after the send at 10.0
    limit.rejected(10.0)  # sent at the same instant
    clock.now = 10.2
    limit.rejected(10.01)  # sent after it: not counted
    clock.now = 12.0
    limit.passed(10.0, sending=27)
    assert limit.statistics().most_in_service == 25
    limit.passed(11.0, sending=24)  # no 429 around it
    assert limit.statistics().most_in_service == 25
    limit.passed(11.5, sending=26)
    assert limit.statistics().most_in_service == 26


# --------------------------------------------------------------------------- a policy


def _plain() -> ResponseError:
    return ResponseError(429)  # no body, no headers: "HTTP 429"


class _FullSlots:
    """A provider with ``slots`` slots: each call is served for 1 s, and one that finds
    them all taken gets a bare 429 after 0.05 s (``turned`` counts them)."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.in_service = 0
        self.turned = 0

    async def __call__(self) -> str:
        if self.in_service >= self.slots:
            self.turned += 1
            await anyio.sleep(0.05)
            raise _plain()
        self.in_service += 1
        try:
            await anyio.sleep(1.0)
        finally:
            self.in_service -= 1
        return "ok"


async def _agents(policy: Policy, provider: _FullSlots, *, spacing: float) -> list[str]:
    """40 agents starting ``spacing`` s apart, each making 8 calls in a row: the answers."""
    results: list[str] = []

    async def agent(index: int) -> None:
        await anyio.sleep(index * spacing)
        results.extend([await policy.call(provider) for _ in range(8)])

    async with anyio.create_task_group() as tg:
        for index in range(40):
            tg.start_soon(agent, index)
    return results


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", [mock_clock()])
async def test_a_policy_learns_the_slots_from_plain_429s() -> None:
    """A provider with 12 slots answers a bare 429 when they are all taken; 40 callers,
    each making 8 one-second calls in a row, start over 2 s (no slots published). The
    policy takes the 429s at a new high for the slots and holds its gate near 12; most
    calls see no 429 at all."""
    slots = 12
    provider = _FullSlots(slots)

    policy = Policy(
        name="plain-slots",
        clock=anyio.current_time,
        retry=RetryConfig(throttle_attempts=20, max_attempts=20),
    )
    results = await _agents(policy, provider, spacing=0.05)
    assert results == ["ok"] * 320
    assert policy.adaptive_limit.limit <= slots + 1
    # 6 here; taken for a per-minute 429 (before), 111 (a third of the calls).
    assert provider.turned <= 16, provider.turned


def test_a_slot_got_before_a_cut_waits_until_the_others_are_below_the_new_limit() -> None:
    """33 slots held when a concurrency 429 cut the limit to 32: the attempt that got the
    33rd just before would be the next 429 if sent. It waits, holding its slot (not counted
    at the provider), until a call leaves."""
    clock = FakeClock()
    gate = Gate(33, name="over", clock=clock)
    limit = AdaptiveLimit(gate, clock=clock)
    tokens = [gate.acquire_sync() for _ in range(33)]
    assert limit.on_concurrency(limit.generation, 33, exact=True) is not None
    assert gate.capacity == 32
    late = object()  # holds tokens[-1]
    wait = limit.reserve_send(clock.now, late)
    assert wait > 0
    assert limit.sending(gate.in_flight) == 32  # held back: not at the provider
    assert limit.reserve_send(clock.now, late) > 0  # still 32 others
    tokens[0].release()  # one leaves
    assert limit.reserve_send(clock.now, late) == 0.0
    assert limit.sending(gate.in_flight) == 32
    for token in tokens[1:]:
        token.release()


# --------------------------------------------------------------------------- a suspect 429


class _Call:
    """A policy's Run as the burst answer sees it: an object that may hold the probe."""

    burst_probe = False


def _at_a_new_high_during_a_ramp(
    *, plain: bool = True
) -> tuple[FakeClock, Gate, AdaptiveLimit, list[Any], float]:
    """32 calls got through at once before; the last 10 s held 40 sends and the 10 s
    before none (a ramp: ``steep``); 33 slot holders at the provider, one of them sent at
    ``at`` and turned away by a 429, a bare one if ``plain`` (else one that names the
    slope rule: not attributed). Returns the clock, gate, limit, the 32 others' tokens and
    ``at``."""
    clock = FakeClock()
    clock.now = 100.0
    gate = Gate(64, name="suspect", clock=clock)
    limit = AdaptiveLimit(gate, clock=clock)
    limit.passed(90.0, sending=32)
    for _ in range(40):
        assert limit.reserve_send(99.0) == 0.0
    tokens = [gate.acquire_sync() for _ in range(33)]
    at = 99.5
    clock.now = 99.55
    limit.rejected(at)
    if plain:
        assert limit.attribute(at, 33) == "burst"  # steep: no evidence of the slots yet
    tokens.pop().release()  # the throttled call's slot goes back at once
    return clock, gate, limit, tokens, at


def test_a_suspect_429s_check_waits_for_a_slot_and_a_pass_teaches_the_slots() -> None:
    """A bare 429 at a new high during a ramp could be the slope rule's or the slots'. Its
    check's probe (the throttled call's retry) waits, the others held too, until fewer
    calls are at the provider than at the 429: a slope rule turns it away then as well,
    the slots do not. Got through, the 429 was the slots': the limit becomes 32, and the
    change is handed to the policy once (it reports it)."""
    clock, gate, limit, tokens, at = _at_a_new_high_during_a_ramp()
    call, other = _Call(), object()
    assert limit.on_throttle(limit.generation, None, 33, admitted_at=at, caller=call) is None
    retry = gate.acquire_sync()  # the retry's slot: 32 others at the provider again
    assert limit.pass_pause(call) == (OVER_LIMIT_POLL_S, False)
    waiting = gate.acquire_sync()  # ``other``'s slot, held back while the check lasts
    wait, probe = limit.pass_pause(other)
    assert wait > 0
    assert not probe
    clock.now += 0.5
    assert limit.pass_pause(call) == (OVER_LIMIT_POLL_S, False)  # still 32 others
    tokens.pop().release()  # a call leaves: 31 others
    assert limit.pass_pause(call) == (0.0, True)
    call.burst_probe = True
    assert limit.take_change() is None
    limit.probe_accepted(call)
    assert gate.capacity == 32
    change = limit.take_change()
    assert change is not None
    assert (change.old, change.new, change.reason) == (64, 32, "concurrency")
    assert limit.take_change() is None
    assert limit.pass_pause(other) == (0.0, False)
    waiting.release()
    retry.release()
    for token in tokens:
        token.release()


def test_a_tentative_lesson_is_undone_by_a_pass_above_it_and_confirmed_by_a_second() -> None:
    """A bare 429 at a new high, 9 calls out, attributed to the slots: the limit becomes
    8 with no hold. A shared pool's 429 lands there as readily: a call that then gets
    through with 10 at the provider undoes it (the gate is uncapped again). The slots'
    lesson is confirmed by a second 429 at the same level instead: then it holds."""
    clock = FakeClock()
    clock.now = 10.0
    gate = Gate(math.inf, name="tentative", clock=clock)
    limit = AdaptiveLimit(gate, clock=clock)
    change = limit.on_concurrency(limit.generation, 9, exact=True, tentative=True)
    assert change is not None
    assert gate.capacity == 8
    assert not limit._slots.holding(clock.now)  # grows back at once
    limit.passed(10.5, sending=10)
    assert gate.capacity == math.inf
    # The slots' lesson: a second 429 at the level confirms it, with the usual hold.
    limit.on_concurrency(limit.generation, 12, exact=True, tentative=True)
    assert gate.capacity == 11
    clock.now = 11.0
    assert limit.on_concurrency(None, 12, exact=True, tentative=True) is None  # no lower
    while gate.capacity < 12:  # grown back by saturated successes, no hold
        limit.on_success(saturated=True)
    limit.on_concurrency(limit.generation, 13, exact=True, tentative=True)
    assert gate.capacity == 12
    assert limit._slots.holding(clock.now)
    limit.passed(11.5, sending=11)  # below the lesson: nothing to undo
    assert gate.capacity == 12
    # A worded concurrency 429 is never tentative.
    worded = AdaptiveLimit(Gate(math.inf, name="worded", clock=clock), clock=clock)
    worded.on_concurrency(worded.generation, 9, exact=True)
    assert worded._slots.holding(clock.now)


@pytest.mark.parametrize("tentative", [False, True])
def test_an_overshoots_429s_answered_out_of_order_teach_the_least_bound(tentative: bool) -> None:
    """A window's release sent 54 calls past 320 slots at once; their 429s come back in
    any order. The first answered (374 out) teaches 373, and the others, sent before that
    lesson, tighten it to the least count (321 out: 320 slots) instead of being old news.
    One sent after the lesson, or after any other change, is old news again."""
    clock = FakeClock()
    clock.now = 30.0
    gate = Gate(math.inf, name="overshoot", clock=clock)
    limit = AdaptiveLimit(gate, clock=clock)
    before = limit.generation
    assert limit.on_concurrency(before, 374, exact=True, tentative=tentative) is not None
    assert gate.capacity == 373
    change = limit.on_concurrency(before, 321, exact=True, tentative=tentative)
    assert change is not None
    assert (change.old, change.new, change.reason) == (373, 320, "concurrency")
    assert limit.on_concurrency(before, 330, exact=True, tentative=tentative) is None
    assert gate.capacity == 320
    assert limit.on_concurrency(before, 300, exact=False) is None  # an overload answer: no
    assert gate.capacity == 320
    assert limit._slots.holding(clock.now) is not tentative  # the lesson's hold is kept
    if tentative:
        limit.passed(30.5, sending=321)  # still undone by a pass above the tighter bound
        assert gate.capacity == math.inf
    limit.on_throttle(limit.generation, None, 300)  # another change since
    assert limit.generation > before + 1
    assert limit.on_concurrency(before, 310, exact=True, tentative=tentative) is None


def test_a_suspect_429s_probe_turned_away_confirms_the_slope_rule() -> None:
    """The same check, its probe turned away with a slot free: the slope rule's window is
    spent. A pause follows, as for any confirmed throttle, and no slot is cut."""
    clock, gate, limit, tokens, at = _at_a_new_high_during_a_ramp()
    call = _Call()
    assert limit.on_throttle(limit.generation, None, None, admitted_at=at, caller=call) is None
    retry = gate.acquire_sync()
    tokens.pop().release()
    assert limit.pass_pause(call) == (0.0, True)
    sent = clock.now
    clock.now += 0.05
    limit.rejected(sent)
    change = limit.on_throttle(limit.generation, None, None, probe=True, admitted_at=sent)
    assert change is not None
    assert change.reason == "burst_rate"
    assert limit.take_change() is None
    assert gate.capacity == 64
    retry.release()
    for token in tokens:
        token.release()


def test_a_suspect_429s_check_waits_for_a_slot_no_longer_than_a_pause() -> None:
    """No slot frees within ``pause_s``: the probe goes as crowded as the 429 it checks,
    and its pass then says nothing about the slots (no cut)."""
    clock, gate, limit, tokens, at = _at_a_new_high_during_a_ramp()
    call = _Call()
    assert limit.on_throttle(limit.generation, None, 33, admitted_at=at, caller=call) is None
    retry = gate.acquire_sync()
    assert limit.pass_pause(call) == (OVER_LIMIT_POLL_S, False)
    clock.now += limit.statistics().pause_s
    assert limit.pass_pause(call) == (0.0, True)
    call.burst_probe = True
    limit.probe_accepted(call)
    assert gate.capacity == 64
    assert limit.take_change() is None
    retry.release()
    for token in tokens:
        token.release()


def test_a_worded_burst_429s_check_goes_at_once() -> None:
    """A 429 that names the slope rule (``limit_burst_rate``) is no suspect: its check's
    probe goes at once, however many calls are at the provider."""
    _clock, gate, limit, tokens, at = _at_a_new_high_during_a_ramp(plain=False)
    call = _Call()
    assert limit.on_throttle(limit.generation, None, 33, admitted_at=at, caller=call) is None
    retry = gate.acquire_sync()
    assert limit.pass_pause(call) == (0.0, True)
    retry.release()
    for token in tokens:
        token.release()


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", [mock_clock()])
async def test_a_ramp_into_full_slots_is_taken_for_the_slots_not_a_slope_rule() -> None:
    """12 slots answer a bare 429 when all are taken; 40 callers start 0.1 s apart, each
    making 8 one-second calls (a ramp: the send rate climbs with the concurrency, so the
    first 429 at a new high is a suspect). Its check's probe goes once a call has left and
    gets through: the 429 was the slots', the limit becomes 12, and no burst pause is
    taken. Before, it was taken for a slope rule: two pauses, 7 calls turned away and
    34.4 s instead of 1 and 27.7 s. A bare 429's lesson is tentative: the limit grows
    back to 13 at once, and that call's 429 confirms 12 (2 calls turned away)."""
    slots = 12
    provider = _FullSlots(slots)

    events: list[Any] = []
    gate = Gate(math.inf, name="ramp", clock=anyio.current_time)  # paced: on the policy's clock
    policy = Policy(
        name="ramp",
        gate=gate,
        clock=anyio.current_time,
        hooks=[events.append],
        retry=RetryConfig(throttle_attempts=20, max_attempts=20),
    )
    start = anyio.current_time()
    results = await _agents(policy, provider, spacing=0.1)
    assert results == ["ok"] * 320
    changes = [(e.reason, e.new) for e in events if isinstance(e, LimitChanged)]
    # Tentative (a bare 429), grown back at once, confirmed by the regrowth's 429.
    assert changes == [("concurrency", 12), ("recovered", 13), ("concurrency", 12)]
    assert gate.capacity == slots
    assert provider.turned == 2
    assert anyio.current_time() - start < 30.0


# --------------------------------------------------------------------------- no estimate near


def test_a_count_below_a_fitted_threshold_is_not_the_request_limits() -> None:
    """Learned from its answers, the request limit's threshold is its count exactly (to
    the count's error): a plain 429 below it is another limit's, however near."""
    facts = {"requests_estimate": 600.0, "requests_fitted": True}
    assert _attribute(requests=600, **facts) == "requests"
    assert _attribute(requests=610, **facts) == "requests"
    assert _attribute(requests=595, **facts) == "burst"  # NEAR of 600, below the fit
    assert _attribute(requests=595, requests_estimate=600.0) == "requests"  # published


def _level(limit: AdaptiveLimit, clock: FakeClock, until: float, *, start: float = 0.0) -> None:
    """Ten sends a second from ``start`` to ``until`` (not included), each let go."""
    for i in range(round((until - start) * 10)):
        clock.now = start + i / 10
        assert limit.reserve_send(clock.now) == 0.0


def _plain_429(limit: AdaptiveLimit, clock: FakeClock, at: float) -> object:
    """A send at ``at`` answered by a bare 429 50 ms later: what it is taken for (then
    told, as a policy tells it: a throttle's send filled no window)."""
    clock.now = at
    assert limit.reserve_send(at) == 0.0
    clock.now = at + 0.05
    limit.rejected(at)
    attributed = limit.attribute(at, 5)
    if attributed == "burst":
        limit.turned_away(at)
    return attributed


def test_plain_429s_at_a_count_nothing_passes_above_are_the_request_limits() -> None:
    """Ten sends a second for two minutes (published 1,200 a minute: the 600 in the
    window is half of it, nowhere near), then bare 429s. The first is no one's: a slope
    rule's, as far as the counts say. The second at the same count, with nothing passed
    above it, is the request limit's: two 429s there fit a threshold (as two worded ones
    would), and the request estimate learns it from then on."""
    clock = FakeClock()
    gate = Gate(64, name="plain-rpm", rate=Rate(requests_per_minute=1200), clock=clock)
    limit = AdaptiveLimit(gate, clock=clock)
    _level(limit, clock, 120.0)
    assert _plain_429(limit, clock, 120.0) == "burst"
    assert _plain_429(limit, clock, 120.1) == "requests"
    limit.on_rate("requests", 120.1)
    estimate = limit.statistics().requests_per_minute_estimate
    assert estimate is not None
    assert 590 <= estimate <= 600


def test_plain_429s_among_passes_at_their_count_are_not_the_request_limits() -> None:
    """The same flow, a shared pool's bare 429s now and then: the sends between them
    pass at the count each 429 came at, and no threshold fits."""
    clock = FakeClock()
    gate = Gate(64, name="plain-pool", rate=Rate(requests_per_minute=1200), clock=clock)
    limit = AdaptiveLimit(gate, clock=clock)
    _level(limit, clock, 120.0)
    assert _plain_429(limit, clock, 120.0) == "burst"
    for i in range(1, 20):
        at = 120.0 + i / 10
        clock.now = at
        assert limit.reserve_send(at) == 0.0
        clock.now = at + 0.05
        limit.passed(at, sending=5)
    assert _plain_429(limit, clock, 122.0) == "burst"
    assert _plain_429(limit, clock, 122.1) == "burst"
    assert limit.statistics().requests_per_minute_estimate is None


@pytest.mark.parametrize("quiet", [False, True])
def test_plain_429s_where_a_slope_rule_could_have_sent_them_are_not_the_request_limits(
    quiet: bool,
) -> None:
    """Bare 429s at one count, again and again, while the rate rose (the trailing 10 s
    held more than the 10 s before) or right after a quiet stretch (a 30 s slope window's
    floor): a slope rule's as readily as a request limit's, and never taken for the
    latter (a 30 s window's floor of 60 held the morning peak to 60 a minute for two
    minutes: 1.56x the oracle)."""
    clock = FakeClock()
    gate = Gate(64, name="plain-slope", rate=Rate(requests_per_minute=1200), clock=clock)
    limit = AdaptiveLimit(gate, clock=clock)
    if quiet:
        _level(limit, clock, 25.0)  # level for 25 s after nothing: the 30 s before was quiet
    else:
        _level(limit, clock, 120.0)
        # The provider took more than a second's pace before (a test's answers,
        # tests/test_limits_pace.py): sends beyond it go untested.
        limit._sends.pace.taken = True
        for i in range(50):  # five times the rate for the last second
            clock.now = 119.0 + i / 50
            assert limit.reserve_send(clock.now) == 0.0
    at = clock.now + 0.1
    for k in range(4):
        assert _plain_429(limit, clock, at + k / 100) == "burst"
    assert limit.statistics().requests_per_minute_estimate is None
