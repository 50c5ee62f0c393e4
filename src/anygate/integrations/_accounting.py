"""What a gated transport learns from each exchange: limits from headers, tokens from usage.

The transport engine (``_transport``) calls four things, a line each:

* :meth:`Accounting.estimate` before the first attempt: the request's token cost for
  ``acquire(tokens=)``, from its JSON body (:func:`anygate.estimate_tokens`), or ``None``;
* :meth:`Accounting.charge_admitted` for a slot taken without ``tokens=`` (the policy's
  admission path): the estimate is charged right after admission by a settle;
* :meth:`Accounting.observe` on every response, success or error, before anything else
  reads it: its rate-limit headers feed the gate's :class:`anygate.RateLearner`;
* :meth:`Accounting.meter` when a response's body is tied to its slot: wraps the body so
  that the usage it reports settles the token, **once**, when the body ends. The settle
  replaces the estimate (``Token.settle`` sets the charge, it does not add to it), so
  nothing is counted twice; a body that never reports usage (a stream without
  ``stream_options.include_usage``, a closed-early response, an error) keeps the estimate.
  When the transport's policy has hooks, the same reading also delivers one
  :class:`anygate.UsageReported` to them (model, server, input and output tokens).

Token work happens only while the gate has a token budget (learned or configured) or the
policy has hooks to report to: a gate without either pays a ``gate.rate`` read per
request. Bodies are decoded here when content-encoded (gzip and deflate always, br and zstd when their libraries are installed;
otherwise the estimate stands).
"""

from __future__ import annotations

import importlib
import json
import zlib
from collections.abc import Callable, Mapping
from contextlib import suppress
from operator import itemgetter
from typing import TYPE_CHECKING, Any, cast, final

from .. import (
    RateLearner,
    estimate_tokens,
    learn_from_error,
    parse_limit_headers,
    usage_tokens,
)
from .._validation import check_flag
from ._body import aclose_stream, close_stream
from ._stream_usage import StreamUsage
from ._usage_report import UsageReporter, describe_request, document_report

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from .. import Gate, Policy, Token

__all__ = ["Accounting", "Estimator", "check_tokens_option"]

#: A request's token cost from its JSON body (a mapping), or ``None`` for "unknown".
Estimator = Callable[[Mapping[str, Any]], "int | None"]

_name = itemgetter(0)  # of a (name, value) header pair
_lower_name = itemgetter(1)  # of an httpx Headers._list entry (raw name, lower-cased, value)

# Per headers class: whether its private ``_list`` holds ``(name, lower-cased name,
# value)`` triples, as httpx's and httpx2's ``Headers`` do (0.27 to 0.29, 2.x). Checked once
# per class on a probe (see _keeps_lowered_names); a class that fails takes ``.raw``.
_LOWERED: dict[type, bool] = {}
_NOTHING: tuple[int | None, int | None, str | None] = (None, None, None)

# JSON bodies are buffered to read their usage; beyond this the estimate stands.
_MAX_JSON = 8 << 20


def _keeps_lowered_names(kind: type) -> bool:
    """Whether ``kind`` (a headers class) keeps its names lower-cased in ``_list``.

    ``Headers._list`` is httpx's private state: it is read only for a class whose probe
    instance shows exactly the expected layout, and agrees with the public ``.raw``.
    """
    if kind.__module__.partition(".")[0] not in ("httpx", "httpx2"):
        return False  # no probe built of a class we do not know
    try:
        probe: Any = kind([(b"X-RateLimit-Probe", b"1"), (b"Date", b"2")])
        entries = probe._list
        return (
            type(entries) is list
            and entries
            == [
                (b"X-RateLimit-Probe", b"x-ratelimit-probe", b"1"),
                (b"Date", b"date", b"2"),
            ]
            and [(name, value) for name, _, value in entries] == probe.raw
        )
    except Exception:  # any other headers class (a mapping, a user's object)
        return False


def check_tokens_option(tokens: object) -> Estimator | None:
    """The transports' ``tokens=`` argument: ``True`` (default estimate), ``False``, a callable."""
    if tokens is True:
        return estimate_tokens
    if tokens is False or tokens is None:
        return None
    if callable(tokens):
        return cast("Estimator", tokens)
    msg = (
        "tokens must be True (estimate from the request body), False (no token accounting) "
        f"or a callable taking the request's JSON and returning an int or None (got {tokens!r})"
    )
    raise TypeError(msg)


