"""Scenario files: YAML (or a mapping) -> validated :mod:`._spec` value objects.

Every key is optional except where a default would be meaningless; unknown keys, wrong
types and out-of-range values raise :class:`anygate.ConfigError` naming the dotted key
path, the value and what is allowed, exactly like the policy's own config loader.

This module only validates shapes and ranges. It does not build workloads or run anything,
and it does not validate a strategy's *policy* mapping: that is the policy's own loader's
job (``anygate.Policy.from_config``), called when the strategy is built.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from .. import ConfigError
from .._yaml import parse_yaml
from ._spec import (
    BUILTIN_STRATEGIES,
    BurstRule,
    FanOut,
    FleetSpec,
    Lognormal,
    NaiveSpec,
    Outage,
    ProviderSpec,
    Published,
    Scenario,
    SharedPool,
    StrategySpec,
    TokenLimits,
    TokenSpec,
)

#: Built-in strategies configured by a policy mapping (the rest take no settings).
_POLICY_BUILTINS = ("seed", "anygate")

__all__ = ["load_yaml", "parse_scenario", "parse_strategy"]


# ---------------------------------------------------------------------- validation helpers


def _fail(path: str, value: object, allowed: str) -> ConfigError:
    msg = f"{path} must be {allowed} (got {value!r})"
    return ConfigError(msg, path=path, value=value)


def _mapping(value: object, path: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _fail(path, value, "a mapping")
    for key in value:
        if not isinstance(key, str):
            raise _fail(f"{path}.<key>", key, "a string key")
    return value


def _check_keys(data: Mapping[str, Any], path: str, allowed: tuple[str, ...]) -> None:
    for key in data:
        if key not in allowed:
            where = f"{path}.{key}" if path else key
            msg = f"{where} is not a known key (allowed here: {', '.join(allowed)})"
            raise ConfigError(msg, path=where, value=data[key])


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _number(
    data: Mapping[str, Any],
    key: str,
    path: str,
    default: float,
    *,
    minimum: float = 0.0,
    strict: bool = False,
    allow_inf: bool = False,
) -> float:
    where = _join(path, key)
    value = data.get(key, default)
    bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _fail(where, value, f"a number {bound}")
    value = float(value)
    if math.isnan(value) or (math.isinf(value) and not allow_inf):
        raise _fail(where, value, f"a finite number {bound}")
    if value < minimum or (strict and value == minimum):
        raise _fail(where, value, f"a number {bound}")
    return value


def _integer(data: Mapping[str, Any], key: str, path: str, default: int, *, minimum: int) -> int:
    where = _join(path, key)
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(where, value, f"an integer >= {minimum}")
    if value < minimum:
        raise _fail(where, value, f"an integer >= {minimum}")
    return value


def _optional_int(data: Mapping[str, Any], key: str, path: str, *, minimum: int) -> int | None:
    # 0 and null both mean "no limit", as max_concurrent_calls: 0 does in the policy config.
    value = data.get(key)
    if value is None or (type(value) is int and value == 0):
        return None
    return _integer(data, key, path, 0, minimum=minimum)


# ---------------------------------------------------------------------- section parsers


def _lognormal(value: object, path: str, default: Lognormal) -> Lognormal:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        # A bare number is a constant duration.
        return Lognormal(median_s=_number({"v": value}, "v", path, 0.0))
    data = _mapping(value, path)
    _check_keys(data, path, ("median_s", "sigma", "min_s", "max_s"))
    median = _number(data, "median_s", path, default.median_s)
    sigma = _number(data, "sigma", path, default.sigma)
    low = _number(data, "min_s", path, default.min_s)
    high = _number(data, "max_s", path, default.max_s, allow_inf=True)
    if high < low:
        raise _fail(_join(path, "max_s"), high, f">= min_s ({low:g})")
    return Lognormal(median_s=median, sigma=sigma, min_s=low, max_s=high)


def _boolean(data: Mapping[str, Any], key: str, path: str, default: bool) -> bool:
    value = data.get(key, default)
    if not isinstance(value, bool):
        raise _fail(_join(path, key), value, "true or false")
    return value


def _burst(value: object, path: str) -> BurstRule | None:
    if value is None:
        return None
    data = _mapping(value, path)
    _check_keys(
        data,
        path,
        ("window_s", "growth", "floor", "growth_min", "growth_max", "drift", "count_rejected"),
    )
    growth = _number(data, "growth", path, 2.0, minimum=1.0)
    low = high = None
    drift = 0.0
    if "growth_min" in data or "growth_max" in data or "drift" in data:
        # A dynamic threshold: all three, or a clear error naming the missing one.
        for key in ("growth_min", "growth_max", "drift"):
            if key not in data:
                raise _fail(
                    _join(path, key), None, "set too when any of growth_min, growth_max, drift is"
                )
        low = _number(data, "growth_min", path, 1.0, minimum=1.0)
        high = _number(data, "growth_max", path, 1.0, minimum=1.0)
        drift = _number(data, "drift", path, 0.0, strict=True)
        if high < low:
            raise _fail(_join(path, "growth_max"), high, f">= growth_min ({low:g})")
        if not low <= growth <= high:
            raise _fail(
                _join(path, "growth"),
                growth,
                f"within [growth_min, growth_max] ([{low:g}, {high:g}])",
            )
    return BurstRule(
        window_s=_number(data, "window_s", path, 10.0, strict=True),
        growth=growth,
        floor=_integer(data, "floor", path, 20, minimum=1),
        growth_min=low,
        growth_max=high,
        drift=drift,
        count_rejected=_boolean(data, "count_rejected", path, False),
    )


def _published(value: object, path: str) -> Published:
    data = _mapping({} if value is None else value, path)
    _check_keys(data, path, ("rpm", "concurrency", "tpm", "itpm", "otpm"))
    return Published(
        rpm=_optional_int(data, "rpm", path, minimum=1),
        concurrency=_optional_int(data, "concurrency", path, minimum=1),
        tpm=_optional_int(data, "tpm", path, minimum=1),
        itpm=_optional_int(data, "itpm", path, minimum=1),
        otpm=_optional_int(data, "otpm", path, minimum=1),
    )


def _token_limits(value: object, path: str) -> TokenLimits | None:
    if value is None:
        return None
    data = _mapping(value, path)
    keys = ("rpm", "tpm", "itpm", "otpm")
    extra = ("capacity_s", "charge_rejected", "background")
    _check_keys(data, path, (*keys, *extra, "rule", "interval_s"))
    rule = data.get("rule", "buckets")
    if rule not in ("buckets", "azure"):
        raise _fail(_join(path, "rule"), rule, "'buckets' or 'azure'")
    if rule == "azure":
        return _azure_limits(data, path)
    if "interval_s" in data:
        raise _fail(_join(path, "interval_s"), data["interval_s"], "left out without rule: azure")
    limits = {key: _optional_int(data, key, path, minimum=1) for key in keys}
    if all(v is None for v in limits.values()):
        raise _fail(path, dict(data), "a mapping setting at least one of rpm, tpm, itpm, otpm")
    background = _number(data, "background", path, 0.0)
    if background >= 1.0:
        raise _fail(_join(path, "background"), background, "a number >= 0 and < 1")
    return TokenLimits(
        rpm=limits["rpm"],
        tpm=limits["tpm"],
        itpm=limits["itpm"],
        otpm=limits["otpm"],
        capacity_s=_number(data, "capacity_s", path, 60.0, strict=True),
        charge_rejected=_boolean(data, "charge_rejected", path, False),
        background=background,
    )


def _azure_limits(data: Mapping[str, Any], path: str) -> TokenLimits:
    """``rule: azure``: a TPM quota; the RPM, windows and charges follow from the rule."""
    for key in ("rpm", "itpm", "otpm", "capacity_s", "charge_rejected", "background"):
        if key in data:
            raise _fail(
                _join(path, key),
                data[key],
                "left out with rule: azure (a TPM quota per deployment; its RPM is 6 per"
                " 1,000 TPM, its windows fixed)",
            )
    if data.get("tpm") is None:
        raise _fail(_join(path, "tpm"), None, "set with rule: azure (the deployment's quota)")
    interval = _number(data, "interval_s", path, 10.0, strict=True)
    if interval not in (1.0, 10.0):
        raise _fail(_join(path, "interval_s"), interval, "1 or 10 (seconds)")
    return TokenLimits(
        tpm=_optional_int(data, "tpm", path, minimum=1), rule="azure", interval_s=interval
    )


def _size(value: object, path: str, default: Lognormal) -> Lognormal:
    """A token count: a bare number, or ``{median, sigma, min, max}`` (lognormal)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return Lognormal(median_s=_number({"v": value}, "v", path, 0.0, minimum=1.0))
    data = _mapping(value, path)
    _check_keys(data, path, ("median", "sigma", "min", "max"))
    low = _number(data, "min", path, 1.0, minimum=1.0)
    high = _number(data, "max", path, math.inf, allow_inf=True)
    if high < low:
        raise _fail(_join(path, "max"), high, f">= min ({low:g})")
    return Lognormal(
        median_s=_number(data, "median", path, default.median_s, minimum=1.0),
        sigma=_number(data, "sigma", path, 0.0),
        min_s=low,
        max_s=high,
    )


