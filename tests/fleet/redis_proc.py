"""A throwaway ``redis-server`` on 127.0.0.1 for the fleet tests (no persistence)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time

__all__ = ["RedisProc", "RedisUnavailable", "free_port"]


class RedisUnavailable(Exception):
    """Raised when no redis-server can be started on this machine."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class RedisProc:
    """One redis-server process; ``stop()`` kills it, ``start()`` brings it back empty,
    ``close()`` kills it and removes its directory."""

    def __init__(self, port: int | None = None, host: str = "127.0.0.1") -> None:
        binary = shutil.which("redis-server") or (
            "/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server") else None
        )
        if binary is None:
            msg = "redis-server is not installed (Debian/Ubuntu: apt-get install redis-server)"
            raise RedisUnavailable(msg)
        self.binary = binary
        self.host = host
        self.port = port or free_port()
        self.dir = tempfile.mkdtemp(prefix="anygate-redis-")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def start(self, timeout: float = 10.0) -> None:
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--bind",
                self.host,
                "--port",
                str(self.port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self.dir,
                "--daemonize",
                "no",
                "--protected-mode",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                msg = f"redis-server exited with {self.proc.returncode}: {err.strip()[:300]}"
                raise RedisUnavailable(msg)
            try:
                with socket.create_connection((self.host, self.port), timeout=0.2) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            time.sleep(0.02)
        self.stop()
        msg = f"redis-server did not answer on {self.host}:{self.port} within {timeout}s"
        raise RedisUnavailable(msg)

    def stop(self) -> None:
        """SIGKILL: the server dies with every connection open, as in a crash."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if proc is not None and proc.stderr:
            proc.stderr.close()

    def close(self) -> None:
        """Stop the server for good and remove its directory (``stop()`` keeps it for a
        restart): each server's directory was left in the temp dir, thousands of them."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def command(self, *args: str | int) -> bytes:
        """One command over a raw socket (RESP), returning the raw reply (tests only)."""
        parts = [f"*{len(args)}\r\n".encode()]
        for arg in args:
            data = str(arg).encode()
            parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
        with socket.create_connection((self.host, self.port), timeout=5) as sock:
            sock.sendall(b"".join(parts))
            chunks = b""
            sock.settimeout(0.3)
            try:
                while True:
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    chunks += chunk
                    if chunks.endswith(b"\r\n"):
                        sock.settimeout(0.05)
            except TimeoutError:
                pass
            return chunks
