"""One behaviour contract over every entry point of a policy (issue 10; trio's
``generic_lock_test`` is the model).

The same tests run over ``call``, ``call_sync``, ``run``, ``run_sync``, the decorator (async
and blocking), the block forms (``attempts`` and ``attempts_sync``) and the gated transports
of both HTTP libraries (async and sync) against a real HTTP server on 127.0.0.1, so no
entry point can drift from the loop they share. An entry point that cannot take part in a
behaviour says so by a capability (a blocking call cannot be cancelled from outside; the
blocking decorator and the sync transport have no deadline of their own), and the test
skips it by that capability, not by name.

The in-process entry points call a fake provider function raising the errors the HTTP
server answers (one table, :data:`fakeprovider.ERRORS`), so the classification, and hence
the expected budgets and events, is the same for all of them. Ordering uses hooks (they
run synchronously inside the loop), events and ``anyio.wait_all_tasks_blocked`` only.
"""

from __future__ import annotations

import functools
import importlib
from collections import deque
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
import pytest

import anygate
from anygate import BreakerConfig, CallFailed, GaveUp, Policy, ResponseError, RetryConfig
from tests.integrations.fakeprovider import ERRORS, FakeProvider, serve

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

pytestmark = pytest.mark.anyio

#: Short real backoff: the transports' server runs on the real clock.
FAST = RetryConfig(base_delay_ms=1, cap_delay_ms=2)
QUICK_PAUSE = anygate.AdaptiveConfig(pause_ms=10)


class Answered(Exception):
    """A transport entry point got a final non-2xx response (the policy gave up on it)."""

    def __init__(self, response: Any) -> None:
        super().__init__(response.status_code)
        self.status: int = response.status_code
        self.headers = response.headers


def _provider_error(behaviour: str) -> ResponseError:
    status, extra, error = ERRORS[behaviour]
    headers = {k.decode(): v.decode() for k, v in extra} or None
    return ResponseError(status, headers=headers, body={"error": error})


class LocalProvider:
    """The in-process twin of :class:`FakeProvider`: the same script, the same errors."""

    def __init__(self) -> None:
        self._script: deque[str] = deque()
        self.seen: list[str] = []
        self.hung = anyio.Event()

    def script(self, *behaviours: str) -> None:
        self._script.extend(behaviours)

    def _next(self) -> str:
        behaviour = self._script.popleft() if self._script else "ok"
        self.seen.append(behaviour)
        return behaviour

    async def complete(self) -> str:
        behaviour = self._next()
        if behaviour == "hang_headers":
            self.hung.set()
            await anyio.sleep_forever()
        if behaviour in ERRORS:
            raise _provider_error(behaviour)
        return "ok"

    def complete_sync(self) -> str:
        behaviour = self._next()
        assert behaviour != "hang_headers", "a blocking call cannot be hung and cancelled"
        if behaviour in ERRORS:
            raise _provider_error(behaviour)
        return "ok"

    async def wait_hung(self) -> None:
        await self.hung.wait()


@dataclass
class Harness:
    """One entry point, open for one test: ``call`` makes one guarded call."""

    provider: LocalProvider | FakeProvider
    call: Callable[..., Awaitable[str]]
    entry: Entry

    @property
    def seen(self) -> list[str]:
        return self.provider.seen

    async def wait_hung(self) -> None:
        provider = self.provider
        if isinstance(provider, LocalProvider):
            await provider.wait_hung()
        else:
            await provider.wait_until(lambda p: "hang_headers" in p.seen)


@dataclass(frozen=True)
class Entry:
    """An entry point and what it can take part in."""

    name: str
    is_async: bool
    #: how a deadline is given: "arg" (deadline=), "scope" (an enclosing cancel scope), None
    deadline: str | None
    #: offers reraise= (else: CallFailed; the transports answer with the last response)
    reraise: bool = False
    #: gives up with CallFailed (the transports hand back the last response instead)
    call_failed: bool = True
    flavour: str | None = None
    opener: Any = field(default=None, compare=False)

    @asynccontextmanager
    async def open(self) -> AsyncIterator[Harness]:
        if self.flavour is None:
            provider = LocalProvider()
            yield Harness(provider, functools.partial(self.opener, provider), self)
            return
        lib = pytest.importorskip(self.flavour)
        gated = importlib.import_module(f"anygate.{self.flavour}")
        fake = FakeProvider()
        async with serve(fake) as url:
            yield Harness(fake, functools.partial(self.opener, lib, gated, url), self)


