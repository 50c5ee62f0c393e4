"""The ``oracle``: a client that knows the provider's hidden rules exactly. The yardstick.

It serves the fleet's calls in FIFO order (by the time each call was asked for) and sends
the head of its queue only at an instant when the provider would admit it: outside any
outage, under the RPM window, with every token bucket holding what the request costs, under
the burst rule's allowance for the current window (the dynamic growth factor included) and
with a slot free. So it is never rejected, and every
strategy's makespan can be put next to it. It is the one strategy that reads the hidden
provider (:meth:`~anygate.sim._provider.ProviderModel.admission_wait`); no other strategy
is given it.

A shared pool's random rejections (``provider.shared_pool``) are the one thing it cannot
foresee; it sends such a call again at once, ahead of the calls asked for after it.

It is not optimal: FIFO is not the schedule that minimises makespan (serving the agents
furthest behind first can be shorter), so a strategy may beat it, which the report shows as
a ratio below 1. It never beats the lower bound, which is a bound.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

import anyio

from ._provider import ProviderError

if TYPE_CHECKING:
    from ._protocol import Send
    from ._provider import ProviderModel

__all__ = ["Oracle"]


class Oracle:
    """FIFO, perfectly paced against the hidden rules; see the module docstring.

    Args:
        provider: the run's provider (its hidden state is read before each send).
    """

    summary = "knows the provider's hidden rules; sends only what would be admitted; FIFO"

    def __init__(self, provider: ProviderModel) -> None:
        self._provider = provider
        self._queue: deque[anyio.Event] = deque()
        self._changed = anyio.Event()
        provider.on_leave(self._notify)

    def _notify(self) -> None:
        self._changed.set()

    async def call(self, send: Send) -> None:
        """Wait for this call's turn and for an admissible instant, then send it.

        Sent once, unless a shared pool turns it away at random (no client can foresee
        that): then it goes again as soon as the rules allow, ahead of every call that was
        asked for later.
        """
        # The request's size is what its caller knows before sending (a Request says it).
        prompt = int(getattr(send, "prompt_tokens", 0))
        max_tokens = int(getattr(send, "max_tokens", 0))
        retry = False
        while True:
            await self._wait_turn(prompt, max_tokens, retry=retry)
            # No await between the check in _wait_turn and the provider's admission:
            # send() checks the rules and takes the slot before it first blocks.
            try:
                await send()
            except ProviderError as exc:
                if not self._provider.turned_away_at_random(exc):
                    raise
                retry = True
            else:
                return

    async def _wait_turn(self, prompt: int, max_tokens: int, *, retry: bool) -> None:
        turn = anyio.Event()
        queue = self._queue
        if retry and queue:
            queue.insert(1, turn)  # right behind the head, which already watches the provider
        else:
            queue.append(turn)
        if queue[0] is turn:
            turn.set()
        try:
            # Only the head of the queue watches the provider; the others wait their turn,
            # so a slot freed wakes one task, not the whole queue.
            await turn.wait()
            while (wait := self._provider.admission_wait(prompt, max_tokens)) != 0.0:
                self._changed = changed = anyio.Event()
                if wait is None:
                    await changed.wait()
                else:
                    with anyio.move_on_after(wait):
                        await changed.wait()
        finally:
            head = queue[0] is turn
            if head:
                queue.popleft()
            else:  # left before its turn (a deadline): rare, so the O(n) scan is fine
                queue.remove(turn)
            if head and queue:
                queue[0].set()
