"""The provider model: what the provider's limits are, inferred from what it says.

A room of its own between the gate (which admits) and the policy (which reacts to each
answer), as Netflix concurrency-limits keeps its ``Limit`` algorithms apart from the
limiters that apply them: each class here is pure arithmetic over counts and times, takes
outcomes and returns an estimate, and knows nothing of locks, clocks, gates or events. The
policy feeds them (under its adaptive limit's lock) and sets the gate from their estimates.

* :mod:`.window`: a per-window count limit (requests per minute) from the client's own
  count at rejection time (issue 30).
* :mod:`.tokens`: its twin for tokens per minute (a send's tokens, not its count).
* :mod:`.requests`, :mod:`.slope`: the request-rate estimate and the slope rule (growth,
  floor, window) read off the send log at each rejection and each full window's edge.
* :mod:`.release`: the doubling waves a throttled herd is released in (issue 26).
* :mod:`.latency`: a queueing server's slots from latency alone, Vegas-style (issue 30
  item 5; off by default).
"""
