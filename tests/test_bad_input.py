"""Absurd values, easy slips and secrets in URLs: clear errors, unchanged state, no leaks.

Regression tests for issue 9's bad-input findings: huge integers (``10**400``) raised a bare
``OverflowError`` without the parameter's name (and ``policy.max_concurrent_calls =
10**400`` half-updated the adaptive limit); ``Policy(hooks=print)`` and
``Policy(control_flow="KeyError")`` gave no useful error; a Gemini key in a URL's query
string reached CallFailed's text, the log and ``Verdict.detail``. Also issue 15's
``circuit_breaker=False``.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

import httpx
import pytest

import anygate
from anygate import (
    AdaptiveConfig,
    BreakerConfig,
    CallFailed,
    CircuitBreaker,
    ConfigError,
    Gate,
    Policy,
    RetryConfig,
    load_config,
)
from anygate.asgi import GateMiddleware
from anygate.httpx import GatedTransport
from tests.policy_helpers import Script

if TYPE_CHECKING:
    from collections.abc import Callable

HUGE = 10**400
ABSURD: list[Any] = [HUGE, -HUGE, math.nan, 1e300, True, "5"]


async def _asgi_app(scope: Any, receive: Any, send: Any) -> None:
    """A do-nothing ASGI app for the middleware's argument checks."""


def _acquire_timeout(value: Any) -> None:
    Gate(1).acquire(timeout=value)


def _acquire_sync_timeout(value: Any) -> None:
    Gate(1).acquire_sync(timeout=value).release()  # a free slot: returns at once if valid


def _check_deadline(value: Any) -> None:
    from anygate._policy.retrying import check_deadline

    check_deadline(value)


ENTRY_POINTS: list[tuple[str, Callable[[Any], object]]] = [
    ("capacity", lambda v: Gate(v)),
    ("timeout", _acquire_timeout),
    ("timeout", _acquire_sync_timeout),
    ("deadline", _check_deadline),
    ("busy_wait_s", lambda v: Policy(busy_wait_s=v)),
    ("attempt_timeout_s", lambda v: Policy(attempt_timeout_s=v)),
    ("max_concurrent_calls", lambda v: Policy(max_concurrent_calls=v)),
    ("max_attempts", lambda v: RetryConfig(max_attempts=v)),
    ("throttle_attempts", lambda v: RetryConfig(throttle_attempts=v)),
    ("base_delay_ms", lambda v: RetryConfig(base_delay_ms=v)),
    ("retry_after_max_s", lambda v: RetryConfig(retry_after_max_s=v)),
    ("reason_budgets.burst_rate", lambda v: RetryConfig(reason_budgets={"burst_rate": v})),
    ("min_concurrent_calls", lambda v: AdaptiveConfig(min_concurrent_calls=v)),
    ("decrease_factor", lambda v: AdaptiveConfig(decrease_factor=v)),
    ("pause_ms", lambda v: AdaptiveConfig(pause_ms=v)),
    ("failure_threshold", lambda v: BreakerConfig(failure_threshold=v)),
    ("recovery_timeout_sec", lambda v: BreakerConfig(recovery_timeout_sec=v)),
    ("failure_threshold", lambda v: CircuitBreaker(failure_threshold=v)),
    ("recovery_timeout", lambda v: CircuitBreaker(recovery_timeout=v)),
    ("recovery_timeout", lambda v: anygate.shared_breaker("llm", recovery_timeout=v)),
    ("failure_threshold", lambda v: anygate.shared_breaker("llm", failure_threshold=v)),
    ("capacity", lambda v: anygate.shared_gate("llm", capacity=v)),
    ("pause_s", lambda v: Policy(name="adaptive").adaptive_limit.configure(pause_s=v)),
    (
        "min_concurrent_calls",
        lambda v: Policy(name="adaptive").adaptive_limit.configure(min_concurrent_calls=v),
    ),
    ("capacity", lambda v: Policy(name="adaptive").adaptive_limit.resize(v)),
    ("timeout", lambda v: GateMiddleware(_asgi_app, gate=Gate(1), timeout=v)),
    ("retry_after", lambda v: GateMiddleware(_asgi_app, gate=Gate(1), retry_after=v)),
    ("timeout", lambda v: GatedTransport(gate=Gate(1), timeout=v)),
    (
        "llm_call.busy_wait_s",
        lambda v: load_config({"llm_call": {"busy_wait_s": v}}),
    ),
    (
        "llm_call.max_concurrent_calls",
        lambda v: load_config({"llm_call": {"max_concurrent_calls": v}}),
    ),
    (
        "circuit_breaker.recovery_timeout_sec",
        lambda v: load_config({"circuit_breaker": {"recovery_timeout_sec": v}}),
    ),
    (
        "llm_call.adaptive_concurrency.pause_ms",
        lambda v: load_config({"llm_call": {"adaptive_concurrency": {"pause_ms": v}}}),
    ),
]


