"""The simulated provider: slots, an RPM limit, a burst-slope rule, outages, latency.

A request arrives, is checked against the rules in a fixed order, and is either answered
with an error after a short "reject latency" or served for its service time:

1. inside an outage window            -> 503 ``overloaded`` (529 ``overloaded_error`` with
                                         Anthropic headers)
   a shared pool's random share         -> its kind's answer, counted toward nothing
2. the sliding-window RPM limit       -> 429 ``rate_limit_exceeded``        (kind ``rpm``)
   the token buckets (``tokens``)     -> 429 per bucket    (kinds ``rpm``, ``tpm``, ``itpm``,
                                         ``otpm``; Azure's windows with ``rule: azure``;
                                         see :mod:`._buckets`)
3. the burst-slope rule               -> 429 ``limit_burst_rate``           (kind ``burst``)
4. every slot busy, ``on_full=reject`` -> 429 ``concurrency_limit_exceeded`` (kind ``concurrency``)
   ``on_full=queue``: wait FIFO for a slot; beyond ``max_queue`` waiting -> 503 (``queue_full``)

A request that passes rules 2 and 3 counts toward both, even if rule 4 then turns it away:
the rate limiter sits in front of the model servers, as it does at real providers, so a retry
storm against full slots burns the rate budget too. A request rejected by rule 2 or 3 counts
toward nothing, unless the burst rule says ``count_rejected`` (then every arrival outside an
outage counts toward the slope). With a dynamic threshold the burst rule's growth factor
drifts from window to window along a path drawn once per seed (the same for every strategy).

The burst rule is *a* slope throttle, not the one DashScope or Volcengine Ark enforce: their
documentation says only that a sudden surge is throttled and that the threshold "adjusts
dynamically". The dynamic threshold and ``count_rejected`` exist to test that a strategy does
not depend on one particular slope rule.

Every answer, success or error, carries the rate-limit headers ``provider.headers`` names,
and the errors' wording follows :mod:`._answers`.

The errors are shaped like the openai / anthropic SDK errors (``status_code``, ``code``,
``type``, ``body["error"]``, ``response.headers``) so :func:`anygate.classify` recognises
them by duck typing, the same way it recognises the real ones.

This is a model for comparing client strategies, not a faithful copy of any provider: real
rate limiters are undisclosed and differ in details (window alignment, per-model pools).
"""

from __future__ import annotations

import math
import weakref
from collections import deque
from typing import TYPE_CHECKING, Final

import anyio

from .. import Busy, Gate

# The answers a client gets live with their wording; imported from here as well.
from ._answers import (
    Dimension,
    ProviderError,
    ProviderResponse,
    Used,
    answer,
    limit_headers,
    retry_after_seconds,
)
from ._buckets import Buckets, make_buckets

if TYPE_CHECKING:
    import random
    from collections.abc import Callable

    from .. import Token
    from ._spec import Lognormal, ProviderSpec

__all__ = [
    "KINDS",
    "ProviderError",
    "ProviderModel",
    "ProviderResponse",
    "Trace",
    "retry_after_seconds",
    "sample",
]

# The marker _check_rules returns for a shared pool's random rejection.
_POOL: Final = "pool"

#: Every way the provider can turn a request away, in report order.
KINDS: Final = ("burst", "rpm", "tpm", "itpm", "otpm", "concurrency", "overloaded", "queue_full")


def sample(dist: Lognormal, rng: random.Random) -> float:
    """Draw one duration: ``median_s * exp(sigma * N(0, 1))`` clipped to ``[min_s, max_s]``."""
    if dist.sigma == 0:
        value = dist.median_s
    else:
        value = dist.median_s * math.exp(dist.sigma * rng.gauss(0.0, 1.0))
    return min(max(value, dist.min_s), dist.max_s)


class Trace:
    """What the provider saw, for the report and the chart.

    Attributes:
        in_service: ``(time, requests in service)`` after every change.
        rejects: ``(time, kind)`` for every request turned away, at arrival.
        counts: requests by outcome: ``ok`` plus every kind in :data:`KINDS`.
        max_in_service: the most requests served at once.
        admitted: requests that got a slot.
        tokens: prompt plus completion tokens of every request served.
    """

    def __init__(self) -> None:
        self.in_service: list[tuple[float, int]] = [(0.0, 0)]
        self.rejects: list[tuple[float, str]] = []
        self.counts: dict[str, int] = dict.fromkeys(("ok", *KINDS), 0)
        self.max_in_service = 0
        self.admitted = 0
        self.tokens = 0


