"""The one validation path for numbers, and the helpers shared by config objects and files.

Every number anygate accepts (gate capacity and timeouts, breaker settings, deadlines,
retry and adaptive settings, transport and middleware timeouts, YAML and mapping
configs) goes through :func:`check_number` or :func:`check_int`: the type is checked
first (``bool`` is not a number), then the value, with ints of any size compared exactly
(``10**400`` never reaches ``float()``, so there is no bare ``OverflowError``), NaN and
infinities refused unless infinity means "no limit", and an upper bound so that no
value can overflow a sleep, a lock timeout or float arithmetic later. Errors name the
parameter, the constraint and the value, and are raised before anything is changed.

One :class:`Check` per audience: the Python API raises ``TypeError`` for a value of the
wrong *type* (the house rule for arguments) and :class:`anygate.ConfigError` for a bad
value; the file loader raises ``ConfigError`` for both, so a config file's every mistake
names its dotted key path. Messages say what is allowed and show the value:
``llm_call.busy_wait_s must be a finite number >= 0 or null (got -1)``.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, overload

from ._errors import ConfigError
from ._verdict import Reason

__all__ = [
    "FILE",
    "FLOAT_MAX",
    "MAX_COUNT",
    "MAX_SECONDS",
    "PY",
    "Check",
    "check_flag",
    "check_int",
    "check_name",
    "check_number",
    "check_redis_url",
    "show",
]

#: The largest duration accepted, in seconds (about 31.7 years): beyond it sleeps and lock
#: timeouts overflow (``threading.TIMEOUT_MAX`` is about 292 years on Linux). Durations in
#: milliseconds are bounded by the same span.
MAX_SECONDS = 1e9
#: The largest count accepted (capacities, attempts, thresholds): 2**53, the largest
#: integer a float holds exactly, so the adaptive limit's float arithmetic stays exact.
MAX_COUNT = 2**53
#: The bound for waits where any finite float works (the waiters cap a wait at
#: ``threading.TIMEOUT_MAX``): only ints too large for a float are refused.
FLOAT_MAX = sys.float_info.max

ErrorFactory = Callable[[str], Exception]


def show(value: object) -> str:
    """``repr(value)``, but short and safe for huge ints (whose ``str`` may even raise)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**30:
        sign = "a negative" if value < 0 else "an"
        return f"{sign} int of {abs(value).bit_length()} bits"
    try:
        text = repr(value)
    except Exception:  # a broken __repr__ must not hide the real error
        text = f"<{type(value).__name__} object>"
    return text if len(text) <= 200 else text[:197] + "..."


@overload
def check_flag(name: str, value: object) -> bool: ...
@overload
def check_flag(name: str, value: object, *, none: bool) -> bool | None: ...
def check_flag(name: str, value: object, *, none: bool = False) -> bool | None:
    """A real ``bool`` (``None`` too when ``none``): ``0`` or ``"no"`` would read as a choice
    it is not.

    Raises:
        TypeError: naming ``name``, what it must be, the value and its type.
    """
    if type(value) is bool or (value is None and none):
        return value
    allowed = "a bool or None" if none else "a bool"
    msg = f"{name} must be {allowed} (got {show(value)} of type {type(value).__name__})"
    raise TypeError(msg)


def check_name(param: str, value: object, *, value_error: ErrorFactory = ValueError) -> str:
    """A name shown in metrics, logs and reprs: a ``str`` with something in it.

    The one rule for every name anygate takes (gates, shared gates and breakers, policies,
    fleet gates, config files): an empty or whitespace-only name is refused, since it
    would label metrics and log lines with nothing (issue 28: ``Gate(name='')`` was
    accepted where ``Policy(name='')`` was refused).

    Raises:
        TypeError: not a ``str``.
        ValueError (or what ``value_error`` makes): empty or only whitespace.
    """
    if not isinstance(value, str):
        msg = (
            f"{param} must be a non-empty string (got {show(value)} of type {type(value).__name__})"
        )
        raise TypeError(msg)
    if not value.strip():
        raise value_error(f"{param} must be a non-empty string (got {show(value)})")
    return value


_REDIS_SCHEMES = ("redis", "rediss", "unix")
_DB_PATH = re.compile(r"/?(?P<db>[0-9]*)/?")


