"""``KeyboardInterrupt`` at every step of ``Gate.acquire_sync``: no slot is ever lost.

Issue 26, item 7. CPython runs signal handlers (and so raises ``KeyboardInterrupt`` in the
main thread) at function entries, after calls return and at backward jumps. Each test here
raises it from a trace function at the k-th such step inside anygate, for every k: at each
``call`` and ``return`` of an anygate frame, and at each line of the frames that make up
``acquire_sync`` outside the ledger's locked steps (a ``KeyboardInterrupt`` between a
lock's ``acquire()`` and the ``try`` after it is the documented best-effort case, in
``docs/guarantees.md``). After each run, whatever happened, the gate must be empty once the
caller releases what it got: no slot held by nobody, nobody left queued.

Single-threaded and deterministic: the contended runs free the slot from the trace
function itself, at the step named by the scenario, so the grant lands at a known point.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import anygate
from anygate import Gate, Token
from anygate._gate import gate as _gate_module
from anygate._gate import waiters as _waiters

if TYPE_CHECKING:
    from types import FrameType

PACKAGE = str(Path(anygate.__file__).parent)
ACQUIRE_SYNC = Gate.acquire_sync.__code__

# Frames traced line by line: acquire_sync and what it runs outside the ledger's locked
# steps (those are traced at their calls and returns only, see the module docstring).
LINE_TRACED = {
    Gate.acquire_sync.__code__,
    Gate._last_look.__code__,
    _waiters.ThreadWaiter.__init__.__code__,
    _waiters.ThreadWaiter.block.__code__,
    *(
        fn.__code__
        for name in ("make_token", "pending_token", "_block")
        if (fn := getattr(_gate_module, name, None) or getattr(Gate, name, None)) is not None
    ),
}


class Interrupter:
    """A trace function raising ``KeyboardInterrupt`` at the ``k``-th step inside anygate,
    and calling ``at_call[name]()`` once when a function of that name is entered."""

    def __init__(self, k: int, at_call: dict[str, Any]) -> None:
        self.k = k
        self.steps = 0
        self.where: str | None = None
        self.at_call = dict(at_call)

    def _step(self, frame: FrameType, event: str) -> None:
        self.steps += 1
        if self.steps == self.k:
            self.where = f"{event} {frame.f_code.co_name}:{frame.f_lineno}"
            raise KeyboardInterrupt

    def local(self, frame: FrameType, event: str, arg: object) -> Any:
        if event == "line" and frame.f_code not in LINE_TRACED:
            return self.local
        if event == "return" and frame.f_code is ACQUIRE_SYNC:
            # After acquire_sync has returned the token is the caller's (an interrupt
            # before the caller stores it is the "token garbage-collected" case).
            return self.local
        if event in ("line", "return"):
            self._step(frame, event)
        return self.local

    def __call__(self, frame: FrameType, event: str, arg: object) -> Any:
        if event != "call" or not frame.f_code.co_filename.startswith(PACKAGE):
            return None
        self._step(frame, event)
        hook = self.at_call.pop(frame.f_code.co_name, None)
        if hook is not None:
            hook()
        return self.local


def attempt(k: int, scenario: str, timeout: float | None) -> tuple[str | None, Gate]:
    """One ``acquire_sync`` interrupted at step ``k`` (or not at all, past the last step).

    Returns where it was interrupted (``None``: it ran to the end) and the gate, after the
    caller released whatever it got and the blocker (if any) was released.
    """
    gate = Gate(1, name="ki")
    at_call: dict[str, Any] = {}
    blocker: Token | None = None
    if scenario != "uncontended":
        blocker = gate.acquire_nowait()
        # The grant lands when the queueing step starts (admitted at once) or when the
        # thread is about to block (woken by the handoff).
        at_call["_enqueue" if scenario == "freed-while-queueing" else "block"] = blocker.release
    tracer = Interrupter(k, at_call)
    token: Token | None = None
    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        token = gate.acquire_sync(timeout=timeout)
    except KeyboardInterrupt:
        pass
    finally:
        sys.settrace(previous)
    if token is not None:
        assert tracer.where is None or tracer.where.startswith("return acquire_sync")
        token.release()
    if blocker is not None:
        blocker.release()
    return tracer.where, gate


@pytest.mark.parametrize("timeout", [None, 60.0], ids=["untimed", "timed"])
@pytest.mark.parametrize("scenario", ["uncontended", "freed-while-queueing", "freed-at-block"])
def test_keyboard_interrupt_at_every_step_of_acquire_sync_loses_no_slot(
    scenario: str, timeout: float | None
) -> None:
    """Wherever the interrupt lands, the slot ends up with the caller (who releases it) or
    back in the gate, and the queue is empty: ``in_flight`` and ``waiting`` are 0 without
    any garbage collection (before the fix, an interrupt between admission and the token's
    creation left ``in_flight`` at 1 for good)."""
    lost = []
    k = 1
    while True:
        where, gate = attempt(k, scenario, timeout)
        stats = gate.statistics()
        if (stats.in_flight, stats.waiting) != (0, 0):
            lost.append((where, stats.in_flight, stats.waiting))
        if where is None:
            break  # k is past the last step: every step has been tried
        k += 1
    assert k > 5  # the trace did see acquire_sync's steps
    assert lost == []
