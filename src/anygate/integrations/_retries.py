"""How a gated transport's failed responses travel through a :class:`~anygate.Policy`.

A transport runs each request on the policy's public attempt loop,
:meth:`anygate.Policy.run` (``run_sync``), with ``reraise=True``: a policy holds its slot
for exactly the duration of ``fn`` in :meth:`~anygate.Policy.call`, but a transport must
keep the slot until the *response body* is closed, long after ``handle_async_request``
has returned, so its step takes the slot itself (:meth:`anygate.Attempt.acquire`) and ties
it to the body. Everything else is the policy's: classification with its rules, budgets,
jitter or ``Retry-After``, the breaker, deadlines, the testing switch, events.

How a failed *response* travels: the attempt raises :class:`ErrorResponse` (an
:class:`anygate.ResponseError` carrying the buffered response) so the policy classifies
it like any provider error; when the policy gives up it re-raises that exception
(``reraise``), and the transport hands its response to the client marked
``x-should-retry: false``, so an SDK on top raises its usual typed error
(``RateLimitError``...) and does not retry again what anygate already retried.
"""

from __future__ import annotations

import json
from typing import Any

from .. import ResponseError

__all__ = [
    "CLASSIFIED_STATUSES",
    "ErrorResponse",
    "decode_body",
    "final_response",
    "is_classified",
]

# The statuses a provider uses for "not now" (the SDKs retry the same set, plus 425 Too
# Early); others (400, 401, 404...) are answers, returned to the caller untouched.
CLASSIFIED_STATUSES = frozenset({408, 409, 425, 429})


def is_classified(status: int) -> bool:
    """Whether a response with ``status`` is classified (and possibly retried)."""
    return status in CLASSIFIED_STATUSES or status >= 500


class ErrorResponse(ResponseError):
    """Raised inside a transport attempt for a classified status; carries the response.

    The response's body has been read and buffered, so it can still be handed to the
    client if this turns out to be the final answer.
    """


def decode_body(content: bytes) -> object:
    """The JSON document in ``content``, else its text (classification reads either)."""
    text = content.decode("utf-8", "replace")
    try:
        return json.loads(text)
    except ValueError:
        return text


def final_response(exc: ErrorResponse) -> Any:
    """The response to hand the client once the policy has given up on ``exc``."""
    response: Any = exc.response
    # anygate has retried this already (or decided it must not be): an SDK on top must not.
    response.headers["x-should-retry"] = "false"
    return response