# ----------------------------------------------------------------------------- entry points


async def _sync(fn: Callable[..., str], *args: Any, **kwargs: Any) -> str:
    # From a worker thread: the blocking forms refuse a thread that runs an event loop.
    return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))


async def _via_call(p: LocalProvider, policy: Policy, deadline: float | None = None) -> str:
    return await policy.call(p.complete, deadline=deadline)


async def _via_call_sync(p: LocalProvider, policy: Policy, deadline: float | None = None) -> str:
    return await _sync(policy.call_sync, p.complete_sync, deadline=deadline)


async def _via_run(
    p: LocalProvider, policy: Policy, deadline: float | None = None, reraise: bool = False
) -> str:
    async def step(attempt: anygate.Attempt) -> str:
        async with await attempt.acquire():
            return await p.complete()

    return await policy.run(step, deadline=deadline, reraise=reraise)


async def _via_run_sync(
    p: LocalProvider, policy: Policy, deadline: float | None = None, reraise: bool = False
) -> str:
    def step(attempt: anygate.Attempt) -> str:
        with attempt.acquire_sync():
            return p.complete_sync()

    return await _sync(policy.run_sync, step, deadline=deadline, reraise=reraise)


async def _via_retry(p: LocalProvider, policy: Policy) -> str:
    @policy.retry
    async def complete() -> str:
        return await p.complete()

    return await complete()


async def _via_retry_sync(p: LocalProvider, policy: Policy) -> str:
    @policy.retry
    def complete() -> str:
        return p.complete_sync()

    return await _sync(complete)


async def _via_attempts(
    p: LocalProvider, policy: Policy, deadline: float | None = None, reraise: bool = False
) -> str:
    async for attempt in policy.attempts(deadline=deadline, reraise=reraise):
        async with attempt:
            return await p.complete()
    raise AssertionError("the block form ended without a result")


async def _via_attempts_sync(
    p: LocalProvider, policy: Policy, deadline: float | None = None, reraise: bool = False
) -> str:
    def blocks() -> str:
        for attempt in policy.attempts_sync(deadline=deadline, reraise=reraise):
            with attempt:
                return p.complete_sync()
        raise AssertionError("the block form ended without a result")

    return await _sync(blocks)


def _answer(response: Any) -> str:
    if response.status_code != 200:
        raise Answered(response)
    return "ok"


async def _via_transport(lib: Any, gated: Any, url: str, policy: Policy) -> str:
    transport = gated.GatedTransport(policy=policy)
    async with lib.AsyncClient(transport=transport) as client:
        return _answer(await client.post(url + "/v1/chat/completions", json={}))


async def _via_sync_transport(lib: Any, gated: Any, url: str, policy: Policy) -> str:
    def send() -> str:
        transport = gated.SyncGatedTransport(policy=policy)
        with lib.Client(transport=transport) as client:
            return _answer(client.post(url + "/v1/chat/completions", json={}))

    return await _sync(send)


def _transports() -> list[Any]:
    params = []
    for flavour in ("httpx", "httpx2"):
        for is_async, opener in ((True, _via_transport), (False, _via_sync_transport)):
            name = f"{flavour}-{'async' if is_async else 'sync'}-transport"
            entry = Entry(
                name,
                is_async,
                "scope" if is_async else None,
                call_failed=False,
                flavour=flavour,
                opener=opener,
            )
            params.append(pytest.param(entry, id=name))
    return params


ENTRIES = [
    pytest.param(Entry("call", True, "arg", opener=_via_call), id="call"),
    pytest.param(Entry("call_sync", False, "arg", opener=_via_call_sync), id="call_sync"),
    pytest.param(Entry("run", True, "arg", reraise=True, opener=_via_run), id="run"),
    pytest.param(
        Entry("run_sync", False, "arg", reraise=True, opener=_via_run_sync), id="run_sync"
    ),
    pytest.param(Entry("retry", True, "scope", opener=_via_retry), id="retry-async"),
    pytest.param(Entry("retry_sync", False, None, opener=_via_retry_sync), id="retry-sync"),
    pytest.param(Entry("attempts", True, "arg", reraise=True, opener=_via_attempts), id="attempts"),
    pytest.param(
        Entry("attempts_sync", False, "arg", reraise=True, opener=_via_attempts_sync),
        id="attempts_sync",
    ),
    *_transports(),
]


