"""The public type of what :meth:`anygate.Gate.acquire` returns.

A :class:`~typing.Protocol`, not the class the gate really returns: at run time that is the
:class:`Token` to be, not yet admitted (awaiting or entering it is the acquisition, so the
uncontended ``async with`` builds one object), and annotations in user code name only this
protocol, which keeps that choice free to change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Generator
    from types import TracebackType

    from .token import Token

__all__ = ["Acquisition"]


class Acquisition(Protocol):
    """What :meth:`Gate.acquire` returns: await it for a :class:`Token`, or enter it.

    ``token = await gate.acquire()`` waits for a slot and hands you the token to release;
    ``async with gate.acquire() as token:`` waits the same way and releases the token when
    the block ends, however it ends. Use this name to annotate code that passes an
    acquisition along before awaiting or entering it. Each acquisition stands for one
    slot: awaiting or entering it again gives back the same token and takes no second
    slot (call ``gate.acquire()`` again for another), and doing so while its first wait
    is still running, or after that wait failed, raises ``RuntimeError``. :meth:`anygate.fleet.FleetGate.acquire`
    returns one too.

    You never construct one: only a gate (or a fleet) does.
    """

    def __await__(self) -> Generator[Any, None, Token]:
        """Wait for a slot and return its token (the caller releases it)."""
        ...

    async def __aenter__(self) -> Token:
        """Wait for a slot and return its token, released by ``__aexit__``."""
        ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        """Release the token taken by ``__aenter__`` (idempotent, never raises)."""
        ...
