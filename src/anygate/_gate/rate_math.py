"""Rate admission arithmetic: pure functions of one monotonic clock (seconds), no state.

Two mechanisms, run by the gate's budgets (``budgets``) under the gate's lock:

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

The formulas live here once, testable as arithmetic; the hot path in
``Budgets.try_take`` spells the same formulas out inline (a call costs more than the
arithmetic there), and ``split.Bucket`` and the fleet's rate script restate them. This is
not a provider-side rate limiter (it cannot see other processes) and not a token counter
(the cost is what callers state, corrected by ``Token.settle``).
"""

from __future__ import annotations

import math

__all__ = ["EPSILON", "TICKS", "admission_time", "charge", "level_tat", "slope_allowance"]

#: Ticks per slope window: the bound holds for every window starting on a tick.
TICKS = 10
#: Slack in seconds when comparing an admission time with the clock. A waiter woken by a
#: timer set for ``due`` may read ``due - 1 ulp``; without slack it would re-park forever on
#: a virtual clock that only advances when everyone sleeps.
EPSILON = 1e-9


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


def level_tat(level: float | None, now: float, interval: float, tau: float) -> float:
    """The ``tat`` of a budget holding ``level`` units at ``now``: ``now + tau - units x T``
    with ``units = min(level, tau / T)`` (a level above the burst is capped to it, a debt
    stays owed); ``level=None``: an empty budget (units 0)."""
    units = 0.0 if level is None else min(level, tau / interval)
    return now + tau - units * interval


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
