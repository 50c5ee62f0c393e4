"""The strategy plug-in protocol: how any client code, built in or yours, joins a comparison.

A *strategy* is a factory: ``factory(context) -> client``. It is called once per run (one
strategy, one seed, one scenario), inside the run, so it may create AnyIO primitives. The
client makes the fleet's logical calls::

    class Client(Protocol):
        summary: str                                    # one line for the report
        async def call(self, send: Send) -> None: ...  # one logical call

``send()`` sends one request to the simulated provider and returns its answer
(:class:`~anygate.sim.ProviderResponse`: ``headers``, ``usage``) when it was served; a
rejection raises :class:`~anygate.sim.ProviderError`, shaped like the openai / anthropic SDK
errors (``status_code``, ``response.headers`` with ``retry-after`` when the provider sends
one, ``body``). ``send(on_headers=...)`` also reports when a served answer starts (its
status and headers, the time to first byte after it got a slot), as a streaming client
sees it. ``call`` returns when the logical call succeeded and raises when it gave up:
:class:`CallLost` names the cause for the report (any other exception counts under its class
name). Retries, caps, backoff, breakers: all the client's own business, on AnyIO time
(``anyio.sleep``; the simulator's clock is virtual).

The factory sees the provider only through :attr:`StrategyContext.published`, the facts the
provider's documentation states. Every built-in strategy uses this same protocol; only the
``oracle``, the yardstick, is also handed the hidden provider, and no other strategy can be.

Select your own with ``anygate simulate --strategy NAME=module:factory`` or
``strategies: {NAME: {factory: "module:factory"}}`` in a scenario file.
"""

from __future__ import annotations

import hashlib
import importlib
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import InitVar, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast, final

from .. import ConfigError

if TYPE_CHECKING:
    from ._spec import Published

__all__ = [
    "CallLost",
    "Client",
    "OnHeaders",
    "Request",
    "Send",
    "StrategyContext",
    "StrategyFactory",
    "load_factory",
]

#: Told that a served answer has started: ``on_headers(status_code, headers)``.
OnHeaders = Callable[[int, Mapping[str, str]], None]

#: Sends one request to the simulated provider: returns its
#: :class:`~anygate.sim.ProviderResponse` (headers, usage), raises ``ProviderError`` when
#: turned away. The simulator's ``send`` is a :class:`Request`.
Send = Callable[[], Awaitable[Any]]


@final
class Request:
    """The ``send`` a client is handed: call it to send, read what the caller knows.

    Attributes:
        prompt_tokens: the request's prompt size (0 without ``fleet.tokens``): a client
            knows its own prompt before sending it.
        max_tokens: the request's ``max_tokens`` (0 without ``fleet.tokens``).

    The completion's size is not here: it is known only from the answer's ``usage``.
    """

    __slots__ = ("_send", "max_tokens", "prompt_tokens")

    def __init__(
        self, send: Callable[..., Awaitable[Any]], *, prompt_tokens: int = 0, max_tokens: int = 0
    ) -> None:
        self._send = send
        self.prompt_tokens: int = prompt_tokens
        self.max_tokens: int = max_tokens

    def __call__(self, *, on_headers: OnHeaders | None = None) -> Awaitable[Any]:
        """Send the request once.

        Args:
            on_headers: called as ``on_headers(status_code, headers)`` when a served
                answer starts: its status and headers arrive (and a stream's first
                bytes) a time to first byte after it got a slot, while the generation
                runs on until ``send()`` returns. What a streaming client sees, and when;
                a rejection is only the raised error. ``None``: not told.
        """
        if on_headers is None:
            return self._send()
        return self._send(on_headers=on_headers)


class Client(Protocol):
    """What a strategy factory returns: makes one logical call at a time (many concurrently)."""

    @property
    def summary(self) -> str:
        """One line saying what the strategy does (shown under the report's table)."""
        ...

    async def call(self, send: Send) -> None:
        """Make one logical call with ``send``; return on success, raise to give up."""
        ...


class CallLost(Exception):
    """Raised by a client when a logical call is lost for good; ``cause`` names why.

    Args:
        cause: a short snake_case reason shown in the report (``gave_up``, ``busy``, ...).
    """

    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause


@dataclass(frozen=True)
class StrategyContext:
    """What a strategy factory is given for one run.

    Args:
        seed: the run's seed. It is not kept: the provider's, the workload's and trio's
            draws are seeded from it, so a strategy holding it could rebuild them (issue
            29). The context keeps only a one-way digest of it, for :meth:`rng`.

    Attributes:
        name: the strategy's name in this comparison.
        published: the provider's published facts (rpm, concurrency, token limits); the
            only provider facts a strategy gets.
        call_deadline_s: the fleet's per-call deadline (``None``: none); the simulator
            already enforces it around each call, a client may also use it.
    """

    name: str
    published: Published
    seed: InitVar[int]
    call_deadline_s: float | None = None
    _stats: object = field(default=None, repr=False, compare=False)
    _stream: str = field(init=False, repr=False, compare=False)

    def __post_init__(self, seed: int) -> None:
        # A digest under its own label, so no stream the simulator draws from (provider,
        # workload, trio) is reachable from it. (In-process code can always search the
        # few seeds a benchmark uses; the rule "published facts only" forbids it, and no
        # built-in strategy reads anything but ``rng``.)
        digest = hashlib.sha256(f"anygate.sim:{seed}:client-stream".encode()).hexdigest()
        object.__setattr__(self, "_stream", digest)

    def rng(self, purpose: str = "") -> random.Random:
        """A ``random.Random`` seeded from the run and ``purpose``, never the global one.

        The stream does not depend on the strategy's name, so two strategies with equal
        settings draw equal numbers (their results are then equal too), and it is
        independent of every stream the provider and the workload draw from.
        """
        return random.Random(f"anygate.sim:client:{self._stream}:{purpose}")


#: Builds a client for one run.
StrategyFactory = Callable[[StrategyContext], Client]


def load_factory(target: str, *, where: str) -> StrategyFactory:
    """Import ``"module:attribute"`` (dots allowed in the attribute) and return it.

    Raises:
        ConfigError: malformed target, module or attribute not found, not callable.
    """
    module_name, sep, attribute = target.partition(":")
    if not sep or not module_name or not attribute:
        msg = f"{where} must be 'module:attribute' (got {target!r})"
        raise ConfigError(msg, path=where, value=target)
    try:
        obj: object = importlib.import_module(module_name)
        for part in attribute.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        msg = f"{where}: cannot load {target!r}: {exc}"
        raise ConfigError(msg, path=where, value=target) from exc
    if not callable(obj):
        msg = f"{where} must name a callable factory (got {target!r}: {type(obj).__name__})"
        raise ConfigError(msg, path=where, value=target)
    return cast("StrategyFactory", obj)
