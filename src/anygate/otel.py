"""OpenTelemetry metrics and spans for anygate (extra ``anygate[otel]``).

::

    telemetry = anygate.otel.Telemetry()
    policy = anygate.Policy(name="llm", max_concurrent_calls=8, hooks=[telemetry])
    telemetry.observe(policy)

See :doc:`observability` for the instruments, their attributes and a Prometheus scrape.
This module imports ``opentelemetry-api``; ``import anygate`` alone does not.
"""

from __future__ import annotations

try:
    import opentelemetry.metrics as _metrics  # noqa: F401 - only to give a helpful error
except ImportError as _exc:  # pragma: no cover - exercised in a venv without the extra
    _msg = "anygate.otel needs the OpenTelemetry API: pip install 'anygate[otel]'"
    raise ImportError(_msg) from _exc

from .integrations._otel import Telemetry, error_type, throttle_kind

__all__ = ["Telemetry", "error_type", "throttle_kind"]

# Show the public path in reprs, docs and tracebacks.
Telemetry.__module__ = __name__
error_type.__module__ = __name__
throttle_kind.__module__ = __name__
