"""Token accounting and limit learning in GatedTransport, over an in-memory inner transport.

The gate's token budget runs on a clock the test holds still, so ``tokens_available`` is
an exact ledger of what was charged: the estimate while a request is in flight, the usage
once its body has reported it, never both. Every test runs with httpx and httpx2, on
asyncio, asyncio+uvloop and trio.
"""

from __future__ import annotations

import gzip
import json
import math
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio
import pytest

import anygate
from anygate._classify.usage import estimate_tokens

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from tests.integrations.conftest import Flavour

pytestmark = pytest.mark.anyio

FULL = 60_000
BODY = {
    "model": "m",
    "max_tokens": 100,
    "messages": [{"role": "user", "content": "x" * 400}],
}
ESTIMATE = estimate_tokens(BODY)
USAGE = {"prompt_tokens": 30, "completion_tokens": 12, "total_tokens": 42}


class Still:
    """A clock the test moves by hand: token levels stay exact between steps."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _gate(clock: Still, **rate: Any) -> anygate.Gate:
    rate.setdefault("tokens_per_minute", FULL)
    gate = anygate.Gate(name="llm", rate=anygate.Rate(burst_s=60, **rate), clock=clock)
    clock.now += 60  # a full budget: FULL tokens
    return gate


def _tokens_left(gate: anygate.Gate) -> float:
    rate = gate.statistics().rate
    assert rate is not None
    assert rate.tokens_available is not None
    return round(rate.tokens_available, 6)  # float refill arithmetic, exact to a millionth


def _sse(*events: dict[str, Any] | str) -> bytes:
    return b"".join(
        f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n".encode() for e in events
    )


def _chunked(data: bytes, size: int) -> Callable[[], AsyncIterator[bytes]]:
    async def gen() -> AsyncIterator[bytes]:
        for i in range(0, len(data), size):
            yield data[i : i + size]

    return gen


def _client(flavour: Flavour, gate: anygate.Gate, handler: Any, **kwargs: Any) -> Any:
    inner = flavour.lib.MockTransport(handler)
    return flavour.lib.AsyncClient(
        transport=flavour.gated.GatedTransport(inner, gate=gate, **kwargs)
    )


def _respond(
    flavour: Flavour, seen: list[float], gate: anygate.Gate, **kwargs: Any
) -> Callable[[Any], Any]:
    def handler(request: Any) -> Any:
        seen.append(_tokens_left(gate))  # what the request was charged when it went out
        return flavour.lib.Response(200, **kwargs)

    return handler


# ----------------------------------------------------------------------------- JSON


@pytest.mark.parametrize("encoding", [None, "gzip", "deflate"])
async def test_json_usage_replaces_the_estimate_once(
    flavour: Flavour, encoding: str | None
) -> None:
    """In flight the request costs its estimate; once read, exactly its usage, however read."""
    clock = Still()
    gate = _gate(clock)
    seen: list[float] = []
    raw = json.dumps({"id": "x", "choices": [], "usage": USAGE}).encode()
    headers = {"content-type": "application/json"}
    if encoding == "gzip":
        raw = gzip.compress(raw)
        headers["content-encoding"] = "gzip"
    elif encoding == "deflate":
        import zlib

        raw = zlib.compress(raw)
        headers["content-encoding"] = "deflate"
    handler = _respond(flavour, seen, gate, headers=headers, stream=_Stream(flavour, raw, 7))
    async with _client(flavour, gate, handler) as client:
        response = await client.post("http://llm/v1/chat/completions", json=BODY)
        assert response.json()["usage"] == USAGE
        await response.aclose()
    assert seen == [FULL - ESTIMATE]
    assert _tokens_left(gate) == FULL - 42


async def test_a_closed_early_json_body_keeps_the_estimate(flavour: Flavour) -> None:
    """A body closed before its end reported nothing: the estimate stands."""
    clock = Still()
    gate = _gate(clock)
    raw = json.dumps({"usage": USAGE}).encode()
    handler = _respond(
        flavour,
        [],
        gate,
        headers={"content-type": "application/json"},
        stream=_Stream(flavour, raw, 4),
    )
    async with _client(flavour, gate, handler) as client:
        request = client.build_request("POST", "http://llm/v1/chat/completions", json=BODY)
        response = await client.send(request, stream=True)
        async for _ in response.aiter_raw():
            break
        await response.aclose()
    assert _tokens_left(gate) == FULL - ESTIMATE


# ----------------------------------------------------------------------------- streams

OPENAI_STREAM = _sse(
    {"choices": [{"delta": {"content": "Hel"}}]},
    {"choices": [{"delta": {"content": "lo"}}], "usage": None},
    {"choices": [], "usage": USAGE},
    "[DONE]",
)
ANTHROPIC_STREAM = _sse(
    {"type": "message_start", "message": {"usage": {"input_tokens": 10, "output_tokens": 1}}},
    {"type": "content_block_delta", "delta": {"text": "Hi"}},
    {"type": "message_delta", "usage": {"output_tokens": 7}},
    {"type": "message_delta", "usage": {"output_tokens": 15}},
    {"type": "message_stop"},
)
RESPONSES_STREAM = _sse(
    {"type": "response.output_text.delta", "delta": "Hi"},
    {
        "type": "response.completed",
        "response": {"usage": {"input_tokens": 5, "output_tokens": 6, "total_tokens": 11}},
    },
)


@pytest.mark.parametrize(
    ("body", "used"),
    [
        (OPENAI_STREAM, 42),
        (ANTHROPIC_STREAM, 25),
        (RESPONSES_STREAM, 11),
        (_sse({"choices": [{"delta": {"content": "Hel"}}]}, "[DONE]"), None),
    ],
    ids=["openai-include-usage", "anthropic", "responses", "no-usage"],
)
@pytest.mark.parametrize("size", [3, 1 << 16], ids=["split", "whole"])
async def test_stream_usage_settles_at_the_end(
    flavour: Flavour, body: bytes, used: int | None, size: int
) -> None:
    """The stream's reported usage settles the token; without any the estimate stays."""
    clock = Still()
    gate = _gate(clock)
    handler = _respond(
        flavour,
        [],
        gate,
        headers={"content-type": "text/event-stream; charset=utf-8"},
        stream=_Stream(flavour, body, size),
    )
    async with _client(flavour, gate, handler) as client:
        request = client.build_request("POST", "http://llm/v1/chat/completions", json=BODY)
        response = await client.send(request, stream=True)
        assert _tokens_left(gate) == FULL - ESTIMATE
        async for _ in response.aiter_raw():
            pass
        await response.aclose()
        await response.aclose()
    assert _tokens_left(gate) == FULL - (ESTIMATE if used is None else used)


