"""anygate: a process-wide admission gate and call policy for LLM calls.

One :class:`Gate` serves asyncio loops, trio runs and plain threads in the same process at
once; callers get :class:`Token` objects any task or thread may release. A :class:`Policy`
guards provider calls with it: one slot per attempt, classified failures, jittered retries
that hold no slot, ``Retry-After``, deadlines and a shared circuit breaker, in every form
(``call``, ``@retry``, the attempt loop ``run`` with its :class:`Attempt`, and the block
form ``attempts()`` with its :class:`AttemptBlock`).
"""

from __future__ import annotations

from ._acquisition import Acquisition as Acquisition
from ._adaptive import AdaptiveLimit as AdaptiveLimit
from ._attempt import Attempt as Attempt
from ._blocks import AttemptBlock as AttemptBlock
from ._breaker import BreakerState as BreakerState
from ._breaker import BreakerStatistics as BreakerStatistics
from ._breaker import CircuitBreaker as CircuitBreaker
from ._breaker import Permit as Permit
from ._breaker import shared_breaker as shared_breaker
from ._classify import Reason as Reason
from ._classify import Rule as Rule
from ._classify import Verdict as Verdict
from ._classify import classify as classify
from ._classify import classify_response as classify_response
from ._config import AdaptiveConfig as AdaptiveConfig
from ._config import BreakerConfig as BreakerConfig
from ._config import PolicyConfig as PolicyConfig
from ._config import RetryConfig as RetryConfig
from ._errors import AnygateError as AnygateError
from ._errors import Busy as Busy
from ._errors import CallFailed as CallFailed
from ._errors import CircuitOpen as CircuitOpen
from ._errors import ConfigError as ConfigError
from ._errors import ResponseError as ResponseError
from ._events import BreakerStateChanged as BreakerStateChanged
from ._events import Event as Event
from ._events import GaveUp as GaveUp
from ._events import Hook as Hook
from ._events import LimitChanged as LimitChanged
from ._events import RetryScheduled as RetryScheduled
from ._events import SlotAdmitted as SlotAdmitted
from ._events import SlotWaiting as SlotWaiting
from ._gate import Gate as Gate
from ._gate import GateStatistics as GateStatistics
from ._headers import LimitReport as LimitReport
from ._headers import ReportedLimit as ReportedLimit
from ._headers import parse_limit_headers as parse_limit_headers
from ._inspect import QueuedCaller as QueuedCaller
from ._inspect import SlotHolder as SlotHolder
from ._learn import LearnedLimits as LearnedLimits
from ._learn import RateLearner as RateLearner
from ._learn import headers_of as headers_of
from ._learn import learn_from_headers as learn_from_headers
from ._limit_values import AdaptiveStatistics as AdaptiveStatistics
from ._loader import load_config as load_config
from ._logging_hook import LoggingHook as LoggingHook
from ._policy import Policy as Policy
from ._rate import Rate as Rate
from ._rate import RateStatistics as RateStatistics
from ._redact import redact as redact
from ._registry import shared_gate as shared_gate
from ._testing import is_testing as is_testing
from ._testing import set_testing as set_testing
from ._token import Token as Token
from ._usage import chars_counter as chars_counter
from ._usage import estimate_tokens as estimate_tokens
from ._usage import tiktoken_counter as tiktoken_counter
from ._usage import usage_tokens as usage_tokens

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
    "Verdict",
    "chars_counter",
    "classify",
    "classify_response",
    "estimate_tokens",
    "headers_of",
    "is_testing",
    "learn_from_headers",
    "load_config",
    "parse_limit_headers",
    "redact",
    "set_testing",
    "shared_breaker",
    "shared_gate",
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
