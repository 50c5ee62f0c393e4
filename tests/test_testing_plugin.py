"""anygate.testing: the pytest plugin isolates process-wide gates and breakers per test.

Each case runs a small user test suite in a subprocess with only this plugin loaded (as the
``pytest11`` entry point would load it), so the outer suite's own isolation cannot help.
The user suite opens a shared breaker in its first test; the second test needs it closed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import anygate
import anygate.testing

SRC = Path(anygate.__file__).resolve().parent.parent

USER_TESTS = textwrap.dedent(
    """
    import anygate

    def test_a_outage_opens_the_breaker():
        breaker = anygate.shared_breaker("llm", failure_threshold=1)
        permit = breaker.acquire()
        permit.failure()
        assert breaker.state is anygate.BreakerState.OPEN
        anygate.shared_gate("llm", capacity=1).capacity = 0

    def test_b_next_test_starts_clean(request):
        {fixture_line}
        assert anygate.shared_breaker("llm").state is anygate.BreakerState.CLOSED
        assert anygate.shared_gate("llm").capacity != 0
        {testing_line}
    """
)


def _run(tmp_path: Path, ini: str = "", fixture: str | None = None, testing: bool = False) -> str:
    fixture_line = f"request.getfixturevalue({fixture!r})" if fixture else "pass"
    testing_line = "assert anygate.is_testing()" if testing else "assert not anygate.is_testing()"
    (tmp_path / "test_user.py").write_text(
        USER_TESTS.format(fixture_line=fixture_line, testing_line=testing_line)
    )
    (tmp_path / "pytest.ini").write_text(f"[pytest]\n{ini}\n")
    env = {**os.environ, "PYTHONPATH": str(SRC), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "anygate.testing", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.stdout + done.stderr


def test_without_isolation_state_leaks_between_tests(tmp_path: Path) -> None:
    """The problem the plugin solves: with the plugin inert, the second test fails."""
    out = _run(tmp_path)
    assert "1 failed, 1 passed" in out, out


def test_ini_option_isolates_every_test(tmp_path: Path) -> None:
    """``anygate_isolate = true``: every test starts from empty registries."""
    out = _run(tmp_path, ini="anygate_isolate = true")
    assert "2 passed" in out, out


def test_fixture_isolates_the_test_that_asks(tmp_path: Path) -> None:
    """The ``anygate_isolated`` fixture gives the test fresh registries."""
    out = _run(tmp_path, fixture="anygate_isolated")
    assert "2 passed" in out, out


def test_testing_fixture_also_makes_retries_instant(tmp_path: Path) -> None:
    """``anygate_testing`` isolates and turns testing mode on for the test only."""
    out = _run(tmp_path, fixture="anygate_testing", testing=True)
    assert "2 passed" in out, out


def test_instant_retries_ini_option(tmp_path: Path) -> None:
    """``anygate_instant_retries = true`` turns testing mode on in every test."""
    out = _run(tmp_path, ini="anygate_isolate = true\nanygate_instant_retries = true", testing=True)
    assert "2 passed" in out, out


def test_isolated_restores_the_previous_registries() -> None:
    """``isolated()`` hides existing shared objects inside and gives them back on exit."""
    outer = anygate.shared_gate("outer", capacity=3)
    with anygate.testing.isolated():
        inner = anygate.shared_gate("outer", capacity=5)
        assert inner is not outer
    assert anygate.shared_gate("outer") is outer
    assert anygate.testing.set_testing is anygate.set_testing


@pytest.mark.parametrize("name", anygate.testing.__all__)
def test_public_names_exist(name: str) -> None:
    """Every name in ``anygate.testing.__all__`` is importable."""
    assert getattr(anygate.testing, name) is not None
