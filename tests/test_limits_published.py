"""A published request rate is probed upward (issue 30: a published limit is a starting
point): pure arithmetic, then on an adaptive limit on a manual clock, then the policy's
switch."""

from __future__ import annotations

import math

import pytest

from anygate import AdaptiveLimit, Gate, LimitReport, Policy, Rate, RateLearner, ReportedLimit
from anygate._limits.published import BIND, BIND_S, GROWTH, WINDOW_S, PublishedProbe, TokenProbe
from tests.policy_helpers import FakeClock


def test_the_probe_steps_a_bound_rate_and_goes_back_at_the_first_429() -> None:
    """A rate whose whole minute was accepted (``BIND`` of it) is multiplied by
    ``GROWTH``; one that was not is asked again a second later; the first per-minute 429
    ends the probe at the last rate that drew none."""
    probe = PublishedProbe(1200)
    assert probe.step(0.0, 0, 1200, rejected=False) is None
    assert probe.next_at == 1.0
    assert probe.step(60.0, int(BIND * 1200) - 1, 1200, rejected=False) is None
    assert probe.next_at == 61.0
    assert probe.step(61.0, int(BIND * 1200) + 1, 1200, rejected=False) == 1200 * GROWTH
    # A minute later at 2,400 the count is 2,400's: stepped again.
    assert probe.step(90.0, 1800, 2400, rejected=False) is None
    assert probe.step(121.0, 2300, 2400, rejected=False) == 4800
    assert probe.step(125.0, 2350, 4800, rejected=True) == 2400
    assert probe.ended
    assert probe.step(200.0, 2400, 2400, rejected=False) is None


def test_a_step_that_stood_steps_again_once_it_binds_over_bind_s() -> None:
    """The first step waits for a whole minute at the published rate; once it stood, the
    stepped rate steps again as soon as its last ``BIND_S`` seconds accepted ``BIND`` of
    it, not after a whole minute at it. The published rate itself never steps so."""
    probe = PublishedProbe(1200)
    burst = math.ceil(BIND * 1200 * BIND_S / WINDOW_S)  # BIND_S of 1,200's pace
    assert probe.step(10.0, 300, 1200, rejected=False, recent=burst) is None
    assert probe.step(61.0, int(BIND * 1200) + 1, 1200, rejected=False) == 2400
    at_2400 = math.ceil(BIND * 2400 * BIND_S / WINDOW_S)
    assert probe.step(66.0, 1300, 2400, rejected=False, recent=at_2400 - 1) is None
    assert probe.step(72.0, 1400, 2400, rejected=False, recent=at_2400) == 4800
    assert probe.good == 2400
    assert probe.step(75.0, 1500, 4800, rejected=True) == 2400
    assert probe.ended


def test_a_step_stands_only_once_bind_s_has_passed_at_it() -> None:
    """The sends of the ``BIND_S`` before a step went at the rate below it: a second after
    the step, a burst that reached the stepped rate's ``BIND_S`` worth proves nothing of
    it, and the rate below stays the good one (what a 429 brings the gate back to, and
    what its requests count as paced at). ``BIND_S`` on, the same count stands."""
    probe = PublishedProbe(12_000)
    assert probe.step(79.0, int(BIND * 12_000) + 1, 12_000, rejected=False) == 24_000
    at_24000 = math.ceil(BIND * 24_000 * BIND_S / WINDOW_S)
    assert probe.step(80.0, 12_000, 24_000, rejected=False, recent=at_24000) is None
    assert probe.good == 12_000
    assert probe.step(79.0 + BIND_S, 12_000, 24_000, rejected=False, recent=at_24000) == 48_000
    assert probe.good == 24_000


def test_a_rate_set_by_another_hand_ends_the_probe() -> None:
    """The header learner (or the user) set the rate: it is theirs, never stepped again."""
    probe = PublishedProbe(1200)
    probe.step(0.0, 0, 1200, rejected=False)
    assert probe.step(60.0, 10_000, 1080, rejected=False) is None
    assert probe.ended


def _bind(limit: AdaptiveLimit, clock: FakeClock, start: float, seconds: float, rpm: int) -> None:
    """Send at ``rpm`` a minute from ``start`` for ``seconds``; each send the limit lets go
    passes (one it holds is not sent)."""
    gap = 60.0 / rpm
    at = start
    while at < start + seconds:
        clock.now = at
        if limit.reserve_send(at, None) == 0.0:
            limit.passed(at)
        at += gap


