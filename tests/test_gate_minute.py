"""A published request minute goes at once (issue 30): the gate's request budget holds a
minute's refill, full if it admitted nothing yet, where the adaptive limit of a policy
with a published rate says so; on a manual clock, through the public ``acquire_nowait``."""

from __future__ import annotations

import pytest

from anygate import AdaptiveLimit, Busy, Gate, Policy, Rate, Token
from tests.policy_helpers import FakeClock


def _one(gate: Gate, cost: dict[str, int]) -> Token | None:
    try:
        return gate.acquire_nowait(**cost)
    except Busy:
        return None


def _take(gate: Gate, most: int, **cost: int) -> list[Token]:
    """Acquire without waiting until the gate refuses (at most ``most``)."""
    tokens: list[Token] = []
    while len(tokens) < most and (token := _one(gate, cost)) is not None:
        tokens.append(token)
    return tokens


def _released(tokens: list[Token]) -> int:
    for token in tokens:
        token.release()
    return len(tokens)


def test_a_minute_is_full_at_the_start_and_refills_at_the_rate() -> None:
    """120 a minute by the minute: all 120 at once at the start, the 121st refused; a
    second later two more (the refill), not a burst's worth again."""
    clock = FakeClock()
    gate = Gate(1000, name="minute", rate=Rate(requests_per_minute=120), clock=clock)
    gate._requests_by_minute()
    assert _released(_take(gate, 200)) == 120
    clock.now = 1.0
    assert _released(_take(gate, 200)) == 2


def test_a_second_is_all_a_rate_holds_without_it() -> None:
    """The default budget holds a second (``burst_s``) and starts empty: what the minute
    changes."""
    clock = FakeClock()
    gate = Gate(1000, name="second", rate=Rate(requests_per_minute=120), clock=clock)
    assert _released(_take(gate, 200)) <= 2
    clock.now = 30.0
    assert _released(_take(gate, 200)) == 2


def test_turned_on_after_the_start_it_keeps_the_level_and_off_caps_it() -> None:
    """Once the gate admitted, the minute does not refill it at once: the level it has
    stays and grows to a minute's worth; turned off, the level is capped to a second's."""
    clock = FakeClock()
    gate = Gate(1000, name="later", rate=Rate(requests_per_minute=120), clock=clock)
    clock.now = 5.0
    taken = _released(_take(gate, 200))
    assert 1 <= taken <= 2
    gate._requests_by_minute()
    assert _released(_take(gate, 200)) == 0
    clock.now = 35.0
    assert _released(_take(gate, 200)) == 60  # 30 s of refill, more than a second's
    clock.now = 65.0
    gate._requests_by_minute(on=False)
    assert _released(_take(gate, 200)) == 2


def test_a_rate_change_keeps_the_minute() -> None:
    """A live rate change (the published probe's step) keeps the budget by the minute,
    its level carried over in requests."""
    clock = FakeClock()
    gate = Gate(1000, name="step", rate=Rate(requests_per_minute=120), clock=clock)
    gate._requests_by_minute()
    assert _released(_take(gate, 100)) == 100
    gate.rate = Rate(requests_per_minute=240)
    clock.now = 30.0  # 20 left + 30 s at 240 a minute: 140, within a minute's 240
    assert _released(_take(gate, 500)) == 140


@pytest.mark.parametrize(
    ("rate", "at_once"),
    [
        (Rate(requests_per_minute=120), True),
        (Rate(requests_per_minute=120, tokens_per_minute=1_000_000), False),
        (Rate(requests_per_minute=120, output_tokens_per_minute=1_000_000), False),
    ],
    ids=["requests", "tokens", "output-tokens"],
)
def test_the_minute_goes_at_once_only_where_it_is_the_only_budget(
    rate: Rate, at_once: bool
) -> None:
    """A policy with a published rate spends the request minute at once where requests
    are its only per-minute budget. Where token budgets are stated they pace each second,
    and a request minute spent at once ran ahead of them (an Anthropic-like provider:
    12 sent against an output budget of 8 at the start, its bucket's reset waited out);
    there the request budget stays a second's, as with a rate that is a ceiling."""
    clock = FakeClock()
    policy = Policy(name=f"minute-{at_once}", rate=rate, rate_is_ceiling=False, clock=clock)
    gate = policy.gate
    limit = policy.adaptive_limit
    assert isinstance(limit, AdaptiveLimit)
    assert limit.probes_published_rate
    cost = {"tokens": 1} if rate.tokens_per_minute or rate.split else {}
    if rate.split:
        cost["output_tokens"] = 0
    taken = _released(_take(gate, 200, **cost))
    assert (taken == 120) is at_once
    assert taken <= (120 if at_once else 2)
    ceiling = Policy(name=f"ceiling-{at_once}", rate=rate, clock=clock)
    assert _released(_take(ceiling.gate, 200, **cost)) <= 2
