"""The token-per-minute estimate from counts at rejection (issue 30 item 1): pure
arithmetic, then on an adaptive limit on a manual clock, then through real calls on trio's
MockClock against a provider with a sliding 60 s token window."""

from __future__ import annotations

import anyio
import pytest

from anygate import AdaptiveLimit, Attempt, Gate, Policy, Rate, ResponseError, RetryConfig
from anygate._limits.tokens import TokenLimit, TokenLog
from tests.conftest import mock_clock
from tests.policy_helpers import FakeClock

# --------------------------------------------------------------------------- the log


def test_held_is_the_tokens_sent_in_the_trailing_minute_less_the_turned_away() -> None:
    """Tokens in ``(at - 60, at]``, by send time, less those turned away."""
    log = TokenLog(60.0)
    for at, cost in [(1.0, 100), (2.0, 200), (2.0, 300), (61.5, 50)]:
        log.sent(at, cost)
    log.rejected(2.0, 300)
    assert log.held(61.0) == 200  # 1.0 has left the window; 2.0's 300 was turned away
    assert log.held(61.5) == 250  # 2.0's 200 and 61.5's 50
    assert log.held(62.0) == 50
    assert log.held(200.0) == 0


def test_free_at_is_when_enough_tokens_have_left_the_window_for_the_send() -> None:
    """With 1,000 a window and sends of 400 at 0, 10 and 20 s, a send of 100 must wait
    until 300 tokens have left: the first send's expiry at 60 s; one of 700 until the
    third's, at 80 s; one of 100 fits at once in a window holding less; one larger than
    the limit waits for the window to empty of ours."""
    log = TokenLog(60.0)
    for at in (0.0, 10.0, 20.0):
        log.sent(at, 400)
    assert log.free_at(30.0, 1000, 100) == pytest.approx(60.0)
    assert log.free_at(30.0, 1000, 700) == pytest.approx(80.0)  # 900 must leave
    assert log.free_at(30.0, 1000, 0) == pytest.approx(60.0)  # 1,200 > 1,000 already
    log2 = TokenLog(60.0)
    log2.sent(0.0, 100)
    assert log2.free_at(30.0, 1000, 100) is None
    assert log2.free_at(30.0, 1000, 5000) == pytest.approx(60.0)
    assert log2.free_at(61.0, 1000, 5000) is None


def test_a_turned_away_send_frees_its_tokens_at_once() -> None:
    """A send the provider did not count holds no room in the window."""
    log = TokenLog(60.0)
    log.sent(0.0, 600)
    log.sent(1.0, 600)
    assert log.free_at(2.0, 1000, 300) == pytest.approx(60.0)
    log.rejected(1.0, 600)
    assert log.free_at(2.0, 1000, 300) is None


# --------------------------------------------------------------------------- the limit


def test_a_rejection_sets_the_estimate_to_the_tokens_the_minute_held() -> None:
    """10 sends of 1,000 tokens a second apart, the 11th turned away: the estimate is
    10,000 tentatively (the rejected call's retry goes past the hold), a second rejection
    within a minute confirms it, and from a minute later it grows by one request's tokens
    a minute."""
    limit = TokenLimit()
    for i in range(10):
        assert limit.wait(float(i), 1000) == 0.0
        limit.sent(float(i), 1000)
    caller = object()
    limit.sent(10.0, 1000, caller)
    assert limit.rejected(10.0, 1000, 10.1, caller)
    assert limit.estimate(10.1) == pytest.approx(10_000, abs=5)
    assert limit.wait(10.2, 1000) == pytest.approx(60.0 - 10.2, abs=1e-3)  # others wait
    assert limit.wait(10.2, 1000, caller) == 0.0  # the check goes
    limit.sent(10.2, 1000, caller)
    assert limit.rejected(10.2, 1000, 10.3, caller)  # confirmed
    assert limit.limit is not None
    assert limit.limit.confirmed
    assert limit.estimate(70.3) == pytest.approx(10_000, abs=5)
    assert limit.estimate(130.3) == pytest.approx(11_000, abs=5)


def test_a_first_rejection_disproved_by_its_retry_passing_is_forgotten() -> None:
    """One 429 (a shared pool's noise): the rejected call's retry passes with the window
    as full, so the estimate goes back to none."""
    limit = TokenLimit()
    for i in range(10):
        limit.sent(float(i), 1000)
    caller = object()
    limit.sent(10.0, 1000, caller)
    limit.rejected(10.0, 1000, 10.1, caller)
    assert limit.wait(10.2, 1000, caller) == 0.0
    limit.sent(10.2, 1000, caller)
    limit.passed(10.2, 1000)
    assert limit.estimate(10.3) is None
    assert limit.wait(10.3, 1000) == 0.0


# --------------------------------------------------------------------------- on a gate


