"""The gated transport engine behind :mod:`anygate.httpx` and :mod:`anygate.httpx2`.

httpx and httpx2 have the same transport shape (``handle_async_request`` / ``handle_request``
returning a response whose ``stream`` the client reads and closes), but their classes are
distinct and both clients check ``isinstance`` against their own base classes. So the logic
lives here, typed structurally and importing neither library, and each flavour module hands
in a :class:`Flavour` (defined in ``_flavour``, with the errors for a missing or mixed-up
library): the body classes built on its own ``AsyncByteStream`` / ``SyncByteStream`` and its
``Response`` (used only to decode a buffered error body).

The slot's life: acquired before the request is sent; held while the response streams, even
when another task reads it; returned exactly once by whichever happens first of: the body
ends, reading it fails or is cancelled, the response is closed, sending failed, or the
response is garbage-collected unclosed (then the gate's leak reclaim returns it, with a
:class:`ResourceWarning` from us naming the request).

Acceptance. Under a policy, an attempt whose status and headers arrived with a 2xx status
is *accepted* (:meth:`anygate.Attempt.accepted`) before the body is read: a recovering
provider's probe then releases the callers waiting for the breaker (or a burst pause) when
its headers arrive, which for a streamed answer is when its first bytes come, not when its
generation ends. The attempt's outcome is the step's return, which comes right after (the
response, body unread). What the body does later is the client's (the SDK raises its read
error); the policy, whose call ended with the headers, does not hear of it.
"""

from __future__ import annotations

import math
from functools import partial
from typing import TYPE_CHECKING, Any, NoReturn, final

import anyio

from .. import Busy, CircuitOpen, Gate, Policy
from .._validation import check_wait
from ._accounting import Accounting
from ._body import AsyncBody, SyncBody
from ._flavour import Flavour, wrong_client
from ._flavour import missing_library as missing_library
from ._retries import ErrorResponse, decode_body, final_response, is_classified

if TYPE_CHECKING:
    from .. import Attempt, Token

__all__ = ["AsyncBody", "Flavour", "SyncBody", "TransportCore"]


def _library_of(obj: object) -> str | None:
    """``"httpx"`` or ``"httpx2"`` if ``obj``'s class derives from one of them, else None."""
    for cls in type(obj).__mro__:
        top = cls.__module__.partition(".")[0]
        if top in ("httpx", "httpx2"):
            return top
    return None


