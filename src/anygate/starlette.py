"""Per-route gates and a closing ``StreamingResponse`` for Starlette and FastAPI.

Needs Starlette (FastAPI brings it): install ``anygate[starlette]``. ::

    chat_gate = anygate.starlette.RouteGate(anygate.shared_gate("chat", capacity=8), timeout=30)

    @app.post("/v1/chat", dependencies=[Depends(chat_gate)])  # FastAPI
    async def chat(question: Question) -> anygate.starlette.StreamingResponse:
        return anygate.starlette.StreamingResponse(answer(question), media_type="text/plain")

See :doc:`integrations-asgi` for when the slot comes back.
"""

from __future__ import annotations

try:
    import starlette as _starlette  # noqa: F401 - only to give a helpful error
except ImportError as _exc:  # pragma: no cover - exercised in a venv without starlette
    _msg = "anygate.starlette needs Starlette (FastAPI brings it): pip install 'anygate[starlette]'"
    raise ImportError(_msg) from _exc

from .integrations._starlette import RouteGate, StreamingResponse

__all__ = ["RouteGate", "StreamingResponse"]

# Show the public path in reprs, docs and tracebacks.
RouteGate.__module__ = __name__
StreamingResponse.__module__ = __name__
