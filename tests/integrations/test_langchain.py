"""anygate.langchain: real ``create_agent`` graphs whose ``ChatOpenAI`` talks to the fake provider.

Nothing is mocked: LangChain builds the graph, langchain-openai drives the real openai SDK,
which talks HTTP to hypercorn on 127.0.0.1 (served by the test's own event loop, on
asyncio, uvloop or trio). The graphs run in worker threads, each on its own path: the sync
one (``agent.invoke``, LangChain's ``wrap_model_call``) or the async one (``agent.ainvoke``,
``awrap_model_call``) on a fresh asyncio or uvloop loop per thread. LangChain's async path is
asyncio-only (langgraph calls ``asyncio.get_running_loop()``: under trio ``ainvoke`` raises
"no running event loop"), so no graph runs on trio; on the trio backend trio serves the
provider to the graphs' threads.
"""

from __future__ import annotations

import asyncio
import importlib
import sys
import threading
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.to_thread
import httpx2
import pytest

import anygate
from tests.integrations.fakeprovider import CHUNKS, FakeProvider, serve

pytest.importorskip("langchain", reason="anygate.langchain needs langchain >= 1.0 (Python 3.11+)")
pytest.importorskip("langchain_openai", reason="the tests drive langchain-openai's ChatOpenAI")

from langchain.agents import create_agent
from langchain_openai import ChatOpenAI
from langgraph.errors import GraphInterrupt

from anygate.langchain import STREAM_EVENT_TYPE, PolicyMiddleware, stream_events

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

pytestmark = pytest.mark.anyio
T = TypeVar("T")

ANSWER = "".join(CHUNKS)
WAIT_S = 30  # a ceiling for cross-thread waits, never reached when the code is right
QUESTION = {"messages": [{"role": "user", "content": "hi"}]}


def _agent(url: str, middleware: PolicyMiddleware, http: Any) -> Any:
    """A graph whose model sends through ``http`` (the caller closes it on its own loop:
    langchain-openai's default clients are cached process-wide and would outlive the
    per-thread loops, leaving their sockets to the garbage collector)."""
    # max_retries=0: the SDK must not retry on its own, or its sleeps would hold the slot
    # and the policy would never see the 429.
    client = (
        {"http_async_client": http}
        if isinstance(http, httpx2.AsyncClient)
        else {"http_client": http}
    )
    model = ChatOpenAI(model="m", base_url=f"{url}/v1", api_key="sk-test", max_retries=0, **client)
    return create_agent(model, tools=[], middleware=[middleware])


def _on_loop(path: str, main: Callable[[httpx2.AsyncClient], Awaitable[T]]) -> T:
    """Run ``main(client)`` on a fresh asyncio (or uvloop) loop in this thread."""

    async def scoped() -> T:
        async with httpx2.AsyncClient() as http:
            return await main(http)

    if path == "uvloop":
        return pytest.importorskip("uvloop").run(scoped())
    return asyncio.run(scoped())


def _answer(state: dict[str, Any]) -> str:
    return str(state["messages"][-1].content)


def _run_graph(path: str, url: str, middleware: PolicyMiddleware) -> str:
    """Run one graph to its answer in this (worker) thread, on ``path``."""
    if path == "sync":
        with httpx2.Client() as http:
            return _answer(_agent(url, middleware, http).invoke(QUESTION))

    async def main(http: httpx2.AsyncClient) -> str:
        return _answer(await _agent(url, middleware, http).ainvoke(QUESTION))

    return _on_loop(path, main)


class Counter:
    """Counts events of one type from any thread; :meth:`wait` blocks until ``target``."""

    def __init__(self, kind: type, target: int) -> None:
        self.kind = kind
        self.target = target
        self.seen = 0
        self._lock = threading.Lock()
        self._reached = threading.Event()

    def __call__(self, event: anygate.Event) -> None:
        if isinstance(event, self.kind):
            with self._lock:
                self.seen += 1
                if self.seen >= self.target:
                    self._reached.set()

    async def wait(self) -> None:
        reached = await anyio.to_thread.run_sync(self._reached.wait, WAIT_S)
        assert reached, f"only {self.seen} of {self.target} {self.kind.__name__} events"