@final
class Accounting:
    """The learning and token-accounting settings of one gated transport."""

    __slots__ = ("estimator", "gate", "learn", "policy")

    def __init__(
        self, gate: Gate, *, learn_limits: object, tokens: object, policy: Policy | None = None
    ) -> None:
        check_flag("learn_limits", learn_limits)
        self.gate = gate
        self.learn = learn_limits
        self.estimator = check_tokens_option(tokens)
        self.policy = policy

    # ------------------------------------------------------------------ before sending

    def token_budget(self) -> float | None:
        """The gate's tokens per minute now, or ``None`` (no token budget to account to)."""
        rate = self.gate.rate
        return None if rate is None else rate.tokens_per_minute

    def estimate(self, request: Any) -> int | None:
        """The request's token cost for ``acquire(tokens=)``, within one minute's budget."""
        estimator = self.estimator
        if estimator is None:
            return None
        rate = self.gate.rate  # token_budget() inline: this runs for every request
        budget = None if rate is None else rate.tokens_per_minute
        if budget is None:
            return None  # nothing to pace; usage still settles if a budget appears
        try:
            body = request.content  # bytes for a body held in memory
        except Exception:  # a streamed upload: not read, not estimated
            return None
        if not body:
            return None
        try:
            doc = json.loads(body)
            cost = estimator(doc) if isinstance(doc, Mapping) else None
        except Exception:  # not JSON, or a user's estimator failing: no estimate
            return None
        if isinstance(cost, bool) or not isinstance(cost, int) or cost <= 0:
            return None
        return min(cost, int(budget))  # a cost above a minute's budget is refused by acquire

    def fits(self, cost: int | None) -> bool:
        """Whether ``acquire(tokens=cost)`` is allowed now (the budget may have shrunk since
        the estimate; then the slot is taken without it and :meth:`charge_admitted` charges)."""
        if not cost:
            return True
        budget = self.token_budget()
        return budget is None or cost <= budget

    def charge_admitted(self, token: Token, cost: int | None) -> None:
        """Charge ``cost`` to a token admitted without ``tokens=``, by settling it."""
        if cost:
            token.settle(tokens=cost)

    # ------------------------------------------------------------------ responses

    def mark(self) -> Any:
        """What the gate had charged, taken right after an admission (``None``: no rate).

        Passed back to :meth:`observe` with that request's response, it lets the reported
        ``remaining`` lower the gate's budgets (``RateLearner.observe(sent=)``).
        """
        gate = self.gate
        if not self.learn or gate._budgets is None:
            return None
        return gate.budget_mark()

    def observe(self, response: Any, sent: Any = None) -> None:
        """Learn from ``response``'s rate-limit headers (never raises); ``sent``: :meth:`mark`."""
        if not self.learn:
            return
        headers: Any = response.headers
        # The parser keeps only names that mention "ratelimit" (and "date" beside them),
        # so a response with none of them -- most, and every one of a server that sends
        # none -- is told apart by one scan of its names in C, several times cheaper than
        # the parser's loop over them (issue 14). A false positive only costs the parse.
        kind = type(headers)
        lowered = _LOWERED.get(kind)
        if lowered is None:
            lowered = _LOWERED[kind] = _keeps_lowered_names(kind)
        try:
            if lowered:  # the names lower-cased already, without building .raw's pairs
                names = b"\n".join(map(_lower_name, headers._list))
            else:
                raw = getattr(headers, "raw", None)
                if type(raw) is not list:
                    raise TypeError  # not httpx's: the parser sorts it out
                names = b"\n".join(map(_name, raw)).lower()
                headers = raw  # the raw pairs are what the parser would read
        except (TypeError, AttributeError):  # a name that is not bytes, or no such list
            pass
        else:
            # find(), not `in`: bytes.__contains__ first tries its operand as an integer
            # (`65 in b"A"`), which costs about as much again on CPython 3.11.
            if names.find(b"ratelimit") < 0:
                return
        report = parse_limit_headers(headers)
        if report:
            RateLearner.of(self.gate).observe(report, sent=sent)

    def observe_refusal(self, error: Exception, sent: Any = None) -> None:
        """Learn the limits a refused response's words state (its body, read to raise it
        for the policy); its headers were learned as it arrived (:meth:`observe`)."""
        if self.learn:
            learn_from_error(self.gate, error, sent=sent, headers=False)

    def _reporter(self, policy: Policy, request: Any) -> UsageReporter:
        facts = describe_request(request, policy.config.provider)
        return UsageReporter(policy, self.gate.name, facts)

    def meter(self, response: Any, token: Token, request: Any = None) -> _Meter | None:
        """A meter that settles ``token`` from ``response``'s usage and reports it to the
        policy's hooks (each only when wanted), or ``None`` if there is nothing to do."""
        settles = False
        if self.estimator is not None:
            rate = self.gate.rate  # token_budget() inline, as in estimate()
            settles = rate is not None and rate.tokens_per_minute is not None
        reporter = None
        policy = self.policy
        # Nobody to tell (no policy, no hooks): no request parsed, no body buffered for it.
        # Successes only: an error handed back unretried (a streamed upload, a give-up's
        # final answer) has no usage, and its model would label a failure as a call.
        ok = 200 <= response.status_code < 300
        if policy is not None and policy.hooks and ok and request is not None:
            reporter = self._reporter(policy, request)
        if not settles and reporter is None:
            return None
        headers = response.headers
        kind = headers.get("content-type", "").partition(";")[0].strip().lower()
        stream = kind == "text/event-stream"
        readable = stream or kind == "application/json" or kind.endswith("+json")
        decode = None
        if readable:
            try:
                decode = _decoder(headers.get("content-encoding", ""))
            except LookupError:
                readable = False  # an encoding we cannot read: the estimate stands
        if not readable:
            if reporter is not None:  # no usage to read, but the model and server still count
                reporter.report(None, None, None)
            return None
        return _Meter(token, stream, decode, settles=settles, reporter=reporter)


