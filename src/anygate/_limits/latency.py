"""A concurrency limit for a queueing server, inferred from latency alone (issue 30 item 5).

Why. A local model server (llama.cpp, Ollama, vLLM without a queue bound) that has more
requests than slots does not refuse them: it queues them and answers slowly. Nothing says
"429"; a client that adds calls only adds waiting time, and a server with a bounded queue
answers "busy" once it is full. The concurrency at which throughput stops rising can be read
off the answers' latency, as Netflix's concurrency-limits does for services (``VegasLimit``,
``Gradient2Limit``).

What. Each successful call is one sample: its latency (send to completion) and the calls
in flight when it was sent, itself included (its *level*). :class:`LatencyLimit` keeps

* per level, the mean latency of the calls sent at it (a running mean, then an exponential
  one, :data:`SMOOTHING`), and when it was last sampled;
* the **no-load latency**: the least of those means (Vegas keeps the least single round
  trip; LLM answers vary too much for that, see :data:`SMOOTHING`);
* the **slots** the server serves at once, by Little's law: at level ``n`` with mean
  latency ``m``, ``n x no_load / m`` calls are being served and the rest wait (Vegas's
  ``queue = limit x (1 - rtt_noload / rtt)``, counted with the calls really in flight rather
  than the limit); the estimate is the most any *recent* level shows (sampled within the
  memory, :data:`PROBE_MULTIPLIER` x limit samples);
* the **limit**: ``max(TOLERANCE x slots, slots + 1)``. Over the slots, so that the server
  never idles between calls and a server that gained slots is found (the level above gets
  sampled); :data:`TOLERANCE` bounds the queueing delay this allows.

Forgetting. A level's mean follows new samples at it (:data:`SMOOTHING`); a level sampled
again after the memory starts afresh. A level not sampled within the memory is dropped if a
recent level lies below it; levels below every recent one are kept: they are the reference
that shows the recent level queued (dropped, as Vegas's periodic reset does, the queued
level would read as unqueued and the limit would creep up 1.5x per memory; measured on a
model server). To refresh that reference, once per memory the limit *probes down* to
``slots / TOLERANCE`` until a call sent at that level answers (BBR's ProbeRTT drains the
queue the same way, for the same reason): a server that got slower or faster is relearned
from it, at the cost of about one round trip at two thirds of the slots per memory.

Not for: providers that refuse load with 429s (their count at rejection says more, see
:mod:`.window`), nor calls whose latency is mostly their own length (long generations):
that is why it is off by default where no slots are published (docs/policy.md). The
premise is that the calls in flight at a send are the queue ahead of it: callers admitted
in one instant that reach the server in another order (trio runs a tick's tasks in random
order) read the last served as the most slots, until the levels the gate then sits at are
sampled.

Pure arithmetic: the caller passes latencies and counts, and holds a lock. Each sample
costs a pass over the levels remembered (the distinct in-flight counts seen recently, a
handful for a local server).
"""

from __future__ import annotations

import math
from typing import final

__all__ = ["PROBE_MULTIPLIER", "SMOOTHING", "TOLERANCE", "LatencyLimit"]

#: Queueing delay tolerated over the no-load latency before the limit stops growing: 1.5x,
#: Netflix ``Gradient2Limit``'s default ``rttTolerance``. On the local-server scenarios
#: (docs/simulate.md) it keeps the server's queue at about half its slots, within a 4-deep
#: queue bound, and no slot idles.
TOLERANCE = 1.5
#: A level's mean becomes exponential after ``1 / SMOOTHING`` samples, with this weight:
#: Gradient2's default ``smoothing`` (0.2), so that a level follows a changed server within
#: about ten samples. A mean, not Vegas's least round trip: LLM answers vary by about 30 %
#: from call to call (the local-server scenarios' sigma 0.3), and the least of 30 such
#: samples is about half the median, which reads every unqueued call as queued.
SMOOTHING = 0.2
#: The memory, in samples per unit of limit: Vegas's ``probeMultiplier`` (30), how often it
#: resets its no-load round trip. Levels older than that stop counting for the slots, and
#: the limit probes down once per memory.
PROBE_MULTIPLIER = 30
#: The memory is at least this many samples (a limit of 1 would otherwise forget the
#: level above within 30 samples, and probe down as often).
_MIN_MEMORY = 60


