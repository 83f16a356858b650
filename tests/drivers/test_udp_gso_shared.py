"""UDP GSO/GRO on a shared device's direct path (design.md "RoCEv2 batching: GSO and GRO",
"Devices shared by processes"): a process sends a batch through its :class:`DevdLink`
(its own UdpLink), the batch reaches the process owning the DestQP on that process's
reuseport socket as one coalesced read (the BPF program picks the socket by the first
segment's DestQP), and comes out split with the ID hints. On 127.0.0.1, ephemeral ports.
"""

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
from softrdma.drivers.links.link import Datagram, GsoLink

LOCAL = "127.0.0.1"
LOCAL_RAW = bytes([127, 0, 0, 1])


def packet(qpn: int, psn: int, size: int) -> bytes:
    """A RoCEv2 UDP payload: BTH (RDMA WRITE middle, DestQP, PSN) + payload + 4 bytes."""
    return struct.pack("!BBHII", 0x07, 0, 0xFFFF, qpn & 0xFFFFFF, psn) + bytes([psn]) * size \
        + bytes(4)


@pytest.fixture
def devd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Devd, Path]]:
    state = tmp_path / "state"
    monkeypatch.setenv("SOFTRDMA_STATE_DIR", str(state))
    monkeypatch.delenv("SOFTRDMA_DEVD_DIRECT", raising=False)
    monkeypatch.delenv("SOFTRDMA_GSO", raising=False)
    monkeypatch.delenv("SOFTRDMA_GRO", raising=False)
    d = Devd(DeviceRecord("gso0", "lo", "roce", 0), state, idle_timeout=30.0, ips=[LOCAL])
    d.start()
    t = threading.Thread(target=d.serve_forever, daemon=True)
    t.start()
    try:
        yield d, state
    finally:
        d.shutdown()
        t.join(5)


def recv_n(link: DevdLink, n: int, timeout: float = 5.0) -> list[Datagram]:
    fd = link.fileno()
    assert fd is not None
    out: list[Datagram] = []
    end = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < end:
        got = link.recv_batch(64)
        out += [Datagram(memoryview(bytes(d.data)), d.src_ip, d.dst_ip, d.sport, d.dport,
                         d.tos, d.ttl, d.grh, d.ident) for d in got]
        if not got:
            select.select([fd], [], [], 0.1)
    return out


def test_a_batch_reaches_the_owner_coalesced(devd: tuple[Devd, Path]) -> None:
    d, state = devd
    rec = DeviceRecord(d.record.name, "lo", "roce", d.udp_port)
    with DevdLink(rec, state_dir=state, spawn=False) as a, \
            DevdLink(rec, state_dir=state, spawn=False) as b:
        assert isinstance(a, GsoLink) and a.direct and b.direct
        qb = b.alloc_qpn()
        parts = [packet(qb, i, 1000) for i in range(12)]
        sport = a.effective_sport(0)
        assert a.gso_limit(LOCAL_RAW) > 1
        assert a.send_gso(LOCAL_RAW, d.udp_port, sport, parts, len(parts[0]), len(parts))
        got = recv_n(b, 12)
        assert [bytes(x.data) for x in got] == parts
        assert [x.ident for x in got] == list(range(12))
        direct = b._direct[0]
        assert direct.gro and direct.stats.gro_receives == 1
        assert direct.stats.gro_segments == 12
        assert a.stats()["forwarded"] == 0  # devd never saw them
        b.note_rx_ids(2, 1)
        assert (direct.stats.gro_id_hint_misses, direct.stats.gro_id_failures) == (2, 1)