@final
class TransportCore:
    """The flavour-independent state and steps of one gated transport.

    Not for direct use: :class:`anygate.httpx.GatedTransport` and friends own one each.

    Args:
        flavour: the HTTP library's classes.
        inner: the transport that really sends the requests; ``None`` for the library's
            default (``AsyncHTTPTransport()`` or ``HTTPTransport()``).
        gate: where each request takes its slot; default ``policy.gate``.
        policy: classify failed responses and retry them under this policy.
        timeout: longest wait for a slot, in seconds; ``None``: the policy's
            ``busy_wait_s``, or no limit without a policy.
        is_async: whether ``inner`` must be an async transport (else a sync one).

    Raises:
        TypeError: neither ``gate`` nor ``policy`` given, one of them of the wrong type,
            ``inner`` not a transport of the right kind or of the other HTTP library.
        ValueError: ``timeout`` is negative or NaN.
    """

    __slots__ = (
        "_async_body",
        "_estimator",
        "_learn",
        "_request_type",
        "_slot_wait",
        "_sync_body",
        "accounting",
        "attempt_timeout",
        "flavour",
        "gate",
        "inner",
        "policy",
        "timeout",
    )

    flavour: Flavour
    inner: Any
    gate: Gate
    policy: Policy | None
    timeout: float | None
    attempt_timeout: float | None
    accounting: Accounting

    def __init__(
        self,
        flavour: Flavour,
        inner: Any,
        *,
        gate: object,
        policy: object,
        timeout: object,
        is_async: bool,
        learn_limits: object = True,
        tokens: object = True,
    ) -> None:
        if policy is not None and not isinstance(policy, Policy):
            msg = (
                f"policy must be an anygate.Policy (got {policy!r} of type {type(policy).__name__})"
            )
            raise TypeError(msg)
        if gate is None:
            if policy is None:
                msg = "a gated transport needs gate= (an anygate.Gate) or policy= (whose gate it uses)"
                raise TypeError(msg)
            gate = policy.gate
        if not isinstance(gate, Gate):
            msg = f"gate must be an anygate.Gate (got {gate!r} of type {type(gate).__name__})"
            raise TypeError(msg)
        if timeout is not None:
            timeout = check_wait("timeout", timeout)
        elif policy is not None:
            timeout = policy.config.busy_wait_s
        if inner is None:
            # Built only after the arguments passed: it loads the CA bundle.
            inner = flavour.async_transport() if is_async else flavour.sync_transport()
        method = "handle_async_request" if is_async else "handle_request"
        library = _library_of(inner)
        if library is not None and library != flavour.name:
            msg = (
                f"inner is an {library} transport ({type(inner).__name__}) but this is "
                f"anygate.{flavour.name}; use anygate.{library}.{'' if is_async else 'Sync'}"
                "GatedTransport for it"
            )
            raise TypeError(msg)
        if not callable(getattr(inner, method, None)):
            msg = f"inner must be a transport with a {method}() method (got {inner!r})"
            raise TypeError(msg)
        self.flavour = flavour
        self.inner = inner
        self.gate = gate
        self.policy = policy
        self.timeout = None if timeout is None else float(timeout)
        self.attempt_timeout = None if policy is None else policy.config.attempt_timeout_s
        self.accounting = Accounting(gate, learn_limits=learn_limits, tokens=tokens, policy=policy)
        # Read on every request: kept here rather than looked up through the flavour and
        # the accounting each time (issue 14).
        self._request_type = flavour.request
        self._async_body = flavour.async_body
        self._sync_body = flavour.sync_body
        self._estimator = self.accounting.estimator
        self._learn = self.accounting.learn
        # A policy's slot wait: self.timeout resolved (None: no limit, even if the policy
        # has one).
        self._slot_wait = math.inf if self.timeout is None else self.timeout

    def _retriable(self, request: Any) -> bool:
        # Only a body held in memory can be sent again; a streamed upload is sent once.
        return self.policy is not None and isinstance(request.stream, self.flavour.byte_stream)

    # ------------------------------------------------------------------ async

    async def send_async(self, request: Any) -> Any:
        """Send ``request`` through the inner async transport while holding one slot.

        With a policy, failed responses are classified and retried under it (see
        :mod:`._retries`); the slot of a successful response is held until it is closed.
        This and :meth:`send_sync` are the whole per-request path of a gated transport.
        """
        if not isinstance(request, self._request_type):
            raise wrong_client(self.flavour.name, request)
        policy = self.policy
        if policy is not None:
            cost = self.accounting.estimate(request)
            try:
                if not self._retriable(request):
                    return await self._attempt_async(request, None, guarded=False, cost=cost)
                try:
                    step = partial(self._attempt_async, request, cost=cost)
                    return await policy.run(step, reraise=True)
                except ErrorResponse as exc:
                    return final_response(exc)
            except (Busy, CircuitOpen) as exc:
                err = self._at_boundary(exc, request)
                if err is exc:
                    raise
                raise err from exc
        # Sent once, without a policy: _attempt_async(guarded=False), _acquire_async's
        # gate-only case and _tie's common case, inline, so the common request runs one
        # frame of ours (issue 14).
        gate = self.gate
        accounting = self.accounting
        estimator = self._estimator
        cost = None
        if estimator is not None:
            rate = gate.rate  # Accounting.token_budget() inline: nothing to estimate for
            if rate is not None and rate.tokens_per_minute is not None:
                cost = accounting.estimate(request)
        try:
            if cost is None or accounting.fits(cost):
                # __aenter__ is what awaiting the acquisition runs: a call fewer.
                token = await gate.acquire(timeout=self.timeout, tokens=cost).__aenter__()
            else:  # the budget shrank since the estimate (see Accounting.fits)
                token = await gate.acquire(timeout=self.timeout).__aenter__()
                accounting.charge_admitted(token, cost)
            try:
                sent = accounting.mark() if self._learn else None
                response = await self.inner.handle_async_request(request)
                if self._learn:
                    accounting.observe(response, sent)
                # Read again: a budget that appeared meanwhile (learned from this or
                # another response) still gets this request's usage.
                if (estimator is not None and accounting.token_budget() is not None) or (
                    response.is_closed
                ):
                    # Usage to meter, or a body already read: the general tie.
                    return self._tie(response, token, request, self._async_body)
                # As in _attempt_async: once the body owns the token nothing else can
                # raise, and until then a BaseException gives the slot back.
                response.stream = self._async_body(response.stream, token, request, self)
                return response
            except BaseException:
                token.release()
                raise
        except (Busy, CircuitOpen) as exc:
            err = self._at_boundary(exc, request)
            if err is exc:
                raise
            raise err from exc

    async def _attempt_async(
        self,
        request: Any,
        attempt: Attempt | None,
        *,
        guarded: bool = True,
        cost: int | None = None,
    ) -> Any:
        """One attempt: take a slot, send, and either tie the slot to the response or
        (``guarded``, classified status) buffer the body, free the slot and raise.

        ``attempt``: the policy loop's (``None``: sent once, outside the loop)."""
        token = await self._acquire_async(attempt, cost)
        try:
            sent = self.accounting.mark() if self._learn else None
            if guarded and self.attempt_timeout is not None:
                response = None
                with anyio.move_on_after(self.attempt_timeout):
                    response = await self._send_async(
                        request, guarded=True, attempt=attempt, sent=sent
                    )
                if response is None:  # the scope ran out: a hung attempt is a transient failure
                    number = 1 if attempt is None else attempt.number
                    msg = f"attempt {number} timed out after {self.attempt_timeout:g}s"
                    raise TimeoutError(msg)
            else:  # _send_async inline: a coroutine fewer per attempt (issue 14)
                response = await self.inner.handle_async_request(request)
                if self._learn:
                    self.accounting.observe(response, sent)
                if guarded and is_classified(response.status_code):
                    await self._refuse_async(request, response, sent)
                if attempt is not None and 200 <= response.status_code < 300:
                    attempt.accepted()  # see "Acceptance" in the module docstring
            # Inside the try: once the body owns the token nothing else can raise here, and
            # until then a BaseException (a Ctrl-C under trio included) gives the slot back.
            return self._tie(response, token, request, self._async_body)
        except BaseException:
            token.release()  # idempotent: a no-op if the body already finished
            raise

    async def _acquire_async(self, attempt: Attempt | None, cost: int | None) -> Token:
        # Slots are taken the way Policy.call takes them (adaptive pause, generation, slot
        # events). Only under a policy: send_async takes a gate-only request's slot itself.
        policy = self.policy
        assert policy is not None
        if attempt is None:
            token = await policy.acquire(self.gate, timeout=self._slot_wait)
        elif self.accounting.fits(cost):
            # Admitted only with room for the estimate, as without a policy: charged after
            # admission, attempts admitted together overdraw the budget (issue 30).
            return await attempt.acquire(self.gate, timeout=self._slot_wait, tokens=cost)
        else:
            token = await attempt.acquire(self.gate, timeout=self._slot_wait)
        self.accounting.charge_admitted(token, cost)
        return token

    async def _send_async(
        self, request: Any, *, guarded: bool, attempt: Attempt | None, sent: Any = None
    ) -> Any:
        response = await self.inner.handle_async_request(request)
        if self._learn:
            self.accounting.observe(response, sent)
        if guarded and is_classified(response.status_code):
            await self._refuse_async(request, response, sent)
        if attempt is not None and 200 <= response.status_code < 300:
            attempt.accepted()  # see "Acceptance" in the module docstring
        return response

    async def _refuse_async(self, request: Any, response: Any, sent: Any = None) -> NoReturn:
        """Buffer a classified response's body and raise it for the policy to classify."""
        stream = response.stream
        try:
            raw = b"".join([chunk async for chunk in stream])
        finally:
            await stream.aclose()
        raise self._error_response(request, response, raw, sent)

    # ------------------------------------------------------------------ sync

    def send_sync(self, request: Any) -> Any:
        """Send ``request`` through the inner sync transport while holding one slot."""
        if not isinstance(request, self._request_type):
            raise wrong_client(self.flavour.name, request)
        policy = self.policy
        if policy is not None:
            cost = self.accounting.estimate(request)
            try:
                if not self._retriable(request):
                    return self._attempt_sync(request, None, guarded=False, cost=cost)
                try:
                    step = partial(self._attempt_sync, request, cost=cost)
                    return policy.run_sync(step, reraise=True)
                except ErrorResponse as exc:
                    return final_response(exc)
            except (Busy, CircuitOpen) as exc:
                err = self._at_boundary(exc, request)
                if err is exc:
                    raise
                raise err from exc
        # Sent once, inline (see send_async).
        gate = self.gate
        accounting = self.accounting
        estimator = self._estimator
        cost = None
        if estimator is not None:
            rate = gate.rate
            if rate is not None and rate.tokens_per_minute is not None:
                cost = accounting.estimate(request)
        try:
            if cost is None or accounting.fits(cost):
                token = gate.acquire_sync(timeout=self.timeout, tokens=cost)
            else:
                token = gate.acquire_sync(timeout=self.timeout)
                accounting.charge_admitted(token, cost)
            try:
                sent = accounting.mark() if self._learn else None
                response = self.inner.handle_request(request)
                if self._learn:
                    accounting.observe(response, sent)
                if (estimator is not None and accounting.token_budget() is not None) or (
                    response.is_closed
                ):
                    return self._tie(response, token, request, self._sync_body)
                response.stream = self._sync_body(response.stream, token, request, self)
                return response
            except BaseException:
                token.release()
                raise
        except (Busy, CircuitOpen) as exc:
            err = self._at_boundary(exc, request)
            if err is exc:
                raise
            raise err from exc

    def _attempt_sync(
        self,
        request: Any,
        attempt: Attempt | None,
        *,
        guarded: bool = True,
        cost: int | None = None,
    ) -> Any:
        token = self._acquire_sync(attempt, cost)
        try:
            sent = self.accounting.mark() if self._learn else None
            response = self.inner.handle_request(request)
            if self._learn:
                self.accounting.observe(response, sent)
            if guarded and is_classified(response.status_code):
                stream = response.stream
                try:
                    raw = b"".join(list(stream))
                finally:
                    stream.close()
                raise self._error_response(request, response, raw, sent)
            if attempt is not None and 200 <= response.status_code < 300:
                attempt.accepted()  # see "Acceptance" in the module docstring
            return self._tie(response, token, request, self._sync_body)
        except BaseException:
            token.release()
            raise

    def _acquire_sync(self, attempt: Attempt | None, cost: int | None) -> Token:
        policy = self.policy
        assert policy is not None
        if attempt is None:
            token = policy.acquire_sync(self.gate, timeout=self._slot_wait)
        elif self.accounting.fits(cost):
            # No deadline of its own: the client's timeouts bound the request, not the wait.
            return attempt.acquire_sync(self.gate, timeout=self._slot_wait, tokens=cost)
        else:
            token = attempt.acquire_sync(self.gate, timeout=self._slot_wait)
        self.accounting.charge_admitted(token, cost)
        return token

    # ------------------------------------------------------------------ shared

    def _at_boundary(self, exc: Busy | CircuitOpen, request: Any) -> Exception:
        """``exc`` as the library's own transport error, for the client and an SDK on top.

        The OpenAI and Anthropic SDKs turn the library's ``RequestError`` family into their
        ``APIConnectionError`` (``TimeoutException`` into ``APITimeoutError``, a subclass)
        and let other exceptions through raw (openai) or wrap them too (anthropic). So a
        refusal becomes :attr:`Flavour.busy_error` (``Busy`` and ``PoolTimeout``: no slot in
        time is the pool timeout of a gate) or :attr:`Flavour.circuit_error`
        (``CircuitOpen`` and ``TransportError``), carrying the original's attributes and
        message, so ``except anygate.Busy`` keeps working around a plain client.
        """
        cls: type[Exception] = (
            self.flavour.busy_error if isinstance(exc, Busy) else self.flavour.circuit_error
        )
        if isinstance(exc, cls):  # a nested gated transport of this library translated it
            return exc
        err: Any = cls.__new__(cls)
        err.__dict__.update(vars(exc))
        err.args = exc.args
        err.request = request
        translated: Exception = err
        return translated

    def _tie(
        self, response: Any, token: Token, request: Any, body: type[AsyncBody] | type[SyncBody]
    ) -> Any:
        """Make ``response`` give ``token`` back when its body ends or it is closed."""
        meter = self.accounting.meter(response, token, request)
        if response.is_closed:
            # Already read into memory (httpx.MockTransport, caching transports): the client
            # will never iterate or close its stream, and there is nothing left to wait for.
            token.release()
            if meter is not None:
                meter.finish_read(response.content)
            return response
        stream = response.stream
        if meter is not None:
            is_async = body is self._async_body
            stream = meter.wrap_async(stream) if is_async else meter.wrap_sync(stream)
        response.stream = body(stream, token, request, self)
        return response

    def _error_response(
        self, request: Any, response: Any, raw: bytes, sent: Any = None
    ) -> ErrorResponse:
        """Wrap a failed response (body read in full) for the policy to classify, and
        learn the limits its words state (``sent``: :meth:`Accounting.mark` at admission)."""
        # Replay the body as it came (still content-encoded) if this becomes the answer.
        response.stream = self.flavour.byte_stream(raw)
        # The client sets this later; classification wants the host now (provider hints).
        response.request = request
        try:
            content = self.flavour.response(
                response.status_code, headers=response.headers, content=raw
            ).content
        except Exception:  # a body that fails to decode is still worth classifying raw
            content = raw
        error = ErrorResponse(
            response.status_code,
            headers=response.headers,
            body=decode_body(content),
            response=response,
        )
        self.accounting.observe_refusal(error, sent)
        return error
