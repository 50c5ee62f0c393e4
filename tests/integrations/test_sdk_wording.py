"""A 429 that states its limit in words teaches the gate, with no rate-limit headers at all.

End to end: the real OpenAI and Anthropic SDKs over HTTP to the fake provider on
127.0.0.1, whose 429 answers carry no ``x-ratelimit-*`` headers, only the wording
(OpenAI's "on tokens per min (TPM): Limit 30000, Used 29937, Requested 385", Anthropic's
"of 30,000 input tokens per minute"), as behind a gateway that forwards errors but not their
headers. Three ways in: a gated transport under a policy (it reads the refused body and
syncs the budget to ``Limit - Used``), a policy around a plain SDK call, and a gated
transport without a policy (it never reads an error's body: nothing learned, the
documented limit). asyncio, asyncio+uvloop and trio.
"""

from __future__ import annotations

import pytest

import anygate
from tests.integrations.fakeprovider import FakeProvider, serve
from tests.integrations.sdks import SDKS, Sdk
from tests.policy_helpers import FakeClock

pytestmark = pytest.mark.anyio

FAST = anygate.RetryConfig(base_delay_ms=1, cap_delay_ms=4)
LIMIT = 30_000
LEFT = 30_000 - 29_937  # Limit - Used, as the words state it


@pytest.fixture(params=SDKS)
def sdk(request: pytest.FixtureRequest) -> Sdk:
    """Run the requesting test with each SDK / HTTP library pair."""
    value: Sdk = request.param
    return value


def _policy(gate: anygate.Gate) -> anygate.Policy:
    return anygate.Policy(name="llm", gate=gate, retry=FAST, adaptive_concurrency=False)


async def test_a_transport_under_a_policy_learns_and_syncs_the_stated_limit(sdk: Sdk) -> None:
    """One refusal in words: the limit is adopted at once, at the whole limit (the budget
    is synced to what the words say is left), and the retry goes through."""
    clock = FakeClock()  # held still: token levels are exact
    gate = anygate.Gate(
        8, name="llm", rate=anygate.Rate(tokens_per_minute=200_000, burst_s=60), clock=clock
    )
    clock.now += 60  # a full budget: 200,000 tokens
    provider = FakeProvider()
    provider.script("tpm_words")
    async with serve(provider) as url:
        client = sdk.client(url, sdk.gated(policy=_policy(gate)))
        assert await sdk.complete(client) == "Hello world"
        await client.close()
    assert provider.seen == ["tpm_words", "ok"]
    limits = anygate.RateLearner.of(gate).limits
    assert (limits.tokens_per_minute, limits.source) == (LIMIT, "openai")
    assert gate.rate == anygate.Rate(tokens_per_minute=LIMIT, burst_s=60)
    rate = gate.statistics().rate
    assert rate is not None
    assert rate.tokens_available is not None
    # Synced to the 63 tokens left, less the retry's estimate, plus what its usage gave
    # back: far under the 30,000 a rate change alone would leave.
    assert rate.tokens_available <= LEFT
    assert limits.syncs == 1


async def test_a_policy_around_a_plain_sdk_call_learns_the_stated_limit(sdk: Sdk) -> None:
    """No transport: the policy reads the SDK's error. Nothing to sync against (no mark of
    what was admitted), so paced with the learner's headroom, 90 %."""
    gate = anygate.Gate(8, name="llm")
    policy = _policy(gate)
    provider = FakeProvider()
    provider.script("tpm_words")
    async with serve(provider) as url:
        client = sdk.client(url, None)
        assert await policy.call(sdk.complete, client) == "Hello world"
        await client.close()
    assert provider.seen == ["tpm_words", "ok"]
    assert gate.rate == anygate.Rate(tokens_per_minute=0.9 * LIMIT)
    assert anygate.RateLearner.of(gate).limits.syncs == 0


async def test_anthropics_words_teach_a_gate_with_an_input_budget(sdk: Sdk) -> None:
    """ "of 30,000 input tokens per minute": the input budget becomes the stated limit; a
    gate without one is not made to pace input tokens."""
    gate = anygate.Gate(8, name="llm", rate=anygate.Rate(input_tokens_per_minute=50_000))
    bare = anygate.Gate(8, name="bare")
    provider = FakeProvider()
    provider.script("itpm_words", "itpm_words")
    async with serve(provider) as url:
        client = sdk.client(url, None)
        assert await _policy(gate).call(sdk.complete, client) == "Hello world"
        assert await _policy(bare).call(sdk.complete, client) == "Hello world"
        await client.close()
    assert gate.rate is not None
    assert gate.rate.input_tokens_per_minute == LIMIT
    assert anygate.RateLearner.of(gate).limits.input_tokens_per_minute == LIMIT
    assert bare.rate is None


async def test_a_transport_without_a_policy_reads_no_error_body(sdk: Sdk) -> None:
    """The SDK gets the 429 as it came, its body unread by the transport: nothing is
    learned (headers would be: see test_sdk_learning)."""
    gate = anygate.Gate(8, name="llm")
    provider = FakeProvider()
    provider.script("tpm_words")
    async with serve(provider) as url:
        client = sdk.client(url, sdk.gated(gate))
        with pytest.raises(sdk.errors.RateLimitError) as caught:
            await sdk.complete(client)
        await client.close()
    assert "Limit 30000" in str(caught.value)
    assert gate.rate is None
    assert gate.in_flight == 0
