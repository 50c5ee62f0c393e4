"""The public surface of ``anygate``: what is exported, where it claims to live, what is final.

Modelled on anyio's ``test_all_attributes.py``: the checks are generic over ``anygate.__all__``,
so a name added later is covered without touching this file.
"""

from __future__ import annotations
import __future__

import contextlib
import copy
import gc
import inspect
import pickle
import sys
import traceback
import types
import typing
from typing import Any

import pytest

import anygate

PUBLIC = [(name, getattr(anygate, name)) for name in anygate.__all__]
# Classes and functions: the objects whose __module__ users see in reprs and tracebacks.
# Type aliases (`Hook = Callable[...]`, `Event = A | B`) are neither, although on Python 3.10
# inspect.isclass() says a parametrized generic is a class.
DEFINED = [
    (name, obj)
    for name, obj in PUBLIC
    if (inspect.isclass(obj) or inspect.isroutine(obj)) and typing.get_origin(obj) is None
]


def test_all_is_sorted_and_unique() -> None:
    """``__all__`` is sorted (a stable, reviewable diff) and lists each name once."""
    assert anygate.__all__ == sorted(set(anygate.__all__))


def test_star_import_gives_exactly_all() -> None:
    """``from anygate import *`` binds every name of ``__all__`` and nothing else."""
    namespace: dict[str, Any] = {}
    exec("from anygate import *", namespace)
    namespace.pop("__builtins__")
    assert sorted(namespace) == anygate.__all__


@pytest.mark.parametrize(("name", "obj"), PUBLIC, ids=[name for name, _ in PUBLIC])
def test_public_name_is_importable(name: str, obj: object) -> None:
    """Each exported name is importable from the package root and is not a placeholder."""
    namespace: dict[str, Any] = {}
    exec(f"from anygate import {name}", namespace)
    assert namespace[name] is obj
    assert obj is not None


@pytest.mark.parametrize(("name", "obj"), DEFINED, ids=[name for name, _ in DEFINED])
def test_public_object_lives_in_anygate(name: str, obj: Any) -> None:
    """Classes and functions report ``anygate.Name``, never a private module, and pickle there."""
    assert obj.__module__ == "anygate"
    assert obj.__qualname__ == name
    # Pickle stores classes and functions by module and qualname: this proves the rewritten
    # path really resolves back to the same object.
    assert pickle.loads(pickle.dumps(obj)) is obj


def test_no_private_module_leaks() -> None:
    """Every public-looking attribute of ``anygate`` is exported or a public submodule."""
    stray = []
    for name, value in vars(anygate).items():
        if name.startswith("_") or name in anygate.__all__:
            continue
        if name.startswith("@"):
            # pytest's assertion rewriter binds "@pytest_ar" in modules it rewrites, and it
            # rewrites every package that ships a pytest11 plugin (anygate.testing): no API.
            continue
        if isinstance(value, types.ModuleType) and not any(
            part.startswith("_") for part in value.__name__.split(".")
        ):
            continue  # a public subpackage such as anygate.cli, once imported
        if isinstance(value, __future__._Feature):
            continue  # `from __future__ import annotations` binds a name; it is not API
        stray.append(name)
    assert not stray, f"public-looking names missing from __all__: {stray}"


def test_errors_show_their_public_path() -> None:
    """A traceback names ``anygate.Busy``, not the private module that defines it."""
    exc = anygate.Busy(gate="llm", capacity=8, in_flight=8, waited=1.0)
    (line,) = traceback.format_exception_only(type(exc), exc)
    assert line.startswith("anygate.Busy: gate 'llm' is busy")
    assert repr(anygate.Gate) == "<class 'anygate.Gate'>"


def test_gate_surface_matches_the_contract() -> None:
    """The gate and token offer the names the issue promises users."""
    gate_api = {
        "acquire",
        "acquire_nowait",
        "acquire_sync",
        "capacity",
        "in_flight",
        "name",
        "statistics",
        "waiting",
    }
    assert gate_api <= {n for n in dir(anygate.Gate) if not n.startswith("_")}
    token_api = {"release", "released", "acquired_at", "admitted_at"}
    assert token_api <= {n for n in dir(anygate.Token) if not n.startswith("_")}
    assert {"__enter__", "__exit__", "__aenter__", "__aexit__"} <= set(dir(anygate.Token))
    assert callable(anygate.shared_gate)


def test_the_gates_ledger_adds_no_public_name() -> None:
    """``Gate`` inherits its state machine for speed (docs/design.md): none of the
    ledger's names (its state and its steps) may become gate API, by a public name or by
    overriding one."""
    from anygate._gate.budget_steps import BudgetSteps
    from anygate._gate.ledger import Ledger
    from anygate._gate.slot_steps import SlotSteps

    inherited = {
        n for cls in (Ledger, SlotSteps, BudgetSteps) for n in dir(cls) if not n.startswith("__")
    }
    assert inherited, "the ledger has state"
    assert all(n.startswith("_") for n in inherited), sorted(inherited)
    public = {n for n in dir(anygate.Gate) if not n.startswith("_")}
    assert public.isdisjoint(inherited)


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [((), {}), ((anygate.Gate(1),), {}), ((), {"gate": anygate.Gate(1)})],
    ids=["bare", "positional-gate", "keyword-gate"],
)
def test_token_has_no_public_constructor(
    args: tuple[object, ...], kwargs: dict[str, object]
) -> None:
    """``Token(...)`` is refused whatever is passed: only a gate creates tokens."""
    with pytest.raises(TypeError, match="no public constructor"):
        anygate.Token(*args, **kwargs)


def test_refused_token_construction_leaves_no_half_built_object(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A refused ``Token()`` leaves nothing behind whose finalizer could fail."""
    unraisable: list[object] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    with contextlib.suppress(TypeError):
        anygate.Token()
    gc.collect()
    assert unraisable == []


def test_token_cannot_be_copied() -> None:
    """Copying a held token would mint a second release of one slot, so it is refused."""
    gate = anygate.Gate(1, name="copy")
    token = gate.acquire_nowait()
    duplicate = None
    try:
        with pytest.raises(TypeError):
            duplicate = copy.copy(token)
    finally:
        token.release()
        if duplicate is not None:
            duplicate.release()  # keep the failure clean: no leak warning at teardown
    assert gate.in_flight == 0


@pytest.mark.skipif(
    sys.version_info < (3, 11),
    reason="typing.final only sets __final__ from Python 3.11; tests/typing checks it statically",
)
@pytest.mark.parametrize("cls", [anygate.Gate, anygate.Token], ids=lambda cls: cls.__name__)
def test_gate_and_token_are_final(cls: type) -> None:
    """``Gate`` and ``Token`` are marked ``@final``, so type checkers reject subclasses."""
    assert getattr(cls, "__final__", False) is True


def test_version_is_a_string() -> None:
    """``anygate.__version__`` exists for bug reports and matches the installed metadata."""
    from importlib.metadata import version

    assert anygate.__version__ == version("anygate")
