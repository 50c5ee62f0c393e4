"""Find scenarios (built-in names or YAML paths) and assemble the strategies to compare.

Built-in scenarios and the built-in ``seed`` / ``anygate`` policy configs are YAML files
shipped inside the package (``anygate/sim/scenarios/*.yaml``, ``anygate/sim/configs/*.yaml``)
and read with :mod:`importlib.resources`, so they work from a wheel, a zip or a checkout.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from .. import ConfigError
from ._parse import load_yaml, parse_scenario
from ._spec import BUILTIN_STRATEGIES, DEFAULT_STRATEGIES, NaiveSpec, Scenario, StrategySpec

__all__ = [
    "DEFAULT_SCENARIO",
    "builtin_policy",
    "builtin_scenarios",
    "deep_merge",
    "load_scenario",
    "resolve_strategies",
    "scenario_mapping",
]

#: What ``anygate simulate`` runs without arguments.
DEFAULT_SCENARIO = "morning-peak"


def _package_yaml(folder: str, name: str) -> Mapping[str, Any]:
    import yaml

    resource = resources.files("anygate.sim").joinpath(folder).joinpath(f"{name}.yaml")
    data = yaml.safe_load(resource.read_text(encoding="utf-8"))
    if not isinstance(data, Mapping):  # pragma: no cover - guarded by the tests
        msg = f"built-in {folder}/{name}.yaml is not a mapping"
        raise ConfigError(msg, path=name, value=data)
    return data


def builtin_scenarios() -> list[str]:
    """Names of the scenarios shipped with anygate, default first."""
    folder = resources.files("anygate.sim").joinpath("scenarios")
    names = sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))
    names.remove(DEFAULT_SCENARIO)
    return [DEFAULT_SCENARIO, *names]


def load_scenario(source: str | Path | Mapping[str, Any] = DEFAULT_SCENARIO) -> Scenario:
    """A scenario from a built-in name, a YAML file path, or a mapping.

    A string naming a built-in scenario (see :func:`builtin_scenarios`) wins over a file of
    the same name in the working directory only when it has no ``.yaml``/``.yml`` suffix
    and no path separator.

    Raises:
        ConfigError: unknown name, unreadable file, or an invalid scenario.
    """
    if isinstance(source, Mapping):
        return parse_scenario(source)
    text = str(source)
    is_path = isinstance(source, Path) or text.endswith((".yaml", ".yml")) or "/" in text
    if not is_path:
        known = builtin_scenarios()
        if text not in known:
            msg = f"scenario must be one of {', '.join(known)} or a .yaml file (got {text!r})"
            close = difflib.get_close_matches(text, known, n=1)
            if close:
                msg += f"; did you mean {close[0]!r}?"
            raise ConfigError(msg, path="scenario", value=text)
        return parse_scenario(_package_yaml("scenarios", text))
    path = Path(source)
    return parse_scenario(load_yaml(path), base_dir=path.parent)


def scenario_mapping(source: str | Path) -> tuple[Mapping[str, Any], Path | None]:
    """The raw mapping of a built-in scenario or a YAML file, and its base directory.

    Raises:
        ConfigError: unknown name or unreadable file (as :func:`load_scenario`).
    """
    text = str(source)
    if isinstance(source, Path) or text.endswith((".yaml", ".yml")) or "/" in text:
        path = Path(source)
        return load_yaml(path), path.parent
    load_scenario(text)  # validates the name, with the usual message
    return _package_yaml("scenarios", text), None


def builtin_policy(name: str) -> Mapping[str, Any]:
    """The built-in policy config of the ``seed`` or ``anygate`` strategy, as a mapping."""
    if name not in ("seed", "anygate"):
        msg = f"built-in policy strategy must be 'seed' or 'anygate' (got {name!r})"
        raise ValueError(msg)
    return _package_yaml("configs", name)


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``override`` laid over it; nested mappings merge key by key."""
    merged = dict(base)
    for key, value in override.items():
        old = merged.get(key)
        if isinstance(old, Mapping) and isinstance(value, Mapping):
            merged[key] = deep_merge(old, value)
        else:
            merged[key] = value
    return merged


