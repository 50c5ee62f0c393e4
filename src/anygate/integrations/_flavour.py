"""What one HTTP library (httpx or httpx2) hands the gated transport, and its mix-up errors.

:class:`Flavour` is the set of one library's classes that :mod:`anygate.httpx` and
:mod:`anygate.httpx2` each hand to the shared engine; :func:`wrong_client` and
:func:`missing_library` are the errors for a transport installed on the other library's
client and for a flavour module imported without its library.

Not for: sending anything. The engine that holds the slot over a request and its response
is :mod:`anygate.integrations._transport`; like it, this module imports neither library.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from collections.abc import Callable

    from .. import Busy, CircuitOpen
    from ._body import AsyncBody, SyncBody

__all__ = ["Flavour", "missing_library", "wrong_client"]


class Flavour(NamedTuple):
    """What one HTTP library (httpx or httpx2) contributes to the shared engine.

    Attributes:
        name: the library's import name, used in messages and to spot a wrong-flavour inner.
        request: the library's ``Request`` (a request of the other library is refused).
        busy_error: :class:`anygate.Busy` combined with the library's ``PoolTimeout``.
        circuit_error: :class:`anygate.CircuitOpen` combined with its ``TransportError``.
        async_body: :class:`AsyncBody` combined with the library's ``AsyncByteStream``.
        sync_body: :class:`SyncBody` combined with the library's ``SyncByteStream``.
        byte_stream: the library's ``ByteStream`` (replays a buffered body, sync and async).
        response: the library's ``Response`` class (decodes a buffered body).
        async_transport: makes the default inner async transport.
        sync_transport: makes the default inner sync transport.
    """

    name: str
    request: type
    busy_error: type[Busy]
    circuit_error: type[CircuitOpen]
    async_body: type[AsyncBody]
    sync_body: type[SyncBody]
    byte_stream: type
    response: Callable[..., Any]
    async_transport: Callable[[], Any]
    sync_transport: Callable[[], Any]


def wrong_client(flavour: str, request: object) -> TypeError:
    """The error for a gated transport of one library installed on the other's client.

    Without it the mix-up fails with a bare ``AssertionError`` deep inside the client
    (httpx and httpx2 check the response type they get back).
    """
    got = type(request).__module__.split(".")[0]
    other = "httpx2" if flavour == "httpx" else "httpx"
    msg = (
        f"anygate.{flavour}.GatedTransport was handed a {type(request).__module__}."
        f"{type(request).__qualname__}: it is installed on a {got} client, but it serves "
        f"{flavour} clients only. Use anygate.{other}.GatedTransport with {other} clients "
        "(the OpenAI 3.x and Anthropic 2.x SDKs are built on httpx2)"
    )
    return TypeError(msg)


def missing_library(flavour: str) -> ImportError:
    """The error for importing ``anygate.httpx`` / ``anygate.httpx2`` without the library."""
    msg = (
        f"anygate.{flavour} needs {flavour}: pip install 'anygate[{flavour}]' (anygate.httpx "
        "serves httpx clients, anygate.httpx2 httpx2 clients, which the OpenAI 3.x and "
        "Anthropic 2.x SDKs use)"
    )
    return ImportError(msg)
