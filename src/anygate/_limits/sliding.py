"""Reading a report of a sliding token window, for :mod:`anygate._limits.learn`.

Why. Azure counts a deployment's tokens over a sliding minute: each request's estimate
counts until a minute after it, and a drained window empties entry by entry, not all at
its reset. Read as a refilled bucket, such a window was paced wrongly (see below); the
gate keeps a copy of it instead (``Budgets`` with ``window``: ``_gate/window.py``),
synced from every report, at the whole limit, with no share measure and no lift (the
window admits what is left of it at once).

What. :func:`sliding`: whether a report shows such a window; :func:`window_left`: what
the gate's copy has left, given what the provider says is left.

Not for: pacing or syncing (the learner's and the budgets').
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .._classify.headers import ReportedLimit
    from .._gate.rate import Rate

__all__ = ["sliding", "window_left"]

# A token kind whose reports show a sliding window, not a refilled bucket, is paced by the
# gate's own copy of the window (``Budgets`` with ``window``: ``_gate/window.py``), synced
# from every report, at the whole limit, with no share measure and no lift (the
# window admits what is left of it at once). Shown by a report with at least
# ``WINDOW_LEFT`` of the limit left yet a reset at least ``WINDOW_RESET`` of the window
# away. A bucket refills its used part by the reset (OpenAI: reset = "time until the
# limit resets to its initial state"), so it looks so only if it refills at under
# ``(1 - WINDOW_LEFT) / WINDOW_RESET`` of its limit's rate; a sliding window empties
# only a window after its newest entry whatever is left (Azure; stuartleeks/
# aoai-simulated-api). At half left (the first choice) a bucket with 55 % background load
# (refilled at 45 % of its limit: half full, it resets in 67 s) was taken for a window
# and, synced as one, got 6.2 % of calls a 429 (TOKEN_TUNING seeds 1-5); at three
# quarters it takes 72 % background load to look so, and the Azure-rule cells' first
# reports (over 90 % left, resets 55-59 s) still show their windows. Before the window
# model, the Azure-rule cells kept a 10 % headroom here and were measured by the share
# meter reading their own pace of a window ago: ~83 % of the limit, 1.185x / 1.212x the
# oracle (seeds 1-5), with no headroom alone 1.11x / 1.07x with 0.5-0.7 % 429s.
WINDOW_RESET = 0.9
WINDOW_LEFT = 0.75


def sliding(dim: ReportedLimit) -> bool:
    """Whether ``dim`` shows a sliding window: ``WINDOW_LEFT`` of its limit left, yet a
    reset ``WINDOW_RESET`` of a window away or more (see the comment above them)."""
    limit, left, reset, window = dim.limit, dim.remaining, dim.reset_s, dim.window_s
    if limit is None or left is None or reset is None or window is None:
        return False
    return left >= WINDOW_LEFT * limit and reset >= WINDOW_RESET * window


def window_left(left: float, dim: ReportedLimit | None, rate: Rate | None) -> float:
    """What the gate's copy of a sliding window has left, given the provider's ``left``:
    the provider counted ``limit - left`` (ours and others'), and the copy holds the
    gate's own rate. Left as the provider's ``left``, a copy at another rate counted the
    difference as others' spending for a minute: a hidden 100,000 TPM behind a published
    200,000 (Azure's rule) saw its first report, before the limit was adopted, charge
    100,000 of phantom use and the fleet sat out the first minute (seeds 1-5: 1.050x the
    oracle)."""
    per_minute = None if dim is None else dim.per_minute
    paced = None if rate is None else rate.tokens_per_minute
    if per_minute is None or paced is None:
        return left
    return left + paced - per_minute
