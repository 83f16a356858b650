"""The IP facts an IPoIB interface needs: addresses of a packet, ICMP errors for the
per-destination MTU, IPv4 fragmentation (RFC 4755 §7.2; RFC 792, RFC 1191, RFC 4443,
RFC 791 §2.3).

Packets from the TUN device are whole IPv4 or IPv6 packets. :func:`parse` checks just
enough to route them (version, header and total length); ICMP errors are built as the
kernel would have: "fragmentation needed" (type 3 code 4 with the next-hop MTU, RFC 1191)
for IPv4 with DF, "packet too big" (type 2 with the MTU, RFC 4443 §3.2) for IPv6.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ..errors import DecodeError

__all__ = [
    "IPV4_HDR", "IPV6_HDR", "PROTO_ICMP", "PROTO_ICMPV6", "IpInfo", "parse", "checksum",
    "icmp4_frag_needed", "icmp6_too_big", "fragment_ipv4", "ipv6_packet",
    "pseudo_sum6", "IPV4_MIN_MTU", "IPV6_MIN_MTU",
]

IPV4_HDR = 20
IPV6_HDR = 40
PROTO_ICMP = 1
PROTO_ICMPV6 = 58
IPV4_MIN_MTU = 68      # RFC 791
IPV6_MIN_MTU = 1280    # RFC 8200 §5
IPV4_DF = 0x4000
IPV4_MF = 0x2000
IPV4_OFFSET_MASK = 0x1FFF
ICMP4_UNREACH = 3
ICMP4_FRAG_NEEDED = 4
ICMP6_TOO_BIG = 2
ICMP4_QUOTE = 576      # RFC 1812 §4.3.2.3: quote at most what fits in 576 bytes
DEFAULT_TTL = 64
_V4 = struct.Struct(">BBHHHBBH4s4s")
_V6 = struct.Struct(">IHBB16s16s")


@dataclass(slots=True)
class IpInfo:
    """What routing a packet needs: version, source, destination, lengths (one per
    packet, so not frozen: a frozen dataclass takes four times as long to make)."""

    version: int
    src: bytes
    dst: bytes
    header_len: int
    total_len: int
    proto: int
    df: bool

    @property
    def multicast(self) -> bool:
        if self.version == 4:
            return self.dst[0] & 0xF0 == 0xE0 or self.dst == b"\xff\xff\xff\xff"
        return self.dst[0] == 0xFF


def parse(pkt: bytes | memoryview) -> IpInfo:
    """Check an IPv4/IPv6 packet's header and length (:class:`DecodeError` if bad)."""
    n = len(pkt)
    if n < 1:
        raise DecodeError("empty IP packet")
    version = pkt[0] >> 4
    if version == 4:
        if n < IPV4_HDR:
            raise DecodeError(f"IPv4 packet of {n} bytes is shorter than its header")
        vihl, _tos, total, _ident, frag, _ttl, proto, _csum, src, dst = _V4.unpack_from(pkt)
        ihl = (vihl & 0x0F) * 4
        if ihl < IPV4_HDR or total < ihl or total > n:
            raise DecodeError(f"IPv4 header length {ihl} / total length {total} do not fit "
                              f"{n} bytes")
        return IpInfo(4, src, dst, ihl, total, proto, bool(frag & IPV4_DF))
    if version == 6:
        if n < IPV6_HDR:
            raise DecodeError(f"IPv6 packet of {n} bytes is shorter than its header")
        _vtf, plen, nh, _hlim, src, dst = _V6.unpack_from(pkt)
        if IPV6_HDR + plen > n:
            raise DecodeError(f"IPv6 payload length {plen} exceeds the {n}-byte packet")
        return IpInfo(6, src, dst, IPV6_HDR, IPV6_HDR + plen, nh, True)
    raise DecodeError(f"IP version {version} is neither 4 nor 6")


