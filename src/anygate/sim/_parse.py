"""Scenario files: YAML (or a mapping) -> validated :mod:`._spec` value objects.

Every key is optional except where a default would be meaningless; unknown keys, wrong
types and out-of-range values raise :class:`anygate.ConfigError` naming the dotted key
path, the value and what is allowed, exactly like the policy's own config loader.

This module only validates shapes and ranges. It does not build workloads or run anything,
and it does not validate a strategy's *policy* mapping: that is the policy's own loader's
job (``anygate.Policy.from_config``), called when the strategy is built.

The scenario as a whole, its fleet, published limits and strategies, and the file reader
are here; the provider section (the simulated provider's rules, the largest) is
:mod:`._parse_provider`'s, and the checks every section uses (keys, numbers, integers,
booleans, durations, each naming its key path) are :mod:`._parse_values`'.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import ConfigError
from .._yaml import parse_yaml
from ._parse_provider import parse_provider
from ._parse_values import (
    as_mapping,
    boolean,
    check_keys,
    fail,
    integer,
    join,
    lognormal,
    number,
    optional_int,
)
from ._spec import (
    BUILTIN_STRATEGIES,
    FanOut,
    FleetSpec,
    Lognormal,
    NaiveSpec,
    Published,
    Scenario,
    StrategySpec,
    TokenSpec,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

#: Built-in strategies configured by a policy mapping (the rest take no settings).
_POLICY_BUILTINS = ("seed", "anygate")

__all__ = ["load_yaml", "parse_scenario", "parse_strategy"]


# ---------------------------------------------------------------------- section parsers


def _published(value: object, path: str) -> Published:
    data = as_mapping({} if value is None else value, path)
    check_keys(data, path, ("rpm", "concurrency", "tpm", "itpm", "otpm"))
    return Published(
        rpm=optional_int(data, "rpm", path, minimum=1),
        concurrency=optional_int(data, "concurrency", path, minimum=1),
        tpm=optional_int(data, "tpm", path, minimum=1),
        itpm=optional_int(data, "itpm", path, minimum=1),
        otpm=optional_int(data, "otpm", path, minimum=1),
    )


def _size(value: object, path: str, default: Lognormal) -> Lognormal:
    """A token count: a bare number, or ``{median, sigma, min, max}`` (lognormal)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return Lognormal(median_s=number({"v": value}, "v", path, 0.0, minimum=1.0))
    data = as_mapping(value, path)
    check_keys(data, path, ("median", "sigma", "min", "max"))
    low = number(data, "min", path, 1.0, minimum=1.0)
    high = number(data, "max", path, math.inf, allow_inf=True)
    if high < low:
        raise fail(join(path, "max"), high, f">= min ({low:g})")
    return Lognormal(
        median_s=number(data, "median", path, default.median_s, minimum=1.0),
        sigma=number(data, "sigma", path, 0.0),
        min_s=low,
        max_s=high,
    )


def _tokens(value: object, path: str) -> TokenSpec | None:
    if value is None:
        return None
    data = as_mapping(value, path)
    check_keys(data, path, ("prompt", "completion", "max_tokens", "grow"))
    for key in ("prompt", "max_tokens"):
        if key not in data:
            raise fail(join(path, key), None, "set when fleet.tokens is")
    max_tokens = integer(data, "max_tokens", path, 1, minimum=1)
    half = Lognormal(median_s=max(1.0, max_tokens / 2))
    return TokenSpec(
        prompt=_size(data["prompt"], join(path, "prompt"), Lognormal(median_s=1000.0)),
        completion=_size(data.get("completion", {}), join(path, "completion"), half),
        max_tokens=max_tokens,
        grow=boolean(data, "grow", path, False),
    )


def _fanout(value: object, path: str, calls_per_agent: int) -> FanOut | None:
    if value is None:
        return None
    data = as_mapping(value, path)
    check_keys(data, path, ("after_call", "subagents", "calls"))
    after = integer(data, "after_call", path, 1, minimum=1)
    if after > calls_per_agent:
        raise fail(join(path, "after_call"), after, f"<= calls_per_agent ({calls_per_agent})")
    return FanOut(
        after_call=after,
        subagents=integer(data, "subagents", path, 3, minimum=1),
        calls=integer(data, "calls", path, 2, minimum=1),
    )


