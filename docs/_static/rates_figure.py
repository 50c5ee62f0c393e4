"""Draw docs/_static/rates-ramp.png: admissions per window for a fleet starting at once.

    PYTHONPATH=src python docs/_static/rates_figure.py

Runs the real :class:`anygate.Gate` on a trio ``MockClock`` (the gate's clock injected as
``anyio.current_time``): 2000 callers arrive at t = 0 on a gate with 1200 requests per
minute, once without and once with ``ramp=2.0`` (window 10 s, default floor of 10), then
again 5 minutes later after an idle pause. Each call holds its slot for 2 s of virtual time.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import anyio
import trio.testing

from anygate import Gate, Rate

WINDOW = 10.0
FLEET = 2000
IDLE_S = 300.0


async def _run(rate: Rate) -> list[float]:
    gate = Gate(256, name="fleet", rate=rate, clock=anyio.current_time)
    start = anyio.current_time()
    times: list[float] = []

    async def call() -> None:
        async with gate.acquire():
            times.append(anyio.current_time() - start)
            await anyio.sleep(2)

    for wave in range(2):
        async with anyio.create_task_group() as tg:
            for _ in range(FLEET // 2):
                tg.start_soon(call)
        if wave == 0:
            await anyio.sleep(IDLE_S)
    return times


def admissions(rate: Rate) -> list[float]:
    """Admission times (seconds from the start) of the two waves."""
    clock = trio.testing.MockClock(autojump_threshold=0)
    out: list[float] = anyio.run(_run, rate, backend="trio", backend_options={"clock": clock})
    return out


def per_window(times: list[float]) -> tuple[list[float], list[int]]:
    counts = Counter(int(round(t, 6) // WINDOW) for t in times)
    last = max(counts)
    xs = [w * WINDOW for w in range(last + 1)]
    return xs, [counts.get(w, 0) for w in range(last + 1)]


def main(out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    flat = admissions(Rate(requests_per_minute=1200))
    ramped = admissions(Rate(requests_per_minute=1200, ramp=2.0, window_s=WINDOW))
    fig, ax = plt.subplots(figsize=(9, 4), dpi=110)
    for times, label, style in (
        (flat, "requests_per_minute=1200", "-"),
        (ramped, "requests_per_minute=1200, ramp=2.0", "--"),
    ):
        xs, ys = per_window(times)
        ax.step(xs, ys, where="post", linestyle=style, label=label)
    ax.axhline(1200 * WINDOW / 60, color="grey", linewidth=0.8, linestyle=":")
    ax.text(0, 1200 * WINDOW / 60 + 4, "rate x window (200)", color="grey", fontsize=8)
    ax.set_xlabel("seconds since the first wave (second wave after 5 idle minutes)")
    ax.set_ylabel(f"admissions per {WINDOW:g} s window")
    ax.set_title(
        f"{FLEET // 2} callers starting at once, twice: budget alone vs with a slope bound"
    )
    ax.legend(loc="center right")
    fig.tight_layout()
    fig.savefig(out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("rates-ramp.png"))
