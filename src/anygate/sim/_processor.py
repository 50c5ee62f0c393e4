"""The ``cookbook-parallel`` peer: the OpenAI cookbook's ``api_request_parallel_processor``.

Written from ``examples/api_request_parallel_processor.py`` (openai-cookbook, main late
2026), the script OpenAI points users to for batches under rate limits:

* two budgets, requests and tokens, each starting *full* at its per-minute value and
  refilled continuously (``available += max_per_minute * seconds_since_update / 60``,
  capped at the per-minute value);
* a request goes out only when both hold what it costs: 1 request, and prompt tokens +
  ``max_tokens * n`` (``num_tokens_consumed_from_request``; ``n`` is 1 here), deducted
  at sending and never given back;
* any error sends the request back to the retry queue, up to ``max_attempts`` (5) attempts
  in all; an error whose message contains "Rate limit" makes *every* request wait until
  ``seconds_to_pause_after_rate_limit_error`` (15 s) after it;
* no concurrency cap, no backoff, no Retry-After.

The budgets are the script's defaults' share of the published limits: it ships
``max_requests_per_minute = 3_000 * 0.5`` and ``max_tokens_per_minute = 250_000 * 0.5``
("leave headroom by setting this to 50 % or 75 % of your limit"), so this peer paces at
half the published RPM and TPM (no budget where nothing is published).

Differences, each with its reason: the script polls every 1 ms; this waits exactly until
the budget suffices (the same instants, without 1,000 wake-ups a second). Its retry queue
goes before new requests; here a retry queues behind the requests already waiting (the
fleet's calls arrive from many agents, not from one file).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Final

import anyio

from ._protocol import CallLost
from ._provider import ProviderError

if TYPE_CHECKING:
    from ._protocol import Send, StrategyContext

__all__ = ["ParallelProcessor"]

#: ``max_attempts`` default of ``process_api_requests_from_file``.
MAX_ATTEMPTS: Final = 5
#: ``seconds_to_pause_after_rate_limit_error`` in the script.
PAUSE_AFTER_RATE_LIMIT_S: Final = 15.0
#: The script's defaults are half of the limits they name (see the module docstring).
HEADROOM: Final = 0.5


class _Budget:
    """One of the script's capacities: full at the start, refilled per second, capped."""

    def __init__(self, per_minute: float) -> None:
        self.per_minute = per_minute
        self.available = per_minute
        self._at: float | None = None

    def refill(self, now: float) -> None:
        if self._at is not None:
            self.available = min(
                self.per_minute, self.available + self.per_minute * (now - self._at) / 60.0
            )
        self._at = now

    def wait(self, cost: float) -> float:
        """Seconds until ``cost`` is available (after :meth:`refill`)."""
        short = cost - self.available
        # Slack: after sleeping the computed time, float rounding can leave a shortfall
        # too small for the clock to advance on, and the loop would spin at one instant.
        return 0.0 if short <= 1e-6 else short * 60.0 / self.per_minute


class ParallelProcessor:
    """``api_request_parallel_processor`` as a strategy; see the module docstring."""

    summary = (
        "OpenAI cookbook api_request_parallel_processor: request and token budgets at 50 % "
        "of the published RPM/TPM, refilled continuously; 5 attempts; every request waits "
        "15 s after a 'Rate limit' error; no cap"
    )

    def __init__(self, context: StrategyContext) -> None:
        published = context.published
        self._requests = None if published.rpm is None else _Budget(published.rpm * HEADROOM)
        self._tokens = None if published.tpm is None else _Budget(published.tpm * HEADROOM)
        self._turn = anyio.Lock()  # one request at a time picks its instant, in order
        self._last_rate_limit = -math.inf

    async def _wait_for_budget(self, tokens: float) -> None:
        async with self._turn:
            while True:
                now = anyio.current_time()
                pause = self._last_rate_limit + PAUSE_AFTER_RATE_LIMIT_S - now
                if pause > 0:
                    await anyio.sleep(pause)
                    continue
                wait = 0.0
                for budget, cost in ((self._requests, 1.0), (self._tokens, tokens)):
                    if budget is not None:
                        budget.refill(now)
                        # A request larger than the whole budget would wait forever in
                        # the script too; here it goes when the budget is full.
                        wait = max(wait, budget.wait(min(cost, budget.per_minute)))
                if wait > 0:
                    await anyio.sleep(wait)
                    continue
                for budget, cost in ((self._requests, 1.0), (self._tokens, tokens)):
                    if budget is not None:
                        budget.available -= cost
                return

    async def call(self, send: Send) -> None:
        """One request of the file: up to 5 attempts, each through the budgets."""
        tokens = float(getattr(send, "prompt_tokens", 0) + getattr(send, "max_tokens", 0))
        for attempt in range(1, MAX_ATTEMPTS + 1):
            await self._wait_for_budget(tokens)
            try:
                await send()
            except ProviderError as exc:
                if "Rate limit" in exc.message:
                    self._last_rate_limit = anyio.current_time()
                if attempt == MAX_ATTEMPTS:
                    raise CallLost("gave_up") from exc
            else:
                return