async def _in_threads(jobs: list[Callable[[], str]]) -> list[str]:
    results: list[str] = []

    async def one(job: Callable[[], str]) -> None:
        results.append(await anyio.to_thread.run_sync(job, abandon_on_cancel=True))

    async with anyio.create_task_group() as tg:
        for job in jobs:
            tg.start_soon(one, job)
    return results


async def test_graphs_on_many_loops_share_one_cap() -> None:
    """Nine graphs (three sync, three on asyncio loops, three on uvloop loops, each in its
    own thread) meet the provider at most 3 at a time.

    The provider holds each answer mid-body, so the first three calls stay in flight; the
    test lets them finish only once the other six found the gate full (one SlotWaiting
    event each). Without the middleware, nine requests would reach the provider at once and
    no SlotWaiting would come (the wait then fails after its ceiling).
    """
    provider = FakeProvider()
    provider.hold()
    waiting = Counter(anygate.SlotWaiting, 6)
    policy = anygate.Policy(
        name="lc-cap",
        max_concurrent_calls=3,
        adaptive_concurrency=False,
        circuit_breaker=False,
        logging_hook=None,
        hooks=[waiting],
    )
    middleware = PolicyMiddleware(policy)
    paths = ["sync", "asyncio", "uvloop"] * 3
    async with serve(provider) as url:
        async with anyio.create_task_group() as tg:
            results: list[str] = []

            async def graphs() -> None:
                jobs = [lambda p=p: _run_graph(p, url, middleware) for p in paths]
                results.extend(await _in_threads(jobs))

            tg.start_soon(graphs)
            await waiting.wait()
            await provider.wait_until(lambda p: p.active == 3)
            # Not gate.statistics().waiting == 6: SlotWaiting is emitted just before its
            # caller enters the queue, so the last one may not be counted there yet. Each
            # event already says its caller found the gate full.
            provider.unhang()
    assert results == [ANSWER] * 9
    assert provider.requests == 9
    assert provider.max_active == 3
    assert policy.gate.in_flight == 0


@pytest.mark.parametrize("path", ["sync", "asyncio", "uvloop"])
async def test_throttle_is_retried_without_holding_the_slot(path: str) -> None:
    """A 429 is retried by the policy (not the SDK), and no slot is held during the backoff.

    The hook reads the gate when the retry is scheduled, i.e. before the backoff sleep: the
    failed attempt's slot must already be back (in_flight 0 with cap 1). The graph's custom
    stream carries the retry for a UI.
    """
    provider = FakeProvider()
    provider.script("retry_after")
    during_backoff: list[int] = []
    policy: anygate.Policy

    def hook(event: anygate.Event) -> None:
        if isinstance(event, anygate.RetryScheduled):
            during_backoff.append(policy.gate.in_flight)

    policy = anygate.Policy(
        name="lc-429",
        max_concurrent_calls=1,
        circuit_breaker=False,
        logging_hook=None,
        hooks=[hook, stream_events],
    )
    middleware = PolicyMiddleware(policy)

    def run(url: str) -> tuple[str, list[Any]]:
        custom: list[Any] = []
        state: dict[str, Any] = {}

        def collect(mode: str, chunk: Any) -> None:
            if mode == "custom":
                custom.append(chunk)
            else:
                state.update(chunk)

        if path == "sync":
            with httpx2.Client() as http:
                agent = _agent(url, middleware, http)
                for mode, chunk in agent.stream(QUESTION, stream_mode=["custom", "values"]):
                    collect(mode, chunk)
        else:

            async def main(http: httpx2.AsyncClient) -> None:
                agent = _agent(url, middleware, http)
                async for mode, chunk in agent.astream(QUESTION, stream_mode=["custom", "values"]):
                    collect(mode, chunk)

            _on_loop(path, main)
        return _answer(state), custom

    async with serve(provider) as url:
        answer, custom = await anyio.to_thread.run_sync(run, url)
    assert answer == ANSWER
    assert provider.seen == ["retry_after", "ok"]
    assert provider.retry_counts == ["0", "0"]  # two policy attempts, no SDK retry
    assert during_backoff == [0]
    assert [(c["type"], c["event"], c["attempt"], c["reason"]) for c in custom] == [
        (STREAM_EVENT_TYPE, "retry", 1, "transient")
    ]
    assert policy.gate.in_flight == 0