def _masked_url(url: str) -> str:
    """``url`` with the password of its user part replaced, for error messages."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    userinfo, at, host = rest.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    user = userinfo.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}"


def check_redis_url(param: str, value: object) -> str:
    """A Redis URL the client will read as written, or an error saying what is wrong.

    ``redis://[user:password@]host[:port][/db]``, ``rediss://`` likewise (TLS), or
    ``unix://[user:password@]/path/to/socket[?db=N]``. The db, from the path or a
    ``?db=`` query, must be a whole number: the Redis client silently reads ``/abc`` as
    db 0, and takes ``http://`` for plain Redis (issue 28). The password never appears in
    a message.

    Raises:
        TypeError: not a ``str``.
        ValueError: another scheme, a port that is not a number, a unix URL without a
            socket path, or a db that is not a whole number.
    """
    from urllib.parse import parse_qs, urlsplit

    if not isinstance(value, str):
        msg = f"{param} must be a redis://, rediss:// or unix:// URL string (got {show(value)} of type {type(value).__name__})"
        raise TypeError(msg)
    shown = repr(_masked_url(value))
    parts = urlsplit(value)
    if parts.scheme.lower() not in _REDIS_SCHEMES or "://" not in value:
        msg = f"{param} must be a redis://, rediss:// or unix:// URL (got {shown})"
        raise ValueError(msg)
    try:
        parts.port  # noqa: B018 - urlsplit checks the port only when asked
    except ValueError:
        msg = f"{param} must have a port number from 0 to 65535 (got {shown})"
        raise ValueError(msg) from None
    dbs = parse_qs(parts.query).get("db", [])
    if parts.scheme.lower() == "unix":
        if not parts.path.strip("/"):
            msg = f"{param} must name the socket: unix:///path/to/redis.sock (got {shown})"
            raise ValueError(msg)
    else:
        match = _DB_PATH.fullmatch(parts.path)
        if match is None:
            msg = f"{param} must have a whole-number db after the host, such as /0 (got {shown})"
            raise ValueError(msg)
        if match["db"]:
            dbs.append(match["db"])
    for db in dbs:
        if not db.isdigit() or not db.isascii():
            msg = f"{param} must have a whole-number db, such as /0 or ?db=0 (got {shown})"
            raise ValueError(msg)
    return value


def _type_error(name: str, value: object, allowed: str, factory: ErrorFactory) -> Exception:
    return factory(f"{name} must be {allowed} (got {show(value)} of type {type(value).__name__})")


def check_wait(name: str, value: object) -> float | None:
    """A wait or timeout in seconds: a number >= 0; ``None`` and infinity mean no limit.

    The one spelling of this check (gate, transport, ASGI middleware), so every such
    argument is refused with the same message. Returns ``None`` for "no limit".

    Raises:
        TypeError: not a number (``bool`` included).
        ValueError: negative or NaN.
    """
    seconds = check_number(name, value, none=True, infinite=True, maximum=FLOAT_MAX)
    return None if seconds is None or seconds == math.inf else seconds


def check_number(
    name: str,
    value: object,
    *,
    minimum: float = 0.0,
    strict: bool = False,
    maximum: float = MAX_SECONDS,
    unit: str = " seconds",
    none: bool = False,
    infinite: bool = False,
    type_error: ErrorFactory = TypeError,
    value_error: ErrorFactory = ValueError,
    allowed: str | None = None,
) -> float | None:
    """Validate a real number; return it as a float (``math.inf`` only if ``infinite``).

    Args:
        name: the parameter's name (or dotted key path) for the message.
        minimum, strict: the lower bound, exclusive when ``strict``.
        maximum: the upper bound (inclusive) for finite values.
        unit: appended to the bounds in messages (``" seconds"``, ``" ms"``, ``""``).
        none: ``None`` is allowed (returned as is).
        infinite: ``math.inf`` is allowed and means "no limit" (returned as is).
        type_error, value_error: exception factories taking the message.
        allowed: wording of what is allowed, for the type, NaN and lower-bound messages
            (the config files' ``"a finite number >= 0 or null"``).

    Raises:
        type_error: not an int or float (``bool`` included).
        value_error: NaN, an infinity not allowed, or out of range.
    """
    if value is None and none:
        return None
    if type(value) is float and minimum < value <= maximum:  # the common case, fast
        return value
    or_none = " or None" if none else ""
    no_limit = ""
    if infinite:
        no_limit = " (None or math.inf: no limit)" if none else " (math.inf: no limit)"
    kind = f"a number of{unit}" if unit else "a number"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _type_error(name, value, allowed or f"{kind}{or_none}", type_error)
    low = f"> {minimum:g}" if strict else f">= {minimum:g}"
    if isinstance(value, float):
        if math.isnan(value):
            if allowed is not None:
                raise value_error(f"{name} must be {allowed} (got nan)")
            raise value_error(f"{name} must be {kind} {low}{or_none}, not NaN (got nan)")
        if value == math.inf and infinite:
            return value
    # Exact comparisons: int vs float compare exactly in Python, whatever the int's size.
    refused_inf = allowed is not None and isinstance(value, float) and math.isinf(value)
    if value < minimum or (strict and value == minimum) or refused_inf:
        if allowed is not None:
            raise value_error(f"{name} must be {allowed} (got {show(value)})")
        raise value_error(f"{name} must be {low}{unit}{or_none} (got {show(value)})")
    if value > maximum:
        msg = f"{name} must be <= {maximum:g}{unit}{no_limit} (got {show(value)})"
        raise value_error(msg)
    return float(value)


def check_int(
    name: str,
    value: object,
    *,
    minimum: int,
    maximum: int = MAX_COUNT,
    none: bool = False,
    type_error: ErrorFactory = TypeError,
    value_error: ErrorFactory = ValueError,
    allowed: str | None = None,
) -> int | None:
    """Validate an integer in ``[minimum, maximum]`` (``bool`` is not an integer).

    Raises:
        type_error: not an int.
        value_error: out of range.
    """
    if value is None and none:
        return None
    if type(value) is int and minimum <= value <= maximum:
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        wording = allowed or f"an integer >= {minimum}" + (" or None" if none else "")
        raise _type_error(name, value, wording, type_error)
    if value < minimum:
        wording = allowed or f">= {minimum}"
        raise value_error(f"{name} must be {wording} (got {show(value)})")
    if value > maximum:
        raise value_error(f"{name} must be <= {maximum} (got {show(value)})")
    return int(value)


class Check:
    """Validation helpers; ``typed`` picks TypeError (Python API) or ConfigError (files)."""

    def __init__(self, *, typed: bool) -> None:
        self.typed = typed

    def bad_type(self, path: str, value: object, allowed: str) -> Exception:
        msg = f"{path} must be {allowed} (got {show(value)} of type {type(value).__name__})"
        if self.typed:
            return TypeError(msg)
        return ConfigError(msg, path=path, value=value)

    @staticmethod
    def bad_value(path: str, value: object, allowed: str) -> ConfigError:
        return ConfigError(f"{path} must be {allowed} (got {show(value)})", path=path, value=value)

    def _factories(self, path: str, value: object) -> tuple[ErrorFactory, ErrorFactory]:
        def config_error(msg: str) -> Exception:
            return ConfigError(msg, path=path, value=value)

        return (TypeError if self.typed else config_error), config_error

    def integer(self, path: str, value: object, *, minimum: int, none: bool = False) -> int | None:
        type_error, value_error = self._factories(path, value)
        return check_int(
            path,
            value,
            minimum=minimum,
            none=none,
            type_error=type_error,
            value_error=value_error,
            allowed=f"an integer >= {minimum}" + (" or null" if none else ""),
        )

    def number(
        self,
        path: str,
        value: object,
        *,
        minimum: float = 0.0,
        strict: bool = False,
        none: bool = False,
    ) -> float | None:
        """A finite number (durations: the unit and bound follow the name's suffix)."""
        unit, maximum = "", MAX_SECONDS
        if path.endswith("_ms"):
            unit, maximum = " ms", MAX_SECONDS * 1000.0
        elif path.endswith(("_s", "_sec")):
            unit = " seconds"
        type_error, value_error = self._factories(path, value)
        bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
        return check_number(
            path,
            value,
            minimum=minimum,
            strict=strict,
            maximum=maximum,
            unit=unit,
            none=none,
            type_error=type_error,
            value_error=value_error,
            allowed=f"a finite number {bound}" + (" or null" if none else ""),
        )

    def name(self, path: str, value: object, *, none: bool = False) -> str | None:
        if value is None and none:
            return None
        allowed = "a non-empty string" + (" or null" if none else "")
        if not isinstance(value, str):
            raise self.bad_type(path, value, allowed)
        if not value.strip():
            raise self.bad_value(path, value, allowed)
        return value

    def boolean(self, path: str, value: object) -> bool:
        if not isinstance(value, bool):
            raise self.bad_type(path, value, "true or false")
        return value

    def mapping(self, path: str, value: object) -> Mapping[Any, Any]:
        if not isinstance(value, Mapping):
            raise self.bad_type(path, value, "a mapping")
        return value

    def budgets(
        self, path: str, value: object, *, key_check: Callable[[str, object], str]
    ) -> Mapping[str, int]:
        items = self.mapping(path, value)
        out: dict[str, int] = {}
        for key, budget in items.items():
            name = key_check(f"{path}.{key}", key)
            parsed = self.integer(f"{path}.{name}", budget, minimum=1)
            assert parsed is not None
            out[name] = parsed
        return MappingProxyType(out)

    def reason_key(self, path: str, key: object) -> str:
        allowed = ", ".join(r.value for r in Reason)
        if not isinstance(key, str):
            raise self.bad_type(path, key, f"a reason ({allowed})")
        try:
            return Reason(key).value
        except ValueError:
            raise self.bad_value(path, key, f"a reason: one of {allowed}") from None

    def class_name(self, path: str, key: object) -> str:
        if not isinstance(key, str):
            raise self.bad_type(path, key, "an exception class name")
        if not key.isidentifier():
            raise self.bad_value(path, key, "an exception class name such as 'ReadTimeout'")
        return key

    def names(self, path: str, value: object) -> tuple[str, ...]:
        if isinstance(value, str) or not isinstance(value, Sequence):
            raise self.bad_type(path, value, "a list of exception class names")
        return tuple(self.class_name(f"{path}[{i}]", v) for i, v in enumerate(value))

    def fraction(self, path: str, value: object, *, none: bool = False) -> float | None:
        """A number strictly between 0 and 1 (a multiplier that must shrink)."""
        if value is None and none:
            return None
        allowed = "a number > 0 and < 1" + (" or null" if none else "")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.bad_type(path, value, allowed)
        # Compared before any float(): exact for ints of any size, False for NaN.
        if not 0 < value < 1:
            raise self.bad_value(path, value, allowed)
        return float(value)


#: For the Python API (wrong types raise TypeError).
PY = Check(typed=True)
#: For config files and mappings (everything raises ConfigError).
FILE = Check(typed=False)
