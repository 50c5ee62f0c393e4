"""The sliding token window (``_gate.window.TokenWindow``) as pure arithmetic.

What Azure OpenAI counts: each charge from its admission until a window later. The gate's
copy admits whatever fits, learns what others spent from ``remaining`` (a phantom entry),
and gives nothing back on a refund of a settle (``Budgets``), only for an admission given
back whole.
"""

from __future__ import annotations

import math

import pytest

from anygate import Rate
from anygate._gate.budgets import Budgets
from anygate._gate.window import TokenWindow


def test_a_window_admits_what_fits_and_waits_for_the_oldest_entries_to_expire() -> None:
    """60,000 a minute: 50,000 go at once; 20,000 more wait until the first 10,000 of
    them expire (at 60 s), not a refill's 10 s; a cost above the capacity waits for an
    empty window."""
    window = TokenWindow(60_000)
    assert window.at(0.0, 50_000) == 0.0
    window.add(0.0, 10_000, 10_000)
    window.add(5.0, 50_000, 40_000)
    assert window.left(5.0) == pytest.approx(10_000)
    assert window.at(5.0, 10_000) == 5.0
    assert window.at(5.0, 20_000) == 60.0
    assert window.at(5.0, 60_001) == 65.0  # the newest entry's expiry: empty then
    assert window.left(60.0) == pytest.approx(20_000)
    assert window.left(65.0) == pytest.approx(60_000)
    assert window.at(70.0, 1) == 70.0


def test_a_hold_delays_every_admission() -> None:
    """A drained report's hold: nothing before it, even with the window empty."""
    window = TokenWindow(60_000)
    window.hold = 30.0
    assert window.at(0.0, 1) == 30.0
    assert window.at(31.0, 1) == 31.0


def test_sync_adds_what_others_spent_as_a_phantom_until_a_window_after_the_send() -> None:
    """The provider had 20,000 left when the request of the mark (seq 30,000: our
    entries charged by then) was counted, and we had 30,000 in the window: others spent
    10,000. It expires a window after the send (70 s), the latest it can. Our entry
    charged after the mark (seq 35,000) is not in the report's count. A report that says
    no more than we know changes nothing."""
    window = TokenWindow(60_000)
    window.add(0.0, 30_000, 30_000)
    window.add(10.0, 35_000, 5_000)
    assert window.sync(12.0, 10.0, 30_000, 20_000)
    assert window.left(12.0) == pytest.approx(15_000)
    assert not window.sync(13.0, 10.0, 30_000, 20_000)  # counted now: nothing new
    assert not window.sync(13.0, 10.0, 35_000, 40_000)  # more left than we know: no raise
    assert window.left(60.0) == pytest.approx(45_000)  # our 30,000 expired
    assert window.left(69.0) == pytest.approx(45_000)
    assert window.left(70.0) == pytest.approx(60_000)  # the phantom and ours of 10 s
    assert not window.sync(80.0, 10.0, 35_000, 0)  # every entry it counted has expired


def test_history_keeps_a_late_report_exact() -> None:
    """An entry expired by now still counts for a report sent while it was live: the
    report says nothing new about it."""
    window = TokenWindow(60_000)
    window.add(0.0, 10_000, 10_000)
    window.add(30.0, 20_000, 10_000)
    assert window.left(61.0) == pytest.approx(50_000)
    # Sent at 40 s: both of ours counted (20,000), 40,000 left: nobody else spent.
    assert not window.sync(61.0, 40.0, 20_000, 40_000)
    assert window.left(61.0) == pytest.approx(50_000)
    window.left(200.0)  # history a window past expiry is dropped
    assert not window._entries


def test_give_back_removes_the_newest_charges() -> None:
    """An admission given back whole (its waiter left) leaves the window: the newest
    entries first, a part of one if need be."""
    window = TokenWindow(60_000)
    window.add(0.0, 10_000, 10_000)
    window.add(1.0, 15_000, 5_000)
    window.give_back(7_000)
    assert window.left(2.0) == pytest.approx(52_000)
    assert window.at(2.0, 52_000) == 2.0
    assert window.at(2.0, 60_000) == 60.0
    window.give_back(math.inf)
    assert window.left(2.0) == pytest.approx(60_000)


def test_entries_out_of_order_are_kept_sorted() -> None:
    """A settle's charge at ``now`` may follow a later admission's (the ledger passes its
    own ``at``): the window stays sorted by expiry, so ``at`` walks the oldest first."""
    window = TokenWindow(60_000)
    window.add(5.0, 10_000, 10_000)
    window.add(2.0, 60_000, 50_000)
    assert window.left(62.0) == pytest.approx(50_000)
    assert window.at(62.0, 60_000) == 65.0
    assert "10000/60000" in repr(window)


def test_budgets_pace_tokens_by_the_window_once_a_report_shows_one() -> None:
    """``Budgets.lower_since(window=True)`` swaps the GCRA token budget for the window: a
    head call waits for expiry, one behind others counts their tokens while both fit the
    window (ours alone beyond: still a lower bound), a settle's refund gives nothing back,
    a further charge counts, and an admission given back whole leaves."""
    budgets = Budgets(Rate(tokens_per_minute=60_000), 0.0)
    assert budgets.tokens_left(0.0) == pytest.approx(0)  # a GCRA budget starts empty
    assert budgets.lower_since(0.0, budgets.mark(0.0), None, 60_000.0, window=True)
    assert budgets.tokens_left(0.0) == pytest.approx(60_000)
    budgets.take(0.0, 10_000)
    budgets.take(5.0, 40_000)
    assert budgets.when(5.0, 20_000) == 60.0
    assert budgets.when(5.0, 20_000, ahead=1, ahead_tokens=5_000) == 65.0
    assert budgets.when(5.0, 20_000, ahead=1, ahead_tokens=50_000) == 60.0
    budgets.settle(-5_000, None)
    assert budgets.tokens_left(5.0) == pytest.approx(10_000)
    budgets.settle(1_000, 5.0)
    assert budgets.tokens_left(5.0) == pytest.approx(9_000)
    budgets.refund(1, 1_000)
    assert budgets.tokens_left(5.0) == pytest.approx(10_000)
    assert budgets.try_take(5.0, 10_000)
    assert not budgets.try_take(5.0, 1)
