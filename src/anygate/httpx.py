"""Gate every request of a plain ``httpx`` client through anygate (extra ``anygate[httpx]``).

The same API as :mod:`anygate.httpx2`, for code on httpx 0.27 / 0.28 (including older
OpenAI and Anthropic SDKs and everything else built on httpx)::

    gate = anygate.Gate(capacity=8, name="llm")
    http = httpx.AsyncClient(transport=anygate.httpx.GatedTransport(gate=gate))

Each HTTP request takes one slot before it is sent and keeps it until its response is closed:
for a streamed response that is when the stream is exhausted or closed, by whichever task
does it. The current OpenAI (3.x) and Anthropic (2.x) SDKs use httpx2: see
:mod:`anygate.httpx2`.

This module imports httpx; ``import anygate`` alone does not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, final

try:
    import httpx
except ImportError as _exc:
    from .integrations._transport import missing_library

    raise missing_library("httpx") from _exc

from .integrations import _transport

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

    from ._gate import Gate
    from ._policy import Policy

__all__ = ["GatedTransport", "SyncGatedTransport"]


class _AsyncBody(_transport.AsyncBody, httpx.AsyncByteStream):
    pass


class _SyncBody(_transport.SyncBody, httpx.SyncByteStream):
    pass


_FLAVOUR = _transport.Flavour(
    name="httpx",
    async_body=_AsyncBody,
    sync_body=_SyncBody,
    byte_stream=httpx.ByteStream,
    response=httpx.Response,
    async_transport=httpx.AsyncHTTPTransport,
    sync_transport=httpx.HTTPTransport,
)


@final
class GatedTransport(httpx.AsyncBaseTransport):
    """An async httpx transport that sends each request only while holding a gate slot.

    Wrap the transport you would otherwise use (by default ``httpx.AsyncHTTPTransport()``)
    and pass the result to ``httpx.AsyncClient(transport=...)``. Client settings that
    configure the *default* transport (``limits``, ``http2``, ``verify``, ``proxy``) do not
    apply to a transport you pass in: set them on ``inner``.

    The slot is taken before the request is sent and given back exactly once, when the
    response is closed or its body has been read to the end, when sending or reading fails,
    or when the caller is cancelled. A streamed response keeps its slot while it streams,
    and any task may finish or close it. A response dropped unclosed gets its slot back
    when it is garbage-collected, with a :class:`ResourceWarning`.

    Without a policy this is not a retry layer: an SDK's own retries (``max_retries``) run,
    each attempt takes its own slot, and since the SDKs close a failed response before
    their backoff sleep, no slot is held while they wait. With a ``policy``, anygate
    retries instead: responses with status 408, 409, 425, 429 or 5xx (and connection
    errors) are classified by the policy (headers and JSON ``error.code``/``error.type``
    included, so ``limit_burst_rate`` is recognised), feed its breaker and events, and are
    retried with its backoff, without a slot between attempts. When it gives up, the last
    response is returned marked ``x-should-retry: false`` so the SDK raises its usual error
    without retrying again; set the SDK's ``max_retries=0`` so that connection errors are
    not retried twice either. Requests whose body is a stream (not bytes) are sent once.

    Args:
        inner: the transport that really sends requests; ``None`` for
            ``httpx.AsyncHTTPTransport()``.
        gate: the gate every request takes its slot from; default ``policy.gate``.
        policy: classify, retry and circuit-break failed requests under this policy.
        timeout: longest wait for a slot, in seconds. ``None`` (the default): the policy's
            ``busy_wait_s``, or as long as it takes without a policy (an enclosing cancel
            scope or the caller's cancellation still ends the wait).
        learn_limits: learn the provider's limits from every response's rate-limit
            headers and pace the gate to them (``docs/learning.md``); default on.
        tokens: token accounting while the gate has a token budget: ``True`` (default)
            estimates each request from its JSON body and settles it from the usage the
            response reports (JSON or stream), ``False`` turns it off, a callable taking
            the request's JSON and returning a count (or ``None``) replaces the estimate.

    Raises:
        TypeError: neither ``gate`` nor ``policy`` given, or one of them of the wrong type;
            ``inner`` is not an async transport (a plain ``httpx`` transport is refused
            with a pointer to :mod:`anygate.httpx`).
        ValueError: ``timeout`` is negative or NaN.
        TypeError: ``learn_limits`` is not a bool, ``tokens`` not a bool or callable.
        anygate.Busy: from a request, when no slot came within ``timeout``.
        anygate.CircuitOpen: from a request, while the policy's breaker is open.
    """

    def __init__(
        self,
        inner: httpx.AsyncBaseTransport | None = None,
        *,
        gate: Gate | None = None,
        policy: Policy | None = None,
        timeout: float | None = None,
        learn_limits: bool = True,
        tokens: bool | Callable[[Mapping[str, Any]], int | None] = True,
    ) -> None:
        self._core = _transport.TransportCore(
            _FLAVOUR,
            inner,
            gate=gate,
            policy=policy,
            timeout=timeout,
            is_async=True,
            learn_limits=learn_limits,
            tokens=tokens,
        )

    @property
    def gate(self) -> Gate:
        """The gate requests take their slots from."""
        return self._core.gate

    @property
    def policy(self) -> Policy | None:
        """The policy failed requests are retried under, if any."""
        return self._core.policy

    @property
    def inner(self) -> httpx.AsyncBaseTransport:
        """The wrapped transport."""
        inner: httpx.AsyncBaseTransport = self._core.inner
        return inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Take a slot, send ``request`` through ``inner``, and tie the slot to the response."""
        if not isinstance(request, httpx.Request):
            raise _transport.wrong_client("httpx", request)
        response: httpx.Response = await self._core.send_async(request)
        return response

    async def aclose(self) -> None:
        """Close the inner transport."""
        await self._core.inner.aclose()

    def __repr__(self) -> str:
        return f"<anygate.httpx.GatedTransport gate={self.gate.name!r} inner={type(self._core.inner).__name__}>"


@final
class SyncGatedTransport(httpx.BaseTransport):
    """The blocking twin of :class:`GatedTransport`, for ``httpx.Client``.

    Waits for a slot with :meth:`anygate.Gate.acquire_sync` and between retries with
    ``time.sleep``, so use it from plain threads, never from a thread running an event loop.
    Same slot lifetime and policy behaviour as :class:`GatedTransport` (the policy's
    ``attempt_timeout_s`` does not apply: a blocking attempt cannot be interrupted).

    Args:
        inner: the transport that really sends requests; ``None`` for
            ``httpx.HTTPTransport()``.
        gate: the gate every request takes its slot from; default ``policy.gate``.
        policy: classify, retry and circuit-break failed requests under this policy.
        timeout: longest wait for a slot, in seconds; ``None``: the policy's
            ``busy_wait_s``, or as long as it takes without a policy.
        learn_limits, tokens: as for :class:`GatedTransport`.

    Raises:
        TypeError: neither ``gate`` nor ``policy`` given, one of them of the wrong type, or
            ``inner`` is not a sync transport.
        ValueError: ``timeout`` is negative or NaN.
        TypeError: ``learn_limits`` is not a bool, ``tokens`` not a bool or callable.
        anygate.Busy: from a request, when no slot came within ``timeout``.
        anygate.CircuitOpen: from a request, while the policy's breaker is open.
        RuntimeError: from a request made on a thread that runs an event loop.
    """

    def __init__(
        self,
        inner: httpx.BaseTransport | None = None,
        *,
        gate: Gate | None = None,
        policy: Policy | None = None,
        timeout: float | None = None,
        learn_limits: bool = True,
        tokens: bool | Callable[[Mapping[str, Any]], int | None] = True,
    ) -> None:
        self._core = _transport.TransportCore(
            _FLAVOUR,
            inner,
            gate=gate,
            policy=policy,
            timeout=timeout,
            is_async=False,
            learn_limits=learn_limits,
            tokens=tokens,
        )

    @property
    def gate(self) -> Gate:
        """The gate requests take their slots from."""
        return self._core.gate

    @property
    def policy(self) -> Policy | None:
        """The policy failed requests are retried under, if any."""
        return self._core.policy

    @property
    def inner(self) -> httpx.BaseTransport:
        """The wrapped transport."""
        inner: httpx.BaseTransport = self._core.inner
        return inner

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Take a slot, send ``request`` through ``inner``, and tie the slot to the response."""
        if not isinstance(request, httpx.Request):
            raise _transport.wrong_client("httpx", request)
        response: httpx.Response = self._core.send_sync(request)
        return response

    def close(self) -> None:
        """Close the inner transport."""
        self._core.inner.close()

    def __repr__(self) -> str:
        return f"<anygate.httpx.SyncGatedTransport gate={self.gate.name!r} inner={type(self._core.inner).__name__}>"
