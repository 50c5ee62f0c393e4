"""The adaptive limit's values: its defaults, its arithmetic and what it reports.

Pure and lock-free, so the rules are testable without a gate: :func:`lowered_limit` (a
throttle's cut), :func:`raised_limit` (a success's growth), :func:`capacity_for` (the gate
capacity a fractional limit means). :mod:`anygate._limits.adaptive` holds the state machine that
applies them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

__all__ = [
    "CHECK_GRACE_FACTOR",
    "CHECK_MIN_GRACE_S",
    "DEFAULT_DECREASE_FACTOR",
    "DEFAULT_ENABLED",
    "DEFAULT_HOLD_S",
    "DEFAULT_LATENCY",
    "DEFAULT_MAX_HOLD_S",
    "DEFAULT_MIN_CONCURRENT_CALLS",
    "DEFAULT_PACE_BURST_RATE",
    "DEFAULT_PAUSE_MS",
    "HERD_GROWTH",
    "OVER_LIMIT_POLL_S",
    "PROBE_GRACE_S",
    "PROBE_RESERVE_S",
    "AdaptiveStatistics",
    "LimitChange",
    "capacity_for",
    "check_grace",
    "lowered_limit",
    "probe_grace",
    "raised_limit",
]

#: Defaults used when a policy creates a gate's adaptive limit without stating a value.
DEFAULT_ENABLED = True
DEFAULT_MIN_CONCURRENT_CALLS = 1
# Chosen on bench_storm.py's tuning set (seeds 1-3): 0.8 and 0.85 beat 0.7 in every cell
# (mean 1.03x vs 1.05x the oracle, 429s unchanged at <= 0.42 %); 0.9 and 0.95 let 429s
# past 0.5 % (slots 48, a growth-1.6 burst rule). 0.8 keeps the margin from that edge.
DEFAULT_DECREASE_FACTOR = 0.8
DEFAULT_PAUSE_MS = 5000.0
#: After a concurrency cut the limit holds this long before it may grow again (probe).
DEFAULT_HOLD_S = 30.0
#: The hold doubles each time a probe finds the same limit again, up to this.
DEFAULT_MAX_HOLD_S = 600.0

#: An uncapped gate takes its calls in flight at a first slope throttle as its limit (the
#: herd's); once the slope rule is learned (it holds the rate), a saturated success raises
#: that limit by one, up to this many times the most calls in service that got through at
#: once, a tenth above what is known good: a round trip's growth, and at most a tenth of
#: the slots turned away when it finds them (fewer: a 429 comes back a reject latency
#: after its send, while the limit still climbs one by one). Grown by 1 / limit instead, the morning peak x10 (320
#: slots) stayed near 244 of them to the end (1.86x the oracle). Chosen on the tuning set
#: (seeds 1-5): 1.25 let 0.66-1.01 % of calls see a 429 in the slots 48, latency 1.5 s and
#: growth 1.6 cells (learning the slots by overshooting them); 1.1 kept them at 0.45-0.59 %.
HERD_GROWTH = 1.1
#: How often an attempt that got its slot before a cut lowered the capacity asks again
#: whether a call left (it waits holding the slot; the gate has no event for a leaving
#: call). A reject latency's order (the storm benchmark's median is 50 ms): a call that
#: leaves in between frees the slot for it at most this late.
OVER_LIMIT_POLL_S = 0.01

#: The limit from latency alone (``_limits.latency``): off. Where no slots are published a
#: slow answer is more often a long generation than a queue (docs/policy.md).
DEFAULT_LATENCY = False

#: A burst throttle is answered by learning the provider's slope rule and holding sends to
#: it (``_limits.slope``) instead of cutting the concurrency limit; see docs/policy.md.
DEFAULT_PACE_BURST_RATE = True
#: With the slope known, a pause's probe not turned away within this long has passed the
#: rate check (unless probes were seen turned away more slowly: see :func:`probe_grace`).
PROBE_GRACE_S = 1.0
#: A first burst throttle is checked before anything is cut: one probe goes at once, the
#: others wait; a probe not turned away within this many times the throttle's own answer
#: time has passed (see :func:`check_grace`). Twice, as for the pause's probe: a throttle
#: comes back about as fast as the one before it.
CHECK_GRACE_FACTOR = 2.0
#: The shortest check: an answer time near zero (a provider on the same host) says nothing.
CHECK_MIN_GRACE_S = 0.02
#: How long a check's probe is kept for the call whose throttle started it, before anyone
#: else may probe. That call re-sends at once (its retry skips its own backoff); 20 ms,
#: the shortest check, covers a busy loop's scheduling. A call that does not come back
#: (a Retry-After to sleep) costs the others this long.
PROBE_RESERVE_S = 0.02

# Float products such as 10 * 0.7 land a hair off the integer; never lose a slot to that.
_EPSILON = 1e-9


# --------------------------------------------------------------------------- arithmetic


def lowered_limit(limit: float, *, factor: float, floor: float) -> float:
    """The limit after a burst-rate throttle: ``max(floor, limit * factor)``.

    With the defaults (factor 0.8, floor 1) a limit of 32 goes 32 -> 25.6 -> 20.48 -> ...
    over successive throttles, and never below one slot.
    """
    return max(floor, limit * factor)


def raised_limit(limit: float, *, ceiling: float) -> float:
    """The limit after one successful call: ``min(ceiling, limit + 1 / limit)``.

    ``limit`` successes in a row raise it by about one slot, so recovery from 22 to 32
    takes roughly 270 successful calls; a limit of 0 (closed) stays closed.
    """
    if limit <= 0:
        return limit
    return min(ceiling, limit + 1.0 / limit)


def capacity_for(limit: float, *, floor: int) -> float:
    """The gate capacity for ``limit``: ``max(floor, floor_int(limit))``; infinity stays."""
    if math.isinf(limit):
        return limit
    return max(floor, math.floor(limit + _EPSILON))


def check_grace(answered_s: float | None, *, pause_s: float) -> float:
    """How long the others wait while a first burst throttle's probe goes:
    ``min(pause_s, max(20 ms, 2 x answered_s))``, where ``answered_s`` is how long the
    throttled attempt took to be turned away, or the median 429 of the last minute if
    longer (``None``: unknown, then the pause's probe grace of 1 s). One answer time says
    little: 429s that took 0.3 s at the median came back in 0.1 s and 0.47 s, and the
    held calls went into the spent window when the probe's 429 came after its grace
    (seeds 1-5: 0.59 % of calls with a 429; 0.38 % with the median)."""
    if answered_s is None:
        return min(pause_s, PROBE_GRACE_S)
    return min(pause_s, max(CHECK_MIN_GRACE_S, CHECK_GRACE_FACTOR * answered_s))


def probe_grace(reject_s: float, *, pause_s: float) -> float:
    """How long a probe must go unanswered to count as past the rate check:
    ``min(pause_s, max(1 s, 2 x the slowest burst 429 a probe got))``."""
    return min(pause_s, max(PROBE_GRACE_S, 2.0 * reject_s))


class LimitChange(NamedTuple):
    """What one throttle or success did to the limit (the policy turns it into an event)."""

    old: float
    new: float
    maximum: float
    reason: str  # "burst_rate", "concurrency", "recovered" or "latency"
    pause_s: float


@dataclass(frozen=True)
class AdaptiveStatistics:
    """A consistent snapshot of an :class:`AdaptiveLimit`.

    Attributes:
        gate: the gate's name.
        enabled: whether it reacts to throttles at all.
        limit: the gate capacity it currently applies (``inf`` without a cap).
        max_concurrent_calls: the configured maximum the limit grows back to.
        min_concurrent_calls: the floor it never goes below.
        decrease_factor: the multiplier applied on a throttle.
        pause_s: the default pause after a throttle, in seconds.
        paused_for: seconds left in the current pause (0 if none).
        throttles: throttles that lowered the limit (one per episode).
        stale_throttles: throttles ignored because the attempt was admitted under an
            older limit.
        pace_burst_rate: whether burst throttles teach the slope rule sends are held to
            (instead of cutting the concurrency limit).
        checked_throttles: first burst throttles that were only checked (with pacing: a
            probe went before anything was paused or cut); those its probe confirmed
            count in ``throttles`` too.
        requests_per_minute_estimate: the provider's per-minute request limit as this
            gate's counts at rejection put it (:mod:`anygate._limits.window`); sends are
            held to it. ``None`` until a requests-per-minute 429 teaches one.
        tokens_per_minute_estimate: its twin for tokens: the tokens this gate's sends
            had in the minute before a tokens-per-minute 429, grown back by one request's
            tokens per minute (:mod:`anygate._limits.tokens`); a send waits until the
            trailing minute's tokens plus its own fit. ``None`` until such a 429.
        slope_growth: how much the provider lets the request count grow per window, as
            this gate's counts at the end of full windows put it
            (:mod:`anygate._limits.slope`); sends are held to it. ``None`` until burst
            429s teach one.
        slope_window_s: the window that growth is per (10 s until edges rule it out).
        slope_floor: what a window after a quiet one may hold, as learned (0: not yet).
        latency: whether successes' latencies set the limit (a queueing server,
            :mod:`anygate._limits.latency`).
        latency_limit: the limit those latencies show (``None``: off, or no success
            yet); the gate follows it between the floor and the maximum.
        no_load_latency_s: an unqueued call's latency as learned, in seconds (``None``:
            not yet).
        most_in_service: the most calls at the provider at once that got through: a
            success's count at its send, less the calls whose 429 came back after it
            went (what a plain 429 at a new high is told apart by; 0: none yet).
        probe_slots_returned: slots a caller held back by a burst pause handed to the call
            its probe is kept for, and that went back to the gate unused (that call left,
            or its reservation ran out, before it took the slot): admissions of the gate
            that reached no provider.
    """

    gate: str
    enabled: bool
    limit: float
    max_concurrent_calls: float
    min_concurrent_calls: int
    decrease_factor: float
    pause_s: float
    paused_for: float
    throttles: int
    stale_throttles: int
    pace_burst_rate: bool = False
    checked_throttles: int = 0
    requests_per_minute_estimate: float | None = None
    tokens_per_minute_estimate: float | None = None
    slope_growth: float | None = None
    slope_window_s: float = 10.0
    slope_floor: int = 0
    latency: bool = False
    latency_limit: float | None = None
    no_load_latency_s: float | None = None
    most_in_service: int = 0
    probe_slots_returned: int = 0
