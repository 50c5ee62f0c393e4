"""The ``naive`` strategy: what client code does before anyone thinks about storms.

No cap (every agent calls the provider whenever it wants), every 429/503 retried after a
fixed exponential delay (1 s, 2 s, 4 s, ... with the defaults) and no jitter, so callers that
failed together retry together. Deliberately *not* built from :class:`anygate.Policy`: it
shows what happens without it. It is a client of the public strategy protocol like every
other built-in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio

from ._protocol import CallLost
from ._provider import ProviderError

if TYPE_CHECKING:
    from ._protocol import Send
    from ._spec import NaiveSpec

__all__ = ["NaiveClient"]


class NaiveClient:
    """Makes each call with fixed exponential backoff and no client-side cap.

    Args:
        spec: backoff base, factor, ceiling and attempt budget.
    """

    def __init__(self, spec: NaiveSpec) -> None:
        self._spec = spec

    @property
    def summary(self) -> str:
        """One line describing the strategy."""
        spec = self._spec
        return (
            f"no cap; retry every 429/503 after {spec.base_delay_s:g}s x {spec.factor:g}^n "
            f"(max {spec.max_delay_s:g}s), no jitter, {spec.max_attempts} attempts"
        )

    async def call(self, send: Send) -> None:
        """Make one logical call, retrying as the spec says."""
        spec = self._spec
        delay = spec.base_delay_s
        for attempt in range(1, spec.max_attempts + 1):
            try:
                await send()
            except ProviderError as exc:  # noqa: PERF203 - a retry loop, as in the peer's source
                if attempt == spec.max_attempts:
                    raise CallLost("gave_up") from exc
                await anyio.sleep(min(delay, spec.max_delay_s))
                delay *= spec.factor
            else:
                return
