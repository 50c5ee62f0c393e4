"""The OpenAI and Anthropic SDKs as the integration tests drive them (no mocks: real clients)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    import anygate

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

MESSAGES = [{"role": "user", "content": "hi"}]


@dataclass(frozen=True)
class Sdk:
    """One SDK on one HTTP library, with the two calls the tests make."""

    name: str
    library: str

    def client(self, url: str, transport: Any, *, max_retries: int = 0, sync: bool = False) -> Any:
        lib = importlib.import_module(self.library)
        http = (lib.Client if sync else lib.AsyncClient)(transport=transport)
        if self.name == "openai":
            cls = openai.OpenAI if sync else openai.AsyncOpenAI
            return cls(
                base_url=f"{url}/v1", api_key="sk-test", http_client=http, max_retries=max_retries
            )
        cls = anthropic.Anthropic if sync else anthropic.AsyncAnthropic
        return cls(base_url=url, api_key="sk-ant-test", http_client=http, max_retries=max_retries)

    def gated(self, gate: anygate.Gate | None = None, *, sync: bool = False, **kwargs: Any) -> Any:
        module = importlib.import_module(f"anygate.{self.library}")
        return (module.SyncGatedTransport if sync else module.GatedTransport)(gate=gate, **kwargs)

    @property
    def errors(self) -> Any:
        """The SDK module, for its exception classes."""
        return openai if self.name == "openai" else anthropic

    def create(self, client: Any, *, stream: bool = False, **extra: Any) -> Any:
        """Start one call; returns the SDK's awaitable (or result, for sync clients)."""
        if self.name == "openai":
            return client.chat.completions.create(
                model="m", messages=MESSAGES, stream=stream, **extra
            )
        return client.messages.create(
            model="m", max_tokens=8, messages=MESSAGES, stream=stream, **extra
        )

    @staticmethod
    def text_of(result: Any) -> str:
        if hasattr(result, "choices"):
            return str(result.choices[0].message.content)
        return str(result.content[0].text)

    @staticmethod
    def text_of_chunk(chunk: Any) -> str:
        if hasattr(chunk, "choices"):
            return chunk.choices[0].delta.content or "" if chunk.choices else ""
        if getattr(chunk, "type", None) == "content_block_delta":
            return str(chunk.delta.text)
        return ""

    async def complete(self, client: Any, **extra: Any) -> str:
        return self.text_of(await self.create(client, **extra))

    async def stream(self, client: Any, **extra: Any) -> str:
        stream = await self.create(client, stream=True, **extra)
        return "".join([self.text_of_chunk(chunk) async for chunk in stream])


SDKS = [
    pytest.param(Sdk("openai", "httpx2"), id="openai-httpx2"),
    pytest.param(Sdk("openai", "httpx"), id="openai-httpx"),
    pytest.param(Sdk("anthropic", "httpx2"), id="anthropic-httpx2"),
]
