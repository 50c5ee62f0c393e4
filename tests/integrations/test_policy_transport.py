"""GatedTransport with an anygate Policy: anygate classifies and retries, the SDK does not.

The documented combination: give the transport a policy and the SDK client
``max_retries=0``. anygate then retries failed responses (408/409/425/429/5xx) and
connection errors with the policy's budgets, backoff and breaker; when it gives up, the SDK
sees the last response marked ``x-should-retry: false`` and raises its usual error without
retrying it again, even with its default ``max_retries=2``. Real SDKs, real HTTP, tiny
backoff settings (a few milliseconds) so the retries run for real.
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING, Any

import anyio
import pytest

import anygate
from tests.integrations.conftest import Arrivals
from tests.integrations.fakeprovider import FakeProvider, serve
from tests.integrations.sdks import SDKS, Sdk
from tests.policy_helpers import FakeClock

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

pytestmark = pytest.mark.anyio

FAST = anygate.RetryConfig(
    base_delay_ms=1, burst_base_delay_ms=2, cap_delay_ms=4, reason_budgets={"burst_rate": 2}
)


@pytest.fixture(params=SDKS)
def sdk(request: pytest.FixtureRequest) -> Sdk:
    """Run the requesting test with each SDK / HTTP library pair."""
    value: Sdk = request.param
    return value


# The adaptive pause after a burst-rate 429 defaults to 5 s of real time; these tests are
# about retries, so keep the mechanism on but its pause short (it has its own tests).
QUICK_PAUSE = anygate.AdaptiveConfig(pause_ms=10)


def _policy(events: list[Any], *, capacity: int = 2, **kwargs: Any) -> anygate.Policy:
    kwargs.setdefault("retry", FAST)
    kwargs.setdefault("adaptive_concurrency", QUICK_PAUSE)
    return anygate.Policy(
        name="llm", gate=anygate.Gate(capacity, name="llm"), hooks=[events.append], **kwargs
    )


def _of(events: list[Any], kind: type) -> list[Any]:
    return [e for e in events if isinstance(e, kind)]


async def test_burst_rate_is_retried_by_anygate(sdk: Sdk) -> None:
    """A ``limit_burst_rate`` 429 is recognised from the JSON body and retried at once as
    the gate's check of it (a burst-rate budget of 2 shows in the event)."""
    provider = FakeProvider()
    provider.script("burst")
    events: list[Any] = []
    policy = _policy(events)
    async with serve(provider) as url:
        client = sdk.client(url, sdk.gated(policy=policy), max_retries=0)
        assert await sdk.complete(client) == "Hello world"
        await client.close()
    assert provider.seen == ["burst", "ok"]
    assert provider.retry_counts == ["0", "0"]  # anygate re-sent it; the SDK never retried
    (retry,) = _of(events, anygate.RetryScheduled)
    assert (retry.reason, retry.attempt, retry.max_attempts) == ("burst_rate", 1, 2)
    # No backoff of its own, and no pause: a first burst throttle is only checked, its
    # retry going at once as the check's probe (its success ends the check).
    assert retry.wait_ms == 0
    assert not retry.from_retry_after
    assert "burst rate" in retry.message
    assert policy.gate.in_flight == 0


async def test_giving_up_hands_the_sdk_its_own_error_and_stops_its_retries(sdk: Sdk) -> None:
    """Burst budget spent: the SDK raises RateLimitError and, despite max_retries=2, sends
    nothing more (the final response says ``x-should-retry: false``); the breaker stays shut."""
    provider = FakeProvider()
    provider.script("burst", "burst", "burst")
    events: list[Any] = []
    policy = _policy(
        events, circuit_breaker=anygate.BreakerConfig(when_open="fail", failure_threshold=1)
    )
    async with serve(provider) as url:
        client = sdk.client(url, sdk.gated(policy=policy), max_retries=2)
        with pytest.raises(sdk.errors.RateLimitError) as info:
            await sdk.complete(client)
        await client.close()
    assert info.value.response.headers["x-should-retry"] == "false"
    assert provider.seen == ["burst", "burst"]
    (gave_up,) = _of(events, anygate.GaveUp)
    assert (gave_up.why, gave_up.attempts, gave_up.reason) == ("budget", 2, "burst_rate")
    assert policy.breaker is not None
    assert policy.breaker.state == "closed"  # burst-rate exhaustion is not "provider down"
    assert policy.gate.in_flight == 0


