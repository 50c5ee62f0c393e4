"""The sample output in docs/simulate.md is what ``anygate simulate`` prints today (issue 28).

It went stale silently (``234s ... b1 c6`` where every Python printed ``235s ... b2 c5``).
The run is deterministic for a seed on every supported Python, so the page's block is
compared with a fresh run; ``ANYGATE_UPDATE_DOCS=1 pytest tests/test_docs_sample.py``
rewrites it after a change that moves the numbers.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parent.parent / "docs" / "simulate.md"
BLOCK = re.compile(
    r"(<!-- simulate-output:start -->\n```text\n)(.*?)(```\n<!-- simulate-output:end -->)",
    re.S,
)


def _fresh_output(capsys: pytest.CaptureFixture[str]) -> str:
    from anygate.cli import main

    assert main(["simulate", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    lines = [line.rstrip() for line in out.splitlines() if "of wall time" not in line]
    return "\n".join(lines).strip("\n") + "\n"


def test_the_simulate_page_shows_todays_output(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default run's report, as an 80-column terminal shows it, is the page's block."""
    pytest.importorskip("rich")
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setenv("TERM", "dumb")
    fresh = _fresh_output(capsys)
    text = PAGE.read_text(encoding="utf-8")
    match = BLOCK.search(text)
    assert match is not None, "docs/simulate.md lost its simulate-output markers"
    if os.environ.get("ANYGATE_UPDATE_DOCS") == "1":
        PAGE.write_text(BLOCK.sub(lambda m: m.group(1) + fresh + m.group(3), text), "utf-8")
        return
    assert match.group(2) == fresh, (
        "docs/simulate.md shows stale output; rerun with ANYGATE_UPDATE_DOCS=1 to refresh it"
    )
