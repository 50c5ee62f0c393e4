"""The public type of what :meth:`anygate.Gate.acquire` returns.

A :class:`~typing.Protocol`, not the class the gate really returns: that class
(``anygate._acquire._Acquire``) is tuned for the uncontended path (slots, no generator per
acquire) and stays free to change, while annotations in user code name only this.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Generator
    from types import TracebackType

    from ._token import Token

__all__ = ["Acquisition"]


class Acquisition(Protocol):
    """What :meth:`Gate.acquire` returns: await it for a :class:`Token`, or enter it.

    ``token = await gate.acquire()`` waits for a slot and hands you the token to release;
    ``async with gate.acquire() as token:`` waits the same way and releases the token when
    the block ends, however it ends. Use this name to annotate code that passes an
    acquisition along before awaiting or entering it. It is not a token, and each
    acquisition is meant to be awaited or entered once. :meth:`anygate.fleet.FleetGate.acquire`
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
