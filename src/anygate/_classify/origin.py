"""Whether a failure came from the provider (or the way to it) or from the caller's own code.

A policy guards provider calls. A ``KeyError`` or ``ZeroDivisionError`` raised by the code
around the call is the caller's bug, not a provider failure: wrapping it in ``CallFailed``
would hide it from ``except KeyError`` and tell an end user "LLM request failed". stamina and
tenacity leave such errors alone too (they retry what they are told to and re-raise the rest).

A failure counts as the provider's when any of these holds:

* classification found something: it is retriable, or its reason is not ``generic``, or it
  carries an HTTP status or an error code;
* a user rule matched it (the user said it is a provider failure, whatever it is);
* the exception, or an exception it was raised from, is an HTTP client's or an SDK's own
  (its class, or a base class, lives in one of :data:`PROVIDER_MODULES`).

Everything else propagates unchanged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._verdict import Reason
from .classify import rule_decides
from .facts import gather
from .patterns import HTTP_MODULES

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .._verdict import Verdict
    from .classify import RuleLike

__all__ = ["PROVIDER_MODULES", "from_provider"]

#: Where provider and transport exceptions come from: the HTTP stacks classification already
#: reads, the SDKs users put behind a policy, and anygate itself (``ResponseError``, a
#: nested policy's ``CallFailed``). A prefix match on the class's ``__module__``.
PROVIDER_MODULES = (
    *HTTP_MODULES,
    "anygate",
    "botocore",
    "cohere",
    "google.api_core",
    "google.genai",
    "groq",
    "litellm",
    "mistralai",
    "dashscope",
    "volcenginesdkarkruntime",
    "grpc",
)
# Exceptions chained deeper than this are not looked at (classification stops there too).
_CAUSE_DEPTH = 3


def from_provider(exc: BaseException, verdict: Verdict, rules: Sequence[RuleLike] = ()) -> bool:
    """Whether ``exc`` (classified as ``verdict``) is a provider failure; see the module."""
    if (
        verdict.retriable
        or verdict.reason is not Reason.GENERIC
        or verdict.status is not None
        or verdict.code is not None
    ):
        return True
    current: BaseException | None = exc
    for _ in range(_CAUSE_DEPTH + 1):
        if current is None:
            break
        facts = gather(current)
        if facts.status is not None or facts.codes:
            return True
        if any(module.startswith(PROVIDER_MODULES) for module in facts.modules):
            return True
        current = current.__cause__
    return any(rule_decides(rule, exc) for rule in rules)
