"""Process-wide named objects, each created once under a lock: the named gates here.

:class:`Registry` also holds the policy room's named breakers (``_policy.sharing``), which
stay there so that the gate room imports nothing of the policy's.
"""

from __future__ import annotations

import math
import threading
from contextlib import contextmanager
from typing import TYPE_CHECKING, Generic, TypeVar

from .._validation import check_name
from .gate import Gate
from .gate_args import check_capacity as _check_capacity
from .gate_args import check_fast_acquire as _check_fast_acquire

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

__all__ = ["Registry", "gates", "shared_gate"]

T = TypeVar("T")


class Registry(Generic[T]):
    """A name -> object map whose entries are created exactly once, thread-safely."""

    def __init__(self, kind: str) -> None:
        self._kind = kind
        self._lock = threading.Lock()
        self._items: dict[str, T] = {}

    def get_or_create(self, name: str, factory: Callable[[], T]) -> tuple[T, bool]:
        """The object called ``name``, creating it with ``factory()`` if absent.

        Returns the object and whether this call created it. ``factory`` runs under the
        registry's lock, so it must be quick and must not touch this registry.
        """
        check_name("name", name)  # whitespace-only too, as Gate(name=) (issue 28)
        with self._lock:
            item = self._items.get(name)
            if item is not None:
                return item, False
            item = self._items[name] = factory()
            return item, True

    def get(self, name: str) -> T | None:
        with self._lock:
            return self._items.get(name)

    @contextmanager
    def isolated(self) -> Iterator[None]:
        """Testing aid: start from an empty registry and restore the old one on exit."""
        with self._lock:
            saved, self._items = self._items, {}
        try:
            yield
        finally:
            with self._lock:
                self._items = saved


gates: Registry[Gate] = Registry("gate")


def shared_gate(
    name: str, *, capacity: float | None = None, fast_acquire: bool | None = None
) -> Gate:
    """The one process-wide :class:`Gate` called ``name``, created on first use.

    Every caller in the process, on any thread or event loop, that asks for the same name
    gets the same instance. ``capacity`` applies only when this call creates the gate
    (``None`` then means unlimited). A later call may repeat the same capacity or pass
    ``None``; passing a *different* capacity raises ``ValueError`` instead of silently
    resizing a gate other code is using (a stale config could otherwise undo a fresher
    one). To resize on purpose, assign ``shared_gate(name).capacity``.

    ``fast_acquire`` follows the same rule: it applies when this call creates the gate
    (``None`` then means ``False``, the checkpointing default of :class:`Gate`), and a
    later call stating a different value raises ``ValueError``. It cannot change later.

    Raises:
        TypeError, ValueError: bad ``name``, ``capacity`` or ``fast_acquire``, or a
            conflicting ``capacity`` or ``fast_acquire``.
    """
    cap = math.inf if capacity is None else _check_capacity(capacity)
    fast = False if fast_acquire is None else _check_fast_acquire(fast_acquire)
    gate, created = gates.get_or_create(name, lambda: Gate(cap, name=name, fast_acquire=fast))
    if not created and capacity is not None and gate.capacity != cap:
        msg = (
            f"shared_gate({name!r}) already exists with capacity {gate.capacity!r}; "
            f"got capacity={capacity!r}. Assign shared_gate({name!r}).capacity to resize it"
        )
        raise ValueError(msg)
    if not created and fast_acquire is not None and gate.fast_acquire != fast:
        msg = (
            f"shared_gate({name!r}) already exists with fast_acquire={gate.fast_acquire!r}; "
            f"got fast_acquire={fast_acquire!r}. It is fixed when the gate is created"
        )
        raise ValueError(msg)
    return gate
