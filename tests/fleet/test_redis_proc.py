"""The throwaway redis-server the fleet tests start leaves nothing behind."""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from collections.abc import Callable

    from .redis_proc import RedisProc


def test_close_stops_the_server_and_removes_its_directory(
    redis_factory: Callable[[], RedisProc],
) -> None:
    server = redis_factory()
    assert os.path.isdir(server.dir)
    assert server.command("PING") == b"+PONG\r\n"
    server.close()
    assert not os.path.exists(server.dir)
    with pytest.raises(OSError), socket.create_connection((server.host, server.port), 1):
        pass
    server.close()  # twice is harmless (the fixture closes it again)
