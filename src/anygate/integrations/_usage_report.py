"""What a gated transport tells its policy's hooks about one answer: :class:`~anygate.UsageReported`.

The transports already read a response's usage to settle a token budget
(:mod:`._accounting`); telemetry wants the same numbers split into input and output, plus
the model and the server, in the OpenTelemetry GenAI vocabulary. This module derives
those from the request (host, port, path, the body's ``model``) and the response's usage,
and delivers the event. Only names and numbers leave it: the path is mapped to an
operation *name*, never passed on, and header values are not read at all.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, final

from .. import UsageReported

if TYPE_CHECKING:
    from .. import Policy

__all__ = ["UsageReporter", "describe_request", "usage_parts"]

logger = logging.getLogger("anygate")

_MAX_TOKENS = 2**53  # as anygate.usage_tokens: a larger count is garbage, not usage
# A model name longer than this is not one (and would be an unbounded label value).
_MAX_MODEL = 128
# Bodies above this are not parsed for their model: a prompt of megabytes would cost a
# parse per request for one label. The OpenAI and Anthropic SDKs send far smaller bodies
# for all but huge prompts; those go unlabelled rather than slow.
_MAX_BODY = 1 << 20
_DEFAULT_PORTS = {"https": 443, "http": 80}
# A "model" key with a plain string value. Inside a JSON string every quote is escaped, so
# this matches keys only; one match is the request's model unless it is nested (an
# Anthropic tool_use input may hold a "model" of its own), so only a lone match is trusted
# and anything else is parsed. A scan costs ~1 us on a 2 kB body, a json.loads ~11 us.
_MODEL_KEY = re.compile(rb'"model"\s*:\s*"([^"\\]{1,128})"')
# Path endings of the OpenAI and Anthropic APIs (and the many servers that copy OpenAI's),
# as GenAI operation names (OpenTelemetry semantic conventions, gen_ai.operation.name).
_OPERATIONS = (
    ("/chat/completions", "chat", "openai"),
    ("/responses", "chat", "openai"),
    ("/completions", "text_completion", "openai"),
    ("/embeddings", "embeddings", "openai"),
    ("/messages", "chat", "anthropic"),
)


def _int(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_TOKENS:
        return None
    return value


def model_name(value: object) -> str | None:
    """``value`` if it can be a model name (a short string), else ``None``."""
    if isinstance(value, str) and 0 < len(value) <= _MAX_MODEL:
        return value
    return None


def usage_parts(usage: object) -> tuple[int | None, int | None]:
    """``(input, output)`` tokens of one ``usage`` object, OpenAI or Anthropic shaped.

    Input includes cached prompt tokens, as the GenAI conventions ask: OpenAI's
    ``prompt_tokens`` (and the Responses API's ``input_tokens``) already count them;
    Anthropic's ``input_tokens`` does not, so its ``cache_creation_input_tokens`` and
    ``cache_read_input_tokens`` are added.
    """
    if not isinstance(usage, Mapping):
        return None, None
    given = _int(usage.get("prompt_tokens"))
    if given is None:
        parts = [
            _int(usage.get(key))
            for key in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
        ]
        found = [p for p in parts if p is not None]
        given = min(_MAX_TOKENS, sum(found)) if found else None
    output = _int(usage.get("completion_tokens"))
    if output is None:
        output = _int(usage.get("output_tokens"))
    return given, output


def document_report(doc: object) -> tuple[int | None, int | None, str | None]:
    """``(input, output, model)`` of a decoded response document (or a stream event)."""
    if not isinstance(doc, Mapping):
        return None, None, None
    usage = doc.get("usage")
    model = doc.get("model")
    inner = doc.get("response") or doc.get("message")  # Responses API / Anthropic message_start
    if isinstance(inner, Mapping):
        if usage is None:
            usage = inner.get("usage")
        if model is None:
            model = inner.get("model")
    return (*usage_parts(usage), model_name(model))


class RequestFacts:
    """The names a request carries that telemetry may label with (see the module docstring)."""

    __slots__ = ("model", "operation", "port", "provider", "server")

    def __init__(
        self,
        server: str | None,
        port: int | None,
        operation: str | None,
        provider: str | None,
        model: str | None,
    ) -> None:
        self.server = server
        self.port = port
        self.operation = operation
        self.provider = provider
        self.model = model


def describe_request(request: Any, hint: str | None) -> RequestFacts:
    """The server, operation, provider and requested model of an httpx/httpx2 request.

    ``hint``: the policy's ``provider`` setting, which wins over the path's API family
    (a DashScope or Ark endpoint speaks OpenAI's API but is not OpenAI).
    """
    url = request.url
    host = url.host or None
    port = url.port
    if port is None:
        port = _DEFAULT_PORTS.get(url.scheme)
    path = url.path.rstrip("/")
    operation = family = None
    for ending, name, api in _OPERATIONS:
        if path.endswith(ending):
            operation, family = name, api
            break
    try:
        body = request.content  # bytes for a body held in memory
    except Exception:  # a streamed upload: not read
        body = b""
    return RequestFacts(host, port, operation, hint or family, _request_model(body))


def _request_model(body: bytes) -> str | None:
    if not body or len(body) > _MAX_BODY or b'"model"' not in body:
        return None
    found = _MODEL_KEY.findall(body, 0, len(body))
    if len(found) == 1:
        try:
            return model_name(found[0].decode())
        except UnicodeDecodeError:
            return None
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    return model_name(doc.get("model")) if isinstance(doc, Mapping) else None


@final
class UsageReporter:
    """Delivers one response's :class:`~anygate.UsageReported` to a policy's hooks, once."""

    __slots__ = ("_facts", "_gate", "_policy")

    def __init__(self, policy: Policy, gate: str, facts: RequestFacts) -> None:
        self._policy = policy
        self._gate = gate
        self._facts = facts

    def report(
        self, input_tokens: int | None, output_tokens: int | None, model: str | None
    ) -> None:
        policy = self._policy
        facts = self._facts
        event = UsageReported(
            policy=policy.name,
            gate=self._gate,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            request_model=facts.model,
            response_model=model,
            server_address=facts.server,
            server_port=facts.port,
            operation=facts.operation,
            provider=facts.provider,
        )
        # As anygate's own dispatcher: a hook's Exception is logged and dropped, so a broken
        # dashboard never breaks a response body; a BaseException (Ctrl-C) propagates.
        for hook in policy.hooks:
            try:
                hook(event)
            except Exception:  # noqa: PERF203 - each hook is isolated from the others
                logger.exception(
                    "anygate hook %r raised on UsageReported; ignored",
                    hook,
                    extra={"event": "UsageReported"},
                )
