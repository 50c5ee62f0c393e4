"""Per-minute limits as token buckets with continuous refill (OpenAI, Anthropic, Azure).

OpenAI: "rate limits are enforced ... with a token bucket-like algorithm" and may be
quantized ("60,000 TPM may be enforced as 1,000 tokens per second"); the request's
``max_tokens`` counts at admission (openai cookbook ``api_request_parallel_processor``,
Azure OpenAI quota docs). Anthropic: "we use the token bucket algorithm ... capacity is
continuously replenished up to your maximum limit", with input and output tokens limited
separately and output tokens estimated from ``max_tokens`` at admission, settled at the end
(docs.claude.com/en/api/rate-limits). This module holds the arithmetic only: the provider
decides what to charge and when.

Not modelled: a provider's per-model and per-project pools, or any quantization other than
a shorter ``capacity_s``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from ._spec import TokenLimits

__all__ = ["Bucket", "Buckets"]

# Refill is float arithmetic: a request that waited exactly the computed time must pass,
# so a level within this many units of the cost counts as enough.
_SLACK: Final = 1e-6


class Bucket:
    """One limit: ``limit`` units per minute, holding at most ``capacity_s`` of refill.

    Full at time 0. ``level`` may not go below 0 through :meth:`take` (callers check
    :meth:`wait` first); :meth:`give` returns units, never past the capacity.
    """

    __slots__ = ("_at", "_level", "capacity", "dimension", "kind", "limit", "rate")

    def __init__(
        self, kind: str, dimension: str, limit: int, capacity_s: float, background: float = 0.0
    ) -> None:
        self.kind = kind  # the rejection kind: rpm, tpm, itpm, otpm
        self.dimension = dimension  # the header name: requests, tokens, input-tokens, ...
        self.limit = limit
        # Another service on the same key spending ``background`` of the refill, steadily:
        # what is left for this client refills that much slower (the limit stays the same).
        self.rate = limit * (1.0 - background) / 60.0
        self.capacity = limit * capacity_s / 60.0
        self._level = self.capacity
        self._at = 0.0

    def level(self, now: float) -> float:
        """Units available at ``now`` (refilled since the last change)."""
        if now > self._at:
            self._level = min(self.capacity, self._level + (now - self._at) * self.rate)
            self._at = now
        return self._level

    def wait(self, cost: float, now: float) -> float:
        """Seconds until ``cost`` units are available: 0 now, ``inf`` beyond the capacity."""
        if cost > self.capacity + _SLACK:
            return math.inf
        short = cost - self.level(now)
        return 0.0 if short <= _SLACK else short / self.rate

    def take(self, cost: float, now: float) -> None:
        """Charge ``cost`` units (the caller checked :meth:`wait` is 0)."""
        self._level = max(0.0, self.level(now) - cost)

    def give(self, units: float, now: float) -> None:
        """Return ``units`` (a settled estimate), up to the capacity."""
        self._level = min(self.capacity, self.level(now) + units)

    def reset_s(self, now: float) -> float:
        """Seconds until the bucket is full again (the ``reset`` headers)."""
        return (self.capacity - self.level(now)) / self.rate


class Buckets:
    """Every bucket of a :class:`~anygate.sim._spec.TokenLimits`, in check order."""

    def __init__(self, limits: TokenLimits) -> None:
        self.limits = limits
        spec = (
            ("rpm", "requests", limits.rpm),
            ("tpm", "tokens", limits.tpm),
            ("itpm", "input-tokens", limits.itpm),
            ("otpm", "output-tokens", limits.otpm),
        )
        self.all = tuple(
            Bucket(kind, dimension, limit, limits.capacity_s, limits.background)
            for kind, dimension, limit in spec
            if limit is not None
        )
        self.by_kind = {b.kind: b for b in self.all}

    @staticmethod
    def cost(bucket: Bucket, prompt: int, max_tokens: int) -> float:
        """What one request costs ``bucket`` at admission."""
        if bucket.kind == "rpm":
            return 1.0
        if bucket.kind == "tpm":
            return float(prompt + max_tokens)
        if bucket.kind == "itpm":
            return float(prompt)
        return float(max_tokens)

    def short(self, prompt: int, max_tokens: int, now: float) -> tuple[Bucket, float] | None:
        """The first bucket that cannot admit the request now and how long until it can."""
        for bucket in self.all:
            wait = bucket.wait(self.cost(bucket, prompt, max_tokens), now)
            if wait > 0:
                return bucket, wait
        return None

    def take(self, prompt: int, max_tokens: int, now: float) -> None:
        """Charge an admitted request to every bucket."""
        for bucket in self.all:
            bucket.take(self.cost(bucket, prompt, max_tokens), now)

    def settle(self, max_tokens: int, completion: int, now: float) -> None:
        """The answer is done: the output bucket gets back what ``max_tokens`` overestimated."""
        output = self.by_kind.get("otpm")
        if output is not None:
            output.give(max(0, max_tokens - completion), now)
