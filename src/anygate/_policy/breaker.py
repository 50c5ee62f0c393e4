"""Circuit breaker: stop calling a provider that keeps failing, probe it, resume.

States::

    closed ──(failure_threshold consecutive failures)──> open
    open ──(recovery_timeout passes; next caller)──> half_open (that caller is the probe)
    half_open ──probe succeeds──> closed
    half_open ──probe fails──> open (for another recovery_timeout)
    half_open ──probe neutral──> half_open (the next caller becomes the probe)

"Consecutive": a success clears the count only if its call was admitted after the
latest failing call counted (a call admitted earlier says the provider answered then, not
since: the long calls in flight when an outage begins would reset it one by one).

Each entry into half-open starts a new *episode*, and a probe permit is bound to the
episode it was admitted in. Only that episode's probe can close, reopen or hand on the
probe role; a probe whose episode is over (another call's success closed the breaker, or
the breaker reopened and half-opened again meanwhile) reports like any other call: its
success still closes the breaker (a success is evidence whoever reports it, if it was sent
after the breaker last opened: a long call admitted before an outage proves nothing), its failure
counts towards ``failure_threshold`` while closed and is ignored otherwise, and its
neutral outcome does nothing. So a late report can neither let a second probe out nor
open a closed breaker on a single failure.

A call the provider has *accepted* (status and headers of a success in, or the first
streamed bytes, the generation still running) may say so before it ends
(:meth:`Permit.accepted`): that is the provider's answer the breaker waits for, so it
counts as a success at that moment (the probe closes the breaker and everyone waiting
goes) instead of when the whole generation is done, seconds later. It is not the call's
outcome: that is still reported when the call ends. A failure after acceptance (a stream
that breaks) is then an ordinary failure of a call in a closed breaker: one towards
``failure_threshold``, never a reopening on its own (the probe's episode ended when it
was accepted), so the callers released at acceptance are not turned back by it, and only
``failure_threshold`` failures in a row open the breaker again, as for any call.

A call takes a :class:`Permit` synchronously, *before its first await*, and reports one of
three outcomes. *Neutral* outcomes (burst-rate exhaustion, non-retriable errors,
cancellation, declared control-flow exceptions) neither trip nor reset the breaker; a
neutral probe just hands the probe role to the next caller, so the breaker can never
wedge in half-open. Exactly one probe runs at a time, yet no lock is held across the call
(pybreaker serialises every call to get that; aiobreaker and purgatory let every caller
through in half-open).

Thread-safe (one ``threading.Lock``, held only for a few assignments) and shared by
asyncio loops, trio runs and threads. The clock is injectable, so the simulator and tests
drive recovery with virtual time.

This is not a retry mechanism and not a rate limiter: it only decides whether a call may
start.

One concern: the state machine. Every transition, and every judgement of a report
(fresh or stale, probe or not), is here, under the breaker's lock; the :class:`Permit` a
call holds (:mod:`~anygate._policy.permit`) only carries a report to :meth:`_record` once,
and the states, statistics record and setting checks are values
(:mod:`~anygate._policy.breaker_state`). :func:`anygate.shared_breaker` lives in
``sharing``, with the other lookups. Waiting for it to close uses
:class:`anygate._gate.latch.Latch`.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, final

from .._errors import CircuitOpen
from .._events.events import BreakerStateChanged
from .._gate.latch import Latch
from .._gate.waiters import ki_protected
from .._validation import check_name
from .breaker_state import BreakerState, BreakerStatistics, check_recovery, check_threshold
from .permit import Permit

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["CircuitBreaker"]

#: Slack in seconds when comparing the clock with the end of the open period. A caller
#: woken by a timer set for that end may read it 1 ulp early; without slack it was turned
#: away, waited a zero-length timeout and asked again, spinning for ever on a virtual clock
#: that only advances when everyone sleeps (seen in the max-wait test under trio's
#: MockClock). The gate's rate budgets need the same slack (``_gate.rate_math.EPSILON``).
_SLACK_S = 1e-9


@final
class CircuitBreaker:
    """A thread-safe circuit breaker with a single half-open probe and neutral outcomes.

    Usually created and shared by :class:`anygate.Policy` (one per name per process, see
    :func:`anygate.shared_breaker`); usable directly around any call::

        permit = breaker.acquire()          # raises CircuitOpen while open
        try:
            result = do_call()
        except ProviderDown:
            permit.failure()
            raise
        except Exception:
            permit.neutral()
            raise
        else:
            permit.success()
        finally:
            permit.neutral()                # no-op if an outcome was already recorded

    Args:
        name: shown in errors, events and reprs.
        failure_threshold: consecutive failures that open the breaker (>= 1).
        recovery_timeout: seconds the breaker stays open before admitting a probe (>= 0).
        clock: monotonic time source in seconds; default :func:`time.monotonic`.

    Raises:
        TypeError, ValueError: bad settings.
    """

    __slots__ = (
        "_admitted",
        "_answered",
        "_clock",
        "_episode",
        "_failures",
        "_lock",
        "_name",
        "_opened",
        "_opened_until",
        "_probe_out",
        "_recovery",
        "_rejected",
        "_state",
        "_streak_seq",
        "_threshold",
        "_wakeup",
    )

    def __init__(
        self,
        name: str = "llm",
        *,
        failure_threshold: int = 5,
        recovery_timeout: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        given: tuple[object, object] = (name, clock)
        check_name("name", name)
        if not callable(given[1]):
            msg = f"clock must be a callable returning seconds (got {clock!r})"
            raise TypeError(msg)
        self._name = name
        self._threshold = check_threshold(failure_threshold)
        self._recovery = check_recovery(recovery_timeout)
        self._clock = clock
        self._lock = threading.Lock()
        self._state = BreakerState.CLOSED
        self._failures = 0
        self._opened_until = 0.0
        self._probe_out = False
        # Numbers the half-open episodes; a probe permit remembers its own (see _record).
        self._episode = 0
        self._opened = 0
        self._rejected = 0
        # Permits given so far (each remembers its number), and the number of the latest
        # admitted failure of the current streak: a success of a call admitted before it
        # is older news than the failure and does not end the streak (see _record).
        self._admitted = 0
        self._streak_seq = -1
        # Whether the provider ever answered a call (a success or an acceptance): only
        # then is a run of failures an outage a giving-up caller waits out (_judge_give_up).
        self._answered = False
        # Callers waiting for the breaker to close park here: open while closed, shut
        # otherwise; _move_locked flips it.
        self._wakeup = Latch(f"breaker {name}")

    # ------------------------------------------------------------------ introspection

    @property
    def name(self) -> str:
        """The breaker's name."""
        return self._name

    @property
    def clock(self) -> Callable[[], float]:
        """The time source the breaker measures recovery with."""
        return self._clock

    @property
    def state(self) -> BreakerState:
        """The current state (``open`` turns into ``half_open`` only when a caller asks)."""
        return self._state

    @property
    def failure_threshold(self) -> int:
        """Consecutive failures that open the breaker."""
        return self._threshold

    @property
    def recovery_timeout(self) -> float:
        """Seconds the breaker stays open before a probe."""
        return self._recovery

    def configure(
        self, *, failure_threshold: int | None = None, recovery_timeout: float | None = None
    ) -> None:
        """Change the settings live; they apply from the next decision on.

        Lowering the threshold to or below the current failure count does not open the
        breaker by itself; the next counted failure does.
        """
        threshold = None if failure_threshold is None else check_threshold(failure_threshold)
        recovery = None if recovery_timeout is None else check_recovery(recovery_timeout)
        with self._lock:
            if threshold is not None:
                self._threshold = threshold
            if recovery is not None:
                self._recovery = recovery

    def statistics(self) -> BreakerStatistics:
        """A consistent snapshot of the state and counters."""
        with self._lock:
            retry_after = 0.0
            if self._state is BreakerState.OPEN:
                retry_after = max(0.0, self._opened_until - self._clock())
            return BreakerStatistics(
                name=self._name,
                state=self._state,
                failures=self._failures,
                failure_threshold=self._threshold,
                recovery_timeout=self._recovery,
                opened=self._opened,
                rejected=self._rejected,
                retry_after=retry_after,
            )

    def __repr__(self) -> str:
        return (
            f"<anygate.CircuitBreaker {self._name!r} {self._state.value}, "
            f"{self._failures}/{self._threshold} failures>"
        )

    # ------------------------------------------------------------------ decisions

    @ki_protected
    def acquire(self) -> Permit:
        """Admit one call, or fail fast.

        Synchronous on purpose: the half-open probe is claimed before the caller's first
        await, so two tasks cannot both see "no probe out" and both become the probe.

        Returns:
            A :class:`Permit`; report the call's outcome on it.

        Raises:
            CircuitOpen: the breaker is open, or half-open with the probe already out.
        """
        return self._admit(log=True)

    @ki_protected
    def _admit(self, *, log: bool) -> Permit:
        """:meth:`acquire`; ``log=False`` for a policy, which reports the changes itself."""
        change = None
        with self._lock:
            state = self._state
            if state is BreakerState.OPEN:
                now = self._clock()
                if now < self._opened_until - _SLACK_S:
                    self._rejected += 1
                    retry_after = self._opened_until - now
                    raise CircuitOpen(name=self._name, retry_after=retry_after)
                change = self._move_locked(BreakerState.HALF_OPEN)
                state = BreakerState.HALF_OPEN
            if state is BreakerState.HALF_OPEN:
                if self._probe_out:
                    self._rejected += 1
                    raise CircuitOpen(name=self._name, retry_after=0.0)
                self._probe_out = True
                self._admitted += 1
                return Permit(
                    self,
                    probe=True,
                    change=change,
                    episode=self._episode,
                    spell=self._opened,
                    log=log,
                    seq=self._admitted,
                )
            self._admitted += 1
            seq = self._admitted
        return Permit(self, probe=False, change=None, spell=self._opened, log=log, seq=seq)

    def would_admit(self) -> bool:
        """Whether :meth:`acquire` would succeed now for a caller that holds no probe."""
        with self._lock:
            if self._state is BreakerState.CLOSED:
                return True
            if self._state is BreakerState.OPEN:
                return self._clock() >= self._opened_until
            return not self._probe_out

    def _wait_s(self) -> float:
        """How long a caller should wait before asking again (0: ask now)."""
        with self._lock:
            if self._state is BreakerState.CLOSED:
                return 0.0
            if self._state is BreakerState.OPEN:
                left = self._opened_until - self._clock()
                return left if left > _SLACK_S else 0.0
            # Half-open: the probe is out (or about to be). Its success opens the wake-up
            # gate; if it fails, the breaker reopens for recovery_timeout, so asking again
            # after that long finds either the next probe's turn or a closed breaker.
            return 0.0 if not self._probe_out else max(self._recovery, 1e-3)

    def _wait_for(self, timeout: float | None) -> float:
        seconds = self._wait_s()
        return seconds if timeout is None else min(seconds, timeout)

    async def wait(self, timeout: float | None = None) -> None:
        """Wait until a call may try :meth:`acquire` again: the breaker closed, or its open
        period ended (the next caller becomes the probe); at most ``timeout`` seconds.

        Returns as soon as the breaker closes. Callers loop: ``acquire()``, and on
        :class:`anygate.CircuitOpen` ``await breaker.wait()``; only one of them becomes
        the probe per recovery interval. Cancellation propagates; nothing is left behind.
        """
        seconds = self._wait_for(timeout)
        if seconds > 0:
            await self._wakeup.wait(seconds)

    def wait_sync(self, timeout: float | None = None) -> None:
        """The blocking twin of :meth:`wait`, for plain threads."""
        seconds = self._wait_for(timeout)
        if seconds > 0:
            self._wakeup.wait_sync(seconds)

    @ki_protected
    def reset(self) -> BreakerStateChanged | None:
        """Force the breaker closed with no failures counted (an operator's override)."""
        with self._lock:
            self._failures = 0
            self._probe_out = False
            return self._move_locked(BreakerState.CLOSED)

    def _move_locked(self, new: BreakerState) -> BreakerStateChanged | None:
        old = self._state
        if old is new:
            return None
        self._state = new
        # Lock order breaker -> gate; the gate never calls back into the breaker.
        if new is BreakerState.CLOSED:
            self._wakeup.open()
        else:
            self._wakeup.shut()
        retry_after = 0.0
        if new is BreakerState.OPEN:
            self._opened += 1
            self._opened_until = self._clock() + self._recovery
            self._probe_out = False
            retry_after = self._recovery
        elif new is BreakerState.CLOSED:
            self._probe_out = False
        else:  # half-open: a new episode; probes of earlier ones are stale from now on
            self._episode += 1
        return BreakerStateChanged(
            breaker=self._name,
            old=old.value,
            new=new.value,
            failures=self._failures,
            retry_after=retry_after,
        )

    @ki_protected
    def _judge_give_up(self, failures: int) -> tuple[bool, BreakerStateChanged | None]:
        """A caller whose last ``failures`` attempts all failed (each reported here
        already) is about to give up: whether it is to wait for the breaker instead, and
        the state change that says why.

        Never for a provider that has not answered a call yet (a wrong address, a bad
        key's 5xx): that is no outage to wait out, and the caller hears of it at once.
        Open (or half-open): yes, the breaker decides now. Closed with at least
        ``failures`` failures in a row counted: the breaker opens first. A caller alone
        in an outage otherwise never lets it decide: with the defaults its 3 attempts end
        before the 5 failures that open it, and its call was lost 3.5 s into an 80 s
        outage (the steady-load scenario, seed 3) that the waiting breaker rides out.
        """
        with self._lock:
            if not self._answered:
                return False, None
            if self._state is not BreakerState.CLOSED:
                return True, None
            if self._failures < max(failures, 1):
                return False, None
            return True, self._move_locked(BreakerState.OPEN)

    @ki_protected
    def _record(self, permit: Permit, outcome: str) -> BreakerStateChanged | None:
        with self._lock:
            # The running probe of the current half-open episode, and no other permit.
            probe = (
                permit._probe
                and self._state is BreakerState.HALF_OPEN
                and permit._episode == self._episode
            )
            if outcome == "accepted":
                # Under the lock, so that an acceptance racing the final report from
                # another thread is either before it or nothing (_report sets _done first).
                if permit._done or permit._accepted:
                    return None
                permit._accepted = True
            if outcome in ("success", "accepted"):
                self._answered = True  # whenever it was sent: the provider has worked
                if (
                    self._state is not BreakerState.CLOSED
                    and (outcome == "accepted" or not permit._probe)
                    and permit._spell != self._opened
                ):
                    # Sent before the breaker last opened (a long call finishing during an
                    # outage that refuses new requests): no news about the provider now.
                    # An acceptance is the sending's answer: a probe of an earlier
                    # episode accepted late is no news either.
                    return None
                if self._failures and permit._seq < self._streak_seq:
                    # Admitted before a failure of the current streak: it says the
                    # provider answered then, not since. Counted, the long calls in
                    # flight when an outage began (64 slots, answers up to 30 s) kept
                    # the count from 5 for 3 s, and a call spent its 3 attempts on the
                    # outage and was lost (the outage scenario with 64 slots, seed 2).
                    return None
                self._failures = 0
                # Any success sent since the breaker opened is fresh evidence the provider
                # works, whichever call it is (closing also ends the episode: its probe
                # becomes stale).
                return self._move_locked(BreakerState.CLOSED)
            if outcome == "failure":
                if probe:
                    self._probe_out = False
                    return self._move_locked(BreakerState.OPEN)
                if self._state is BreakerState.CLOSED:
                    # Stale probes included: one late failure is one failure, not a trip.
                    self._failures += 1
                    streak = self._streak_seq if self._failures > 1 else -1
                    self._streak_seq = max(streak, permit._seq)
                    if self._failures >= self._threshold:
                        return self._move_locked(BreakerState.OPEN)
                # A call admitted before the breaker opened, failing late, neither extends
                # the open period nor fails the running probe.
                return None
            # neutral: the current probe hands its role on; counters untouched. A stale
            # probe must not: the flag now belongs to another episode's probe.
            if probe:
                self._probe_out = False
            return None
