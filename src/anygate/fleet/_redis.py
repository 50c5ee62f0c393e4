"""The fleet's Redis link: one coredis client per session, every call under a deadline.

Two coredis 6.9 behaviours shape this module (both reproduced on this machine):

* A blocking command in flight when the server dies, or when the network drops packets,
  never returns. So every call here runs under a client-side deadline
  (``anyio.fail_after``), and a blocking pop's deadline is its server-side timeout plus the
  operation timeout.
* A cancelled blocking command discards its connection, and the pool never gives that
  connection's slot back: after ``max_connections`` cancellations every command of the
  client waits forever for a pool slot. So the fleet never cancels a blocking pop in
  normal operation (the server-side timeout always ends it first), and after *any*
  deadline or connection error the whole client is thrown away and a fresh one made.
  A session is the lifetime of one client; the agent opens a new session after a failure.

This module is the only one that imports coredis.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import anyio

from ._scripts import SYNC, keys_for, prefix_for

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence

__all__ = ["RATELESS", "Link", "LinkDown", "Session", "SyncReply"]

#: The script's rate arguments when the fleet has no rate.
RATELESS: tuple[object, ...] = ("", "", 0, 0, "", 0, 0, 0, "", 0, 0)


class LinkDown(Exception):
    """Raised when a Redis call failed or passed its deadline; the session is over."""

    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause


class SyncReply:
    """The script's answer, as numbers."""

    __slots__ = (
        "active",
        "cap",
        "epoch",
        "grace_left",
        "held",
        "limit",
        "permit_tokens",
        "permit_wait",
        "permits",
        "queued",
        "used",
    )

    def __init__(self, raw: Sequence[Any]) -> None:
        self.held = int(raw[0])
        limit = int(raw[1])
        self.limit: int | None = None if limit < 0 else limit
        self.epoch = str(raw[2])
        self.cap = int(raw[3])
        self.grace_left = int(raw[4]) / 1000.0
        self.used = int(raw[5])
        self.active = int(raw[6])
        self.queued = int(raw[7])
        self.permits = int(raw[8])
        self.permit_tokens = int(raw[9])
        wait = int(raw[10])
        self.permit_wait: float | None = None if wait < 0 else wait / 1000.0


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"


class Link:
    """How to reach Redis: the URL, the deadlines, and the fleet's keys.

    Args:
        url: a ``redis://`` / ``rediss://`` / ``unix://`` URL.
        name: the fleet gate's name (the hash tag of its keys).
        op_timeout: seconds any single call may take before the session is declared down.
        cluster: talk to a Redis Cluster (all keys share one hash tag, so one shard).
    """

    def __init__(self, url: str, name: str, *, op_timeout: float, cluster: bool = False) -> None:
        self.url = url
        self.name = name
        self.op_timeout = op_timeout
        self.cluster = cluster
        self.keys = keys_for(name)
        self.prefix = prefix_for(name)

    def where(self) -> str:
        """The server, for error messages (credentials stripped)."""
        tail = self.url.rsplit("@", 1)[-1]
        return tail.split("://", 1)[-1]

    async def probe(self) -> None:
        """Check that the server accepts connections, without coredis.

        coredis 6.9 leaks a connection's internal streams (ResourceWarning) for every
        connection attempt that fails, so while Redis is down the agent knocks with a plain
        socket and only builds a client once something answers.
        """
        parts = urlsplit(self.url)
        try:
            with anyio.fail_after(self.op_timeout):
                if parts.scheme == "unix":
                    stream: Any = await anyio.connect_unix(parts.path)
                else:
                    stream = await anyio.connect_tcp(
                        parts.hostname or "localhost", parts.port or 6379
                    )
                await stream.aclose()
        except (OSError, TimeoutError) as exc:
            raise LinkDown(_describe(exc)) from exc

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[Session]:
        """One fresh client for the duration of the block; connection errors become LinkDown."""
        import coredis
        from coredis.retry import NoRetryPolicy

        # No coredis-level retries: the agent decides what to resend, and the script is safe
        # to resend. No pool timeout of its own: our deadlines bound every wait.
        kwargs: dict[str, Any] = {"decode_responses": True, "retry_policy": NoRetryPolicy()}
        client: Any
        if self.cluster:
            client = coredis.RedisCluster.from_url(self.url, **kwargs)
        else:
            client = coredis.Redis.from_url(self.url, **kwargs)
        # Entering the client only starts its pool's task group (connections are made by
        # the first command, under that command's deadline), so it is not under a deadline
        # itself: a task group must not be opened inside a cancel scope it outlives.
        async with client:
            yield Session(self, client)


class Session:
    """Calls on one client. Any failure raises :class:`LinkDown`; the client is then unusable."""

    def __init__(self, link: Link, client: Any) -> None:
        import hashlib

        from coredis.exceptions import NoScriptError, RedisError

        self._link = link
        self._client = client
        self._errors: tuple[type[BaseException], ...] = (
            OSError,
            TimeoutError,
            RedisError,
        )
        self._noscript = NoScriptError
        self._sha = hashlib.sha1(SYNC.encode()).hexdigest()
        # The cold path in one round trip: a session's first call sends the script with
        # EVAL (which also caches it), later ones EVALSHA. coredis's Script would try
        # EVALSHA, get NOSCRIPT, SCRIPT LOAD and EVALSHA again: three round trips on every
        # fresh server (first use, after a restart or a SCRIPT FLUSH).
        self._loaded = False

    async def call(
        self,
        pid: str,
        *,
        keep: int,
        demand: int,
        wantmax: int,
        want: int,
        cap: int,
        lease_ms: int,
        ticket_ms: int,
        grace_ms: int,
        epoch: str | None = None,
        hint: bool = True,
        op: str = "sync",
        rate: Sequence[object] = RATELESS,
    ) -> SyncReply:
        """Run the fleet script once (see ``_scripts``); ``rate``: ARGV 14-24."""
        args: list[object] = [pid, keep, demand, cap, lease_ms, ticket_ms, grace_ms]
        args += [self._link.prefix, "1" if hint else "0", op, wantmax, epoch or "", want]
        args += rate
        keys = self._link.keys
        client = self._client
        try:
            with anyio.fail_after(self._link.op_timeout):
                if self._loaded:
                    try:
                        raw = await client.evalsha(self._sha, keys=keys, args=args)
                    except self._noscript:  # flushed: EVAL again (two round trips in all)
                        raw = await client.eval(SYNC, keys=keys, args=args)
                else:
                    raw = await client.eval(SYNC, keys=keys, args=args)
                    self._loaded = True
        except self._errors as exc:
            raise LinkDown(_describe(exc)) from exc
        return SyncReply(raw)

    async def wait_hint(self, pid: str, seconds: float) -> bool:
        """Block on this process's hint list for up to ``seconds``; ``True`` if hinted.

        The server-side timeout ends the pop first; the client deadline only fires when
        the server or the network is gone (coredis would otherwise wait forever).
        """
        key = self._link.prefix + "w:" + pid
        try:
            with anyio.fail_after(seconds + self._link.op_timeout):
                reply = await self._client.blpop([key], timeout=seconds)
        except self._errors as exc:
            raise LinkDown(_describe(exc)) from exc
        return reply is not None
