"""IPv4, IPv6 and UDP headers and the Internet checksum, as RoCEv2 carries them.

IBA Annex A17.2 (RoCEv2 packet format): a RoCEv2 packet is an IB transport packet in a UDP
datagram to port 4791 (A17.2.1, IANA) over IPv4 (RFC 791 §3.1) or IPv6 (RFC 8200 §3); the
UDP checksum (RFC 768) may be zero over IPv4 (A17.2.2). The ICRC over these headers is
:mod:`softrdma.wire.icrc`; :mod:`softrdma.wire.roce` is the facade that re-exports both.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

from ..errors import InvalidArgument
from .crc import Buffer
from .fields import U16

__all__ = [
    "ROCE_V2_UDP_PORT", "ETH_P_IP", "ETH_P_IPV6", "IPPROTO_UDP", "IB_GRH_FLOWLABEL_MASK",
    "ipv4_header", "ipv6_header", "udp_header", "inet_checksum", "udp_checksum",
]

ROCE_V2_UDP_PORT = 4791  # Annex A17.2.1: the IANA port of RoCEv2
IB_GRH_FLOWLABEL_MASK = 0xFFFFF  # the 20-bit flow label (IBA 8.3.1, RFC 8200 §3)

ETH_P_IP = 0x0800
ETH_P_IPV6 = 0x86DD
IPPROTO_UDP = 17

_IPV4 = struct.Struct("!BBHHHBBH4s4s")
_IPV6 = struct.Struct("!IHBB16s16s")
_UDP = struct.Struct("!HHHH")


# --------------------------------------------------------------------------- IP / UDP
def inet_checksum(data: Buffer, initial: int = 0) -> int:
    """The Internet checksum (RFC 1071) of ``data``: ones-complement of the 16-bit sum.

    ``initial`` is an already-folded partial sum (not complemented) to continue from.
    Summation happens in C over native 16-bit words; the result is byte-swapped back
    when the host is little-endian (RFC 1071 §2(B): the sum is byte-order independent).
    """
    return (~_sum16(data, initial)) & 0xFFFF


def _sum16(data: Buffer, initial: int = 0) -> int:
    mv = memoryview(data).cast("B")
    n = len(mv)
    s = 0
    if n >= 2:
        s = sum(mv[:n & ~1].cast("H"))
        if _LITTLE:
            # fold first, then swap the 16-bit result to network order
            while s >> 16:
                s = (s & 0xFFFF) + (s >> 16)
            s = ((s & 0xFF) << 8) | (s >> 8)
    if n & 1:
        s += mv[n - 1] << 8
    s += initial
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return s


_LITTLE = struct.pack("=H", 1) == b"\x01\x00"


def _addr(a: bytes, n: int, name: str) -> bytes:
    if len(a) != n:
        raise InvalidArgument(name, f"must be {n} bytes, got {len(a)}")
    return bytes(a)


def ipv4_header(src: bytes, dst: bytes, payload_len: int, *, tos: int = 0, ttl: int = 64,
                ident: int = 0, df: bool = True, proto: int = IPPROTO_UDP) -> bytes:
    """A 20-byte IPv4 header (RFC 791 §3.1) with a correct header checksum.

    ``payload_len`` is the length of what follows the header (UDP header included).
    """
    total = 20 + payload_len
    if not 20 <= total <= 0xFFFF:
        raise InvalidArgument("payload_len", f"IPv4 total length {total} out of range")
    hdr = bytearray(_IPV4.pack(0x45, tos & 0xFF, total, ident & 0xFFFF, 0x4000 if df else 0,
                               ttl & 0xFF, proto & 0xFF, 0,
                               _addr(src, 4, "src"), _addr(dst, 4, "dst")))
    U16.pack_into(hdr, 10, inet_checksum(hdr))
    return bytes(hdr)


def ipv6_header(src: bytes, dst: bytes, payload_len: int, *, tclass: int = 0,
                flow_label: int = 0, hop_limit: int = 64, next_header: int = IPPROTO_UDP) -> bytes:
    """A 40-byte IPv6 header (RFC 8200 §3); ``payload_len`` counts what follows it."""
    if not 0 <= payload_len <= 0xFFFF:
        raise InvalidArgument("payload_len", f"IPv6 payload length {payload_len} out of range")
    w0 = (6 << 28) | ((tclass & 0xFF) << 20) | (flow_label & IB_GRH_FLOWLABEL_MASK)
    return _IPV6.pack(w0, payload_len, next_header & 0xFF, hop_limit & 0xFF,
                      _addr(src, 16, "src"), _addr(dst, 16, "dst"))


def udp_header(sport: int, dport: int, length: int, checksum: int = 0) -> bytes:
    """An 8-byte UDP header (RFC 768); ``length`` includes the 8 header bytes."""
    if not 8 <= length <= 0xFFFF:
        raise InvalidArgument("length", f"UDP length {length} out of range")
    return _UDP.pack(sport & 0xFFFF, dport & 0xFFFF, length, checksum & 0xFFFF)


def udp_checksum(src: bytes, dst: bytes, udp_hdr: Buffer, parts: Iterable[Buffer]) -> int:
    """UDP checksum over the IPv4 or IPv6 pseudo-header (RFC 768, RFC 8200 §8.1).

    ``udp_hdr`` is taken with its checksum field as zero; a computed 0 is sent as 0xFFFF.
    """
    uh = bytearray(udp_hdr)
    uh[6:8] = b"\0\0"
    length = U16.unpack_from(uh, 4)[0]
    if len(src) == 4:
        pseudo = bytes(src) + bytes(dst) + struct.pack("!BBH", 0, IPPROTO_UDP, length)
    else:
        pseudo = bytes(src) + bytes(dst) + struct.pack("!IxxxB", length, IPPROTO_UDP)
    s = _sum16(pseudo)
    s = _sum16(uh, s)
    s = _sum16(b"".join(bytes(p) for p in parts), s)
    c = (~s) & 0xFFFF
    return c or 0xFFFF
