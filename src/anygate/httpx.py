"""Gate every request of a plain ``httpx`` client through anygate (extra ``anygate[httpx]``).

The same API as :mod:`anygate.httpx2`, for code on httpx 0.27 / 0.28 (including older
OpenAI and Anthropic SDKs and everything else built on httpx)::

    gate = anygate.Gate(capacity=8, name="llm")
    http = httpx.AsyncClient(transport=anygate.httpx.GatedTransport(gate=gate))

Each HTTP request takes one slot before it is sent and keeps it until its response is closed:
for a streamed response that is when the stream is exhausted or closed, by whichever task
does it. The current OpenAI (3.x) and Anthropic (2.x) SDKs use httpx2: see
:mod:`anygate.httpx2`.

This module imports httpx; ``import anygate`` alone does not. It only names httpx's classes:
the transports' code is shared with :mod:`anygate.httpx2` (``anygate.integrations._shell``).
"""

from __future__ import annotations

from typing import final

try:
    import httpx
except ImportError as _exc:
    from .integrations._transport import missing_library

    raise missing_library("httpx") from _exc

from . import Busy, CircuitOpen
from .integrations import _shell, _transport

__all__ = ["GatedTransport", "SyncGatedTransport", "TransportBusy", "TransportCircuitOpen"]


class _AsyncBody(_transport.AsyncBody, httpx.AsyncByteStream):
    pass


class _SyncBody(_transport.SyncBody, httpx.SyncByteStream):
    pass


class TransportBusy(Busy, httpx.PoolTimeout):
    """Raised by a gated httpx transport when no slot came within its wait."""

    __doc__ = _shell.BUSY_DOC.format(lib="httpx")


class TransportCircuitOpen(CircuitOpen, httpx.TransportError):
    """Raised by a gated httpx transport while its policy's breaker is open."""

    __doc__ = _shell.CIRCUIT_OPEN_DOC.format(lib="httpx")


_FLAVOUR = _transport.Flavour(
    name="httpx",
    request=httpx.Request,
    busy_error=TransportBusy,
    circuit_error=TransportCircuitOpen,
    async_body=_AsyncBody,
    sync_body=_SyncBody,
    byte_stream=httpx.ByteStream,
    response=httpx.Response,
    async_transport=httpx.AsyncHTTPTransport,
    sync_transport=httpx.HTTPTransport,
)


@final
class GatedTransport(
    _shell.AsyncShell[httpx.AsyncBaseTransport, httpx.Request, httpx.Response],
    httpx.AsyncBaseTransport,
):
    """An async httpx transport that sends each request only while holding a gate slot."""

    __doc__ = _shell.ASYNC_DOC.format(lib="httpx")
    _flavour = _FLAVOUR


@final
class SyncGatedTransport(
    _shell.SyncShell[httpx.BaseTransport, httpx.Request, httpx.Response], httpx.BaseTransport
):
    """The blocking twin of :class:`GatedTransport`, for ``httpx.Client``."""

    __doc__ = _shell.SYNC_DOC.format(lib="httpx")
    _flavour = _FLAVOUR
