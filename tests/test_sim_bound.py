"""The provider-capacity lower bound matches cases small enough to work out by hand.

All latencies and think times are constants and agents start exactly at their ramp
offsets (no start jitter), so every expected number below is plain arithmetic.
"""

from __future__ import annotations

import pytest

from anygate.sim._spec import BurstRule, FanOut, FleetSpec, Lognormal, ProviderSpec
from anygate.sim._workload import build_workload


def _bound(fleet: FleetSpec, **provider: object) -> object:
    spec = ProviderSpec(latency=Lognormal(median_s=1.0), **provider)  # type: ignore[arg-type]
    return build_workload(fleet, spec, seed=7).lower_bound(spec)


def _fleet(**kwargs: object) -> FleetSpec:
    return FleetSpec(start_jitter_s=0.0, **kwargs)  # type: ignore[arg-type]


def test_one_slot_serialises_all_work() -> None:
    """2 agents x 3 calls of 1 s on 1 slot: 6 s of work, longer than either 3 s chain."""
    bound = _bound(_fleet(agents=2, calls_per_agent=3), slots=1)
    assert bound.seconds == pytest.approx(6.0)
    assert bound.binding == "slots"
    assert bound.chain_s == pytest.approx(3.0)


def test_many_slots_make_the_chain_bind() -> None:
    """4 agents x 3 calls of 1 s with 0.5 s think, 8 slots: the 1 + 1.5 + 1.5 = 4 s chain binds."""
    fleet = _fleet(agents=4, calls_per_agent=3, think=Lognormal(median_s=0.5))
    bound = _bound(fleet, slots=8)
    assert bound.slots_s == pytest.approx(12 / 8)
    assert bound.chain_s == pytest.approx(4.0)
    assert (bound.seconds, bound.binding) == (pytest.approx(4.0), "chain")


def test_ramp_delays_the_last_chain() -> None:
    """A 10 s ramp over 5 agents starts the last one at 8 s; its 2 s chain ends at 10 s."""
    bound = _bound(_fleet(agents=5, ramp_s=10.0, calls_per_agent=2), slots=100)
    assert bound.chain_s == pytest.approx(10.0)


def test_fanout_chain_counts_its_longest_subagent() -> None:
    """Lead: call (1 s), 2 subagents of 2 calls (1 + 0.5 + 1 = 2.5 s), call (0.5 + 1 s) = 5 s."""
    fleet = _fleet(
        agents=1,
        calls_per_agent=2,
        think=Lognormal(median_s=0.5),
        fanout=FanOut(after_call=1, subagents=2, calls=2),
    )
    assert fleet.total_calls == 6
    bound = _bound(fleet, slots=10)
    assert bound.chain_s == pytest.approx(5.0)
    assert bound.slots_s == pytest.approx(0.6)


def test_rpm_bound() -> None:
    """130 calls at 60 RPM: admission 121 comes 2 minutes after the first, then 1 s of service."""
    bound = _bound(_fleet(agents=130, calls_per_agent=1), slots=1000, rpm=60)
    assert bound.rpm_s == pytest.approx(121.0)
    assert (bound.seconds, bound.binding) == (pytest.approx(121.0), "rpm")
    # Exactly 120 calls fit in windows starting at 0 and 60 s.
    exact = _bound(_fleet(agents=120, calls_per_agent=1), slots=1000, rpm=60)
    assert exact.rpm_s == pytest.approx(61.0)


def test_burst_bound() -> None:
    """Floor 10, growth 2, 10 s windows: 10 + 20 + 40 = 70 calls need windows 0-2, so 20 s + 1 s."""
    rule = BurstRule(window_s=10.0, growth=2.0, floor=10)
    bound = _bound(_fleet(agents=70, calls_per_agent=1), slots=1000, burst=rule)
    assert bound.burst_s == pytest.approx(21.0)
    assert bound.binding == "burst"
    # One more call needs a fourth window.
    more = _bound(_fleet(agents=71, calls_per_agent=1), slots=1000, burst=rule)
    assert more.burst_s == pytest.approx(31.0)
    # Ten calls fit in the first window: the bound is just the service time.
    few = _bound(_fleet(agents=10, calls_per_agent=1), slots=1000, burst=rule)
    assert few.burst_s == pytest.approx(1.0)