# Waits where any finite float is accepted (the waiters cap them at threading.TIMEOUT_MAX).
WAITS = {"timeout", "deadline"}
FINITE_ONLY = {make for name, make in ENTRY_POINTS if name == "retry_after"}


@pytest.mark.parametrize("value", ABSURD, ids=["huge", "-huge", "nan", "1e300", "bool", "str"])
@pytest.mark.parametrize(("name", "make"), ENTRY_POINTS, ids=[n for n, _ in ENTRY_POINTS])
def test_absurd_numbers_raise_errors_naming_the_parameter(
    name: str, make: Callable[[Any], object], value: Any
) -> None:
    """Every number entry point: TypeError or ValueError (ConfigError is one) naming the
    parameter, never a bare OverflowError. 1e300 seconds is accepted only where the wait
    is capped by the waiters (gate and transport timeouts, deadlines)."""
    if value == 1e300 and name in WAITS and make not in FINITE_ONLY:
        make(value)  # a wait longer than any clock: accepted, waits like None
        return
    with pytest.raises((TypeError, ValueError)) as info:
        make(value)
    assert not isinstance(info.value, OverflowError)
    assert name in str(info.value)


def test_a_huge_max_concurrent_calls_leaves_the_policy_unchanged() -> None:
    """``policy.max_concurrent_calls = 10**400`` is refused before anything changes: the
    property and repr keep working (before: the adaptive limit was half-updated)."""
    policy = Policy(name="huge", max_concurrent_calls=4)
    before = (policy.max_concurrent_calls, policy.gate.capacity, repr(policy))
    for value in (HUGE, -1, 2.0, None):
        with pytest.raises((TypeError, ValueError), match="max_concurrent_calls"):
            policy.max_concurrent_calls = value
    assert (policy.max_concurrent_calls, policy.gate.capacity, repr(policy)) == before


def test_a_huge_capacity_leaves_the_gate_unchanged() -> None:
    """``gate.capacity = 10**400`` is refused and the gate keeps its capacity."""
    gate = Gate(3)
    with pytest.raises(ValueError, match="capacity must be <="):
        gate.capacity = HUGE
    assert gate.capacity == 3
    assert repr(gate) == f"<anygate.Gate {gate.name!r} 0/3, 0 waiting>"


def test_breaker_configure_with_a_huge_value_changes_nothing() -> None:
    """configure() validates every argument before applying any."""
    breaker = CircuitBreaker(failure_threshold=2, recovery_timeout=5)
    with pytest.raises(ValueError, match="recovery_timeout"):
        breaker.configure(failure_threshold=3, recovery_timeout=HUGE)
    assert (breaker.failure_threshold, breaker.recovery_timeout) == (2, 5)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"hooks": print}, "hooks must be a list"),
        ({"hooks": "print"}, "hooks must be a list"),
        ({"control_flow": "KeyError"}, "control_flow must be a list"),
        ({"control_flow": KeyError}, "control_flow must be a list"),
        ({"rules": 5}, "rules must be a list"),
        ({"circuit_breaker": "off"}, "circuit_breaker must be"),
    ],
)
def test_a_lone_item_where_a_list_belongs_is_refused_by_name(
    kwargs: dict[str, Any], fragment: str
) -> None:
    """``hooks=print`` or ``control_flow="KeyError"`` name the argument and suggest a list
    (before: "object is not iterable", or the letters K, e, y... taken as class names)."""
    with pytest.raises(TypeError, match=fragment) as info:
        Policy(**kwargs)
    if "must be a list" in fragment:
        assert "for one item write" in str(info.value)


def test_hooks_and_control_flow_accept_any_iterable() -> None:
    """A generator of hooks is read once and kept (not exhausted by the check)."""
    policy = Policy(hooks=(h for h in [print]), control_flow=(c for c in ["KeyError"]))
    assert policy.hooks == (print,)
    assert policy.config.control_flow == ("KeyError",)


