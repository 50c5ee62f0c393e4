"""The public transport classes' shell, shared by :mod:`anygate.httpx` and :mod:`anygate.httpx2`.

The two libraries have the same transport shape but distinct classes, and each client checks
``isinstance`` against its own base classes, so each flavour module must still define its
own ``GatedTransport`` deriving from its library's ``AsyncBaseTransport``. Everything else
lives here once: the constructor, the properties, the request entry point, ``aclose`` and the
repr, generic over the library's transport, request and response types so that a type
checker still sees ``httpx2.Request -> httpx2.Response`` on ``anygate.httpx2``. A flavour
module only names its library's classes (a :class:`~._flavour.Flavour`) and formats the
docstrings below with its library's name.

The per-request path is one call, :meth:`~._transport.TransportCore.send_async` /
``send_sync``: what a request does (validation, slot, policy, errors at the SDK boundary)
is added there, never here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from ._transport import Flavour, TransportCore

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from .. import Gate, Policy

__all__ = ["ASYNC_DOC", "BUSY_DOC", "CIRCUIT_OPEN_DOC", "SYNC_DOC", "AsyncShell", "SyncShell"]

# The library's AsyncBaseTransport / BaseTransport, Request and Response.
InnerT = TypeVar("InnerT")
RequestT = TypeVar("RequestT")
ResponseT = TypeVar("ResponseT")


class _Shell(Generic[InnerT]):
    """What both transport kinds share: the core, the properties and the repr."""

    _flavour: ClassVar[Flavour]
    _is_async: ClassVar[bool]
    _core: TransportCore

    def __init__(
        self,
        inner: InnerT | None = None,
        *,
        gate: Gate | None = None,
        policy: Policy | None = None,
        timeout: float | None = None,
        learn_limits: bool = True,
        tokens: bool | Callable[[Mapping[str, Any]], int | None] = True,
    ) -> None:
        self._core = TransportCore(
            self._flavour,
            inner,
            gate=gate,
            policy=policy,
            timeout=timeout,
            is_async=self._is_async,
            learn_limits=learn_limits,
            tokens=tokens,
        )
        # The per-request entry point bound straight to the engine's, in the instance:
        # the client's call then runs one coroutine frame, not this class's method and
        # the engine's (an await of a coroutine per request, issue 14). The methods below
        # stay for the base classes, help() and type checkers.
        if self._is_async:
            self.__dict__["handle_async_request"] = self._core.send_async
        else:
            self.__dict__["handle_request"] = self._core.send_sync

    @property
    def gate(self) -> Gate:
        """The gate requests take their slots from."""
        return self._core.gate

    @property
    def policy(self) -> Policy | None:
        """The policy failed requests are retried under, if any."""
        return self._core.policy

    @property
    def inner(self) -> InnerT:
        """The wrapped transport."""
        inner: InnerT = self._core.inner
        return inner

    def __repr__(self) -> str:
        return (
            f"<anygate.{self._flavour.name}.{type(self).__name__} gate={self.gate.name!r} "
            f"inner={type(self._core.inner).__name__}>"
        )


class AsyncShell(_Shell[InnerT], Generic[InnerT, RequestT, ResponseT]):
    """The body of ``GatedTransport``; see :data:`ASYNC_DOC` for what it does."""

    _is_async = True

    async def handle_async_request(self, request: RequestT) -> ResponseT:
        """Take a slot, send ``request`` through ``inner``, and tie the slot to the response."""
        response: ResponseT = await self._core.send_async(request)
        return response

    async def aclose(self) -> None:
        """Close the inner transport."""
        inner: Any = self._core.inner
        await inner.aclose()


class SyncShell(_Shell[InnerT], Generic[InnerT, RequestT, ResponseT]):
    """The body of ``SyncGatedTransport``; see :data:`SYNC_DOC` for what it does."""

    _is_async = False

    def handle_request(self, request: RequestT) -> ResponseT:
        """Take a slot, send ``request`` through ``inner``, and tie the slot to the response."""
        response: ResponseT = self._core.send_sync(request)
        return response

    def close(self) -> None:
        """Close the inner transport."""
        inner: Any = self._core.inner
        inner.close()


# The public docstrings, formatted with the library's import name ({lib}). Each flavour
# class also spells out its summary line as a literal docstring, which is what static tools
# (pyright --verifytypes, editors) read; the assigned __doc__ is what help() and Sphinx show.
ASYNC_DOC = """An async {lib} transport that sends each request only while holding a gate slot.

    Wrap the transport you would otherwise use (by default ``{lib}.AsyncHTTPTransport()``)
    and pass the result to ``{lib}.AsyncClient(transport=...)``. Client settings that
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
            ``{lib}.AsyncHTTPTransport()``.
        gate: the gate every request takes its slot from; default ``policy.gate``.
        policy: classify, retry and circuit-break failed requests under this policy.
        timeout: longest wait for a slot, in seconds. ``None`` (the default): the policy's
            ``busy_wait_s``, or as long as it takes without a policy (an enclosing cancel
            scope or the caller's cancellation still ends the wait).
        learn_limits: learn the provider's limits from every response's rate-limit
            headers and pace the gate to them (``docs/learning.md``); default on.
        tokens: token accounting while the gate has a token budget: ``True`` (default)
            estimates each request from its JSON body and settles it, once, from the usage
            the response reports (JSON or stream); ``False`` turns it off; a callable taking
            the request's JSON and returning a count (or ``None``) replaces the estimate.

    Raises:
        TypeError: neither ``gate`` nor ``policy`` given, or one of them of the wrong type;
            ``inner`` is not an async transport (a transport of the other library is
            refused with a pointer to the module for it).
        ValueError: ``timeout`` is negative or NaN.
        TypeError: ``learn_limits`` is not a bool, ``tokens`` not a bool or a callable.
        TransportBusy: from a request, when no slot came within ``timeout`` (an
            :class:`anygate.Busy` and a ``{lib}.PoolTimeout``).
        TransportCircuitOpen: from a request, while the policy's breaker is open (an
            :class:`anygate.CircuitOpen` and a ``{lib}.TransportError``).
    """

SYNC_DOC = """The blocking twin of :class:`GatedTransport`, for ``{lib}.Client``.

    Waits for a slot with :meth:`anygate.Gate.acquire_sync` and between retries with
    ``time.sleep``, so use it from plain threads, never from a thread running an event loop.
    Same slot lifetime and policy behaviour as :class:`GatedTransport` (the policy's
    ``attempt_timeout_s`` does not apply: a blocking attempt cannot be interrupted).

    Args:
        inner: the transport that really sends requests; ``None`` for
            ``{lib}.HTTPTransport()``.
        gate: the gate every request takes its slot from; default ``policy.gate``.
        policy: classify, retry and circuit-break failed requests under this policy.
        timeout: longest wait for a slot, in seconds; ``None``: the policy's
            ``busy_wait_s``, or as long as it takes without a policy.
        learn_limits, tokens: as for :class:`GatedTransport`.

    Raises:
        TypeError: neither ``gate`` nor ``policy`` given, one of them of the wrong type, or
            ``inner`` is not a sync transport.
        ValueError: ``timeout`` is negative or NaN.
        anygate.Busy: from a request, when no slot came within ``timeout``.
        anygate.CircuitOpen: from a request, while the policy's breaker is open.
        RuntimeError: from a request made on a thread that runs an event loop.
    """

BUSY_DOC = """Raised by a gated {lib} transport when no slot came within its wait.

    An :class:`anygate.Busy` (same attributes and message) that is also a
    ``{lib}.PoolTimeout``, so the client and an SDK on top treat it as their own: the
    OpenAI and Anthropic SDKs raise ``APITimeoutError`` (a kind of ``APIConnectionError``)
    with this as its ``__cause__``, and retry it if their ``max_retries`` allows.
    """

CIRCUIT_OPEN_DOC = """Raised by a gated {lib} transport while its policy's breaker is open.

    An :class:`anygate.CircuitOpen` (same attributes and message) that is also a
    ``{lib}.TransportError``: nothing was sent. The OpenAI and Anthropic SDKs raise
    ``APIConnectionError`` with this as its ``__cause__`` (and retry it if their
    ``max_retries`` allows: set it to 0 on a client whose transport has a policy).
    """