def checksum(data: bytes | bytearray | memoryview, initial: int = 0) -> int:
    """The Internet checksum (RFC 1071) of ``data``, folded, complemented."""
    b = bytes(data)
    if len(b) % 2:
        b += b"\0"
    s: int = initial + sum(struct.unpack(f">{len(b) // 2}H", b))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def pseudo_sum6(src: bytes, dst: bytes, length: int, nh: int) -> int:
    """The unfolded sum of the IPv6 pseudo-header (RFC 8200 §8.1)."""
    b = bytes(src) + bytes(dst) + struct.pack(">IxxxB", length, nh)
    return sum(struct.unpack(">20H", b))


def ipv4_header(src: bytes, dst: bytes, proto: int, payload_len: int, *, ident: int = 0,
                frag: int = 0, ttl: int = DEFAULT_TTL, tos: int = 0) -> bytes:
    hdr = _V4.pack(0x45, tos, IPV4_HDR + payload_len, ident, frag, ttl, proto, 0, src, dst)
    return hdr[:10] + struct.pack(">H", checksum(hdr)) + hdr[12:]


def ipv6_packet(src: bytes, dst: bytes, nh: int, payload: bytes, hop_limit: int) -> bytes:
    return _V6.pack(6 << 28, len(payload), nh, hop_limit, src, dst) + payload


def icmp4_frag_needed(pkt: bytes | memoryview, our_ip: bytes, mtu: int) -> bytes:
    """ICMP destination unreachable, fragmentation needed (RFC 792; next-hop MTU per
    RFC 1191 §4) from ``our_ip`` to the source of ``pkt``, quoting its start."""
    info = parse(pkt)
    quote = bytes(pkt[:min(info.total_len, ICMP4_QUOTE - IPV4_HDR - 8)])
    body = struct.pack(">BBHHH", ICMP4_UNREACH, ICMP4_FRAG_NEEDED, 0, 0, mtu) + quote
    body = body[:2] + struct.pack(">H", checksum(body)) + body[4:]
    return ipv4_header(our_ip, info.src, PROTO_ICMP, len(body)) + body


def icmp6_too_big(pkt: bytes | memoryview, our_ip: bytes, mtu: int) -> bytes:
    """ICMPv6 packet too big (RFC 4443 §3.2) from ``our_ip`` to the source of ``pkt``,
    quoting as much as fits in the minimum MTU."""
    info = parse(pkt)
    quote = bytes(pkt[:min(info.total_len, IPV6_MIN_MTU - IPV6_HDR - 8)])
    body = struct.pack(">BBHI", ICMP6_TOO_BIG, 0, 0, mtu) + quote
    csum = checksum(body, pseudo_sum6(our_ip, info.src, len(body), PROTO_ICMPV6))
    body = body[:2] + struct.pack(">H", csum) + body[4:]
    return ipv6_packet(our_ip, info.src, PROTO_ICMPV6, body, DEFAULT_TTL)


def fragment_ipv4(pkt: bytes | memoryview, mtu: int) -> list[bytes]:
    """Split an IPv4 packet without DF into fragments of at most ``mtu`` bytes
    (RFC 791 §2.3: offsets in 8-byte units, MF on all but the last, options copied
    as they are)."""
    info = parse(pkt)
    hdr = bytearray(pkt[:info.header_len])
    data = bytes(pkt[info.header_len:info.total_len])
    _, frag0 = struct.unpack_from(">HH", hdr, 4)
    base_off = frag0 & IPV4_OFFSET_MASK
    last_mf = frag0 & IPV4_MF
    step = (mtu - info.header_len) // 8 * 8
    if step <= 0:
        raise DecodeError(f"MTU {mtu} cannot carry a fragment of this packet")
    out: list[bytes] = []
    for off in range(0, len(data), step):
        chunk = data[off:off + step]
        more = IPV4_MF if off + step < len(data) else last_mf
        h = bytearray(hdr)
        struct.pack_into(">H", h, 2, info.header_len + len(chunk))
        struct.pack_into(">H", h, 6, more | (base_off + off // 8))
        struct.pack_into(">H", h, 10, 0)
        struct.pack_into(">H", h, 10, checksum(h))
        out.append(bytes(h) + chunk)
    return out
