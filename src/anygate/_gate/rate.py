"""Rate admission arithmetic: the :class:`Rate` value and the per-gate budget state.

Two mechanisms, both pure arithmetic on one monotonic clock (seconds), run by the ledger
under the gate's lock:

* **GCRA budgets** (virtual scheduling), one per configured rate: requests (cost 1 per
  admission) and tokens (cost ``tokens=``). Each keeps one *theoretical arrival time*
  ``tat``; see :func:`admission_time` and :func:`charge`. A budget starts **empty** and
  refills continuously, holding at most ``burst_s`` seconds of refill: a fleet that starts
  at once gets ``rate x burst_s`` in its first ``burst_s``, never a minute's budget in the
  first second (the OpenAI cookbook's full-bucket start is the counter-example).
* **The slope bound**: admissions are counted per *tick* of ``window_s / 10``; an
  admission is allowed only if, for every window of ``window_s`` made of whole ticks that
  contains the current tick, ``count(window) <= ramp x count(previous window) + floor``
  still holds with it (see :func:`slope_allowance`). Idle windows count 0, so after a
  pause the allowance decays back to ``floor`` and the next peak ramps again.

This is not a provider-side rate limiter (it cannot see other processes) and not a token
counter (the cost is what callers state, corrected by ``Token.settle``).

One concern, a little over ~500 lines: the public :class:`Rate` is the validated input of
exactly this arithmetic, and :class:`Budgets` is its only consumer; splitting them would
put the rule for what a rate means and the rule for applying it in two places.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple, final

from .._validation import check_number
from .split import Bucket

__all__ = [
    "EPSILON",
    "SPLIT_BURST_S",
    "TICKS",
    "BudgetMark",
    "Budgets",
    "Rate",
    "RateStatistics",
    "admission_time",
    "charge",
    "slope_allowance",
]

#: Ticks per slope window: the bound holds for every window starting on a tick.
TICKS = 10
#: Slack in seconds when comparing an admission time with the clock. A waiter woken by a
#: timer set for ``due`` may read ``due - 1 ulp``; without slack it would re-park forever on
#: a virtual clock that only advances when everyone sleeps.
EPSILON = 1e-9
# Rates above this are not limits but typos; keeping them finite keeps float math exact.
_MAX_PER_MINUTE = 1e12
#: Seconds of refill the input- and output-token budgets hold: a minute. Anthropic's
#: buckets hold the whole per-minute limit ("continuously replenished up to your maximum
#: limit", its rate-limit documentation), and an output charge is ``max_tokens`` until
#: the answer settles it: held to ``burst_s`` (1 s), each call's reservation became a debt
#: refunded only when the call ended, pacing at OTPM / max_tokens (measured on the
#: Anthropic-like TOKEN_TUNING cell, issue 30: 1.152x the oracle with a 1 s input budget
#: and this one, 1.235x at 10 s, 1.607x at 1 s; 1.124x with both at 60 s). The budgets
#: still start empty, so this never exceeds the provider's own bucket.
SPLIT_BURST_S = 60.0
_MAX_WINDOW_S = 86_400.0


def _number(name: str, value: object, *, low: float, low_ok: bool, high: float) -> float:
    """Validate a positive number through the one validation path (``_validation``)."""
    checked = check_number(name, value, minimum=low, strict=not low_ok, maximum=high, unit="")
    assert checked is not None  # none=False
    return checked


@final
@dataclass(frozen=True, kw_only=True)
class Rate:
    """How fast a :class:`anygate.Gate` may admit: per-minute budgets and a slope bound.

    Pass it as ``Gate(rate=...)`` or set ``gate.rate`` at any time. An admission needs a
    slot *and* room in every budget configured here; callers wait for both in one strict
    FIFO order (per priority class).

    Budgets start empty and refill continuously (GCRA), holding at most ``burst_s``
    seconds of refill, so the first admission waits one request's (or its tokens') refill
    time. In any span of ``d`` seconds a budget admits at most ``rate x d / 60 + burst``
    units, where ``burst`` is ``rate x burst_s / 60`` or the largest single cost if that is
    bigger (a cost above the burst needs a full budget and leaves a debt).

    With ``ramp``, the number of admissions in any ``window_s`` window starting on a tick
    (``window_s / 10``) is at most ``ramp x`` the previous window's plus ``ramp_floor``.

    This is not a guarantee about the provider's own counters (other processes share
    them); it paces this process.

    Args:
        requests_per_minute: request budget; ``None`` = no request-rate limit.
        tokens_per_minute: token budget, charged what ``acquire(tokens=)`` states (0 when
            not stated) and corrected by :meth:`anygate.Token.settle`; ``None`` = none.
        input_tokens_per_minute: input-token budget (Anthropic's ITPM), charged the input
            part of the cost: ``tokens - output_tokens``; ``None`` = none.
        output_tokens_per_minute: output-token budget (Anthropic's OTPM), charged
            ``acquire(output_tokens=)`` (typically the request's ``max_tokens``) and
            corrected to the tokens generated by ``Token.settle(output_tokens=)``;
            ``None`` = none. The split budgets stand beside ``tokens_per_minute`` (a call
            must fit every budget configured) and cost nothing when unset.
        ramp: admissions per window may grow at most this factor (``> 1``) per window;
            ``None`` = no slope bound.
        window_s: the slope window in seconds (default 10).
        burst_s: seconds of refill a budget holds at most (default 1: Alibaba enforces
            RPM/60 per second, so one second of budget is what such a provider tolerates).
        ramp_floor: admissions always allowed in a window after idle; default
            ``ceil(window_s)``, one request per second.

    Raises:
        TypeError: a value is not a number (bools are rejected), ``ramp_floor`` not an int.
        ValueError: a rate or window that is negative, zero, NaN, infinite or huge;
            ``ramp <= 1``; ``burst_s`` outside (0, 60]; ``ramp_floor < 1``; no budget and
            no ramp at all (use ``rate=None``).
    """

    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    ramp: float | None = None
    window_s: float = 10.0
    burst_s: float = 1.0
    ramp_floor: int | None = None
    input_tokens_per_minute: float | None = None
    output_tokens_per_minute: float | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        for name in (
            "requests_per_minute",
            "tokens_per_minute",
            "input_tokens_per_minute",
            "output_tokens_per_minute",
        ):
            value = getattr(self, name)
            if value is not None:
                set_(self, name, _number(name, value, low=0, low_ok=False, high=_MAX_PER_MINUTE))
        if self.ramp is not None:
            set_(self, "ramp", _number("ramp", self.ramp, low=1, low_ok=False, high=1e6))
        set_(
            self,
            "window_s",
            _number("window_s", self.window_s, low=0, low_ok=False, high=_MAX_WINDOW_S),
        )
        set_(self, "burst_s", _number("burst_s", self.burst_s, low=0, low_ok=False, high=60))
        floor: object = self.ramp_floor
        if floor is not None:
            if isinstance(floor, bool) or not isinstance(floor, int):
                msg = (
                    "ramp_floor must be an int >= 1 or None "
                    f"(got {floor!r} of type {type(floor).__name__})"
                )
                raise TypeError(msg)
            if not 1 <= floor <= 10**9:
                msg = f"ramp_floor must be an int >= 1 and <= 1e9 or None (got {floor!r})"
                raise ValueError(msg)
        if (
            self.requests_per_minute is None
            and self.tokens_per_minute is None
            and self.input_tokens_per_minute is None
            and self.output_tokens_per_minute is None
            and self.ramp is None
        ):
            msg = (
                "Rate needs requests_per_minute, tokens_per_minute, input_tokens_per_minute, "
                "output_tokens_per_minute or ramp (got none of them); use rate=None for no "
                "rate limit"
            )
            raise ValueError(msg)

    @classmethod
    def per(
        cls,
        seconds: float,
        *,
        requests: float | None = None,
        tokens: float | None = None,
        ramp: float | None = None,
        window_s: float = 10.0,
        burst_s: float = 1.0,
        ramp_floor: int | None = None,
    ) -> Rate:
        """A rate of ``requests`` (and/or ``tokens``) per ``seconds``: aiolimiter's spelling.

        ``Rate.per(1, requests=5)`` is ``Rate(requests_per_minute=300)``, and
        ``Rate.per(30, requests=100, tokens=50_000)`` is 200 requests and 100,000 tokens
        per minute: the result is an ordinary :class:`Rate` (it compares equal to the
        per-minute spelling), so everything above applies to it.

        Unlike ``aiolimiter.AsyncLimiter(max_rate, time_period)``, whose bucket starts
        full and holds a whole period, the budget starts empty and holds ``burst_s``
        seconds of refill (default 1 s): pass ``burst_s=seconds`` (at most 60) to allow a
        period's worth at once after idle.

        Args:
            seconds: the period the counts are given over, in seconds (``> 0``, at most a
                day).
            requests: requests per period; ``None`` = no request-rate limit.
            tokens: tokens per period; ``None`` = no token-rate limit.
            ramp, window_s, burst_s, ramp_floor: as for :class:`Rate`.

        Raises:
            TypeError, ValueError: as for :class:`Rate`, naming ``seconds``, ``requests``
                or ``tokens`` and the value.
        """
        period = _number("seconds", seconds, low=0, low_ok=False, high=_MAX_WINDOW_S)
        if requests is None and tokens is None and ramp is None:
            msg = (
                "Rate.per needs requests, tokens or ramp (got none of them); "
                "use rate=None for no rate limit"
            )
            raise ValueError(msg)
        per_minute: dict[str, float] = {}
        for name, count in (("requests", requests), ("tokens", tokens)):
            if count is not None:
                count = _number(name, count, low=0, low_ok=False, high=_MAX_PER_MINUTE)
                per_minute[name] = count * 60.0 / period
                if not per_minute[name] <= _MAX_PER_MINUTE:  # also catches an overflow to inf
                    msg = (
                        f"{name} per seconds must come to at most {_MAX_PER_MINUTE:g} per "
                        f"minute (got {count!r} per {period!r} s)"
                    )
                    raise ValueError(msg)
        return cls(
            requests_per_minute=per_minute.get("requests"),
            tokens_per_minute=per_minute.get("tokens"),
            ramp=ramp,
            window_s=window_s,
            burst_s=burst_s,
            ramp_floor=ramp_floor,
        )

    @property
    def split(self) -> bool:
        """Whether input or output tokens have a budget of their own (ITPM / OTPM)."""
        return self.input_tokens_per_minute is not None or self.output_tokens_per_minute is not None

    @property
    def floor(self) -> int:
        """The slope bound's floor: ``ramp_floor``, or ``ceil(window_s)`` when unset."""
        return self.ramp_floor if self.ramp_floor is not None else max(1, math.ceil(self.window_s))


@dataclass(frozen=True)
class RateStatistics:
    """The rate view of :meth:`anygate.Gate.statistics`, taken under the gate's lock.

    Attributes:
        rate: the gate's :class:`Rate`.
        requests_available: request units in the budget now (negative while in debt);
            ``None`` without a request rate.
        tokens_available: token units in the budget now (negative while in debt, e.g.
            after a settle charged more than was stated); ``None`` without a token rate.
        next_admission_s: seconds until a request stating no tokens could be admitted by
            every budget and the slope bound (0: now); slots and queued callers aside.
        admitted_this_window: admissions in the last ``window_s`` (whole ticks).
        admitted_previous_window: admissions in the ``window_s`` before that.
        input_tokens_available: input-token units in the budget now (negative in debt);
            ``None`` without an input-token rate.
        output_tokens_available: output-token units in the budget now (negative in debt);
            ``None`` without an output-token rate.
    """

    rate: Rate
    requests_available: float | None
    tokens_available: float | None
    next_admission_s: float
    admitted_this_window: int
    admitted_previous_window: int
    input_tokens_available: float | None = None
    output_tokens_available: float | None = None


def admission_time(tat: float, now: float, cost: float, interval: float, tau: float) -> float:
    """The earliest time ``>= now`` at which a budget can pay ``cost`` units.

    GCRA (virtual scheduling). With ``T = interval`` (seconds per unit) and burst
    ``B = tau / T`` units, the budget's level at time ``t`` is
    ``B - max(0, tat - t) / T`` (full when ``tat <= t``, negative while in debt). A cost
    conforms when the level covers ``min(cost, B)``::

        t = max(now, tat - tau + min(cost * T, tau))

    so a cost above the burst waits for a full budget and leaves a debt, and a cost of 0
    still waits out any debt (what a later ``settle`` charged).
    """
    return max(now, tat - tau + min(cost * interval, tau))


def charge(tat: float, at: float, cost: float, interval: float) -> float:
    """The new ``tat`` after paying ``cost`` units at time ``at``: ``max(tat, at) + cost * T``.

    A refund is a negative ``cost`` applied to ``tat`` directly (``tat + cost * T``); the
    level stays capped at the burst because :func:`admission_time` clamps with ``now``.
    """
    return max(tat, at) + cost * interval


def slope_allowance(counts: list[int], ramp: float, floor: int) -> int:
    """Admissions still allowed in the newest tick of ``counts`` by the slope bound.

    ``counts`` holds the last ``2k`` ticks, oldest first (``k = len(counts) // 2``), the
    newest being the current tick. Every window of ``k`` ticks that contains the current
    tick ends at tick ``i + m`` for ``m = 0..k-1``; its known part is ticks
    ``i+m-k+1 .. i`` (later ticks are still empty), and its previous window
    ``i+m-2k+1 .. i+m-k`` lies wholly in the past. Admitting ``n`` more now keeps every
    such window within ``count <= ramp x previous + floor`` iff::

        n <= min over m of (ramp * previous_m + floor - current_m)

    Checking only at admission time suffices: a later admission in the same window checks
    that window again with this one counted. Returns that minimum, rounded down, >= 0.
    """
    k = len(counts) // 2
    # prefix[j] = sum(counts[:j])
    prefix = [0]
    total = 0
    for c in counts:
        total += c
        prefix.append(total)
    last = len(counts)  # index one past the current tick
    best = math.inf
    for m in range(k):
        current = prefix[last] - prefix[last - k + m]
        previous = prefix[last - k + m] - prefix[last - 2 * k + m]
        best = min(best, ramp * previous + floor - current)
    return max(0, math.floor(best + 1e-9))


class BudgetMark(NamedTuple):
    """What a gate's budgets had charged at one moment (``Budgets.mark``), for later syncs.

    A named tuple, not a frozen dataclass: the transports take one per request, and a
    frozen dataclass costs several times as much to build.

    Attributes:
        at: the gate's clock when the mark was taken.
        requests: request units charged since the budgets began (cumulative, never less).
        tokens: token units charged since the budgets began (refunds do not count down).
        tokens_back: token units refunded since the budgets began (``settle`` refunds).
        input_tokens: input-token units charged so far (0 without an input budget).
        output_tokens: output-token units charged so far (0 without an output budget).
    """

    at: float
    requests: float
    tokens: float
    tokens_back: float = 0.0
    input_tokens: float = 0.0
    output_tokens: float = 0.0


class Budgets:
    """The mutable rate state of one gate; every method runs under the gate's lock.

    Not thread-safe on its own and not public: :class:`anygate.Gate` owns one per rate.
    """

    __slots__ = (
        "_allow",
        "_counts",
        "_current",
        "_epoch",
        "_floor",
        "_ramp",
        "_req_step",
        "_tick",
        "_tick_end",
        "_tick_index",
        "inp",
        "max_tokens",
        "outp",
        "rate",
        "req_interval",
        "req_ready",
        "req_spent",
        "req_tat",
        "req_tau",
        "split",
        "started",
        "tok_back",
        "tok_interval",
        "tok_spent",
        "tok_tat",
        "tok_tau",
    )

    _allow: int
    _counts: list[int]
    _current: int
    _epoch: float
    _floor: int
    _ramp: float
    _tick: float
    _tick_end: float
    _tick_index: int
    req_spent: float
    tok_spent: float
    inp: Bucket | None
    outp: Bucket | None
    split: bool
    tok_back: float

    def __init__(self, rate: Rate, now: float | None, old: Budgets | None = None) -> None:
        """Budgets that start empty at ``now``; ``old``'s levels and history carry over.

        ``now=None`` (the clock cannot be read yet: a virtual clock outside its run) makes
        them start, empty, at the first slow-path step; the fast path refuses until then.
        """
        self.rate = rate
        self.started = now is not None
        # Units charged so far (admissions and settle charges, never refunds), carried over
        # a rate change: what ``lower_since`` subtracts for admissions after a mark.
        self.req_spent = 0.0 if old is None else old.req_spent
        self.tok_spent = 0.0 if old is None else old.tok_spent
        self.tok_back = 0.0 if old is None else old.tok_back
        if now is None:
            now = 0.0
        elif old is not None and not old.started:
            old = None
        burst = rate.burst_s
        self.req_interval = self.req_tau = self.req_tat = self._req_step = 0.0
        self.req_ready = -math.inf
        self.tok_interval = self.tok_tau = self.tok_tat = 0.0
        rpm, tpm = rate.requests_per_minute, rate.tokens_per_minute
        # The largest cost one admission may state: a whole minute of the token budget.
        self.max_tokens = math.inf if tpm is None else tpm
        # The split budgets (ITPM / OTPM): objects, off the inline fast path; see split.py.
        itpm, otpm = rate.input_tokens_per_minute, rate.output_tokens_per_minute
        split_tau = max(burst, SPLIT_BURST_S)
        old_in = None if old is None else old.inp
        old_out = None if old is None else old.outp
        self.inp = None if itpm is None else Bucket(itpm, split_tau, now, old_in)
        self.outp = None if otpm is None else Bucket(otpm, split_tau, now, old_out)
        self.split = self.inp is not None or self.outp is not None
        if itpm is not None:
            # A cost stating no output part is all input: at most a minute of ITPM.
            self.max_tokens = min(self.max_tokens, itpm)
        if rpm is not None:
            self.req_interval = 60.0 / rpm
            self.req_tau = burst
            level = old.requests_left(now) if old is not None else None
            self.req_tat = self._tat_for(level, now, self.req_interval, self.req_tau)
            self._update_ready()
        if tpm is not None:
            self.tok_interval = 60.0 / tpm
            self.tok_tau = burst
            level = old.tokens_left(now) if old is not None else None
            self.tok_tat = self._tat_for(level, now, self.tok_interval, self.tok_tau)
        self._ramp = rate.ramp or 0.0
        self._floor = rate.floor
        self._tick = rate.window_s / TICKS
        self._current = 0
        if old is not None and old._tick == self._tick:
            # Keep the window history: a live change must not forget recent admissions.
            old._flush()
            self._epoch, self._counts = old._epoch, old._counts
            self._tick_index, self._tick_end = old._tick_index, old._tick_end
        else:
            # A new (or re-sized) window starts with an idle history: the floor applies.
            self._epoch = now
            self._counts = [0] * (2 * TICKS)
            self._tick_index = 0
            self._tick_end = now + self._tick
        self._allow = slope_allowance(self._counts, self._ramp, self._floor) if self._ramp else 0
        self._roll(now)
        if not self.started:
            self.req_ready = math.inf  # the fast path defers to when(), which starts us

    def _start(self, now: float) -> None:
        self.__init__(self.rate, now)  # type: ignore[misc]  # re-run in place, once

    @staticmethod
    def _tat_for(level: float | None, now: float, interval: float, tau: float) -> float:
        # A new budget starts empty (level 0); a changed one keeps its level in units.
        units = 0.0 if level is None else min(level, tau / interval)
        return now + tau - units * interval

    def _update_ready(self) -> None:
        # The earliest time the next request conforms (admission_time with cost 1).
        if self.req_interval:
            self._req_step = min(self.req_interval, self.req_tau) - self.req_tau
            self.req_ready = self.req_tat + self._req_step
        else:
            self.req_ready = -math.inf

    # ------------------------------------------------------------------ views

    def requests_left(self, now: float) -> float | None:
        """Request units in the budget now (negative in debt), or ``None`` if unlimited."""
        if not self.req_interval:
            return None
        return (self.req_tau - max(0.0, self.req_tat - now)) / self.req_interval

    def tokens_left(self, now: float) -> float | None:
        """Token units in the budget now (negative in debt), or ``None`` if unlimited."""
        if not self.tok_interval:
            return None
        return (self.tok_tau - max(0.0, self.tok_tat - now)) / self.tok_interval

    def window_counts(self, now: float) -> tuple[int, int]:
        """Admissions in the current and the previous ``window_s`` (whole ticks)."""
        self._roll(now)  # flushes the current tick's count
        counts = self._counts
        return sum(counts[TICKS:]), sum(counts[:TICKS])

    # ------------------------------------------------------------------ admission

    def try_take(self, now: float, tokens: int) -> bool:
        """Pay for one admission now if every budget allows it: the uncontended path.

        :func:`admission_time`, :func:`charge` and :meth:`take` spelled out inline: this
        runs on every uncontended acquire, whose budget is a few hundred nanoseconds.
        Budgets with a split part go through :meth:`try_take_split` instead.
        """
        late = now + 1e-9  # EPSILON, as a constant
        if late < self.req_ready:
            return False
        tok_interval = self.tok_interval
        if tok_interval:
            tau = self.tok_tau
            cost = tokens * tok_interval
            if late < self.tok_tat - tau + (cost if cost < tau else tau):
                return False
        if late >= self._tick_end:
            self._roll(now)
        if self._allow < 1 and self._ramp:
            return False
        interval = self.req_interval
        if interval:
            tat = self.req_tat
            if tat < now:
                tat = now
            tat += interval
            self.req_tat = tat
            self.req_ready = tat + self._req_step
            self.req_spent += 1
        if tokens and tok_interval:
            tat = self.tok_tat
            if tat < now:
                tat = now
            self.tok_tat = tat + tokens * tok_interval
            self.tok_spent += tokens
        self._current += 1
        self._allow -= 1
        return True

    def try_take_split(self, now: float, tokens: int, out: int) -> bool:
        """:meth:`try_take` for budgets with input/output parts (``out`` of ``tokens`` is
        output): the general :meth:`when` and :meth:`take`, off the inline fast path."""
        if not self.started:
            return False  # the slow path starts them (when())
        if self.when(now, tokens, out=out) > now + EPSILON:
            return False
        self.take(now, tokens, out)
        return True

    def _split_due(self, now: float, tokens: int, out: int, ahead_in: float = 0.0) -> float:
        """When the split budgets admit ``tokens`` (``out`` of them output) at the earliest."""
        at = now
        if self.inp is not None:
            at = max(at, self.inp.at(now, tokens - out, ahead_in))
        if self.outp is not None:
            at = max(at, self.outp.at(now, out))
        return at

    def _split_pay(self, at: float, tokens: int, out: int) -> None:
        if self.inp is not None:
            self.inp.pay(at, tokens - out)
        if self.outp is not None:
            self.outp.pay(at, out)

    def statistics(self, now: float) -> RateStatistics:
        """The rate view at ``now``."""
        if not self.started:
            self._start(now)
        current, previous = self.window_counts(now)
        return RateStatistics(
            rate=self.rate,
            requests_available=self.requests_left(now),
            tokens_available=self.tokens_left(now),
            next_admission_s=self.next_admission(now),
            admitted_this_window=current,
            admitted_previous_window=previous,
            input_tokens_available=None if self.inp is None else self.inp.left(now),
            output_tokens_available=None if self.outp is None else self.outp.left(now),
        )

    def when(
        self, now: float, tokens: int, ahead: int = 0, ahead_tokens: int = 0, out: int = 0
    ) -> float:
        """Earliest admission time of a request behind ``ahead`` others (a lower bound).

        Exact for the head (``ahead == 0``): the latest of every budget's GCRA time and
        the slope bound's next allowance. Behind others, only the budgets they must pay
        first are counted, so the estimate never exceeds the true time (the split budgets
        count none of the costs ahead: the queue keeps only their total).
        """
        if not self.started:
            self._start(now)
        at = now
        if self.req_interval:
            tat = max(self.req_tat, now) + ahead * self.req_interval
            at = max(at, admission_time(tat, now, 1, self.req_interval, self.req_tau))
        if self.tok_interval:
            tat = max(self.tok_tat, now) + ahead_tokens * self.tok_interval
            at = max(at, admission_time(tat, now, tokens, self.tok_interval, self.tok_tau))
        if self.split:
            at = max(at, self._split_due(now, tokens, out))
        if self._ramp and not ahead:
            at = max(at, self._slope_time(at))
        return at

    def take(self, at: float, tokens: int, out: int = 0) -> None:
        """Charge one admission at time ``at`` (``<= now``) to every budget."""
        if self.req_interval:
            self.req_tat = charge(self.req_tat, at, 1, self.req_interval)
            self._update_ready()
            self.req_spent += 1
        if self.tok_interval and tokens:
            self.tok_tat = charge(self.tok_tat, at, tokens, self.tok_interval)
            self.tok_spent += tokens
        if self.split:
            self._split_pay(at, tokens, out)
        # Counted with or without a ramp: statistics report admissions per window.
        if at + EPSILON >= self._tick_end:
            self._roll(at)
        self._current += 1
        self._allow -= 1

    def next_admission(self, now: float) -> float:
        """Seconds until a request stating no tokens could be admitted (slots aside)."""
        return max(0.0, self.when(now, 0) - now)

    def settle(self, delta: int, now: float | None, in_delta: int = 0, out_delta: int = 0) -> None:
        """A token settle: charge ``delta`` more tokens (refund when negative).

        A charge is paid at ``now``, like one at admission (:func:`charge`): a tat in the
        past only means "full", and adding to it would lose the charge in the burst cap.
        Refunds stay relative (the level is capped anyway). ``in_delta`` / ``out_delta``
        are the input and output parts' changes, for the split budgets (``now`` may be
        ``None`` only when no part is charged more).
        """
        if self.inp is not None and in_delta:
            self.inp.settle(in_delta, now)
        if self.outp is not None and out_delta:
            self.outp.settle(out_delta, now)
        if delta > 0 and self.tok_interval:
            self.tok_spent += delta
            if now is not None and self.tok_tat < now:
                self.tok_tat = now
        elif delta < 0 and self.tok_interval:
            self.tok_back -= delta
        if self.tok_interval and delta:
            self.tok_tat += delta * self.tok_interval

    def refund(self, requests: int, tokens: int, out: int = 0) -> None:
        """Give budget back (negative values charge more); the slope counts stay.

        ``out`` is the output part of ``tokens``, for the split budgets (:meth:`settle`
        moves those itself: this is for an admission given back whole).
        """
        if self.split:
            if self.inp is not None:
                self.inp.refund(tokens - out)
            if self.outp is not None:
                self.outp.refund(out)
        if self.req_interval and requests:
            self.req_tat -= requests * self.req_interval
            self._update_ready()
        if self.tok_interval and tokens:
            self.tok_tat -= tokens * self.tok_interval

    def hold_until(self, at: float) -> None:
        """Spend every budget until ``at``: no admission before it, then refill as usual.

        For a provider that said its own budget is drained until ``at``. The request
        budget is left with one unit at ``at`` and the token budget with none (a call
        stating tokens then waits for their refill), exactly as if admissions had
        drained them; a budget already owing past ``at`` keeps its debt. Deferred to
        the first slow-path step if the budgets have not started.
        """
        if self.req_interval:
            tat = at + self.req_tau - min(self.req_interval, self.req_tau)
            if tat > self.req_tat:
                self.req_tat = tat
                self._update_ready()
        if self.tok_interval:
            tat = at + self.tok_tau
            if tat > self.tok_tat:
                self.tok_tat = tat
        for bucket in (self.inp, self.outp):
            if bucket is not None:
                bucket.hold(at)

    def mark(self, now: float) -> BudgetMark:
        """What has been charged so far, stamped ``now``: the reference of :meth:`lower_since`."""
        if not self.split:
            return BudgetMark(now, self.req_spent, self.tok_spent, self.tok_back)
        return BudgetMark(
            now,
            self.req_spent,
            self.tok_spent,
            self.tok_back,
            0.0 if self.inp is None else self.inp.spent - self.inp.back,
            0.0 if self.outp is None else self.outp.spent - self.outp.back,
        )

    def lower_since(
        self,
        now: float,
        mark: BudgetMark,
        requests: float | None,
        tokens: float | None,
        input_tokens: float | None = None,
        output_tokens: float | None = None,
    ) -> bool:
        """Lower each budget to what a provider said was left at ``mark``, less our spending since.

        For a provider's ``remaining`` header (``_limits.learn``): ``requests`` / ``tokens``
        units were left in its bucket when the reported request was sent (``mark`` taken
        right after that request was charged here). Everything this gate charged since
        (``spent - mark``) is assumed to be counted against that bucket by now, and no
        refill since is credited, so ``left - spent_since`` is a lower bound on the
        provider's level: a budget above it is brought down to it, possibly into debt
        (the provider refills slower than we pace, e.g. another client spends from it).
        The crediting of no refill is the conservative choice: a report ``d`` seconds old
        understates the level by ``d`` seconds of the provider's net refill (callers drop
        reports older than one already applied, see ``RateLearner``). Never raises a
        level of the request or total-token budget (the input- and output-token budgets
        are set to the provider's count either way: ``split.Bucket.sync``); ``None`` (or a
        budget the gate does not have) changes nothing. Returns ``True`` if a budget
        changed.
        """
        changed = False
        if requests is not None and self.req_interval:
            level = requests - (self.req_spent - mark.requests)
            tat = now + self.req_tau - level * self.req_interval
            if tat > self.req_tat:
                self.req_tat = tat
                self._update_ready()
                changed = True
        if tokens is not None and self.tok_interval:
            level = tokens - (self.tok_spent - mark.tokens)
            tat = now + self.tok_tau - level * self.tok_interval
            if tat > self.tok_tat:
                self.tok_tat = tat
                changed = True
        # The split budgets count net charges (settle refunds subtracted): their marks
        # hold ``spent - back`` (see ``mark``). They are set, not only lowered (see
        # ``split.Bucket.sync``).
        if input_tokens is not None and self.inp is not None:
            since = self.inp.spent - self.inp.back - mark.input_tokens
            changed |= self.inp.sync(now, input_tokens, since)
        if output_tokens is not None and self.outp is not None:
            since = self.outp.spent - self.outp.back - mark.output_tokens
            changed |= self.outp.sync(now, output_tokens, since)
        return changed

    # ------------------------------------------------------------------ slope ticks

    def _index(self, t: float) -> int:
        return math.floor((t - self._epoch + EPSILON) / self._tick)

    def _flush(self) -> None:
        # The current tick's count lives in a plain int on the hot path (a list item
        # update costs more); it joins the ring whenever the ring is read.
        if self._current:
            self._counts[-1] += self._current
            self._current = 0

    def _roll(self, now: float) -> None:
        """Move the tick ring forward to the tick containing ``now``."""
        self._flush()
        index = self._index(now)
        steps = index - self._tick_index
        if steps > 0:
            counts = self._counts
            if steps >= len(counts):
                counts[:] = [0] * len(counts)
            else:
                del counts[:steps]
                counts.extend([0] * steps)
            self._tick_index = index
            if self._ramp:
                self._allow = slope_allowance(counts, self._ramp, self._floor)
        self._tick_end = self._epoch + (self._tick_index + 1) * self._tick

    def _slope_time(self, at: float) -> float:
        """Earliest time ``>= at`` with slope allowance for one more admission."""
        steps = self._index(at) - self._tick_index if at + EPSILON >= self._tick_end else 0
        if steps <= 0 and self._allow >= 1:
            return at
        self._flush()
        counts = self._counts
        size = len(counts)
        for extra in range(max(steps, 1), size + 1):
            # The ring as it will look ``extra`` ticks on, with no admissions meanwhile.
            view = counts[extra:] + [0] * extra
            if slope_allowance(view, self._ramp, self._floor) >= 1:
                return max(at, self._epoch + (self._tick_index + extra) * self._tick)
        return at  # not reached: an idle ring allows the floor (>= 1)
