"""A busy gate for ASGI routes (extra ``anygate[asgi]``, which needs nothing else).

:class:`GateMiddleware` admits an HTTP request only while it holds a slot of an
:class:`anygate.Gate`, waiting up to a timeout, and otherwise answers ``429`` with a JSON
error body and ``Retry-After``. It works with any ASGI 3 server and framework (Starlette,
FastAPI, Quart, plain ASGI apps)::

    gate = anygate.shared_gate("chat", capacity=4)
    app.add_middleware(anygate.asgi.GateMiddleware, gate=gate, timeout=30, paths=["/v1/chat"])
"""

from __future__ import annotations

from .integrations._asgi import ASGIApp, GateMiddleware

__all__ = ["ASGIApp", "GateMiddleware"]

# Show the public path in reprs, docs and tracebacks.
GateMiddleware.__module__ = __name__