def test_an_adaptive_limit_holds_sends_to_the_token_estimate() -> None:
    """On an adaptive limit: a worded TPM 429 (``unit="tokens"``) neither pauses nor
    paces the request rate; sends are held until the trailing minute's tokens plus their
    own fit under the estimate, and the statistics show it."""
    clock = FakeClock()
    gate = Gate(32, name="tpm", rate=Rate(tokens_per_minute=1_000_000), clock=clock)
    limit = AdaptiveLimit(gate, clock=clock, pace_burst_rate=True)
    for i in range(20):
        clock.now = float(i)
        assert limit.reserve_send(clock.now, None, 500) == 0.0
    clock.now = 20.0
    caller = object()
    assert limit.reserve_send(20.0, caller, 500) == 0.0
    clock.now = 20.2
    limit.on_rate("tokens", 20.0, caller=caller, tokens=500)
    stats = limit.statistics()
    assert stats.tokens_per_minute_estimate == pytest.approx(10_000, abs=1)
    assert stats.requests_per_minute_estimate is None
    assert limit.pause_left() == 0.0
    # 10,000 in the window: a send of 500 waits until the first send (at 0) has left.
    assert limit.reserve_send(20.3, object(), 500) == pytest.approx(60.0 - 20.3, abs=1e-3)
    assert limit.reserve_send(20.3, caller, 500) == 0.0  # the rejected call's check
    # At 61.5 the sends at 0 and 1 have left: 9,500 + 500 fit under 10,000 and growth.
    assert limit.reserve_send(61.5, object(), 500) == 0.0


def _refund_after_a_tpm_429(paced: float) -> float:
    """Tokens the budget holds after a settle refund of 400, once a TPM 429 came for the
    21st send of 500 tokens (20 sent a second apart, 10,000 in the minute) on a gate
    paced at ``paced`` tokens a minute."""
    clock = FakeClock()
    gate = Gate(32, name="keep", rate=Rate(tokens_per_minute=paced, burst_s=60), clock=clock)
    limit = AdaptiveLimit(gate, clock=clock, pace_burst_rate=True)
    for i in range(20):
        clock.now = float(i)
        limit.reserve_send(clock.now, None, 500)
    clock.now = 20.0
    caller = object()
    limit.reserve_send(20.0, caller, 500)
    token = gate.acquire_nowait(tokens=500)
    clock.now = 20.2
    limit.on_rate("tokens", 20.0, caller=caller, tokens=500)
    before = gate.statistics().rate
    token.settle(tokens=100)
    token.release()
    after = gate.statistics().rate
    assert before is not None
    assert after is not None
    assert before.tokens_available is not None
    assert after.tokens_available is not None
    return after.tokens_available - before.tokens_available


def test_a_tpm_429_only_the_admission_estimates_explain_keeps_refunds() -> None:
    """The minute held 10,000 tokens by the estimates charged at admission when the 429
    came: on a gate paced at 6,000 a minute only settle refunds could have let that
    through, so the provider counts the estimates (OpenAI reserves ``max_tokens``) and a
    refund gives nothing back from then on (no headers, seeds 1-5: 2.33 % -> 0.33 % of
    calls with a 429). Paced at 60,000, the 429 says the limit is lower than the pace
    (the estimate's business): refunds are given back as before."""
    assert _refund_after_a_tpm_429(6_000) == pytest.approx(0)
    assert _refund_after_a_tpm_429(60_000) == pytest.approx(400)


# --------------------------------------------------------------------------- a policy


def _tpm() -> ResponseError:
    return ResponseError(
        429,
        body={
            "error": {
                "code": "rate_limit_exceeded",
                "message": "Rate limit reached for gpt-4o in organization org-x on tokens "
                "per min (TPM): Limit 20000, Used 19500, Requested 1000.",
            }
        },
    )


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", [mock_clock()])
async def test_a_policy_holds_sends_to_the_tokens_per_minute_it_counted() -> None:
    """The provider accepts 20,000 tokens in any sliding 60 s (Azure's way) although the
    gate's budget is 120,000 a minute; each call states 1,000 tokens. The 429s say
    "tokens per min (TPM)"; after the first, sends are held to what the window held, so
    few more are rejected, and no call is lost."""
    gate = Gate(
        8, name="tpm-estimate", rate=Rate(tokens_per_minute=120_000), clock=anyio.current_time
    )
    policy = Policy(gate=gate, retry=RetryConfig(throttle_attempts=10), clock=anyio.current_time)
    window: list[tuple[float, int]] = []
    rejected = 0
    done = 0

    async def step(attempt: Attempt) -> str:
        nonlocal rejected
        token = await attempt.acquire(tokens=1000)
        try:
            now = anyio.current_time()
            if sum(c for t, c in window if t > now - 60.0) + 1000 > 20_000:
                rejected += 1
                raise _tpm()
            window.append((now, 1000))
            await anyio.sleep(0.5)
            return "ok"
        finally:
            token.release()

    async def one() -> None:
        nonlocal done
        await policy.run(step)
        done += 1

    async with anyio.create_task_group() as tg:
        for _ in range(120):
            tg.start_soon(one)
            await anyio.sleep(0.5)  # 120 calls a minute: six times the hidden limit
    assert done == 120
    assert len(window) == 120
    assert rejected <= 4  # the first word, its confirmation, and at most a couple more
    estimate = policy.adaptive_limit.statistics().tokens_per_minute_estimate
    assert estimate is not None
    assert 19_000 <= estimate < 22_000
