"""Gated transports: a hook raising a BaseException strands neither probe nor slot.

Issue 9, faults 2 and 3, through ``GatedTransport`` / ``SyncGatedTransport`` with a policy
(see ``tests/test_policy_faults.py`` for the policy itself). Real HTTP on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import anyio
import anyio.to_thread
import pytest

import anygate
from anygate import BreakerConfig, BreakerStateChanged, Policy, RetryConfig, SlotAdmitted
from tests.integrations.fakeprovider import FakeProvider, serve
from tests.policy_helpers import FakeClock
from tests.test_policy_faults import RaiseOn

if TYPE_CHECKING:
    from tests.integrations.conftest import Flavour

pytestmark = pytest.mark.anyio


async def test_transport_hooks_raising_strand_neither_probe_nor_slot(flavour: Flavour) -> None:
    """KeyboardInterrupt from the half-open event, then from SlotAdmitted; each time the
    next request still goes through, and the gate ends empty."""
    clock = FakeClock()
    hooks = [
        RaiseOn(BreakerStateChanged, KeyboardInterrupt, new="half_open"),
        RaiseOn(SlotAdmitted, KeyboardInterrupt),
    ]
    policy = Policy(
        gate=anygate.Gate(1, name="t"),
        circuit_breaker=BreakerConfig(when_open="fail", failure_threshold=1, recovery_timeout_sec=60),
        retry=RetryConfig(max_attempts=1),
        clock=clock,
        hooks=hooks,
    )
    breaker = policy.breaker
    assert breaker is not None
    breaker.acquire().failure()
    clock.now += 60
    async with serve(FakeProvider()) as url:
        transport = flavour.gated.GatedTransport(policy=policy)
        async with flavour.lib.AsyncClient(transport=transport) as client:
            for _ in range(2):
                with pytest.raises(KeyboardInterrupt):
                    await client.post(f"{url}/v1/chat/completions", json={})
                assert policy.gate.in_flight == 0
            response = await client.post(f"{url}/v1/chat/completions", json={})
            assert response.status_code == 200
    assert breaker.state == "closed"
    assert policy.gate.in_flight == 0


async def test_sync_transport_hook_raising_on_slot_admitted_gives_the_slot_back(
    flavour: Flavour,
) -> None:
    """SyncGatedTransport on a worker thread: the same for SlotAdmitted."""
    policy = Policy(
        gate=anygate.Gate(1, name="t"),
        busy_wait_s=0,
        hooks=[RaiseOn(SlotAdmitted, KeyboardInterrupt)],
    )
    async with serve(FakeProvider()) as url:

        def send() -> tuple[int, int]:
            transport = flavour.gated.SyncGatedTransport(policy=policy)
            with flavour.lib.Client(transport=transport) as client:
                with contextlib.suppress(KeyboardInterrupt):
                    client.post(f"{url}/v1/chat/completions", json={})
                held = policy.gate.in_flight
                status: int = client.post(f"{url}/v1/chat/completions", json={}).status_code
                return held, status

        assert await anyio.to_thread.run_sync(send) == (0, 200)
    assert policy.gate.in_flight == 0