@pytest.mark.parametrize("reraise", [False, True])
async def test_deer_flow_config_keys_and_give_up_as_message(reraise: bool) -> None:
    """deer-flow's ``llm_call`` / ``circuit_breaker`` keys build the policy as they are;
    with ``on_failure="continue"`` a call that fails for good ends the model step with the
    user-safe wording instead of an exception (ModelRetryMiddleware's behaviour), also when
    ``reraise`` makes the give-up the SDK's own exception."""
    provider = FakeProvider()
    provider.script("unauthorized")
    middleware = PolicyMiddleware(
        config={
            "llm_call": {
                "name": "deerflow",
                "max_concurrent_calls": 2,
                "retry_max_attempts": 3,
                "retry_base_delay_ms": 1000,
                "retry_cap_delay_ms": 8000,
                "burst_retry_base_delay_ms": 5000,
                "reraise": reraise,
            },
            "circuit_breaker": {"failure_threshold": 5, "recovery_timeout_sec": 60},
        },
        on_failure="continue",
    )
    policy = middleware.policy
    assert (policy.name, policy.max_concurrent_calls) == ("deerflow", 2)
    assert "GraphBubbleUp" in policy.config.control_flow
    async with serve(provider) as url:
        answer = await anyio.to_thread.run_sync(_run_graph, "sync", url, middleware)
    assert provider.seen == ["unauthorized"]  # not retriable: asked once
    assert "authentication" in answer  # CallFailed.user_message, redacted wording


def test_bad_arguments_are_named() -> None:
    policy = anygate.Policy(name="lc-bad", circuit_breaker=False, logging_hook=None)
    with pytest.raises(TypeError, match="policy or config, not both"):
        PolicyMiddleware(policy, config={})
    with pytest.raises(TypeError, match=r"policy must be an anygate.Policy \(got dict\)"):
        PolicyMiddleware({})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"on_failure must be 'error' or 'continue' \(got 'x'\)"):
        PolicyMiddleware(policy, on_failure="x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="deadline_s"):
        PolicyMiddleware(policy, deadline_s=-1)
    with pytest.raises(anygate.ConfigError, match=r"llm_call\.retry_max_attempts"):
        PolicyMiddleware(config={"llm_call": {"retry_max_attempts": 0}})


def _interrupting(calls: list[int]) -> Callable[[Any], Any]:
    def handler(request: Any) -> Any:
        calls.append(1)
        raise GraphInterrupt(())

    return handler


def _middlewares() -> list[PolicyMiddleware]:
    mine = anygate.Policy(name="lc-own", logging_hook=None)
    return [PolicyMiddleware(config={"llm_call": {"name": "lc-config"}}), PolicyMiddleware(mine)]


def test_interrupts_pass_through_once_sync() -> None:
    """A LangGraph interrupt from the model step is asked once and re-raised as it is, by
    a policy built from config (GraphBubbleUp is its control flow) and by the user's own,
    and leaves the breaker alone."""
    for middleware in _middlewares():
        calls: list[int] = []
        with pytest.raises(GraphInterrupt):
            middleware.wrap_model_call(object(), _interrupting(calls))  # type: ignore[arg-type]
        assert calls == [1]
        breaker = middleware.policy.breaker
        assert breaker is not None
        assert breaker.statistics().failures == 0


async def test_interrupts_pass_through_once_async() -> None:
    """The same on the async hook, which itself runs on any backend (trio included)."""
    for middleware in _middlewares():
        calls: list[int] = []
        handler = _interrupting(calls)

        async def ahandler(request: Any, handler: Callable[[Any], Any] = handler) -> Any:
            return handler(request)

        with pytest.raises(GraphInterrupt):
            await middleware.awrap_model_call(object(), ahandler)  # type: ignore[arg-type]
        assert calls == [1]


def test_missing_langchain_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without LangChain the import names the extra and the Python floor (on 3.10 the extra
    installs nothing)."""
    monkeypatch.setitem(sys.modules, "langchain.agents.middleware", None)
    monkeypatch.delitem(sys.modules, "anygate.langchain")
    with pytest.raises(
        ImportError,
        match=r"LangChain >= 1\.0 on Python 3\.11\+: pip install 'anygate\[langchain\]'",
    ):
        importlib.import_module("anygate.langchain")
