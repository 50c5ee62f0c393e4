"""Is a cancellation pending for the running task? Read from the runtime's own state, guarded.

The uncontended acquire must be a cancel point: it refuses in an already-cancelled scope even
when a slot is free. Asking that through the public APIs (anyio's
``current_effective_deadline()`` on asyncio, trio's ``checkpoint_if_cancelled()``, a
coroutine per call) costs about as much as the rest of the acquire together, so this module
answers it from the runtime's private state, the way those public functions do internally:

* asyncio (anyio's cancel scopes): ``anyio._backends._asyncio._task_states`` (a
  ``WeakKeyDictionary`` of task to ``TaskState``), ``TaskState.cancel_scope``, and on each
  scope ``_cancel_called``, ``_shield`` and ``_parent_scope``, walked from the task's
  innermost scope outwards until a shield, as ``current_effective_deadline()`` does; on
  Python 3.10 and 3.11 also ``asyncio.tasks._current_tasks`` (the running task per loop,
  which ``asyncio.current_task()`` reads there in Python; 3.12+ has it in C).
* trio: the running task from ``trio._core._run.GLOBAL_RUN_CONTEXT.task`` (what
  ``trio.lowlevel.current_task()`` returns, without its call), its
  ``_cancel_status.effectively_cancelled``, and ``_runner.ki_pending`` /
  ``_runner.main_task`` (a pending Ctrl-C is delivered at a cancel point of the main
  task), as ``checkpoint_if_cancelled()`` does; and, as it does, one write: the task's
  ``_cancel_points`` count, which ``trio.testing.assert_checkpoints()`` reads.

Only the *question* is answered privately: when a cancellation is pending, the caller still
awaits the public checkpoint, which raises it. A wrong private answer could therefore only
skip a cancel point (or add a harmless one), and the guard makes that impossible on
versions it does not know:

**The guard.** On the first question on each backend, the structure is checked (the
attributes exist and have the expected types) and the private answer is compared with the
public one for the running task. Any mismatch or error selects the public path for the rest
of the process. Both paths are tested on the oldest and newest anyio and trio the project
supports (``tests/test_cancel_state.py``; ``nox -s oldest``), and ``use_public()`` lets
tests force the fallback. ``docs/performance.md`` says what each read saves.

``Token.__aenter__`` spells the two private reads out (a call fewer each on the fast
pair): it reads ``states_get`` / ``task_of`` (asyncio) and ``trio_context`` (trio), which
are set only once the guard has trusted that path, and calls ``cancellation_check()`` in
``waiters`` (these functions) for everything else.
"""

from __future__ import annotations

import asyncio
import math
import sys
import weakref
from types import BuiltinFunctionType
from typing import Any

__all__ = ["asyncio_pending", "mode", "trio_context", "trio_pending", "use_public"]

_PROBE, _PRIVATE, _PUBLIC = "probe", "private", "public"
_modes = {"asyncio": _PROBE, "trio": _PROBE}

_NEG_INF = -math.inf  # anyio's deadline for a cancelled scope, made once
_current_task = asyncio.current_task
_ref = weakref.ref
#: anyio's ``_task_states.data.get`` once the guard chose the private path on asyncio, else
#: ``None``; ``Token.__aenter__`` then walks the running task's scopes inline.
states_get: Any = None
#: The running task of a loop (``task_of(loop)``), as the guard checked it.
task_of: Any = _current_task
#: trio's ``GLOBAL_RUN_CONTEXT`` (a thread-local) once the guard chose the private path,
#: else ``None``; ``_waiters.cancellation_check`` reads the task from it inline.
trio_context: Any = None
_public_deadline: Any = None  # anyio's asyncio current_effective_deadline
_private_states_get: Any = None  # what _asyncio_private reads (states_get once trusted)


def mode(backend: str) -> str:
    """``"private"``, ``"public"`` or ``"probe"`` (not asked yet) for ``backend``."""
    return _modes[backend]


def use_public(public: bool) -> None:
    """Force the public path (``True``) or let the guard probe again (``False``); for tests."""
    global asyncio_pending, trio_pending
    global trio_context, states_get
    trio_context = states_get = None
    if public:
        asyncio_pending, trio_pending = _asyncio_public, _trio_public
        _modes.update(asyncio=_PUBLIC, trio=_PUBLIC)
    else:
        asyncio_pending, trio_pending = _asyncio_probe, _trio_probe
        _modes.update(asyncio=_PROBE, trio=_PROBE)


# ----------------------------------------------------------------------------- asyncio


def _anyio_asyncio() -> Any:
    """anyio's asyncio backend module, whose private state the guard inspects."""
    from anyio._backends import _asyncio

    return _asyncio


