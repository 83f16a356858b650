"""Raw datagrams on the direct receive path of a shared device.

(Moved from tests/drivers/test_reuseport.py, which other test files imported.)"""

from __future__ import annotations

import select
import struct
import time

from softrdma.drivers.devd.client import DevdLink
from softrdma.drivers.links.link import Datagram

LOCAL = "127.0.0.1"


def packet(qpn: int, payload: bytes = b"", opcode: int = 0x04) -> bytes:
    """A RoCEv2 UDP payload: BTH (opcode, P_Key 0xFFFF, DestQP, PSN 0) + payload + ICRC."""
    return struct.pack("!BBHII", opcode, 0, 0xFFFF, qpn & 0xFFFFFF, 0) + payload + bytes(4)


def recv_all(link: DevdLink, n: int, timeout: float = 3.0) -> list[Datagram]:
    fd = link.fileno()
    assert fd is not None
    out: list[Datagram] = []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        got = link.recv_batch(64)
        out += [Datagram(memoryview(bytes(d.data)), d.src_ip, d.dst_ip, d.sport, d.dport,
                         d.tos, d.ttl) for d in got]
        if got:
            continue
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"{len(out)} of {n} datagrams arrived")
        select.select([fd], [], [], left)
    return out


def qpns_of(dgrams: list[Datagram]) -> list[int]:
    return [int.from_bytes(d.data[5:8], "big") for d in dgrams]
