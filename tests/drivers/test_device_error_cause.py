"""A device whose devd cannot start because its UDP port is taken says so, with the
errno of the cause (EADDRINUSE), in the native API and under pyverbs (where
"Errno: 19, No such device" used to hide it)."""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from softrdma import verbs as v
from softrdma.compat.pyverbs.device import Context as PyverbsContext
from softrdma.compat.pyverbs.pyverbs_error import PyverbsRDMAError
from softrdma.drivers.host.registry import Registry
from softrdma.errors import DeviceError

DEV = "busyport0"


@pytest.fixture
def held_port(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """A device on lo whose UDP port another program holds."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as held:
        held.bind(("127.0.0.1", 0))
        port = int(held.getsockname()[1])
        reg = Registry(tmp_path)
        reg.delete("softrdma_lo")
        reg.add(DEV, "lo", "roce", port)
        monkeypatch.setenv("SOFTRDMA_STATE_DIR", str(tmp_path))
        monkeypatch.setenv("SOFTRDMA_SHARED", "1")
        yield port


def test_native_context_names_the_port_in_use(held_port: int) -> None:
    with pytest.raises(DeviceError) as ei:
        v.Context(DEV)
    assert ei.value.errno == errno.EADDRINUSE
    assert f"port {held_port}" in str(ei.value) and "Address already in use" in str(ei.value)


def test_pyverbs_context_names_the_port_in_use(held_port: int) -> None:
    with pytest.raises(PyverbsRDMAError) as ei:
        PyverbsContext(name=DEV)
    assert ei.value.error_code == errno.EADDRINUSE
    text = str(ei.value)
    assert f"port {held_port}: Address already in use" in text
    assert "No such device" not in text
