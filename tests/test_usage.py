"""Token estimates from request bodies and usage from responses and streams."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from anygate import chars_counter, estimate_tokens, tiktoken_counter, usage_tokens
from anygate.integrations._stream_usage import StreamUsage


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"messages": [{"role": "user", "content": "x" * 40}], "max_tokens": 100}, 110),
        ({"messages": [{"role": "user", "content": "x" * 40}], "max_completion_tokens": 7}, 17),
        ({"input": "x" * 8, "max_output_tokens": 50}, 52),  # Responses API
        (
            {
                "system": "x" * 4,
                "messages": [{"role": "user", "content": [{"type": "text", "text": "y" * 4}]}],
                "max_tokens": 1,
            },
            4,
        ),
        ({"messages": [{"role": "user", "content": "x" * 40}], "max_tokens": 10, "n": 3}, 40),
        ({"messages": [{"role": "user", "content": "x" * 40}]}, 10),  # no cap: the prompt only
        ({"model": "m"}, 0),
        ({"messages": [], "max_tokens": True}, 0),  # a bool is not a cap
        ({"messages": [], "max_tokens": -5}, 0),
    ],
)
def test_estimates(body: dict[str, Any], expected: int) -> None:
    """Prompt text at 4 characters a token, plus the stated output cap times n."""
    assert estimate_tokens(body) == expected
    assert estimate_tokens(json.dumps(body).encode()) == expected
    assert estimate_tokens(json.dumps(body)) == expected


def test_estimate_options_and_non_json() -> None:
    """A custom counter and default output are used; non-JSON bodies give None."""
    body = {"messages": [{"role": "user", "content": "hello world"}]}
    assert estimate_tokens(body, counter=lambda text: 2, default_output=30) == 32
    assert estimate_tokens(body, counter=chars_counter(1)) == len("hello world")
    assert estimate_tokens(b"\xff not json") is None
    assert estimate_tokens(b"[1, 2]") is None
    assert estimate_tokens(None) is None

    def broken(text: str) -> int:
        raise RuntimeError

    assert estimate_tokens(body, counter=broken) == 3  # falls back to 4 characters a token


def test_chars_counter_checks_its_argument() -> None:
    """A bad ratio names the parameter and the value."""
    with pytest.raises(ValueError, match=r"chars_per_token must be > 0.*\(got 0\)"):
        chars_counter(0)
    with pytest.raises(TypeError, match="chars_per_token"):
        chars_counter("4")  # type: ignore[arg-type]


def test_tiktoken_is_optional(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without tiktoken the counter says how to get it.

    tiktoken is hidden rather than looked for: the test group installs it now (through
    langchain-openai), and counting with it would download its encodings from the network.
    """
    monkeypatch.setitem(sys.modules, "tiktoken", None)  # import_module then raises ImportError
    with pytest.raises(ImportError, match="pip install tiktoken"):
        tiktoken_counter()


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        ({"usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}}, 7),
        ({"usage": {"prompt_tokens": 3, "completion_tokens": 4}}, 7),
        ({"usage": {"input_tokens": 5, "output_tokens": 6, "total_tokens": 11}}, 11),  # Responses
        ({"response": {"usage": {"input_tokens": 5, "output_tokens": 6, "total_tokens": 11}}}, 11),
        (
            {
                "type": "message",
                "usage": {
                    "input_tokens": 10,
                    "cache_creation_input_tokens": 2,
                    "cache_read_input_tokens": 3,
                    "output_tokens": 5,
                    "server_tool_use": {"web_search_requests": 1},
                },
            },
            20,
        ),
        ({"usage": None}, None),
        ({"usage": {"total_tokens": -1}}, None),
        ({"choices": []}, None),
        ([1], None),
        ("garbage", None),
    ],
)
def test_usage_of_response_documents(doc: Any, expected: int | None) -> None:
    """OpenAI chat, Responses and Anthropic shapes; anything else is None."""
    assert usage_tokens(doc) == expected


def test_stream_usage_across_split_lines() -> None:
    """Lines split across chunks, a final line without newline, Anthropic's split usage."""
    meter = StreamUsage()
    data = (
        b'event: message_start\ndata: {"type":"message_start","message":{"usage":{"input_tokens":10,"output_tokens":1}}}\n\n'
        b'data: {"type":"message_delta","usage":{"output_tokens":9}}\n\n'
        b'data: {"type":"message_delta","usage":{"output_tokens":15}}'
    )
    for i in range(0, len(data), 5):
        meter.feed(data[i : i + 5])
    assert meter.tokens == 19  # 10 in + 9 out: the last line has no newline yet
    meter.close()
    assert meter.tokens == 25
    empty = StreamUsage()
    empty.feed(b'data: {"choices": [{"delta": {"content": "usage"}}]}\n\ndata: [DONE]\n\n')
    empty.feed(b"data: {not json usage}\n")
    empty.close()
    assert empty.tokens is None


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.binary(max_size=64), max_size=10),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
        lambda children: (
            st.lists(children, max_size=4)
            | st.dictionaries(
                st.sampled_from(
                    [
                        "usage",
                        "messages",
                        "max_tokens",
                        "n",
                        "input",
                        "total_tokens",
                        "input_tokens",
                        "response",
                        "message",
                    ]
                ),
                children,
                max_size=4,
            )
        ),
        max_leaves=20,
    ),
)
def test_never_raises(chunks: list[bytes], doc: Any) -> None:
    """Any bytes or JSON shape: no exception, and counts are ints >= 0 or None."""
    meter = StreamUsage()
    for chunk in chunks:
        meter.feed(chunk)
        meter.feed(b"data: " + json.dumps(doc).encode() + b"\n")
    meter.close()
    assert meter.tokens is None or meter.tokens >= 0
    for value in (usage_tokens(doc), estimate_tokens(doc) if isinstance(doc, dict) else None):
        assert value is None or (isinstance(value, int) and value >= 0)
