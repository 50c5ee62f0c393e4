"""The one YAML reader behind every config file: ``load_config``, ``Policy.from_config``,
``anygate check-config`` and ``anygate simulate``'s files (issue 28).

``yaml.safe_load`` alone lets two mistakes through silently, and the readers used to
disagree about them: a key given twice in one mapping (the last one wins, so a second
``llm_call:`` drops the first) and a number in exponent form without a dot or a signed
exponent (``1e3``), which YAML 1.1 reads as a *string*. This reader refuses the first,
naming the file and both lines, and reads the second as YAML 1.2 does, a float. It never
constructs anything but plain data (a subclass of ``yaml.SafeLoader``). An empty file is
each caller's to judge: a policy file must state something, a scenario may be all defaults.

A foundation module beside ``_validation`` (not in the config room) because the simulator,
which may use only the public API and the foundations, reads its files with it too.
"""

from __future__ import annotations

import functools
import re
from typing import IO, Any

from ._errors import ConfigError

__all__ = ["parse_yaml", "read_yaml_file"]

# YAML 1.2's core-schema floats that YAML 1.1 (PyYAML) leaves as strings: an exponent
# without a dot in the mantissa (1e3, .5e-3 is already 1.1) or without a sign (1.0e3).
# Only exponent forms: plain digits stay ints, and dotted decimals were floats already.
_FLOAT_1_2 = re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$")


def _yaml() -> Any:
    try:
        import yaml
    except ImportError as exc:
        msg = "reading YAML needs PyYAML: pip install 'anygate[yaml]'"
        raise ImportError(msg, name="yaml") from exc
    return yaml


@functools.cache
def _strict_loader() -> type:
    """The loader class, built once (on first use, so PyYAML stays optional)."""
    yaml = _yaml()

    class StrictLoader(yaml.SafeLoader):  # type: ignore[misc,name-defined]
        def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    first = seen[key]
                    msg = (
                        f"{key_node.start_mark.name}:{key_node.start_mark.line + 1}: "
                        f"duplicate key {key!r} (first at line {first.line + 1}); "
                        "YAML would silently keep the last"
                    )
                    raise ConfigError(msg, path=str(key), value=key)
                seen[key] = key_node.start_mark
            mapping: dict[Any, Any] = super().construct_mapping(node, deep=deep)
            return mapping

    # add_implicit_resolver copies the class's resolver table first, so SafeLoader itself
    # (and everyone else's yaml.safe_load) is unchanged.
    StrictLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_1_2, list("-+0123456789."))
    return StrictLoader


def parse_yaml(source: str | IO[str], origin: str) -> object:
    """Parse YAML text or a text stream strictly; ``None`` for an empty document.

    ``origin`` names the source in error messages (a file path, ``"--config"``).

    Raises:
        ImportError: PyYAML is missing (the message names the extra to install).
        ConfigError: a key given twice in one mapping (the message names
            ``origin:line`` and the first line).
        yaml.YAMLError: not valid YAML; callers word it for their context.
    """
    loader = _strict_loader()
    if isinstance(source, str):
        # PyYAML names a string source "<unicode string>" in its marks: name it ourselves.
        from io import StringIO

        stream = StringIO(source)
        stream.name = origin
        source = stream
    return _yaml().load(source, Loader=loader)


def read_yaml_file(path: str) -> object:
    """Read and parse the YAML file at ``path`` strictly; ``None`` for an empty document.

    Raises:
        ImportError: PyYAML is missing.
        ConfigError: unreadable file, invalid YAML (the message names the file, line and
            column), or a key given twice in one mapping.
    """
    yaml = _yaml()
    try:
        # A stream, not its text: PyYAML then names the file in its error marks.
        with open(path, encoding="utf-8") as fh:
            return parse_yaml(fh, path)
    except OSError as exc:
        msg = f"cannot read config file {path!r}: {exc.strerror or exc}"
        raise ConfigError(msg, path="", value=path) from exc
    except yaml.YAMLError as exc:
        msg = f"config file {path!r} is not valid YAML: {exc}"
        raise ConfigError(msg, path="", value=path) from exc
