"""Run every model call of a LangChain agent under a :class:`anygate.Policy` (extra ``anygate[langchain]``).

``create_agent(model, tools, middleware=[PolicyMiddleware(policy)])`` puts each model call
of the graph, on the sync path (``agent.invoke``, LangChain's ``wrap_model_call``) and the
async one (``agent.ainvoke``, ``awrap_model_call``), behind the policy: one slot of its
process-wide gate per attempt, classified retries with jitter or ``Retry-After`` that hold
no slot, the shared circuit breaker. Graphs on several event loops and threads share the
one gate, so this replaces a hand-written limiter-and-retry middleware (deer-flow's) whole.

This module imports LangChain (``langchain>=1.0``, Python 3.11+); ``import anygate`` alone
does not. LangChain's async path runs on asyncio (and uvloop) only, not on trio.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, Literal

try:
    from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
    from langchain_core.messages import AIMessage
    from langgraph.config import get_stream_writer
except ImportError as _exc:
    _msg = (
        "anygate.langchain needs LangChain >= 1.0 on Python 3.11+: pip install 'anygate[langchain]'"
    )
    raise ImportError(_msg) from _exc

from . import (
    Busy,
    CallFailed,
    CircuitOpen,
    Event,
    GaveUp,
    PolicyConfig,
    RetryScheduled,
    load_config,
)
from . import Policy as _Policy
from ._validation import check_wait

if TYPE_CHECKING:
    import os
    from collections.abc import Awaitable, Callable, Mapping

__all__ = ["STREAM_EVENT_TYPE", "PolicyMiddleware", "stream_events"]

#: The ``type`` of the custom stream chunks that :func:`stream_events` writes.
STREAM_EVENT_TYPE: Final[str] = "anygate.llm_call"

# LangGraph's interrupts (GraphInterrupt) and its other bubbling signals (ParentCommand)
# derive from GraphBubbleUp, and a control-flow name matches anywhere in the MRO. They are
# control flow: retrying one would run a human-in-the-loop step twice, and they say nothing
# about the provider. By name, so that the policy's config stays plain data.
_CONTROL_FLOW = ("GraphBubbleUp",)


def stream_events(event: Event) -> None:
    """A policy hook that tells the graph's stream about retries and give-ups.

    Inside a graph run (``agent.stream(..., stream_mode="custom")``) each
    :class:`anygate.RetryScheduled` and :class:`anygate.GaveUp` becomes a custom chunk
    ``{"type": STREAM_EVENT_TYPE, "event": "retry" | "gave_up", "message": ..., ...}`` for a
    UI's "retrying in 6s" line; ``message`` is the event's redacted wording. Outside a graph
    run it does nothing. :class:`PolicyMiddleware` adds it to the policies it builds; give it
    in ``hooks=`` to a policy you build yourself.
    """
    if isinstance(event, RetryScheduled):
        chunk: dict[str, Any] = {
            "type": STREAM_EVENT_TYPE,
            "event": "retry",
            "policy": event.policy,
            "attempt": event.attempt,
            "max_attempts": event.max_attempts,
            "wait_ms": event.wait_ms,
            "reason": event.reason.value,
            "message": event.message,
        }
    elif isinstance(event, GaveUp):
        chunk = {
            "type": STREAM_EVENT_TYPE,
            "event": "gave_up",
            "policy": event.policy,
            "attempts": event.attempts,
            "reason": event.reason.value,
            "message": event.message,
        }
    else:
        return
    try:
        writer = get_stream_writer()
    except RuntimeError:
        return  # not inside a graph run (a plain policy.call elsewhere shares the policy)
    writer(chunk)


class PolicyMiddleware(AgentMiddleware):
    """An agent middleware running each model call under a :class:`anygate.Policy`.

    Args:
        policy: the policy to use; policies with the same gate name share one gate, so
            several graphs (and plain SDK calls) may use one cap.
        config: instead of ``policy``, build one from this: what
            :func:`anygate.load_config` reads (a YAML path, or a mapping with the
            ``llm_call`` and ``circuit_breaker`` sections, deer-flow's keys as they are),
            or a :class:`anygate.PolicyConfig`. The policy built gets :func:`stream_events`
            as a hook and LangGraph's interrupts as control flow. Neither given: a policy
            with the defaults (``Policy()``, the shared gate ``"llm"``).
        deadline_s: seconds bounding each model call, its retries and backoff included
            (``policy.call(deadline=)``); ``None``: no bound of our own.
        on_failure: ``"error"`` raises the policy's error (:class:`anygate.CallFailed`,
            :class:`anygate.CircuitOpen`, :class:`anygate.Busy`, or the SDK's own with
            ``reraise``); ``"continue"`` ends the model step with an ``AIMessage`` holding
            the error's user-safe wording instead, as ``ModelRetryMiddleware`` does.

    Raises:
        TypeError: both ``policy`` and ``config`` given, or ``policy`` is not a Policy.
        ValueError: ``on_failure`` is neither ``"error"`` nor ``"continue"``, or
            ``deadline_s`` is negative.
        ConfigError: ``config`` is invalid.

    The chat model should not retry on its own: build it with ``max_retries=0``
    (``ChatOpenAI``, ``ChatAnthropic``), or each policy attempt hides the SDK's retries,
    their sleeps holding the slot.
    """

    def __init__(
        self,
        policy: _Policy | None = None,
        *,
        config: str | os.PathLike[str] | Mapping[str, Any] | PolicyConfig | None = None,
        deadline_s: float | None = None,
        on_failure: Literal["error", "continue"] = "error",
    ) -> None:
        super().__init__()
        if policy is not None and config is not None:
            msg = "PolicyMiddleware takes policy or config, not both"
            raise TypeError(msg)
        _check_policy(policy)
        if on_failure not in ("error", "continue"):
            msg = f"on_failure must be 'error' or 'continue' (got {on_failure!r})"
            raise ValueError(msg)
        self._deadline = check_wait("deadline_s", deadline_s)
        self._on_failure = on_failure
        if policy is None:
            loaded = config if isinstance(config, PolicyConfig) else load_config(config or {})
            policy = _Policy.from_config(
                loaded,
                control_flow=(*loaded.control_flow, *_CONTROL_FLOW),
                hooks=(stream_events,),
            )
        self._policy = policy

    @property
    def policy(self) -> _Policy:
        """The policy each model call runs under."""
        return self._policy

    def wrap_model_call(
        self,
        request: ModelRequest,
        handler: Callable[[ModelRequest], ModelResponse],
    ) -> ModelResponse | AIMessage:
        """The sync graph path: ``handler`` runs under ``policy.call_sync`` (blocking waits)."""
        try:
            return self._policy.call_sync(handler, request, deadline=self._deadline)
        except Exception as exc:
            return self._failed(exc)

    async def awrap_model_call(
        self,
        request: ModelRequest,
        handler: Callable[[ModelRequest], Awaitable[ModelResponse]],
    ) -> ModelResponse | AIMessage:
        """The async graph path: ``handler`` runs under ``await policy.call``."""
        try:
            return await self._policy.call(handler, request, deadline=self._deadline)
        except Exception as exc:
            return self._failed(exc)

    def _failed(self, exc: Exception) -> AIMessage:
        # With reraise=True a give-up surfaces as the SDK's own exception, its CallFailed
        # attached: "continue" must still answer it, and nothing else (the caller's own
        # errors and LangGraph's control flow stay exceptions).
        failed = exc if isinstance(exc, CallFailed) else CallFailed.of(exc)
        if self._on_failure == "error" or (
            failed is None and not isinstance(exc, (CircuitOpen, Busy))
        ):
            raise exc
        return AIMessage(content=str(exc) if failed is None else failed.user_message)


def _check_policy(policy: object) -> None:
    if policy is not None and not isinstance(policy, _Policy):
        msg = f"policy must be an anygate.Policy (got {type(policy).__name__})"
        raise TypeError(msg)