async def test_quota_is_never_retried_even_by_the_sdk(sdk: Sdk) -> None:
    """``insufficient_quota`` is billing: one request, no retry by anygate or the SDK."""
    provider = FakeProvider()
    events: list[Any] = []
    policy = _policy(events)
    async with serve(provider) as url:
        client = sdk.client(url, sdk.gated(policy=policy), max_retries=2)
        with pytest.raises(sdk.errors.RateLimitError):
            await sdk.complete(client, extra_headers={"x-fake": "quota"})
        await client.close()
    assert provider.requests == 1
    (gave_up,) = _of(events, anygate.GaveUp)
    assert (gave_up.why, gave_up.reason) == ("not_retriable", "quota")


async def test_retry_after_is_honoured_without_jitter(sdk: Sdk) -> None:
    """``retry-after-ms`` sets the wait exactly; the slot is free meanwhile."""
    provider = FakeProvider()
    provider.script("retry_after_ms")
    events: list[Any] = []
    policy = _policy(events)
    async with serve(provider) as url:
        client = sdk.client(url, sdk.gated(policy=policy), max_retries=0)
        assert await sdk.stream(client) == "Hello world"
        await client.close()
    (retry,) = _of(events, anygate.RetryScheduled)
    assert (retry.wait_ms, retry.from_retry_after, retry.verdict.status) == (1, True, 429)
    assert provider.seen == ["retry_after_ms", "ok"]


async def test_breaker_opens_and_fails_fast_through_the_sdk(sdk: Sdk) -> None:
    """Two failed attempts (503s) exhaust the budget and open the breaker, which counts
    attempts; the next call is refused
    before anything is sent, as the SDK's APIConnectionError caused by anygate.CircuitOpen."""
    provider = FakeProvider()
    provider.script("overloaded", "overloaded")
    events: list[Any] = []
    policy = _policy(
        events,
        retry=anygate.RetryConfig(max_attempts=2, base_delay_ms=1, cap_delay_ms=2),
        circuit_breaker=anygate.BreakerConfig(
            when_open="fail", failure_threshold=2, recovery_timeout_sec=3600
        ),
    )
    async with serve(provider) as url:
        client = sdk.client(url, sdk.gated(policy=policy), max_retries=0)
        with pytest.raises(sdk.errors.InternalServerError):
            await sdk.complete(client)
        with pytest.raises(sdk.errors.APIConnectionError) as info:
            await sdk.complete(client)
        await client.close()
    # The transport raises CircuitOpen as its library's TransportError, which both SDKs
    # wrap in APIConnectionError (see test_sdk_errors.py).
    assert isinstance(info.value.__cause__, anygate.CircuitOpen), info.value
    assert provider.seen == ["overloaded", "overloaded"]
    assert [e.new for e in _of(events, anygate.BreakerStateChanged)] == ["open"]
    (gave_up,) = _of(events, anygate.GaveUp)
    assert (gave_up.why, gave_up.reason) == ("budget", "busy")
    assert policy.gate.in_flight == 0


class _Recorder:
    """A policy hook that keeps the events and lets a test wait for one."""

    def __init__(self) -> None:
        self.events: list[Any] = []
        self._changed = anyio.Event()

    def __call__(self, event: Any) -> None:
        self.events.append(event)
        self._changed.set()
        self._changed = anyio.Event()

    async def wait_for(self, predicate: Any) -> Any:
        while True:
            for event in self.events:
                if predicate(event):
                    return event
            await self._changed.wait()