def _asyncio_private(loop: object) -> bool:
    task = task_of(loop)
    if task is None:
        return False
    state = _private_states_get(_ref(task))
    if state is None:  # a task anyio never saw has no anyio cancel scope
        return False
    scope = state.cancel_scope
    while scope is not None:
        if scope._cancel_called:
            return True
        if scope._shield:
            return False
        scope = scope._parent_scope
    return False


def _asyncio_public(loop: object) -> bool:
    deadline = _public_deadline or _resolve_public_deadline()
    pending: bool = deadline() == _NEG_INF  # a float compare, no bool() call
    return pending


def _resolve_public_deadline() -> Any:
    global _public_deadline
    import anyio.lowlevel

    _public_deadline = anyio.lowlevel.current_token().backend_class.current_effective_deadline
    return _public_deadline


def _asyncio_probe(loop: object) -> bool:
    """The first question on asyncio: check the structure, compare answers, pick a path."""
    global asyncio_pending, states_get, task_of, _private_states_get
    public = _asyncio_public(loop)
    states_get = None
    try:
        # The running task of ``loop``: on 3.12+ asyncio's C ``current_task(loop)``; before
        # that ``current_task`` is Python (a loop lookup and a call), and the dict it reads,
        # ``asyncio.tasks._current_tasks``, answers directly.
        if not isinstance(_current_task, BuiltinFunctionType):
            current = asyncio.tasks._current_tasks  # type: ignore[attr-defined]
            if not isinstance(current, dict):
                raise TypeError(current)
            task_of = current.get
        if task_of(loop) is not _current_task():
            raise LookupError(loop)
        backend = _anyio_asyncio()
        states = backend._task_states
        data: Any = getattr(states, "data", None)  # the WeakKeyDictionary's own dict of refs
        scope = backend.CancelScope()
        ok = (
            isinstance(states, weakref.WeakKeyDictionary)
            and isinstance(data, dict)
            and "cancel_scope" in backend.TaskState.__slots__
            and type(scope._cancel_called) is bool
            and type(scope._shield) is bool
            and scope._parent_scope is None
        )
        if ok:
            _private_states_get = data.get
            ok = _asyncio_private(loop) == public
    except Exception:
        ok = False
    if ok:
        states_get = _private_states_get
    asyncio_pending = _asyncio_private if ok else _asyncio_public
    _modes["asyncio"] = _PRIVATE if ok else _PUBLIC
    return public


# ----------------------------------------------------------------------------- trio


def _trio_run_context() -> Any:
    """trio's ``GLOBAL_RUN_CONTEXT``, whose ``task`` is the running task."""
    return sys.modules["trio"]._core._run.GLOBAL_RUN_CONTEXT


def _trio_private() -> bool:
    task = trio_context.task
    if task._cancel_status.effectively_cancelled:
        return True
    runner = task._runner
    return bool(runner.ki_pending and task is runner.main_task)


def _trio_public() -> bool:
    return True  # trio's own checkpoint_if_cancelled() answers, for every call


def _trio_probe() -> bool:
    """The first question on trio: check the structure, compare answers, pick a path."""
    global trio_pending, trio_context
    trio = sys.modules["trio"]
    try:
        # The running task, as trio.lowlevel.current_task() reads it (without its call).
        context = _trio_run_context()
        task = trio.lowlevel.current_task()
        if context.task is not task:
            raise LookupError(task)
        runner = task._runner
        # The public deadline leaves out a pending Ctrl-C, which the private answer has.
        public = trio.current_effective_deadline() == -math.inf or (
            runner.ki_pending and task is runner.main_task
        )
        ok = (
            type(task._cancel_status.effectively_cancelled) is bool
            and type(runner.ki_pending) is bool
            and type(task._cancel_points) is int
            and runner.main_task is not None
        )
        if ok:
            trio_context = context
            ok = _trio_private() == public
    except Exception:
        ok = False
    if not ok:
        trio_context = None
    trio_pending = _trio_private if ok else _trio_public
    _modes["trio"] = _PRIVATE if ok else _PUBLIC
    return True  # this once, let trio's own checkpoint_if_cancelled() answer


#: Whether a cancellation is pending for the running asyncio task of ``loop``, the loop
#: running in this thread;
#: then the caller awaits anyio's checkpoint, which raises it.
asyncio_pending = _asyncio_probe
#: Whether the running trio task must await trio's ``checkpoint_if_cancelled()``: a
#: cancellation or Ctrl-C is pending (always ``True`` on the public path, which lets trio
#: answer).
trio_pending = _trio_probe
