"""A devd of a private state directory on 127.0.0.1 and its raw datagrams.

(Moved from tests/drivers/test_devd.py, which other test files imported.)"""

from __future__ import annotations

import select
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from softrdma.drivers.devd.client import DevdLink
from softrdma.drivers.devd.daemon import Devd
from softrdma.drivers.host.registry import DeviceRecord
from softrdma.drivers.links.link import Datagram
from softrdma.drivers.links.udp import UdpLink

LOCAL = "127.0.0.1"


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("SOFTRDMA_STATE_DIR", str(d))
    # these tests are about the forwarded path (every datagram through devd), the fallback
    # of the direct path that tests/drivers/test_reuseport*.py cover
    monkeypatch.setenv("SOFTRDMA_DEVD_DIRECT", "0")
    return d


class Running:
    def __init__(self, d: Devd, thread: threading.Thread, state: Path) -> None:
        self.devd = d
        self.thread = thread
        self.state = state
        self.record = DeviceRecord(d.record.name, "lo", "roce", d.udp_port)

    def client(self, direct: bool | None = None) -> DevdLink:
        return DevdLink(self.record, state_dir=self.state, spawn=False, direct=direct)


def start_devd(state: Path, name: str = "t0", idle_timeout: float = 30.0) -> Running:
    d = Devd(DeviceRecord(name, "lo", "roce", 0), state, idle_timeout=idle_timeout, ips=[LOCAL])
    d.start()
    t = threading.Thread(target=d.serve_forever, daemon=True)
    t.start()
    return Running(d, t, state)


@pytest.fixture
def running(state: Path) -> Iterator[Running]:
    r = start_devd(state)
    try:
        yield r
    finally:
        r.devd.shutdown()
        r.thread.join(5)
        assert not r.thread.is_alive()


def packet(qpn: int, payload: bytes = b"", opcode: int = 0x04) -> bytes:
    """A RoCEv2 UDP payload: BTH (opcode, P_Key 0xFFFF, DestQP, PSN 0) + payload + ICRC."""
    bth = struct.pack("!BBHI I", opcode, 0, 0xFFFF, qpn & 0xFFFFFF, 0)
    return bth + payload + b"\x00\x00\x00\x00"


def recv_one(link: DevdLink | UdpLink, timeout: float = 2.0) -> Datagram:
    fd = link.fileno()
    assert fd is not None
    deadline = time.monotonic() + timeout
    while True:
        got = link.recv_batch(1)
        if got:
            return got[0]
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError("no datagram arrived")
        select.select([fd], [], [], left)


def wait_for(cond: object, timeout: float = 3.0) -> None:
    assert callable(cond)
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.005)

