"""Shared fixtures: every async test runs on asyncio, asyncio+uvloop (where installed) and trio."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import Any

import pytest

from anygate import _registry

_BACKENDS: list[Any] = [pytest.param("asyncio", id="asyncio")]
if importlib.util.find_spec("uvloop") is not None:
    _BACKENDS.append(pytest.param(("asyncio", {"use_uvloop": True}), id="asyncio+uvloop"))
_BACKENDS.append(pytest.param("trio", id="trio"))


@pytest.fixture(params=_BACKENDS)
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    """Run the requesting async test once per backend."""
    return request.param


@pytest.fixture
def mock_clock_backend() -> Any:
    """For ``@pytest.mark.parametrize("anyio_backend", [...])``-free virtual-time tests.

    Use as ``anyio_backend`` override: tests that need exact time run on trio's MockClock
    with autojump, so hours of backoff pass in milliseconds and assertions are exact.
    """
    import trio.testing

    return ("trio", {"clock": trio.testing.MockClock(autojump_threshold=0)})


@pytest.fixture(autouse=True)
def _isolated_registries() -> Iterator[None]:
    """Each test sees fresh process-wide registries; the real ones are restored afterwards."""
    with _registry.gates.isolated():
        yield
