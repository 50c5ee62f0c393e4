"""Learning a gate's :class:`~anygate.Rate` from what the provider's headers report.

One :class:`RateLearner` per gate (``RateLearner.of(gate)``) turns :class:`LimitReport`
objects into the gate's ``rate``:

* **Pacing.** A request or token limit, once the evidence is consistent, becomes the
  gate's ``requests_per_minute`` / ``tokens_per_minute`` at ``(1 - headroom)`` of it
  (default 90 %, Langroid's margin); a token limit whose ``remaining`` the gate is synced
  to (below) at the whole limit. Consistent means ``confirm`` reports in a row (default
  2) stating the same limit (within 1 %) *with something used*: a full bucket (remaining
  equal to the limit) tells nothing, since a fresh key and a misconfigured gateway look
  the same. A limit a refusal states (a 429's words, ``ReportedLimit.refused``) needs
  no second report. A changed limit (a tier upgrade, a lowered quota) needs its own streak.
  Anthropic's input and output limits become ``input_tokens_per_minute`` /
  ``output_tokens_per_minute`` the same way, at the whole limit, for a gate that has
  those budgets (never a new budget: a gate without them is not made to pace them).
* **Holding.** A drained bucket (``remaining == 0``) tells a lot: its limit is adopted at
  once, and the gate admits nobody until the reported reset (at most ``max_hold_s``,
  default 60 s), through the gate's one hold hook (``BudgetSteps._hold_until``).
* **Syncing.** A report of what is ``remaining`` in a bucket the gate paces (requests,
  tokens) brings the gate's own budget down to it, less what this gate admitted after the
  reported request was sent (``sent``, a mark the caller took at admission; see
  ``Budgets.lower_since``). Only ever lower: another client spending from the same
  bucket shows here and nowhere else. A report sent before one already applied is
  dropped (answers come back out of order, and an older snapshot only understates).
* **Lifting.** The provider's bucket starts full (a minute of its limit), the gate's
  token budget empty. Once, early, the gate's token budget is raised to the reported
  ``remaining`` less ``headroom`` of the limit (less our charges since), so a fleet spends
  that first bucket: only if nobody else spends from it (:meth:`.ShareMeter.lift`), and
  never on a kind whose reports show a sliding window.
* **Windows.** A token limit whose reports show a sliding window (Azure OpenAI: a
  minute's quota, each request's estimate counted until a minute after it) is paced by a
  copy of that window in the gate (``_gate/window.py``): it admits whatever is left of
  the window, as the provider does, and every report charges it what the provider
  counted beyond our own entries. At the whole limit, with no share measure and no lift.
* **Sharing.** Two such reports of a bucket below a quarter of its limit, falling under
  our pace, measure the rate it refills beyond our own charges (the limit less what
  others spend); the gate is paced at the lower of that share and ``(1 - headroom)`` of
  the limit (:meth:`.ShareMeter.measure`).
* **Ceilings.** Never above a user's rate: each dimension the gate's rate had when the
  learner was made (or :attr:`RateLearner.ceiling` says) caps what is learned. Other
  fields of the gate's rate (``ramp``, ``window_s``, ``burst_s``) are kept.

Limits that cannot be per minute (a reset far beyond the reported window, as with daily
quotas) are not paced to, though a drain still holds. On its own this is not a fleet
coordinator: each process paces itself to the whole limit (see ``docs/learning.md``). On
a :class:`~anygate.fleet.FleetGate`'s ``gate`` the rate and the holds are the fleet's
(the gate's ``_learned_rate`` and ``_hold_until`` hooks send them there); nothing is
synced to ``remaining`` (the gate has no budget mark).

The snapshot :attr:`RateLearner.limits` returns, :class:`LearnedLimits`, is defined in
:mod:`anygate._limits.learned_limits` and re-imported here.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import weakref
from typing import TYPE_CHECKING, Literal, final

from .._classify.headers import MAX_RESET_S, LimitReport, ReportedLimit, parse_limit_headers
from .._gate.rate import BudgetMark, Rate
from .._validation import check_int, check_number
from .learned_limits import LearnedLimits
from .share import ShareMeter, same
from .sliding import sliding, window_left

if TYPE_CHECKING:
    from .._gate.gate import Gate

__all__ = ["LearnedLimits", "RateLearner"]

# Learned rates above this are not limits (and would fail Rate's own bound).
_MAX_PER_MINUTE = 1e12
_KINDS = ("requests", "tokens")
# Anthropic's input and output token limits, learned only for a gate that paces them with
# budgets of its own (``Rate(input_tokens_per_minute=, output_tokens_per_minute=)``): it
# is synced to their ``remaining`` (``Budgets.lower_since``), so paced at the whole limit.
_SPLIT_KINDS = ("input_tokens", "output_tokens")
# Kinds paced at the whole limit once the gate's budget is synced to their `remaining`
# (issue 30). Tokens: the syncs bring the budget down to the provider's level at every
# answer, so a margin on top only leaves a tenth of the limit unused (TOKEN_TUNING, seeds
# 1-3: ~15,000-token prompts 1.138x -> 1.025x the oracle, 80 agents 1.109x -> 1.034x, no
# 429 added). Requests keep the headroom: at the whole limit the Anthropic-like tuning cell
# (80 RPM) went from 8.5 % to 10 % of calls with a 429 (1.208x -> 1.249x).
_SYNCED_AT_LIMIT = frozenset({"tokens"})


_registry: weakref.WeakKeyDictionary[Gate, RateLearner] = weakref.WeakKeyDictionary()
_registry_lock = threading.Lock()


@final
class RateLearner:
    """Sets and updates one gate's :class:`~anygate.Rate` from rate-limit headers.

    Use :meth:`of` to get the gate's learner (made with the defaults on first use); build
    one directly to choose the settings: it then becomes the gate's learner. Thread-safe:
    any task, loop or thread may call :meth:`observe`.

    Args:
        gate: the gate to pace.
        headroom: the fraction of each reported limit left unused, in ``[0, 0.99]``
            (default 0.1: pace at 90 %); none on a token limit once a report with
            ``remaining`` and ``sent=`` has synced the gate's token budget to it.
        confirm: consistent reports needed before a limit is adopted, an int >= 1
            (default 2); a drained report needs none.
        max_hold_s: the longest hold after a drained report, in seconds (default 60).
        ceiling: the most the learner may set, per dimension: a :class:`~anygate.Rate`,
            ``"gate"`` (the default: the gate's rate now, as the user configured it) or
            ``None`` (no ceiling). A dimension the ceiling leaves unset is uncapped.

    Raises:
        TypeError: ``gate`` is not a Gate; a setting of the wrong type.
        ValueError: a setting out of range.
    """

    __slots__ = (
        "_ceiling",
        "_confirm",
        "_gate",
        "_headroom",
        "_holds",
        "_learned",
        "_lock",
        "_max_hold",
        "_paced_at",
        "_rate",
        "_reports",
        "_share",
        "_source",
        "_streaks",
        "_synced",
        "_synced_kinds",
        "_syncs",
        "_told",
        "_windowed",
    )

    def __init__(
        self,
        gate: Gate,
        *,
        headroom: float = 0.1,
        confirm: int = 2,
        max_hold_s: float = 60.0,
        ceiling: Rate | Literal["gate"] | None = "gate",
    ) -> None:
        from .._gate.gate import Gate  # a cycle at import time: _gate does not import us

        given: object = gate  # typed as object: the check is for untyped callers
        if not isinstance(given, Gate):
            msg = f"gate must be an anygate.Gate (got {given!r} of type {type(given).__name__})"
            raise TypeError(msg)
        room = check_number("headroom", headroom, maximum=0.99, unit="")
        assert room is not None
        self._headroom = room
        count = check_int("confirm", confirm, minimum=1, maximum=1000)
        assert count is not None
        self._confirm = count
        hold = check_number("max_hold_s", max_hold_s, maximum=MAX_RESET_S)
        assert hold is not None
        self._max_hold = hold
        self._ceiling = self._check_ceiling(gate.rate if ceiling == "gate" else ceiling)
        self._gate = weakref.ref(gate)  # the registry maps gate -> learner: no cycle
        self._lock = threading.Lock()
        self._learned: dict[str, float] = {}
        self._streaks: dict[str, tuple[float, int]] = {}
        self._rate: Rate | None = None
        self._source = ""
        self._reports = 0
        self._holds = 0
        self._syncs = 0
        # The newest ``sent`` mark time applied by a sync: older reports are dropped.
        self._synced = -math.inf
        # When this learner last changed the gate's token pace, on the gate's clock (the
        # lift measures a span at one pace: ShareMeter.lift).
        self._paced_at = -math.inf
        # Kinds whose `remaining` has been synced to (paced without headroom, see _apply).
        self._synced_kinds: set[str] = set()
        # The kinds of limit any report stated (headers, or a refusal's words): the
        # provider's own numbers, which a published rate's probe leaves to them.
        self._told: set[str] = set()
        # Kinds whose reports showed a sliding window (keep the headroom, see _apply).
        self._windowed: set[str] = set()
        # What the bucket leaves us: the lift, the share measure (_limits.share).
        self._share = ShareMeter()
        with _registry_lock:
            _registry[gate] = self

    @staticmethod
    def _check_ceiling(value: object) -> Rate | None:
        if value is not None and not isinstance(value, Rate):
            msg = f"ceiling must be an anygate.Rate or None (got {value!r})"
            raise TypeError(msg)
        return value

    @classmethod
    def of(cls, gate: Gate) -> RateLearner:
        """The gate's learner, made with the default settings on first use."""
        with _registry_lock:
            learner = _registry.get(gate)
        if learner is None:
            learner = cls(gate)
            # Two threads may race to make one; the registry keeps whichever came last,
            # and both return that one.
            with _registry_lock:
                learner = _registry.setdefault(gate, learner)
        return learner

    @staticmethod
    def _existing(gate: Gate) -> RateLearner | None:
        """The gate's learner if it has one (:meth:`of` makes one)."""
        return _registry.get(gate)

    # ------------------------------------------------------------------ views

    @staticmethod
    def told(gate: Gate, kind: Literal["requests", "tokens"]) -> bool:
        """Whether any report to ``gate``'s learner (if it has one) stated a limit of
        ``kind``: rate-limit headers, or a refusal's words. A published rate's upward
        probe (:mod:`anygate._limits.published`) ends then: the provider says its limit."""
        learner = _registry.get(gate)
        return learner is not None and kind in learner._told

    @property
    def gate(self) -> Gate:
        """The gate this learner paces (``ReferenceError`` once it is gone)."""
        gate = self._gate()
        if gate is None:
            msg = "the gate of this RateLearner has been garbage-collected"
            raise ReferenceError(msg)
        return gate

    @property
    def headroom(self) -> float:
        """The fraction of each reported limit left unused."""
        return self._headroom

    @property
    def ceiling(self) -> Rate | None:
        """The most the learner may set per dimension; settable (e.g. after a user change)."""
        return self._ceiling

    @ceiling.setter
    def ceiling(self, value: Rate | None) -> None:
        checked = self._check_ceiling(value)
        with self._lock:
            self._ceiling = checked

    @property
    def limits(self) -> LearnedLimits:
        """A snapshot of what has been learned."""
        with self._lock:
            return LearnedLimits(
                requests_per_minute=self._learned.get("requests"),
                tokens_per_minute=self._learned.get("tokens"),
                source=self._source,
                reports=self._reports,
                holds=self._holds,
                rate=self._rate,
                syncs=self._syncs,
                requests_share_per_minute=self._share.available.get("requests"),
                tokens_share_per_minute=self._share.available.get("tokens"),
                input_tokens_per_minute=self._learned.get("input_tokens"),
                output_tokens_per_minute=self._learned.get("output_tokens"),
            )

    def __repr__(self) -> str:
        gate = self._gate()
        name = "<gone>" if gate is None else repr(gate.name)
        learned = ", ".join(f"{k}={v:g}/min" for k, v in sorted(self._learned.items()))
        return f"<anygate.RateLearner gate={name} {learned or 'nothing learned'}>"

    # ------------------------------------------------------------------ learning

    def observe_headers(
        self, headers: object, now: float | None = None, *, sent: BudgetMark | None = None
    ) -> bool:
        """:meth:`observe` the report parsed from ``headers`` (any mapping-like headers)."""
        return self.observe(parse_limit_headers(headers), now, sent=sent)

    def observe(
        self, report: LimitReport, now: float | None = None, *, sent: BudgetMark | None = None
    ) -> bool:
        """Learn from one response's report; ``True`` if the gate's rate, hold or level changed.

        Args:
            report: from :func:`anygate.parse_limit_headers`.
            now: when the response arrived, on the gate's clock; default the clock now.
                Reported resets count from it.
            sent: ``gate.budget_mark()`` taken right after the reported request was
                admitted, before it was sent. With it, what the report says is
                ``remaining`` lowers the gate's budgets (see the module docstring);
                without it, nothing is synced (the gate cannot tell which of its own
                admissions the provider had counted).

        Never raises on what the report says (it holds only checked values). On a
        :class:`~anygate.fleet.FleetGate`'s ``gate`` the rate it learns and its holds are
        the fleet's, for every process (``FleetGate.set_rate``, without waiting); it has
        no budget mark, so nothing is synced to ``remaining`` there.
        """
        if not report:
            return False
        gate = self._gate()
        if gate is None:
            return False
        dims: dict[str, ReportedLimit | None] = {
            "requests": report.requests,
            "tokens": report.token_limit,
        }
        with self._lock:
            self._reports += 1
            self._source = report.source
            self._told.update(kind for kind, dim in dims.items() if dim is not None)
            adopted = False
            hold_s = 0.0
            for kind in _KINDS:
                dim = dims[kind]
                if dim is None:
                    continue
                adopted |= self._weigh(kind, dim)
                if kind not in self._windowed and sliding(dim):
                    self._windowed.add(kind)
                    adopted |= kind in self._learned  # its pace may change
                if dim.drained and dim.reset_s is not None and not self._copied(kind, gate, sent):
                    hold_s = max(hold_s, min(dim.reset_s, self._max_hold))
            rate = gate.rate
            for kind, dim in (
                ("input_tokens_per_minute", report.input_tokens),
                ("output_tokens_per_minute", report.output_tokens),
            ):
                # A split limit the gate paces (its own budget, synced below from
                # ``remaining``) refills continuously: a drain is a level of 0, not a
                # hold until the reset, which Anthropic states as the time of *full*
                # refill (holding to it idled the Anthropic-like sweep cell ~55 s, issue
                # 30). One the gate does not pace still holds it.
                if dim is None:
                    continue
                if rate is not None and getattr(rate, kind) is not None:
                    adopted |= self._weigh(kind.removesuffix("_per_minute"), dim)
                    continue
                if dim.drained and dim.reset_s is not None:
                    hold_s = max(hold_s, min(dim.reset_s, self._max_hold))
            fresh = sent is not None and sent.at >= self._synced
            if fresh:
                assert sent is not None
                for kind in _KINDS:
                    dim = dims[kind]
                    if dim is not None:
                        if kind != "tokens" or kind not in self._windowed:
                            # A token window is copied (see .sliding), and gives back
                            # what we charged a window ago: the measure read our own pace.
                            adopted |= self._share.measure(kind, dim, sent, self._headroom)
                        if (
                            kind in _SYNCED_AT_LIMIT
                            and dim.remaining is not None
                            and kind not in self._synced_kinds
                        ):
                            self._synced_kinds.add(kind)
                            adopted |= kind in self._learned  # re-paced without headroom
            changed = self._apply(gate) if adopted else False
            if hold_s > 0:
                start = gate._read_clock() if now is None else now
                # A virtual clock read outside its run cannot say when: no hold then.
                if start is not None and gate._hold_until(start + hold_s):
                    self._holds += 1
                    changed = True
            if fresh:
                assert sent is not None
                requests, tokens = _left(dims["requests"]), _left(dims["tokens"])
                # Anthropic's input / output limits sync the gate's split budgets
                # (ITPM / OTPM), when it has them, as the total does its token budget.
                inputs, outputs = _left(report.input_tokens), _left(report.output_tokens)
                # A bucket, not a sliding window: it is lifted (once) and keeps the spare.
                bucket = "tokens" not in self._windowed
                if not bucket and tokens is not None:
                    tokens = window_left(tokens, dims["tokens"], gate.rate)
                lift = None
                share = self._share
                if tokens is not None and bucket:
                    share.refilled(dims["tokens"], sent)
                if tokens is not None and not share.lifted:
                    lift = (
                        share.lift(dims["tokens"], sent, self._headroom, self._paced_at)
                        if bucket
                        else None
                    )
                    share.lifted |= not bucket
                if any(v is not None for v in (requests, tokens, inputs, outputs)):
                    self._synced = sent.at
                    if gate._lower_budgets(
                        sent,
                        requests,
                        tokens,
                        inputs,
                        outputs,
                        lift=lift,
                        spare=bucket,
                        window=not bucket,
                    ):
                        self._syncs += 1
                        changed = True
        return changed

    def _copied(self, kind: str, gate: Gate, sent: BudgetMark | None) -> bool:
        """Whether the gate's token budget copies ``kind``'s sliding window and this report
        syncs it (``sent``): a drain is then the copy's level of 0, freeing as its entries
        expire, not a hold until the reset, which is when the *whole* window has expired.
        Held to it, Azure's rule at 300,000 TPM (seed 2) sat out a minute after a drained
        report at 65 s: 1.157x the oracle."""
        rate = gate.rate
        return (
            kind in self._windowed
            and sent is not None
            and rate is not None
            and rate.tokens_per_minute is not None
        )

    def _weigh(self, kind: str, dim: ReportedLimit) -> bool:
        """Count ``dim`` as evidence for ``kind``'s limit; ``True`` if a new one is adopted."""
        per_minute = dim.per_minute
        if per_minute is None or dim.limit is None:
            return False
        if (
            dim.reset_s is not None
            and dim.window_s is not None
            and dim.reset_s > 2 * dim.window_s + 1
        ):
            return False  # refills over more than its window: not a per-window limit
        if dim.remaining is not None and dim.remaining >= dim.limit:
            return False  # a full bucket tells nothing
        value, count = self._streaks.get(kind, (per_minute, 0))
        count = count + 1 if same(value, per_minute) else 1
        self._streaks[kind] = (per_minute, count)
        if count < self._confirm and not (dim.drained or dim.refused):
            return False
        current = self._learned.get(kind)
        if current is not None and same(current, per_minute):
            return False
        self._learned[kind] = per_minute
        return True

    def _apply(self, gate: Gate) -> bool:
        """Set the gate's rate from what is learned, under the ceiling; ``True`` if changed."""
        current = gate.rate
        ceiling = self._ceiling
        values: dict[str, float | None] = {
            kind: None if current is None else getattr(current, f"{kind}_per_minute")
            for kind in (*_KINDS, *_SPLIT_KINDS)
        }
        for kind in (*_KINDS, *_SPLIT_KINDS):
            learned = self._learned.get(kind)
            if learned is None or (values[kind] is None and kind in _SPLIT_KINDS):
                continue  # a split limit is learned only for a budget the gate has
            synced = kind in self._synced_kinds or kind in _SPLIT_KINDS
            room = 0.0 if synced else self._headroom
            paced = min(learned * (1.0 - room), _MAX_PER_MINUTE)
            available = self._share.available.get(kind)
            if available is not None:
                # No headroom on a measured rate: the syncs keep the level honest, and a
                # margin here would leave a share of what is left unused for good.
                paced = min(paced, available)
            cap = None if ceiling is None else getattr(ceiling, f"{kind}_per_minute")
            if cap is not None:
                paced = min(paced, cap)
            if paced > 0:
                values[kind] = paced
        rpm, tpm = values["requests"], values["tokens"]
        if current is None:
            rate = Rate(requests_per_minute=rpm, tokens_per_minute=tpm)
        else:
            rate = dataclasses.replace(
                current,
                requests_per_minute=rpm,
                tokens_per_minute=tpm,
                input_tokens_per_minute=values["input_tokens"],
                output_tokens_per_minute=values["output_tokens"],
            )
        if rate == current:
            return False
        if current is None or current.tokens_per_minute != tpm:
            at = gate._read_clock()  # None outside a virtual clock's run: no time known
            if at is not None:
                self._paced_at = at
        if not gate._learned_rate(rate):
            return False
        self._rate = rate
        return True


def _left(dim: ReportedLimit | None) -> float | None:
    """What ``dim`` says is left in the provider's bucket, if it says (and can be synced)."""
    return None if dim is None else dim.remaining
