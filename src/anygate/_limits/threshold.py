"""A per-window request limit: the count the provider's answers contradict least.

Why. A requests-per-minute 429 says the provider's window was full: the count of ours in
it (:meth:`.SentLog.held`) bounds the limit from above; a pass bounds it from below. But a
shared key's pool also answers random per-minute 429s at any count (a few per cent of
calls), and in a steady flow every one of them lands at the count the window holds right
then: it looks like the limit. Taken at its word, each lowered the estimate a request and
the next landed on the new hold, 48 a minute against a regrowth of one: the morning peak
with 5 % of its calls turned away at random took 8.1x the oracle (1 %: 5.0x; issue 30,
"noise is told apart by evidence"). Two words within a window did not tell them apart: at
0.8 random 429s a second, a second word always came before the passes (2 s a call) that
would have disproved the first.

What tells them apart is every answer at once. A limit ``L`` says a send that found ``n``
of ours in its window passes when ``n < L`` and is turned away when ``n >= L``. A random
429 is a send at a count that passes around it; a real limit turns away every send at or
above it. :class:`CountLimit` keeps the answers of the last :data:`MEMORY_S` (by send time)
and holds sends to the threshold that contradicts fewest of them: a pass at or above it,
or a rejection below it, each count one. "No limit" contradicts every rejection. Noise at
any rate below a half contradicts the threshold at its own count more (the passes there)
than no limit (itself). A real limit's rejections pile up at and above it with no pass,
and a count that errs a request high (a rejection still unanswered when counted) is
lowered by the next window's rejections, none of which pass.

A threshold is held only when it fits at least :data:`SUPPORT` more answers than no limit
does: one 429 alone is a shared pool's as often as a limit's; a real limit's next send
is turned away a reject latency later (about 50 ms), noise's is not.

The estimate grows back by ``growth`` requests a window from the threshold (a raised limit
is found again at that bounded, stated rate), and a pass at or above the threshold is a
contradiction that moves it at once (:meth:`CountLimit.passed`).

Held, nothing is ever sent above a threshold but the regrowth, a request a minute: a call
turned away at random twice in a row (its retry went 26 ms after the first 429) held the
morning peak at 453 requests a minute for a minute, while its sends at 452 passed 185
times (5 % random 429s, seed 3: 1.244x the lower bound). So a threshold is *checked* until
its :attr:`CountLimit.support` reaches :data:`CONFIRM`: one send at a time goes above it
(:class:`.RequestLimit`). A real limit turns each check away (two 429s more per limit
learned); a pool at a rate ``p`` passes it, and a walk that steps down with ``1 - p`` and
up with ``p`` from :data:`SUPPORT` reaches :data:`CONFIRM` before it falls below
:data:`SUPPORT` about ``(p / (1 - p))**2`` of the time: 1 % at 10 % of calls. One check
alone left a 10 % pool's threshold standing for two minutes whenever it was turned away
(seed 3: 1.30x the lower bound).

The count errs by a request or two either way (:func:`.window.count_slack`), and the
error drifts: a run of :data:`CONFIRM` rejections within it below the threshold, nothing
passing between, says the provider's window holds more than our count of it, and the
passes at or above their count are of the count as it was: forgotten, so the threshold
comes down to the run at once instead of when its 429s outnumber a minute of passes.

Every threshold is **tested** before it holds for good: checked (one send above it at a
time, the first a second after it was set) until a check sent at least a slope window
after it was set is turned away (:meth:`.RequestLimit._next_check`). 429s a few
milliseconds apart at one count say that *some* window was full then, not that it was a
minute's: a provider that enforces its per-minute limit over shorter intervals (OpenAI:
"60,000 requests a minute may be enforced as 1,000 a second") answers "requests per
minute" at whatever count the minute held then, and confirmed at once by a burst of such
answers, 84 a minute held a fleet paced at 1,200 for a minute, again and again (morning
peak with the published 1,200 a minute enforced per second: 5.4x the oracle; with the
test, 1.003x).

A 429 that **quotes** the limit with its window full (OpenAI's "Limit 600, Used 600,
Requested 1"), at a send whose count of ours agrees with that number within the count's
error, is the minute's limit in the provider's own words, and the count says the window
is ours: its threshold is neither checked nor tested (:attr:`CountLimit.agrees`). Checked
and tested as an inferred one, it cost the morning peak with a hidden RPM 600 four 429s
more a run (a check a second and a slope window after it was set, then its regrowth's
each minute). A quote at another count (a quantized limit's "Limit 1,200, Used 20", or a
key shared with others) is only a word, as before.

A 429 that did not say what it counted (no code, no wording, no headers) is taken for
this limit's only by its count (:meth:`.RequestLimit.unexplained`, :func:`.attribute`):
such a threshold is **inferred** (``stated=False``). The sends of one wave (sent before
the wave's first 429 was answered) met one state of the provider, whichever of its limits
was full: their 429s are one answer, at the wave's lowest count (each answered one leaves
our count), not one each, as much the slots' or a slope window's end as a minute's.
Counted one each and confirmed by them, a slope window's end taught the morning peak with
plain 429s (seed 20) 164 a minute, and the 26 of a wave released into the outage
scenario's first window after the outage (seed 9) 60 a minute: 4.2x and 4.8x the oracle,
the slots idle for ten minutes.

A pass is best heard when the provider accepts the send (status and headers, or the first
streamed bytes: :meth:`.SendPath.accepted`), as fast as a 429 comes; heard when the
generation ends, seconds later, the random 429s at a new high of the window outvote the
passes still on their way.

Not thread-safe, no clock of its own: the caller passes times and holds a lock.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque
from typing import final

from .window import count_slack, same_count

__all__ = ["CONFIRM", "MAX_ANSWERS", "MEMORY_S", "SUPPORT", "CountLimit"]

#: How long an answer is evidence, by its send time: two windows. A limit that changed
#: (another user of the key took part of it) is learned again within this, and a window's
#: worth of answers at the hold is always in it (the hold's sends answer within a window).
MEMORY_S = 120.0
#: How many more answers a threshold must fit than "no limit" before sends are held to it.
#: One: the first 429 of a random pool held the whole ramp until a pass disproved it (the
#: morning peak with 5 % random 429s lost 2-6 s of sends at each of them). Two: a real
#: limit's second rejection comes a reject latency after its first.
SUPPORT = 2
#: The most answers kept, the oldest forgotten first: what each costs stays bounded (an
#: answer is an insertion into a sorted list, a fit a bisection per rejection level). At a
#: thousand calls a minute the two minutes keep about 2,000; at 100,000 a minute the last
#: 2.5 s, still thousands of answers around the count the window holds.
MAX_ANSWERS = 4096
#: The support a threshold is checked up to (one send above it at a time): see the module
#: docstring. Four: two checks turned away at a real limit, a pool's walk from two at
#: 10 % of calls confirms about 1 % of its thresholds.
CONFIRM = 4


@final
class CountLimit:
    """The threshold of a per-window count limit, fitted to the answers; see the module
    docstring.

    Args:
        window_s: the provider's window (60 s for a per-minute limit).
        growth: how much the estimate grows back per window from the threshold.
    """

    __slots__ = (
        "_answers",
        "_newest",
        "_passes",
        "_rejections",
        "_streak",
        "_wave",
        "estimated_at",
        "growth",
        "held_since",
        "high",
        "noise",
        "paced",
        "quoted",
        "stated",
        "support",
        "tested",
        "window_s",
    )

    def __init__(self, window_s: float = 60.0, growth: float = 1.0, *, stated: bool = True) -> None:
        self.window_s = window_s
        self.growth = growth
        # Whether the provider said its 429s were this limit's (worded), or the counts
        # did (inferred, see the module docstring); once a worded one comes, stated.
        self.stated = stated
        # Whether a check of the threshold held, sent a slope window after it was set,
        # was turned away (:meth:`.RequestLimit._next_check`; see the module docstring).
        self.tested = False
        # The latest wave of inferred 429s: (when its first was answered, the send time
        # and count recorded for it).
        self._wave: tuple[float, float, int] | None = None
        self.high: float = math.inf  # the threshold held (inf: none)
        self.estimated_at = -math.inf  # when ``high`` was set
        self.held_since = -math.inf  # when a threshold was last set where none was held
        # (send time, count, rejected) in answer order, and the counts sorted by answer.
        self._answers: deque[tuple[float, int, bool]] = deque()
        self._passes: list[int] = []
        self._rejections: list[int] = []
        self._newest = -math.inf  # the latest send time answered
        # How many more answers the threshold held fits than no limit does (0: none held).
        self.support = 0
        # The requests a minute sends are paced at (the user's or published rate; inf:
        # none): a word for a threshold at it (see _fit).
        self.paced = math.inf
        # Whether the last rejection fits no threshold held (none, or it came below it):
        # a shared pool's, as far as every answer says.
        self.noise = False
        # Rejections since the last pass (see rejected).
        self._streak = 0
        # The limit a 429 quoted with its window full ("Limit 600, Used 600"), when our
        # count agreed with it (see agrees); ``None``: none quoted.
        self.quoted: float | None = None

    @property
    def agrees(self) -> bool:
        """Whether the threshold held is the one the provider quoted, within the count's
        error: its own number, at the count ours found; it needs no check (see the
        module docstring)."""
        quoted = self.quoted
        return quoted is not None and same_count(self.high, quoted)

    def passed(self, at: float, count: int) -> None:
        """The send at ``at`` passed with ``count`` of ours already in its window. At or
        above the threshold it contradicts it: the threshold is fitted again."""
        self._record(at, count, rejected=False)
        self._streak = 0
        if count >= self.high:
            self._fit(at)

    def rejected(self, at: float, count: int, now: float, *, stated: bool = True) -> bool:
        """The send at ``at`` was turned away, answered at ``now``, with ``count`` of ours
        in its window (``0``: someone else filled it, which teaches nothing); whether the
        estimate went down. ``stated=False``: the 429 did not say it was this limit's (see
        the module docstring: one answer per wave)."""
        self.stated |= stated  # the provider said so
        if count <= 0:
            self._streak += 1
            self.noise = False
            return False
        before = self.estimate(now)
        wave = self._wave
        if not stated and wave is not None and at < wave[0]:
            # Sent before the wave's first 429 was answered: the same answer. Its count
            # (lower: each answered one left ours) replaces the wave's.
            if count >= wave[2] or not self._unrecord(wave[1], wave[2]):
                return False
            self._wave = (wave[0], at, count)
        else:
            self._streak += 1
            if not stated:
                self._wave = (now, at, count)
        self._record(at, count, rejected=True)
        held = self.high
        if self._streak >= CONFIRM and count < held and same_count(count, held):
            # CONFIRM in a row, nothing passed between, within the count's error below
            # the threshold: the provider's window holds more than our count of it says
            # (a send it counted and we did not), and every send the hold lets go is
            # turned away; the passes at or above this count are of the count as it was.
            # A pool's 429s come so at 10 % of calls once in 10,000. Outvoted by those
            # passes, the hold's sends were turned away until the 429s outnumbered them
            # (a learned 597 and 429s at 594: 331 in 20 s; morning peak, plain 429s,
            # 96 slots: 1.91 % -> 0.62 % of calls with a 429).
            self._forget_passes(count)
        self._fit(now)
        self.noise = count < self.high
        if self.high == held and count >= held:
            # At or above the threshold it held: the regrowth since went too far (or the
            # send went with one the hold let through): grow again from the threshold.
            self.estimated_at = now
        return self.estimate(now) < before

    def estimate(self, now: float) -> float:
        """The limit to hold sends to: the threshold, grown by ``growth`` per window since
        it was set; ``inf`` when none is held."""
        if self.high == math.inf:
            return math.inf
        return self.high + self.growth * max(0.0, now - self.estimated_at) / self.window_s

    def _record(self, at: float, count: int, *, rejected: bool) -> None:
        answers = self._answers
        answers.append((at, count, rejected))
        insort(self._rejections if rejected else self._passes, count)
        self._newest = max(self._newest, at)  # answers come out of send order
        horizon = self._newest - MEMORY_S
        while answers and (answers[0][0] < horizon or len(answers) > MAX_ANSWERS):
            _, old, was_rejected = answers.popleft()
            counts = self._rejections if was_rejected else self._passes
            del counts[bisect_left(counts, old)]

    def _unrecord(self, at: float, count: int) -> bool:
        """Forget the rejection recorded for the send at ``at`` with ``count`` (whether it
        was still remembered)."""
        for i in range(len(self._answers) - 1, -1, -1):
            if self._answers[i] == (at, count, True):
                del self._answers[i]
                del self._rejections[bisect_left(self._rejections, count)]
                return True
        return False

    def _forget_passes(self, level: int) -> None:
        """Forget the passes at or above ``level``."""
        self._answers = deque(answer for answer in self._answers if answer[2] or answer[1] < level)
        del self._passes[bisect_left(self._passes, level) :]

    def _fit(self, now: float) -> None:
        """Hold the threshold that contradicts fewest answers, when it fits :data:`SUPPORT`
        more than no limit does; ties go to the lower (the cheaper mistake)."""
        passes, rejections = self._passes, self._rejections
        # The paced rate is one more word, for a threshold within the count's error of
        # it: a 429 where the gate's own pace put the window is its limit's (the morning
        # peak with 96 slots paced at the real 1,200 a minute: waiting for a second 429
        # there cost 1.007x -> 1.025x the oracle), and no word for one well below it (a
        # pool's first 429 at the top of a ramp holds nothing).
        paced = self.paced
        prior = 1 if paced != math.inf else 0
        best, fewest = math.inf, len(rejections) + prior  # no limit contradicts every one
        previous = None
        for below, level in enumerate(rejections):
            if level == previous:
                continue
            previous = level
            wrong = (len(passes) - bisect_left(passes, level)) + below
            if prior and not same_count(level, paced):
                wrong += 1
            if wrong < fewest:
                best, fewest = level, wrong
        if best != math.inf and len(rejections) + prior - fewest < SUPPORT:
            best = math.inf
        high = self.high
        if best > high and len(passes) == bisect_left(passes, high):
            # What set it is forgotten, nothing since contradicts it: confirmed. Taken
            # as just set, its checks cost the real RPM 600 two 429s a memory.
            self.support = CONFIRM
            # Only a pass at or above it lifts a threshold: its 429s forgotten (a hold
            # that works draws none), it stands. Lifted as they aged out, the morning
            # peak's real 600 a minute let sends through to the next 429s (seed 1, 231 s).
            return
        if (
            best == math.inf
            and high != math.inf
            and (
                len(rejections) == bisect_left(rejections, high - count_slack(high))
                or (self.tested and passes[-1] <= high + count_slack(high))
            )
        ):
            # A threshold that outlived the 429s that set it (a hold that works draws
            # none), passed above by its regrowth: up to the most that passed, growing on
            # from there. Lifted to no limit, one regrowth send that passed at the real
            # RPM 600 (its count a request off) let the gate's pace through: 14 429s in a
            # second (seed 8; seeds 6-10 0.38 % -> 0.52 % of calls with a 429). So is a
            # tested threshold passed just above (within the count's error): an inferred
            # one's wave is one answer, and three regrowth passes at 597 and 598
            # outvoted the four 429s at 597 of a real 600 (plain 429s, seed 3: lifted,
            # the gate's pace went through, 5.9 % of calls with a 429).
            best, self.support = passes[-1] + 1, CONFIRM
        else:
            self.support = len(rejections) + prior - fewest if best != math.inf else 0
        if best != high:
            if high == math.inf:
                self.held_since = now
                self.tested = False  # a new threshold needs its own test
            self.high = best
            self.estimated_at = now

    def __repr__(self) -> str:
        return (
            f"CountLimit(high={self.high}, answers={len(self._answers)}, "
            f"rejections={len(self._rejections)})"
        )
