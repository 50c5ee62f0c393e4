"""Reading a provider's exception by duck typing: status, codes, text, headers, host.

Classification (``classify``) decides; this module only *looks*. It reads
``status_code``, ``code``, ``type``, ``body`` (JSON or text, ``body["error"]`` included),
``response.headers`` and the message from the exceptions of ``openai``, ``anthropic``,
``httpx``/``httpx2`` and friends without importing any of them, and survives attributes
that raise (httpx's ``.request`` does). An exception without a ``body`` (httpx's
``HTTPStatusError``) is read through its ``response``, but only a body already in memory:
classifying never reads from the network. Gathered once per exception into a
:class:`Facts`. :func:`headers_of` finds the response headers on a result or an exception
the same way, for header learning (``_limits.learn``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "KNOWN_PROVIDERS",
    "Facts",
    "decode_body",
    "detect_provider",
    "gather",
    "headers_of",
    "loaded_content",
    "read_attr",
]


@dataclass(frozen=True)
class Facts:
    """What classification looks at, gathered once per exception."""

    status: int | None
    codes: tuple[str, ...]  # lower-cased error codes and types
    text: str  # lower-cased message(s), codes included
    headers: object
    class_names: tuple[str, ...]
    modules: tuple[str, ...]
    host: str


def read_attr(obj: object, name: str) -> object:
    """``getattr`` that survives properties which raise (httpx's ``.request`` does)."""
    if obj is None:
        return None
    try:
        return getattr(obj, name, None)
    except Exception:
        return None


def _int_status(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and 100 <= value <= 599:
        return value
    return None


def decode_body(body: object) -> object:
    """A body as the SDKs hold it: bytes decoded, JSON parsed when it looks like JSON."""
    if isinstance(body, (bytes, bytearray)):
        body = bytes(body).decode("utf-8", "replace")
    if isinstance(body, str):
        stripped = body.strip()
        if stripped[:1] in ("{", "["):
            try:
                return json.loads(stripped)
            except ValueError:
                return body
    return body


def loaded_content(response: object) -> bytes | None:
    """The body of an httpx/httpx2-style ``response`` if it is already in memory, else None.

    Only a *closed* response is read: its ``content`` is then either loaded or raises
    (``ResponseNotRead``, swallowed), never a read from the network. An open one, or a
    response of a library whose ``content`` streams on access (``requests``), is left alone.
    """
    if read_attr(response, "is_closed") is not True:
        return None
    content = read_attr(response, "content")
    return bytes(content) if isinstance(content, (bytes, bytearray)) else None


def _str_values(mapping: object, keys: Sequence[str]) -> list[str]:
    out: list[str] = []
    if isinstance(mapping, dict):
        for key in keys:
            value = mapping.get(key)
            if isinstance(value, (str, int)) and not isinstance(value, bool) and value != "":
                out.append(str(value))
    return out


def _host_of(exc: BaseException) -> str:
    for holder in (exc, read_attr(exc, "response")):
        request = read_attr(holder, "request")
        url = read_attr(request, "url")
        host = read_attr(url, "host")
        if isinstance(host, str) and host:
            return host.lower()
    return ""


def gather(exc: BaseException) -> Facts:
    """Everything classification reads from ``exc``, wherever the SDK put it."""
    response = read_attr(exc, "response")
    status = None
    for holder, attr in (
        (exc, "status_code"),
        (exc, "status"),
        (exc, "http_status"),
        (response, "status_code"),
        (response, "status"),
    ):
        status = _int_status(read_attr(holder, attr))
        if status is not None:
            break

    raw = read_attr(exc, "body")
    if raw is None:
        # httpx's HTTPStatusError (from raise_for_status()) carries only the response.
        raw = loaded_content(response)
    body = decode_body(raw)
    error = body.get("error") if isinstance(body, dict) else None
    codes: list[str] = []
    for attr in ("code", "type", "error_code"):
        value = read_attr(exc, attr)
        if isinstance(value, (str, int)) and not isinstance(value, bool) and value != "":
            codes.append(str(value))
    codes += _str_values(error, ("code", "type"))
    codes += _str_values(body, ("code", "type", "error_code"))
    if isinstance(error, str):
        codes.append(error)

    messages = [str(exc)]
    for attr in ("message", "api_message"):
        value = read_attr(exc, attr)
        if isinstance(value, str):
            messages.append(value)
    messages += _str_values(error, ("message",))
    messages += _str_values(body, ("message", "msg", "detail"))
    if isinstance(body, str):
        messages.append(body[:2000])
    lowered_codes = tuple(dict.fromkeys(c.lower() for c in codes))
    text = " ".join([*messages, *codes]).lower()

    headers = read_attr(exc, "headers")
    if headers is None:
        headers = read_attr(response, "headers")
    mro = type(exc).__mro__
    return Facts(
        status=status,
        codes=lowered_codes,
        text=text,
        headers=headers,
        class_names=tuple(c.__name__ for c in mro),
        modules=tuple(c.__module__ or "" for c in mro),
        host=_host_of(exc),
    )


#: The providers whose errors classification tells apart, by hint or by host. A hint is
#: only worth giving for these (``dashscope``'s per-window 429 wording collides with
#: OpenAI's billing one); a config naming another (a typo such as ``openia``) would
#: change nothing, so the config refuses it (issue 28). Grows with ``detect_provider``.
KNOWN_PROVIDERS = ("openai", "anthropic", "dashscope", "ark")


def detect_provider(facts: Facts, provider: str | None) -> str:
    """The configured provider hint, else a guess from the request's host ('' if none)."""
    if provider:
        return provider.lower()
    host = facts.host
    if "dashscope" in host or "aliyuncs" in host:
        return "dashscope"
    if "volces" in host or "volcengine" in host:
        return "ark"
    if "anthropic" in host:
        return "anthropic"
    if "openai" in host:
        return "openai"
    return ""


def _looks_like_headers(value: object) -> bool:
    return callable(getattr(value, "get", None)) and callable(getattr(value, "items", None))


def headers_of(obj: object) -> object | None:
    """The response headers carried by an SDK / HTTP result or exception, else ``None``.

    Finds them on, in order: ``obj.response`` (``openai.APIStatusError``,
    ``anthropic.APIStatusError``, ``httpx.HTTPStatusError``, an SDK stream),
    ``obj.http_response`` (the SDKs' ``APIResponse``), and ``obj`` itself when it is a
    response (it has ``headers`` and ``status_code``: ``httpx.Response``, the SDKs'
    ``with_raw_response`` results). Parsed SDK models carry no headers: ``None``. So do
    requests and connection errors (a request's headers are not the provider's answer).
    Never raises (a property that fails counts as absent).
    """
    if obj is None:
        return None
    for name in ("response", "http_response", None):
        try:
            candidate = obj if name is None else getattr(obj, name, None)
            if candidate is None or not hasattr(candidate, "status_code"):
                continue
            headers = getattr(candidate, "headers", None)
        except Exception:  # e.g. httpx raises RuntimeError for an unset .response
            continue
        if headers is not None and _looks_like_headers(headers):
            found: object = headers
            return found
    return None
