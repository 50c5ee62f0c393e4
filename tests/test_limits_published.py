"""A published request rate is probed upward (issue 30: a published limit is a starting
point): pure arithmetic, then on an adaptive limit on a manual clock, then the policy's
switch."""

from __future__ import annotations

import pytest

from anygate import AdaptiveLimit, Gate, Policy, Rate
from anygate._limits.published import BIND, GROWTH, PublishedProbe
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
