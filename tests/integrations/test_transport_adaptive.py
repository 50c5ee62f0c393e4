"""GatedTransport with a Policy under adaptive concurrency: the pause, the cut, the recovery.

After a ``limit_burst_rate`` 429 the policy's gate is cut and attempts admitted afterwards
sit out a pause holding their slot, exactly as with ``policy.call``. The transport must do
the same, and record each attempt's admission generation so that 429s from attempts sent
before the cut count once.

Timing tests run on trio's MockClock with the fake provider served in-process through the
library's ``ASGITransport`` (no sockets, so virtual time cannot race a real server's
timers); the rest run on every backend against the fake provider on hypercorn.
"""

from __future__ import annotations

import time
import types
from typing import TYPE_CHECKING, Any

import anyio
import pytest

import anygate
from tests.conftest import mock_clock
from tests.integrations.fakeprovider import FakeProvider, serve
from tests.policy_helpers import FakeClock

if TYPE_CHECKING:
    from tests.integrations.conftest import Flavour

pytestmark = pytest.mark.anyio
virtual_time = pytest.mark.parametrize("anyio_backend", [mock_clock()])

ONE_ATTEMPT = anygate.RetryConfig(max_attempts=1, throttle_attempts=1)
PATH = "/v1/chat/completions"


class Stamped:
    """An inner async transport that notes when each request reached the provider."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.sent: list[float] = []

    async def handle_async_request(self, request: Any) -> Any:
        self.sent.append(anyio.current_time())
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def _limits(events: list[Any]) -> list[tuple[float, float, str]]:
    return [(e.old, e.new, e.reason) for e in events if isinstance(e, anygate.LimitChanged)]


@virtual_time
async def test_after_a_burst_429_requests_wait_the_pause_then_go_at_the_lowered_limit(
    flavour: Flavour,
) -> None:
    """Cap 4: a burst 429 cuts the gate to 2 (factor 0.5) with a 5 s pause. Of four requests sent 1 s
    later, one (the probe) reaches the provider when the pause ends; the rest follow its
    success, two at a time."""
    provider = FakeProvider()
    events: list[Any] = []
    policy = anygate.Policy(
        name="llm",
        gate=anygate.Gate(4, name="llm"),
        retry=ONE_ATTEMPT,
        hooks=[events.append],
        clock=anyio.current_time,
        adaptive_concurrency=anygate.AdaptiveConfig(decrease_factor=0.5),
    )
    inner = Stamped(flavour.lib.ASGITransport(app=provider))
    transport = flavour.gated.GatedTransport(inner, policy=policy)
    statuses: list[int] = []

    async def post() -> None:
        statuses.append((await client.post(PATH, json={})).status_code)

    async with flavour.lib.AsyncClient(transport=transport, base_url="http://fake") as client:
        start = anyio.current_time()
        throttled = await client.post(PATH, json={}, headers={"x-fake": "burst"})
        assert (throttled.status_code, throttled.headers["x-should-retry"]) == (429, "false")
        assert _limits(events) == [(4, 2, "burst_rate")]
        assert policy.gate.capacity == 2
        await anyio.sleep(1)
        provider.hold()  # successful responses stop mid-body until unhang()
        async with anyio.create_task_group() as tg:
            for _ in range(4):
                tg.start_soon(post)
            await provider.wait_until(lambda p: p.active == 1)
            # Nothing during the pause; then one probe, and the others wait for its answer.
            assert [t - start for t in inner.sent] == [0, 5]
            assert (policy.gate.in_flight, policy.gate.waiting) == (2, 2)
            provider.unhang()
    assert statuses == [200] * 4
    assert len(inner.sent) == 5
    assert _limits(events)[0] == (4, 2, "burst_rate")
    assert policy.gate.capacity >= 2
    assert policy.gate.in_flight == 0


@virtual_time
async def test_a_pause_longer_than_the_slot_wait_is_busy_at_once(flavour: Flavour) -> None:
    """``timeout=1`` and a 5 s pause: the next request is refused with anygate.Busy without
    waiting, sends nothing, and gives its slot back."""
    provider = FakeProvider()
    policy = anygate.Policy(
        name="llm", gate=anygate.Gate(4, name="llm"), retry=ONE_ATTEMPT, clock=anyio.current_time
    )
    inner = Stamped(flavour.lib.ASGITransport(app=provider))
    transport = flavour.gated.GatedTransport(inner, policy=policy, timeout=1)
    async with flavour.lib.AsyncClient(transport=transport, base_url="http://fake") as client:
        await client.post(PATH, json={}, headers={"x-fake": "burst"})
        start = anyio.current_time()
        with pytest.raises(anygate.Busy, match="'llm' is busy"):
            await client.post(PATH, json={})
        assert anyio.current_time() == start
    assert provider.seen == ["burst"]
    assert policy.gate.in_flight == 0


async def test_throttles_from_attempts_sent_before_the_cut_count_once(flavour: Flavour) -> None:
    """Three requests in flight all get a burst 429: one cut (10 -> 8), two stale throttles.
    A request admitted after the cut and throttled too cuts again (8 -> 6). Without a pause
    (``pause_ms=0``) only the recorded admission generation tells the two apart."""
    provider = FakeProvider()
    events: list[Any] = []
    policy = anygate.Policy(
        name="llm",
        gate=anygate.Gate(10, name="llm"),
        retry=ONE_ATTEMPT,
        hooks=[events.append],
        adaptive_concurrency=anygate.AdaptiveConfig(pause_ms=0, pace_burst_rate=False),
    )
    async with serve(provider) as url:
        transport = flavour.gated.GatedTransport(policy=policy)
        async with flavour.lib.AsyncClient(transport=transport, base_url=url) as client:

            async def post() -> None:
                headers = {"x-fake": "burst", "x-fake-wait": "go"}
                assert (await client.post(PATH, json={}, headers=headers)).status_code == 429

            async with anyio.create_task_group() as tg:
                for _ in range(3):
                    tg.start_soon(post)
                await provider.wait_until(lambda p: p.requests == 3)
                provider.release("go")
            assert _limits(events) == [(10, 8, "burst_rate")]
            assert policy.adaptive_limit.statistics().stale_throttles == 2
            await post()
    assert _limits(events) == [(10, 8, "burst_rate"), (8, 6, "burst_rate")]
    assert policy.gate.in_flight == 0


async def test_sync_transport_sits_out_the_pause_holding_its_slot(
    flavour: Flavour, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SyncGatedTransport: after a burst 429 cuts the gate 2 -> 1, the next request sleeps
    the pause left on the policy's clock with its slot held, then succeeds, and the success
    restores the limit to 2."""
    provider = FakeProvider()
    clock = FakeClock()
    slept: list[tuple[float, int]] = []
    policy = anygate.Policy(
        name="llm", gate=anygate.Gate(2, name="llm"), retry=ONE_ATTEMPT, clock=clock
    )

    def sleep(seconds: float) -> None:
        slept.append((seconds, policy.gate.in_flight))
        clock.now += seconds

    # Only the attempt loop's sleeps (the pause) are recorded; the real time module is left
    # alone for the server and the client.
    fake_time = types.SimpleNamespace(monotonic=time.monotonic, sleep=sleep)
    monkeypatch.setattr("anygate._policy.admission.time", fake_time)

    def work(url: str) -> list[float]:
        transport = flavour.gated.SyncGatedTransport(policy=policy)
        with flavour.lib.Client(transport=transport, base_url=url) as client:
            first = client.post(PATH, json={}, headers={"x-fake": "burst"}).status_code
            capacity = policy.gate.capacity
            clock.now = 1.0
            second = client.post(PATH, json={}).status_code
        return [first, capacity, second]

    async with serve(provider) as url:
        result = await anyio.to_thread.run_sync(work, url)
    assert result == [429, 1, 200]
    assert slept == [(4.0, 1)]
    assert provider.seen == ["burst", "ok"]
    assert policy.gate.capacity == 2
    assert policy.gate.in_flight == 0
