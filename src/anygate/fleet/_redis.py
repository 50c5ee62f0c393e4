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
from time import monotonic
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import anyio

from ._ratescript import SPLITLESS
from ._scripts import SYNC, keys_for, prefix_for

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence

__all__ = ["RATELESS", "SPLITLESS", "Link", "LinkDown", "Session", "SyncReply"]

#: The script's rate arguments when the fleet has no rate.
RATELESS: tuple[object, ...] = ("", "", 0, 0, "", 0, 0, 0, "", 0, 0)


class LinkDown(Exception):
    """Raised when a Redis call failed or passed its deadline; the session is over.

    Attributes:
        cause: one line for people: what failed, without a traceback.
        deadline: the call passed its deadline (the server may be alive but not answering),
            as opposed to a connection that was refused, reset or dropped.
    """

    def __init__(self, cause: str, *, deadline: bool = False) -> None:
        super().__init__(cause)
        self.cause = cause
        self.deadline = deadline


class SyncReply:
    """The script's answer, as numbers."""

    __slots__ = (
        "active",
        "cap",
        "epoch",
        "grace_left",
        "held",
        "limit",
        "live_rate",
        "permit_inputs",
        "permit_outputs",
        "permit_tokens",
        "permit_wait",
        "permits",
        "queued",
        "rate_version",
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
        self.permit_inputs = int(raw[11])
        self.permit_outputs = int(raw[12])
        # The live fleet rate's version (0: none set), and the rate itself when this
        # process knew another version ("" otherwise).
        self.rate_version = int(raw[13])
        self.live_rate = str(raw[14])


def _describe(exc: BaseException, op_timeout: float | None = None) -> str:
    """One line saying why a call failed, for people (issue 27: not a 60-line group).

    anyio's ``connect_tcp`` raises ``OSError("All connection attempts failed")`` from the
    real error, and coredis wraps socket errors in its own; the first errno found along
    the chain names the cause better than either wrapper.
    """
    if isinstance(exc, TimeoutError) and op_timeout is not None:
        return f"no answer within op_timeout={op_timeout:g}s"
    seen: BaseException | None = exc
    for _ in range(8):  # a bounded walk: chains can be cyclic
        if seen is None:
            break
        if isinstance(seen, ConnectionRefusedError):
            return "connection refused"
        if isinstance(seen, (ConnectionResetError, BrokenPipeError)):
            return "connection reset"
        if isinstance(seen, OSError) and seen.errno is not None and seen.strerror:
            return seen.strerror[:1].lower() + seen.strerror[1:]
        seen = seen.__cause__ or seen.__context__
    text = " ".join(str(exc).split()) or type(exc).__name__
    if len(text) > 200:
        text = text[:197] + "..."
    if type(exc).__module__.startswith("coredis"):  # its messages say what happened
        return text[:1].lower() + text[1:]
    return f"{type(exc).__name__}: {text}"


def _late(
    exc: TimeoutError, op_timeout: float, elapsed: float, limit: float | None = None
) -> LinkDown:
    """A deadline passed: Redis did not answer, unless this process itself did not run.

    A process resumed after SIGSTOP (or a VM pause) finds every deadline long past at
    once; Redis is not at fault, and failing the callers for it is wrong (issue 27's fault
    test: 60 refusals after one SIGCONT). A deadline that fired far later than it was due
    says so: it is reported as a drop, which the agent retries once at once.
    """
    due = op_timeout if limit is None else limit
    stalled = elapsed > 2 * due + 0.5  # far beyond any timer's lateness on a loaded host
    return LinkDown(_describe(exc, op_timeout), deadline=not stalled)


def _link_down(exc: BaseException) -> LinkDown | None:
    """The first :class:`LinkDown` inside ``exc`` and its exception groups, if any.

    coredis runs its pool in a task group, so a ``LinkDown`` raised in a session arrives
    wrapped in an ``ExceptionGroup`` (possibly nested); a connection error raised by the
    pool's own tasks arrives the same way, unwrapped by us into a ``LinkDown``.
    """
    if isinstance(exc, LinkDown):
        return exc
    inner = getattr(exc, "exceptions", None)
    if isinstance(inner, tuple):
        for sub in inner:
            found = _link_down(sub)
            if found is not None:
                return found
        for sub in inner:
            if _is_connection_error(sub):
                return LinkDown(_describe(sub))
    return None


def _is_connection_error(exc: BaseException) -> bool:
    if isinstance(exc, OSError):
        return True
    try:
        from coredis.exceptions import RedisError
    except ImportError:  # pragma: no cover - coredis is what made the group
        return False
    return isinstance(exc, RedisError)


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
        """The server, for error messages: ``host:port`` or a socket path (no credentials)."""
        parts = urlsplit(self.url)
        if parts.scheme == "unix":
            return parts.path
        try:
            port = parts.port or 6379
        except ValueError:  # a malformed port: show what was given, credentials stripped
            return self.url.rsplit("@", 1)[-1].split("://", 1)[-1]
        host = parts.hostname or "localhost"
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

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
        except TimeoutError as exc:
            raise LinkDown(_describe(exc, self.op_timeout), deadline=True) from exc
        except OSError as exc:
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
        try:
            async with client:
                yield Session(self, client)
        except Exception as exc:  # an ExceptionGroup; cancellations (BaseException) pass
            down = _link_down(exc)
            if down is None:
                raise
            raise down from None  # the group's traceback says nothing the cause does not


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
        newcomer_ms: int | None = None,
        split: Sequence[object] = SPLITLESS,
        live: str = "",
        rate_version: int = 0,
    ) -> SyncReply:
        """Run the fleet script once (see ``_scripts``); ``rate``: ARGV 14-24, ``split``:
        ARGV 26-33 (see ``_ratescript``); ``live``: the live rate to set (``op="rate"``),
        ``rate_version``: the live rate's version this process adopted last.

        ``newcomer_ms``: how long after a server start a process that knows no earlier
        state waits for the first survivor (default ``grace_ms``).
        """
        args: list[object] = [pid, keep, demand, cap, lease_ms, ticket_ms, grace_ms]
        args += [self._link.prefix, "1" if hint else "0", op, wantmax, epoch or "", want]
        args += rate
        args.append(grace_ms if newcomer_ms is None else newcomer_ms)
        args += split
        if split:  # (an older agent's 25 arguments end before the split part)
            args += (live, str(rate_version))
        keys = self._link.keys
        client = self._client
        started = monotonic()
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
        except TimeoutError as exc:
            raise _late(exc, self._link.op_timeout, monotonic() - started) from exc
        except self._errors as exc:
            raise LinkDown(_describe(exc)) from exc
        return SyncReply(raw)

    async def wait_hint(self, pid: str, seconds: float) -> bool:
        """Block on this process's hint list for up to ``seconds``; ``True`` if hinted.

        The server-side timeout ends the pop first; the client deadline only fires when
        the server or the network is gone (coredis would otherwise wait forever).
        """
        key = self._link.prefix + "w:" + pid
        started = monotonic()
        try:
            with anyio.fail_after(seconds + self._link.op_timeout):
                reply = await self._client.blpop([key], timeout=seconds)
        except TimeoutError as exc:
            limit = seconds + self._link.op_timeout
            raise _late(exc, self._link.op_timeout, monotonic() - started, limit) from exc
        except self._errors as exc:
            raise LinkDown(_describe(exc)) from exc
        return reply is not None
