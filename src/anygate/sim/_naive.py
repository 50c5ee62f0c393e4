"""The ``naive`` strategy: what client code does before anyone thinks about storms.

No cap (every agent calls the provider whenever it wants), every 429/503 retried after a
fixed exponential delay (1 s, 2 s, 4 s, ... with the defaults) and no jitter, so callers that
failed together retry together. This is the baseline the other strategies are measured
against; it is deliberately *not* built from :class:`anygate.Policy`, because the point is to
show what happens without it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import anyio

from ._provider import ProviderError, ProviderModel

if TYPE_CHECKING:
    from ._results import Recorder
    from ._spec import NaiveSpec
    from ._workload import CallPlan

__all__ = ["NaiveInvoker"]


class NaiveInvoker:
    """Makes each call with fixed exponential backoff and no client-side cap.

    Args:
        spec: backoff base, factor, ceiling and attempt budget.
        provider: the simulated provider.
        recorder: where the call records go.
    """

    def __init__(self, spec: NaiveSpec, provider: ProviderModel, recorder: Recorder) -> None:
        self._spec = spec
        self._provider = provider
        self._recorder = recorder

    @property
    def summary(self) -> str:
        """One line describing the strategy."""
        spec = self._spec
        return (
            f"no cap; retry every 429/503 after {spec.base_delay_s:g}s x {spec.factor:g}^n "
            f"(max {spec.max_delay_s:g}s), no jitter, {spec.max_attempts} attempts"
        )

    async def __call__(self, call: CallPlan) -> None:
        """Make one logical call, retrying as the spec says."""
        spec, recorder = self._spec, self._recorder
        record = recorder.begin(call.index)
        deadline = recorder.call_deadline_s
        delay = spec.base_delay_s
        # A caller's deadline bounds the whole call, as an enclosing timeout would.
        with anyio.move_on_after(math.inf if deadline is None else deadline):
            for attempt in range(1, spec.max_attempts + 1):
                record.attempts += 1
                try:
                    await self._provider.serve(call.service_s)
                except ProviderError as exc:
                    record.got_429 |= exc.status_code == 429
                    if attempt == spec.max_attempts:
                        break
                    await anyio.sleep(min(delay, spec.max_delay_s))
                    delay *= spec.factor
                else:
                    recorder.finish(record, "ok")
                    return
        recorder.finish(record, "gave_up")
