"""What users really run, written from the peers' current sources: their retry loops.

Each peer is a pure delay function (the formula, with its source and version in the
docstring, in :mod:`._peer_delays`) and a client here that runs the peer's retry loop
around :data:`~anygate.sim.Send`, on AnyIO time. The random draws happen in the same
order as in the source (for example tenacity computes the next wait *before* checking
whether to stop), from a seeded generator instead of the global one.

Sources read for these (late 2026): openai-python 3.57.0 ``_base_client.py`` /
``_constants.py``; tenacity 9.1.4+ (main at c650fb4) ``wait.py`` / ``__init__.py``; stamina
26.1.0+ (main at 87ccfa4) ``_core.py``; LiteLLM Router's retry path
(``async_function_with_retries``, ``_time_to_sleep_before_retry``,
``litellm.utils._calculate_retry_after``, ``constants.py``) and its deployment rpm/tpm check
(``router_utils/pre_call_checks/model_rate_limit_check.py``, called from
``Router.async_routing_strategy_pre_call_checks``). ``docs/simulate.md`` states the formulas and
what is modelled and what is not.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Final

import anyio

from ._peer_delays import (
    OPENAI_MAX_RETRIES,
    OPENAI_MAX_RETRY_AFTER,
    cookbook_wait,
    litellm_retry_delay,
    openai_retry_after,
    openai_retry_delay,
    openai_should_retry,
    stamina_backoff,
)
from ._processor import ParallelProcessor
from ._protocol import CallLost
from ._provider import ProviderError

if TYPE_CHECKING:
    from ._peer_delays import Random
    from ._protocol import Client, Send, StrategyContext

__all__ = ["PEERS", "SdkError", "sdk_request"]

#: ``+cap`` peers cap at the published concurrency, else at this (the usual hand-picked 32).
DEFAULT_CAP: Final = 32


# ---------------------------------------------------------------------- retry loops


class SdkError(Exception):
    """What the simulated openai client raises when it stops retrying (``APIStatusError``)."""

    def __init__(self, error: ProviderError, cause: str) -> None:
        super().__init__(str(error))
        self.status_code = error.status_code
        self.error = error
        self.cause = cause


async def sdk_request(send: Send, rng: Random, *, max_retries: int = OPENAI_MAX_RETRIES) -> None:
    """One ``client.chat.completions.create()``: openai-python's own retry loop.

    Raises:
        SdkError: the last rejection, once the SDK stops retrying.
    """
    for retries_taken in range(max_retries + 1):
        try:
            await send()
        except ProviderError as exc:  # noqa: PERF203 - a retry loop, as in the peer's source
            remaining = max_retries - retries_taken
            if remaining > 0 and openai_should_retry(exc.status_code, exc.headers):
                await anyio.sleep(openai_retry_delay(retries_taken, exc.headers, rng))
                continue
            retry_after = openai_retry_after(exc.headers)
            cause = "gave_up"
            if (
                retry_after is not None
                and math.isfinite(retry_after)
                and retry_after > OPENAI_MAX_RETRY_AFTER
            ):
                cause = "retry_after_too_long"
            raise SdkError(exc, cause) from exc
        else:
            return


class Sdk:
    """openai-python's built-in retries only (``max_retries=2``)."""

    summary = (
        "openai-python 3.57 defaults: 2 retries of 408/409/429/5xx, "
        "min(0.5*2^n, 8)*(1-0.25U) s or Retry-After <= 120 s; no cap"
    )

    def __init__(self, context: StrategyContext) -> None:
        self._rng = context.rng("sdk")

    async def call(self, send: Send) -> None:
        """One SDK call; its own retries only."""
        try:
            await sdk_request(send, self._rng)
        except SdkError as exc:
            raise CallLost(exc.cause) from exc


class Cookbook:
    """The OpenAI cookbook's tenacity recipe around a default client."""

    summary = (
        "tenacity wait_random_exponential(min=1, max=60), stop_after_attempt(6), "
        "around a default SDK client (its 2 retries inside each attempt); no cap"
    )

    def __init__(self, context: StrategyContext) -> None:
        self._sdk_rng = context.rng("sdk")
        self._rng = context.rng("tenacity")

    async def call(self, send: Send) -> None:
        """``@retry(wait=wait_random_exponential(min=1, max=60), stop=stop_after_attempt(6))``."""
        attempt_number = 1
        while True:
            try:
                await sdk_request(send, self._sdk_rng)
            except SdkError as exc:  # noqa: PERF203 - a retry loop, as in the peer's source
                # tenacity computes the wait before it checks the stop condition.
                wait = cookbook_wait(attempt_number, self._rng)
                if attempt_number >= 6:
                    raise CallLost("gave_up") from exc  # tenacity.RetryError
                await anyio.sleep(wait)
                attempt_number += 1
            else:
                return


