"""Pure backoff arithmetic: the decorrelated-jitter window and Retry-After parsing."""

from __future__ import annotations

import math
import random
import statistics
from datetime import datetime, timezone
from email.utils import format_datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from anygate._classify.retry_after import parse_retry_after
from anygate._policy.backoff import decorrelated_jitter, jitter_window

NOW = 1_900_000_000.0  # a fixed "wall clock" for HTTP-date tests


def test_first_window_is_seeded_from_the_reasons_own_base() -> None:
    """The first retry's window starts at the reason's base and spans to min(cap, 3*base)."""
    assert jitter_window(None, base_ms=5000, cap_ms=8000) == (5000.0, 8000.0)
    assert jitter_window(None, base_ms=1000, cap_ms=8000) == (1000.0, 3000.0)


def test_window_grows_from_the_previous_delay_and_is_clamped_to_the_cap() -> None:
    """hi = min(cap, max(base, 3 * prev)); a huge previous delay is clamped, never exceeded."""
    assert jitter_window(2000, base_ms=1000, cap_ms=8000) == (1000.0, 6000.0)
    assert jitter_window(100_000, base_ms=1000, cap_ms=8000) == (1000.0, 8000.0)
    assert jitter_window(10, base_ms=1000, cap_ms=8000) == (1000.0, 1000.0)


def test_base_above_cap_means_cap() -> None:
    """A base larger than the cap collapses the window onto the cap."""
    assert jitter_window(None, base_ms=9000, cap_ms=8000) == (8000.0, 8000.0)
    assert decorrelated_jitter(None, base_ms=9000, cap_ms=8000, rng=random.Random(1)) == 8000.0


@pytest.mark.parametrize("seed", [None, 0, 1, 42])
def test_burst_first_retry_is_not_degenerate_with_defaults(seed: int | None) -> None:
    """Ported regression: the first burst-rate retry spreads over [5000, 8000] ms, with a
    real RNG and with seeded ones, instead of always landing on 5000 ms."""
    rng = random.Random(seed)
    draws = [decorrelated_jitter(None, base_ms=5000, cap_ms=8000, rng=rng) for _ in range(2000)]
    assert all(5000 <= d <= 8000 for d in draws)
    assert len(set(draws)) > 1900
    assert min(draws) < 5200
    assert max(draws) > 7800


def test_clamping_before_drawing_spreads_delays_instead_of_piling_on_the_cap() -> None:
    """With a huge previous delay the draw is uniform over [base, cap]: no mass at the cap
    (clamping *after* drawing would put ~95% of draws exactly on the cap)."""
    rng = random.Random(7)
    draws = [decorrelated_jitter(200_000, base_ms=1000, cap_ms=8000, rng=rng) for _ in range(4000)]
    assert sum(d == 8000 for d in draws) == 0
    assert statistics.mean(draws) == pytest.approx(4500, rel=0.05)


def test_a_generator_returning_the_bound_itself_is_clamped() -> None:
    """An rng that overshoots (some return b itself, or worse) cannot leave the window."""

    class Overshoot:
        def uniform(self, a: float, b: float) -> float:
            return b + 1

    assert decorrelated_jitter(None, base_ms=1000, cap_ms=8000, rng=Overshoot()) == 3000.0


@given(
    prev=st.none() | st.floats(min_value=0, max_value=1e9),
    base=st.floats(min_value=0, max_value=1e7),
    cap=st.floats(min_value=0, max_value=1e7),
    seed=st.integers(0, 2**32),
)
def test_every_draw_stays_inside_its_window(
    prev: float | None, base: float, cap: float, seed: int
) -> None:
    """Property: lo <= delay <= hi <= cap, and lo = min(base, cap), for any inputs."""
    lo, hi = jitter_window(prev, base_ms=base, cap_ms=cap)
    assert lo == min(base, cap)
    assert lo <= hi <= max(cap, lo)
    delay = decorrelated_jitter(prev, base_ms=base, cap_ms=cap, rng=random.Random(seed))
    assert lo <= delay <= hi


# --------------------------------------------------------------------------- Retry-After


def test_retry_after_ms_wins_over_retry_after() -> None:
    """retry-after-ms is read first, in milliseconds (the OpenAI/Anthropic order)."""
    headers = {"retry-after-ms": "1500", "retry-after": "9"}
    assert parse_retry_after(headers, now=NOW) == 1.5


def test_fractional_seconds() -> None:
    """retry-after may be fractional seconds."""
    assert parse_retry_after({"Retry-After": "0.25"}, now=NOW) == 0.25
    assert parse_retry_after({"retry-after": " 3 "}, now=NOW) == 3.0


def test_http_date_is_relative_to_now() -> None:
    """An HTTP-date becomes the seconds between it and ``now``; a past date means 0."""
    later = format_datetime(datetime.fromtimestamp(NOW + 42, tz=timezone.utc), usegmt=True)
    earlier = format_datetime(datetime.fromtimestamp(NOW - 42, tz=timezone.utc), usegmt=True)
    assert parse_retry_after({"retry-after": later}, now=NOW) == pytest.approx(42)
    assert parse_retry_after({"retry-after": earlier}, now=NOW) == 0.0


@pytest.mark.parametrize(
    "value", ["soon", "", "-1", "nan", "NaN", "inf", "-inf", "1e999", "Mon, 99 Foo 2026"]
)
def test_garbage_negative_nan_and_infinite_values_are_ignored(value: str) -> None:
    """Values that are not a usable wait give None, so ordinary backoff applies."""
    assert parse_retry_after({"retry-after": value}, now=NOW) is None


def test_broken_retry_after_ms_falls_back_to_retry_after() -> None:
    """A garbage retry-after-ms does not hide a good retry-after."""
    assert parse_retry_after({"retry-after-ms": "nan", "retry-after": "2"}, now=NOW) == 2.0
    assert parse_retry_after({"retry-after-ms": "-5"}, now=NOW) is None


def test_header_containers() -> None:
    """httpx Headers, plain dicts in any case, and lists of (bytes) pairs all work."""
    httpx = pytest.importorskip("httpx")
    assert parse_retry_after(httpx.Headers({"Retry-After": "4"}), now=NOW) == 4.0
    assert parse_retry_after({"RETRY-AFTER-MS": "10"}, now=NOW) == 0.01
    assert parse_retry_after([(b"retry-after", b"5")], now=NOW) == 5.0
    assert parse_retry_after([("Retry-After", "6")], now=NOW) == 6.0
    assert parse_retry_after(None, now=NOW) is None
    assert parse_retry_after({}, now=NOW) is None
    assert parse_retry_after(object(), now=NOW) is None


def test_zero_is_a_valid_wait() -> None:
    """``retry-after: 0`` means retry immediately, not "no header"."""
    result = parse_retry_after({"retry-after": "0"}, now=NOW)
    assert result == 0.0
    assert not math.isnan(result)
