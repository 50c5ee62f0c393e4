"""Type-level tests of anygate.langchain (the LangChain agent middleware).

Checked by mypy and pyright, never executed (pytest does not collect this file). Negative
lines carry ``# type: ignore[code]``, which strict mypy and pyright flag once unneeded.
"""

# pyright: strict, reportUnnecessaryTypeIgnoreComment=error

from __future__ import annotations

from typing import TYPE_CHECKING

from typing_extensions import assert_type

import anygate
from anygate.langchain import STREAM_EVENT_TYPE, PolicyMiddleware, stream_events

if TYPE_CHECKING:
    from langchain.agents.middleware import AgentMiddleware

policy = anygate.Policy(name="llm", hooks=[stream_events])
middleware = PolicyMiddleware(policy, deadline_s=30, on_failure="continue")
assert_type(middleware.policy, anygate.Policy)
base: AgentMiddleware = middleware  # it is LangChain's middleware, for create_agent
PolicyMiddleware(config={"llm_call": {"max_concurrent_calls": 4}})
PolicyMiddleware(config="config.yaml")
PolicyMiddleware(config=anygate.PolicyConfig())
assert_type(STREAM_EVENT_TYPE, str)

PolicyMiddleware(policy, on_failure="retry")  # type: ignore[arg-type]
PolicyMiddleware(policy, deadline_s="30")  # type: ignore[arg-type]
PolicyMiddleware("llm")  # type: ignore[arg-type]