@final
class LatencyLimit:
    """The latency estimate (see the module docstring); not thread-safe.

    Args:
        ceiling: the limit never exceeds this (``inf``: no cap).
        floor: nor goes below this.
    """

    __slots__ = (
        "_ceiling",
        "_floor",
        "_levels",
        "_limit",
        "_noload",
        "_probe_level",
        "_probed_at",
        "_samples",
        "_slots",
        "_target",
    )

    def __init__(self, *, ceiling: float = math.inf, floor: float = 1.0) -> None:
        self._ceiling = ceiling
        self._floor = floor
        # level -> [mean latency, samples at it, index of its last sample]
        self._levels: dict[int, list[float]] = {}
        self._samples = 0
        self._noload: float | None = None
        self._slots: float | None = None
        self._target: float | None = None  # the limit, not probing
        self._limit: float | None = None
        self._probed_at = 0  # the sample the last probe down ended (or none began) at
        self._probe_level = 0  # > 0 while probing down: the level it waits for

    @property
    def limit(self) -> float | None:
        """The concurrency to allow, between the floor and the ceiling; ``None`` before
        the first sample."""
        return self._limit

    @property
    def slots(self) -> float | None:
        """The calls the server serves at once, as the latencies put it."""
        return self._slots

    @property
    def no_load_latency(self) -> float | None:
        """The latency of an unqueued call, in the caller's time unit."""
        return self._noload

    @property
    def probing(self) -> bool:
        """Whether the limit is probing down (see the module docstring)."""
        return self._probe_level > 0

    def bound(self, *, ceiling: float, floor: float) -> None:
        """New bounds (the gate's maximum or floor changed); applied at the next sample."""
        self._ceiling = ceiling
        self._floor = floor

    def observe(self, latency: float, in_flight: int) -> float | None:
        """One successful call: ``latency`` from its send to its completion, and the calls
        in flight at its send, itself included. Returns the new :attr:`limit`.

        A latency that is not a positive finite number, or a count below 1, is ignored
        (a clock that did not move says nothing)."""
        if not (latency > 0 and math.isfinite(latency)) or in_flight < 1:
            return self._limit
        self._samples += 1
        now = self._samples
        memory = self._memory()
        oldest = now - memory
        levels = self._levels
        level = levels.get(in_flight)
        if level is None or level[2] < oldest:
            levels[in_flight] = [latency, 1.0, float(now)]
        else:
            level[1] += 1
            level[0] += (latency - level[0]) * max(SMOOTHING, 1.0 / level[1])
            level[2] = float(now)
        recent = [n for n, (_, _, seen) in levels.items() if seen >= oldest]
        lowest = min(recent)  # the level just sampled is recent
        for n in [n for n, (_, _, seen) in levels.items() if seen < oldest and n > lowest]:
            del levels[n]
        noload = min(mean for mean, _, _ in levels.values())
        slots = max(n * noload / levels[n][0] for n in recent)
        self._noload = noload
        self._slots = slots
        self._target = self._clamp(max(TOLERANCE * slots, slots + 1))
        if self._probe_level:
            if in_flight <= self._probe_level or now - self._probed_at > memory:
                self._probe_level = 0  # refreshed (or the gate never got that low)
                self._probed_at = now
        elif now - self._probed_at >= memory:
            self._probe_level = max(1, math.floor(self._clamp(slots / TOLERANCE)))
            self._probed_at = now
        self._limit = self._clamp(self._probe_level) if self._probe_level else self._target
        return self._limit

    def _memory(self) -> float:
        target = self._target
        if target is None or math.isinf(target):
            return _MIN_MEMORY
        return max(_MIN_MEMORY, PROBE_MULTIPLIER * target)

    def _clamp(self, value: float) -> float:
        return max(self._floor, min(self._ceiling, value))
