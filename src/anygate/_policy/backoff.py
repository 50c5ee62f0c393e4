"""Pure arithmetic for retries: decorrelated jitter.

Nothing here sleeps, reads a clock or touches global state; callers pass the random source
in, so every result is reproducible in tests and in the simulator. What the provider asks
for (``Retry-After``) is read by :mod:`anygate._classify.retry_after`.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["Uniform", "decorrelated_jitter", "jitter_window"]


class Uniform(Protocol):
    """Anything with ``uniform(a, b)``, such as :class:`random.Random`."""

    def uniform(self, a: float, b: float) -> float: ...


def jitter_window(prev_ms: float | None, *, base_ms: float, cap_ms: float) -> tuple[float, float]:
    """The interval the next decorrelated-jitter delay is drawn from, in milliseconds.

    Formula (AWS "decorrelated jitter", with the window clamped *before* drawing)::

        lo   = min(base, cap)
        prev = lo                        if prev is None (the first retry)
        hi   = min(cap, max(lo, 3 * prev))
        window = [lo, hi]

    Seeding ``prev`` with the reason's *own* base keeps the first window wide: with the
    burst-rate defaults (base 5000 ms, cap 8000 ms) it is [5000, 8000] rather than the
    degenerate [5000, 5000] a fleet would retry on in lockstep. Clamping to the cap before
    drawing spreads delays uniformly instead of piling them on the cap. A base above the
    cap is treated as the cap.

    Args:
        prev_ms: the previous delay of this call, or ``None`` before the first retry.
        base_ms: the smallest delay (>= 0).
        cap_ms: the largest delay (>= 0).

    Returns:
        ``(lo, hi)`` with ``0 <= lo <= hi <= max(cap_ms, 0)``.
    """
    lo = max(0.0, min(float(base_ms), float(cap_ms)))
    prev = lo if prev_ms is None else max(0.0, float(prev_ms))
    hi = min(float(cap_ms), max(lo, 3.0 * prev))
    return lo, max(lo, hi)


def decorrelated_jitter(
    prev_ms: float | None, *, base_ms: float, cap_ms: float, rng: Uniform
) -> float:
    """Draw the next retry delay in milliseconds: ``uniform(*jitter_window(...))``.

    See :func:`jitter_window` for the formula. Defaults used by :class:`anygate.Policy`:
    base 1000 ms (5000 ms for ``burst_rate``), cap 8000 ms.

    Args:
        prev_ms: the previous delay of this call, or ``None`` before the first retry.
        base_ms: the smallest delay.
        cap_ms: the largest delay.
        rng: the random source, e.g. ``random.Random(seed)``.
    """
    lo, hi = jitter_window(prev_ms, base_ms=base_ms, cap_ms=cap_ms)
    if lo == hi:
        return lo
    # Some generators can return b itself; clamp so the contract lo <= d <= hi holds.
    return min(hi, max(lo, rng.uniform(lo, hi)))
