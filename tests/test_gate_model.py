"""A hypothesis state machine checks the gate's locked steps against a plain reference model.

The machine drives the same internal steps the public methods use (``_admit``,
``_enqueue``, ``_withdraw``, ``_abandon``, token release, the capacity setter) with waiters
whose wake-up is recorded instead of resuming a task, so every interleaving of grants,
cancellations, dead loops, leaks and resizes can be explored deterministically. The
invariants are the ones in ``anygate._gate.ledger``'s module docstring.
"""

from __future__ import annotations

import math
import warnings
from collections import deque

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from anygate import Gate, Rate, Token
from anygate._gate import waiters as _waiters
from anygate._gate.token import make_token


class RecordingWaiter(_waiters.Waiter):
    """A waiter whose wake-up is recorded; ``alive=False`` models a closed event loop."""

    __slots__ = ("alive", "log", "name")

    def __init__(self, name: int, log: list[int], *, alive: bool) -> None:
        super().__init__()
        self.name = name
        self.log = log
        self.alive = alive

    def wake(self) -> bool:
        if self.alive:
            self.log.append(self.name)
        return self.alive


class GateMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.gate = Gate(2)
        self.woken: list[int] = []
        self.waiters: dict[int, RecordingWaiter] = {}
        self.tokens: list[Token] = []  # the only references: dropping one leaks it
        # Reference model.
        self.capacity: float = 2
        self.queue: deque[int] = deque()  # live waiters, FIFO
        self.granted: set[int] = set()  # granted, not yet resumed
        self.expected_wakes: list[int] = []
        self.next_name = 0
        self.peak_grant_excess = 0

    # ----------------------------------------------------------------- model helpers

    @property
    def in_flight(self) -> int:
        return len(self.tokens) + len(self.granted)

    def _take_head(self) -> None:
        """The head waiter receives a slot already counted in in_flight."""
        name = self.queue.popleft()
        if self.waiters[name].alive:
            # The slot is counted once (by its placeholder) at this point.
            self.peak_grant_excess = max(
                self.peak_grant_excess, int(self.in_flight > self.capacity)
            )
            self.granted.add(name)
            self.expected_wakes.append(name)
        else:
            self._route_freed_slot(counted=True)  # a dead waiter gives its slot up again

    def _route_freed_slot(self, *, counted: bool = False) -> None:
        """A slot is given up: the head waiter gets it if it fits under capacity, else it is freed.

        ``counted`` means the slot is still in in_flight (a dead waiter's grant); otherwise
        its holder has already been removed from the model.
        """
        in_flight_with_slot = self.in_flight + (0 if counted else 1)
        if self.queue and in_flight_with_slot <= self.capacity:
            if not counted:
                self.granted.add(-1)  # placeholder keeps in_flight right during the handoff
            self._take_head()
            self.granted.discard(-1)
        # else: freed (nothing to record; in_flight already excludes it)

    def _token(self) -> Token:
        return make_token(self.gate, GateMachine._token.__code__, 0)

    # ----------------------------------------------------------------- rules

    @rule()
    def acquire_nowait(self) -> None:
        admitted = self.gate._admit()
        assert admitted == (not self.queue and self.in_flight < self.capacity)
        if admitted:
            self.tokens.append(self._token())

    @rule(alive=st.booleans())
    def enqueue(self, alive: bool) -> None:
        name = self.next_name
        self.next_name += 1
        waiter = RecordingWaiter(name, self.woken, alive=alive)
        self.waiters[name] = waiter
        admitted = self.gate._enqueue(waiter)
        assert admitted == (not self.queue and self.in_flight < self.capacity)
        if admitted:
            self.tokens.append(self._token())
        else:
            self.queue.append(name)

    @precondition(lambda self: bool(self.queue))
    @rule(data=st.data())
    def cancel_queued(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(list(self.queue)))
        assert self.gate._withdraw(self.waiters[name])  # it held no slot
        self.queue.remove(name)

    @precondition(lambda self: bool(self.granted))
    @rule(data=st.data())
    def cancel_after_grant(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(self.granted)))
        self.gate._abandon(self.waiters[name])
        self.granted.discard(name)
        self._route_freed_slot()

    @precondition(lambda self: bool(self.granted))
    @rule(data=st.data())
    def resume(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(self.granted)))
        assert not self.gate._withdraw(self.waiters[name])  # it holds the slot
        self.granted.discard(name)
        self.tokens.append(self._token())

    @precondition(lambda self: bool(self.tokens))
    @rule(data=st.data(), twice=st.booleans())
    def release(self, data: st.DataObject, twice: bool) -> None:
        token = self.tokens.pop(data.draw(st.integers(0, len(self.tokens) - 1)))
        token.release()
        if twice:
            token.release()  # idempotent
        self._route_freed_slot()

    @precondition(lambda self: bool(self.tokens))
    @rule(data=st.data())
    def leak(self, data: st.DataObject) -> None:
        index = data.draw(st.integers(0, len(self.tokens) - 1))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            del self.tokens[index]  # the last reference: Token.__del__ reclaims the slot
        self._route_freed_slot()

    @rule(capacity=st.one_of(st.integers(0, 5), st.just(math.inf)))
    def set_capacity(self, capacity: float) -> None:
        self.gate.capacity = capacity
        self.capacity = capacity
        # Reserve a slot for each head waiter while room remains, then wake them in grant
        # order. A dead one gives its slot up again: it goes to the next queued waiter,
        # whose wake-up comes after the rest of the batch (the gate fires one list).
        pending = []
        while self.queue and self.in_flight < capacity:
            name = self.queue.popleft()
            self.granted.add(-2 - name)  # reserved, not yet woken
            pending.append(name)
        i = 0
        while i < len(pending):
            name = pending[i]
            i += 1
            self.granted.discard(-2 - name)
            if self.waiters[name].alive:
                self.granted.add(name)
                self.expected_wakes.append(name)
            elif self.queue and self.in_flight < capacity:
                successor = self.queue.popleft()
                self.granted.add(-2 - successor)
                pending.append(successor)
            self.peak_grant_excess = max(
                self.peak_grant_excess, int(self.in_flight > self.capacity)
            )

    def teardown(self) -> None:
        for token in self.tokens:
            token.release()

    # ----------------------------------------------------------------- invariants

    @invariant()
    def counts_match_the_model(self) -> None:
        stats = self.gate.statistics()
        assert stats.in_flight == self.in_flight >= 0
        assert stats.waiting == len(self.queue)

    @invariant()
    def grants_are_fifo_and_only_to_live_waiters(self) -> None:
        assert self.woken == self.expected_wakes

    @invariant()
    def no_grant_ever_exceeds_capacity(self) -> None:
        assert self.peak_grant_excess == 0


GateMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
test_gate_matches_model = GateMachine.TestCase


class RatedGateMachine(RuleBasedStateMachine):
    """Rates, settle and priorities on a virtual clock, against an independent checker.

    Waiters are recorded (never resumed by a loop); the clock only moves when the machine
    says so, and a waiter's budget timer is modelled by polling it once its ``due`` has
    come. Checked: grants keep FIFO within each class, at most ``OVERTAKES`` admissions in
    a row overtake the longest-waiting caller, no sliding minute admits more than the rate
    plus the burst, the token budget never goes below what settles refunded, and every
    count matches.
    """

    RPM = 30.0  # burst 1 s: 0.5 request; one admission per 2 s

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.gate = Gate(
            3,
            rate=Rate(requests_per_minute=self.RPM, tokens_per_minute=600, burst_s=2),
            clock=lambda: self.now,
        )
        self.woken: list[int] = []
        self.waiters: dict[int, RecordingWaiter] = {}
        self.queued: dict[int, int] = {}  # name -> priority, in arrival order
        self.granted: list[int] = []
        self.tokens: list[Token] = []
        self.admissions: list[float] = []
        self.next_name = 0

    def _token(self, cost: int) -> Token:
        return make_token(self.gate, RatedGateMachine._token.__code__, 0, cost)

    def _collect(self) -> None:
        """Move newly woken waiters that hold a grant into the granted list."""
        for name in list(self.queued):
            if self.waiters[name].state == _waiters.GRANTED:
                self._check_order(name)
                del self.queued[name]
                self.granted.append(name)
                self.admissions.append(self.now)

    def _check_order(self, name: int) -> None:
        priority = self.queued[name]
        # FIFO within the class: nobody of the same class queued before it is still waiting.
        for other, p in self.queued.items():
            if other == name:
                break
            if p == priority and self.waiters[other].state == _waiters.WAITING:
                msg = f"waiter {name} overtook {other} in class {priority}"
                raise AssertionError(msg)

    @rule(priority=st.integers(0, 2), cost=st.integers(0, 400))
    def enqueue(self, priority: int, cost: int) -> None:
        name = self.next_name
        self.next_name += 1
        waiter = RecordingWaiter(name, self.woken, alive=True)
        waiter.priority, waiter.tokens = priority, cost
        self.waiters[name] = waiter
        self.queued[name] = priority
        if self.gate._enqueue(waiter):
            del self.queued[name]
            self.admissions.append(self.now)
            self.tokens.append(self._token(cost))
        self._collect()

    @rule(cost=st.integers(0, 50))
    def nowait(self, cost: int) -> None:
        if self.gate._admit(cost, 0):
            self.admissions.append(self.now)
            self.tokens.append(self._token(cost))
        self._collect()

    @rule(seconds=st.sampled_from([0.1, 0.5, 1.0, 2.0, 7.0]))
    def advance_clock(self, seconds: float) -> None:
        self.now += seconds
        # Budget timers that have come: the waiter polls (as its park loop would).
        for name in list(self.queued):
            waiter = self.waiters[name]
            if waiter.state == _waiters.WAITING and waiter.due <= self.now:
                self.gate._poll(waiter, None)
        self._collect()

    @precondition(lambda self: bool(self.granted))
    @rule()
    def resume(self) -> None:
        name = self.granted.pop(0)
        self.tokens.append(self._token(self.waiters[name].tokens))

    @precondition(lambda self: bool(self.tokens))
    @rule(data=st.data(), settle=st.one_of(st.none(), st.integers(0, 600)))
    def release(self, data: st.DataObject, settle: int | None) -> None:
        token = self.tokens.pop(data.draw(st.integers(0, len(self.tokens) - 1)))
        if settle is not None:
            token.settle(tokens=settle)
            token.settle(tokens=settle)  # the same value again changes nothing
        token.release()
        self._collect()

    @precondition(lambda self: bool(self.queued))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(list(self.queued)))
        waiter = self.waiters[name]
        if waiter.state == _waiters.WAITING:
            self.gate._abandon(waiter)
            del self.queued[name]
        self._collect()

    @rule(rpm=st.sampled_from([30.0, 60.0]))
    def change_rate(self, rpm: float) -> None:
        self.RPM = min(self.RPM, rpm)  # the checker uses the stricter of the rates seen
        self.gate.rate = Rate(requests_per_minute=rpm, tokens_per_minute=600, burst_s=2)
        self._collect()

    def teardown(self) -> None:
        for token in self.tokens:
            token.release()

    @invariant()
    def counts_match(self) -> None:
        stats = self.gate.statistics()
        live = sum(1 for n in self.queued if self.waiters[n].state == _waiters.WAITING)
        assert stats.waiting == live
        assert stats.in_flight == len(self.tokens) + len(self.granted) <= 3

    @invariant()
    def no_minute_exceeds_rate_plus_burst(self) -> None:
        # The fastest rate ever set bounds every span: 60 rpm, burst 2 s = 2 requests.
        times = self.admissions
        for i, t in enumerate(times):
            in_span = sum(1 for x in times[: i + 1] if x > t - 60)
            assert in_span <= 60 + 2 + 1e-9


RatedGateMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None
)
test_rated_gate_matches_model = RatedGateMachine.TestCase