async def test_backoff_holds_no_slot() -> None:
    """Capacity 1: while call A backs off after a 503, queued call B gets the slot, and
    A's retry queues behind B."""
    sdk = Sdk("openai", "httpx2")
    provider = FakeProvider()
    provider.script("overloaded")
    recorder = _Recorder()
    policy = anygate.Policy(
        name="llm", gate=anygate.Gate(1, name="llm"), hooks=[recorder], retry=FAST
    )
    arrivals = Arrivals(sdk.gated(policy=policy))
    results: dict[str, str] = {}

    async def run(key: str, headers: dict[str, str]) -> None:
        results[key] = await sdk.complete(client, extra_headers=headers)

    async with serve(provider) as url:
        client = sdk.client(url, arrivals)
        async with anyio.create_task_group() as tg:
            tg.start_soon(run, "a", {"x-fake-wait": "a"})
            await provider.wait_until(lambda p: p.requests == 1)
            tg.start_soon(run, "b", {"x-fake": "hang_headers"})
            await arrivals.wait_entered(2)
            provider.release("a")  # A's first attempt: 503
            await provider.wait_until(lambda p: p.requests == 2)  # B got the slot...
            await recorder.wait_for(  # ...and A's second attempt found the gate full
                lambda e: isinstance(e, anygate.SlotWaiting) and e.attempt == 2
            )
            assert (policy.gate.in_flight, policy.gate.waiting) == (1, 1)
            provider.unhang()
        await client.close()
    assert results == {"a": "Hello world", "b": "Hello world"}
    assert provider.seen == ["overloaded", "hang_headers", "ok"]


async def test_streamed_success_keeps_its_slot_until_closed() -> None:
    """On the policy path too, a successful stream holds its slot until it is closed."""
    sdk = Sdk("anthropic", "httpx2")
    provider = FakeProvider()
    policy = _policy([], capacity=1)
    async with serve(provider) as url:
        client = sdk.client(url, sdk.gated(policy=policy))
        stream = await sdk.create(client, stream=True, extra_headers={"x-fake": "hang_stream"})
        async for _ in stream:
            break
        assert policy.gate.in_flight == 1
        await stream.close()
        assert policy.gate.in_flight == 0
        await client.close()


async def test_connection_errors_are_retried_then_raised_as_is() -> None:
    """A refused connection is retried per the policy, then surfaces as the SDK's
    APIConnectionError (the transport re-raises the library's own ConnectError)."""
    sdk = Sdk("openai", "httpx2")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    events: list[Any] = []
    policy = _policy(events)
    client = sdk.client(f"http://127.0.0.1:{port}", sdk.gated(policy=policy))
    with pytest.raises(sdk.errors.APIConnectionError):
        await sdk.complete(client)
    await client.close()
    assert len(_of(events, anygate.RetryScheduled)) == 2
    (gave_up,) = _of(events, anygate.GaveUp)
    assert (gave_up.attempts, gave_up.reason) == (3, "transient")
    assert policy.gate.in_flight == 0


async def test_hung_attempt_times_out_and_is_retried() -> None:
    """``attempt_timeout_s`` turns a provider that never answers into a retried failure.

    The timeout is long enough for the answered retry on a loaded machine: at 0.05 s the
    retry itself timed out once under a CI run beside a benchmark (two retries)."""
    sdk = Sdk("openai", "httpx2")
    provider = FakeProvider()
    provider.script("hang_headers")
    events: list[Any] = []
    policy = _policy(events, attempt_timeout_s=0.5)
    async with serve(provider) as url:
        client = sdk.client(url, sdk.gated(policy=policy))
        assert await sdk.complete(client) == "Hello world"
        await client.close()
    (retry,) = _of(events, anygate.RetryScheduled)
    assert retry.reason == "transient"
    assert "timed out" in retry.verdict.detail
    assert provider.seen == ["hang_headers", "ok"]


async def test_streamed_request_body_is_sent_once(flavour: Any) -> None:
    """A body that is a stream cannot be replayed: the 503 comes back, unretried."""
    provider = FakeProvider()
    events: list[Any] = []
    policy = _policy(events)

    async def body() -> AsyncIterator[bytes]:
        yield b"{}"

    async with serve(provider) as url:
        transport = flavour.gated.GatedTransport(policy=policy)
        async with flavour.lib.AsyncClient(transport=transport) as client:
            reply = await client.post(
                url + "/v1/x", content=body(), headers={"x-fake": "overloaded"}
            )
    assert reply.status_code == 503
    assert "x-should-retry" not in reply.headers
    assert provider.requests == 1
    assert [type(e) for e in events] == [anygate.SlotAdmitted]  # no retry, no give-up