@pytest.mark.anyio
@pytest.mark.parametrize("off", [False, None, BreakerConfig(enabled=False)])
async def test_circuit_breaker_false_turns_the_breaker_off(off: Any) -> None:
    """``circuit_breaker=False`` means no breaker, as ``adaptive_concurrency=False`` does."""
    policy = Policy(name="nobreaker", circuit_breaker=off)
    assert policy.breaker is None
    assert "breaker off" in repr(policy)
    assert await policy.call(Script()) == "ok"


def test_circuit_breaker_true_and_false_in_config_files() -> None:
    """``circuit_breaker: false`` in YAML or a mapping turns it off (it used to be read as
    an empty section, which left it on); ``true`` keeps the defaults."""
    off = load_config({"circuit_breaker": False})
    assert off.circuit_breaker.enabled is False
    assert Policy.from_config(off).breaker is None
    assert load_config({"circuit_breaker": True}).circuit_breaker.enabled is True
    assert Policy(circuit_breaker=True).breaker is not None
    with pytest.raises(ConfigError, match="circuit_breaker must be a mapping, true or false"):
        load_config({"circuit_breaker": 3})


# ----------------------------------------------------------------- redaction

GEMINI_KEY = "AIzaSyD-1234567890abcdefghijklmnopqrs"
SECRETS = {
    "gemini query": f"https://generativelanguage.googleapis.com/v1beta/models/x?key={GEMINI_KEY}",
    "gemini header": f"x-goog-api-key: {GEMINI_KEY}",
    "gemini json": f'{{"key": "{GEMINI_KEY}"}}',
    "groq": "invalid key gsk_0123456789abcdefghijABCDEFGHIJ",
    "xai": "Incorrect API key provided: xai-0123456789abcdefghijABCDEFGHIJ",
    "hugging face": "token hf_0123456789abcdefghijABCDEFGHIJ rejected",
    "azure header": "api-key: 0123456789abcdef0123456789abcdef",
    "azure sas": "https://acct.blob.core.windows.net/c/b?sv=2024&sig=Zm9vYmFyYmF6cXV4",
    "aws": "credential AKIAIOSFODNN7EXAMPLE invalid",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N",
    "json api_key": '{"api_key": "not-a-prefixed-secret-value"}',
}
SECRET_VALUES = [
    GEMINI_KEY,
    "gsk_0123456789",
    "xai-0123456789",
    "hf_0123456789",
    "0123456789abcdef0123456789abcdef",
    "Zm9vYmFyYmF6cXV4",
    "AKIAIOSFODNN7EXAMPLE",
    "dozjgNryP4J3jVmNHl0w5N",
    "not-a-prefixed-secret-value",
]


@pytest.mark.parametrize("text", list(SECRETS.values()), ids=list(SECRETS))
def test_every_provider_key_shape_is_redacted(text: str) -> None:
    """Each key shape and place (header, query, JSON body) is masked by redact()."""
    out = anygate.redact(text)
    assert "[REDACTED]" in out
    for secret in SECRET_VALUES:
        assert secret not in out


