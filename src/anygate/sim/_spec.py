"""What a scenario is: frozen value objects for the provider, the fleet and the strategies.

A scenario describes one provider, one fleet of agents and the strategies to compare.
``_parse`` builds these objects from YAML or a mapping, validating every key; the objects
themselves only hold values (and their defaults), so the rest of the simulator can take
them as given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

__all__ = [
    "BUILTIN_STRATEGIES",
    "DEFAULT_STRATEGIES",
    "BurstRule",
    "FanOut",
    "FleetSpec",
    "Lognormal",
    "NaiveSpec",
    "Outage",
    "ProviderSpec",
    "Published",
    "Scenario",
    "SharedPool",
    "StrategySpec",
    "TokenLimits",
    "TokenSpec",
]

#: Every built-in strategy, in display order (each selectable with ``--only``).
BUILTIN_STRATEGIES = (
    "naive",
    "sdk",
    "sdk+cap",
    "cookbook",
    "cookbook+cap",
    "stamina",
    "stamina+cap",
    "litellm",
    "litellm+limits",
    "cookbook-parallel",
    "seed",
    "anygate",
    "oracle",
)

#: What a run compares unless told otherwise (``--only all`` for every built-in). The
#: uncapped ``cookbook`` and ``stamina`` are left out only to keep the default run a few
#: seconds: their retry storms cost the most CPU (they are in every benchmark run), and
#: ``cookbook-parallel`` (a batch script, issue 29's token peer) to keep it unchanged.
DEFAULT_STRATEGIES = tuple(
    s for s in BUILTIN_STRATEGIES if s not in ("cookbook", "stamina", "cookbook-parallel")
)


# ---------------------------------------------------------------------- value objects


@dataclass(frozen=True, kw_only=True)
class Lognormal:
    """A lognormal duration in seconds: ``median_s * exp(sigma * N(0, 1))``, clipped.

    ``sigma = 0`` gives the constant ``median_s``. Lognormal because LLM response times are
    skewed: most calls are near the median, a few take several times longer.
    """

    median_s: float
    sigma: float = 0.0
    min_s: float = 0.0
    max_s: float = math.inf


@dataclass(frozen=True, kw_only=True)
class BurstRule:
    """The slope throttle: requests admitted per window may grow at most ``growth``-fold.

    Windows are fixed, ``[k * window_s, (k + 1) * window_s)``. Window ``k`` admits at most
    ``max(floor, floor(growth * admitted(k - 1)))`` requests; the rest get HTTP 429
    ``limit_burst_rate``. ``floor`` is what a quiet account may always send.
    """

    window_s: float
    growth: float
    floor: int
    #: Dynamic threshold: when set, the growth factor of window ``k`` drifts as a random walk
    #: within ``[growth_min, growth_max]`` (step drawn uniformly from ``[-drift, drift]``
    #: per window), the same path for every strategy of one seed. ``growth`` is the start.
    growth_min: float | None = None
    growth_max: float | None = None
    drift: float = 0.0
    #: Count every arrival toward the slope, rejected ones included (``False``: only
    #: admitted requests count, as before).
    count_rejected: bool = False

    @property
    def dynamic(self) -> bool:
        """Whether the growth factor drifts."""
        return self.growth_min is not None and self.growth_max is not None and self.drift > 0

    @property
    def highest_growth(self) -> float:
        """The largest growth factor any window can have (for the lower bound)."""
        return self.growth_max if self.dynamic and self.growth_max is not None else self.growth


@dataclass(frozen=True, kw_only=True)
class Outage:
    """A window ``[start_s, end_s)`` in which every new request gets 503 "overloaded"."""

    start_s: float
    end_s: float


@dataclass(frozen=True, kw_only=True)
class ProviderSpec:
    """The simulated provider (or model server).

    Attributes:
        slots: requests served at once.
        on_full: ``"reject"`` answers a request that finds every slot busy with 429;
            ``"queue"`` makes it wait in FIFO order (a local model server).
        max_queue: with ``on_full="queue"``, requests beyond this many waiting get 503
            "server busy" (``None``: unbounded).
        rpm: requests admitted per sliding 60 s window (``None``: no limit).
        burst: the slope rule (``None``: none).
        retry_after: Retry-After sent with 429s: seconds, ``"auto"`` (the time until the
            violated rule would admit again) or ``None`` (no header).
        latency: service time of an admitted request.
        reject_latency: how long a 429/503 answer takes to arrive.
        outages: windows in which the provider answers 503.
        shared_pool: random throttles from other tenants (``None``: none).
        tokens: request and token buckets with continuous refill (``None``: none).
        headers: the rate-limit headers sent on every response: ``"openai"``
            (``x-ratelimit-*``), ``"anthropic"`` (``anthropic-ratelimit-*``, and outages
            answer 529 ``overloaded_error``) or ``"none"``.
        plain_429: every 429 says only "Too Many Requests": no code or wording names the
            limit that was hit.
    """

    slots: int = 32
    on_full: Literal["reject", "queue"] = "reject"
    max_queue: int | None = None
    rpm: int | None = None
    burst: BurstRule | None = None
    retry_after: float | Literal["auto"] | None = None
    latency: Lognormal = field(default_factory=lambda: Lognormal(median_s=2.0, sigma=0.5))
    reject_latency: Lognormal = field(
        default_factory=lambda: Lognormal(median_s=0.05, sigma=0.5, max_s=1.0)
    )
    outages: tuple[Outage, ...] = ()
    shared_pool: SharedPool | None = None
    tokens: TokenLimits | None = None
    headers: Literal["none", "openai", "anthropic"] = "none"
    plain_429: bool = False


@dataclass(frozen=True, kw_only=True)
class TokenLimits:
    """Per-minute limits enforced as token buckets with continuous refill.

    OpenAI and Anthropic both document their limits this way: a bucket of ``limit``
    units refilled at ``limit / 60`` per second, so capacity comes back gradually rather
    than at a minute boundary. A request is admitted only when every bucket holds what it
    costs: 1 request; ``prompt + max_tokens`` tokens (``tpm``: OpenAI counts the
    request's ``max_tokens`` at admission and, like Azure OpenAI, refunds nothing);
    ``prompt`` input tokens (``itpm``); ``max_tokens`` output tokens (``otpm``, settled to
    the real completion size when the answer ends, as Anthropic documents).

    Attributes:
        rpm: requests per minute (``None``: no request bucket).
        tpm: total tokens per minute (OpenAI's TPM).
        itpm: input tokens per minute (Anthropic's ITPM).
        otpm: output tokens per minute (Anthropic's OTPM).
        capacity_s: how many seconds of refill a bucket holds: 60 (a full minute's budget,
            full at the start) or less for a provider that enforces a per-minute limit over
            shorter intervals (OpenAI: "60,000 TPM may be enforced as 1,000 tokens per
            second"; Azure OpenAI: 1 s or 10 s intervals).
        charge_rejected: a request turned away by a bucket still takes one request from
            the request bucket (OpenAI: "unsuccessful requests contribute to your
            per-minute limit").
        background: the share of every bucket's refill another service on the same API
            key spends, steadily (``0 <= background < 1``); the client sees it only in
            the headers' ``remaining`` and in its 429s.
        rule: ``"buckets"`` (the above) or ``"azure"``: Azure OpenAI's quota, a ``tpm``
            per deployment with RPM at 6 per 1,000 TPM, the requests evaluated over a
            sliding ``interval_s`` (at most ``ceil(RPM * interval_s / 60)`` in any
            ``interval_s``) and the tokens (prompt + ``max_tokens``, at admission) over a
            sliding 60 s (see :class:`~anygate.sim._buckets.AzureWindows`). Only ``tpm``
            and ``interval_s`` apply then.
        interval_s: Azure's request interval: 10 (stuartleeks/aoai-simulated-api) or 1
            (Azure OpenAI's docs: "typically 1 or 10 seconds").
    """

    rpm: int | None = None
    tpm: int | None = None
    itpm: int | None = None
    otpm: int | None = None
    capacity_s: float = 60.0
    charge_rejected: bool = False
    background: float = 0.0
    rule: Literal["buckets", "azure"] = "buckets"
    interval_s: float = 10.0


@dataclass(frozen=True, kw_only=True)
class TokenSpec:
    """The size of each call in tokens, drawn once per seed like its service time.

    Sizes are lognormal (the ``median_s`` / ``min_s`` / ``max_s`` fields of
    :class:`Lognormal` hold token counts here) and rounded to whole tokens.

    Attributes:
        prompt: the prompt's size (a chain's first call; with ``grow`` every later call).
        completion: the answer's size, at most ``max_tokens``.
        max_tokens: the request's ``max_tokens`` (what a provider reserves at admission).
        grow: each later call of a chain sends the whole conversation so far: the
            previous prompt and completion plus a newly drawn prompt (an agent loop).
    """

    prompt: Lognormal
    completion: Lognormal
    max_tokens: int
    grow: bool = False


@dataclass(frozen=True, kw_only=True)
class SharedPool:
    """Other tenants on a shared pool: a random share of arrivals is turned away, whatever
    this client sends.

    Each arrival outside an outage is turned away with ``probability``, drawn from its own
    random stream (the run's seed), before any other rule; such a request counts toward no
    limit (unless the burst rule counts rejected arrivals). No client can avoid these
    answers: the scenario tests that a strategy does not mistake noise for its own excess
    (a rate it cuts at every throttle ends at its floor). ``kind`` is the answer: a
    ``limit_burst_rate`` 429 (``"burst"``), a per-minute 429 (``"rpm"``) or a 503
    overload (``"overloaded"``).
    """

    probability: float
    kind: Literal["burst", "rpm", "overloaded"] = "burst"


@dataclass(frozen=True, kw_only=True)
class Published:
    """What a client could know about the provider from its published documentation.

    The only provider facts a strategy is given (:class:`~anygate.sim.StrategyContext`);
    everything else in :class:`ProviderSpec` is hidden, as a real provider's limiter is.

    Attributes:
        rpm: the published requests-per-minute limit (``None``: not published).
        concurrency: the published number of requests served at once (a local model
            server's slot count; hosted providers rarely publish one).
        tpm: the published tokens-per-minute limit.
        itpm: the published input-tokens-per-minute limit.
        otpm: the published output-tokens-per-minute limit.
    """

    rpm: int | None = None
    concurrency: int | None = None
    tpm: int | None = None
    itpm: int | None = None
    otpm: int | None = None


@dataclass(frozen=True, kw_only=True)
class FanOut:
    """After lead call number ``after_call``, ``subagents`` subagents each make ``calls``."""

    after_call: int
    subagents: int
    calls: int


@dataclass(frozen=True, kw_only=True)
class FleetSpec:
    """The agents and the chains of calls they make.

    Attributes:
        agents: lead agents.
        ramp_s: agent ``i`` starts at ``i * ramp_s / agents`` (0: all together).
        start_jitter_s: plus a uniform random offset in ``[0, start_jitter_s)``, so no two
            agents start at the very same instant (real fleets never do, and distinct
            instants keep the simulation independent of the scheduler's tie-breaking).
        calls_per_agent: sequential calls in each lead agent's chain.
        think: time between consecutive calls of one chain (tool use); ``None``: none.
        fanout: optional subagents spawned mid-chain.
        call_deadline_s: passed to the strategy as each call's deadline (``None``: none).
        on_failure: ``"stop"``: a chain whose call failed for good makes no further calls
            (an agent turn ends on an error); ``"continue"``: it goes on to its next call.
        tokens: each call's prompt, ``max_tokens`` and completion sizes (``None``: calls
            carry no tokens, and token buckets are not allowed).
    """

    agents: int = 100
    ramp_s: float = 0.0
    start_jitter_s: float = 0.05
    calls_per_agent: int = 5
    think: Lognormal | None = None
    fanout: FanOut | None = None
    call_deadline_s: float | None = None
    on_failure: Literal["stop", "continue"] = "stop"
    tokens: TokenSpec | None = None

    @property
    def total_calls(self) -> int:
        """Calls the whole fleet makes: lead chains plus every subagent chain."""
        per_agent = self.calls_per_agent
        if self.fanout is not None:
            per_agent += self.fanout.subagents * self.fanout.calls
        return self.agents * per_agent


@dataclass(frozen=True, kw_only=True)
class NaiveSpec:
    """Retry without cap or jitter: wait ``min(max_delay_s, base_delay_s * factor**(n-1))``.

    Every 429, 5xx and connection error is retried, up to ``max_attempts`` attempts in all.
    """

    base_delay_s: float = 1.0
    factor: float = 2.0
    max_delay_s: float = 60.0
    max_attempts: int = 10


@dataclass(frozen=True, kw_only=True)
class StrategySpec:
    """One strategy to compare.

    At most one of ``naive``, ``policy`` and ``factory`` is set; none means a built-in
    peer (``sdk``, ``litellm``, ``oracle``, ...) found by name. ``policy`` is an anygate policy
    config mapping (the keys of ``config.example.yaml``); for the built-in ``seed`` and
    ``anygate`` strategies it holds the overrides to merge over the built-in config, and
    ``replace`` says the mapping is complete (a user's ``--config``) instead. ``factory``
    is a user's strategy factory (see :class:`~anygate.sim.StrategyContext`): the
    factory itself, or ``"module:attribute"`` (what ``--strategy`` and scenario files give;
    a sweep's worker processes need that form).
    """

    name: str
    naive: NaiveSpec | None = None
    policy: Mapping[str, Any] | None = None
    factory: str | Callable[[Any], Any] | None = None
    replace: bool = False
    source: str = "built-in"
    #: Built-in ``seed`` / ``anygate``: take ``max_concurrent_calls`` from the scenario's
    #: published concurrency when it publishes one.
    from_published: bool = False
    #: Built-in ``anygate``: also pace to the published RPM (``requests_per_minute``, the
    #: gate's rate admission). ``seed`` does not: deer-flow's limiter has no rate.
    paces_published_rpm: bool = False
    #: A user's ``--config`` for ``anygate``: the published facts fill only the keys the
    #: file leaves out, and the run says what the file changes against the built-in.
    user_file: bool = False
    #: A policy strategy accepts each attempt when its answer starts (status and headers,
    #: before the generation ends; :meth:`anygate.Attempt.accepted`), as the library's
    #: gated transports do. Not the built-in ``seed``: deer-flow's breaker hears of a call
    #: only when it ends.
    accepts: bool = True


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """A whole simulation: provider, fleet, strategies, seed.

    Attributes:
        name: shown in reports.
        description: one paragraph saying what the scenario reproduces.
        seed: default random seed (the command line may override it).
        time_limit_s: virtual-time safety stop; calls unfinished by then count as failed.
        provider: the provider model.
        fleet: the agents.
        published: what the provider's docs say; the only provider facts strategies see.
        strategies: extra strategies and overrides of the built-in ones, by name.
    """

    name: str = "unnamed"
    description: str = ""
    seed: int = 1
    time_limit_s: float = 3600.0
    provider: ProviderSpec = field(default_factory=ProviderSpec)
    fleet: FleetSpec = field(default_factory=FleetSpec)
    published: Published = field(default_factory=Published)
    strategies: tuple[StrategySpec, ...] = ()
