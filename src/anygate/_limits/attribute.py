"""Which limit a plain 429 hit: the one whose count was nearest its estimate (issue 30).

Why. A provider may answer every limit with the same bare ``429 Too Many Requests`` (no
code, no wording, no headers). Treated as a per-minute 429 that does not say what it
counted, each one paced the request rate; but in the storm simulator's morning peak most
plain 429s are the provider's 32 slots, which no rate pacing bounds: 23 % of calls got a
429 where a worded answer cost 0.4 %. The client's own counts at the rejected send say
which limit was full far better than its wording-free answer does.

What. :func:`attribute` takes the counts at the rejected attempt's send and each limit's
estimate, and names the limit the 429 is taken for:

1. ``"concurrency"``: more calls were at the provider than ever got through at once
   (``sending > most_passed``, once one got through). A rate rule turns calls away at any concurrency; a slot
   limit only above the slots, so a new high is the slots' evidence. Not while the send
   rate could have been too steep (``steep``: the slope rule not yet learned, and the
   trailing slope window held more than the one before it): while a fleet ramps up its
   concurrency rises with its rate, and a slope 429 at a new high taken for the slots
   held a 48-slot provider to 30 for two minutes (1.17x the oracle). Once learned, the
   rule holds every send to its allowance, so a new high is the slots' again. Nor when the requests of the last minute are nearer their estimate
   (both full at once: the rate's answer is the one that also slows the concurrency).
2. ``"requests"``: the requests accepted in the minute before the send reached
   :data:`NEAR` of the per-minute estimate (learned, or else published).
3. ``"burst"``: neither, and no token budget is counted: what is left is a rule over a
   shorter window than a minute, the slope rule a burst 429 names
   (:mod:`anygate._limits.slope` learns it the same way).
4. ``None``: neither, but tokens are counted too (a token budget's 429 without wording
   says nothing our counts can tell from a short window's): the caller keeps its answer
   for a per-minute 429 that does not say what it counted.

Pure, no state: the owner (:class:`anygate.AdaptiveLimit`) gathers the counts under its
lock.
"""

from __future__ import annotations

from typing import Literal

__all__ = ["NEAR", "Attributed", "attribute"]

Attributed = Literal["concurrency", "requests", "burst"]

#: How near its estimate a per-minute count must be for a plain 429 to be taken for it:
#: a round value below 1, because the provider's minute and ours do not line up (a sliding
#: window against our log's) and accepted answers still in flight are not yet counted.
NEAR = 0.9


def attribute(
    *,
    sending: int,
    most_passed: int,
    requests: int,
    requests_estimate: float | None,
    steep: bool,
    tokens_counted: bool,
) -> Attributed | None:
    """The limit a plain 429 is taken for (see the module docstring), or ``None``.

    Args:
        sending: calls at the provider when the rejected attempt was sent, itself included.
        most_passed: the most calls at the provider at the send of an attempt that got
            through (0: none yet).
        requests: requests the provider accepted in the minute before the send.
        requests_estimate: the per-minute request limit's estimate (learned, else
            published); ``None``: unknown.
        steep: a slope rule could have turned the send away (see above).
        tokens_counted: the gate has a token budget (tokens could be what ran out).
    """
    fullness = 0.0
    if requests_estimate is not None and requests_estimate > 0:
        fullness = requests / requests_estimate
    if not steep and 0 < most_passed < sending and sending / most_passed >= fullness:
        return "concurrency"
    if fullness >= NEAR:
        return "requests"
    return None if tokens_counted else "burst"