def _fleet(value: object, path: str) -> FleetSpec:
    base = FleetSpec()
    data = as_mapping({} if value is None else value, path)
    check_keys(
        data,
        path,
        (
            "agents",
            "ramp_s",
            "start_jitter_s",
            "calls_per_agent",
            "think",
            "fanout",
            "call_deadline_s",
            "on_failure",
            "tokens",
        ),
    )
    on_failure = data.get("on_failure", base.on_failure)
    if on_failure not in ("stop", "continue"):
        raise fail(join(path, "on_failure"), on_failure, '"stop" or "continue"')
    calls = integer(data, "calls_per_agent", path, base.calls_per_agent, minimum=1)
    think = data.get("think")
    deadline = data.get("call_deadline_s")
    return FleetSpec(
        agents=integer(data, "agents", path, base.agents, minimum=1),
        ramp_s=number(data, "ramp_s", path, base.ramp_s),
        start_jitter_s=number(data, "start_jitter_s", path, base.start_jitter_s),
        calls_per_agent=calls,
        think=None
        if think is None
        else lognormal(think, join(path, "think"), Lognormal(median_s=1.0)),
        fanout=_fanout(data.get("fanout"), join(path, "fanout"), calls),
        call_deadline_s=None
        if deadline is None
        else number(data, "call_deadline_s", path, 0.0, strict=True),
        on_failure=on_failure,
        tokens=_tokens(data.get("tokens"), join(path, "tokens")),
    )


def _naive(value: object, path: str) -> NaiveSpec:
    base = NaiveSpec()
    data = as_mapping({} if value is None else value, path)
    check_keys(data, path, ("base_delay_s", "factor", "max_delay_s", "max_attempts"))
    return NaiveSpec(
        base_delay_s=number(data, "base_delay_s", path, base.base_delay_s),
        factor=number(data, "factor", path, base.factor, minimum=1.0),
        max_delay_s=number(data, "max_delay_s", path, base.max_delay_s),
        max_attempts=integer(data, "max_attempts", path, base.max_attempts, minimum=1),
    )


def parse_strategy(name: str, value: object, path: str, *, base_dir: Path | None) -> StrategySpec:
    """One ``strategies.<name>`` entry: ``{naive: {...}}``, ``{policy: mapping-or-path}`` or
    ``{factory: "module:attribute"}``.

    A ``policy`` given as a string is a path to a policy YAML file, relative to
    ``base_dir`` (the scenario file's directory). The file is read here; its *contents* are
    validated later by the policy's loader. A ``factory`` is imported when the run starts.

    Raises:
        ConfigError: unknown keys, not exactly one kind, an unreadable file, settings for a
            built-in peer.
    """
    data = as_mapping({} if value is None else value, path)
    check_keys(data, path, ("naive", "policy", "factory"))
    kinds = [key for key in ("naive", "policy", "factory") if key in data]
    if len(kinds) > 1:
        raise fail(
            path, dict(data), "exactly one of {naive: ...}, {policy: ...}, {factory: ...}, not both"
        )
    builtin = name in BUILTIN_STRATEGIES
    if builtin and name not in (*_POLICY_BUILTINS, "naive"):
        if data:
            raise fail(path, dict(data), f"empty: {name!r} is a built-in peer with fixed settings")
        return StrategySpec(name=name)
    if "factory" in data:
        if builtin:
            raise fail(join(path, "factory"), data["factory"], f"absent: {name!r} is built in")
        factory = data["factory"]
        if not isinstance(factory, str) or factory.count(":") != 1 or factory.startswith(":"):
            raise fail(join(path, "factory"), factory, 'a "module:attribute" string')
        return StrategySpec(name=name, factory=factory, source=factory)
    if "naive" in data:
        if name in _POLICY_BUILTINS:
            raise fail(join(path, "naive"), data["naive"], f"absent: {name!r} is a policy strategy")
        return StrategySpec(name=name, naive=_naive(data["naive"], join(path, "naive")))
    if name == "naive":
        if data:
            raise fail(path, dict(data), "{naive: {...}} for the built-in naive strategy")
        return StrategySpec(name=name, naive=NaiveSpec())
    raw = data.get("policy")
    if raw is None and name not in _POLICY_BUILTINS:
        raise fail(path, dict(data), "{naive: {...}}, {policy: mapping or path} or {factory: ...}")
    if isinstance(raw, str):
        file = Path(raw) if base_dir is None else base_dir / raw
        return StrategySpec(
            name=name, policy=load_yaml(file, join(path, "policy")), replace=True, source=str(file)
        )
    policy = as_mapping({} if raw is None else raw, join(path, "policy"))
    # A custom strategy's mapping is complete; for seed/anygate it overrides the built-in.
    return StrategySpec(name=name, policy=policy, replace=name not in _POLICY_BUILTINS)