def _tokens(value: object, path: str) -> TokenSpec | None:
    if value is None:
        return None
    data = _mapping(value, path)
    _check_keys(data, path, ("prompt", "completion", "max_tokens", "grow"))
    for key in ("prompt", "max_tokens"):
        if key not in data:
            raise _fail(_join(path, key), None, "set when fleet.tokens is")
    max_tokens = _integer(data, "max_tokens", path, 1, minimum=1)
    half = Lognormal(median_s=max(1.0, max_tokens / 2))
    return TokenSpec(
        prompt=_size(data["prompt"], _join(path, "prompt"), Lognormal(median_s=1000.0)),
        completion=_size(data.get("completion", {}), _join(path, "completion"), half),
        max_tokens=max_tokens,
        grow=_boolean(data, "grow", path, False),
    )


def _outages(value: object, path: str) -> tuple[Outage, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise _fail(path, value, "a list of {start_s, end_s} mappings")
    result = []
    for index, item in enumerate(value):
        where = f"{path}[{index}]"
        data = _mapping(item, where)
        _check_keys(data, where, ("start_s", "end_s"))
        start = _number(data, "start_s", where, 0.0)
        end = _number(data, "end_s", where, 0.0)
        if end <= start:
            raise _fail(f"{where}.end_s", end, f"> start_s ({start:g})")
        result.append(Outage(start_s=start, end_s=end))
    return tuple(sorted(result, key=lambda o: o.start_s))


def _shared_pool(value: object, path: str) -> SharedPool | None:
    if value is None:
        return None
    data = _mapping(value, path)
    _check_keys(data, path, ("probability", "kind"))
    if "probability" not in data:
        raise _fail(_join(path, "probability"), None, "set (the share of arrivals turned away)")
    probability = _number(data, "probability", path, 0.0, strict=True)
    if probability >= 1.0:
        raise _fail(_join(path, "probability"), probability, "a number > 0 and < 1")
    kind = data.get("kind", "burst")
    if kind not in ("burst", "rpm", "overloaded"):
        raise _fail(_join(path, "kind"), kind, '"burst", "rpm" or "overloaded"')
    return SharedPool(probability=probability, kind=kind)


def _provider(value: object, path: str) -> ProviderSpec:
    base = ProviderSpec()
    data = _mapping({} if value is None else value, path)
    _check_keys(
        data,
        path,
        (
            "slots",
            "on_full",
            "max_queue",
            "rpm",
            "burst",
            "retry_after_s",
            "latency",
            "reject_latency",
            "outages",
            "shared_pool",
            "tokens",
            "headers",
            "plain_429",
        ),
    )
    headers = data.get("headers", base.headers)
    if headers not in ("none", "openai", "anthropic"):
        raise _fail(_join(path, "headers"), headers, '"none", "openai" or "anthropic"')
    on_full = data.get("on_full", base.on_full)
    if on_full not in ("reject", "queue"):
        raise _fail(_join(path, "on_full"), on_full, '"reject" or "queue"')
    raw = data.get("retry_after_s")
    retry_after: float | Literal["auto"] | None = (
        raw if raw is None or raw == "auto" else _number(data, "retry_after_s", path, 0.0)
    )
    max_queue = _optional_int(data, "max_queue", path, minimum=1)
    if max_queue is not None and on_full != "queue":
        raise _fail(_join(path, "max_queue"), max_queue, 'null unless on_full is "queue"')
    return ProviderSpec(
        slots=_integer(data, "slots", path, base.slots, minimum=1),
        on_full=on_full,
        max_queue=max_queue,
        rpm=_optional_int(data, "rpm", path, minimum=1),
        burst=_burst(data.get("burst"), _join(path, "burst")),
        retry_after=retry_after,
        latency=_lognormal(data.get("latency", {}), _join(path, "latency"), base.latency),
        reject_latency=_lognormal(
            data.get("reject_latency", {}), _join(path, "reject_latency"), base.reject_latency
        ),
        outages=_outages(data.get("outages"), _join(path, "outages")),
        shared_pool=_shared_pool(data.get("shared_pool"), _join(path, "shared_pool")),
        tokens=_token_limits(data.get("tokens"), _join(path, "tokens")),
        headers=headers,
        plain_429=_boolean(data, "plain_429", path, False),
    )


def _fanout(value: object, path: str, calls_per_agent: int) -> FanOut | None:
    if value is None:
        return None
    data = _mapping(value, path)
    _check_keys(data, path, ("after_call", "subagents", "calls"))
    after = _integer(data, "after_call", path, 1, minimum=1)
    if after > calls_per_agent:
        raise _fail(_join(path, "after_call"), after, f"<= calls_per_agent ({calls_per_agent})")
    return FanOut(
        after_call=after,
        subagents=_integer(data, "subagents", path, 3, minimum=1),
        calls=_integer(data, "calls", path, 2, minimum=1),
    )


def _fleet(value: object, path: str) -> FleetSpec:
    base = FleetSpec()
    data = _mapping({} if value is None else value, path)
    _check_keys(
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
        raise _fail(_join(path, "on_failure"), on_failure, '"stop" or "continue"')
    calls = _integer(data, "calls_per_agent", path, base.calls_per_agent, minimum=1)
    think = data.get("think")
    deadline = data.get("call_deadline_s")
    return FleetSpec(
        agents=_integer(data, "agents", path, base.agents, minimum=1),
        ramp_s=_number(data, "ramp_s", path, base.ramp_s),
        start_jitter_s=_number(data, "start_jitter_s", path, base.start_jitter_s),
        calls_per_agent=calls,
        think=None
        if think is None
        else _lognormal(think, _join(path, "think"), Lognormal(median_s=1.0)),
        fanout=_fanout(data.get("fanout"), _join(path, "fanout"), calls),
        call_deadline_s=None
        if deadline is None
        else _number(data, "call_deadline_s", path, 0.0, strict=True),
        on_failure=on_failure,
        tokens=_tokens(data.get("tokens"), _join(path, "tokens")),
    )


def _naive(value: object, path: str) -> NaiveSpec:
    base = NaiveSpec()
    data = _mapping({} if value is None else value, path)
    _check_keys(data, path, ("base_delay_s", "factor", "max_delay_s", "max_attempts"))
    return NaiveSpec(
        base_delay_s=_number(data, "base_delay_s", path, base.base_delay_s),
        factor=_number(data, "factor", path, base.factor, minimum=1.0),
        max_delay_s=_number(data, "max_delay_s", path, base.max_delay_s),
        max_attempts=_integer(data, "max_attempts", path, base.max_attempts, minimum=1),
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
    data = _mapping({} if value is None else value, path)
    _check_keys(data, path, ("naive", "policy", "factory"))
    kinds = [key for key in ("naive", "policy", "factory") if key in data]
    if len(kinds) > 1:
        raise _fail(
            path, dict(data), "exactly one of {naive: ...}, {policy: ...}, {factory: ...}, not both"
        )
    builtin = name in BUILTIN_STRATEGIES
    if builtin and name not in (*_POLICY_BUILTINS, "naive"):
        if data:
            raise _fail(path, dict(data), f"empty: {name!r} is a built-in peer with fixed settings")
        return StrategySpec(name=name)
    if "factory" in data:
        if builtin:
            raise _fail(_join(path, "factory"), data["factory"], f"absent: {name!r} is built in")
        factory = data["factory"]
        if not isinstance(factory, str) or factory.count(":") != 1 or factory.startswith(":"):
            raise _fail(_join(path, "factory"), factory, 'a "module:attribute" string')
        return StrategySpec(name=name, factory=factory, source=factory)
    if "naive" in data:
        if name in _POLICY_BUILTINS:
            raise _fail(
                _join(path, "naive"), data["naive"], f"absent: {name!r} is a policy strategy"
            )
        return StrategySpec(name=name, naive=_naive(data["naive"], _join(path, "naive")))
    if name == "naive":
        if data:
            raise _fail(path, dict(data), "{naive: {...}} for the built-in naive strategy")
        return StrategySpec(name=name, naive=NaiveSpec())
    raw = data.get("policy")
    if raw is None and name not in _POLICY_BUILTINS:
        raise _fail(path, dict(data), "{naive: {...}}, {policy: mapping or path} or {factory: ...}")
    if isinstance(raw, str):
        file = Path(raw) if base_dir is None else base_dir / raw
        return StrategySpec(
            name=name, policy=load_yaml(file, _join(path, "policy")), replace=True, source=str(file)
        )
    policy = _mapping({} if raw is None else raw, _join(path, "policy"))
    # A custom strategy's mapping is complete; for seed/anygate it overrides the built-in.
    return StrategySpec(name=name, policy=policy, replace=name not in _POLICY_BUILTINS)


def _strategies(value: object, path: str, base_dir: Path | None) -> tuple[StrategySpec, ...]:
    if value is None:
        return ()
    data = _mapping(value, path)
    return tuple(
        parse_strategy(name, item, _join(path, name), base_dir=base_dir)
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
    return _mapping({} if data is None else data, path or str(file))


def parse_scenario(data: object, *, base_dir: Path | None = None) -> Scenario:
    """Validate a scenario mapping (the parsed YAML) into a :class:`Scenario`.

    Args:
        data: the mapping.
        base_dir: directory that relative policy file paths are resolved against.

    Raises:
        ConfigError: naming the key path, the value and what is allowed.
    """
    top = _mapping(data, "scenario")
    _check_keys(
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
        raise _fail("name", name, "a non-empty string")
    description = top.get("description", "")
    if not isinstance(description, str):
        raise _fail("description", description, "a string")
    provider = _provider(top.get("provider"), "provider")
    fleet = _fleet(top.get("fleet"), "fleet")
    limits = provider.tokens
    if limits is not None and fleet.tokens is None and (limits.tpm or limits.itpm or limits.otpm):
        raise _fail(
            "fleet.tokens", None, "set when provider.tokens limits tokens (calls need sizes)"
        )
    return Scenario(
        name=name,
        description=" ".join(description.split()),
        seed=_integer(top, "seed", "", 1, minimum=0),
        time_limit_s=_number(top, "time_limit_s", "", 3600.0, strict=True),
        provider=provider,
        fleet=fleet,
        published=_published(top.get("published"), "published"),
        strategies=_strategies(top.get("strategies"), "strategies", base_dir),
    )
