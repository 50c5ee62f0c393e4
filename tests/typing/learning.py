"""Type-checked only (mypy --strict, pyright): the header learning and token accounting API."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from typing_extensions import assert_type

import anygate
from anygate.httpx2 import GatedTransport

if TYPE_CHECKING:
    from collections.abc import Mapping

gate = anygate.Gate(8, name="llm")
report = anygate.parse_limit_headers({"x-ratelimit-limit-requests": "60"}, now=0.0)
assert_type(report, anygate.LimitReport)
dim = report.requests
if dim is not None:
    assert_type(dim, anygate.ReportedLimit)
    assert_type(dim.limit, float | None)
    assert_type(dim.per_minute, float | None)
    assert_type(dim.drained, bool)
assert_type(report.token_limit, anygate.ReportedLimit | None)

learner = anygate.RateLearner.of(gate)
assert_type(learner, anygate.RateLearner)
custom = anygate.RateLearner(gate, headroom=0.2, confirm=3, max_hold_s=30.0, ceiling=None)
anygate.RateLearner(gate, ceiling="gate")
anygate.RateLearner(gate, ceiling=anygate.Rate(requests_per_minute=10))
assert_type(custom.observe(report), bool)
assert_type(custom.observe(report, now=1.0), bool)
assert_type(custom.observe_headers([("a", "b")]), bool)
limits = custom.limits
assert_type(limits, anygate.LearnedLimits)
assert_type(limits.requests_per_minute, float | None)
assert_type(limits.rate, anygate.Rate | None)
custom.ceiling = None
assert_type(limits.input_tokens_per_minute, float | None)
assert_type(limits.output_tokens_per_minute, float | None)
published = anygate.Policy(
    name="published", rate=anygate.Rate(requests_per_minute=500), rate_is_ceiling=False
)
assert_type(published.config.rate_is_ceiling, bool)
local = anygate.Policy(name="local", max_concurrent_calls=1, concurrency_is_ceiling=False)
assert_type(local.config.concurrency_is_ceiling, bool)
assert_type(local.adaptive_limit.probes_published_slots, bool)
assert_type(published.adaptive_limit.probes_published_rate, bool)
assert_type(anygate.learn_from_headers(gate, None), bool)
assert_type(anygate.learn_from_error(gate, Exception(), headers=False), bool)
assert_type(anygate.ReportedLimit(1.0).refused, bool)
assert_type(anygate.headers_of(Exception()), object | None)

assert_type(anygate.estimate_tokens({"max_tokens": 1}), int | None)
assert_type(
    anygate.estimate_tokens(b"{}", counter=anygate.chars_counter(3.5), default_output=16),
    int | None,
)
assert_type(anygate.usage_tokens({"usage": {}}), int | None)


def estimator(body: Mapping[str, Any]) -> int | None:
    return anygate.estimate_tokens(body)


GatedTransport(gate=gate, learn_limits=False, tokens=estimator)
GatedTransport(gate=gate, tokens=False)
