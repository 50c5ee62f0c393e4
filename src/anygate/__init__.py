"""anygate: a process-wide admission gate and call policy for LLM calls.

One :class:`Gate` serves asyncio loops, trio runs and plain threads in the same process at
once; callers get :class:`Token` objects any task or thread may release.
"""

from __future__ import annotations

from ._errors import AnygateError as AnygateError
from ._errors import Busy as Busy
from ._errors import CallFailed as CallFailed
from ._errors import CircuitOpen as CircuitOpen
from ._errors import ConfigError as ConfigError
from ._gate import Gate as Gate
from ._gate import GateStatistics as GateStatistics
from ._registry import shared_gate as shared_gate
from ._token import Token as Token

__all__ = [
    "AnygateError",
    "Busy",
    "CallFailed",
    "CircuitOpen",
    "ConfigError",
    "Gate",
    "GateStatistics",
    "Token",
    "shared_gate",
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