async def test_sync_twin_retries_under_the_policy() -> None:
    """SyncGatedTransport in a worker thread: the same classification, retries and events."""
    sdk = Sdk("openai", "httpx2")
    provider = FakeProvider()
    provider.script("burst")
    events: list[Any] = []
    policy = _policy(events)
    async with serve(provider) as url:
        client = sdk.client(url, sdk.gated(policy=policy, sync=True), sync=True)
        text = await anyio.to_thread.run_sync(lambda: sdk.text_of(sdk.create(client)))
        client.close()
    assert text == "Hello world"
    assert provider.seen == ["burst", "ok"]
    (retry,) = _of(events, anygate.RetryScheduled)
    assert retry.reason == "burst_rate"
    assert policy.gate.in_flight == 0


def test_policy_supplies_gate_and_wait(flavour: Any) -> None:
    """Without ``gate=`` the transport uses the policy's gate and ``busy_wait_s``."""
    policy = anygate.Policy(name="p", max_concurrent_calls=3, busy_wait_s=7)
    transport = flavour.gated.GatedTransport(policy=policy)
    assert transport.gate is policy.gate
    assert transport.policy is policy
    assert transport._core.timeout == 7
    with pytest.raises(TypeError, match=r"needs gate= .* or policy="):
        flavour.gated.GatedTransport()
    with pytest.raises(TypeError, match=r"policy must be an anygate\.Policy"):
        flavour.gated.GatedTransport(policy="llm")


async def test_breaker_waiters_go_when_the_probes_headers_arrive(flavour: Any) -> None:
    """After an outage, the breaker's probe is a streamed answer: a caller waiting for the
    breaker is served as soon as the probe's status and first bytes arrive, while the
    probe's body still streams (issue 30 item 4)."""
    provider = FakeProvider()
    provider.script("overloaded")
    clock = FakeClock()
    breaker = anygate.CircuitBreaker("probe", failure_threshold=1, recovery_timeout=60)
    breaker._clock = clock  # recovery on a manual clock; the waits below are real time
    policy = anygate.Policy(
        name="probe",
        gate=anygate.Gate(4, name="probe"),
        breaker=breaker,
        retry=anygate.RetryConfig(max_attempts=1),
        adaptive_concurrency=False,
    )
    path = "/v1/chat/completions"
    async with serve(provider) as url:
        transport = flavour.gated.GatedTransport(policy=policy)
        async with flavour.lib.AsyncClient(transport=transport) as client:
            assert (await client.post(url + path, json={})).status_code == 503
            assert breaker.state == "open"
            clock.now = 60.0  # the next caller is the probe
            opened: list[Any] = []
            served = anyio.Event()

            async def probe() -> None:
                request = client.build_request(
                    "POST",
                    url + path,
                    json={"stream": True},
                    headers={"x-fake": "hang_stream", "x-fake-wait": "probe"},
                )
                opened.append(await client.send(request, stream=True))

            async def waiter() -> None:
                # The probe is out: this waits for the breaker (up to 60 real seconds,
                # the recovery time) unless the probe's acceptance closes it.
                assert (await client.post(url + path, json={})).status_code == 200
                served.set()

            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(probe)
                    await provider.wait_until(lambda p: p.requests == 2)  # the probe is held
                    tg.start_soon(waiter)
                    # Until the waiter is parked on the breaker (not admitted). Polled, not
                    # wait_all_tasks_blocked(): under Python 3.10 anyio's asyncio backend
                    # fails on the server's tasks there ('WaitTaskRescheduled' has no
                    # 'done'); fail_after bounds it.
                    while breaker.statistics().rejected < 1:
                        await anyio.sleep(0.005)
                    assert breaker.statistics().rejected == 1  # parked, not admitted
                    provider.release("probe")  # headers and the first chunk, then it hangs
                    await served.wait()
                    assert breaker.state == "closed"
                    assert policy.gate.in_flight == 1  # the probe's body is still open
                    assert provider.active == 1
                    provider.unhang()
                (response,) = opened
                body = b"".join([chunk async for chunk in response.aiter_bytes()])
                assert b"[DONE]" in body
                await response.aclose()
    assert policy.gate.in_flight == 0
    assert provider.seen == ["overloaded", "hang_stream", "ok"]
