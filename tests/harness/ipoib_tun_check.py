"""Run inside a fresh network namespace (root) by tests/ipoib/test_ipoib_tun.py: a TUN device
(:class:`softrdma.drivers.links.tun.TunDevice`) carries UDP both ways; prints one JSON object.

* write: a 65000-byte UDP datagram (well under the MTU, 65520) written to the device
  reaches a local socket whole; a copy with a bad UDP checksum written first is dropped by
  the kernel (the next datagram the socket gets is the good one: checksums are verified);
* read: a datagram the host sends towards the device is read back as one IP packet with
  a correct UDP checksum (the kernel computed it: no offload);
* read_framed: another is read with the device's header in front of it in one buffer,
  nothing past the packet written; with nothing waiting it returns 0."""

from __future__ import annotations

import ipaddress
import json
import select
import socket
import struct
import sys
import time

from softrdma.drivers.links.tun import VNET_HDR_LEN, TunDevice
from softrdma.ipoib.ip import checksum, parse

OURS = bytes([10, 99, 0, 1])
PEER = bytes([10, 99, 0, 2])
BIG = 65000


def udp4(src: bytes, dst: bytes, sport: int, dport: int, payload: bytes) -> bytearray:
    ulen = 8 + len(payload)
    ip = bytearray(struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + ulen, 1, 0x4000, 64, 17, 0,
                               src, dst))
    ip[10:12] = struct.pack(">H", checksum(ip))
    udp = bytearray(struct.pack(">HHHH", sport, dport, ulen, 0) + payload)
    pseudo = src + dst + struct.pack(">xBH", 17, ulen)
    udp[6:8] = struct.pack(">H", checksum(pseudo + udp) or 0xFFFF)
    return ip + udp


def main() -> int:
    tun = TunDevice(sys.argv[1])
    tun.configure(65520, [ipaddress.IPv4Interface("10.99.0.1/24")])
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    rx.bind(("10.99.0.1", 9999))
    rx.settimeout(60)
    payload = bytes(range(256)) * (BIG // 256) + bytes(BIG % 256)
    good = udp4(PEER, OURS, 7777, 9999, payload)
    bad = bytearray(good)
    bad[-1] ^= 0x55
    wrote = [tun.write(bad), tun.write(good)]
    first = rx.recv(1 << 17)
    # the other way: the host -> the TUN device -> read_framed, the packet's checksum
    # complete (no offload)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx.sendto(b"x" * 3000, ("10.99.0.2", 7777))
    buf = bytearray(1 << 16)
    got = None
    deadline = time.monotonic() + 60
    while got is None and time.monotonic() < deadline:
        select.select([tun.fileno()], [], [], 1.0)
        n = tun.read_framed(memoryview(buf))
        if n <= 0:
            continue
        pkt = bytes(buf[VNET_HDR_LEN:VNET_HDR_LEN + n])
        info = parse(pkt)
        if info.version == 4 and info.proto == 17 and pkt[22:24] == b"\x1e\x61":
            udp = pkt[info.header_len:info.total_len]
            pseudo = info.src + info.dst + struct.pack(">xBH", 17, len(udp))
            got = {"len": n, "total_len": info.total_len, "csum_ok": checksum(pseudo + udp) == 0,
                   "payload_ok": udp[8:] == b"x" * 3000}
    # read_framed: the device's header in the buffer's first VNET_HDR_LEN bytes, the
    # packet behind it, nothing past it touched; 0 when nothing is waiting
    empty = -1  # drained (the kernel may have queued IPv6 housekeeping): ends at 0
    for _ in range(1000):
        empty = tun.read_framed(memoryview(buf))
        if empty == 0:
            break
    tx.sendto(b"y" * 2000, ("10.99.0.2", 7778))
    framed = None
    deadline = time.monotonic() + 60
    while framed is None and time.monotonic() < deadline:
        select.select([tun.fileno()], [], [], 1.0)
        buf[:] = b"\xaa" * len(buf)
        n = tun.read_framed(memoryview(buf))
        if n <= 0:
            continue
        pkt = bytes(buf[VNET_HDR_LEN:VNET_HDR_LEN + n])
        info = parse(pkt)
        if info.version == 4 and info.proto == 17 and pkt[22:24] == b"\x1e\x62":
            framed = {"len": n, "total_len": info.total_len, "payload_ok":
                      pkt[info.header_len + 8:] == b"y" * 2000,
                      "after_untouched": buf[VNET_HDR_LEN + n:] == b"\xaa" * (len(buf) - VNET_HDR_LEN - n)}
    tun.close()
    print(json.dumps({"wrote": wrote, "first_is_good": first == payload, "read": got,
                      "empty": empty, "framed": framed}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
