"""Type-level tests of anygate.otel, anygate.starlette and anygate.testing (issue 15).

Checked by mypy and pyright, never executed (pytest does not collect this file).
"""

# pyright: strict, reportUnnecessaryTypeIgnoreComment=error

from __future__ import annotations

from typing import Literal

from typing_extensions import assert_type

import anygate
import anygate.otel
import anygate.starlette
import anygate.testing

gate = anygate.Gate(4, name="llm")
policy = anygate.Policy(name="llm", hooks=[anygate.otel.Telemetry()])

telemetry = anygate.otel.Telemetry(spans=True)
telemetry.observe(policy)
telemetry.observe(gate)
telemetry.observe(policy.adaptive_limit)
telemetry.observe(anygate.RateLearner.of(gate))
telemetry.observe("llm")  # type: ignore[arg-type]
assert_type(anygate.otel.throttle_kind(anygate.classify(ValueError("x"))), str | None)
assert_type(
    anygate.throttle_kind(anygate.classify(ValueError("x"))),
    Literal["concurrency", "overload", "burst", "rate"] | None,
)
assert_type(anygate.otel.error_type(ValueError("x")), str)
assert_type(anygate.otel.error_type(anygate.classify(ValueError("x"))), str)
usage = anygate.UsageReported("llm", "llm", input_tokens=3, request_model="gpt-4o")
telemetry(usage)
anygate.UsageReported("llm", "llm", input_tokens="3")  # type: ignore[arg-type]


async def ask() -> str:
    return "hi"


async def traced() -> None:
    assert_type(await telemetry.call(policy, ask), str)
    with telemetry.span(policy):
        await ask()


route_gate = anygate.starlette.RouteGate(gate, timeout=30)
assert_type(route_gate.gate, anygate.Gate)
anygate.starlette.RouteGate("llm")  # type: ignore[arg-type]

with anygate.testing.isolated():
    pass
with anygate.testing.set_testing(True):
    pass
