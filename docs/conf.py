"""Sphinx configuration: MyST Markdown pages, the furo theme, an API reference from docstrings.

The build must work offline and treat every warning as an error (``sphinx-build -W``), so:
no intersphinx (it downloads inventories), no extension that fetches anything, and nothing
nitpicky about references to names outside anygate (without intersphinx they cannot resolve).
"""

from __future__ import annotations

import types
from typing import Any

import anygate

project = "anygate"
author = "anygate developers"
copyright = "2026, anygate developers"
release = anygate.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx_copybutton",  # a copy button on code blocks; pure JS, fetches nothing
]

# Copy commands without their prompts ("$ ", ">>> ", "... ") and skip output lines.
copybutton_prompt_text = r"\$ |>>> |\.\.\. "
copybutton_prompt_is_regexp = True
copybutton_only_copy_prompt_lines = False

root_doc = "index"
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "_static"]

# MyST: ::: fences for admonitions, definition lists, and anchors for `page.md#section` links.
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# Docstrings are Google style (Args/Returns/Raises/Attributes).
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# Render "Attributes:" as :ivar: fields of the class rather than separate attribute entries:
# exception attributes are set in __init__ and dataclass fields have no docstrings, so
# separate entries would either be missing or duplicate what autodoc emits.
napoleon_use_ivar = True
# Sphinx links each :ivar: name to *any* object of that name, so an event's `policy` field
# (a policy's name) becomes an ambiguous link to the transports' `policy` attributes. Those
# links would be wrong even when unambiguous; only the ambiguity warnings are silenced here,
# missing targets still fail the build.
suppress_warnings = ["ref.python"]

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
# Show `capacity=math.inf` as written, not the evaluated `inf`.
autodoc_preserve_defaults = True
autodoc_default_options = {"members": True}

html_theme = "furo"
html_static_path = ["_static"]
html_css_files = ["anygate.css"]
html_title = f"anygate {release}"

# Classes users obtain but never construct: their constructor only raises TypeError, so
# showing its (*args, **kwargs) signature would invite the call it refuses.
_NO_PUBLIC_CONSTRUCTOR = {"anygate.Token"}


def _hide_constructor_signature(
    app: Any,
    what: str,
    name: str,
    obj: Any,
    options: Any,
    signature: str | None,
    return_annotation: str | None,
) -> tuple[str, str | None] | None:
    if what == "class" and name in _NO_PUBLIC_CONSTRUCTOR:
        return "", None
    return None


def _describe_union_alias(
    app: Any, what: str, name: str, obj: Any, options: Any, lines: list[str]
) -> None:
    # A type alias such as `Event = A | B` has no docstring of its own; autodoc would show
    # the generic text of types.UnionType ("Represent a PEP 604 union type"). Say what the
    # alias stands for instead (autodoc already does this for Callable[...] aliases).
    if what == "data" and isinstance(obj, types.UnionType):
        members = " | ".join(
            f":class:`~{arg.__module__}.{arg.__qualname__}`" for arg in obj.__args__
        )
        lines[:] = [f"alias of {members}", "", *lines[_inherited_doc_length(obj) :]]


def _inherited_doc_length(obj: Any) -> int:
    doc = type(obj).__doc__ or ""
    return len(doc.strip().splitlines()) + 1 if doc else 0


def setup(app: Any) -> None:
    app.connect("autodoc-process-signature", _hide_constructor_signature)
    app.connect("autodoc-process-docstring", _describe_union_alias)
