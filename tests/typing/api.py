"""Type-level tests of anygate's public API: checked by mypy and pyright, never executed.

Every public call is made once with ``assert_type`` on its result, so a signature that drifts
(a return type widening to ``Any``, a parameter renamed or losing its type) fails the typing
session. Lines that *must* be rejected carry ``# type: ignore[code]``: mypy's
``warn_unused_ignores`` (strict) and pyright's ``reportUnnecessaryTypeIgnoreComment`` turn an
ignore that is no longer needed into an error, so these are real negative tests.

pytest does not collect this file (its name does not start with ``test_``).
"""

# pyright: strict, reportUnnecessaryTypeIgnoreComment=error

from __future__ import annotations

import math

from typing_extensions import assert_type

import anygate
from anygate import (
    AnygateError,
    Busy,
    CallFailed,
    CircuitOpen,
    ConfigError,
    Gate,
    GateStatistics,
    Token,
    shared_gate,
)

# ---------------------------------------------------------------- constructing gates

gate = Gate(capacity=8, name="llm")
assert_type(gate, Gate)
assert_type(Gate(), Gate)
assert_type(Gate(3), Gate)
assert_type(Gate(math.inf), Gate)
assert_type(Gate(capacity=0.0, name=None), Gate)
assert_type(anygate.Gate(2, name="module-path"), Gate)

Gate(capacity="8")  # type: ignore[arg-type]
Gate(8, "llm")  # type: ignore[call-arg]  # name is keyword-only

# ---------------------------------------------------------------- introspection

assert_type(gate.name, str)
assert_type(gate.capacity, float)
assert_type(gate.in_flight, int)
assert_type(gate.waiting, int)
gate.capacity = 3
gate.capacity = 2.0
gate.capacity = math.inf
gate.capacity = "3"  # type: ignore[assignment]
gate.in_flight = 1  # type: ignore[misc]  # read-only property
assert_type(repr(gate), str)

stats = gate.statistics()
assert_type(stats, GateStatistics)
assert_type(stats.name, str)
assert_type(stats.capacity, float)
assert_type(stats.in_flight, int)
assert_type(stats.waiting, int)
assert_type(stats.admitted, int)
assert_type(stats.rejected, int)
assert_type(stats.timed_out, int)
assert_type(stats.cancelled, int)
assert_type(stats.leaked, int)
stats.in_flight = 0  # type: ignore[misc]  # frozen dataclass

# ---------------------------------------------------------------- acquiring


async def acquire_async() -> None:
    token = await gate.acquire()
    assert_type(token, Token)
    assert_type(await gate.acquire(timeout=None), Token)
    assert_type(await gate.acquire(timeout=1), Token)
    assert_type(await gate.acquire(timeout=0.5), Token)
    async with gate.acquire(timeout=60) as held:
        assert_type(held, Token)
    async with token as same:
        assert_type(same, Token)
    await gate.acquire(60)  # type: ignore[call-arg]  # timeout is keyword-only
    await gate.acquire(timeout="60")  # type: ignore[arg-type]


def acquire_blocking() -> None:
    token = gate.acquire_sync()
    assert_type(token, Token)
    assert_type(gate.acquire_sync(timeout=2.5), Token)
    with gate.acquire_sync(timeout=60) as held:
        assert_type(held, Token)
    with token as same:
        assert_type(same, Token)
    assert_type(gate.acquire_nowait(), Token)
    gate.acquire_nowait(timeout=1)  # type: ignore[call-arg]


# ---------------------------------------------------------------- tokens


def use_token(token: Token) -> None:
    assert_type(token.release(), None)
    assert_type(token.released, bool)
    assert_type(token.acquired_at, str)
    token.released = True  # type: ignore[misc]  # read-only property


# ---------------------------------------------------------------- final classes


class SubGate(Gate):  # type: ignore[misc]  # Gate is @final
    pass


class SubToken(Token):  # type: ignore[misc]  # Token is @final
    pass


# ---------------------------------------------------------------- process-wide gates

assert_type(shared_gate("llm"), Gate)
assert_type(shared_gate("llm", capacity=8), Gate)
assert_type(shared_gate("llm", capacity=None), Gate)
assert_type(anygate.shared_gate("llm", capacity=math.inf), Gate)
shared_gate("llm", 8)  # type: ignore[call-arg]  # capacity is keyword-only
shared_gate(name=1)  # type: ignore[arg-type]

# ---------------------------------------------------------------- errors


def handle_errors() -> None:
    try:
        gate.acquire_nowait()
    except Busy as busy:
        assert_type(busy, Busy)
        assert_type(busy.gate, str)
        assert_type(busy.capacity, float)
        assert_type(busy.in_flight, int)
        assert_type(busy.waited, float)
    except CircuitOpen as circuit:
        assert_type(circuit.name, str)
        assert_type(circuit.retry_after, float)
    except CallFailed as failed:
        assert_type(failed.attempts, int)
        assert_type(failed.user_message, str)
    except ConfigError as config:
        assert_type(config.path, str)
        assert_type(config.value, object)


# The hierarchy: every error is an AnygateError; ConfigError is also a ValueError.
error_types: tuple[type[AnygateError], ...] = (Busy, CallFailed, CircuitOpen, ConfigError)
value_error: type[ValueError] = ConfigError
not_a_value_error: type[ValueError] = Busy  # type: ignore[assignment]

assert_type(Busy(gate="llm", capacity=8, in_flight=8, waited=1.5), Busy)
assert_type(CircuitOpen(name="openai", retry_after=30.0), CircuitOpen)
assert_type(ConfigError("bad", path="llm_call.busy_wait_s", value=-1), ConfigError)
assert_type(ConfigError("bad"), ConfigError)
Busy("llm", 8, 8, 1.5)  # type: ignore[call-arg]  # attributes are keyword-only

assert_type(anygate.__version__, str)
