"""Fixtures for the integration tests: the HTTP library flavours, and a counting transport."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import pytest

if TYPE_CHECKING:
    from types import ModuleType

# trio warns about every async generator it has to finalise unexhausted. httpx's and the
# SDKs' own generators are left that way whenever a stream is not read to the end (and the
# SDKs stop reading at "[DONE]"), with or without anygate. anygate's bodies are plain
# iterators, not generators, so this filter cannot hide a leak of ours.
_THIRD_PARTY_ASYNCGEN = pytest.mark.filterwarnings(
    r"ignore:Async generator '(openai|anthropic|httpx2?|httpcore2?)\.:ResourceWarning"
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Apply the third-party async-generator filter to the integration tests only."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.path).parents:
            item.add_marker(_THIRD_PARTY_ASYNCGEN)


# httpx2 2.16 needs Python 3.11, but 2.12-2.14 (what openai 3.x installs there) run on 3.10.
_FLAVOURS = [pytest.param("httpx", id="httpx"), pytest.param("httpx2", id="httpx2")]


@dataclass(frozen=True)
class Flavour:
    """One HTTP library and anygate's module for it."""

    name: str
    lib: Any  # the httpx or httpx2 module
    gated: ModuleType  # anygate.httpx or anygate.httpx2


@pytest.fixture(params=_FLAVOURS)
def flavour(request: pytest.FixtureRequest) -> Flavour:
    """Run the requesting test once with httpx and once with httpx2."""
    name: str = request.param
    lib = pytest.importorskip(name)
    return Flavour(name, lib, importlib.import_module(f"anygate.{name}"))


class Arrivals:
    """An outer async transport that counts requests going into the gated one, and answers.

    A request counted in :attr:`entered` has entered ``GatedTransport.handle_async_request``;
    that method queues on the gate without awaiting anything else first, so once the test
    task runs again every counted request is either admitted or parked in the gate's queue.
    :attr:`answered` counts responses whose headers came back (their bodies may not have).
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.entered = 0
        self.answered = 0
        self._changed = anyio.Event()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def handle_async_request(self, request: Any) -> Any:
        self.entered += 1
        self._notify()
        response = await self.inner.handle_async_request(request)
        self.answered += 1
        self._notify()
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def __aenter__(self) -> Arrivals:
        await self.inner.__aenter__()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.inner.__aexit__(*exc_info)

    async def wait_entered(self, count: int) -> None:
        """Wait until ``count`` requests have entered."""
        while self.entered < count:
            await self._changed.wait()

    async def wait_answered(self, count: int) -> None:
        """Wait until ``count`` responses have come back (headers only)."""
        while self.answered < count:
            await self._changed.wait()
