"""Two "hosts": network namespaces joined by a veth pair, Redis on one, workers on both.

Needs root and ``ip netns`` (skipped otherwise). ``tc netem`` adds 2 ms each way where the
kernel has it; this machine's kernel has no ``sch_netem``, so here the link has no added
delay (the test says which in its output).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from typing import TYPE_CHECKING

import pytest

from .fleetproc import Fleet
from .redis_proc import RedisProc, RedisUnavailable

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.slow


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@pytest.fixture
def two_hosts() -> Iterator[tuple[str, str, bool]]:
    """Namespaces (a, b) with 10.77.x.1 on a and 10.77.x.2 on b; whether netem is on."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 (ip netns)")
    tag = uuid.uuid4().hex[:6]
    a, b = f"aga{tag}", f"agb{tag}"
    try:
        _ip("netns", "add", a)
        _ip("netns", "add", b)
        _ip("link", "add", f"va{tag}", "type", "veth", "peer", "name", f"vb{tag}")
    except subprocess.CalledProcessError as exc:
        subprocess.run(["ip", "netns", "del", a], capture_output=True)
        subprocess.run(["ip", "netns", "del", b], capture_output=True)
        pytest.skip(f"network namespaces not permitted here: {exc.stderr.decode().strip()}")
    try:
        _ip("link", "set", f"va{tag}", "netns", a)
        _ip("link", "set", f"vb{tag}", "netns", b)
        _ip("-n", a, "addr", "add", "10.77.0.1/24", "dev", f"va{tag}")
        _ip("-n", b, "addr", "add", "10.77.0.2/24", "dev", f"vb{tag}")
        for ns, dev in ((a, f"va{tag}"), (b, f"vb{tag}")):
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        netem = True
        for ns, dev in ((a, f"va{tag}"), (b, f"vb{tag}")):
            done = subprocess.run(
                [
                    "ip",
                    "netns",
                    "exec",
                    ns,
                    "tc",
                    "qdisc",
                    "add",
                    "dev",
                    dev,
                    "root",
                    "netem",
                    "delay",
                    "2ms",
                ],
                capture_output=True,
            )
            netem = netem and done.returncode == 0
        yield a, b, netem
    finally:
        subprocess.run(["ip", "netns", "del", a], capture_output=True)
        subprocess.run(["ip", "netns", "del", b], capture_output=True)


@pytest.mark.timeout(180)
def test_fleet_across_two_network_namespaces(two_hosts: tuple[str, str, bool]) -> None:
    """4 workers on each side of a veth link, Redis on one side: the cap of 8 holds for all."""
    a, b, netem = two_hosts
    server = RedisProc(host="10.77.0.1")
    try:
        _start_in(server, a)
    except RedisUnavailable as exc:
        server.close()
        pytest.skip(str(exc))
    try:
        common = {
            "name": "two-hosts",
            "url": server.url,
            "counter_url": server.url,
            "capacity": 8,
            "tasks": 20,
            "duration": 8.0,
            "hold": (0.002, 0.02),
            "lease_ttl": 5.0,
        }
        configs = [
            {**common, "backend": "asyncio" if i % 2 else "trio", "seed": i} for i in range(8)
        ]
        side_a = Fleet(configs[:4], prefix=["ip", "netns", "exec", a])
        side_b = Fleet(configs[4:], prefix=["ip", "netns", "exec", b])
        side_a.go()
        side_b.go()
        results = side_a.results(60) + side_b.results(60)
        reply = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                a,
                "redis-cli",
                "-h",
                "10.77.0.1",
                "-p",
                str(server.port),
                "GET",
                "max:two-hosts",
            ],
            capture_output=True,
            check=True,
        ).stdout.strip()
    finally:
        server.close()
    print(f"netem delay: {'2 ms each way' if netem else 'not available on this kernel'}")
    print("grants per worker:", [r["grants"] for r in results])
    assert 0 < int(reply) <= 8
    assert all(r["grants"] > 0 for r in results)


def _start_in(server: RedisProc, ns: str) -> None:
    """RedisProc.start, inside namespace ``ns`` (its probe must run there too)."""
    binary = server.binary
    proc = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            ns,
            binary,
            "--bind",
            server.host,
            "--port",
            str(server.port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            server.dir,
            "--protected-mode",
            "no",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    server.proc = proc
    for _ in range(200):
        ping = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                ns,
                "redis-cli",
                "-h",
                server.host,
                "-p",
                str(server.port),
                "PING",
            ],
            capture_output=True,
        )
        if ping.stdout.strip() == b"PONG":
            return
        if proc.poll() is not None:
            msg = (
                f"redis-server in {ns} exited: {proc.stderr.read().decode() if proc.stderr else ''}"
            )
            raise RedisUnavailable(msg)
        subprocess.run(["sleep", "0.05"], check=True)
    msg = f"redis-server in {ns} did not answer"
    raise RedisUnavailable(msg)