def test_an_adaptive_limit_steps_the_gates_published_rate_until_a_429() -> None:
    """On a gate paced at a published 600 requests a minute, bound for a minute: the rate
    doubles; a per-minute 429 brings it back to the published 600 at once, and it stays
    there (the request estimate holds sends from then on)."""
    clock = FakeClock()
    gate = Gate(64, name="published", rate=Rate(requests_per_minute=600), clock=clock)
    limit = AdaptiveLimit(gate, clock=clock, pace_burst_rate=True)
    limit._probe_published_rate(True)
    assert limit.probes_published_rate
    _bind(limit, clock, 0.0, 55.0, 600)
    assert gate.rate == Rate(requests_per_minute=600)  # not yet a whole minute's worth
    _bind(limit, clock, 55.0, 6.0, 600)
    assert gate.rate == Rate(requests_per_minute=1200)
    limit.on_rate("requests", clock.now)
    assert gate.rate == Rate(requests_per_minute=600)
    assert not limit.probes_published_rate
    _bind(limit, clock, clock.now, 120.0, 600)
    assert gate.rate == Rate(requests_per_minute=600)


def test_a_rate_that_does_not_bind_is_not_stepped() -> None:
    """Demand under the published rate (half of it) says nothing about a higher one."""
    clock = FakeClock()
    gate = Gate(64, name="slack", rate=Rate(requests_per_minute=600), clock=clock)
    limit = AdaptiveLimit(gate, clock=clock, pace_burst_rate=True)
    limit._probe_published_rate(True)
    _bind(limit, clock, 0.0, 180.0, 300)
    assert gate.rate == Rate(requests_per_minute=600)
    assert limit.probes_published_rate


@pytest.mark.parametrize("published", [True, False], ids=["published", "ceiling"])
def test_a_policy_probes_its_rate_only_when_it_is_the_published_one(published: bool) -> None:
    """``rate_is_ceiling=False`` turns the probe on for the policy's gate; the default
    (a ceiling) leaves it off; a policy without a request rate has nothing to probe."""
    policy = Policy(
        name=f"probe-{published}",
        rate=Rate(requests_per_minute=600),
        rate_is_ceiling=not published,
    )
    assert policy.adaptive_limit.probes_published_rate is published
    bare = Policy(name=f"probe-bare-{published}", rate_is_ceiling=False)
    assert not bare.adaptive_limit.probes_published_rate


# ----------------------------------------------------------------------------- tokens


def test_the_token_probe_steps_while_the_rate_binds_and_only_on_proof_again() -> None:
    """A token rate that bound over the last ``BIND_S`` doubles at once; the next step
    waits until the tokens accepted since the first prove more than the rate below it
    (a full bucket of the old rate could have passed them otherwise)."""
    probe = TokenProbe(120_000)
    share = BIND * 120_000 * BIND_S / WINDOW_S  # what binding means over BIND_S
    assert probe.step(10.0, share - 1, 0.0, 120_000, rejected=False) is None
    assert probe.next_at == 11.0
    assert probe.step(11.0, share + 1, 20_000, 120_000, rejected=False) == 240_000
    assert probe.stepped
    # Binding at 240,000 a minute later, but 240,000 accepted since the step is what a full
    # bucket of 120,000 holds plus a minute of its refill: no proof, no step.
    assert probe.step(71.0, 2 * share, 20_000 + 240_000, 240_000, rejected=False) is None
    # 80 s: 320,000 since the step, against the old rate's 120,000 x (1 + 80/60) x 1.05.
    assert probe.step(91.0, 2 * share, 20_000 + 320_000, 240_000, rejected=False) == 480_000


def test_a_429_brings_the_token_rate_back_to_what_the_tokens_prove() -> None:
    """The first 429 ends the probe at the proven rate: a bucket of ``c`` drained by a
    step (at twice ``c``) after a minute proves ``c`` exactly; never above the rate."""
    probe = TokenProbe(100_000)
    share = BIND * 100_000 * BIND_S / WINDOW_S
    assert probe.step(10.0, share, 10_000, 100_000, rejected=False) == 200_000
    # A real 130,000 full at the step runs dry ~1.86 min later at 200,000 a minute.
    drained = 130_000 * (1 + 1.8571)
    assert probe.proven(10.0 + 1.8571 * 60, 10_000 + drained) == pytest.approx(130_000, rel=1e-3)
    assert probe.step(10.0 + 1.8571 * 60, 0.0, 10_000 + drained, 200_000, rejected=True) == (
        pytest.approx(130_000, rel=1e-3)
    )
    assert probe.ended
    # The published rate proven no more than itself: a 429 before any step leaves it.
    fresh = TokenProbe(100_000)
    assert fresh.step(5.0, 0.0, 5_000, 100_000, rejected=True) is None
    assert fresh.ended


def test_a_token_rate_set_by_another_hand_ends_the_token_probe() -> None:
    probe = TokenProbe(100_000)
    assert probe.step(5.0, 0.0, 0.0, 90_000, rejected=False) is None
    assert probe.ended
    assert not probe.stepped


class _Bucket:
    """A provider's token bucket: ``per_minute`` refilled continuously, full at the start."""

    def __init__(self, per_minute: float) -> None:
        self.per_minute = per_minute
        self.level = per_minute
        self.at = 0.0

    def take(self, at: float, cost: float) -> bool:
        self.level = min(self.per_minute, self.level + (at - self.at) * self.per_minute / 60)
        self.at = at
        if self.level < cost:
            return False
        self.level -= cost
        return True