async def test_no_token_budget_means_no_token_work(flavour: Flavour) -> None:
    """A gate without tokens_per_minute charges nothing and reads no bodies."""
    clock = Still()
    gate = _gate(clock, tokens_per_minute=None, requests_per_minute=600)

    def handler(request: Any) -> Any:
        return flavour.lib.Response(200, json={"usage": USAGE})

    async with _client(flavour, gate, handler) as client:
        response = await client.post("http://llm/v1/chat/completions", json=BODY)
        assert response.status_code == 200
    rate = gate.statistics().rate
    assert rate is not None
    assert rate.tokens_available is None


async def test_a_custom_estimator_and_a_huge_estimate(flavour: Flavour) -> None:
    """tokens=callable replaces the estimate; one above a minute's budget is capped to it."""
    clock = Still()
    gate = _gate(clock)
    seen: list[float] = []
    handler = _respond(flavour, seen, gate, headers={"content-type": "text/plain"}, text="hi")
    async with _client(flavour, gate, handler, tokens=lambda body: 10**9) as client:
        await client.post("http://llm/v1/chat/completions", json=BODY)
    assert seen == [0.0]  # capped to one minute's budget (60000)
    clock2 = Still()
    gate2 = _gate(clock2)
    handler2 = _respond(
        flavour, [], gate2, headers={"content-type": "application/json"}, json={"usage": USAGE}
    )
    async with _client(flavour, gate2, handler2, tokens=False) as client:
        await client.post("http://llm/v1/chat/completions", json=BODY)
    assert _tokens_left(gate2) == FULL  # tokens=False: no estimate, no settle


