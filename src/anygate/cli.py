"""The ``anygate`` command line: ``anygate simulate`` and ``anygate check-config``.

Installed as the ``anygate`` console script (``pip install 'anygate[cli]'`` brings trio,
PyYAML and rich). Everything heavy is imported inside the command that needs it, so
``anygate --help`` is instant and ``import anygate`` never pulls any of it in.

Exit codes: 0 success, 1 a missing optional dependency, 2 bad usage or an invalid config or
scenario (the message names the key), 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Sequence

    from rich.console import Console

    from .sim import SimulationResult

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="anygate",
        description="anygate: one admission gate and call policy for every LLM call.",
    )
    parser.add_argument("--version", action="version", version=f"anygate {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    sim = commands.add_parser(
        "simulate",
        help="compare retry/cap strategies in a virtual-clock storm simulation",
        description=(
            "Simulate a fleet of agents calling a rate-limited provider on a virtual clock "
            "and compare strategies side by side: what users really run (the openai SDK's "
            "retries, the cookbook's tenacity recipe, stamina, LiteLLM's Router, with and "
            "without a semaphore cap), naive, seed (deer-flow), anygate (your --config or "
            "the library's defaults plus the provider's published facts) and an oracle "
            "that knows the provider's hidden rules. Lost calls come first: a strategy "
            "that lost calls gets no makespan ratio. Deterministic for a seed. "
            "'anygate simulate sweep SCENARIO --vary KEY=V1,V2 --seeds 1-5' runs every "
            "variation x strategy x seed in parallel processes."
        ),
    )
    sim.add_argument(
        "scenario",
        nargs="?",
        default=None,
        help="a built-in scenario name or a scenario .yaml file (default: morning-peak); "
        "or 'sweep' followed by the scenario",
    )
    sim.add_argument("target", nargs="?", default=None, help=argparse.SUPPRESS)
    sim.add_argument("--config", metavar="FILE", help="your policy config for 'anygate'")
    sim.add_argument(
        "--strategy",
        action="append",
        default=[],
        metavar="NAME=FILE|MODULE:FACTORY",
        help="add a strategy: a policy config file, or a Python factory (repeatable)",
    )
    sim.add_argument(
        "--only",
        metavar="NAMES",
        help="comma-separated strategies to run, in this order ('all': every one)",
    )
    sim.add_argument(
        "--vary",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help="sweep: a dotted scenario key and its values (repeatable; the product is run)",
    )
    sim.add_argument("--seeds", metavar="N-M", help="sweep: seeds, e.g. 1-5 or 1,3,7")
    sim.add_argument(
        "--jobs", type=int, metavar="N", help="sweep: worker processes (default: CPU count)"
    )
    sim.add_argument("--seed", type=int, help="random seed (default: the scenario's)")
    sim.add_argument("--plot", metavar="FILE", help="also write the chart as .png/.svg/.pdf")
    sim.add_argument(
        "--json",
        nargs="?",
        const="-",
        metavar="FILE",
        help="write machine-readable results to FILE, or to stdout (then no table)",
    )
    sim.add_argument(
        "--details",
        action="store_true",
        help="also print why calls were lost, rejections, latency, settings and the chart",
    )
    sim.add_argument("--no-chart", action="store_true", help="omit the chart from --details")
    sim.add_argument("--list", action="store_true", help="list built-in scenarios and exit")
    sim.set_defaults(handler=_simulate)

    check = commands.add_parser(
        "check-config",
        help="validate a policy config and print its effective values",
        description=(
            "Validate a policy config file (llm_call / circuit_breaker) and print every "
            "effective value, defaults filled in. Errors name the offending key."
        ),
    )
    check.add_argument("file", help="the YAML config file")
    check.add_argument("--json", action="store_true", help="print the values as JSON")
    check.set_defaults(handler=_check_config)
    return parser


def _console(*, stderr: bool = False) -> Console:
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)


def _check_policy_file(path: str | None) -> None:
    """Read ``--config`` through :func:`anygate.load_config` first, so the simulator takes
    exactly the files a program could load (an empty file, a key given twice refused),
    before minutes of simulating rather than after.

    Raises:
        ConfigError: as :func:`anygate.load_config`.
    """
    if path is not None:
        from . import load_config

        load_config(path)


def _sweep(args: argparse.Namespace, extra: list[tuple[str, str]], only: list[str] | None) -> int:
    from . import sim
    from .sim._scenarios import scenario_mapping
    from .sim._sweep import format_sweep, parse_seeds, parse_vary, run_sweep

    _check_policy_file(args.config)
    source = args.target if args.scenario == "sweep" else args.scenario
    base, base_dir = scenario_mapping(source or sim.DEFAULT_SCENARIO)
    scenario = sim.load_scenario(source or sim.DEFAULT_SCENARIO)
    names = [
        s.name for s in sim.resolve_strategies(scenario, config=args.config, extra=extra, only=only)
    ]
    if args.jobs is not None and args.jobs < 1:
        print(f"anygate: --jobs must be >= 1 (got {args.jobs})", file=sys.stderr)
        return 2
    to_stdout = args.json == "-"
    started = time.perf_counter()

    def progress(done: int, total: int) -> None:
        if not to_stdout and sys.stderr.isatty():
            print(f"\r{done}/{total} runs", end="", file=sys.stderr, flush=True)

    result = run_sweep(
        base,
        parse_vary(args.vary),
        parse_seeds(args.seeds or str(scenario.seed)),
        names,
        base_dir=None if base_dir is None else str(base_dir),
        extra=extra,
        config=args.config,
        jobs=args.jobs,
        progress=progress,
    )
    if args.json is not None:
        text = json.dumps(result.to_dict(), indent=2)
        if to_stdout:
            print(text)
        else:
            with open(args.json, "w", encoding="utf-8") as fh:
                fh.write(text + "\n")
    if not to_stdout:
        if sys.stderr.isatty():
            print(file=sys.stderr)
        print(format_sweep(result))
        print(f"(swept in {time.perf_counter() - started:.1f}s of wall time)")
    return 0


def _simulate(args: argparse.Namespace) -> int:
    from . import sim

    if args.list:
        for name in sim.builtin_scenarios():
            scenario = sim.load_scenario(name)
            print(f"{name:<16} {scenario.fleet.total_calls:>6} calls  {scenario.name}")
        return 0
    extra = []
    for item in args.strategy:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            print(
                f"anygate: --strategy must be NAME=FILE or NAME=MODULE:FACTORY (got {item!r})",
                file=sys.stderr,
            )
            return 2
        extra.append((name, path))
    only = [n.strip() for n in args.only.split(",") if n.strip()] if args.only else None
    if args.scenario == "sweep" or args.vary or args.seeds:
        if args.plot:
            print("anygate: --plot does not apply to a sweep", file=sys.stderr)
            return 2
        return _sweep(args, extra, only)
    if args.target is not None:
        print(f"anygate: unexpected argument {args.target!r}", file=sys.stderr)
        return 2
    _check_policy_file(args.config)
    scenario = sim.load_scenario(args.scenario or sim.DEFAULT_SCENARIO)
    strategies = sim.resolve_strategies(scenario, config=args.config, extra=extra, only=only)
    if args.plot:
        import importlib.util

        from .sim._plot import SUFFIXES

        if not args.plot.lower().endswith(SUFFIXES):
            print(
                f"anygate: --plot must end in {', '.join(SUFFIXES)} (got {args.plot!r})",
                file=sys.stderr,
            )
            return 2
        if importlib.util.find_spec("matplotlib") is None:  # say so before simulating
            print("anygate: --plot needs matplotlib: pip install 'anygate[plot]'", file=sys.stderr)
            return 1
    to_stdout = args.json == "-"
    started = time.perf_counter()
    result = _run_with_progress(sim, scenario, strategies, args.seed, quiet=to_stdout)
    elapsed = time.perf_counter() - started
    if args.json is not None:
        text = json.dumps(result.to_dict(), indent=2)
        if to_stdout:
            print(text)
        else:
            with open(args.json, "w", encoding="utf-8") as fh:
                fh.write(text + "\n")
    if not to_stdout:
        from .sim._report import print_report

        console = _console()
        print_report(
            result,
            console,
            description=scenario.description,
            details=args.details,
            show_chart=not args.no_chart,
        )
        _say_config_changes(console, scenario, strategies)
        console.print(f"[dim]simulated in {elapsed:.1f}s of wall time[/]")
    if args.plot:
        from .sim._plot import write_plot

        written = write_plot(result, args.plot)
        if not to_stdout:
            print(f"chart written to {written}")
    return 0


def _say_config_changes(console: Console, scenario: Any, strategies: Any) -> None:
    """Say what ``--config`` changes against the built-in ``anygate`` strategy, in the
    compact report too: a file that states every default can still drop a published fact."""
    from rich.text import Text

    from .sim._policy_strategy import config_changes

    for spec in strategies:
        changes = config_changes(spec, scenario.published)
        if changes:
            hint = ""
            if " changes " in changes:
                hint = "; leave a key out of the file to keep the built-in's (published) value"
            console.print(Text(f"{spec.name}: {changes}{hint}", style="yellow"))


def _run_with_progress(
    sim: Any, scenario: Any, strategies: Any, seed: int | None, *, quiet: bool
) -> SimulationResult:
    """Run the simulation with a progress bar per strategy on stderr (none if ``quiet``)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    if quiet:
        result: SimulationResult = sim.simulate(scenario, seed=seed, strategies=strategies)
        return result
    columns = (
        TextColumn("{task.description:>12}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("calls"),
    )
    with Progress(*columns, console=_console(stderr=True), transient=True) as bar:
        tasks: dict[str, Any] = {}

        def progress(name: str, done: int, total: int) -> None:
            if name not in tasks:
                tasks[name] = bar.add_task(name, total=total)
            bar.update(tasks[name], completed=done)

        done: SimulationResult = sim.simulate(
            scenario, seed=seed, strategies=strategies, progress=progress
        )
    return done


def _check_config(args: argparse.Namespace) -> int:
    import inspect

    from ._config.checkconfig import check_file
    from ._policy.breaker import CircuitBreaker

    checked, errors = check_file(args.file)
    if errors:
        # Every problem at once: fixing a file one error per run is slow (issue 15).
        for error in errors:
            print(f"anygate: error: {error}", file=sys.stderr)
        if len(errors) > 1:
            print(f"anygate: {args.file}: {len(errors)} errors", file=sys.stderr)
        return 2
    assert checked is not None
    config = checked
    effective = config.to_mapping()
    # Unset breaker settings mean "keep the shared breaker's, or the defaults when this
    # policy creates it": show the defaults, and say so, rather than a bare null.
    breaker = effective["circuit_breaker"]
    defaults = inspect.signature(CircuitBreaker).parameters
    inherited = []
    for key, parameter in (
        ("failure_threshold", "failure_threshold"),
        ("recovery_timeout_sec", "recovery_timeout"),
    ):
        if breaker.get(key) is None:
            breaker[key] = defaults[parameter].default
            inherited.append(f"circuit_breaker.{key}")
    # Likewise for the gate's adaptive limit.
    adaptive = effective["llm_call"]["adaptive_concurrency"]
    for key, value in config.adaptive_concurrency.effective().items():
        if adaptive.get(key) is None:
            adaptive[key] = value
            inherited.append(f"llm_call.adaptive_concurrency.{key}")
    if args.json:
        return _write_stdout(json.dumps(effective, indent=2) + "\n")
    import yaml

    lines = [
        f"# {args.file}: valid. Effective values, defaults filled in:",
        yaml.safe_dump(effective, sort_keys=False, default_flow_style=False).rstrip(),
    ]
    if inherited:
        lines.append(
            f"# not set in the file: {', '.join(inherited)}; the defaults above apply when "
            "this policy creates its breaker (or its gate's adaptive limit), while one "
            "already shared under the same name keeps its own values."
        )
    return _write_stdout("\n".join(lines) + "\n")


def _write_stdout(text: str) -> int:
    """Write and flush ``text``; a reader that went away (``| head``) is not an error."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        _stdout_gone()
    return 0


def _stdout_gone() -> None:
    """The reader of stdout went away (``| head``): stop writing, quietly, as Unix tools do.

    Python would otherwise report the failed flush again at exit, with a traceback. Point
    stdout at /dev/null (the Python docs' recipe for SIGPIPE); the exit code stays 0, as
    for ``check-config --json | head``, since the command itself did its work.
    """
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``anygate`` console script; returns the exit code."""
    from ._errors import ConfigError

    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        code: int = args.handler(args)
        # Inside the try: a reader gone before the last buffered write fails here, not in
        # the interpreter's exit-time flush, where it can no longer be caught.
        sys.stdout.flush()
    except BrokenPipeError:
        # Every command, not only check-config: `anygate simulate --json - | head` ended in
        # a BrokenPipeError traceback (issue 28).
        _stdout_gone()
        return 0
    except ConfigError as exc:
        print(f"anygate: error: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:
        if "pip install" in str(exc):
            print(f"anygate: {exc}", file=sys.stderr)
        else:
            print(
                f"anygate: {exc.name or exc} is needed for this command: "
                "pip install 'anygate[cli]'",
                file=sys.stderr,
            )
        return 1
    except KeyboardInterrupt:
        print("anygate: interrupted", file=sys.stderr)
        return 130
    return code


if __name__ == "__main__":
    raise SystemExit(main())
