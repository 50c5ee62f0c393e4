"""What a token is: its fields, and what can be read off it without changing it.

Why. :class:`~anygate._gate.token.Token` is one object whose hot paths (the acquisition in
``__aenter__``, the release in ``__aexit__``) are spelled out inline for the benchmarks,
and that is most of it; the rest is what a token *is*. :class:`TokenState` declares every
field (with what writes it), the read-only properties (``released``, ``acquired_at``,
``in_flight_at_admission``, ``tokens``), the refusals to be copied or pickled (a copy would
be a second release of one slot) and the repr; :func:`code_site` turns the acquiring frame
into ``file:line``. ``Token`` extends it.

Not for: anything that changes a token or its gate (admission, release, settle, the
finalizer's reclaim), which is :mod:`anygate._gate.token`'s; and not for use on its own:
only ``Token`` is ever made.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from types import CodeType

    from .gate import Gate

__all__ = ["TokenState", "code_site"]


class TokenState:
    """A token's fields and its read-only view, which :class:`anygate.Token` extends."""

    # ``_gate`` is None until admitted and once released; the gate flips it under its lock
    # so two threads releasing at once cannot both give the slot back. ``_home`` stays
    # set: a settle after release still corrects the rate budget.
    __slots__ = (
        "_code",
        "_cost",
        "_gate",
        "_home",
        "_lasti",
        "_out",
        "_priority",
        "_seen",
        "_since",
        "_timeout",
    )

    _gate: Gate | None
    _home: Gate
    # Tokens charged to the gate's token budget for this admission (``acquire(tokens=)``,
    # then whatever the last settle said); written under the gate's lock.
    _cost: int
    # The output part of ``_cost`` (``acquire(output_tokens=)``, then the last settle's),
    # for a rate's split budgets; written only when stated (see ledger.token_out).
    _out: int
    # The acquiring frame's code object and instruction offset: two cheap reads at acquire
    # time; the file:line they point to is worked out only when someone asks.
    _code: CodeType
    _lasti: int
    # time.monotonic() at admission, for Gate.holders(); PENDING or ACQUIRING before.
    _since: float
    # What acquire() was asked for: the wait limit and the priority class.
    _timeout: float | None
    _priority: int
    # The gate's in_flight as this token was admitted (see in_flight_at_admission).
    _seen: int

    @property
    def released(self) -> bool:
        """Whether the slot has been given back."""
        return self._gate is None and self._since >= 0.0

    @property
    def acquired_at(self) -> str:
        """``file:line`` of the code that acquired this token."""
        return code_site(self._code, self._lasti)

    @property
    def admitted_at(self) -> float | None:
        """When the slot was granted, on ``time.monotonic()``; ``None`` before admission.

        For a caller that waited in the queue, the moment the gate handed it the slot (a
        release or a raise, in whichever task or thread made it), which comes before its
        own task runs again: a process stopped in between (SIGSTOP, a VM pause) holds the
        slot from then, not from when it resumed. Kept after the release.
        """
        since = self._since
        return since if since >= 0.0 else None

    @property
    def in_flight_at_admission(self) -> int:
        """The gate's ``in_flight`` just after this token was admitted, itself included.

        What the gate looked like at admission, before the acquire's schedule point let
        other tasks run (they may have been admitted meanwhile): the policy's adaptive
        limit learns a provider's slots from it. ``0`` until admitted.
        """
        try:
            return self._seen
        except AttributeError:  # set at admission only: a store fewer per acquire()
            return 0

    @property
    def tokens(self) -> int:
        """Tokens charged for this admission: ``acquire(tokens=)``, or the last settle."""
        return self._cost

    def __copy__(self) -> NoReturn:
        # A copy would be a second release of one slot (in_flight would go negative).
        msg = "a Token stands for one slot and cannot be copied; pass the token itself"
        raise TypeError(msg)

    def __deepcopy__(self, memo: object) -> NoReturn:
        self.__copy__()

    def __reduce__(self) -> NoReturn:
        msg = "a Token is bound to a gate in this process and cannot be pickled"
        raise TypeError(msg)

    def __repr__(self) -> str:
        gate = self._gate
        if gate is not None:
            state = f"held on gate {gate.name!r}"
        elif self._since >= 0.0:
            state = "released"
        else:
            state = f"not admitted yet on gate {self._home.name!r}"
        return f"<anygate.Token {state}, acquired at {self.acquired_at}>"


def code_site(code: CodeType, lasti: int) -> str:
    """``file:line`` of instruction offset ``lasti`` in ``code``."""
    line = code.co_firstlineno
    for start, end, lineno in code.co_lines():
        if start <= lasti < end and lineno is not None:
            line = lineno
            break
    return f"{code.co_filename}:{line}"
