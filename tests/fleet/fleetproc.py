"""Launch and collect fleet worker processes (see ``worker.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anygate

WORKER = Path(__file__).with_name("worker.py")
SRC = str(Path(anygate.__file__).resolve().parent.parent)

__all__ = ["Fleet"]


class Fleet:
    """N worker processes started together; ``results()`` waits and parses their output."""

    def __init__(self, configs: list[dict[str, Any]], *, prefix: list[str] | None = None) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
        self.procs = []
        for cfg in configs:
            cmd = [*(prefix or []), sys.executable, str(WORKER), json.dumps(cfg)]
            self.procs.append(
                subprocess.Popen(
                    cmd,
                    env=env,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                )
            )
        self.started_at = 0.0

    def go(self, timeout: float = 60.0) -> float:
        """Wait until every worker is ready, then start them together; returns the time."""
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if line.strip() != b"ready":
                err = proc.stderr.read().decode()[-3000:] if proc.stderr else ""
                msg = f"worker did not get ready: {line!r}\n{err}"
                raise AssertionError(msg)
            if time.monotonic() > deadline:
                msg = "workers took too long to start"
                raise AssertionError(msg)
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.write(b"go\n")
            proc.stdin.flush()
        self.started_at = time.time()
        return self.started_at

    def results(self, timeout: float) -> list[dict[str, Any]]:
        out = []
        for proc in self.procs:
            stdin, proc.stdin = proc.stdin, None  # communicate() would flush a closed pipe
            if stdin is not None:
                stdin.close()
            stdout, stderr = proc.communicate(timeout=timeout)
            if proc.returncode != 0:
                msg = f"worker failed ({proc.returncode}):\n{stderr.decode()[-3000:]}"
                raise AssertionError(msg)
            out.append(json.loads(stdout.decode().strip().splitlines()[-1]))
        return out

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()  # SIGKILL
                proc.wait()
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
