"""The documentation's Python examples run as written, and the docs cover the public API.

Every fenced block whose info string is ``python`` (or ``py``) in ``docs/*.md`` is executed.
The blocks of one page run in order, in one fresh ``__main__`` namespace, so a page reads as
one program: later blocks use names that earlier blocks defined. Each block is compiled with
the page's path and its real line numbers, so a failing example's traceback points into the
Markdown file. Pages run in an empty temporary working directory (an example that needs a file,
such as a YAML config, writes it first, which also keeps it self-contained for readers) with
the suite's warnings-as-errors filter and per-test timeout.

Opting a block out (for a snippet that needs a running server, real credentials, or is a
deliberate fragment): put this HTML comment on the line right before its opening fence::

    <!-- docs-test: skip -->
    <!-- docs-test: skip: needs a running model server -->

The comment is invisible in the rendered page (Sphinx/MyST and GitHub both drop it). A skipped
block is still compiled (top-level ``await`` allowed), so it cannot rot into a syntax error.
A marker that is misspelt or not followed by a Python block fails the suite, as does a Python
block hidden inside a backtick directive fence (e.g. ````` ````{note} `````), where it would
silently never run: use a ``:::`` colon fence for admonitions around examples.
"""

from __future__ import annotations

import ast
import fnmatch
import re
import sys
import traceback
import types
from dataclasses import dataclass
from pathlib import Path

import pytest

import anygate

DOCS = Path(__file__).resolve().parent.parent / "docs"
PAGES = sorted(DOCS.glob("*.md"))

_PYTHON = {"python", "py", "python3"}
_LITERAL_DIRECTIVES = {"{code-block}", "{code}", "{sourcecode}"}
_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*(?P<body>.*?)\s*-->\s*$")
_SKIP = re.compile(r"^skip(?::\s*\S.*)?$")
# autodoc directives emit reStructuredText, so in MyST pages they live in ```{eval-rst} blocks.
_AUTODOC = re.compile(
    r"^\s*\.\. auto(?:class|function|exception|data)::\s+(?P<name>anygate\.[\w.]+)", re.MULTILINE
)


class DocsSyntaxError(Exception):
    """Raised when a page's fences or docs-test markers are malformed."""


@dataclass(frozen=True)
class Block:
    """One Python example: its source, the 1-based line of its first code line, and skip."""

    source: str
    line: int
    skip: bool


def extract_blocks(text: str, where: str) -> list[Block]:
    """Python blocks of a Markdown page, in order, with their docs-test markers applied."""
    blocks: list[Block] = []
    lines = text.splitlines()
    pending_marker: tuple[int, str] | None = None  # (line number, body) awaiting its fence
    i = 0
    while i < len(lines):
        line = lines[i]
        marker = _MARKER.match(line)
        if marker:
            body = marker.group("body")
            if not _SKIP.match(body):
                msg = f"{where}:{i + 1}: unknown docs-test marker {body!r} (expected 'skip' or 'skip: reason')"
                raise DocsSyntaxError(msg)
            pending_marker = (i + 1, body)
            i += 1
            continue
        opening = _FENCE.match(line)
        if not opening:
            if line.strip() and pending_marker is not None:
                msg = f"{where}:{pending_marker[0]}: docs-test marker is not directly followed by a ```python block"
                raise DocsSyntaxError(msg)
            i += 1
            continue
        indent = len(opening.group("indent"))
        fence = opening.group("fence")
        info = opening.group("info").strip()
        language = info.split()[0] if info else ""
        body_lines: list[str] = []
        i += 1
        while i < len(lines):
            closing = _FENCE.match(lines[i])
            if (
                closing
                and closing.group("fence")[0] == fence[0]
                and len(closing.group("fence")) >= len(fence)
                and not closing.group("info").strip()
            ):
                break
            body_lines.append(lines[i])
            i += 1
        else:
            msg = f"{where}:{i}: unclosed code fence {fence}{info}"
            raise DocsSyntaxError(msg)
        first_code_line = i - len(body_lines) + 1
        i += 1  # past the closing fence
        if language in _PYTHON:
            source = "\n".join(_strip_indent(body, indent) for body in body_lines)
            blocks.append(Block(source + "\n", first_code_line, skip=pending_marker is not None))
        else:
            if pending_marker is not None:
                msg = f"{where}:{pending_marker[0]}: docs-test marker precedes a {language or 'plain'!r} block, not a Python one"
                raise DocsSyntaxError(msg)
            # A directive such as ```{note} parses its content as Markdown, where a python
            # fence would render but never run; a ```markdown block is literal text.
            directive = language.startswith("{") and language not in _LITERAL_DIRECTIVES
            for offset, inner in enumerate(body_lines if directive else []):
                nested = _FENCE.match(inner)
                if nested and (nested.group("info").strip().split() or [""])[0] in _PYTHON:
                    msg = (
                        f"{where}:{first_code_line + offset}: a Python block nested in a "
                        f"{fence}{info} fence would never run; wrap examples in ::: fences"
                    )
                    raise DocsSyntaxError(msg)
            words = info.split()
            if language in _LITERAL_DIRECTIVES and words[1:] and words[1] in _PYTHON:
                msg = f"{where}:{first_code_line - 1}: write runnable examples as ```python, not {info}"
                raise DocsSyntaxError(msg)
        pending_marker = None
    if pending_marker is not None:
        msg = f"{where}:{pending_marker[0]}: docs-test marker at the end of the page"
        raise DocsSyntaxError(msg)
    return blocks


