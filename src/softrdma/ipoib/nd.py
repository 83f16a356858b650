"""IPv6 Neighbor Discovery over IPoIB (RFC 4861 §4.3, §4.4, §7.1; RFC 4391 §9.2).

The Source/Target Link-Layer Address option of IPoIB is Type, Length 3 (24 bytes),
two reserved zero bytes, then the 20-byte link-layer address (RFC 4391 §9.2, Linux
``ndisc_addr_option_pad`` = 2 for ARPHRD_INFINIBAND; docs/protocols.md §10).
Messages are built and checked here; the interface decides what to do with them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

from ..errors import DecodeError
from .hwaddr import ALEN, HwAddr
from .ip import IPV6_HDR, PROTO_ICMPV6, checksum, ipv6_packet, pseudo_sum6

__all__ = ["NdType", "NdMessage", "ND_HOP_LIMIT", "build", "decode", "is_nd"]

ND_HOP_LIMIT = 255          # RFC 4861 §7.1.1: anything else is not from the link
OPT_SLLA = 1
OPT_TLLA = 2
OPT_UNIT = 8
LLA_OPT_LEN = 3             # 24 bytes
LLA_PAD = 2
NA_ROUTER = 0x80
NA_SOLICITED = 0x40
NA_OVERRIDE = 0x20
_HDR = struct.Struct(">BBHB3x16s")   # type, code, checksum, flags, reserved, target
_OPT = struct.Struct(">BB")


class NdType(IntEnum):
    NEIGHBOR_SOLICITATION = 135
    NEIGHBOR_ADVERTISEMENT = 136


@dataclass(frozen=True, slots=True)
class NdMessage:
    """A Neighbor Solicitation or Advertisement and the addresses around it."""

    type: int
    src: bytes
    dst: bytes
    target: bytes
    lladdr: HwAddr | None = None     # SLLA in an NS, TLLA in an NA
    flags: int = 0                   # NA: R, S, O


def is_nd(nh: int, payload: bytes | memoryview) -> bool:
    """Whether an IPv6 payload of next header ``nh`` is an NS or NA."""
    return nh == PROTO_ICMPV6 and len(payload) >= 1 and payload[0] in (
        NdType.NEIGHBOR_SOLICITATION, NdType.NEIGHBOR_ADVERTISEMENT)


def build(msg: NdMessage) -> bytes:
    """The whole IPv6 packet (hop limit 255, checksum over the pseudo-header)."""
    body = bytearray(_HDR.pack(msg.type, 0, 0, msg.flags, bytes(msg.target)))
    if msg.lladdr is not None:
        opt = OPT_SLLA if msg.type == NdType.NEIGHBOR_SOLICITATION else OPT_TLLA
        body += _OPT.pack(opt, LLA_OPT_LEN) + bytes(LLA_PAD) + msg.lladdr.encode()
    csum = checksum(body, pseudo_sum6(msg.src, msg.dst, len(body), PROTO_ICMPV6))
    struct.pack_into(">H", body, 2, csum)
    return ipv6_packet(msg.src, msg.dst, PROTO_ICMPV6, bytes(body), ND_HOP_LIMIT)


def decode(pkt: bytes | memoryview) -> NdMessage:
    """Check an NS/NA (RFC 4861 §7.1.1/§7.1.2: hop limit 255, code 0, checksum,
    length, option lengths) and return it; :class:`DecodeError` otherwise."""
    if len(pkt) < IPV6_HDR + _HDR.size:
        raise DecodeError("ND message shorter than its fixed part")
    plen, nh, hlim = struct.unpack_from(">HBB", pkt, 4)
    src, dst = bytes(pkt[8:24]), bytes(pkt[24:40])
    body = bytes(pkt[IPV6_HDR:IPV6_HDR + plen])
    if nh != PROTO_ICMPV6 or len(body) != plen or plen < _HDR.size:
        raise DecodeError("ND message length or next header is wrong")
    if hlim != ND_HOP_LIMIT:
        raise DecodeError(f"ND hop limit {hlim}, must be {ND_HOP_LIMIT}")
    if checksum(body, pseudo_sum6(src, dst, plen, PROTO_ICMPV6)) != 0:
        raise DecodeError("ND ICMPv6 checksum mismatch")
    typ, code, _c, flags, target = _HDR.unpack_from(body)
    if typ not in (NdType.NEIGHBOR_SOLICITATION, NdType.NEIGHBOR_ADVERTISEMENT) or code:
        raise DecodeError(f"ICMPv6 type {typ} code {code} is not NS/NA")
    if target[0] == 0xFF:
        raise DecodeError("ND target is a multicast address")
    want = OPT_SLLA if typ == NdType.NEIGHBOR_SOLICITATION else OPT_TLLA
    lladdr: HwAddr | None = None
    off = _HDR.size
    while off < plen:
        if off + 2 > plen:
            raise DecodeError("truncated ND option")
        otype, olen = _OPT.unpack_from(body, off)
        if olen == 0 or off + olen * OPT_UNIT > plen:
            raise DecodeError(f"ND option {otype} has a bad length {olen}")
        if otype == want:
            if olen != LLA_OPT_LEN:
                raise DecodeError(f"IPoIB link-layer address option of length {olen}, "
                                  f"expected {LLA_OPT_LEN}")
            start = off + 2 + LLA_PAD
            lladdr = HwAddr.decode(body[start:start + ALEN])
        off += olen * OPT_UNIT
    return NdMessage(typ, src, dst, target, lladdr, flags if typ == NdType.NEIGHBOR_ADVERTISEMENT
                     else 0)
