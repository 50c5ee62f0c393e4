"""Per-minute limits as token buckets with continuous refill (OpenAI, Anthropic, Azure).

OpenAI: "rate limits are enforced ... with a token bucket-like algorithm" and may be
quantized ("60,000 TPM may be enforced as 1,000 tokens per second"); the request's
``max_tokens`` counts at admission (openai cookbook ``api_request_parallel_processor``,
Azure OpenAI quota docs). Anthropic: "we use the token bucket algorithm ... capacity is
continuously replenished up to your maximum limit", with input and output tokens limited
separately and output tokens estimated from ``max_tokens`` at admission, settled at the end
(docs.claude.com/en/api/rate-limits). This module holds the arithmetic only: the provider
decides what to charge and when.

Azure OpenAI (``rule: azure``, :class:`AzureWindows`) is not a bucket: a deployment has a
TPM quota and RPM = 6 per 1,000 TPM, and "Azure OpenAI evaluates the rate of incoming
requests over a small period of time, typically 1 or 10 seconds"; each request is charged
an estimate of prompt + ``max_tokens`` at admission (learn.microsoft.com, Azure OpenAI
"Quotas and limits" / "Manage quota"). Windows as stuartleeks/aoai-simulated-api evaluates
them (``limiters.py``, ``SlidingWindow``, after its "return to sliding window rate
limiting"): at most ``ceil(TPM / 1000)`` requests in any sliding 10 s (RPM / 6; RPM / 60
per second with ``interval_s: 1``) and at most TPM tokens in any sliding 60 s, this
request included; a rejected request is not recorded.

Not modelled: a provider's per-model and per-project pools, or any quantization other than
a shorter ``capacity_s``.
"""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from ._spec import TokenLimits

__all__ = ["AzureWindows", "Bucket", "Buckets", "Window", "make_buckets"]

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


class Window(Bucket):
    """A sliding window: at most ``capacity`` units admitted in any ``window_s`` seconds.

    A unit counts from its admission until ``window_s`` later (an entry keeps its expiry,
    so "still counted" and "a positive wait" are the same float comparison). ``limit`` is
    the per-minute figure the headers and 429s quote; ``rate`` is ``capacity / window_s``
    (for the lower bound). Nothing is given back (:meth:`give` does nothing).
    """

    __slots__ = ("_entries", "_used", "window_s")

    def __init__(
        self, kind: str, dimension: str, limit: int, capacity: float, window_s: float
    ) -> None:
        # Not Bucket.__init__: no refill level; the attributes callers read are set here.
        self.kind = kind
        self.dimension = dimension
        self.limit = limit
        self.capacity = capacity
        self.window_s = window_s
        self.rate = capacity / window_s
        self._entries: deque[tuple[float, float]] = deque()  # (expiry, cost), oldest first
        self._used = 0.0

    def _purge(self, now: float) -> None:
        entries = self._entries
        while entries and entries[0][0] <= now:
            self._used -= entries.popleft()[1]
        if not entries:
            self._used = 0.0

    def level(self, now: float) -> float:
        """Units that may still be admitted at ``now``."""
        self._purge(now)
        return max(0.0, self.capacity - self._used)

    def wait(self, cost: float, now: float) -> float:
        """Seconds until ``cost`` fits: until enough of the oldest entries have expired."""
        if cost > self.capacity + _SLACK:
            return math.inf
        self._purge(now)
        excess = self._used + cost - self.capacity
        if excess <= _SLACK:
            return 0.0
        for expiry, units in self._entries:
            excess -= units
            if excess <= _SLACK:
                return expiry - now
        return math.inf  # unreachable: cost <= capacity

    def take(self, cost: float, now: float) -> None:
        """Record an admission of ``cost`` units at ``now``."""
        self._purge(now)
        self._entries.append((now + self.window_s, cost))
        self._used += cost

    def give(self, units: float, now: float) -> None:
        """Nothing comes back: the estimate charged at admission stays in the window."""

    def reset_s(self, now: float) -> float:
        """Seconds until the window is empty again (the ``reset`` headers)."""
        self._purge(now)
        return self._entries[-1][0] - now if self._entries else 0.0


class AzureWindows(Buckets):
    """Azure OpenAI's rule for a deployment of ``limits.tpm`` (see the module docstring).

    The same interface as :class:`Buckets`, so the provider, the oracle and the lower
    bound treat both alike: kind ``rpm`` for the request window, ``tpm`` for the tokens.
    """

    def __init__(self, limits: TokenLimits) -> None:
        if limits.tpm is None:  # _parse refuses it; the check keeps the types honest
            msg = "rule azure needs a tpm"
            raise ValueError(msg)
        self.limits = limits
        tpm = limits.tpm
        rpm = 6.0 * tpm / 1000.0  # Azure: "RPM = 6 per 1,000 TPM"
        per_interval = math.ceil(rpm * limits.interval_s / 60.0 - 1e-9)
        self.all = (
            Window("rpm", "requests", max(1, math.floor(rpm)), per_interval, limits.interval_s),
            Window("tpm", "tokens", tpm, float(tpm), 60.0),
        )
        self.by_kind = {b.kind: b for b in self.all}

    def short(self, prompt: int, max_tokens: int, now: float) -> tuple[Bucket, float] | None:
        """The window that objects longest (its wait is the Retry-After), as
        aoai-simulated-api reports the reason with the later reset."""
        worst: tuple[Bucket, float] | None = None
        for window in self.all:
            wait = window.wait(self.cost(window, prompt, max_tokens), now)
            if wait > 0 and (worst is None or wait > worst[1]):
                worst = (window, wait)
        return worst

    def settle(self, max_tokens: int, completion: int, now: float) -> None:
        """Nothing is settled: the estimate stays charged."""


def make_buckets(limits: TokenLimits) -> Buckets:
    """The limiter ``limits.rule`` names: token buckets, or Azure's windows."""
    return AzureWindows(limits) if limits.rule == "azure" else Buckets(limits)
