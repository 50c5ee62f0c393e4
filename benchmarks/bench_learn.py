"""What reading rate-limit headers and usage costs per response, against baselines of the same run.

    python benchmarks/bench_learn.py

(a) ``parse_limit_headers`` on a typical OpenAI answer's ``httpx.Headers`` (15 headers, 6 of
    them rate limits) and an Anthropic one (13 rate-limit headers with RFC 3339 resets),
    each vs the same call on the same answer without rate-limit headers (the fast path every
    response of a provider that sends none pays). Reported as a ratio and in microseconds.
    Target: <= 25 us per response with headers (the transport's own per-request overhead is
    of that order).
(b) ``learn_from_headers`` (parse + observe, the learner adopting nothing new: the steady
    state) vs parse alone. Target: <= 1.5x.
(c) ``StreamUsage`` following a 200-chunk SSE stream vs a bare loop over the same chunks.
    Reported (no target): what token accounting adds to a streamed answer.
(d) one request through ``anygate.httpx.GatedTransport`` over ``httpx.MockTransport``
    (the cheapest exchange there is) answering with OpenAI's rate-limit headers and a JSON
    usage (limits far above the run's pace), the gate holding a token budget:
    ``learn_limits=True, tokens=True`` vs both off.
    Target: <= 1.5x (on a real provider the difference is noise against network time).

Timings are best-of-N wall clock on a shared machine: read ratios, not absolute numbers.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

import httpx

import anygate
from anygate._classify.usage import StreamUsage

if TYPE_CHECKING:
    from collections.abc import Callable

ROUNDS = 20_000

COMMON = {
    "date": "Thu, 03 Dec 2026 10:00:00 GMT",
    "content-type": "application/json",
    "transfer-encoding": "chunked",
    "connection": "keep-alive",
    "openai-organization": "org-x",
    "openai-processing-ms": "512",
    "openai-version": "2020-10-01",
    "strict-transport-security": "max-age=31536000",
    "x-request-id": "req_0123456789abcdef",
}
OPENAI = COMMON | {
    "x-ratelimit-limit-requests": "10000",
    "x-ratelimit-limit-tokens": "2000000",
    "x-ratelimit-remaining-requests": "9999",
    "x-ratelimit-remaining-tokens": "1999000",
    "x-ratelimit-reset-requests": "6ms",
    "x-ratelimit-reset-tokens": "1m2.5s",
}
ANTHROPIC = (
    COMMON
    | {
        f"anthropic-ratelimit-{kind}-{field}": value
        for kind in ("requests", "tokens", "input-tokens", "output-tokens")
        for field, value in (
            ("limit", "4000"),
            ("remaining", "3999"),
            ("reset", "2026-12-03T10:00:01Z"),
        )
    }
    | {"retry-after": "1"}
)


def report(name: str, value: float, target: float | None, unit: str = "x") -> None:
    if target is None:
        print(f"    {name}: {value:.2f}{unit}")
        return
    verdict = "ok" if value <= target else "MISSED"
    print(f"    {name}: {value:.2f}{unit} (target <= {target:g}{unit}) {verdict}")


def per_call(fn: Callable[[], object], rounds: int = ROUNDS, repeats: int = 5) -> float:
    """Best-of-``repeats`` seconds per call."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(rounds):
            fn()
        best = min(best, (time.perf_counter() - start) / rounds)
    return best


def bench_parse() -> None:
    print("(a) parse_limit_headers per response")
    baseline = httpx.Headers(COMMON)
    base = per_call(lambda: anygate.parse_limit_headers(baseline))
    print(f"    baseline, no rate-limit headers: {base * 1e6:.2f} us")
    for name, values in (("openai", OPENAI), ("anthropic", ANTHROPIC)):
        headers = httpx.Headers(values)
        assert anygate.parse_limit_headers(headers), name
        cost = per_call(lambda headers=headers: anygate.parse_limit_headers(headers))
        report(f"{name} vs baseline", cost / base, None)
        report(f"{name} per response", cost * 1e6, 25, " us")


def bench_learn() -> None:
    print("(b) learn_from_headers, steady state, vs parse alone")
    headers = httpx.Headers(OPENAI)
    gate = anygate.Gate(name="bench")
    anygate.learn_from_headers(gate, headers)
    anygate.learn_from_headers(gate, headers)
    assert gate.rate is not None
    parse = per_call(lambda: anygate.parse_limit_headers(headers))
    learn = per_call(lambda: anygate.learn_from_headers(gate, headers))
    report("learn / parse", learn / parse, 1.5)
    print(f"    learn per response: {learn * 1e6:.2f} us")


def bench_stream() -> None:
    print("(c) StreamUsage over a 200-chunk SSE stream vs a bare loop")
    chunk = json.dumps({"choices": [{"index": 0, "delta": {"content": "token "}}]})
    events = [f"data: {chunk}\n\n".encode() for _ in range(199)]
    events.append(b'data: {"choices": [], "usage": {"total_tokens": 1234}}\n\n')

    def bare() -> None:
        for event in events:
            len(event)

    def metered() -> None:
        meter = StreamUsage()
        for event in events:
            meter.feed(event)
        meter.close()
        assert meter.tokens == 1234

    base = per_call(bare, rounds=500)
    cost = per_call(metered, rounds=500)
    report("metered / bare", cost / base, None)
    print(f"    per chunk: {(cost - base) / len(events) * 1e6:.2f} us added")


def bench_transport() -> None:
    import anyio

    from anygate.httpx import GatedTransport

    print("(d) a request through GatedTransport (MockTransport), learning + tokens vs off")
    body = json.dumps({"id": "x", "choices": [], "usage": {"total_tokens": 42}}).encode()

    # Limits far above the run's pace: this measures the work, not the pacing it leads to.
    limits = OPENAI | {
        "x-ratelimit-limit-requests": "1000000000",
        "x-ratelimit-remaining-requests": "999999999",
        "x-ratelimit-limit-tokens": "100000000000",
        "x-ratelimit-remaining-tokens": "99999999999",
    }

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers=limits, content=body)

    payload = {"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}

    async def run(on: bool) -> float:
        gate = anygate.Gate(name="bench", rate=anygate.Rate(tokens_per_minute=1e11))
        transport = GatedTransport(
            httpx.MockTransport(handler), gate=gate, learn_limits=on, tokens=on
        )
        async with httpx.AsyncClient(transport=transport) as client:
            best = float("inf")
            for _ in range(5):
                start = time.perf_counter()
                for _ in range(500):
                    await client.post("http://llm/v1/chat/completions", json=payload)
                best = min(best, (time.perf_counter() - start) / 500)
        return best

    off = anyio.run(run, False)
    on = anyio.run(run, True)
    report("learning + tokens / off", on / off, 1.5)
    print(f"    per request: {off * 1e6:.0f} us off, {on * 1e6:.0f} us on")


if __name__ == "__main__":
    bench_parse()
    bench_learn()
    bench_stream()
    bench_transport()
