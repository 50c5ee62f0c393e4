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
   (``sending > most_passed``, once one got through). A rate rule turns calls away at
   any concurrency; a slot limit only above the slots, so a new high is the slots'
   evidence. Not while the send rate could have been too steep (``steep``: the slope
   rule not yet learned, and the trailing slope window held more than the one before
   it): while a fleet ramps up its concurrency rises with its rate, and a slope 429 at a
   new high taken for the slots held a 48-slot provider to 30 for two minutes (1.17x the
   oracle). Once learned, the rule holds every send to its allowance, so a new high is
   the slots' again. Nor when a per-minute count is nearer its estimate (both full at
   once: the rate's answer is the one that also slows the concurrency).
2. ``"requests"`` or ``"tokens"``: the per-minute count fullest against its estimate
   (learned, else published), once it reached :data:`NEAR` of it: requests accepted in
   the minute before the send, tokens in the minute up to it (with the send's own). A
   learned request estimate is a fitted threshold (``requests_fitted``): its own count
   must reach it, for below it the request limit's answers call the 429 another's.
3. ``"burst"``: neither: what is left is a rule over a shorter window than a minute, the
   slope rule a burst 429 names (:mod:`anygate._limits.slope` learns it the same way).
   At a new high (only ``steep`` kept it from rule 1) it is a *suspect*: its check's
   probe goes once a call has left, and a pass makes it the slots' after all
   (:mod:`anygate._limits.burst`).

The owner asks once more before a ``"burst"`` is final: the 429s no estimate explained
may fit a threshold of the request count of their own, a request limit below the
published one (:meth:`.RequestLimit.unexplained`, where no slope rule could have sent
them: :meth:`.Sends.sloped`).

A 429 whose code names a per-minute limit but not what it counted (OpenAI's
``rate_limit_exceeded`` without its wording) is only ever requests or tokens: the fuller
of the two. These rules replace the burst pacer, which answered every such 429 by pacing
the request rate to 0.7x what it had measured (issue 30 item 6).

Pure, no state: the owner (:class:`anygate.AdaptiveLimit`) gathers the counts under its
lock.
"""

from __future__ import annotations

from typing import Literal

__all__ = ["NEAR", "Attributed", "attribute"]

Attributed = Literal["concurrency", "requests", "tokens", "burst"]

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
    tokens: float = 0.0,
    tokens_estimate: float | None = None,
    steep: bool = False,
    per_minute: bool = False,
    requests_fitted: bool = False,
) -> Attributed:
    """The limit a plain 429 is taken for (see the module docstring).

    Args:
        sending: calls at the provider when the rejected attempt was sent, itself included.
        most_passed: the most calls at the provider at the send of an attempt that got
            through (0: none yet).
        requests: requests the provider accepted in the minute before the send.
        requests_estimate: the per-minute request limit's estimate (learned, else
            published); ``None``: unknown.
        tokens: tokens the provider accepted in the minute up to the send, its own
            included (0: the attempt was charged none).
        tokens_estimate: the per-minute token limit's estimate; ``None``: unknown (or
            the attempt was charged no tokens: it could not be what ran out).
        steep: a slope rule could have turned the send away (see above).
        per_minute: the answer's code names a per-minute limit: requests or tokens only.
        requests_fitted: ``requests_estimate`` is the threshold the request limit's
            answers fit (:mod:`anygate._limits.threshold`, ``requests`` counted as it
            counts): full only at or above it, not :data:`NEAR` of it.
    """
    by_requests = _fullness(requests, requests_estimate)
    if requests_fitted and by_requests < 1.0:
        # Below a fitted threshold the request limit's own answers call the 429 another
        # limit's: NEAR of a learned 597 a minute took a slope rule's wave at 594-596
        # for the request limit's, each retry sent ahead as a shared pool's into the
        # same full window (hidden RPM 600 with plain 429s, seed 5: 48 429s in 2 s).
        by_requests = 0.0
    by_tokens = _fullness(tokens, tokens_estimate)
    fullest: Attributed = "tokens" if by_tokens > by_requests else "requests"
    fullness = max(by_requests, by_tokens)
    if per_minute:
        return fullest
    if not steep and 0 < most_passed < sending and sending / most_passed >= fullness:
        return "concurrency"
    if fullness >= NEAR:
        return fullest
    return "burst"


def _fullness(count: float, estimate: float | None) -> float:
    return 0.0 if estimate is None or estimate <= 0 else count / estimate
