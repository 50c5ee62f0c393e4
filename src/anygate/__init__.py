"""anygate: a process-wide admission gate and call policy for LLM calls.

One :class:`Gate` serves asyncio loops, trio runs and plain threads in the same process at
once; callers get :class:`Token` objects any task or thread may release. A :class:`Policy`
guards provider calls with it: one slot per attempt, classified failures, jittered retries
that hold no slot, ``Retry-After``, deadlines and a shared circuit breaker, in every form
(``call``, ``@retry``, the attempt loop ``run`` with its :class:`Attempt`, and the block
form ``attempts()`` with its :class:`AttemptBlock`).
"""

from __future__ import annotations

from ._classify.classify import Reason as Reason
from ._classify.classify import Rule as Rule
from ._classify.classify import Verdict as Verdict
from ._classify.classify import classify as classify
from ._classify.classify import classify_response as classify_response
from ._classify.facts import headers_of as headers_of
from ._classify.headers import LimitReport as LimitReport
from ._classify.headers import ReportedLimit as ReportedLimit
from ._classify.headers import parse_limit_headers as parse_limit_headers
from ._classify.throttle import throttle_kind as throttle_kind
from ._classify.usage import chars_counter as chars_counter
from ._classify.usage import estimate_tokens as estimate_tokens
from ._classify.usage import tiktoken_counter as tiktoken_counter
from ._classify.usage import usage_tokens as usage_tokens
from ._config.config import AdaptiveConfig as AdaptiveConfig
from ._config.config import BreakerConfig as BreakerConfig
from ._config.config import RetryConfig as RetryConfig
from ._config.limit_values import AdaptiveStatistics as AdaptiveStatistics
from ._config.loader import load_config as load_config
from ._config.policy_config import PolicyConfig as PolicyConfig
from ._errors import AnygateError as AnygateError
from ._errors import Busy as Busy
from ._errors import CallFailed as CallFailed
from ._errors import CircuitOpen as CircuitOpen
from ._errors import ConfigError as ConfigError
from ._errors import ResponseError as ResponseError
from ._events.events import BreakerStateChanged as BreakerStateChanged
from ._events.events import Event as Event
from ._events.events import GaveUp as GaveUp
from ._events.events import Hook as Hook
from ._events.events import LimitChanged as LimitChanged
from ._events.events import RetryScheduled as RetryScheduled
from ._events.events import SlotAdmitted as SlotAdmitted
from ._events.events import SlotWaiting as SlotWaiting
from ._events.events import UsageReported as UsageReported
from ._events.logging_hook import LoggingHook as LoggingHook
from ._gate.acquisition import Acquisition as Acquisition
from ._gate.gate import Gate as Gate
from ._gate.gate import GateStatistics as GateStatistics
from ._gate.inspect import QueuedCaller as QueuedCaller
from ._gate.inspect import SlotHolder as SlotHolder
from ._gate.rate import BudgetMark as BudgetMark
from ._gate.rate import Rate as Rate
from ._gate.rate import RateStatistics as RateStatistics
from ._gate.registry import shared_gate as shared_gate
from ._gate.token import Token as Token
from ._limits.adaptive import AdaptiveLimit as AdaptiveLimit
from ._limits.learn import LearnedLimits as LearnedLimits
from ._limits.learn import RateLearner as RateLearner
from ._limits.learn_from import learn_from_error as learn_from_error
from ._limits.learn_from import learn_from_headers as learn_from_headers
from ._policy.attempt import Attempt as Attempt
from ._policy.blocks import AttemptBlock as AttemptBlock
from ._policy.breaker import CircuitBreaker as CircuitBreaker
from ._policy.breaker_state import BreakerState as BreakerState
from ._policy.breaker_state import BreakerStatistics as BreakerStatistics
from ._policy.permit import Permit as Permit
from ._policy.policy import Policy as Policy
from ._policy.sharing import shared_breaker as shared_breaker
from ._policy.testing_switch import is_testing as is_testing
from ._policy.testing_switch import set_testing as set_testing
from ._redact import redact as redact

__all__ = [
    "Acquisition",
    "AdaptiveConfig",
    "AdaptiveLimit",
    "AdaptiveStatistics",
    "AnygateError",
    "Attempt",
    "AttemptBlock",
    "BreakerConfig",
    "BreakerState",
    "BreakerStateChanged",
    "BreakerStatistics",
    "BudgetMark",
    "Busy",
    "CallFailed",
    "CircuitBreaker",
    "CircuitOpen",
    "ConfigError",
    "Event",
    "Gate",
    "GateStatistics",
    "GaveUp",
    "Hook",
    "LearnedLimits",
    "LimitChanged",
    "LimitReport",
    "LoggingHook",
    "Permit",
    "Policy",
    "PolicyConfig",
    "QueuedCaller",
    "Rate",
    "RateLearner",
    "RateStatistics",
    "Reason",
    "ReportedLimit",
    "ResponseError",
    "RetryConfig",
    "RetryScheduled",
    "Rule",
    "SlotAdmitted",
    "SlotHolder",
    "SlotWaiting",
    "Token",
    "UsageReported",
    "Verdict",
    "chars_counter",
    "classify",
    "classify_response",
    "estimate_tokens",
    "headers_of",
    "is_testing",
    "learn_from_error",
    "learn_from_headers",
    "load_config",
    "parse_limit_headers",
    "redact",
    "set_testing",
    "shared_breaker",
    "shared_gate",
    "throttle_kind",
    "tiktoken_counter",
    "usage_tokens",
]

__version__ = "0.1.0.dev0"


def _fixup_module_metadata() -> None:
    # Show the public path in reprs and tracebacks (trio's fixup_module_metadata).
    for name in __all__:
        obj = globals()[name]
        if getattr(obj, "__module__", "").startswith("anygate._"):
            obj.__module__ = "anygate"


_fixup_module_metadata()
del _fixup_module_metadata
