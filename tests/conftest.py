"""Shared fixtures: every async test runs on asyncio, asyncio+uvloop (where installed) and trio."""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any

import pytest

from anygate._gate import registry as _registry
from anygate._policy import sharing as _sharing

if TYPE_CHECKING:
    from collections.abc import Iterator

_BACKENDS: list[Any] = [pytest.param("asyncio", id="asyncio")]
if importlib.util.find_spec("uvloop") is not None:
    _BACKENDS.append(pytest.param(("asyncio", {"use_uvloop": True}), id="asyncio+uvloop"))
_BACKENDS.append(pytest.param("trio", id="trio"))


@pytest.fixture(params=_BACKENDS)
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    """Run the requesting async test once per backend."""
    return request.param


def mock_clock() -> Any:
    """A backend parameter for virtual-time tests: trio with ``MockClock(autojump_threshold=0)``.

    Use it to override the backend fixture for one test or module::

        @pytest.mark.parametrize("anyio_backend", [mock_clock()])
        async def test_backoff_waits_exactly(anyio_backend): ...

    Time only advances when every task is blocked, so hours of backoff pass in milliseconds
    and assertions on ``anyio.current_time()`` are exact. Assert on differences of
    ``anyio.current_time()``, never on absolute values.
    """
    import trio.testing

    return pytest.param(
        ("trio", {"clock": trio.testing.MockClock(autojump_threshold=0)}), id="trio-mockclock"
    )


@pytest.fixture(autouse=True)
def _isolated_registries() -> Iterator[None]:
    """Each test sees fresh process-wide registries; the real ones are restored afterwards."""
    with _registry.gates.isolated(), _sharing.breakers.isolated():
        yield
