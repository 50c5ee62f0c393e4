"""The adaptive limit's send path: what every attempt asks before it goes, and tells after.

Why. Between getting its slot and reaching the provider an attempt may have to wait: a
window the provider counts is full (:mod:`.sends`), or it got its slot just before a cut
and the others already fill the new limit. And every answer feeds the estimates back:
a pass bounds them from below, a 429 of any kind says a send filled no window, one that
names a per-minute limit teaches its estimate, and one that names none is attributed
(:mod:`.attribute`).

What. :class:`SendPath`, the methods of :class:`~anygate._limits.adaptive.AdaptiveLimit`
for that path: :meth:`~SendPath.reserve_send` (with the held set, :meth:`~SendPath.unhold`
and :meth:`~SendPath.sending`), :meth:`~SendPath.passed`, :meth:`~SendPath.rejected`,
:meth:`~SendPath.turned_away`, :meth:`~SendPath.accepted`, :meth:`~SendPath.disown` (a
call's end), :meth:`~SendPath.on_rate` and :meth:`~SendPath.attribute`; a pass and a
per-minute 429 step the published probes (:mod:`.probing`). Each takes the limit's lock
for a few assignments, or none when there is nothing to do.
"""

from __future__ import annotations

from typing import Literal

from .._config.limit_values import (
    OVER_LIMIT_POLL_S,
)
from .._gate.waiters import ki_protected
from .._validation import check_number
from .attribute import Attributed, attribute
from .probing import PublishedSteps
from .threshold import MEMORY_S

__all__ = ["SendPath"]

#: Acceptance marks kept before the stale ones are swept: a call ends by ``disown``,
#: which drops its mark, so more than this many means calls that ended elsewhere (an
#: ``accepted()`` after its call was over); a mark older than the threshold's memory
#: marks no answer it still keeps.
_MARKS = 1024