def test_bound_is_the_largest_part() -> None:
    """``seconds`` is the maximum of every part that applies, and names it."""
    rule = BurstRule(window_s=10.0, growth=2.0, floor=10)
    bound = _bound(_fleet(agents=50, calls_per_agent=2), slots=2, rpm=600, burst=rule)
    parts = {
        "slots": bound.slots_s,
        "chain": bound.chain_s,
        "rpm": bound.rpm_s,
        "burst": bound.burst_s,
    }
    assert parts["slots"] == pytest.approx(50.0)
    assert parts["burst"] == pytest.approx(31.0)  # 10 + 20 + 40 < 100 calls <= 150
    assert bound.seconds == max(p for p in parts.values() if p is not None)
    assert bound.binding == "slots"


def test_workload_is_a_function_of_the_seed() -> None:
    """The same seed draws the same workload; another seed draws a different one."""
    fleet = FleetSpec(agents=20, calls_per_agent=3, think=Lognormal(median_s=1.0, sigma=0.5))
    provider = ProviderSpec()
    a = build_workload(fleet, provider, seed=3)
    assert a == build_workload(fleet, provider, seed=3)
    assert a != build_workload(fleet, provider, seed=4)
    assert len(a.calls) == fleet.total_calls
    assert [c.index for c in a.calls] == list(range(fleet.total_calls))


def test_an_outage_adds_its_length_minus_the_longest_call() -> None:
    """10 agents x 2 calls of 1 s on 1 slot: 20 s of work. An outage [5, 15): 5 s of work
    before it, at most the one call in flight (1 s) during it, 14 s after 15 s: ends at 29 s,
    9 s later than without it. One at [30, 40) starts after the work can be done: 0."""
    fleet = _fleet(agents=10, calls_per_agent=2)
    from anygate.sim._spec import Outage

    bound = _bound(fleet, slots=1, outages=(Outage(start_s=5, end_s=15),))
    assert bound.outage_s == pytest.approx(9.0)
    assert bound.slots_s == pytest.approx(29.0)
    late = _bound(fleet, slots=1, outages=(Outage(start_s=30, end_s=40),))
    assert late.outage_s == 0.0


def test_burst_bound_uses_the_highest_dynamic_growth_and_none_when_rejections_count() -> None:
    """floor 10, growth up to 3 per 10 s window: 10 + 30 + 90 >= 100 calls -> the window at
    20 s holds the last admission (21 s with a 1 s call). Counting rejected arrivals lets a
    strategy raise the allowance, so there is no burst bound then."""
    fleet = _fleet(agents=100, calls_per_agent=1)
    dynamic = BurstRule(window_s=10, growth=2, floor=10, growth_min=1.5, growth_max=3, drift=0.2)
    assert _bound(fleet, slots=1000, burst=dynamic).burst_s == pytest.approx(21.0)
    counting = BurstRule(window_s=10, growth=2, floor=10, count_rejected=True)
    assert _bound(fleet, slots=1000, burst=counting).burst_s is None


def test_a_chain_waits_out_an_outage() -> None:
    """One agent, 2 calls of 1 s, outage [0.5, 10): the first call, admitted at 0, ends at
    1 s; the second would start at 1 s inside the outage, so at best it runs 10-11 s."""
    from anygate.sim._spec import Outage

    bound = _bound(
        _fleet(agents=1, calls_per_agent=2), slots=4, outages=(Outage(start_s=0.5, end_s=10),)
    )
    assert bound.chain_s == pytest.approx(11.0)
    assert (bound.binding, bound.seconds) == ("chain", pytest.approx(11.0))
