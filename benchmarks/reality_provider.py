"""The simulator's provider behind real HTTP: OpenAI's ``/v1/chat/completions`` on 127.0.0.1.

The fake provider of ``reality_check.py``. It is the simulator's own rule code,
:class:`anygate.sim._provider.ProviderModel` (token buckets from ``sim/_buckets.py``, the
``x-ratelimit-*`` headers and the 429 wording from ``sim/_answers.py``, Retry-After as
integer seconds with ``retry-after-ms`` beside it), served as a raw ASGI app by hypercorn,
so both runs of the reality check enforce the very same rules and send the very same
headers and bodies. Only the transport differs: real sockets, HTTP/1.1, JSON, and the real
openai SDK on the other side.

What a request costs is read from the request, as a provider reads it: the prompt is
``ceil(characters / 4)`` of the messages' text (the chars counter that
:func:`anygate.estimate_tokens` uses by default, so the client's estimate of the prompt is
exact, as it is in the simulator) and ``max_tokens`` comes from the body. What only the
provider knows, how long the call takes to serve and how long its answer is, comes from
the simulator's workload draw for the call the ``x-sim-call`` request header names (the
SDK sends it with ``extra_headers``), so both runs serve the same work.

Time: the model reads ``anyio.current_time()`` and sleeps with ``anyio.sleep``. Run it in
``trio.run(..., clock=trio.testing.MockClock(rate=SCALE))`` and every duration of the model
(service times, reject latencies, bucket refill, the Retry-After it computes) is virtual
time running ``SCALE`` times faster than the wall clock; see ``reality_check.py``.

Control endpoints (not OpenAI's): ``POST /sim/reset`` starts a fresh provider (full buckets,
time 0 = now); ``GET /sim/trace`` returns what the provider saw since (responses by kind,
tokens served, most requests in service at once).
"""

from __future__ import annotations

import json
import math
import random
import socket
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

import anyio

from anygate.sim._provider import ProviderError, ProviderModel
from anygate.sim._workload import build_workload

if TYPE_CHECKING:
    from anygate.sim import Scenario

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

#: Characters per prompt token, on both sides (anygate's default ``chars_counter``).
CHARS_PER_TOKEN = 4


def prompt_text(tokens: int) -> str:
    """A prompt the provider (and anygate's default estimate) counts as ``tokens`` tokens."""
    return "x" * (tokens * CHARS_PER_TOKEN)


def _prompt_tokens(doc: dict[str, Any]) -> int:
    texts = [
        m["content"]
        for m in doc.get("messages", ())
        if isinstance(m, dict) and isinstance(m.get("content"), str)
    ]
    return math.ceil(len("\n".join(texts)) / CHARS_PER_TOKEN)