def _strip_indent(line: str, indent: int) -> str:
    # A fence indented inside a list item indents its content by the same amount.
    prefix = len(line) - len(line.lstrip(" "))
    return line[min(prefix, indent) :]


def _compile(block: Block, filename: str) -> types.CodeType:
    # Leading newlines make the code's line numbers those of the Markdown file.
    flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT if block.skip else 0
    return compile("\n" * (block.line - 1) + block.source, filename, "exec", flags=flags)


def _pages_with_examples() -> list[Path]:
    pages = []
    for page in PAGES:
        try:
            if not extract_blocks(page.read_text("utf-8"), page.name):
                continue
        except DocsSyntaxError:
            pass  # keep it: the test reports the error for this page alone
        pages.append(page)
    return pages


# Pages whose examples need a library that some supported Pythons cannot install: the
# [langchain] extra installs nothing on 3.10 (current LangChain needs 3.11). Skipped, with
# the reason, where it is missing; everywhere else they run.
_PAGE_NEEDS = {"integrations-langchain.md": "langchain"}


@pytest.mark.parametrize("page", _pages_with_examples(), ids=lambda page: page.name)
def test_examples_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every runnable Python block of the page executes without error, in order, as one script.

    Skipped blocks are compiled, not run. The page's output is left to pytest's capture.
    """
    blocks = extract_blocks(page.read_text("utf-8"), page.name)
    if page.name in _PAGE_NEEDS:
        need = _PAGE_NEEDS[page.name]
        pytest.importorskip(need, reason=f"{page.name}'s examples need {need} (Python 3.11+)")
    module = types.ModuleType("__main__")
    module.__file__ = str(page)
    # A fresh __main__ for the page, as `python page.py` would have (runpy does the same swap).
    monkeypatch.setitem(sys.modules, "__main__", module)
    monkeypatch.chdir(tmp_path)
    for block in blocks:
        code = _compile(block, str(page))
        if not block.skip:
            exec(code, module.__dict__)


def test_owned_pages_have_runnable_examples() -> None:
    """The guide pages really contain examples, so the execution test cannot pass vacuously."""
    for name in ("getting-started.md", "gate.md"):
        page = DOCS / name
        blocks = [b for b in extract_blocks(page.read_text("utf-8"), name) if not b.skip]
        assert len(blocks) >= 3, f"{name} has only {len(blocks)} runnable examples"


def test_extract_blocks_honours_fences_and_markers() -> None:
    """The extractor finds python blocks with their real line numbers, skip markers and indent."""
    text = "\n".join(
        [
            "# Title",  # 1
            "```python",  # 2
            "a = 1",  # 3
            "```",  # 4
            "<!-- docs-test: skip: needs a server -->",  # 5
            "```py",  # 6
            "await serve()",  # 7
            "```",  # 8
            "````markdown",  # 9
            "```",  # 10: too short to close the four-backtick fence
            "````",  # 11
            "- item",  # 12
            "  ```python",  # 13
            "  b = a + 1",  # 14
            "  ```",  # 15
            "```sh",  # 16
            "echo not python",  # 17
            "```",  # 18
            "````markdown",  # 19: literal text, its python fence is an illustration
            "```python",  # 20
            "not_run()",  # 21
            "```",  # 22
            "````",  # 23
        ]
    )
    blocks = extract_blocks(text, "sample.md")
    assert blocks == [
        Block("a = 1\n", 3, skip=False),
        Block("await serve()\n", 7, skip=True),
        Block("b = a + 1\n", 14, skip=False),
    ]


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("<!-- docs-test: skipp -->\n```python\nx = 1\n```\n", "unknown docs-test marker"),
        ("<!-- docs-test: skip -->\nprose\n```python\nx = 1\n```\n", "not directly followed"),
        ("<!-- docs-test: skip -->\n```yaml\nx: 1\n```\n", "not a Python one"),
        ("text\n<!-- docs-test: skip -->\n", "end of the page"),
        ("````{note}\n```python\nx = 1\n```\n````\n", "would never run"),
        ("```{code-block} python\nx = 1\n```\n", "not {code-block} python"),
        ("```python\nx = 1\n", "unclosed code fence"),
    ],
    ids=["typo", "stray", "wrong-language", "dangling", "nested", "code-block", "unclosed"],
)
def test_extract_blocks_rejects_mistakes(text: str, complaint: str) -> None:
    """Markers and fences that would silently skip or mis-run an example are errors."""
    with pytest.raises(DocsSyntaxError, match=re.escape(complaint)):
        extract_blocks(text, "sample.md")


def test_failing_example_points_into_the_markdown() -> None:
    """A failing block's traceback names the page and the block's real line number."""
    (block,) = extract_blocks("intro\n\n```python\nx = 1\nraise ValueError(x)\n```\n", "p.md")
    with pytest.raises(ValueError) as info:
        exec(_compile(block, "p.md"), {})
    frame = traceback.extract_tb(info.value.__traceback__)[-1]
    assert (frame.filename, frame.lineno) == ("p.md", 5)


def test_every_public_name_is_in_the_api_reference() -> None:
    """Each name in anygate.__all__ has exactly one autodoc entry across the docs pages."""
    documented: dict[str, int] = {}
    for page in PAGES:
        for match in _AUTODOC.finditer(page.read_text("utf-8")):
            name = match.group("name")
            documented[name] = documented.get(name, 0) + 1
    expected = {f"anygate.{name}" for name in anygate.__all__}
    missing = sorted(expected - documented.keys())
    assert not missing, f"public names without an autodoc entry in docs/*.md: {missing}"
    twice = sorted(name for name, count in documented.items() if count > 1)
    assert not twice, f"documented more than once (Sphinx rejects duplicates): {twice}"


def test_every_page_is_in_a_toctree() -> None:
    """Each docs page is reachable from the index's toctrees, and every entry exists."""
    index = (DOCS / "index.md").read_text("utf-8")
    entries: list[str] = []
    for tree in re.finditer(r"^```\{toctree\}\n(?P<body>.*?)^```$", index, re.M | re.S):
        entries += [
            line.strip()
            for line in tree.group("body").splitlines()
            if line.strip() and not line.startswith(":")
        ]
    stems = {page.stem for page in PAGES} - {"index"}
    reached = {stem for stem in stems if any(fnmatch.fnmatch(stem, entry) for entry in entries)}
    assert reached == stems, f"pages missing from every toctree: {sorted(stems - reached)}"
    dangling = [e for e in entries if not any(fnmatch.fnmatch(s, e) for s in stems)]
    assert not dangling, f"toctree entries without a page: {dangling}"
