"""Automation: `nox` runs tests (every Python found, every async backend), lint, typing, docs.

By default `nox` runs ``tests`` (every Python), ``processes`` (the multi-process tests,
once), ``lint``, ``typing`` and ``docs``. `nox -s bench` runs the benchmarks (not part of
the default run: they take minutes and their numbers only mean something on a quiet
machine). `nox -s soak` runs the million-operation soak (tests marked ``slow``, which the
default pytest run deselects). `nox -s reality` checks the simulator against real HTTP runs
(wall-clock bound, not in ``bench``)."""

from __future__ import annotations

import os

import nox

PYPROJECT = nox.project.load_toml("pyproject.toml")
PYTHONS = ["3.10", "3.11", "3.12", "3.13"]

nox.needs_version = ">=2025.2.9"
nox.options.default_venv_backend = "uv|virtualenv"
nox.options.sessions = ["tests", "processes", "oldest", "lint", "typing", "docs"]
# Interpreters that are not installed are skipped, not failures: a user's machine has
# whichever Pythons it has. (nox turns this on by itself under CI=true.)
nox.options.error_on_missing_interpreters = False
# uv would otherwise try to download a missing interpreter from the internet.
os.environ.setdefault("UV_PYTHON_DOWNLOADS", "never")


def _install(session: nox.Session, *groups: str, extras: str = "") -> None:
    deps: list[str] = []
    for group in groups:
        deps += nox.project.dependency_groups(PYPROJECT, group)
    session.install("-e", f".[{extras}]" if extras else ".", *deps)


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """The test suite on asyncio, asyncio+uvloop and trio (one pytest run covers all).

    Spread over every core (pytest-xdist). The tests that start fleets of processes or
    fresh interpreters run once, in ``processes``: on 2 cores they are a third of a run's
    time, and what they check (Redis, the OS, the simulator's hashing) is not what differs
    between Pythons; the in-process fleet and simulator tests still run on every one.
    """
    _install(session, "test", extras="all")
    session.run("pytest", "-n", "auto", "-m", "not slow and not processes", *session.posargs)


@nox.session
def processes(session: nox.Session) -> None:
    """The tests marked ``processes``, one at a time (they load every core themselves)."""
    _install(session, "test", extras="all")
    session.run("pytest", "-m", "processes and not slow", *session.posargs)


def _floor(requirement: str) -> str:
    """``name>=X`` (optionally with a marker) as ``name==X``: the oldest version allowed."""
    name, _, version = requirement.partition(">=")
    return f"{name.strip()}=={version.split(',')[0].split(';')[0].strip()}"


@nox.session
def oldest(session: nox.Session) -> None:
    """The gate's tests on the oldest anyio and trio that pyproject.toml allows.

    The uncontended acquire reads anyio's and trio's private cancellation state behind a
    guard (``anygate._gate.cancel_state``, ``docs/performance.md``); ``tests`` runs both the
    private path and its public fallback on the newest versions, this session on the
    floors. The versions come from the declared minimums, so raising one moves this too.
    """
    project = PYPROJECT["project"]
    anyio = next(r for r in project["dependencies"] if r.startswith("anyio"))
    trio = next(r for r in project["optional-dependencies"]["trio"] if r.startswith("trio"))
    deps = [
        d
        for d in nox.project.dependency_groups(PYPROJECT, "test")
        if d.startswith(("pytest", "hypothesis", "uvloop"))
    ]
    session.install("-e", ".", _floor(anyio), _floor(trio), *deps)
    session.run("python", "-c", "import anyio, trio; print('oldest: trio', trio.__version__)")
    session.run(
        "pytest", "-n", "auto", "-m", "not slow and not processes",
        "tests/test_cancel_state.py", "tests/test_gate_checkpoints.py", "tests/test_gate.py",
        "tests/test_gate_races.py", "tests/test_gate_regressions.py", "tests/test_gate_runtimes.py",
        "tests/test_gate_hotpath.py",
        *session.posargs,
    )  # fmt: skip


@nox.session
def lint(session: nox.Session) -> None:
    """ruff (lint and formatting), then import-linter (the contracts in pyproject.toml)."""
    _install(session, "lint")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    # PYTHONPATH: grimp reads the sources of this checkout.
    session.run("lint-imports", "--no-cache", env={"PYTHONPATH": "src"})


@nox.session
def typing(session: nox.Session) -> None:
    """mypy --strict and pyright over the package and tests/typing, then pyright --verifytypes."""
    _install(session, "typing", extras="all")
    session.run("mypy")
    # --verifytypes only inspects the installed package's public symbols; this plain run is
    # what type-checks tests/typing/api.py (the API contract) with pyright too.
    session.run("pyright")
    session.run("pyright", "--verifytypes", "anygate", "--ignoreexternal")


@nox.session
def docs(session: nox.Session) -> None:
    """Build the Sphinx docs with warnings as errors."""
    _install(session, "docs", extras="all")
    session.run("sphinx-build", "-W", "--keep-going", "-b", "html", "docs", "docs/_build/html")


@nox.session
def soak(session: nox.Session) -> None:
    """The slow soak: 1,000,000 operations on shared gates and breakers from every runtime.

    ``ANYGATE_SOAK_OPS`` scales it (``ANYGATE_SOAK_OPS=100000 nox -s soak``).
    """
    _install(session, "test", extras="all")
    session.run("pytest", "-m", "slow", "-s", "tests/test_soak.py", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """Run every benchmark script; each prints ratios against baselines from the same run."""
    _install(session, "test", extras="all")
    # The peers bench_policy.py compares Policy.call with; not dependencies of anygate.
    session.install("stamina", "tenacity")
    scripts = session.posargs or sorted(
        f"benchmarks/{name}" for name in os.listdir("benchmarks") if name.startswith("bench_")
    )
    for script in scripts:
        session.run("python", script)


@nox.session
def reality(session: nox.Session) -> None:
    """The simulator's reality check: one token-limited scenario simulated and run for real.

    The real openai SDK (through ``anygate.httpx2.GatedTransport``, and two peers) against
    the simulator's provider served over HTTP on 127.0.0.1, with time scaled down
    (``benchmarks/reality_check.py``; ``nox -s reality -- --scale 20 --reps 1``). Wall-clock
    bound, a few minutes, and noisy on a loaded machine: not part of ``bench`` or ``tests``.
    """
    _install(session, "test", extras="all")
    session.install("tenacity")  # the cookbook peer's retry library
    session.run("python", "benchmarks/reality_check.py", *session.posargs)
