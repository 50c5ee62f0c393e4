"""``@policy.retry``: a function that always runs under a policy, checked like the original.

The decorator form of :meth:`anygate.Policy.call` and :meth:`~anygate.Policy.call_sync`
(stamina's ``@retry`` and tenacity's ``@retry`` are the models): the wrapper keeps the
function's signature for type checkers (``ParamSpec``) and its name and docstring
(:func:`functools.wraps`), and every call goes through the policy, so the two forms share
one attempt loop and cannot drift apart. It is a thin client: no behaviour of its own.
"""

from __future__ import annotations

import functools
import inspect
from typing import TYPE_CHECKING, Any, TypeVar, overload

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine

    from typing_extensions import ParamSpec

    from .policy import Policy

    P = ParamSpec("P")

T = TypeVar("T")

__all__ = ["retry"]


@overload
def retry(
    policy: Policy, fn: Callable[P, Coroutine[Any, Any, T]], /
) -> Callable[P, Coroutine[Any, Any, T]]: ...


@overload
def retry(policy: Policy, fn: Callable[P, T], /) -> Callable[P, T]: ...


def retry(policy: Policy, fn: Callable[..., Any], /) -> Callable[..., Any]:
    """Decorate ``fn`` so that each call runs under ``policy``.

    An ``async def`` function (or a callable whose ``__call__`` is one) becomes an async
    function running ``await policy.call(fn, ...)``; anything else a blocking function
    running ``policy.call_sync(fn, ...)``. Each call of the result is one guarded call:
    one slot per attempt, classified failures, retries without a slot, the breaker.

    A ``deadline`` keyword argument of the call goes to ``fn`` itself, not to the policy
    (use :meth:`~anygate.Policy.call` for a per-call deadline).

    Raises:
        TypeError: ``fn`` is not callable.
    """
    if not callable(fn):  # for untyped callers
        msg = f"policy.retry() decorates a function (got {fn!r} of type {type(fn).__name__})"  # type: ignore[unreachable]
        raise TypeError(msg)
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004  # an instance with an async __call__
    ):

        @functools.wraps(fn)
        async def guarded(*args: Any, **kwargs: Any) -> Any:
            if "deadline" in kwargs:  # fn's own argument: keep it away from Policy.call
                return await policy.call(functools.partial(fn, *args, **kwargs))
            return await policy.call(fn, *args, **kwargs)

        return guarded

    @functools.wraps(fn)
    def guarded_sync(*args: Any, **kwargs: Any) -> Any:
        if "deadline" in kwargs:
            return policy.call_sync(functools.partial(fn, *args, **kwargs))
        return policy.call_sync(fn, *args, **kwargs)

    return guarded_sync