@pytest.fixture(params=ENTRIES)
def entry(request: pytest.FixtureRequest) -> Entry:
    """Run the requesting test once per entry point."""
    value: Entry = request.param
    return value


def _policy(events: list[Any], **kwargs: Any) -> Policy:
    kwargs.setdefault("retry", FAST)
    kwargs.setdefault("adaptive_concurrency", QUICK_PAUSE)
    kwargs.setdefault("gate", anygate.Gate(1, name="llm"))
    return Policy(name="llm", hooks=[events.append], **kwargs)


def _of(events: list[Any], kind: type) -> list[Any]:
    return [e for e in events if isinstance(e, kind)]


async def _call_with_deadline(h: Harness, policy: Policy, seconds: float) -> str:
    if h.entry.deadline == "arg":
        return await h.call(policy, deadline=seconds)
    assert h.entry.deadline == "scope"
    with anyio.CancelScope(deadline=anyio.current_time() + seconds):
        return await h.call(policy)
    raise AssertionError("the deadline's scope cut the call instead of the policy")


def _check_gave_up(entry: Entry, exc: BaseException, status: int, *, reraise: bool) -> None:
    """The entry point's way of saying "given up on a response with ``status``"."""
    if not entry.call_failed:
        assert isinstance(exc, Answered)
        assert exc.status == status
        # anygate retried it already: an SDK on top must not retry it again.
        assert exc.headers["x-should-retry"] == "false"
    elif reraise:
        assert isinstance(exc, ResponseError)
        assert exc.status_code == status
    else:
        assert isinstance(exc, CallFailed)
        assert isinstance(exc.__cause__, ResponseError)
        assert exc.__cause__.status_code == status


# ----------------------------------------------------------------------------- the contract


async def test_a_retriable_failure_is_retried_then_succeeds(entry: Entry) -> None:
    """Two 503s are retried (one RetryScheduled each) and the third attempt's answer comes
    back; no slot is left taken."""
    events: list[Any] = []
    policy = _policy(events)
    async with entry.open() as h:
        h.provider.script("overloaded", "overloaded")
        assert await h.call(policy) == "ok"
        assert h.seen == ["overloaded", "overloaded", "ok"]
    assert [e.attempt for e in _of(events, anygate.RetryScheduled)] == [1, 2]
    assert _of(events, GaveUp) == []
    assert policy.gate.in_flight == 0


async def test_giving_up_after_max_attempts(entry: Entry) -> None:
    """With ``max_attempts=2`` the third 503 is never asked for: GaveUp (why ``budget``)
    and the entry point's give-up answer (CallFailed, or the transport's last response)."""
    events: list[Any] = []
    policy = _policy(events, retry=RetryConfig(max_attempts=2, base_delay_ms=1, cap_delay_ms=2))
    async with entry.open() as h:
        h.provider.script("overloaded", "overloaded", "overloaded")
        with pytest.raises(Exception) as info:
            await h.call(policy)
        assert h.seen == ["overloaded", "overloaded"]
    _check_gave_up(entry, info.value, 503, reraise=False)
    (gave_up,) = _of(events, GaveUp)
    assert (gave_up.why, gave_up.attempts, gave_up.max_attempts) == ("budget", 2, 2)
    assert policy.gate.in_flight == 0


async def test_reraise_gives_the_provider_exception_itself(entry: Entry) -> None:
    """``reraise=True``: after giving up, the provider's own exception, not CallFailed
    (reported alike: GaveUp)."""
    if not entry.reraise:
        pytest.skip(f"{entry.name} has no reraise= (see the give-up test for its answer)")
    events: list[Any] = []
    policy = _policy(events, retry=RetryConfig(max_attempts=2, base_delay_ms=1, cap_delay_ms=2))
    async with entry.open() as h:
        h.provider.script("overloaded", "overloaded")
        with pytest.raises(ResponseError) as info:
            await h.call(policy, reraise=True)
    _check_gave_up(entry, info.value, 503, reraise=True)
    assert [g.why for g in _of(events, GaveUp)] == ["budget"]


