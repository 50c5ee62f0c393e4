"""Packaging metadata a new user depends on: extras, entry points, URLs, the README's start."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
tomllib = pytest.importorskip("tomllib")  # Python 3.11+; the metadata is the same on 3.10
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]


def test_httpx2_extra_installs_on_every_supported_python() -> None:
    """openai 3.x installs httpx2 on Python 3.10, so the extra must not exclude it."""
    (requirement,) = PROJECT["optional-dependencies"]["httpx2"]
    assert "python_version" not in requirement
    assert requirement.startswith("httpx2>=2.12")


def test_pytest_plugin_entry_point_is_importable() -> None:
    """The ``pytest11`` entry point names a module that exists and defines the fixtures."""
    target = PROJECT["entry-points"]["pytest11"]["anygate"]
    module = importlib.import_module(target)
    assert hasattr(module, "anygate_isolated")
    assert hasattr(module, "pytest_addoption")


def test_project_urls_and_extras_listed() -> None:
    """The metadata has project URLs, and ``all`` pulls in every other extra."""
    assert {"Homepage", "Repository", "Issues", "Changelog"} <= set(PROJECT["urls"])
    extras = set(PROJECT["optional-dependencies"]) - {"all"}
    (everything,) = PROJECT["optional-dependencies"]["all"]
    listed = set(everything.split("[", 1)[1].rstrip("]").split(","))
    assert listed == extras


def test_readme_starts_with_the_two_setup_commands_then_install() -> None:
    """The two setup commands stay first; the install section follows them."""
    text = (ROOT / "README.md").read_text("utf-8")
    first_block = text.split("```sh\n", 1)[1].split("```", 1)[0]
    assert first_block.splitlines() == [
        "python3 -m venv .venv && .venv/bin/pip install -q -e '.[cli]' && .venv/bin/anygate simulate",
        "python3 -m venv .venv && .venv/bin/pip install -q 'nox[uv]' && .venv/bin/nox",
    ]
    assert text.index("## Installing the released package") < text.index("---")
    assert 'pip install "anygate[all]"' in text
