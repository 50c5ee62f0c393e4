"""The gated transports' ``UsageReported``: what each answer tells a policy's hooks.

httpx / httpx2 ``MockTransport`` answers (no network) in the shapes the providers use:
OpenAI chat completions and Responses, Anthropic messages with cache tokens, streamed and
plain, content-encoded or not, non-JSON; plus the blocking transport, a broken hook and a
request too big to parse. Every test checks the event's fields exactly.
"""

from __future__ import annotations

import gzip
import json
import logging
from typing import TYPE_CHECKING, Any

import pytest

import anygate

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from tests.integrations.conftest import Flavour

pytestmark = pytest.mark.anyio

URL = "https://api.example.com/v1/chat/completions"
CHAT = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}


def _policy(events: list[Any], **kwargs: Any) -> anygate.Policy:
    return anygate.Policy(name="llm", hooks=[events.append], circuit_breaker=None, **kwargs)


def _reports(events: list[Any]) -> list[anygate.UsageReported]:
    return [e for e in events if isinstance(e, anygate.UsageReported)]


def _chunked(data: bytes, size: int) -> Callable[[], AsyncIterator[bytes]]:
    async def gen() -> AsyncIterator[bytes]:
        for i in range(0, len(data), size):
            yield data[i : i + size]

    return gen


async def _send(
    flavour: Flavour,
    policy: anygate.Policy,
    response: Callable[[Any], Any],
    *,
    url: str = URL,
    body: Any = None,
) -> bytes:
    inner = flavour.lib.MockTransport(response)
    transport = flavour.gated.GatedTransport(inner, policy=policy)
    async with flavour.lib.AsyncClient(transport=transport) as client:
        answer = await client.post(url, json=CHAT if body is None else body)
        return bytes(answer.content)


def _expected(**fields: Any) -> anygate.UsageReported:
    given: dict[str, Any] = {
        "policy": "llm",
        "gate": "llm",
        "request_model": "gpt-4o",
        "server_address": "api.example.com",
        "server_port": 443,
        "operation": "chat",
        "provider": "openai",
    }
    return anygate.UsageReported(**(given | fields))


@pytest.mark.parametrize("encoding", [None, "gzip"])
@pytest.mark.parametrize(
    ("answer", "tokens"),
    [
        pytest.param(
            {"model": "gpt-4o-2024", "usage": {"prompt_tokens": 9, "completion_tokens": 2}},
            (9, 2),
            id="chat",
        ),
        pytest.param(
            {
                "response": {
                    "model": "gpt-4o-2024",
                    "usage": {"input_tokens": 7, "output_tokens": 3},
                }
            },
            (7, 3),
            id="responses-event",
        ),
        pytest.param(
            {
                "model": "gpt-4o-2024",
                "usage": {
                    "input_tokens": 5,
                    "cache_read_input_tokens": 100,
                    "cache_creation_input_tokens": 20,
                    "output_tokens": 6,
                },
            },
            (125, 6),
            id="anthropic-cache",
        ),
    ],
)
async def test_a_json_answer_reports_input_output_model_and_server(
    flavour: Flavour, encoding: str | None, answer: dict[str, Any], tokens: tuple[int, int]
) -> None:
    """One event per answer, read as the body ends: input (cached prompt tokens included,
    as the GenAI conventions count them), output, both models and the server."""
    raw = json.dumps(answer).encode()
    headers = {"content-type": "application/json"}
    if encoding == "gzip":
        raw = gzip.compress(raw)
        headers["content-encoding"] = "gzip"
    events: list[Any] = []
    content = await _send(
        flavour,
        _policy(events),
        lambda request: flavour.lib.Response(
            200, headers=headers, stream=flavour.lib.ByteStream(raw)
        ),
    )
    assert json.loads(content) == answer  # the body the client reads is untouched
    assert _reports(events) == [
        _expected(input_tokens=tokens[0], output_tokens=tokens[1], response_model="gpt-4o-2024")
    ]


async def test_a_streamed_anthropic_answer_reports_its_usage_once(flavour: Flavour) -> None:
    """Usage split over ``message_start`` (input, cache) and cumulative ``message_delta``
    (output), the stream cut into 7-byte chunks: one event with the largest of each."""
    events_sse = [
        {
            "type": "message_start",
            "message": {
                "model": "claude-x",
                "usage": {"input_tokens": 10, "cache_read_input_tokens": 30, "output_tokens": 1},
            },
        },
        {"type": "message_delta", "usage": {"output_tokens": 5}},
        {"type": "message_delta", "usage": {"output_tokens": 12}},
        {"type": "message_stop"},
    ]
    raw = b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events_sse)
    events: list[Any] = []
    await _send(
        flavour,
        _policy(events),
        lambda request: flavour.lib.Response(
            200, headers={"content-type": "text/event-stream"}, content=_chunked(raw, 7)()
        ),
        url="https://api.anthropic.com/v1/messages",
        body={"model": "claude-x", "max_tokens": 8, "messages": []},
    )
    assert _reports(events) == [
        _expected(
            input_tokens=40,
            output_tokens=12,
            request_model="claude-x",
            response_model="claude-x",
            server_address="api.anthropic.com",
            provider="anthropic",
        )
    ]