class SimulatedOpenAI:
    """An ASGI app answering chat completions with the simulator's provider model.

    Args:
        scenario: the provider's rules and the fleet whose workload gives each call its
            service time and completion size.
        seed: seeds the workload and the provider's reject latencies as the simulator
            seeds them.
    """

    def __init__(self, scenario: Scenario, seed: int) -> None:
        self._scenario = scenario
        self._seed = seed
        self._calls = build_workload(scenario.fleet, scenario.provider, seed).calls
        self._provider: ProviderModel | None = None
        #: The server loop's lag since the last reset (see :func:`watch_lag`).
        self.lag: list[float] = []

    def reset(self) -> None:
        """A fresh provider: full buckets, nothing in service, time 0 is now."""
        seed = self._seed
        self._provider = ProviderModel(
            self._scenario.provider,
            random.Random(f"anygate.sim:{seed}:provider"),
            epoch=anyio.current_time(),
            growth_rng=random.Random(f"anygate.sim:{seed}:burst-growth"),
            pool_rng=random.Random(f"anygate.sim:{seed}:shared-pool"),
        )
        self.lag.clear()

    def trace(self) -> dict[str, Any]:
        """What the provider saw since the last reset."""
        if self._provider is None:
            return {}
        trace = self._provider.trace
        return {
            "counts": trace.counts,
            "tokens": trace.tokens,
            "admitted": trace.admitted,
            "max_in_service": trace.max_in_service,
            "lag": lag_summary(self.lag),
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        body = await _read_body(receive)
        path = scope["path"]
        if path == "/sim/reset":
            self.reset()
            await _respond(send, 200, {}, {"ok": True})
        elif path == "/sim/trace":
            await _respond(send, 200, {}, self.trace())
        elif path == "/v1/chat/completions":
            await self._complete(scope, body, send)
        else:
            await _respond(send, 404, {}, {"error": {"message": f"no route {path}"}})

    async def _complete(self, scope: Scope, body: bytes, send: Send) -> None:
        if self._provider is None:
            self.reset()
        provider = self._provider
        assert provider is not None
        doc = json.loads(body)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        call = self._calls[int(headers["x-sim-call"])]
        prompt = _prompt_tokens(doc)
        max_tokens = int(doc.get("max_completion_tokens") or doc.get("max_tokens") or 0)
        try:
            answer = await provider.serve(
                call.service_s, prompt, max_tokens, call.completion_tokens
            )
        except ProviderError as exc:
            await _respond(send, exc.status_code, exc.headers, exc.body)
            return
        completion = {
            "id": f"chatcmpl-sim-{call.index}",
            "object": "chat.completion",
            "created": 0,
            "model": doc.get("model", "gpt-sim"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "ok"},
                    "finish_reason": "stop",
                }
            ],
            "usage": answer.usage,
        }
        await _respond(send, 200, answer.headers, completion)


async def _respond(send: Send, status: int, headers: dict[str, str], doc: object) -> None:
    payload = json.dumps(doc).encode()
    raw = [(b"content-type", b"application/json")]
    raw += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": payload, "more_body": False})


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _read_body(receive: Receive) -> bytes:
    body = b""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return body
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


#: How often the loop-lag watcher wakes, in virtual seconds.
LAG_PERIOD_S = 0.05


async def watch_lag(samples: list[float]) -> None:
    """Record, every :data:`LAG_PERIOD_S`, how late a sleep ended, in virtual seconds.

    The distortion of a scaled run in one number: a loop that wakes 1 ms (wall) late at
    ``SCALE`` 20 is 20 ms late in virtual time, on every timer it runs.
    """
    while True:
        before = anyio.current_time()
        await anyio.sleep(LAG_PERIOD_S)
        samples.append(anyio.current_time() - before - LAG_PERIOD_S)


def lag_summary(samples: list[float]) -> dict[str, float]:
    """p50 / p99 / max of lag samples, in virtual milliseconds."""
    ordered = sorted(samples) or [0.0]

    def rank(p: float) -> float:
        return 1000 * ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]

    return {"p50_ms": rank(50), "p99_ms": rank(99), "max_ms": 1000 * ordered[-1]}


def listening_socket() -> socket.socket:
    """A socket bound to a free port on 127.0.0.1 and listening."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    return sock


async def serve(
    app: SimulatedOpenAI, sock: socket.socket, shutdown: Callable[[], Awaitable[None]]
) -> None:
    """Serve ``app`` with hypercorn's trio worker on ``sock`` until ``shutdown()`` returns.

    hypercorn's own timeouts run on the same (scaled) trio clock, so they are set far
    beyond any run: a keep-alive connection closed by a virtual 5 s idle timeout would
    make the client reconnect, which the simulator has no counterpart for.
    """
    from hypercorn.config import Config
    from hypercorn.trio import serve as hypercorn_serve

    config = Config()
    config.bind = [f"fd://{sock.detach()}"]
    config.accesslog = None
    config.errorlog = None
    config.keep_alive_timeout = 1e9
    config.graceful_timeout = 1.0
    await hypercorn_serve(app, config, shutdown_trigger=shutdown)  # type: ignore[arg-type]
