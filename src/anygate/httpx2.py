"""Gate every request of an ``httpx2`` client through anygate (extra ``anygate[httpx2]``).

The OpenAI (3.x) and Anthropic (2.x) SDKs are built on httpx2 and accept
``http_client=httpx2.AsyncClient(transport=...)``, so this is how their calls take a slot::

    gate = anygate.Gate(capacity=8, name="llm")
    http = httpx2.AsyncClient(transport=anygate.httpx2.GatedTransport(gate=gate))
    client = openai.AsyncOpenAI(http_client=http)

Each HTTP request takes one slot before it is sent and keeps it until its response is closed:
for a streamed completion that is when the stream is exhausted or closed, by whichever task
does it. For plain ``httpx`` (0.27, 0.28) use :mod:`anygate.httpx`, which has the same API.

This module imports httpx2; ``import anygate`` alone does not. It only names httpx2's
classes: the transports' code is shared with :mod:`anygate.httpx`
(``anygate.integrations._shell``).
"""

from __future__ import annotations

from typing import final

try:
    import httpx2
except ImportError as _exc:
    from .integrations._transport import missing_library

    raise missing_library("httpx2") from _exc

from . import Busy, CircuitOpen
from .integrations import _shell, _transport

__all__ = ["GatedTransport", "SyncGatedTransport", "TransportBusy", "TransportCircuitOpen"]


class _AsyncBody(_transport.AsyncBody, httpx2.AsyncByteStream):
    pass


class _SyncBody(_transport.SyncBody, httpx2.SyncByteStream):
    pass


class TransportBusy(Busy, httpx2.PoolTimeout):
    """Raised by a gated httpx2 transport when no slot came within its wait."""

    __doc__ = _shell.BUSY_DOC.format(lib="httpx2")


class TransportCircuitOpen(CircuitOpen, httpx2.TransportError):
    """Raised by a gated httpx2 transport while its policy's breaker is open."""

    __doc__ = _shell.CIRCUIT_OPEN_DOC.format(lib="httpx2")


_FLAVOUR = _transport.Flavour(
    name="httpx2",
    request=httpx2.Request,
    busy_error=TransportBusy,
    circuit_error=TransportCircuitOpen,
    async_body=_AsyncBody,
    sync_body=_SyncBody,
    byte_stream=httpx2.ByteStream,
    response=httpx2.Response,
    async_transport=httpx2.AsyncHTTPTransport,
    sync_transport=httpx2.HTTPTransport,
)


@final
class GatedTransport(
    _shell.AsyncShell[httpx2.AsyncBaseTransport, httpx2.Request, httpx2.Response],
    httpx2.AsyncBaseTransport,
):
    """An async httpx2 transport that sends each request only while holding a gate slot."""

    __doc__ = _shell.ASYNC_DOC.format(lib="httpx2")
    _flavour = _FLAVOUR


@final
class SyncGatedTransport(
    _shell.SyncShell[httpx2.BaseTransport, httpx2.Request, httpx2.Response], httpx2.BaseTransport
):
    """The blocking twin of :class:`GatedTransport`, for ``httpx2.Client``."""

    __doc__ = _shell.SYNC_DOC.format(lib="httpx2")
    _flavour = _FLAVOUR