async def test_an_answer_without_usage_still_names_model_server_and_operation(
    flavour: Flavour,
) -> None:
    """A non-JSON answer on a plain-HTTP embeddings URL with a port: no token counts, but
    the request's model, the host, the port and the operation; the policy's ``provider``
    hint wins over the path's API family."""
    events: list[Any] = []
    await _send(
        flavour,
        _policy(events, provider="dashscope"),
        lambda request: flavour.lib.Response(200, text="ok"),
        url="http://127.0.0.1:8000/v1/embeddings",
        body={"model": "text-embedding-3-small", "input": "hi"},
    )
    assert _reports(events) == [
        _expected(
            request_model="text-embedding-3-small",
            server_address="127.0.0.1",
            server_port=8000,
            operation="embeddings",
            provider="dashscope",
        )
    ]


async def test_a_huge_request_is_not_parsed_for_its_model(flavour: Flavour) -> None:
    """A request body over 1 MiB goes without ``request_model`` (its parse would cost
    more than the label is worth); the answer's usage is still reported."""
    events: list[Any] = []
    big = {"model": "gpt-4o", "messages": [{"role": "user", "content": "x" * (1 << 20)}]}
    answer = {"model": "gpt-4o", "usage": {"prompt_tokens": 1, "completion_tokens": 1}}
    await _send(
        flavour,
        _policy(events),
        lambda request: flavour.lib.Response(200, json=answer),
        body=big,
    )
    assert _reports(events) == [
        _expected(request_model=None, response_model="gpt-4o", input_tokens=1, output_tokens=1)
    ]


async def test_a_failing_hook_is_logged_and_the_others_still_hear(
    flavour: Flavour, caplog: pytest.LogCaptureFixture
) -> None:
    """A hook raising on ``UsageReported`` is logged under ``anygate``; the hooks after it
    still get the event and the client still gets the whole body."""
    events: list[Any] = []

    def broken(event: anygate.Event) -> None:
        if isinstance(event, anygate.UsageReported):
            raise RuntimeError("dashboard down")

    policy = anygate.Policy(name="llm", hooks=[broken, events.append], circuit_breaker=None)
    answer = {"model": "m", "usage": {"prompt_tokens": 2, "completion_tokens": 3}}
    with caplog.at_level(logging.ERROR, logger="anygate"):
        content = await _send(
            flavour, policy, lambda request: flavour.lib.Response(200, json=answer)
        )
    assert json.loads(content) == answer
    assert [r.event for r in caplog.records] == ["UsageReported"]  # type: ignore[attr-defined]
    assert _reports(events) == [_expected(response_model="m", input_tokens=2, output_tokens=3)]


def test_the_blocking_transport_reports_too(flavour: Flavour) -> None:
    """``SyncGatedTransport`` delivers the same event in the calling thread."""
    events: list[Any] = []
    answer = {"model": "m", "usage": {"prompt_tokens": 2, "completion_tokens": 3}}
    inner = flavour.lib.MockTransport(lambda request: flavour.lib.Response(200, json=answer))
    transport = flavour.gated.SyncGatedTransport(inner, policy=_policy(events))
    with flavour.lib.Client(transport=transport) as client:
        assert client.post(URL, json=CHAT).json() == answer
    assert _reports(events) == [_expected(response_model="m", input_tokens=2, output_tokens=3)]


async def test_an_error_answer_handed_back_reports_nothing(flavour: Flavour) -> None:
    """A 400 the policy does not retry reaches the client as it came; it is no answer to
    label, so no ``UsageReported`` (the give-up's ``GaveUp`` says what happened)."""
    events: list[Any] = []
    error = {"error": {"type": "invalid_request_error", "message": "bad"}, "model": "m"}
    await _send(flavour, _policy(events), lambda request: flavour.lib.Response(400, json=error))
    assert _reports(events) == []
    assert any(isinstance(e, anygate.SlotAdmitted) for e in events)  # the call did happen


@pytest.mark.parametrize(
    ("body", "model"),
    [
        pytest.param({"model": "gpt-4o", "messages": []}, "gpt-4o", id="plain"),
        pytest.param(
            {
                "messages": [{"content": [{"type": "tool_use", "input": {"model": "inner"}}]}],
                "model": "claude-x",
            },
            "claude-x",
            id="nested-model-key-first",
        ),
        pytest.param(
            {"messages": [{"content": 'say "model": "x"'}], "model": "m2"}, "m2", id="quoted"
        ),
        pytest.param({"model": 'a"b'}, 'a"b', id="escaped"),
        pytest.param({"model": 3}, None, id="not-a-string"),
        pytest.param({"model": "m" * 129}, None, id="too-long"),
    ],
)
async def test_the_request_model_is_the_top_level_one(
    flavour: Flavour, body: dict[str, Any], model: str | None
) -> None:
    """The request's own ``model``, not one nested in a tool's input or quoted in a prompt;
    a value that is not a short string is no model name."""
    events: list[Any] = []
    await _send(flavour, _policy(events), lambda r: flavour.lib.Response(200, text=""), body=body)
    (report,) = _reports(events)
    assert report.request_model == model
