"""Testing helpers for apps that use anygate, and a pytest plugin.

Process-wide state outlives a test: a :func:`~anygate.shared_gate` resized in one test, or a
:func:`~anygate.shared_breaker` opened by one test's failures, is what the next test gets
(which then fails with :class:`~anygate.CircuitOpen`). :func:`isolated` gives a block fresh
registries (gates, breakers, and so the adaptive limits that hang off gates) and restores
the old ones afterwards; :func:`set_testing` makes every policy's retries instant.

The pytest plugin is registered automatically when anygate is installed (entry point
``anygate``; disable with ``-p no:anygate``). It does nothing on its own; it offers:

- the fixture ``anygate_isolated``: the test runs inside :func:`isolated`;
- the fixture ``anygate_testing``: as ``anygate_isolated``, plus ``set_testing(True)``;
- the ini options ``anygate_isolate = true`` (every test runs isolated) and
  ``anygate_instant_retries = true`` (every test runs with ``set_testing(True)``).

This module imports pytest; import it from tests only.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING

import pytest

from ._gate.registry import gates
from ._policy.sharing import breakers
from ._policy.testing_switch import is_testing, set_testing

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["anygate_isolated", "anygate_testing", "is_testing", "isolated", "set_testing"]


@contextmanager
def isolated() -> Iterator[None]:
    """Run a block with empty process-wide registries of gates and breakers.

    Inside, :func:`~anygate.shared_gate`, :func:`~anygate.shared_breaker` and policies that
    share by name create fresh objects; on exit the previous registries come back, so code
    outside the block (other tests, a session-scoped fixture) sees what it had. Objects
    created inside are simply dropped. Nests. Not for production code: another thread
    using the registries meanwhile sees the swap too.
    """
    with gates.isolated(), breakers.isolated():
        yield


@pytest.fixture
def anygate_isolated() -> Iterator[None]:
    """Run the test with fresh process-wide gates and breakers (see :func:`isolated`)."""
    with isolated():
        yield


@pytest.fixture
def anygate_testing(anygate_isolated: None) -> Iterator[None]:
    """Fresh gates and breakers, and ``set_testing(True)``: retries are instant."""
    with set_testing(True):
        yield


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register the plugin's ini options."""
    parser.addini(
        "anygate_isolate",
        "run every test with fresh anygate gates and breakers",
        type="bool",
        default=False,
    )
    parser.addini(
        "anygate_instant_retries",
        "run every test with anygate.set_testing(True) (instant retries)",
        type="bool",
        default=False,
    )


@pytest.fixture(autouse=True)
def _anygate_per_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """Apply the ini options to every test (a no-op when both are off)."""
    isolate = bool(request.config.getini("anygate_isolate"))
    instant = bool(request.config.getini("anygate_instant_retries"))
    with isolated() if isolate else _nothing(), set_testing(True) if instant else _nothing():
        yield


@contextmanager
def _nothing() -> Iterator[None]:
    yield
