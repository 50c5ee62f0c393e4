"""Token: proof of one admitted slot, releasable once from any task, thread or event loop."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, NoReturn, final

if TYPE_CHECKING:
    from types import CodeType, TracebackType

    from typing_extensions import Self

    from ._gate import Gate

__all__ = ["Token"]


@final
class Token:
    """One admitted slot of a :class:`Gate`.

    A token is created only by a gate (``acquire``, ``acquire_nowait``, ``acquire_sync``).
    Unlike ``anyio.CapacityLimiter``, it is not bound to the task that acquired it: hand it to
    another task, thread or event loop and release it there. :meth:`release` is synchronous,
    never awaits (so no cancellation can interrupt it halfway) and idempotent, so several
    cleanup paths may all call it and the first one wins.

    A token is also a context manager, sync and async; leaving the block releases it.

    A token that is garbage-collected unreleased gives its slot back and emits a
    :class:`ResourceWarning` naming the gate and the ``file:line`` that acquired it. Treat
    that as a bug report, not a feature: collection may happen much later than the work.

    This is not a lease: it has no expiry, and the gate never revokes it.
    """

    # ``_gate`` is None once released; the gate flips it under its lock so two threads
    # releasing at once cannot both give the slot back. ``_home`` stays set: a settle
    # after release still corrects the rate budget.
    __slots__ = ("_code", "_cost", "_gate", "_home", "_lasti", "_since")

    _gate: Gate | None
    _home: Gate
    # Tokens charged to the gate's token budget for this admission (``acquire(tokens=)``,
    # then whatever the last settle said); written under the gate's lock.
    _cost: int
    # The acquiring frame's code object and instruction offset: two cheap reads at acquire
    # time; the file:line they point to is worked out only when someone asks.
    _code: CodeType
    _lasti: int
    # time.monotonic() at admission, for Gate.holders().
    _since: float

    # Annotated None, not NoReturn: with NoReturn mypy types the class itself as a callable
    # returning Never and rejects object.__new__(Token) in make_token.
    def __init__(self, *args: object, **kwargs: object) -> None:
        self._gate = None  # the half-built object is still finalized: keep __del__ quiet
        msg = "Token has no public constructor; obtain one from Gate.acquire() and friends"
        raise TypeError(msg)

    @property
    def released(self) -> bool:
        """Whether the slot has been given back."""
        return self._gate is None

    @property
    def acquired_at(self) -> str:
        """``file:line`` of the code that acquired this token."""
        return code_site(self._code, self._lasti)

    @property
    def tokens(self) -> int:
        """Tokens charged for this admission: ``acquire(tokens=)``, or the last settle."""
        return self._cost

    def release(self) -> None:
        """Give the slot back. Safe from any task or thread; a second call does nothing.

        Releasing never refunds rate budget: the request was made. Use :meth:`settle` to
        correct the token charge.
        """
        gate = self._gate
        if gate is not None:
            gate._release(self)

    def settle(self, *, tokens: int) -> None:
        """State the call's real token cost; the gate charges or refunds the difference.

        The token's charge *becomes* ``tokens``: the difference from what was charged so
        far (``acquire(tokens=)``, or an earlier settle) is applied exactly once, so
        settling twice with the same value changes nothing and nothing is ever refunded
        twice. A refund wakes whoever can now go. Safe from any task or thread, and also
        after :meth:`release` (usage often arrives with the end of a stream); it only
        touches the token budget, never the slot. Without a token rate on the gate it only
        records the value.

        Args:
            tokens: the call's total tokens (e.g. ``usage.total_tokens``), an int >= 0.

        Raises:
            TypeError: ``tokens`` is not an int (bools are rejected).
            ValueError: ``tokens`` is negative or above 2**53. The gate is unchanged.
        """
        value: object = tokens
        if isinstance(value, bool) or not isinstance(value, int):
            msg = f"tokens must be an int >= 0 (got {value!r} of type {type(value).__name__})"
            raise TypeError(msg)
        if not 0 <= value <= 2**53:
            msg = f"tokens must be >= 0 and <= 2**53 (got {value!r})"
            raise ValueError(msg)
        self._home._settle(self, value)

    def __copy__(self) -> NoReturn:
        # A copy would be a second release of one slot (in_flight would go negative).
        msg = "a Token stands for one slot and cannot be copied; pass the token itself"
        raise TypeError(msg)

    def __deepcopy__(self, memo: object) -> NoReturn:
        self.__copy__()

    def __reduce__(self) -> NoReturn:
        msg = "a Token is bound to a gate in this process and cannot be pickled"
        raise TypeError(msg)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        self.release()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        self.release()

    def __del__(self) -> None:
        # __del__ rather than weakref.finalize: a finalizer per token costs 1-3 us at
        # creation, __del__ costs nothing until collection. The gate defers the actual
        # release because this may run while this very thread holds the gate's lock.
        # Cleared first: in a garbage cycle this token may be finalized before the object
        # that owns it, whose own cleanup may then still call release(); that must be a
        # no-op, not a second give-back of the same slot.
        gate = self._gate
        if gate is not None:
            self._gate = None
            gate._reclaim_leaked(self._code, self._lasti)

    def __repr__(self) -> str:
        gate = self._gate
        state = "released" if gate is None else f"held on gate {gate.name!r}"
        return f"<anygate.Token {state}, acquired at {self.acquired_at}>"


_new_token = object.__new__
_monotonic = time.monotonic


def make_token(gate: Gate, code: CodeType, lasti: int, cost: int = 0) -> Token:
    """Create a held token; only gates call this."""
    token: Token = _new_token(Token)
    token._gate = token._home = gate
    token._code = code
    token._lasti = lasti
    token._cost = cost
    token._since = _monotonic()
    return token


def code_site(code: CodeType, lasti: int) -> str:
    """``file:line`` of instruction offset ``lasti`` in ``code``."""
    line = code.co_firstlineno
    for start, end, lineno in code.co_lines():
        if start <= lasti < end and lineno is not None:
            line = lineno
            break
    return f"{code.co_filename}:{line}"