def _pace_tokens(
    limit: AdaptiveLimit, gate: Gate, clock: FakeClock, bucket: _Bucket, until: float
) -> int:
    """Send 2,000-token requests at the gate's token rate into ``bucket`` until ``until``;
    each answer goes to the adaptive limit as the policy gives it, and a send the token
    estimate holds waits. Returns the 429s."""
    cost, rejected = 2_000, 0
    while clock.now < until:
        rate = gate.rate
        assert rate is not None
        assert rate.tokens_per_minute is not None
        at = clock.now
        wait = limit.reserve_send(at, None, tokens=cost)
        if wait > 0:  # held to the token estimate a 429 taught
            clock.now = at + wait
            continue
        if bucket.take(at, cost):
            limit.passed(at, 1, cost)
        else:
            rejected += 1
            limit.on_rate("tokens", at, tokens=cost)
        clock.now = at + 60.0 * cost / rate.tokens_per_minute
    return rejected


@pytest.mark.parametrize("real", [50_000, 100_000, 150_000, 200_000, 400_000])
def test_a_paced_token_rate_ends_near_the_buckets_limit_and_never_above(real: int) -> None:
    """A gate paced at a published 100,000 TPM in front of a bucket of ``real``: the probe
    ends within a few minutes at no more than the real limit, and at nearly all of it
    when that is above the published rate; a tier below leaves the published rate to the
    token estimate (the probe ends at its first 429)."""
    clock = FakeClock()
    gate = Gate(64, name=f"tokens-{real}", rate=Rate(tokens_per_minute=100_000), clock=clock)
    limit = AdaptiveLimit(gate, clock=clock, pace_burst_rate=True)
    limit._probe_published_rate(True)
    assert limit.probes_published_rate
    rejected = _pace_tokens(limit, gate, clock, _Bucket(real), 600.0)
    rate = gate.rate
    assert rate is not None
    assert rate.tokens_per_minute is not None
    assert not limit.probes_published_rate
    assert rejected >= 1
    if real > 100_000:
        assert 0.9 * real <= rate.tokens_per_minute <= real
    else:
        assert rate.tokens_per_minute == 100_000


def test_a_stated_token_limit_ends_the_token_probe() -> None:
    """Headers (or a 429's words) that state the token limit are the provider's own
    number: the probe leaves the rate to the learner, even at the published value."""
    clock = FakeClock()
    gate = Gate(64, name="stated-tokens", rate=Rate(tokens_per_minute=100_000), clock=clock)
    limit = AdaptiveLimit(gate, clock=clock, pace_burst_rate=True)
    limit._probe_published_rate(True)
    report = LimitReport(tokens=ReportedLimit(limit=100_000, remaining=90_000, reset_s=1.0))
    RateLearner.of(gate).observe(report, 0.0)
    _pace_tokens(limit, gate, clock, _Bucket(400_000), 120.0)
    assert gate.rate == Rate(tokens_per_minute=100_000)
    assert not limit.probes_published_rate


def test_a_plain_429_is_the_stepped_token_rates_and_ends_an_unstepped_probe() -> None:
    """A 429 that says nothing (no code, no words, no headers): while the token rate is
    stepped it is taken for the tokens' (a bucket the step drains answers so: hidden
    300,000 behind a published 200,000 with plain 429s kept the step and lost calls);
    before any step it ends the probe at the published rate."""
    clock = FakeClock()
    gate = Gate(64, name="plain-stepped", rate=Rate(tokens_per_minute=100_000), clock=clock)
    limit = AdaptiveLimit(gate, clock=clock, pace_burst_rate=True)
    limit._probe_published_rate(True)
    _pace_tokens(limit, gate, clock, _Bucket(1_000_000), 12.0)
    assert gate.rate == Rate(tokens_per_minute=200_000)
    assert limit.attribute(clock.now, 1, 2_000) == "tokens"
    limit.on_rate("tokens", clock.now, tokens=2_000)  # as the policy does with "tokens"
    rate = gate.rate
    assert rate is not None
    assert rate.tokens_per_minute is not None
    assert 100_000 <= rate.tokens_per_minute < 200_000
    assert not limit.probes_published_rate

    clock = FakeClock()
    gate = Gate(64, name="plain-unstepped", rate=Rate(tokens_per_minute=100_000), clock=clock)
    limit = AdaptiveLimit(gate, clock=clock, pace_burst_rate=True)
    limit._probe_published_rate(True)
    assert limit.attribute(0.0, 1, 2_000) != "tokens"
    assert not limit.probes_published_rate
    _pace_tokens(limit, gate, clock, _Bucket(1_000_000), 120.0)
    assert gate.rate == Rate(tokens_per_minute=100_000)