class Stamina:
    """stamina's defaults around a default client."""

    summary = (
        "stamina.retry defaults: 10 attempts or 45 s, min(5, 0.1*2^(n-1) + U(0,1)) s, "
        "around a default SDK client (its 2 retries inside each attempt); no cap"
    )

    def __init__(self, context: StrategyContext) -> None:
        self._sdk_rng = context.rng("sdk")
        self._rng = context.rng("stamina")

    async def call(self, send: Send) -> None:
        """``@stamina.retry(on=<the SDK's 429/5xx errors>)`` with every other setting default."""
        start = anyio.current_time()
        attempt_number = 1
        while True:
            try:
                await sdk_request(send, self._sdk_rng)
            except SdkError as exc:  # noqa: PERF203 - a retry loop, as in the peer's source
                wait = stamina_backoff(attempt_number, self._rng)
                # stop_any(stop_after_attempt(10), stop_after_delay(45)): the delay is the
                # time from the first attempt's start to this failed attempt's end.
                if attempt_number >= 10 or anyio.current_time() - start >= 45.0:
                    raise CallLost("gave_up") from exc
                await anyio.sleep(wait)
                attempt_number += 1
            else:
                return


class LiteLLM:
    """LiteLLM Router with one deployment and its defaults (``num_retries`` 2, no cap)."""

    summary = (
        "LiteLLM Router, one deployment, defaults: num_retries 2, "
        "min(0.5*2^n, 8) + 0.75U s or int Retry-After <= 60 s (+ jitter); no cap"
    )

    def __init__(self, context: StrategyContext) -> None:
        self._rng = context.rng("litellm")
        self._num_retries = OPENAI_MAX_RETRIES  # Router: num_retries = openai.DEFAULT_MAX_RETRIES

    async def call(self, send: Send) -> None:
        """``async_function_with_retries``: the first try, then ``num_retries`` more.

        Each sleep reads the *first* error's headers, and the loop sleeps after the last
        failure too before it raises, as the Router does.
        """
        num_retries = self._num_retries
        try:
            await send()
        except ProviderError as first:
            original = first
        else:
            return
        await anyio.sleep(litellm_retry_delay(0, original.headers, self._rng))
        for current_attempt in range(num_retries):
            try:
                await send()
            except ProviderError:  # noqa: PERF203 - a retry loop, as in the peer's source
                await anyio.sleep(
                    litellm_retry_delay(current_attempt + 1, original.headers, self._rng)
                )
            else:
                return
        raise CallLost("gave_up") from original


class _MinuteCounts:
    """One of ``ModelRateLimitingCheck``'s counters: a count per calendar minute.

    LiteLLM keys it by the UTC minute (``f"{id}:{model}:rpm:{dt.strftime('%H-%M')}"``,
    60 s TTL), so a count covers the wall-clock minute it falls in, not the last 60 s.
    Virtual time 0 is a minute boundary (the provider's ``SIM_EPOCH``).
    """

    __slots__ = ("count", "minute")

    def __init__(self) -> None:
        self.minute = -1
        self.count = 0

    def now(self, at: float) -> int:
        """The count of the minute ``at`` falls in."""
        minute = math.floor(at / 60.0)
        if minute != self.minute:
            self.minute, self.count = minute, 0
        return self.count


class _ModelRateLimit(Exception):
    """The ``litellm.RateLimitError`` the pre-call check raises (429, ``retry-after: 60``,
    ``num_retries=0``): it never reaches the provider."""

    def __init__(self, kind: str, limit: int, used: int) -> None:
        super().__init__(f"Model rate limit exceeded. {kind} limit={limit}, current usage={used}")
        self.headers = {"retry-after": "60"}


