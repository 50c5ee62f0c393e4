"""The scenario's ``provider`` section -> :class:`ProviderSpec`: the simulated provider's rules.

Slots and what happens when they are full, the per-minute and burst-rate (slope) rules,
token budgets (token buckets, or Azure's quota rule), outages, a shared pool's noise,
latencies, Retry-After and the headers sent. Like the rest of the scenario file, shapes and
ranges only, each refusal naming its key path (the shared checks are
:mod:`._parse_values`'); cross-section checks (a token limit needs call sizes in the
fleet) are :func:`._parse.parse_scenario`'s.

Split out of ``_parse`` as its own concern: the provider model's knobs, the largest
section and the one most often extended, apart from the workload and strategies.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from ._parse_values import (
    as_mapping,
    boolean,
    check_keys,
    fail,
    integer,
    join,
    lognormal,
    number,
    optional_int,
)
from ._spec import BurstRule, Outage, ProviderSpec, SharedPool, TokenLimits

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["parse_provider"]


def _burst(value: object, path: str) -> BurstRule | None:
    if value is None:
        return None
    data = as_mapping(value, path)
    check_keys(
        data,
        path,
        ("window_s", "growth", "floor", "growth_min", "growth_max", "drift", "count_rejected"),
    )
    growth = number(data, "growth", path, 2.0, minimum=1.0)
    low = high = None
    drift = 0.0
    if "growth_min" in data or "growth_max" in data or "drift" in data:
        # A dynamic threshold: all three, or a clear error naming the missing one.
        for key in ("growth_min", "growth_max", "drift"):
            if key not in data:
                raise fail(
                    join(path, key), None, "set too when any of growth_min, growth_max, drift is"
                )
        low = number(data, "growth_min", path, 1.0, minimum=1.0)
        high = number(data, "growth_max", path, 1.0, minimum=1.0)
        drift = number(data, "drift", path, 0.0, strict=True)
        if high < low:
            raise fail(join(path, "growth_max"), high, f">= growth_min ({low:g})")
        if not low <= growth <= high:
            raise fail(
                join(path, "growth"),
                growth,
                f"within [growth_min, growth_max] ([{low:g}, {high:g}])",
            )
    return BurstRule(
        window_s=number(data, "window_s", path, 10.0, strict=True),
        growth=growth,
        floor=integer(data, "floor", path, 20, minimum=1),
        growth_min=low,
        growth_max=high,
        drift=drift,
        count_rejected=boolean(data, "count_rejected", path, False),
    )


def _token_limits(value: object, path: str) -> TokenLimits | None:
    if value is None:
        return None
    data = as_mapping(value, path)
    keys = ("rpm", "tpm", "itpm", "otpm")
    extra = ("capacity_s", "charge_rejected", "background")
    check_keys(data, path, (*keys, *extra, "rule", "interval_s"))
    rule = data.get("rule", "buckets")
    if rule not in ("buckets", "azure"):
        raise fail(join(path, "rule"), rule, "'buckets' or 'azure'")
    if rule == "azure":
        return _azure_limits(data, path)
    if "interval_s" in data:
        raise fail(join(path, "interval_s"), data["interval_s"], "left out without rule: azure")
    limits = {key: optional_int(data, key, path, minimum=1) for key in keys}
    if all(v is None for v in limits.values()):
        raise fail(path, dict(data), "a mapping setting at least one of rpm, tpm, itpm, otpm")
    background = number(data, "background", path, 0.0)
    if background >= 1.0:
        raise fail(join(path, "background"), background, "a number >= 0 and < 1")
    return TokenLimits(
        rpm=limits["rpm"],
        tpm=limits["tpm"],
        itpm=limits["itpm"],
        otpm=limits["otpm"],
        capacity_s=number(data, "capacity_s", path, 60.0, strict=True),
        charge_rejected=boolean(data, "charge_rejected", path, False),
        background=background,
    )


def _azure_limits(data: Mapping[str, Any], path: str) -> TokenLimits:
    """``rule: azure``: a TPM quota; the RPM, windows and charges follow from the rule."""
    for key in ("rpm", "itpm", "otpm", "capacity_s", "charge_rejected", "background"):
        if key in data:
            raise fail(
                join(path, key),
                data[key],
                "left out with rule: azure (a TPM quota per deployment; its RPM is 6 per"
                " 1,000 TPM, its windows fixed)",
            )
    if data.get("tpm") is None:
        raise fail(join(path, "tpm"), None, "set with rule: azure (the deployment's quota)")
    interval = number(data, "interval_s", path, 10.0, strict=True)
    if interval not in (1.0, 10.0):
        raise fail(join(path, "interval_s"), interval, "1 or 10 (seconds)")
    return TokenLimits(
        tpm=optional_int(data, "tpm", path, minimum=1), rule="azure", interval_s=interval
    )


def _outages(value: object, path: str) -> tuple[Outage, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise fail(path, value, "a list of {start_s, end_s} mappings")
    result = []
    for index, item in enumerate(value):
        where = f"{path}[{index}]"
        data = as_mapping(item, where)
        check_keys(data, where, ("start_s", "end_s"))
        start = number(data, "start_s", where, 0.0)
        end = number(data, "end_s", where, 0.0)
        if end <= start:
            raise fail(f"{where}.end_s", end, f"> start_s ({start:g})")
        result.append(Outage(start_s=start, end_s=end))
    return tuple(sorted(result, key=lambda o: o.start_s))


def _shared_pool(value: object, path: str) -> SharedPool | None:
    if value is None:
        return None
    data = as_mapping(value, path)
    check_keys(data, path, ("probability", "kind"))
    if "probability" not in data:
        raise fail(join(path, "probability"), None, "set (the share of arrivals turned away)")
    probability = number(data, "probability", path, 0.0, strict=True)
    if probability >= 1.0:
        raise fail(join(path, "probability"), probability, "a number > 0 and < 1")
    kind = data.get("kind", "burst")
    if kind not in ("burst", "rpm", "overloaded"):
        raise fail(join(path, "kind"), kind, '"burst", "rpm" or "overloaded"')
    return SharedPool(probability=probability, kind=kind)


def parse_provider(value: object, path: str) -> ProviderSpec:
    base = ProviderSpec()
    data = as_mapping({} if value is None else value, path)
    check_keys(
        data,
        path,
        (
            "slots",
            "on_full",
            "max_queue",
            "rpm",
            "burst",
            "retry_after_s",
            "latency",
            "reject_latency",
            "outages",
            "shared_pool",
            "tokens",
            "headers",
            "plain_429",
        ),
    )
    headers = data.get("headers", base.headers)
    if headers not in ("none", "openai", "anthropic"):
        raise fail(join(path, "headers"), headers, '"none", "openai" or "anthropic"')
    on_full = data.get("on_full", base.on_full)
    if on_full not in ("reject", "queue"):
        raise fail(join(path, "on_full"), on_full, '"reject" or "queue"')
    raw = data.get("retry_after_s")
    retry_after: float | Literal["auto"] | None = (
        raw if raw is None or raw == "auto" else number(data, "retry_after_s", path, 0.0)
    )
    max_queue = optional_int(data, "max_queue", path, minimum=1)
    if max_queue is not None and on_full != "queue":
        raise fail(join(path, "max_queue"), max_queue, 'null unless on_full is "queue"')
    return ProviderSpec(
        slots=integer(data, "slots", path, base.slots, minimum=1),
        on_full=on_full,
        max_queue=max_queue,
        rpm=optional_int(data, "rpm", path, minimum=1),
        burst=_burst(data.get("burst"), join(path, "burst")),
        retry_after=retry_after,
        latency=lognormal(data.get("latency", {}), join(path, "latency"), base.latency),
        reject_latency=lognormal(
            data.get("reject_latency", {}), join(path, "reject_latency"), base.reject_latency
        ),
        outages=_outages(data.get("outages"), join(path, "outages")),
        shared_pool=_shared_pool(data.get("shared_pool"), join(path, "shared_pool")),
        tokens=_token_limits(data.get("tokens"), join(path, "tokens")),
        headers=headers,
        plain_429=boolean(data, "plain_429", path, False),
    )