def _finish(spec: StrategySpec) -> StrategySpec:
    """Resolve a built-in policy strategy's overrides against its shipped config."""
    if spec.policy is None or spec.replace:
        return spec
    merged = deep_merge(builtin_policy(spec.name), spec.policy)
    source = "built-in" + (" + scenario overrides" if spec.policy else "")
    return StrategySpec(
        name=spec.name,
        policy=merged,
        replace=True,
        source=source,
        from_published=True,
        paces_published_rpm=spec.name == "anygate",
        accepts=spec.name != "seed",
    )


def _is_factory(value: str) -> bool:
    """``module:attribute`` rather than a file path (``--strategy NAME=...``)."""
    if value.endswith((".yaml", ".yml")) or Path(value).exists():
        return False
    module, sep, attribute = value.partition(":")
    return bool(sep and module and attribute) and "/" not in module and "\\" not in module


def resolve_strategies(
    scenario: Scenario,
    *,
    config: str | Path | None = None,
    extra: Sequence[tuple[str, str | Path]] = (),
    only: Sequence[str] | None = None,
) -> list[StrategySpec]:
    """The strategies to compare, in display order, each ready to build.

    Order: the built-ins (:data:`~anygate.sim._spec.BUILTIN_STRATEGIES`), then the
    scenario's own strategies, then ``extra``. The scenario may override parts of the
    built-in ``seed`` / ``anygate`` configs; ``config`` (the user's policy file) replaces the
    ``anygate`` strategy's config, the published facts filling only the keys it leaves out.

    Args:
        scenario: provides overrides and extra strategies.
        config: path of the user's anygate policy config.
        extra: ``(name, policy file or "module:factory")`` pairs added by the user.
        only: keep just these names, in this order.

    Raises:
        ConfigError: unreadable files, duplicate or unknown names.
    """
    specs: dict[str, StrategySpec] = {}
    for name in BUILTIN_STRATEGIES:
        if name == "naive":
            specs[name] = StrategySpec(name=name, naive=NaiveSpec())
        elif name in ("seed", "anygate"):
            specs[name] = StrategySpec(name=name, policy={})
        else:
            specs[name] = StrategySpec(name=name)
    for spec in scenario.strategies:
        specs[spec.name] = spec
    if config is not None:
        # The file is the strategy's whole config; what the scenario publishes still fills
        # the keys it leaves out, as for the built-in (issue 28: config.example.yaml, which
        # states every default, silently dropped the published-RPM pacing).
        specs["anygate"] = StrategySpec(
            name="anygate",
            policy=load_yaml(Path(config), "--config"),
            replace=True,
            source=str(config),
            from_published=True,
            paces_published_rpm=True,
            user_file=True,
        )
    for name, path in extra:
        if not name or name in specs:
            msg = f"--strategy name must be new and non-empty (got {name!r}; taken: {', '.join(specs)})"
            raise ConfigError(msg, path="--strategy", value=name)
        text = str(path)
        if _is_factory(text):
            specs[name] = StrategySpec(name=name, factory=text, source=text)
            continue
        specs[name] = StrategySpec(
            name=name,
            policy=load_yaml(Path(path), f"--strategy {name}"),
            replace=True,
            source=text,
        )
    if only is not None and list(only) == ["all"]:
        only = list(specs)
    if only is not None:
        unknown = [name for name in only if name not in specs]
        if unknown:
            msg = f"--only names must be among {', '.join(specs)} (got {', '.join(unknown)})"
            raise ConfigError(msg, path="--only", value=list(only))
        chosen = [specs[name] for name in only]
    else:
        builtins = [specs[name] for name in DEFAULT_STRATEGIES]
        chosen = builtins + [s for name, s in specs.items() if name not in BUILTIN_STRATEGIES]
    return [_finish(spec) for spec in chosen]