async def test_a_non_retriable_failure_is_not_retried(entry: Entry) -> None:
    """A billing 429 (``insufficient_quota``) is asked once: GaveUp ``not_retriable``."""
    events: list[Any] = []
    policy = _policy(events)
    async with entry.open() as h:
        h.provider.script("quota")
        with pytest.raises(Exception) as info:
            await h.call(policy)
        assert h.seen == ["quota"]
    _check_gave_up(entry, info.value, 429, reraise=False)
    assert [g.why for g in _of(events, GaveUp)] == ["not_retriable"]


async def test_an_open_breaker_refuses_before_sending(entry: Entry) -> None:
    """After a failure opens the breaker (``when_open: fail``), the next call is refused with
    CircuitOpen (a transport's is the library's error, a CircuitOpen too), asking nothing."""
    events: list[Any] = []
    policy = _policy(
        events,
        retry=RetryConfig(max_attempts=1, base_delay_ms=1, cap_delay_ms=2),
        circuit_breaker=BreakerConfig(
            failure_threshold=1, recovery_timeout_sec=3600, when_open="fail"
        ),
    )
    async with entry.open() as h:
        h.provider.script("overloaded")
        with pytest.raises(Exception) as info:
            await h.call(policy)
        _check_gave_up(entry, info.value, 503, reraise=False)
        assert policy.breaker is not None
        assert policy.breaker.state == "open"
        with pytest.raises(anygate.CircuitOpen):
            await h.call(policy)
        assert h.seen == ["overloaded"]
    assert policy.gate.in_flight == 0


async def test_a_retry_that_would_outlast_the_deadline_gives_up_at_once(entry: Entry) -> None:
    """A ``Retry-After: 60`` within a 5 s deadline (``deadline=`` or an enclosing scope):
    no sleep at all, GaveUp ``deadline`` after one request."""
    if entry.deadline is None:
        pytest.skip(f"{entry.name} has no deadline of its own")
    events: list[Any] = []
    policy = _policy(events)
    async with entry.open() as h:
        h.provider.script("retry_after_long")
        started = anyio.current_time()
        with pytest.raises(Exception) as info:
            await _call_with_deadline(h, policy, 5.0)
        assert anyio.current_time() - started < 5.0  # gave up, did not wait
        assert h.seen == ["retry_after_long"]
    _check_gave_up(entry, info.value, 429, reraise=False)
    assert [g.why for g in _of(events, GaveUp)] == ["deadline"]


async def test_the_backoff_holds_no_slot(entry: Entry) -> None:
    """On a one-slot gate: when the retry is scheduled the slot is free (a hook takes it,
    synchronously, inside the loop), and the next attempt has to queue for it (it is handed
    back when that attempt says it waits)."""
    events: list[Any] = []
    held: list[anygate.Token] = []
    waited: list[int] = []
    gate = anygate.Gate(1, name="llm")

    def hook(event: anygate.Event) -> None:
        events.append(event)
        if isinstance(event, anygate.RetryScheduled):
            held.append(gate.acquire_nowait())  # Busy if the failed attempt still held it
        elif isinstance(event, anygate.SlotWaiting) and held:
            waited.append(event.attempt)
            held.pop().release()

    policy = Policy(
        name="llm", gate=gate, retry=FAST, adaptive_concurrency=QUICK_PAUSE, hooks=[hook]
    )
    async with entry.open() as h:
        h.provider.script("overloaded")
        assert await h.call(policy) == "ok"
    assert [e.attempt for e in _of(events, anygate.RetryScheduled)] == [1]
    assert waited == [2]
    assert gate.in_flight == 0


async def test_cancellation_ends_the_call_and_frees_its_slot(entry: Entry) -> None:
    """Cancelled while the provider has not answered: the cancellation propagates (nothing is
    retried or reported as given up), the slot comes back, the breaker heard nothing."""
    if not entry.is_async:
        pytest.skip("a blocking call cannot be cancelled from outside")
    events: list[Any] = []
    policy = _policy(events)
    async with entry.open() as h:
        h.provider.script("hang_headers")
        async with anyio.create_task_group() as tg:
            tg.start_soon(h.call, policy)
            await h.wait_hung()
            assert policy.gate.in_flight == 1
            tg.cancel_scope.cancel()
        # The task group has waited for the cancelled call to finish: its cleanup has run.
    assert tg.cancel_scope.cancel_called
    assert policy.gate.in_flight == 0
    assert _of(events, GaveUp) == []
    assert _of(events, anygate.RetryScheduled) == []
    assert policy.breaker is not None
    stats = policy.breaker.statistics()
    assert (stats.state, stats.failures) == ("closed", 0)
