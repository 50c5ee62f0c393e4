"""Validation helpers shared by the config objects and the YAML loader.

One :class:`Check` per audience: the Python API raises ``TypeError`` for a value of the
wrong *type* (the house rule for arguments) and :class:`anygate.ConfigError` for a bad
value; the file loader raises ``ConfigError`` for both, so a config file's every mistake
names its dotted key path. Messages say what is allowed and show the value:
``llm_call.busy_wait_s must be a finite number >= 0 or null (got -1)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from ._classify import Reason
from ._errors import ConfigError

__all__ = ["FILE", "PY", "Check"]


class Check:
    """Validation helpers; ``typed`` picks TypeError (Python API) or ConfigError (files)."""

    def __init__(self, *, typed: bool) -> None:
        self.typed = typed

    def bad_type(self, path: str, value: object, allowed: str) -> Exception:
        msg = f"{path} must be {allowed} (got {value!r} of type {type(value).__name__})"
        if self.typed:
            return TypeError(msg)
        return ConfigError(msg, path=path, value=value)

    @staticmethod
    def bad_value(path: str, value: object, allowed: str) -> ConfigError:
        return ConfigError(f"{path} must be {allowed} (got {value!r})", path=path, value=value)

    def integer(self, path: str, value: object, *, minimum: int, none: bool = False) -> int | None:
        if value is None and none:
            return None
        allowed = f"an integer >= {minimum}" + (" or null" if none else "")
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.bad_type(path, value, allowed)
        if value < minimum:
            raise self.bad_value(path, value, allowed)
        return value

    def number(
        self,
        path: str,
        value: object,
        *,
        minimum: float = 0.0,
        strict: bool = False,
        none: bool = False,
    ) -> float | None:
        if value is None and none:
            return None
        bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
        allowed = f"a finite number {bound}" + (" or null" if none else "")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.bad_type(path, value, allowed)
        if math.isnan(value) or math.isinf(value):
            raise self.bad_value(path, value, allowed)
        if value < minimum or (strict and value == minimum):
            raise self.bad_value(path, value, allowed)
        return float(value)

    def name(self, path: str, value: object, *, none: bool = False) -> str | None:
        if value is None and none:
            return None
        allowed = "a non-empty string" + (" or null" if none else "")
        if not isinstance(value, str):
            raise self.bad_type(path, value, allowed)
        if not value.strip():
            raise self.bad_value(path, value, allowed)
        return value

    def boolean(self, path: str, value: object) -> bool:
        if not isinstance(value, bool):
            raise self.bad_type(path, value, "true or false")
        return value

    def mapping(self, path: str, value: object) -> Mapping[Any, Any]:
        if not isinstance(value, Mapping):
            raise self.bad_type(path, value, "a mapping")
        return value

    def budgets(
        self, path: str, value: object, *, key_check: Callable[[str, object], str]
    ) -> Mapping[str, int]:
        items = self.mapping(path, value)
        out: dict[str, int] = {}
        for key, budget in items.items():
            name = key_check(f"{path}.{key}", key)
            parsed = self.integer(f"{path}.{name}", budget, minimum=1)
            assert parsed is not None
            out[name] = parsed
        return MappingProxyType(out)

    def reason_key(self, path: str, key: object) -> str:
        allowed = ", ".join(r.value for r in Reason)
        if not isinstance(key, str):
            raise self.bad_type(path, key, f"a reason ({allowed})")
        try:
            return Reason(key).value
        except ValueError:
            raise self.bad_value(path, key, f"a reason: one of {allowed}") from None

    def class_name(self, path: str, key: object) -> str:
        if not isinstance(key, str):
            raise self.bad_type(path, key, "an exception class name")
        if not key.isidentifier():
            raise self.bad_value(path, key, "an exception class name such as 'ReadTimeout'")
        return key

    def names(self, path: str, value: object) -> tuple[str, ...]:
        if isinstance(value, str) or not isinstance(value, Sequence):
            raise self.bad_type(path, value, "a list of exception class names")
        return tuple(self.class_name(f"{path}[{i}]", v) for i, v in enumerate(value))

    def fraction(self, path: str, value: object, *, none: bool = False) -> float | None:
        """A number strictly between 0 and 1 (a multiplier that must shrink)."""
        if value is None and none:
            return None
        allowed = "a number > 0 and < 1" + (" or null" if none else "")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.bad_type(path, value, allowed)
        if math.isnan(value) or not 0 < value < 1:
            raise self.bad_value(path, value, allowed)
        return float(value)


#: For the Python API (wrong types raise TypeError).
PY = Check(typed=True)
#: For config files and mappings (everything raises ConfigError).
FILE = Check(typed=False)
