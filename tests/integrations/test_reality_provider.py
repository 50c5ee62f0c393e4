"""The reality check's fake provider answers the real openai SDK as the simulator answers.

``benchmarks/reality_provider.py`` serves the simulator's provider model over HTTP for
``benchmarks/reality_check.py`` (a wall-clock benchmark, not run here). This checks only
what that benchmark relies on and no timing: the real SDK parses its answers, every answer
carries OpenAI's rate-limit headers, a token-bucket 429 has the simulator's wording and
Retry-After, and the headers and wording are exactly what the simulator's own provider sends
for the same requests.
"""

from __future__ import annotations

import importlib.util
import random
import re
import sys
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest

from anygate import parse_limit_headers
from anygate.sim import load_scenario
from anygate.sim._provider import ProviderError, ProviderModel
from tests.integrations.fakeprovider import serve

pytestmark = pytest.mark.anyio

_PATH = Path(__file__).parents[2] / "benchmarks" / "reality_provider.py"

# One agent, two calls of 1,000 prompt tokens and max_tokens 1,000 against a 3,000 TPM
# bucket (full at the start): the first is admitted, the second is turned away on tokens.
SCENARIO: dict[str, Any] = {
    "name": "reality provider test",
    "provider": {
        "slots": 4,
        "tokens": {"rpm": 500, "tpm": 3000, "charge_rejected": True},
        "headers": "openai",
        "retry_after_s": "auto",
        "latency": 0.001,
        "reject_latency": {"median_s": 0.001, "sigma": 0},
    },
    "fleet": {
        "agents": 1,
        "calls_per_agent": 2,
        "tokens": {
            "prompt": {"median": 1000, "sigma": 0},
            "completion": {"median": 10, "sigma": 0},
            "max_tokens": 1000,
        },
    },
}


def _module() -> Any:
    spec = importlib.util.spec_from_file_location("reality_provider", _PATH)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("reality_provider", module)
    spec.loader.exec_module(module)
    return module


def _numbers_out(message: str) -> str:
    return re.sub(r"\d+(\.\d+)?", "N", message)


def _rate_headers(headers: Any) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.startswith(("x-ratelimit-", "retry-after"))}


async def test_real_sdk_gets_the_simulators_answers() -> None:
    """A 200 with usage and x-ratelimit-* headers, then a TPM 429 worded and timed as the
    simulator's provider words and times it, read by the real SDK (no retries)."""
    reality = _module()
    scenario = load_scenario(SCENARIO)
    app = reality.SimulatedOpenAI(scenario, 1)
    async with serve(app) as url, httpx2.AsyncClient() as http:
        sdk = openai.AsyncOpenAI(
            base_url=f"{url}/v1", api_key="sk-test", max_retries=0, http_client=http
        )
        (await http.post(f"{url}/sim/reset")).raise_for_status()
        body = {
            "model": "gpt-4o-mini",
            "messages": [{"role": "user", "content": reality.prompt_text(1000)}],
            "max_tokens": 1000,
        }
        raw = await sdk.chat.completions.with_raw_response.create(
            **body, extra_headers={"x-sim-call": "0"}
        )
        completion = raw.parse()
        with pytest.raises(openai.RateLimitError) as caught:
            await sdk.chat.completions.create(**body, extra_headers={"x-sim-call": "1"})
        trace = (await http.get(f"{url}/sim/trace")).json()

    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (1000, 10)
    ok_headers = _rate_headers(raw.headers)
    assert ok_headers["x-ratelimit-limit-tokens"] == "3000"
    assert ok_headers["x-ratelimit-remaining-tokens"] == "1000"  # after its own charge
    assert parse_limit_headers(raw.headers) is not None

    error = caught.value
    assert error.status_code == 429
    # Used: 2,000 less the refill (50 tokens/s) between the two requests.
    assert re.search(
        r"on tokens per min \(TPM\): Limit 3000, Used \d+, Requested 2000", error.message
    )
    got = _rate_headers(error.response.headers)
    assert int(got["retry-after"]) >= 1
    assert float(got["retry-after-ms"]) > 0
    assert trace["counts"]["ok"] == 1
    assert trace["counts"]["tpm"] == 1

    # The simulator's own provider, sent the same two requests, answers with the same
    # headers and the same wording (the numbers differ by the refill between requests).
    model = ProviderModel(scenario.provider, random.Random(0))
    first = await model.serve(0.0, 1000, 1000, 10)
    with pytest.raises(ProviderError) as simulated:
        await model.serve(0.0, 1000, 1000, 10)
    assert _rate_headers(first.headers).keys() == ok_headers.keys()
    assert first.headers["x-ratelimit-limit-tokens"] == ok_headers["x-ratelimit-limit-tokens"]
    assert _rate_headers(simulated.value.headers).keys() == got.keys()
    assert simulated.value.body["error"]["code"] == error.code  # type: ignore[index]
    assert _numbers_out(error.message).endswith(_numbers_out(simulated.value.message))