@pytest.mark.anyio
async def test_a_key_in_a_url_query_never_reaches_text_we_write(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An httpx error for ``...?key=AIza...`` (Gemini's documented form): CallFailed's text,
    its verdict's detail, events and the anygate log carry no key (before: verbatim)."""
    url = f"https://generativelanguage.googleapis.com/v1beta/models/g:generateContent?key={GEMINI_KEY}"
    request = httpx.Request("POST", url)
    response = httpx.Response(503, request=request, text="overloaded")
    error = httpx.HTTPStatusError(
        f"Server error '503' for url '{url}'", request=request, response=response
    )
    events: list[Any] = []
    policy = Policy(
        name="gemini",
        retry=RetryConfig(max_attempts=2, base_delay_ms=0, cap_delay_ms=0),
        hooks=[events.append],
    )
    with caplog.at_level(logging.DEBUG, logger="anygate"), pytest.raises(CallFailed) as info:
        await policy.call(Script(error, error))
    texts = [str(info.value), info.value.verdict.detail, info.value.user_message, caplog.text]
    texts += [repr(event) for event in events]
    assert any("[REDACTED]" in text for text in texts)
    for text in texts:
        assert GEMINI_KEY not in text


# --- issue 28: one rule for names, known providers, Redis URLs read as written ---------------


def _fleet(name: str = "f", url: str = "redis://127.0.0.1:6379/0") -> object:
    pytest.importorskip("coredis")
    from anygate.fleet import FleetGate

    return FleetGate(name, capacity=1, url=url)


NAME_TAKERS: list[tuple[str, Callable[[Any], object]]] = [
    ("Gate(name=)", lambda v: Gate(1, name=v)),
    ("shared_gate", anygate.shared_gate),
    ("shared_breaker", anygate.shared_breaker),
    ("CircuitBreaker(name=)", lambda v: CircuitBreaker(v)),
    ("Policy(name=)", lambda v: Policy(name=v)),
    ("Policy(gate_name=)", lambda v: Policy(name="p", gate_name=v)),
    ("load_config", lambda v: load_config({"llm_call": {"name": v}})),
    ("FleetGate", lambda v: _fleet(name=v)),
]


@pytest.mark.parametrize("value", ["", " ", "\t\n"], ids=["empty", "space", "blank"])
@pytest.mark.parametrize(("where", "make"), NAME_TAKERS, ids=[w for w, _ in NAME_TAKERS])
def test_every_name_refuses_empty_and_blank(
    where: str, make: Callable[[Any], object], value: str
) -> None:
    """An empty or whitespace-only name is refused wherever a name is taken, with the
    parameter, the rule and the value (issue 28: ``Gate(name='')`` and ``shared_gate(' ')``
    were accepted, ``Policy(name='')`` refused)."""
    with pytest.raises(ValueError, match="must be a non-empty string") as info:
        make(value)
    assert repr(value) in str(info.value)
    assert "name" in str(info.value)


def test_a_policy_provider_must_be_one_classification_knows() -> None:
    """``provider`` is a classification hint that only the known providers change, so a
    typo would silently drop the hint: it is refused, listing the known ones and the
    closest (issue 28: ``Policy(provider='openia')`` was accepted). Any case is fine."""
    with pytest.raises(ConfigError, match="did you mean 'openai'") as info:
        Policy(name="p", provider="openia")
    message = str(info.value)
    assert "provider must be one of openai, anthropic, dashscope, ark or null" in message
    assert "(got 'openia')" in message
    assert info.value.path == "provider"
    with pytest.raises(ConfigError, match=r"llm_call\.provider must be one of .*\(got 'azure'\)"):
        load_config({"llm_call": {"provider": "azure"}})
    with pytest.raises(TypeError, match="provider must be a non-empty string or null"):
        Policy(name="p", provider=3)  # type: ignore[arg-type]
    assert load_config({"llm_call": {"provider": "DashScope"}}).provider == "DashScope"
    assert Policy(name="p", provider="ark").config.provider == "ark"
    assert Policy(name="p").config.provider is None


@pytest.mark.parametrize(
    ("url", "complaint"),
    [
        ("http://127.0.0.1:6379/0", "must be a redis://, rediss:// or unix:// URL"),
        ("localhost:6379", "must be a redis://, rediss:// or unix:// URL"),
        ("redis://127.0.0.1:6379/abc", "must have a whole-number db after the host"),
        ("redis://127.0.0.1/0/1", "must have a whole-number db after the host"),
        ("rediss://127.0.0.1/0?db=x", "must have a whole-number db"),
        ("redis://127.0.0.1:port/0", "must have a port number from 0 to 65535"),
        ("unix://", "must name the socket"),
        ("unix:///tmp/redis.sock?db=one", "must have a whole-number db"),
    ],
)
def test_a_redis_url_is_read_as_written_or_refused(url: str, complaint: str) -> None:
    """A URL the Redis client would misread (``/abc`` silently db 0, ``http://`` taken as
    Redis) is refused naming ``url``, the rule and the URL (issue 28)."""
    with pytest.raises(ValueError, match=complaint) as info:
        _fleet(url=url)
    assert str(info.value).startswith("url must")
    assert repr(url) in str(info.value)


def test_a_refused_redis_url_never_shows_its_password() -> None:
    """The password in a refused URL is masked in the message."""
    with pytest.raises(ValueError, match="whole-number db") as info:
        _fleet(url="redis://app:s3cret-pw@redis.internal:6379/abc")
    assert "s3cret-pw" not in str(info.value)
    assert "'redis://app:***@redis.internal:6379/abc'" in str(info.value)


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1",
        "redis://127.0.0.1:6379/0",
        "REDIS://127.0.0.1:6379/15/",
        "rediss://user:pw@redis.example:6380/3",
        "redis://127.0.0.1:6379?db=2",
        "unix:///var/run/redis.sock?db=1",
    ],
)
def test_good_redis_urls_are_taken(url: str) -> None:
    """The documented URL forms are still accepted (nothing connects until first use)."""
    fleet = _fleet(url=url)
    assert fleet.name == "f"  # type: ignore[attr-defined]
