"""The gate's budget steps: locked steps that change the rate budgets outside an admission.

A rate set live (``_set_rate``), a token settle (``_settle``) and the hooks of header
learning (``_limits.learn``): ``_hold_until`` and ``_budget_mark`` / ``_lower_budgets``.
Each is one locked section over the ledger's state (``ledger``), like the slot steps, and
admits from the head of the queue whoever a budget it raised lets go (I2); the arithmetic is
the budgets' own (``budgets.Budgets``).

Header learning enters through ``_hold_until``: a provider that reports its budget drained
has ours spent until its reset, so I2 and the hot paths are unchanged (a hold is a debt like
any other); ``_lower_budgets`` only lowers the request and total-token budgets, likewise
(but for the token budget's one lift, ``lift=``, which admits whoever it lets go).

A subclass of ``ledger.Ledger`` that :class:`anygate.Gate` inherits, with no state of its
own; not where callers are admitted, queued or released (``slot_steps``), and none of it
runs on the uncontended path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .budgets import Budgets
from .ledger import Ledger, token_out
from .waiters import Waiter, ki_protected

if TYPE_CHECKING:
    from collections.abc import Callable

    from .rate import BudgetMark, Rate
    from .token import Token

__all__ = ["BudgetSteps"]


class BudgetSteps(Ledger):
    """The ledger's steps that change the rate budgets; :class:`anygate.Gate` inherits them."""

    __slots__ = ()

    @ki_protected
    def _set_rate(self, rate: Rate | None) -> None:
        """Apply a validated rate live: budgets keep their level, the next ones go if they can."""

        def change(now: float | None) -> None:
            self._budgets = None if rate is None else Budgets(rate, now, self._budgets)

        self._change_budgets(change, read_clock=rate is not None)

    @ki_protected
    def _requests_by_minute(self, on: bool = True) -> None:
        """Let the request budget hold a minute's refill from now on, full if it admitted
        nothing yet (``BudgetSync.by_minute``; ``on=False``: a second's again): the rate
        is the provider's *published* per-minute limit, which takes its minute at once.
        Set by the adaptive limit of a policy that says so (``rate_is_ceiling=False``);
        its send path holds every trailing minute to the rate (``_limits.pace``)."""

        def change(now: float | None) -> None:
            budgets = self._budgets
            if budgets is not None:
                if now is not None and not budgets.started:
                    budgets._start(now)
                budgets.by_minute(0.0 if now is None else now, on)

        self._change_budgets(change)

    def _change_budgets(
        self, change: Callable[[float | None], None], read_clock: bool = True
    ) -> None:
        """Run ``change(now)`` on the budgets under the lock (``now``: the clock, ``None``
        if it cannot be read, ``0.0`` unread), then admit whoever they now let go."""
        wakes: list[Waiter] = []
        lock = self._lock
        lock.acquire()
        try:
            now = self._read_clock() if read_clock else 0.0
            change(now)
            if now is not None:
                self._advance_locked(now, wakes)
        finally:
            lock.release()
            if self._deferred:
                self._drain()
        if wakes:
            self._fire(wakes)

    def _learned_rate(self, rate: Rate) -> bool:
        """Header learning's rate (``_limits.learn``), set live; whether it was. A fleet's
        local gate sends it to the fleet instead (the provider's limit is every
        process's), where it applies once Redis applied it."""
        self._set_rate(rate)
        return True

    @ki_protected
    def _hold_until(self, at: float) -> bool:
        """Admit nobody before ``at`` (on the gate's clock) by spending the rate budgets.

        The one gate-core hook of header learning (``_limits.learn``): a provider that says its
        budget is drained until ``at`` gets no calls from us before then. It lives in
        the budgets (``Budgets.hold_until``), so the hot path pays nothing and waiters
        wait for it exactly as for any budget (I2); holding only delays, so nobody
        needs waking: the next waiter's timer finds the later time when it fires.
        Returns ``False`` (and holds nothing) when the gate has no rate budget to spend
        or its clock cannot be read now.
        """
        if self._shares_rate:
            return False
        lock = self._lock
        lock.acquire()
        try:
            budgets = self._budgets
            now = None if budgets is None else self._read_clock()
            held = budgets is not None and now is not None
            if budgets is not None and now is not None:
                if not budgets.started:
                    budgets._start(now)
                budgets.hold_until(at)
        finally:
            lock.release()
            if self._deferred:
                self._drain()
        return held

    @ki_protected
    def _keep_token_estimates(self) -> bool:
        """From now on a settle refund gives nothing back to the token budget.

        The third gate-core hook, for the adaptive limit (``_limits.sending``): a
        tokens-per-minute 429 that only the estimates charged at admission explain (not
        what the calls' settles brought the budget down to) says the provider keeps
        them, as OpenAI reserves ``max_tokens``. Only ever less budget, so nobody needs
        waking (I2). A budget synced to a provider's reports is left to them (its
        refunds wait for the next report). Returns whether the budget changed mode.
        """
        if self._shares_rate:
            return False
        lock = self._lock
        lock.acquire()
        try:
            budgets = self._budgets
            changed = budgets is not None and bool(budgets.tok_interval) and not budgets.tok_keep
            if changed:
                assert budgets is not None
                budgets.tok_keep = True
        finally:
            lock.release()
            if self._deferred:
                self._drain()
        return changed

    @ki_protected
    def _budget_mark(self) -> BudgetMark | None:
        """``Gate.budget_mark``: the budgets' charges so far, stamped with the clock now;
        the reference a later :meth:`_lower_budgets` counts this gate's own admissions
        from. ``None`` without a rate budget of its own (a fleet's local gate) or a
        readable clock."""
        if self._shares_rate:
            return None
        lock = self._lock
        lock.acquire()
        try:
            budgets = self._budgets
            now = None if budgets is None else self._read_clock()
            mark = None if budgets is None or now is None else budgets.mark(now)
        finally:
            lock.release()
            if self._deferred:
                self._drain()
        return mark

    @ki_protected
    def _lower_budgets(
        self,
        mark: BudgetMark,
        requests: float | None,
        tokens: float | None,
        input_tokens: float | None = None,
        output_tokens: float | None = None,
        *,
        lift: float | None = None,
        spare: bool = False,
        window: bool = False,
    ) -> bool:
        """Bring the budgets down to what a provider said was left (``Budgets.lower_since``).

        The second gate-core hook of header learning (``_limits.learn``), beside
        :meth:`_hold_until`: ``requests`` / ``tokens`` units were left at ``mark`` by the
        provider's count; this gate's own charges since ``mark`` are subtracted. The
        request and total-token budgets are only ever lowered, so, as with a hold, nobody
        needs waking for them (I2), but for the token budget's one lift (``lift``, from
        ``ShareMeter.lift``); the input- and output-token budgets (``input_tokens`` /
        ``output_tokens``) are set to the provider's count; a raise of either kind admits
        whoever it lets go, from the head of the queue (I9). ``spare``: keep the largest
        admission beyond the burst spare in a token bucket (``Budgets.lower_since``).
        ``window``: the token budget becomes (or is) a copy of the provider's sliding
        window, whose level may rise; the queue is advanced as for a lift. Returns ``False`` when nothing
        changed, the gate has no rate budget, or its clock cannot be read now.
        """
        if self._shares_rate:
            return False
        wakes: list[Waiter] = []
        lock = self._lock
        lock.acquire()
        try:
            budgets = self._budgets
            now = None if budgets is None else self._read_clock()
            lowered = False
            if budgets is not None and now is not None:
                if not budgets.started:
                    budgets._start(now)
                if budgets.split or lift is not None or spare or window:
                    lowered = budgets.lower_since(
                        now,
                        mark,
                        requests,
                        tokens,
                        input_tokens,
                        output_tokens,
                        lift=lift,
                        spare=spare,
                        window=window,
                    )
                else:
                    lowered = budgets.lower_since(now, mark, requests, tokens)
                if lowered and (budgets.split or lift is not None or window) and self._live:
                    self._advance_locked(now, wakes)
        finally:
            lock.release()
            if self._deferred:
                self._drain()
        if wakes:
            self._fire(wakes)
        return lowered

    @ki_protected
    def _settle(self, token: Token, tokens: int, out: int | None = None) -> None:
        """Make ``token``'s token charge ``tokens`` (``out`` of them output; ``None``:
        the output part stays, at most ``tokens``): charge or refund the difference once."""
        wakes: list[Waiter] = []
        lock = self._lock
        lock.acquire()
        try:
            delta = tokens - token._cost
            was_out = token_out(token)
            if out is None:
                out = min(was_out, tokens)
            token._cost = tokens  # the next settle charges relative to this one
            if out or was_out:
                token._out = out
            out_delta = out - was_out
            in_delta = delta - out_delta
            budgets = self._budgets
            if budgets is not None and (delta or (out_delta and budgets.split)):
                # A charge is paid now, like one at admission (see Budgets.settle).
                more = delta > 0 or in_delta > 0 or out_delta > 0
                at = self._read_clock() if more else None
                if budgets.split:
                    budgets.settle(delta, at, in_delta, out_delta)
                else:
                    budgets.settle(delta, at)
                if (delta < 0 or in_delta < 0 or out_delta < 0) and self._live:
                    self._advance_locked(self._clock(), wakes)
        finally:
            lock.release()
            if self._deferred:
                self._drain()
        if wakes:
            self._fire(wakes)
