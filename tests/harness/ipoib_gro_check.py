"""Run inside a fresh network namespace (root) by tests/ipoib/test_ipoib_tun.py: coalesced
TCP segments (:mod:`softrdma.ipoib.gro`) written to a TUN device
(:meth:`softrdma.drivers.links.tun.TunDevice.write_gso`) reach a local TCP socket; one
whose segments include a damaged one is dropped by the kernel's checksum check. Prints
one JSON object.

The script plays the remote TCP end behind the TUN device: it writes a SYN to a local
listener, reads the SYN-ACK, writes the ACK, then data segments, merged."""

from __future__ import annotations

import ipaddress
import json
import select
import socket
import struct
import sys
import time

from softrdma.drivers.links.tun import VNET_HDR_LEN, TunDevice
from softrdma.ipoib.gro import Merged, TcpCoalescer
from softrdma.ipoib.ip import checksum

OURS = bytes([10, 99, 0, 1])
PEER = bytes([10, 99, 0, 2])
PORT, PEER_PORT = 9998, 40000
SEG = 1000
SYN, ACK = 0x02, 0x10
DEADLINE_S = 60.0


def tcp4(seq: int, ack: int, flags: int, payload: bytes = b"") -> bytes:
    th = bytearray(struct.pack(">HHIIBBHHH", PEER_PORT, PORT, seq, ack, 5 << 4, flags, 65535,
                               0, 0) + payload)
    struct.pack_into(">H", th, 16, checksum(PEER + OURS + struct.pack(">xBH", 6, len(th)) + th))
    ip = bytearray(struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + len(th), 1, 0x4000, 64, 6, 0,
                               PEER, OURS))
    struct.pack_into(">H", ip, 10, checksum(ip))
    return bytes(ip + th)


def csum_errors() -> int:
    with open("/proc/net/snmp") as f:
        rows = [line.split() for line in f if line.startswith("Tcp:")]
    return int(rows[1][rows[0].index("InCsumErrors")])


def read_synack(tun: TunDevice) -> int:
    buf = bytearray(1 << 16)
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        select.select([tun.fileno()], [], [], 1.0)
        n = tun.read_framed(memoryview(buf))
        pkt = memoryview(buf)[VNET_HDR_LEN:VNET_HDR_LEN + n]
        if n >= 40 and pkt[9] == 6 and struct.unpack_from(">H", pkt, 20)[0] == PORT \
                and pkt[33] & (SYN | ACK) == SYN | ACK:
            return int(struct.unpack_from(">I", pkt, 24)[0])
    raise SystemExit("no SYN-ACK from the listener")


def merged(segs: list[bytes]) -> Merged:
    g = TcpCoalescer()
    for s in segs:
        g.push(s)
    g.flush()
    out = g.take()
    assert len(out) == 1 and isinstance(out[0], Merged), out
    return out[0]


def main() -> int:
    tun = TunDevice(sys.argv[1])
    tun.configure(65520, [ipaddress.IPv4Interface("10.99.0.1/24")])
    lst = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lst.bind(("10.99.0.1", PORT))
    lst.listen(1)
    lst.settimeout(DEADLINE_S)
    isn = 5000
    tun.write(tcp4(isn, 0, SYN))
    their = read_synack(tun)
    tun.write(tcp4(isn + 1, their + 1, ACK))
    conn, _ = lst.accept()
    conn.settimeout(DEADLINE_S)
    seq = isn + 1
    data = bytes(range(256)) * 40
    chunks = [data[i:i + SEG] for i in range(0, 8 * SEG, SEG)] + [data[8 * SEG:8 * SEG + 300]]
    good = [tcp4(seq + i * SEG, their + 1, ACK, c) for i, c in enumerate(chunks)]
    first = merged(good)
    ok_first = tun.write_gso(first.head, first.payloads, first.gso_type, first.gso_size)
    want = b"".join(chunks)
    got = b""
    while len(got) < len(want):
        got += conn.recv(1 << 16)
    # the next run, one segment damaged: the whole merged packet is dropped
    seq2 = seq + len(want)
    chunks2 = [bytes([7]) * SEG for _ in range(6)]
    segs2 = [tcp4(seq2 + i * SEG, their + 1, ACK, c) for i, c in enumerate(chunks2)]
    damaged = bytearray(segs2[2])
    damaged[-5] ^= 0x10
    errs0 = csum_errors()
    bad = merged([*segs2[:2], bytes(damaged), *segs2[3:]])
    ok_bad = tun.write_gso(bad.head, bad.payloads, bad.gso_type, bad.gso_size)
    deadline = time.monotonic() + DEADLINE_S
    while csum_errors() == errs0 and time.monotonic() < deadline:
        time.sleep(0.01)
    dropped = csum_errors() > errs0
    again = merged(segs2)  # TCP's retransmission, undamaged this time
    ok_again = tun.write_gso(again.head, again.payloads, again.gso_type, again.gso_size)
    got2 = b""
    while len(got2) < 6 * SEG:
        got2 += conn.recv(1 << 16)
    tun.close()
    print(json.dumps({"wrote": [ok_first, ok_bad, ok_again], "segments": len(first.payloads),
                      "first_ok": got == want, "damaged_dropped": dropped,
                      "second_ok": got2 == b"".join(chunks2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
