"""What one simulated run measured: per-call records while it runs, frozen results after.

:class:`Recorder` lives inside a run and is written to by the strategies (attempts, backoff,
outcomes) and by policy event hooks; :func:`summarize` turns it and the provider's
:class:`~anygate.sim._provider.Trace` into a frozen :class:`StrategyResult`. Nothing here
reads the wall clock, so equal runs give equal results, field for field.
"""

from __future__ import annotations

import math
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import anyio

from ._provider import KINDS, Trace

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from ._workload import LowerBound

__all__ = [
    "CallRecord",
    "Percentiles",
    "Recorder",
    "RunStats",
    "Series",
    "SimulationResult",
    "StrategyResult",
    "current_call",
    "series",
    "summarize",
]

#: The call the running task is making, for event hooks that do not know it themselves.
current_call: ContextVar[CallRecord | None] = ContextVar("anygate_sim_call", default=None)

_PROGRESS_STEPS = 200


class CallRecord:
    """One logical call as it happens (mutable; frozen into a result at the end)."""

    __slots__ = ("attempts", "end", "got_429", "index", "outcome", "slot_wait", "start")

    def __init__(self, index: int, start: float) -> None:
        self.index = index
        self.start = start
        self.end = math.nan
        self.outcome = ""
        self.attempts = 0
        self.slot_wait = 0.0
        self.got_429 = False


class RunStats:
    """Counters a strategy's hooks may bump during a run (breaker trips, adaptive cuts)."""

    def __init__(self) -> None:
        self.breaker_trips = 0
        self.limit_cuts = 0
        self.lowest_limit: float | None = None


class Recorder(RunStats):
    """Collects call records for one run; calls ``progress(done)`` every so often.

    Args:
        total: calls the workload holds.
        progress: called with the number of finished calls, about 200 times per run.
        call_deadline_s: the deadline strategies give each call (``None``: none).
    """

    def __init__(
        self,
        total: int,
        progress: Callable[[int], None] | None = None,
        *,
        call_deadline_s: float | None = None,
    ) -> None:
        super().__init__()
        self.total = total
        self.call_deadline_s = call_deadline_s
        self.records: list[CallRecord] = []
        self.done = 0
        self.not_run = 0  # calls of chains that stopped after a failure
        self._progress = progress
        self._step = max(1, total // _PROGRESS_STEPS)

    def begin(self, index: int) -> CallRecord:
        """A call starts now; it becomes the task's :data:`current_call`."""
        record = CallRecord(index, anyio.current_time())
        self.records.append(record)
        current_call.set(record)
        return record

    def finish(self, record: CallRecord, outcome: str) -> None:
        """The call ended: ``"ok"``, or why it failed (``"gave_up"``, ``"circuit_open"``, ...)."""
        record.end = anyio.current_time()
        record.outcome = outcome
        current_call.set(None)
        self.done += 1
        if self._progress is not None and (self.done % self._step == 0 or self.done == self.total):
            self._progress(self.done)


@dataclass(frozen=True)
class Percentiles:
    """p50 / p95 / p99 in seconds (nearest-rank; 0 when there is nothing to rank)."""

    p50: float
    p95: float
    p99: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Percentiles:
        """Nearest-rank percentiles of ``values``."""
        ordered = sorted(values)
        if not ordered:
            return cls(0.0, 0.0, 0.0)

        def rank(p: float) -> float:
            return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]

        return cls(rank(50), rank(95), rank(99))