def _decoder(encoding: str) -> Callable[[bytes], bytes] | None:
    """A stateful decoder for a ``Content-Encoding``; ``None`` for identity."""
    names = [e.strip().lower() for e in encoding.split(",") if e.strip()]
    names = [e for e in names if e != "identity"]
    if not names:
        return None
    if len(names) > 1:
        raise LookupError(encoding)
    name = names[0]
    if name in ("gzip", "x-gzip"):
        return zlib.decompressobj(zlib.MAX_WBITS | 16).decompress
    if name == "deflate":
        return _Deflate().decompress
    if name == "br":
        for module in ("brotli", "brotlicffi"):
            try:
                lib = importlib.import_module(module)
            except ImportError:
                continue
            return lib.Decompressor().process  # type: ignore[no-any-return]
        raise LookupError(name)
    if name == "zstd":
        try:
            zstandard = importlib.import_module("zstandard")
        except ImportError:
            raise LookupError(name) from None
        return zstandard.ZstdDecompressor().decompressobj().decompress  # type: ignore[no-any-return]
    raise LookupError(name)


class _Deflate:
    """``deflate`` as servers really send it: zlib-wrapped, or raw (as httpx accepts)."""

    def __init__(self) -> None:
        self._obj: Any = None
        self._first = True

    def decompress(self, data: bytes) -> bytes:
        if self._first:
            self._first = False
            try:
                self._obj = zlib.decompressobj()
                return bytes(self._obj.decompress(data))
            except zlib.error:
                self._obj = zlib.decompressobj(-zlib.MAX_WBITS)
        return bytes(self._obj.decompress(data))


