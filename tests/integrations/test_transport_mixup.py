"""A gated transport on the other library's client, and a missing library, fail clearly.

httpx and httpx2 have the same transport shape, so ``httpx2.AsyncClient(transport=
anygate.httpx.GatedTransport(...))`` type-checks loosely and used to fail with a bare
``AssertionError`` inside the client. Now the first request says which module to use, and
takes no slot.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import anygate

httpx = pytest.importorskip("httpx")
httpx2 = pytest.importorskip("httpx2")

import anygate.httpx  # noqa: E402 - after the importorskip
import anygate.httpx2  # noqa: E402

pytestmark = pytest.mark.anyio
SRC = Path(anygate.__file__).resolve().parent.parent


async def test_httpx_transport_on_an_httpx2_client_is_refused() -> None:
    """anygate.httpx on an httpx2 client: a TypeError naming anygate.httpx2, no slot used."""
    gate = anygate.Gate(1, name="llm")
    async with httpx2.AsyncClient(transport=anygate.httpx.GatedTransport(gate=gate)) as client:
        with pytest.raises(TypeError, match=r"installed on a httpx2 client.*anygate\.httpx2\."):
            await client.get("http://127.0.0.1:9/")
    assert gate.statistics().admitted == 0


async def test_httpx2_transport_on_an_httpx_client_is_refused() -> None:
    """The reverse mix-up names anygate.httpx."""
    gate = anygate.Gate(1, name="llm")
    async with httpx.AsyncClient(transport=anygate.httpx2.GatedTransport(gate=gate)) as client:
        with pytest.raises(TypeError, match=r"installed on a httpx client.*anygate\.httpx\."):
            await client.get("http://127.0.0.1:9/")
    assert gate.statistics().admitted == 0


def test_sync_mix_up_is_refused() -> None:
    """The blocking transports check the same way."""
    gate = anygate.Gate(1, name="llm")
    with httpx2.Client(transport=anygate.httpx.SyncGatedTransport(gate=gate)) as client:
        with pytest.raises(TypeError, match=r"anygate\.httpx\.GatedTransport was handed a"):
            client.get("http://127.0.0.1:9/")
    assert gate.statistics().admitted == 0


@pytest.mark.parametrize("lib", ["httpx", "httpx2"])
def test_import_without_the_library_names_the_extra(lib: str) -> None:
    """``import anygate.httpx`` where httpx is not installed says which extra to install."""
    code = f"import sys; sys.modules[{lib!r}] = None; import anygate.{lib}"
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONPATH": str(SRC)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert f"ImportError: anygate.{lib} needs {lib}: pip install 'anygate[{lib}]'" in done.stderr
