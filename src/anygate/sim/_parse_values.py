"""Scenario-file checks shared by every section: keys, numbers, integers, flags, durations.

Each reads one value (or the keys of one mapping) at a dotted key path and returns it
checked, or raises :class:`anygate.ConfigError` naming the path, the value and what is
allowed, in the words of the policy's own config loader. They know no section: what a
key means and which keys a section takes is :mod:`._parse`'s and
:mod:`._parse_provider`'s.

Split out of ``_parse`` so that both section modules use one set of checks (and one
wording of refusals).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .. import ConfigError
from ._spec import Lognormal

__all__ = [
    "as_mapping",
    "boolean",
    "check_keys",
    "fail",
    "integer",
    "join",
    "lognormal",
    "number",
    "optional_int",
]


def fail(path: str, value: object, allowed: str) -> ConfigError:
    msg = f"{path} must be {allowed} (got {value!r})"
    return ConfigError(msg, path=path, value=value)


def as_mapping(value: object, path: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise fail(path, value, "a mapping")
    for key in value:
        if not isinstance(key, str):
            raise fail(f"{path}.<key>", key, "a string key")
    return value


def check_keys(data: Mapping[str, Any], path: str, allowed: tuple[str, ...]) -> None:
    for key in data:
        if key not in allowed:
            where = f"{path}.{key}" if path else key
            msg = f"{where} is not a known key (allowed here: {', '.join(allowed)})"
            raise ConfigError(msg, path=where, value=data[key])


def join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def number(
    data: Mapping[str, Any],
    key: str,
    path: str,
    default: float,
    *,
    minimum: float = 0.0,
    strict: bool = False,
    allow_inf: bool = False,
) -> float:
    where = join(path, key)
    value = data.get(key, default)
    bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise fail(where, value, f"a number {bound}")
    value = float(value)
    if math.isnan(value) or (math.isinf(value) and not allow_inf):
        raise fail(where, value, f"a finite number {bound}")
    if value < minimum or (strict and value == minimum):
        raise fail(where, value, f"a number {bound}")
    return value


def integer(data: Mapping[str, Any], key: str, path: str, default: int, *, minimum: int) -> int:
    where = join(path, key)
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise fail(where, value, f"an integer >= {minimum}")
    if value < minimum:
        raise fail(where, value, f"an integer >= {minimum}")
    return value


def optional_int(data: Mapping[str, Any], key: str, path: str, *, minimum: int) -> int | None:
    # 0 and null both mean "no limit", as max_concurrent_calls: 0 does in the policy config.
    value = data.get(key)
    if value is None or (type(value) is int and value == 0):
        return None
    return integer(data, key, path, 0, minimum=minimum)


def boolean(data: Mapping[str, Any], key: str, path: str, default: bool) -> bool:
    value = data.get(key, default)
    if not isinstance(value, bool):
        raise fail(join(path, key), value, "true or false")
    return value


def lognormal(value: object, path: str, default: Lognormal) -> Lognormal:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        # A bare number is a constant duration.
        return Lognormal(median_s=number({"v": value}, "v", path, 0.0))
    data = as_mapping(value, path)
    check_keys(data, path, ("median_s", "sigma", "min_s", "max_s"))
    median = number(data, "median_s", path, default.median_s)
    sigma = number(data, "sigma", path, default.sigma)
    low = number(data, "min_s", path, default.min_s)
    high = number(data, "max_s", path, default.max_s, allow_inf=True)
    if high < low:
        raise fail(join(path, "max_s"), high, f">= min_s ({low:g})")
    return Lognormal(median_s=median, sigma=sigma, min_s=low, max_s=high)
