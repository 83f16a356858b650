"""The IPoIB encapsulation header and ARP over InfiniBand (RFC 4391 §6, §9.1.1; RFC 4755 §4).

Every IPoIB message, on the UD QP or on a connection, is the 4-byte header
``|Type(16)|Reserved(16)|`` followed by the payload; Type is the EtherType. ARP uses
hardware type 32 (``ARPHRD_INFINIBAND``) and 20-byte hardware addresses
(docs/protocols.md §10).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

from ..errors import DecodeError
from .hwaddr import ALEN, HwAddr

__all__ = [
    "ENCAP_LEN", "EtherType", "encap_header", "decode_encap", "ARP_HTYPE_INFINIBAND",
    "ArpOp", "ArpPacket", "ARP_LEN",
]

ENCAP_LEN = 4  # IPOIB_ENCAP_LEN


class EtherType(IntEnum):
    """The Type values an IPoIB interface carries (RFC 4755 §4 table; ARP per RFC 4391)."""

    IPV4 = 0x0800
    ARP = 0x0806
    IPV6 = 0x86DD


_ENCAP = struct.Struct(">HH")
_HEADERS = {t: _ENCAP.pack(t, 0) for t in EtherType}


def encap_header(ethertype: int) -> bytes:
    """The 4 bytes in front of a payload of ``ethertype`` (Reserved zero, RFC 4391 §6)."""
    hdr = _HEADERS.get(ethertype)  # type: ignore[call-overload]
    return hdr if hdr is not None else _ENCAP.pack(ethertype, 0)


def decode_encap(data: bytes | memoryview) -> int:
    """The Type of an IPoIB message; :class:`DecodeError` if it is shorter than the
    header or the Type is not one we carry. The Reserved field is ignored on receive."""
    if len(data) < ENCAP_LEN:
        raise DecodeError(f"IPoIB message of {len(data)} bytes is shorter than the "
                          f"{ENCAP_LEN}-byte encapsulation header")
    etype, _reserved = _ENCAP.unpack_from(data)
    if etype not in _HEADERS:
        raise DecodeError(f"IPoIB encapsulation Type {etype:#06x} is not IPv4, IPv6 or ARP")
    return int(etype)


ARP_HTYPE_INFINIBAND = 32  # ARPHRD_INFINIBAND
_ARP_FIXED = struct.Struct(">HHBBH")
_IPV4_LEN = 4
ARP_LEN = _ARP_FIXED.size + 2 * (ALEN + _IPV4_LEN)  # 56


class ArpOp(IntEnum):
    REQUEST = 1
    REPLY = 2


@dataclass(frozen=True, slots=True)
class ArpPacket:
    """An ARP request or reply for IPv4 over InfiniBand (RFC 4391 §9.1.1)."""

    op: int
    sender_hw: HwAddr
    sender_ip: bytes
    target_hw: HwAddr
    target_ip: bytes

    def encode(self) -> bytes:
        return (_ARP_FIXED.pack(ARP_HTYPE_INFINIBAND, EtherType.IPV4, ALEN, _IPV4_LEN, self.op)
                + self.sender_hw.encode() + bytes(self.sender_ip)
                + self.target_hw.encode() + bytes(self.target_ip))

    @classmethod
    def decode(cls, data: bytes | memoryview) -> ArpPacket:
        """Parse and check hardware type 32, protocol IPv4, lengths 20/4, op 1 or 2."""
        if len(data) < ARP_LEN:
            raise DecodeError(f"ARP packet of {len(data)} bytes, InfiniBand ARP is {ARP_LEN}")
        htype, ptype, hlen, plen, op = _ARP_FIXED.unpack_from(data)
        if htype != ARP_HTYPE_INFINIBAND:
            raise DecodeError(f"ARP hardware type {htype}, expected {ARP_HTYPE_INFINIBAND}")
        if ptype != EtherType.IPV4 or hlen != ALEN or plen != _IPV4_LEN:
            raise DecodeError(f"ARP ptype {ptype:#06x} hlen {hlen} plen {plen}: not IPv4 over IB")
        if op not in (ArpOp.REQUEST, ArpOp.REPLY):
            raise DecodeError(f"ARP operation {op} is neither request nor reply")
        o = _ARP_FIXED.size
        b = bytes(data[o:ARP_LEN])
        return cls(op, HwAddr.decode(b[0:ALEN]), b[ALEN:ALEN + 4],
                   HwAddr.decode(b[ALEN + 4:2 * ALEN + 4]), b[2 * ALEN + 4:2 * ALEN + 8])
