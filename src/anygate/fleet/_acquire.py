"""What :meth:`FleetGate.acquire` returns: awaitable, and an async context manager."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, final

if TYPE_CHECKING:
    from collections.abc import Generator
    from types import TracebackType

    from .._gate.acquisition import Acquisition
    from .._gate.token import Token
    from ._fleet import FleetGate

__all__ = ["_FleetAcquire"]


@final
class _FleetAcquire:
    """The local gate's acquisition, plus a kick to the agent when the slot goes back.

    Returning the lease at once matters while this process sheds toward its fair share
    (another process is short); a bare ``fleet.gate`` user is noticed by the agent's
    poll instead (2 ms while shares are being enforced).
    """

    __slots__ = ("_fleet", "_inner")

    def __init__(self, fleet: FleetGate, inner: Acquisition) -> None:
        self._fleet = fleet
        self._inner = inner

    def __await__(self) -> Generator[Any, None, Token]:
        return self._inner.__await__()

    async def __aenter__(self) -> Token:
        return await self._inner.__aenter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        await self._inner.__aexit__(exc_type, exc_val, exc_tb)
        self._fleet._released()
