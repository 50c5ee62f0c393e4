"""The provider model: what the provider's limits are, inferred from what it says.

A room of its own between the gate (which admits) and the policy (which runs one call's
attempts), as Netflix concurrency-limits keeps its ``Limit`` algorithms apart from the
limiters that apply them. The policy feeds it each answer; the gate reads its estimates.
Two kinds of module:

**Estimates**, one small class per limit kind: pure arithmetic over counts and times, an
outcome in and an estimate out, nothing of locks, clocks, gates or events.

* :mod:`.concurrency`: the provider's slots, from concurrency 429s and what got through.
* :mod:`.window`: a per-window count limit from the client's own count at rejection time.
* :mod:`.requests`, :mod:`.tokens`: the per-minute request and token estimates on it.
* :mod:`.slope`: the slope rule (growth, floor, window) read off the send log at each
  full window's edge.
* :mod:`.release`: the doubling waves a throttled herd is released in (issue 26).
* :mod:`.pace`: the gate's request rate over send instants, once a 429 showed the
  provider counts a second.
* :mod:`.sends`: the windows a send is held to (slope, release, tokens, requests, pace) behind
  one interface, :class:`~.sends.SendLimit`.
* :mod:`.latency`: a queueing server's slots from latency alone, Vegas-style (off by
  default).
* :mod:`.attribute`: which limit a 429 that names none was taken for.
* :mod:`.share`: what a shared bucket leaves this client, from its reports over time.

**Owners**, which apply the estimates to a gate under a lock, on an injectable clock:

* :mod:`.adaptive`: :class:`anygate.AdaptiveLimit`, one per gate, in four classes over one
  set of fields: :mod:`.state` (the fields, writing the gate), :mod:`.sending` (the send
  path), :mod:`.burst` (the burst answer, with the pause of :mod:`.pause`) and
  :mod:`.adaptive` (the public reactions and settings).
* :mod:`.learn`: :class:`anygate.RateLearner`, a gate's ``Rate`` from the provider's
  rate-limit headers (the provider's own numbers replace the estimates); what it has
  learned, :class:`anygate.LearnedLimits`, is the record of :mod:`.learned_limits`.

May import: configuration, classification, the gate and the foundations; never the policy
(import-linter checks it).
"""