async def test_policy_retries_charge_each_attempt_once(flavour: Flavour) -> None:
    """Under a policy: a throttled attempt keeps its estimate, the answered one its usage."""
    clock = Still()
    gate = _gate(clock)
    answers = [429, 200]

    def handler(request: Any) -> Any:
        status = answers.pop(0)
        if status == 429:
            return flavour.lib.Response(
                429, headers={"retry-after": "0"}, json={"error": {"code": "rate_limit"}}
            )
        return flavour.lib.Response(200, json={"usage": USAGE})

    policy = anygate.Policy(
        name="llm", gate=gate, retry=anygate.RetryConfig(base_delay_ms=1, cap_delay_ms=2)
    )
    with anygate.set_testing(True):
        async with _client(flavour, gate, handler, policy=policy) as client:
            response = await client.post("http://llm/v1/chat/completions", json=BODY)
            assert response.status_code == 200
    assert _tokens_left(gate) == FULL - ESTIMATE - 42


async def test_policy_attempts_wait_for_room_for_their_estimate(flavour: Flavour) -> None:
    """Issue 30: under a policy an attempt is admitted only with room for its estimate, as
    without one; charged after admission, requests sent together overdrew the budget. The
    first request's usage refunds its estimate, and that lets the second go."""
    clock = Still()
    gate = _gate(clock, tokens_per_minute=ESTIMATE + ESTIMATE // 2)
    sent: list[str] = []
    release = anyio.Event()

    async def handler(request: Any) -> Any:
        sent.append(request.url.path)
        if request.url.path == "/first":
            await release.wait()
        return flavour.lib.Response(200, json={"usage": USAGE})

    policy = anygate.Policy(name="llm", gate=gate)
    with anygate.set_testing(True):
        async with (
            _client(flavour, gate, handler, policy=policy) as client,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(partial(client.post, "http://llm/first", json=BODY))
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(partial(client.post, "http://llm/second", json=BODY))
            await anyio.wait_all_tasks_blocked()
            assert sent == ["/first"]
            assert gate.waiting == 1
            release.set()
    assert sent == ["/first", "/second"]
    assert _tokens_left(gate) == ESTIMATE + ESTIMATE // 2 - 2 * 42


# ----------------------------------------------------------------------------- learning


def _limits(remaining: int) -> dict[str, str]:
    return {
        "x-ratelimit-limit-requests": "600",
        "x-ratelimit-remaining-requests": str(remaining),
        "x-ratelimit-reset-requests": "100ms",
        "x-ratelimit-limit-tokens": "100000",
        "x-ratelimit-remaining-tokens": str(99_000 - remaining),
        "x-ratelimit-reset-tokens": "600ms",
    }


async def test_every_response_teaches_the_gate(flavour: Flavour) -> None:
    """Rate-limit headers on responses (errors included) set the gate's rate at 90 %."""
    clock = Still()
    gate = anygate.Gate(name="llm", clock=clock)
    remaining = iter([590, 580])

    def handler(request: Any) -> Any:
        return flavour.lib.Response(
            503 if request.url.path.endswith("fail") else 200, headers=_limits(next(remaining))
        )

    async with _client(flavour, gate, handler) as client:
        await client.post("http://llm/v1/fail", json=BODY)
        assert gate.rate is None
        await client.post("http://llm/v1/chat/completions", json=BODY)
    assert gate.rate == anygate.Rate(requests_per_minute=540, tokens_per_minute=90_000)
    limits = anygate.RateLearner.of(gate).limits
    assert (limits.requests_per_minute, limits.tokens_per_minute) == (600, 100_000)


async def test_learning_can_be_turned_off(flavour: Flavour) -> None:
    """learn_limits=False: the headers are not read."""
    gate = anygate.Gate(name="llm")
    remaining = iter([590, 580])

    def handler(request: Any) -> Any:
        return flavour.lib.Response(200, headers=_limits(next(remaining)))

    async with _client(flavour, gate, handler, learn_limits=False) as client:
        await client.post("http://llm/v1/a", json=BODY)
        await client.post("http://llm/v1/b", json=BODY)
    assert gate.rate is None


def test_bad_options_name_the_parameter(flavour: Flavour) -> None:
    """learn_limits and tokens are checked when the transport is built."""
    gate = anygate.Gate(name="llm")
    with pytest.raises(TypeError, match="learn_limits must be a bool"):
        flavour.gated.GatedTransport(gate=gate, learn_limits="yes")
    with pytest.raises(TypeError, match="tokens must be True"):
        flavour.gated.GatedTransport(gate=gate, tokens=3)
    assert math.isfinite(float(ESTIMATE or 0))


class _Stream:
    """A response body that arrives in ``size``-byte chunks (sync and async)."""

    def __init__(self, flavour: Flavour, data: bytes, size: int) -> None:
        self._data = data
        self._size = size

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for i in range(0, len(self._data), self._size):
            yield self._data[i : i + self._size]

    def __iter__(self) -> Any:
        for i in range(0, len(self._data), self._size):
            yield self._data[i : i + self._size]

    async def aclose(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_sync_transport_settles_and_learns(flavour: Flavour) -> None:
    """SyncGatedTransport: the same accounting on a blocking client, in a plain thread."""
    clock = Still()
    gate = _gate(clock)
    remaining = iter([590, 580])
    raw = json.dumps({"usage": USAGE}).encode()

    def handler(request: Any) -> Any:
        return flavour.lib.Response(
            200,
            headers={"content-type": "application/json", **_limits(next(remaining))},
            stream=_Stream(flavour, raw, 5),
        )

    transport = flavour.gated.SyncGatedTransport(flavour.lib.MockTransport(handler), gate=gate)
    with flavour.lib.Client(transport=transport) as client:
        for _ in range(2):
            assert client.post("http://llm/v1/chat/completions", json=BODY).json()["usage"] == USAGE
    # The first refund counts once the second answer's report came; the second waits for
    # the next report (a budget synced to a provider's bucket holds refunds until then).
    assert _tokens_left(gate) == FULL - 42 - ESTIMATE
    assert gate.rate == anygate.Rate(
        requests_per_minute=540, tokens_per_minute=FULL, burst_s=60
    )  # the user's 60000 caps the learned 90000


async def test_learning_reads_names_in_any_case(flavour: Flavour) -> None:
    """Rate-limit header names are matched case-insensitively (the transport's quick scan
    for them included), among other headers."""
    gate = anygate.Gate(name="llm")
    remaining = iter([590, 580])

    def handler(request: Any) -> Any:
        limits = {name.title(): value for name, value in _limits(next(remaining)).items()}
        return flavour.lib.Response(200, headers={"Server": "x", **limits})

    async with _client(flavour, gate, handler) as client:
        await client.post("http://llm/v1/a", json=BODY)
        await client.post("http://llm/v1/b", json=BODY)
    assert gate.rate == anygate.Rate(requests_per_minute=540, tokens_per_minute=90_000)


def test_learning_from_headers_whose_raw_names_are_not_bytes() -> None:
    """A response whose headers' ``raw`` pairs hold ``str`` names (not what httpx builds,
    but an inner transport may) is read by the parser all the same; without rate-limit
    names nothing is learned."""
    from anygate.integrations._accounting import Accounting

    class Headers:
        def __init__(self, pairs: list[tuple[str, str]]) -> None:
            self.raw = pairs

    class Response:
        def __init__(self, pairs: list[tuple[str, str]]) -> None:
            self.headers = Headers(pairs)

    gate = anygate.Gate(name="llm")
    accounting = Accounting(gate, learn_limits=True, tokens=True)
    for _ in range(2):
        accounting.observe(Response([("Server", "x")]))
    assert gate.rate is None
    for remaining in (590, 580):
        accounting.observe(Response(list(_limits(remaining).items())))
    assert gate.rate == anygate.Rate(requests_per_minute=540, tokens_per_minute=90_000)


@pytest.mark.parametrize("lowered", [True, False], ids=["private-names", "public-raw"])
async def test_the_header_scan_skips_the_parser_on_both_paths(
    flavour: Flavour, lowered: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Responses without a rate-limit header name never reach the parser, responses with
    one (in any case) teach the gate: on the scan of httpx's lower-cased names and on the
    public ``.raw`` fallback the scan takes for a headers class it does not trust."""
    from anygate.integrations import _accounting

    monkeypatch.setattr(_accounting, "_LOWERED", {flavour.lib.Headers: lowered})
    parsed: list[object] = []
    parse = _accounting.parse_limit_headers

    def counting(headers: object) -> Any:
        parsed.append(headers)
        return parse(headers)

    monkeypatch.setattr(_accounting, "parse_limit_headers", counting)
    gate = anygate.Gate(name="llm")
    remaining = iter([590, 580])

    def handler(request: Any) -> Any:
        if request.url.path.endswith("plain"):
            return flavour.lib.Response(200, headers={"Server": "x", "X-Rate": "1"})
        limits = {name.title(): value for name, value in _limits(next(remaining)).items()}
        return flavour.lib.Response(200, headers={"Server": "x", **limits})

    async with _client(flavour, gate, handler) as client:
        for _ in range(3):
            await client.post("http://llm/v1/plain", json=BODY)
        assert (parsed, gate.rate) == ([], None)
        await client.post("http://llm/v1/a", json=BODY)
        await client.post("http://llm/v1/b", json=BODY)
    assert len(parsed) == 2
    assert gate.rate == anygate.Rate(requests_per_minute=540, tokens_per_minute=90_000)


def test_the_lowered_names_are_read_only_from_the_expected_layout(flavour: Flavour) -> None:
    """httpx's private ``Headers._list`` is trusted only for a class of the HTTP libraries
    whose probe shows ``(name, lower-cased name, value)`` entries agreeing with ``.raw``;
    any other class takes the public path (a false negative would stop learning)."""
    from anygate.integrations._accounting import _keeps_lowered_names

    assert _keeps_lowered_names(flavour.lib.Headers)

    class Reordered(flavour.lib.Headers):  # type: ignore[name-defined,misc]
        @property
        def _list(self) -> list[tuple[bytes, bytes, bytes]]:
            return [(lower, raw, value) for raw, lower, value in self.__dict__["_list"]]

        @_list.setter
        def _list(self, value: list[tuple[bytes, bytes, bytes]]) -> None:
            self.__dict__["_list"] = value

    class Broken(flavour.lib.Headers):  # type: ignore[name-defined,misc]
        def __init__(self, *args: object) -> None:
            raise RuntimeError

    for cls in (Reordered, Broken):
        cls.__module__ = f"{flavour.name}._models"  # pass the module check, fail the probe
        assert not _keeps_lowered_names(cls)
    assert not _keeps_lowered_names(dict)


def _left(remaining: int) -> dict[str, str]:
    return {
        "x-ratelimit-limit-tokens": "100000",
        "x-ratelimit-remaining-tokens": str(remaining),
        "x-ratelimit-reset-tokens": "6s",
    }


async def test_remaining_lowers_the_gates_budget(flavour: Flavour) -> None:
    """Another client drained the provider's bucket: 10,000 tokens left when our request
    went out, so the gate's full 60,000 comes down to that. The settle refund of its
    estimate to the 42 tokens it used waits for the next report: whether the provider
    gave it back too (OpenAI keeps the estimate) only a report can say."""
    clock = Still()
    gate = _gate(clock)
    raw = json.dumps({"usage": USAGE}).encode()

    def handler(request: Any) -> Any:
        headers = {"content-type": "application/json", **_left(10_000)}
        return flavour.lib.Response(200, headers=headers, content=raw)

    async with _client(flavour, gate, handler) as client:
        response = await client.post("http://llm/v1/chat/completions", json=BODY)
        assert response.json()["usage"] == USAGE
    assert _tokens_left(gate) == 10_000
    assert anygate.RateLearner.of(gate).limits.syncs == 1


def test_remaining_lowers_the_gates_budget_sync(flavour: Flavour) -> None:
    """The same through SyncGatedTransport, under a policy (one attempt)."""
    clock = Still()
    gate = _gate(clock)
    raw = json.dumps({"usage": USAGE}).encode()

    def handler(request: Any) -> Any:
        headers = {"content-type": "application/json", **_left(10_000)}
        return flavour.lib.Response(200, headers=headers, content=raw)

    policy = anygate.Policy(gate=gate, circuit_breaker=False)
    transport = flavour.gated.SyncGatedTransport(
        flavour.lib.MockTransport(handler), gate=gate, policy=policy
    )
    with flavour.lib.Client(transport=transport) as client:
        assert client.post("http://llm/v1/chat/completions", json=BODY).json()["usage"] == USAGE
    assert _tokens_left(gate) == 10_000