@dataclass(frozen=True)
class StrategyResult:
    """Everything one strategy's run measured; equal seeds give equal results.

    Attributes:
        name: the strategy.
        summary: one line saying what the strategy does (cap, retries, breaker).
        makespan_s: virtual time at which the last call ended, lost or not (the time
            limit, when calls were still unfinished).
        ratio: ``makespan_s`` / the lower bound; ``None`` when calls were lost (less work
            done: a ratio would flatter it).
        calls: logical calls in the workload.
        ok: calls that succeeded.
        failures: lost calls by cause (``gave_up``, ``circuit_open``, ``busy``,
            ``deadline``, ``not_run`` for calls of a chain that stopped after a failure,
            ``unfinished`` when the time limit stopped them, or a client's own cause).
        responses: provider responses by outcome: ``ok`` and every rejection kind.
        calls_with_429: calls that received at least one 429.
        attempts: requests sent to the provider.
        retries: attempts beyond each call's first.
        breaker_trips: times a circuit breaker opened.
        max_concurrency: the most requests the provider served at once.
        latency: call latency (start to end, retries and waits included), ok calls.
        slot_wait: time each call spent waiting for a client-side slot, all attempts.
        in_service: the provider's ``(time, requests in service)`` steps.
        rejects: ``(time, kind)`` of every rejection.
        limit_cuts: times the adaptive concurrency limit was lowered after a burst-rate
            throttle.
        lowest_limit: the lowest capacity it went to (``None``: never lowered).
        oracle_ratio: ``makespan_s`` / the oracle's makespan on the same workload
            (``None`` when calls were lost, or when no oracle ran).
        bound_ratio: ``makespan_s`` / the lower bound even when calls were lost (for the
            record; reports show ``ratio``).
        tokens_per_s: prompt plus completion tokens served / ``makespan_s`` (``None``
            when the calls carry no tokens).
    """

    name: str
    summary: str
    makespan_s: float
    ratio: float | None
    calls: int
    ok: int
    failures: Mapping[str, int]
    responses: Mapping[str, int]
    calls_with_429: int
    attempts: int
    retries: int
    breaker_trips: int
    max_concurrency: int
    latency: Percentiles
    slot_wait: Percentiles
    in_service: tuple[tuple[float, int], ...] = field(repr=False)
    rejects: tuple[tuple[float, str], ...] = field(repr=False)
    limit_cuts: int = 0
    lowest_limit: float | None = None
    oracle_ratio: float | None = None
    bound_ratio: float = math.nan
    tokens_per_s: float | None = None

    @property
    def failed(self) -> int:
        """Calls that did not succeed."""
        return self.calls - self.ok

    @property
    def rate_429(self) -> float:
        """Fraction of calls that received at least one 429."""
        return self.calls_with_429 / self.calls if self.calls else 0.0

    @property
    def count_429(self) -> int:
        """429 responses, every kind."""
        kinds = ("burst", "rpm", "tpm", "itpm", "otpm", "concurrency")
        return sum(self.responses.get(kind, 0) for kind in kinds)

    @property
    def count_503(self) -> int:
        """503 responses (outage, full queue), and Anthropic's 529 overloads."""
        return sum(self.responses.get(kind, 0) for kind in ("overloaded", "queue_full"))

    def to_dict(self, *, horizon: float, buckets: int = 120) -> dict[str, Any]:
        """A JSON-ready mapping, with the time series bucketed over ``[0, horizon)``."""
        data = asdict(self)
        del data["in_service"], data["rejects"]
        data.update(
            failed=self.failed,
            lost=dict(self.failures),
            rate_429=self.rate_429,
            series=asdict(series(self, horizon=horizon, buckets=buckets)),
        )
        return data


@dataclass(frozen=True)
class SimulationResult:
    """One run of a scenario: the bound and every strategy's result, in order."""

    scenario: str
    seed: int
    calls: int
    bound: LowerBound
    strategies: tuple[StrategyResult, ...]
    oracle_makespan_s: float | None = None

    @property
    def horizon(self) -> float:
        """The longest makespan, the common time axis of charts."""
        return max((s.makespan_s for s in self.strategies), default=0.0) or 1.0

    def to_dict(self, *, buckets: int = 120) -> dict[str, Any]:
        """A JSON-ready mapping of the whole run."""
        return {
            "scenario": self.scenario,
            "seed": self.seed,
            "calls": self.calls,
            "lower_bound": asdict(self.bound),
            "oracle_makespan_s": self.oracle_makespan_s,
            "strategies": [
                s.to_dict(horizon=self.horizon, buckets=buckets) for s in self.strategies
            ],
        }