class ProviderModel:
    """One simulated provider; see the module docstring for the rules and their order.

    Args:
        spec: the provider's parameters.
        rng: source of reject latencies (service times come with each request, drawn once
            per logical call, so every strategy serves the same work).
        growth_rng, pool_rng, head_rng: the dynamic threshold's path, the shared pool's
            draws and the times to first byte, each its own stream.
        epoch: the ``anyio.current_time()`` that counts as time 0 (outage windows, burst
            windows and the trace are relative to it).

    Not thread-safe and not meant to be: it runs inside one virtual-clock trio run.
    """

    def __init__(
        self,
        spec: ProviderSpec,
        rng: random.Random,
        *,
        epoch: float = 0.0,
        growth_rng: random.Random | None = None,
        pool_rng: random.Random | None = None,
        head_rng: random.Random | None = None,
    ) -> None:
        import random as _random

        self._spec = spec
        self._rng = rng
        # The dynamic threshold's path: its own stream, so it is the same for every strategy.
        self._growth_rng = growth_rng if growth_rng is not None else _random.Random(0)
        self._growths: list[float] = []
        # The shared pool's draws: their own stream, so they do not shift reject latencies.
        self._pool_rng = pool_rng if pool_rng is not None else _random.Random(1)
        self._pool_errors: weakref.WeakSet[ProviderError] = weakref.WeakSet()
        # The times to first byte (serve's on_headers): their own stream, so a client that
        # asks for them shifts no reject latency, and one that does not draws nothing.
        self._head_rng = head_rng if head_rng is not None else _random.Random(2)
        self._on_leave: list[Callable[[], None]] = []
        self._epoch = epoch
        self._slots = Gate(spec.slots, name="provider")
        self._in_service = 0
        self._admissions: deque[float] = deque()  # admission times within the RPM window
        self._window = -1  # index of the burst window being counted
        self._window_count = 0
        self._previous_count = 0
        self._buckets = None if spec.tokens is None else make_buckets(spec.tokens)
        self.trace = Trace()

    @property
    def in_service(self) -> int:
        """Requests being served right now."""
        return self._in_service

    async def serve(
        self,
        service_s: float,
        prompt_tokens: int = 0,
        max_tokens: int = 0,
        completion_tokens: int = 0,
        *,
        on_headers: Callable[[int, dict[str, str]], None] | None = None,
    ) -> ProviderResponse:
        """Handle one request that needs ``service_s`` seconds of a slot.

        With token buckets it costs ``prompt_tokens`` and ``max_tokens`` at admission and
        its answer is ``completion_tokens`` long (the output bucket is settled to it).

        ``on_headers``: called with the answer's status (200) and headers when it starts,
        a time to first byte after the request got its slot (a draw of the reject
        latency, no longer than ``service_s``: a real API takes about as long to start a
        stream as to refuse a request), while the rest of ``service_s`` (the generation)
        runs on. Its draws come from a stream of their own, and the request ends when it
        would have without it: callers that pass none see exactly what they saw before.

        Raises:
            ProviderError: the request was turned away (after the reject latency).
        """
        now = anyio.current_time() - self._epoch
        kind, until_free, used = self._check_rules(now, prompt_tokens, max_tokens)
        headers = self._limit_headers(now)
        slot = kind if kind is not None else await self._take_slot()
        if isinstance(slot, str):
            raise await self._rejection(now, slot, until_free, used, headers)
        with slot:
            self._enter()
            try:
                if on_headers is None:
                    await anyio.sleep(service_s)
                else:
                    await self._stream(service_s, headers, on_headers)
            finally:
                if self._buckets is not None:
                    # Before _leave: the oracle re-checks the buckets when a request leaves.
                    end = anyio.current_time() - self._epoch
                    self._buckets.settle(max_tokens, completion_tokens, end)
                self._leave()
        trace = self.trace
        trace.counts["ok"] += 1
        trace.tokens += prompt_tokens + completion_tokens
        return ProviderResponse(headers, prompt_tokens, completion_tokens)

    async def _stream(
        self,
        service_s: float,
        headers: dict[str, str],
        on_headers: Callable[[int, dict[str, str]], None],
    ) -> None:
        """Serve ``service_s`` with the answer's start reported after the first byte."""
        end = anyio.current_time() + service_s  # what anyio.sleep(service_s) would wait for
        await anyio.sleep(min(sample(self._spec.reject_latency, self._head_rng), service_s))
        on_headers(200, dict(headers))
        await anyio.sleep_until(end)

    def _limit_headers(self, now: float) -> dict[str, str]:
        """The rate-limit headers of a response to a request that arrived at ``now``."""
        style = self._spec.headers
        if style == "none":
            return {}
        dims: list[Dimension] = []
        buckets = self._buckets
        rpm = self._spec.rpm
        if rpm is not None and (buckets is None or "rpm" not in buckets.by_kind):
            window = self._admissions
            reset = window[-1] + 60.0 - now if window else 0.0
            dims.append(Dimension("requests", rpm, rpm - len(window), max(reset, 0.0)))
        if buckets is not None:
            dims += [
                Dimension(b.dimension, b.limit, b.level(now), b.reset_s(now)) for b in buckets.all
            ]
        return limit_headers(style, dims, now)

    async def _take_slot(self) -> Token | str:
        """Rule 4: a slot, or the kind of rejection when none can be had."""
        spec = self._spec
        if spec.on_full == "reject":
            try:
                return self._slots.acquire_nowait()
            except Busy:
                return "concurrency"
        if spec.max_queue is not None and self._slots.waiting >= spec.max_queue:
            return "queue_full"
        return await self._slots.acquire()

    def growth(self, index: int) -> float:
        """The burst rule's growth factor in window ``index`` (fixed, or the drifting path)."""
        burst = self._spec.burst
        if burst is None:
            return 1.0
        if not burst.dynamic or burst.growth_min is None or burst.growth_max is None:
            return burst.growth
        path = self._growths
        while len(path) <= index:
            last = path[-1] if path else burst.growth
            step = self._growth_rng.uniform(-burst.drift, burst.drift) if path else 0.0
            path.append(min(max(last + step, burst.growth_min), burst.growth_max))
        return path[index]

    def _roll(self, now: float) -> int:
        """Move the burst bookkeeping to the window holding ``now``; its allowance."""
        burst = self._spec.burst
        assert burst is not None
        index = math.floor(now / burst.window_s)
        if index != self._window:
            self._previous_count = self._window_count if index == self._window + 1 else 0
            self._window = index
            self._window_count = 0
        return max(burst.floor, math.floor(self.growth(max(index, 0)) * self._previous_count))

    def _rpm_full(self, now: float) -> bool:
        window = self._admissions
        while window and window[0] <= now - 60.0:
            window.popleft()
        return self._spec.rpm is not None and len(window) >= self._spec.rpm

    def _check_rules(
        self, now: float, prompt: int = 0, max_tokens: int = 0
    ) -> tuple[str | None, float | None, Used | None]:
        """Rules 1-3 of the module docstring; records the admission when all pass.

        Returns the rejection kind (``None``: admitted so far), how long until the rule
        that objected would admit (``None``: no such time) and, for a per-minute limit, the
        numbers its 429 quotes.
        """
        spec = self._spec
        for outage in spec.outages:
            if outage.start_s <= now < outage.end_s:
                return "overloaded", None, None
        pool = spec.shared_pool
        if pool is not None and self._pool_rng.random() < pool.probability:
            if spec.burst is not None and spec.burst.count_rejected:
                self._roll(now)
                self._window_count += 1
            return _POOL, None, None
        burst = spec.burst
        allowed = self._roll(now) if burst is not None else 0
        counts_all = burst is not None and burst.count_rejected
        if spec.rpm is not None and self._rpm_full(now):
            if counts_all:
                self._window_count += 1
            used = Used(spec.rpm, len(self._admissions), 1)
            return "rpm", self._admissions[0] + 60.0 - now, used
        buckets = self._buckets
        if buckets is not None and (short := buckets.short(prompt, max_tokens, now)):
            bucket, wait = short
            if counts_all:
                self._window_count += 1
            requests = buckets.by_kind.get("rpm")
            # OpenAI: "unsuccessful requests contribute to your per-minute limit".
            charged = requests if buckets.limits.charge_rejected else None
            if charged is not None and charged is not bucket and charged.wait(1.0, now) == 0.0:
                charged.take(1.0, now)
            cost = Buckets.cost(bucket, prompt, max_tokens)
            used = Used(bucket.limit, round(bucket.capacity - bucket.level(now)), round(cost))
            return bucket.kind, wait, used
        if burst is not None:
            if self._window_count >= allowed:
                if counts_all:
                    self._window_count += 1
                return "burst", (self._window + 1) * burst.window_s - now, None
            self._window_count += 1
        if spec.rpm is not None:
            self._admissions.append(now)
        if buckets is not None:
            buckets.take(prompt, max_tokens, now)
        return None, None, None

    def admission_wait(self, prompt_tokens: int = 0, max_tokens: int = 0) -> float | None:
        """For the oracle only: how long until a request sent now would be admitted.

        ``0``: a request sent now passes every rule and gets a slot at once; a positive
        number: rules 1-3 turn requests away for that long at least (ask again then);
        ``None``: rules 1-3 would pass but every slot is busy (ask again after a request
        leaves). Reads the provider's hidden state; no strategy but the oracle may call it.
        It changes nothing a request would not (it only moves the burst window forward).
        """
        spec = self._spec
        now = anyio.current_time() - self._epoch
        # Never 0 while a rule objects: ``a + 60 - now`` can round to 0.0 when ``a + 60`` is
        # still (by one ulp) after ``now``; asking again a nanosecond later is exact.
        tiny = 1e-9
        for outage in spec.outages:
            if outage.start_s <= now < outage.end_s:
                return max(outage.end_s - now, tiny)
        if spec.rpm is not None and self._rpm_full(now):
            return max(self._admissions[0] + 60.0 - now, tiny)
        burst = spec.burst
        if burst is not None:
            # Roll first: ``count >= self._roll(now)`` read the count of the last window
            # with admissions before the roll reset it, so after a quiet window (an outage)
            # the oracle idled a whole window the rules allowed (issue 29).
            allowed = self._roll(now)
            if self._window_count >= allowed:
                return max((self._window + 1) * burst.window_s - now, tiny)
        if self._buckets is not None:
            short = self._buckets.short(prompt_tokens, max_tokens, now)
            if short is not None:
                return max(short[1], tiny)
        if self._slots.in_flight >= spec.slots:
            return None
        return 0.0

    def _retry_after(self, until_free: float | None) -> float | None:
        setting = self._spec.retry_after
        if setting is None or until_free is None or not math.isfinite(until_free):
            return None
        if setting == "auto":
            return max(until_free, 0.001)
        return setting

    def turned_away_at_random(self, exc: BaseException) -> bool:
        """For the oracle only: whether ``exc`` is one of the shared pool's random answers
        (which no client can avoid, so the oracle sends again at once)."""
        return exc in self._pool_errors

    async def _rejection(
        self,
        now: float,
        kind: str,
        until_free: float | None,
        used: Used | None,
        headers: dict[str, str],
    ) -> ProviderError:
        """Count a rejection, wait the reject latency, and return the error to raise."""
        spec = self._spec
        if kind == _POOL:
            pool = spec.shared_pool
            assert pool is not None
            error = await self._rejection(now, pool.kind, None, None, headers)
            self._pool_errors.add(error)
            return error
        trace = self.trace
        trace.counts[kind] += 1
        trace.rejects.append((now, kind))
        await anyio.sleep(sample(spec.reject_latency, self._rng))
        wait = until_free if until_free is not None and math.isfinite(until_free) else None
        said = answer(kind, style=spec.headers, plain=spec.plain_429, used=used, wait_s=wait)
        return ProviderError(kind, self._retry_after(until_free), said=said, headers=headers)

    def _enter(self) -> None:
        self._in_service += 1
        trace = self.trace
        trace.admitted += 1
        trace.in_service.append((anyio.current_time() - self._epoch, self._in_service))
        trace.max_in_service = max(trace.max_in_service, self._in_service)

    def _leave(self) -> None:
        self._in_service -= 1
        self.trace.in_service.append((anyio.current_time() - self._epoch, self._in_service))
        for listener in self._on_leave:
            listener()

    def on_leave(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` whenever a request leaves its slot (for the oracle)."""
        self._on_leave.append(listener)