class LiteLLMLimits(LiteLLM):
    """``litellm`` with ``rpm``/``tpm`` on the deployment, enforced by the Router.

    The deployment's ``rpm``/``tpm`` are the published RPM/TPM, with
    ``optional_pre_call_checks=["enforce_model_rate_limits"]``: without that check a
    single deployment's ``rpm``/``tpm`` are only ``simple-shuffle`` weights and nothing is
    enforced (the ``litellm`` row). ``ModelRateLimitingCheck.async_pre_call_check``
    (``router_utils/pre_call_checks/model_rate_limit_check.py``) runs before each attempt:

    * TPM first: the minute's token count (each *success* adds its ``total_tokens`` when
      it is logged; a request's own size is never checked) ``>= tpm``: rejected;
    * then RPM, increment first: the minute's request count, this one included (rejected
      attempts count too), ``> rpm``: rejected.

    A rejection is a 429 ``RateLimitError`` with ``num_retries=0``. On a call's first
    attempt that makes ``async_function_with_retries`` raise at once (``num_retries > 0``
    else ``raise``): the call is lost, with no wait. On a retry (the first attempt was a
    provider error) it is one more failed retry, and the loop sleeps as ``litellm`` does,
    from the first error's headers.
    """

    summary = (
        "litellm with deployment rpm/tpm = published RPM/TPM and enforce_model_rate_limits: "
        "per-UTC-minute counts (tokens at success); over them a 429 at once, never retried "
        "on a first attempt; no cap"
    )

    def __init__(self, context: StrategyContext) -> None:
        super().__init__(context)
        self._rpm = context.published.rpm
        self._tpm = context.published.tpm
        self._requests = _MinuteCounts()
        self._tokens = _MinuteCounts()

    def _check(self) -> None:
        """``async_pre_call_check``: raise :class:`_ModelRateLimit` over a limit."""
        now = anyio.current_time()
        if self._tpm is not None:
            used = self._tokens.now(now)
            if used >= self._tpm:  # LiteLLM: current_tpm is not None and >= tpm_limit
                raise _ModelRateLimit("TPM", self._tpm, used)
        if self._rpm is not None:
            self._requests.now(now)
            self._requests.count += 1
            if self._requests.count > self._rpm:
                raise _ModelRateLimit("RPM", self._rpm, self._requests.count)

    async def _attempt(self, send: Send) -> None:
        self._check()
        response = await send()
        usage = getattr(response, "usage", None)
        total = usage.get("total_tokens", 0) if isinstance(usage, dict) else 0
        if total:  # async_log_success_event: "if not model or not total_tokens: return"
            self._tokens.now(anyio.current_time())
            self._tokens.count += total

    async def call(self, send: Send) -> None:
        """``async_function_with_retries`` with the pre-call check before every attempt."""
        num_retries = self._num_retries
        try:
            await self._attempt(send)
        except _ModelRateLimit as exc:
            raise CallLost("model_rate_limit") from exc  # num_retries=0: raised at once
        except ProviderError as first:
            original = first
        else:
            return
        await anyio.sleep(litellm_retry_delay(0, original.headers, self._rng))
        for current_attempt in range(num_retries):
            try:
                await self._attempt(send)
            except (ProviderError, _ModelRateLimit):  # noqa: PERF203 - the source's loop
                await anyio.sleep(
                    litellm_retry_delay(current_attempt + 1, original.headers, self._rng)
                )
            else:
                return
        raise CallLost("gave_up") from original


class Capped:
    """``+cap``: a semaphore held around the whole logical call, retries and sleeps included.

    The usual idiom (``async with sem: await call_with_retries()``); it holds the permit
    through the SDK's and the wrapper's backoff sleeps, which paces a throttled fleet.
    """

    def __init__(self, inner: Client, cap: int) -> None:
        self._inner = inner
        self._cap = cap
        self._semaphore = anyio.Semaphore(cap)

    @property
    def summary(self) -> str:
        """The inner strategy's summary with the cap."""
        return self._inner.summary.replace("; no cap", "") + f"; semaphore cap {self._cap}"

    async def call(self, send: Send) -> None:
        """Hold a permit for the whole call."""
        async with self._semaphore:
            await self._inner.call(send)


def _capped(kind: type[Sdk | Cookbook | Stamina]) -> object:
    def factory(context: StrategyContext) -> Client:
        cap = context.published.concurrency or DEFAULT_CAP
        return Capped(kind(context), cap)

    return factory


#: The built-in peer factories, by strategy name (each is a public-protocol factory).
PEERS: Final = {
    "sdk": Sdk,
    "sdk+cap": _capped(Sdk),
    "cookbook": Cookbook,
    "cookbook+cap": _capped(Cookbook),
    "stamina": Stamina,
    "stamina+cap": _capped(Stamina),
    "litellm": LiteLLM,
    "litellm+limits": LiteLLMLimits,
    "cookbook-parallel": ParallelProcessor,
}
