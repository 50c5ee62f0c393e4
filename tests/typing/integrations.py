"""Type-level tests of the integrations (anygate.httpx, anygate.httpx2, anygate.asgi).

Checked by mypy and pyright, never executed (pytest does not collect this file). Negative
lines carry ``# type: ignore[code]``, which strict mypy and pyright flag once unneeded.
"""

# pyright: strict, reportUnnecessaryTypeIgnoreComment=error

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx
import httpx2
from typing_extensions import assert_type

import anygate
import anygate.httpx
import anygate.httpx2
from anygate.asgi import ASGIApp, GateMiddleware

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, MutableMapping

gate = anygate.Gate(4, name="llm")
policy = anygate.Policy(name="llm")

# --- httpx2 (the OpenAI 3.x / Anthropic 2.x flavour)
t2 = anygate.httpx2.GatedTransport(gate=gate)
assert_type(t2, anygate.httpx2.GatedTransport)
assert_type(t2.gate, anygate.Gate)
assert_type(t2.policy, anygate.Policy | None)
assert_type(t2.inner, httpx2.AsyncBaseTransport)
anygate.httpx2.GatedTransport(httpx2.AsyncHTTPTransport(), policy=policy, timeout=5)
client2 = httpx2.AsyncClient(transport=t2)
sync2 = anygate.httpx2.SyncGatedTransport(httpx2.HTTPTransport(), gate=gate, timeout=None)
assert_type(sync2.inner, httpx2.BaseTransport)
httpx2.Client(transport=sync2)
anygate.httpx2.GatedTransport(gate="llm")  # type: ignore[arg-type]
anygate.httpx2.GatedTransport(httpx.AsyncHTTPTransport(), gate=gate)  # type: ignore[arg-type]

# --- plain httpx
t1 = anygate.httpx.GatedTransport(httpx.AsyncHTTPTransport(), gate=gate)
assert_type(t1.inner, httpx.AsyncBaseTransport)
httpx.AsyncClient(transport=t1)
httpx.Client(transport=anygate.httpx.SyncGatedTransport(policy=policy))
anygate.httpx.SyncGatedTransport(timeout="5")  # type: ignore[arg-type]

# --- ASGI


async def app(
    scope: MutableMapping[str, Any],
    receive: Callable[[], Awaitable[MutableMapping[str, Any]]],
    send: Callable[[MutableMapping[str, Any]], Awaitable[None]],
) -> None: ...


gated: ASGIApp = GateMiddleware(app, gate=gate, timeout=30, paths=["/v1/chat"], retry_after=2)
assert_type(GateMiddleware(app, gate=gate).gate, anygate.Gate)
GateMiddleware(app, gate=gate, timeout="30")  # type: ignore[arg-type]
