"""``anygate check-config``'s stricter reading of a config file: every error, not the first.

:func:`anygate.load_config` stops at the first problem, which suits a program starting up.
A person checking a file wants the whole list. This module reads the YAML with the reader
``load_config`` uses (``anygate._yaml``: duplicate keys refused, YAML 1.2 numbers), then asks
:func:`load_config` repeatedly with the parsed mapping, setting aside each offending key
until the rest validates.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .._errors import ConfigError
from .._yaml import read_yaml_file
from .loader import load_config

if TYPE_CHECKING:
    from .policy_config import PolicyConfig

__all__ = ["check_file"]

# A runaway guard: each round removes one key, and real files have a few dozen at most.
_MAX_ROUNDS = 200
_SEGMENT = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def _remove(data: Any, path: str) -> bool:
    """Delete the value at dotted ``path`` (``a.b[2].c``) from ``data``; False if absent."""
    parts: list[str | int] = [
        name if name else int(index) for name, index in _SEGMENT.findall(path)
    ]
    if not parts:
        return False
    node = data
    for part in parts[:-1]:
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):  # noqa: PERF203 - a short path, run once per error
            return False
    last = parts[-1]
    try:
        del node[last]
    except (KeyError, IndexError, TypeError):
        return False
    return True


def _parent(path: str) -> str:
    cut = max(path.rfind("."), path.rfind("["))
    return path[:cut] if cut > 0 else ""


def check_file(path: str) -> tuple[PolicyConfig | None, list[ConfigError]]:
    """Validate the config file at ``path``, collecting every error.

    Returns the config (``None`` when there were errors) and the errors in file order of
    discovery. An empty file is an error: it states nothing, and ``load_config`` would
    give the defaults for it.

    Raises:
        ImportError: PyYAML is missing.
    """
    try:
        data = read_yaml_file(path)
    except ConfigError as exc:
        return None, [exc]
    if data is None:
        msg = (
            f"config file {path!r} is empty: nothing to check (a policy config has "
            "llm_call: and/or circuit_breaker: sections; every key is optional)"
        )
        return None, [ConfigError(msg, path="", value=None)]
    if not isinstance(data, Mapping):
        msg = (
            f"config file {path!r} must be a mapping with sections llm_call, circuit_breaker "
            f"(got {type(data).__name__})"
        )
        return None, [ConfigError(msg, path="", value=data)]
    work = copy.deepcopy(data)
    errors: list[ConfigError] = []
    for _ in range(_MAX_ROUNDS):
        try:
            config = load_config(work)
        except ConfigError as exc:
            errors.append(exc)
            # Set the offending key aside and look again. A missing required key has no
            # value to remove: drop the entry that lacks it instead.
            where = exc.path
            while where and not _remove(work, where):
                where = _parent(where)
            if not where:
                break  # an error about the whole file: nothing further to learn
            continue
        return (None, errors) if errors else (config, [])
    return None, errors
