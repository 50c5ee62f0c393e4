"""The outcome of classifying a failure: :class:`Reason` and :class:`Verdict`.

Plain values with no behaviour and no imports of the rest of anygate, so both the errors
(``CallFailed.verdict``) and the classifier (which raises and reads those errors) can use
them without an import cycle. Classification itself is :mod:`._classify`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

__all__ = ["Reason", "Verdict"]


class Reason(str, enum.Enum):
    """Why a call failed. A ``str`` enum: ``Reason.QUOTA == "quota"``."""

    QUOTA = "quota"
    """Billing or account quota exhausted. Never retried."""
    AUTH = "auth"
    """Bad or missing credentials, or no permission. Never retried."""
    BURST_RATE = "burst_rate"
    """The request *rate* rose too steeply (``limit_burst_rate``). Retried once, later."""
    TRANSIENT = "transient"
    """Timeouts, dropped connections and streams, 408/409/425/429/5xx. Retried."""
    BUSY = "busy"
    """The provider says it is overloaded or asks to try again later. Retried."""
    GENERIC = "generic"
    """Anything else, such as a bad request. Not retried."""

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Verdict:
    """How one failure was classified.

    Attributes:
        reason: the :class:`Reason`.
        retriable: whether another attempt may succeed.
        retry_after: seconds the provider asked us to wait (``Retry-After``), else ``None``.
        status: the HTTP status, if any.
        code: the provider's error code or type (``"limit_burst_rate"``,
            ``"insufficient_quota"``, ``"overloaded_error"``), if any.
        detail: a short description of the error with secrets redacted.
        stream_interrupted: the failure cut a streamed response short (a shorter answer
            may get through).
    """

    reason: Reason
    retriable: bool
    retry_after: float | None = None
    status: int | None = None
    code: str | None = None
    detail: str = field(default="", compare=False)
    stream_interrupted: bool = False
