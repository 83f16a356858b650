"""UDP GSO batch frames as a capture on ``lo`` holds them.

(Moved from tests/tools/test_pcap_gso.py, which other test files imported.)"""

from __future__ import annotations

import struct

from softrdma.wire import roce

SRC, DST = bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2])


SPORT = 0xC123


ETH = bytes(12) + b"\x08\x00"


_BTH = struct.Struct("!BBHII")


def _bth(opcode: int, psn: int, dqpn: int = 0x12) -> bytes:
    return _BTH.pack(opcode, 0, 0xFFFF, dqpn & 0xFFFFFF, 0x80000000 | psn)


def _segments(n: int, plen: int = 1024, last: int = 1024, base_id: int = 0,
              dqpn: int = 0x12) -> list[bytes]:
    """RC SEND FIRST, MIDDLE..., LAST UDP payloads with their ICRCs for IDs base_id+i."""
    out = []
    for i in range(n):
        op = 0x00 if i == 0 else (0x02 if i == n - 1 else 0x01)
        body = _bth(op, 100 + i, dqpn) + bytes([i]) * (last if i == n - 1 else plen)
        ulen = 8 + len(body) + 4
        ip = roce.ipv4_header(SRC, DST, ulen, ident=base_id + i)
        udp = roce.udp_header(SPORT, 4791, ulen)
        out.append(body + roce.icrc(ip, udp, (body,)))
    return out


def _batch_frame(segs: list[bytes], base_id: int = 0) -> bytes:
    payload = b"".join(segs)
    ulen = 8 + len(payload)
    return ETH + roce.ipv4_header(SRC, DST, ulen, ident=base_id) + \
        roce.udp_header(SPORT, 4791, ulen) + payload