@final
class _Meter:
    """Reads one response body's usage as it passes and settles its token once."""

    __slots__ = (
        "_buffer",
        "_decode",
        "_done",
        "_reporter",
        "_settles",
        "_size",
        "_stream",
        "_token",
    )

    def __init__(
        self,
        token: Token,
        stream: bool,
        decode: Callable[[bytes], bytes] | None,
        *,
        settles: bool = True,
        reporter: UsageReporter | None = None,
    ) -> None:
        self._token = token
        self._settles = settles
        self._reporter = reporter
        self._decode = decode
        self._stream: StreamUsage | None = StreamUsage() if stream else None
        self._buffer: list[bytes] | None = None if stream else []
        self._size = 0
        self._done = False

    def feed(self, chunk: bytes) -> None:
        if self._done or not chunk:
            return
        try:
            data = self._decode(chunk) if self._decode is not None else chunk
        except Exception:  # a corrupt body: stop metering, the estimate stands
            self._done = True
            return
        if self._stream is not None:
            self._stream.feed(data)
            return
        buffer = self._buffer
        if buffer is not None:
            self._size += len(data)
            if self._size > _MAX_JSON:
                self._buffer = None  # too big to read back: the estimate stands
            else:
                buffer.append(data)

    def finish(self) -> None:
        """The body ended: settle with the usage it reported, if any (once)."""
        if self._done:
            return
        if self._stream is not None:
            self._stream.close()
            self._settle(self._stream.tokens, self._stream.parts)
        elif self._buffer is not None:
            self._end_document(b"".join(self._buffer))
        else:
            self._settle(None, _NOTHING)

    def abandon(self) -> None:
        """The body was closed before its end: a stream's usage so far, else the estimate."""
        if self._done:
            return
        if self._stream is not None:
            self._stream.close()
            self._settle(self._stream.tokens, self._stream.parts)
        else:
            self._settle(None, _NOTHING)

    def finish_read(self, content: bytes) -> None:
        """The body was already read and decoded (a closed response): settle from it."""
        if self._stream is not None:
            self._stream.feed(content)
            self.finish()
        else:
            self._end_document(content)

    def _end_document(self, content: bytes) -> None:
        # Parsed once for both readers (usage_tokens takes the document as well as bytes).
        try:
            doc: object = json.loads(content)
        except (ValueError, UnicodeDecodeError, RecursionError):
            doc = None
        self._settle(usage_tokens(doc), document_report(doc))

    def _settle(self, used: int | None, parts: tuple[int | None, int | None, str | None]) -> None:
        self._done = True
        self._buffer = None
        if used is not None and self._settles:
            with suppress(TypeError, ValueError):  # an absurd count: the estimate stands
                self._token.settle(tokens=used)
        if self._reporter is not None:
            self._reporter.report(*parts)

    def wrap_async(self, inner: Any) -> _AsyncMetered:
        return _AsyncMetered(inner, self)

    def wrap_sync(self, inner: Any) -> _SyncMetered:
        return _SyncMetered(inner, self)


class _AsyncMetered:
    """An async byte stream that shows each chunk to a meter, then passes it on."""

    def __init__(self, inner: Any, meter: _Meter) -> None:
        self._inner = inner
        self._meter = meter
        self._iterator: AsyncIterator[bytes] | None = None
        self._closed = False

    def __aiter__(self) -> _AsyncMetered:
        return self

    async def __anext__(self) -> bytes:
        iterator = self._iterator
        if iterator is None:
            iterator = self._iterator = self._inner.__aiter__()
        try:
            chunk: bytes = await iterator.__anext__()
        except StopAsyncIteration:
            self._meter.finish()
            raise
        self._meter.feed(chunk)
        return chunk

    async def aclose(self) -> None:
        # Idempotent: the body around us closes its iterator (us) and then its stream (us).
        if self._closed:
            return
        self._closed = True
        try:
            await aclose_stream(self._iterator, self._inner)
        finally:
            self._meter.abandon()


class _SyncMetered:
    """The blocking twin of :class:`_AsyncMetered`."""

    def __init__(self, inner: Any, meter: _Meter) -> None:
        self._inner = inner
        self._meter = meter
        self._iterator: Iterator[bytes] | None = None
        self._closed = False

    def __iter__(self) -> _SyncMetered:
        return self

    def __next__(self) -> bytes:
        iterator = self._iterator
        if iterator is None:
            iterator = self._iterator = iter(self._inner)
        try:
            chunk: bytes = next(iterator)
        except StopIteration:
            self._meter.finish()
            raise
        self._meter.feed(chunk)
        return chunk

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            close_stream(self._iterator, self._inner)
        finally:
            self._meter.abandon()
