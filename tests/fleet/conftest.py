"""Fleet fixtures: a real redis-server on 127.0.0.1, started by the tests themselves.

Skipped with the reason when redis-server cannot be started here; under ``CI=true`` that
is a failure instead (CI installs redis-server, see ``.ci/run``).
"""

from __future__ import annotations

import gc
import hashlib
import os
from typing import TYPE_CHECKING, NoReturn

import pytest

from .redis_proc import RedisProc, RedisUnavailable

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

pytest.importorskip("coredis", reason="the fleet gate needs coredis (pip install anygate[redis])")

# coredis 6.9 leaves the internal streams of a connection attempt that failed unclosed (a
# ResourceWarning when collected, in whichever thread and test the collector runs). The
# agent avoids most such attempts while Redis is down by probing with a plain socket first,
# not all of them; the fixtures below collect garbage before the filter goes away.
_COREDIS_LEAK = "ignore:Unclosed <MemoryObject:ResourceWarning"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = os.path.dirname(__file__)
    # The soaks (20 s, two network namespaces) stay out of the default run: select them
    # with `-m slow`.
    wanted = "slow" in (config.option.markexpr or "")
    skip = pytest.mark.skip(reason="slow soak; run with -m slow")
    for item in items:
        if str(item.path).startswith(here):
            item.add_marker(pytest.mark.filterwarnings(_COREDIS_LEAK))
            if "slow" in item.keywords and not wanted:
                item.add_marker(skip)


def _unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true and redis-server cannot be started: {reason}")
    pytest.skip(f"redis-server cannot be started here: {reason}")


def _started() -> RedisProc:
    """A started server, or the test skipped (failed under ``CI=true``). A server that
    exits at its start is tried again on another port, twice: its free port is picked
    before redis binds it, and another worker's connection can take it in between (seen
    once in a CI run: "redis-server exited with 1")."""
    reason = ""
    for _ in range(3):
        try:
            server = RedisProc()
        except RedisUnavailable as exc:
            _unavailable(str(exc))
        try:
            server.start()
        except RedisUnavailable as exc:
            server.close()
            reason = str(exc)
            continue
        return server
    _unavailable(reason)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisProc]:
    """One redis-server for the whole session (tests use distinct gate names)."""
    server = _started()
    yield server
    server.close()


@pytest.fixture
def redis_factory() -> Iterator[Callable[[], RedisProc]]:
    """Dedicated servers for tests that kill and restart Redis; all stopped afterwards."""
    started: list[RedisProc] = []

    def make() -> RedisProc:
        server = _started()
        started.append(server)
        return server

    yield make
    for server in started:
        server.close()
    gc.collect()


@pytest.fixture
def gate_name(request: pytest.FixtureRequest) -> str:
    """A gate name unique to the test (and backend), so tests never share fleet state."""
    digest = hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:10]
    return "t-" + "".join(c if c.isalnum() else "-" for c in request.node.name)[:40] + digest