@dataclass(frozen=True)
class Series:
    """A run bucketed in time: mean requests in service and rejections per bucket."""

    bucket_s: float
    in_flight: tuple[float, ...]
    rejected_429: tuple[int, ...]
    rejected_503: tuple[int, ...]


def series(result: StrategyResult, *, horizon: float, buckets: int) -> Series:
    """Bucket ``result`` over ``[0, horizon)``: time-weighted mean in service, rejection counts."""
    width = horizon / buckets
    area = [0.0] * buckets
    steps = result.in_service
    for (start, level), (end, _) in zip(steps, (*steps[1:], (horizon, 0)), strict=True):
        # Spread the constant level over the buckets [start, end) overlaps.
        t = start
        while t < end and level:
            index = min(int(t / width), buckets - 1)
            edge = min(end, (index + 1) * width)
            if edge <= t:  # float edge case at the end of the horizon
                break
            area[index] += level * (edge - t)
            t = edge
    r429 = [0] * buckets
    r503 = [0] * buckets
    for when, kind in result.rejects:
        index = min(int(when / width), buckets - 1)
        if kind in ("overloaded", "queue_full"):
            r503[index] += 1
        else:
            r429[index] += 1
    return Series(
        bucket_s=width,
        in_flight=tuple(a / width for a in area),
        rejected_429=tuple(r429),
        rejected_503=tuple(r503),
    )


def summarize(
    name: str,
    summary: str,
    recorder: Recorder,
    trace: Trace,
    bound: LowerBound,
    *,
    run_end: float | None = None,
) -> StrategyResult:
    """Freeze one run's records into a :class:`StrategyResult`.

    ``run_end`` is when the run stopped; it is the makespan when calls were unfinished.
    """
    records = recorder.records
    finished = [r for r in records if r.outcome]
    makespan = max((r.end for r in finished), default=0.0)
    failures: dict[str, int] = {}
    for record in records:
        if record.outcome != "ok":
            reason = record.outcome or "unfinished"
            failures[reason] = failures.get(reason, 0) + 1
    if recorder.not_run:
        failures["not_run"] = recorder.not_run
    # Calls the time limit stopped before they began.
    missing = recorder.total - len(records) - recorder.not_run
    if missing:
        failures["unfinished"] = failures.get("unfinished", 0) + missing
    if failures.get("unfinished") and run_end is not None:
        makespan = max(makespan, run_end)
    raw = makespan / bound.seconds if bound.seconds > 0 else math.inf
    attempts = sum(r.attempts for r in records)
    return StrategyResult(
        name=name,
        summary=summary,
        makespan_s=makespan,
        ratio=None if failures else raw,
        calls=recorder.total,
        ok=sum(1 for r in records if r.outcome == "ok"),
        failures=dict(sorted(failures.items())),
        responses={kind: trace.counts[kind] for kind in ("ok", *KINDS)},
        calls_with_429=sum(1 for r in records if r.got_429),
        attempts=attempts,
        retries=sum(max(0, r.attempts - 1) for r in records),
        breaker_trips=recorder.breaker_trips,
        max_concurrency=trace.max_in_service,
        latency=Percentiles.of([r.end - r.start for r in finished if r.outcome == "ok"]),
        slot_wait=Percentiles.of([r.slot_wait for r in records]),
        in_service=tuple(trace.in_service),
        rejects=tuple(trace.rejects),
        limit_cuts=recorder.limit_cuts,
        lowest_limit=recorder.lowest_limit,
        bound_ratio=raw,
        tokens_per_s=trace.tokens / makespan if trace.tokens and makespan > 0 else None,
    )