class SendPath(PublishedSteps):
    """The send path of :class:`~anygate._limits.adaptive.AdaptiveLimit` (see the module
    docstring). Not for use on its own."""

    __slots__ = ()

    @ki_protected
    def reserve_send(
        self, at: float, caller: object | None = None, tokens: int | None = None
    ) -> float:
        """An attempt on the gate (charged ``tokens``) would be sent at ``at`` (this
        limit's clock): ``0.0`` and it is counted, or the seconds to wait, holding the
        slot, until the per-minute estimates' windows have room
        (:meth:`anygate._limits.sends.Sends.wait`), or until a call leaves when it got its
        slot just before a cut (:meth:`_over_limit`)."""
        if not (self._enabled and self._pace):
            if self._held:  # unlocked: a stale read is checked again under the lock
                self.unhold(caller)
            return 0.0
        with self._lock:
            cost = tokens or 0
            held = self._held
            sends = self._sends
            gate = self._gate()
            rate = None if gate is None else gate.rate
            if rate is not sends.pace.rate:
                sends.pace.follow(rate, at)
            wait = sends.wait(at, cost, caller, len(held))
            if wait <= 0 and caller is not None and self._over_limit(caller):
                wait = OVER_LIMIT_POLL_S
            if wait <= 0:
                sends.sent(at, cost, caller)
                if caller is not None:
                    self._pause.went(caller, at)
                    out = self._out
                    out.pop(caller, None)  # an earlier attempt's, unanswered
                    self._sent += 1
                    out[caller] = (self._sent, len(out) + 1, False)
            if caller is not None:
                if wait > 0:
                    held.add(caller)
                else:
                    held.discard(caller)
            return wait

    def _over_limit(self, caller: object) -> bool:
        """Whether ``caller`` waits, holding its slot, because the others at the provider
        fill the limit the throttles taught (the latency ceiling has its own pace): it got
        its slot before a cut lowered it (a concurrency 429 while it was being admitted).
        Sent, it was the next 429: one more per probe upward (33 in flight against 32
        slots, twice per probe in the morning peak)."""
        gate = self._gate()
        if gate is None:
            return False
        # A capacity set by another hand since (a fleet's local gate starts at 0 and its
        # agent grants the leases): theirs is the maximum. Not adopted here, a policy made
        # before the first lease kept its limit at 0 and held its first call forever.
        self._adopt_external_resize()
        held = self._held
        others = gate.in_flight - len(held) - (0 if caller in held else 1)
        # Above the maximum by a published slot count's latencies: the gate's own limit.
        return self._slots.over(others) and others >= self._applied

    def _answered(self, caller: object | None, *, taken: bool) -> None:
        """``caller``'s send was answered: counted if it is one of the send pace's test
        burst (:meth:`anygate._limits.pace.SendPace.answered`). Under the lock."""
        if caller is not None and self._sends.pace.testing:
            self._sends.pace.answered(caller, taken=taken)

    def _test_answer(self, caller: object | None) -> None:
        """:meth:`_answered` for a send the provider took, from an unlocked path: the
        lock only while a test is out (a stale read is checked again under it)."""
        if caller is not None and self._sends.pace.testing:
            with self._lock:
                self._answered(caller, taken=True)

    def unhold(self, caller: object | None) -> None:
        """``caller``'s attempt left a hold without sending (cancelled, refused), or
        ended otherwise unanswered: neither held nor at the provider."""
        if caller is not None and (caller in self._held or caller in self._out):
            with self._lock:
                self._held.discard(caller)
                self._out.pop(caller, None)

    @ki_protected
    def disown(self, caller: object) -> None:
        """``caller``'s call has ended: a probe kept for its retry goes to the next to ask
        at once (a transport's 429 handed back, a call out of attempts), not after
        ``PROBE_RESERVE_S``; an attempt it sent that no answer told of (a transport
        error) is no longer at the provider. Cheap when it holds none (every call ends
        here)."""
        pause = self._pause
        # Unlocked: a stale read only keeps the 20 ms wait (or a finished call's mark).
        if (
            pause.owner is not caller
            and not self._ahead
            and caller not in self._accepted
            and caller not in self._out
        ):
            return
        with self._lock:
            self._ahead.discard(caller)
            self._accepted.pop(caller, None)
            self._out.pop(caller, None)
            pause.disown(caller)

    def sending(self, in_flight: int) -> int:
        """Of the gate's ``in_flight`` slot holders, those not held back: at the provider
        (or about to be). A concurrency 429 is counted against these: counted with the
        held ones, an uncapped fleet of 2,400 behind 320 slots cut 423, 422, 421 ... one
        rejection each (the morning peak x10, with the herd limit lifted once the slope is
        known: an experiment, not the default)."""
        return max(0, in_flight - len(self._held))

    def turned_away(
        self,
        at: float,
        tokens: int | None = None,
        *,
        refused: bool = False,
        caller: object | None = None,
    ) -> None:
        """``caller``'s attempt sent at ``at`` (charged ``tokens``) was throttled, or a
        server error answered it: the provider did not count it; ``refused``: its slots
        turned it away (a concurrency 429), and its request window may have
        (:meth:`anygate._limits.window.SentLog.refused`)."""
        if self._enabled and self._pace:
            with self._lock:
                self._sends.turned_away(at, tokens or 0, refused=refused)
                self._answered(caller, taken=False)
                if caller is not None:
                    self._out.pop(caller, None)  # answered: no longer at the provider

    def rejected(self, at: float, caller: object | None = None) -> None:
        """``caller``'s attempt sent at ``at`` got a 429 now (any kind): it was at the
        provider until now, but not in service (see :meth:`passed`); a send of the pace's
        test burst turned away (:meth:`anygate._limits.pace.SendPace.answered`; a 429
        for the test's requests makes the pace hold, :meth:`.SendPace.rejected`)."""
        if self._enabled:
            with self._lock:
                sent = None if caller is None else self._out.pop(caller, None)
                self._slots.rejected(at, self._clock(), None if sent is None else sent[0])
                self._answered(caller, taken=False)

    def passed(
        self,
        at: float,
        sending: int = 0,
        tokens: int | None = None,
        caller: object | None = None,
    ) -> None:
        """``caller``'s attempt sent at ``at`` with ``sending`` calls at the provider
        (itself included), charged ``tokens``, succeeded: a lower bound for the estimates
        (:meth:`anygate._limits.concurrency.ConcurrencyLimit.passed`,
        :meth:`anygate._limits.sends.Sends.passed`); the request estimate's, unless
        :meth:`accepted` gave it already."""
        # Counted at its send: the slot holders not held back read a batch the gate
        # admitted at once before any had asked to go (56 against 32 slots, a pass among
        # them 42), and the slots' plain 429s then read as a slope rule's (the outage
        # scenario, plain 429s, seed 9, its minute spent at once: a storm every 5 s).
        # Its place in the send order tells which 429s were sent before it.
        sent = None if caller is None or not self._out else self._out.pop(caller, None)
        order = None
        if sent is not None:
            order, sending = sent[0], min(sending, sent[1])
        if sending > self._slots.most_passed:  # unlocked: a stale read locks once more
            with self._lock:
                self._slots.passed(at, sending, order)
                self._apply()  # a tentative lesson it refuted is undone
        sends = self._sends
        self._test_answer(caller)
        # Unlocked: no estimate (no per-minute 429 yet), no work.
        if sends.requests.listening or (tokens and sends.tokens.limit is not None):
            with self._lock:
                told = caller is not None and self._accepted.get(caller) == at
                sends.passed(at, tokens or 0, requests=not told)
        probe = self._published
        if probe is not None and not probe.ended and self._clock() >= probe.next_at:
            self._probe_published(probe)
        token_probe = self._published_tokens
        if (
            token_probe is not None
            and not token_probe.ended
            and self._clock() >= token_probe.next_at
        ):
            self._probe_published_tokens(token_probe)

    def accepted(self, at: float, caller: object) -> None:
        """``caller``'s attempt sent at ``at`` was accepted (a success status and headers
        arrived, or the first streamed bytes) and is still running: it got past the
        provider's request window, so the request estimate hears its pass now, not when
        the generation ends (:mod:`anygate._limits.threshold`: a random 429 answers in
        tens of milliseconds, a pass seconds later; heard only then, two random 429s at
        a new high of the window held sends there before any pass could outvote them).
        Once per attempt; :meth:`passed` then leaves the request estimate out, and the
        mark goes when the call ends (``disown``). A send of the pace's test burst, taken
        (:meth:`anygate._limits.pace.SendPace.answered`)."""
        sends = self._sends
        self._test_answer(caller)
        # Unlocked reads, checked again under the lock: whether the slots have yet to
        # hear of it, and whether the request estimate listens (before its first
        # per-minute 429 it does not). One locked step for both.
        sent = self._out.get(caller)
        fresh = sent is not None and not sent[2]
        if not fresh and not sends.requests.listening:
            return
        with self._lock:
            if fresh and sent is not None:
                self._in_service(at, caller, sent)
            accepted = self._accepted
            if not sends.requests.listening or accepted.get(caller) == at:
                return
            if len(accepted) >= _MARKS:  # marks of calls that never ended here: stale
                horizon = at - MEMORY_S
                for old in [key for key, marked in accepted.items() if marked < horizon]:
                    del accepted[old]
            accepted[caller] = at
            sends.requests.passed(at)

    def _in_service(self, at: float, caller: object, sent: tuple[int, int, bool]) -> None:
        """``caller``'s attempt, sent at ``at`` as ``sent`` says, was accepted: it holds
        one of the provider's slots now, so the slots' lower bound
        (:attr:`~anygate._limits.concurrency.ConcurrencyLimit.most_passed`) hears of it
        at once, not when the generation ends. Counted low: of the calls at the provider
        at its send, those sent before it and not yet answered nor accepted may still be
        turned away, so they are left out (the 429s already heard are the slots' own
        correction); the pass at the call's end counts them once they are known. Under
        the lock."""
        out = self._out
        if out.get(caller) is not sent:  # answered meanwhile, or a new attempt
            return
        order, count, _ = sent
        out[caller] = (order, count, True)  # in service: sure for those sent after it
        if count <= self._slots.most_passed:
            return
        unsure = sum(1 for place, _, taken in out.values() if place < order and not taken)
        self._slots.passed(at, count - unsure, order)
        self._apply()  # a tentative lesson it refuted is undone

    def attribute(
        self, at: float, sending: int, tokens: int | None = None, *, per_minute: bool = False
    ) -> Attributed:
        """The limit a 429 that does not say which (no wording, no headers) for the attempt
        sent at ``at`` with ``sending`` calls at the provider, charged ``tokens``, is taken
        for (:mod:`anygate._limits.attribute`); ``per_minute``: its code names a
        per-minute limit (requests or tokens only). While a published token rate's probe
        stands above the published rate, the tokens' (its step is what most likely ran
        out); while it has not stepped, the 429 ends it where it is
        (:class:`anygate._limits.published.TokenProbe`)."""
        gate = self._gate()
        rate = None if gate is None else gate.rate
        with self._lock:
            sends = self._sends
            requests = sends.requests
            threshold = requests.threshold
            if threshold is not None:
                estimate: float | None = threshold
                count = requests.count(at)
            else:
                estimate = None if rate is None else rate.requests_per_minute
                count = sends.requests_in_minute(at)
            token_estimate = None
            if tokens:
                token_estimate = sends.tokens.estimate(at)
                if token_estimate is None and rate is not None:
                    token_estimate = rate.tokens_per_minute
            attributed = attribute(
                sending=sending,
                most_passed=self._slots.most_passed,
                requests=count,
                requests_estimate=estimate,
                requests_fitted=threshold is not None,
                tokens=sends.tokens.held(at) if tokens else 0.0,
                tokens_estimate=token_estimate,
                # Learned, the slope rule holds every send to its allowance: a new high
                # then is the slots' (taken for the slope's, the peak's herd limit grown
                # past 32 slots taught a 5 s window and growth 1.5 from their 429s: 1.045x).
                steep=sends.steep(at),
                per_minute=per_minute,
            )
            most = self._slots.most_passed
            token_probe = self._published_tokens
            if token_probe is not None and token_probe.ended:
                token_probe = None
            if token_probe is not None and tokens and token_probe.stepped:
                # A stepped token rate is what most likely ran out: a bucket the step
                # drains answers plain 429s the counts take for another limit's.
                attributed = "tokens"
            if (
                attributed == "burst"
                and not sends.sloped(at)
                and requests.unexplained(at, self._clock())
            ):
                # A count no estimate explained, where such 429s keep coming with nothing
                # passing above: the request limit's, below the published rate.
                attributed = "requests"
            if attributed == "burst" and 0 < most < sending:
                # A new high the ramp kept from being the slots': a suspect, checked
                # once a call has left (anygate._limits.burst).
                self._suspect = (at, sending)
        if token_probe is not None and attributed != "tokens":
            # Refused at the published token rate, by whichever limit: the probe ends.
            self._probe_published_tokens(token_probe, at_once=True, refused=True)
        return attributed

    @ki_protected
    def on_rate(
        self,
        unit: Literal["requests", "tokens"],
        admitted_at: float,
        *,
        caller: object | None = None,
        tokens: int | None = None,
        stated: bool = True,
        quoted: float | None = None,
    ) -> None:
        """An RPM/TPM 429 for ``caller``'s attempt sent at ``admitted_at`` (charged
        ``tokens``): the provider's own per-minute budget is spent, and a gate paced to
        its published rate overshoots it by the budget's burst after a lull.
        ``stated=False``: the 429 did not say what it counted; :meth:`attribute` took it
        for ``unit``'s (an inferred threshold needs more, :mod:`anygate._limits.threshold`).
        ``quoted``: the requests a minute the 429 quoted as its limit, with its window
        full (OpenAI's "Limit 600, Used 600"; ``None``: none, or not full); where this
        client's own count agrees, the threshold is the provider's number and needs no
        check.

        ``unit="requests"`` holds the gate's sends to the limit's estimate: the count of
        this gate's requests the provider accepted in the minute before the rejected one
        was sent (:mod:`anygate._limits.requests`). ``unit="tokens"`` (with the attempt's
        charged ``tokens``; without them it counts as requests) holds sends to the tokens
        the provider accepted in that minute (:mod:`anygate._limits.tokens`). No check,
        no pause, no cut: the estimates tell noise apart by themselves. A 429 that does
        not say what it counted is attributed first (:meth:`attribute`).
        """
        quoted = check_number("quoted", quoted, strict=True, unit="", none=True)
        gate = self._pace_gate() if self._enabled else None
        if gate is None:
            return
        cost = tokens or 0
        paced = gate.rate.requests_per_minute if gate.rate is not None else None
        probe = self._published
        if probe is not None and not probe.ended:
            paced = probe.good  # a step is the probe's guess; the rate below it was paced
        with self._lock:
            sends = self._sends
            now = self._clock()
            sends.rejected(
                unit, admitted_at, cost, now, caller, paced, stated=stated, quoted=quoted
            )
            held = sends.tokens.held(admitted_at) if unit == "tokens" else 0.0
            limit = sends.requests.limit
            if unit == "requests" and limit is not None and limit.noise and caller is not None:
                # Below every limit the answers allow: a shared pool's. The provider
                # would have served the call; its retry goes ahead of fresh calls, as a
                # burst 429 taken for noise does (goes_ahead), not behind the queue.
                self._ahead.add(caller)
        if unit == "requests" and probe is not None and not probe.ended:
            self._probe_published(probe, at_once=True)  # back to the last rate without one
        token_probe = self._published_tokens
        if unit == "tokens" and token_probe is not None and not token_probe.ended:
            self._probe_published_tokens(token_probe, at_once=True)  # back to the proven rate
        rate = gate.rate
        paced = None if rate is None else rate.tokens_per_minute
        if unit == "tokens" and cost and paced is not None and held + cost > paced:
            # The minute up to the send held more, by the estimates charged at admission,
            # than the gate's token budget lets through: its settles' refunds let it.
            # The provider counted the estimates (OpenAI reserves max_tokens): refunds
            # give nothing back from now on. A 429 at fewer tokens than the pace is a
            # lower limit, the estimate's (:mod:`anygate._limits.tokens`). Without
            # headers to sync to, seeds 1-5: 2.33 % -> 0.33 % of calls with a 429.
            gate._keep_token_estimates()