def _strategies(value: object, path: str, base_dir: Path | None) -> tuple[StrategySpec, ...]:
    if value is None:
        return ()
    data = as_mapping(value, path)
    return tuple(
        parse_strategy(name, item, join(path, name), base_dir=base_dir)
        for name, item in data.items()
    )


def load_yaml(file: Path, path: str = "") -> Mapping[str, Any]:
    """Read a YAML mapping with the safe loader.

    Raises:
        ConfigError: the file is missing, unreadable, not YAML, or not a mapping.
    """
    try:
        import yaml
    except ImportError as exc:  # pragma: no cover - PyYAML is in the cli extra
        msg = "reading YAML needs PyYAML: pip install 'anygate[cli]'"
        raise ConfigError(msg, path=path, value=str(file)) from exc
    try:
        text = file.read_text(encoding="utf-8")
        data = parse_yaml(text, str(file))  # the config reader's YAML (issue 28)
    except OSError as exc:
        msg = f"{path or 'file'}: cannot read {str(file)!r}: {exc.strerror or exc}"
        raise ConfigError(msg, path=path, value=str(file)) from exc
    except yaml.YAMLError as exc:
        msg = f"{path or 'file'}: {str(file)!r} is not valid YAML: {exc}"
        raise ConfigError(msg, path=path, value=str(file)) from exc
    return as_mapping({} if data is None else data, path or str(file))


def parse_scenario(data: object, *, base_dir: Path | None = None) -> Scenario:
    """Validate a scenario mapping (the parsed YAML) into a :class:`Scenario`.

    Args:
        data: the mapping.
        base_dir: directory that relative policy file paths are resolved against.

    Raises:
        ConfigError: naming the key path, the value and what is allowed.
    """
    top = as_mapping(data, "scenario")
    check_keys(
        top,
        "",
        (
            "name",
            "description",
            "seed",
            "time_limit_s",
            "provider",
            "fleet",
            "published",
            "strategies",
        ),
    )
    name = top.get("name", "unnamed")
    if not isinstance(name, str) or not name:
        raise fail("name", name, "a non-empty string")
    description = top.get("description", "")
    if not isinstance(description, str):
        raise fail("description", description, "a string")
    provider = parse_provider(top.get("provider"), "provider")
    fleet = _fleet(top.get("fleet"), "fleet")
    limits = provider.tokens
    if limits is not None and fleet.tokens is None and (limits.tpm or limits.itpm or limits.otpm):
        raise fail(
            "fleet.tokens", None, "set when provider.tokens limits tokens (calls need sizes)"
        )
    return Scenario(
        name=name,
        description=" ".join(description.split()),
        seed=integer(top, "seed", "", 1, minimum=0),
        time_limit_s=number(top, "time_limit_s", "", 3600.0, strict=True),
        provider=provider,
        fleet=fleet,
        published=_published(top.get("published"), "published"),
        strategies=_strategies(top.get("strategies"), "strategies", base_dir),
    )
