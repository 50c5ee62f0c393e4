"""What :meth:`FleetGate.acquire` returns: awaitable, and an async context manager."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, final

if TYPE_CHECKING:
    from collections.abc import Generator
    from types import TracebackType

    from .._token import Token
    from ._fleet import FleetGate

__all__ = ["_FleetAcquire"]


@final
class _FleetAcquire:
    """What :meth:`FleetGate.acquire` returns: awaitable, and an async context manager."""

    __slots__ = ("_fleet", "_timeout", "_token")

    def __init__(self, fleet: FleetGate, timeout: float | None) -> None:
        self._fleet = fleet
        self._timeout = timeout
        self._token: Token | None = None

    def __await__(self) -> Generator[Any, None, Token]:
        return self._fleet._acquire(self._timeout).__await__()

    async def __aenter__(self) -> Token:
        self._token = await self._fleet._acquire(self._timeout)
        return self._token

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        if self._token is not None:
            self._token.release()
            self._fleet._released()
