"""IPoIB link-layer addresses, multicast GIDs, the CM Service ID and private data.

* The 20-byte link-layer address ``<flags>:<UD QPN>:<GID>`` (RFC 4391 §9.1.1, extended by
  RFC 4755 §3.1 with the connected-mode flags: "Bit 0" = RC, "Bit 1" = UC in IBA bit
  numbering, i.e. the most significant bits 0x80 and 0x40 of the octet, as Linux's
  ``IPOIB_FLAGS_RC``/``IPOIB_FLAGS_UC``). Reserved flag bits are zero on transmit and
  ignored on receive (§3.1).
* Broadcast and multicast MGIDs of a P_Key (RFC 4391 §4; docs/protocols.md §10,
  Linux ``ip_ib_mc_map`` / ``ipv6_ib_mc_map``).
* The IPoIB-CM Service ID (RFC 4755 §3.5) and the REQ/REP/REJ private data (§6).
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass, field

from ..errors import DecodeError, InvalidArgument

__all__ = [
    "ALEN", "FLAG_RC", "FLAG_UC", "FLAGS_KNOWN", "MULTICAST_QPN", "DEFAULT_PKEY",
    "IPOIB_CM_SERVICE_PREFIX", "CM_DATA_SIZE", "HwAddr", "CmData",
    "ipv4_broadcast_mgid", "ipv4_mcast_mgid", "ipv6_mcast_mgid", "solicited_node",
    "service_id", "interface_id", "link_local",
]

ALEN = 20                      # INFINIBAND_ALEN
FLAG_RC = 0x80                 # RFC 4755 §3.1 bit 0 (Linux IPOIB_FLAGS_RC)
FLAG_UC = 0x40                 # RFC 4755 §3.1 bit 1 (Linux IPOIB_FLAGS_UC)
FLAGS_KNOWN = FLAG_RC | FLAG_UC
MULTICAST_QPN = 0xFFFFFF       # IBA 10.5: the multicast QPN in a multicast address
QPN_MASK = 0xFFFFFF
DEFAULT_PKEY = 0xFFFF
PKEY_FULL_MEMBER = 0x8000
MGID_PREFIX = 0xFF
MGID_FLAGS_TRANSIENT = 0x10
SCOPE_LINK_LOCAL = 0x2
SIGNATURE_IPV4 = 0x401B        # RFC 4391 §4: IPoIB IPv4 multicast signature
SIGNATURE_IPV6 = 0x601B        # RFC 4391 §4: IPoIB IPv6 multicast signature
GUID_UL_BIT = 0x02             # RFC 4291 App. A: universal/local bit of the IID

# RFC 4755 §3.5 draws the IPoIB Service ID as |00000001|Type|Reserved|QPN|. The IBA
# assigns the IETF the Service ID block whose top nibble is 1 (0x1000000000000000 ..
# 0x1FFFFFFFFFFFFFFF); Linux reads the drawing's leading field as that prefix and
# listens on IPOIB_CM_IETF_ID | UD QPN = 0x1000000000000000 | QPN (Type 0, Reserved 0,
# QPN in the low 24 bits). We use Linux's value so that Linux peers interoperate.
IPOIB_CM_SERVICE_PREFIX = 0x1000000000000000

_HW = struct.Struct(">I16s")
_CM_DATA = struct.Struct(">II")
CM_DATA_SIZE = _CM_DATA.size


@dataclass(frozen=True, slots=True)
class HwAddr:
    """A 20-byte IPoIB link-layer address: flags, UD QPN, GID (RFC 4755 §3.1)."""

    qpn: int
    gid: bytes
    flags: int = 0
    #: the address with the flags zeroed: the identity of the peer and the value compared
    #: MSB first for REQ crossing (RFC 4755 §3.3); made once (looked up per packet)
    key: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 0 <= self.qpn <= QPN_MASK:
            raise InvalidArgument("qpn", f"a QPN is 24 bits, got {self.qpn!r}")
        if len(self.gid) != 16:
            raise InvalidArgument("gid", f"a GID is 16 bytes, got {len(self.gid)}")
        object.__setattr__(self, "key", _HW.pack(self.qpn, bytes(self.gid)))

    def encode(self) -> bytes:
        return _HW.pack((self.flags & 0xFF) << 24 | self.qpn, bytes(self.gid))

    @classmethod
    def decode(cls, data: bytes | memoryview) -> HwAddr:
        """Parse 20 bytes; reserved flag bits are ignored (RFC 4755 §3.1)."""
        if len(data) != ALEN:
            raise DecodeError(f"an IPoIB hardware address is {ALEN} bytes, got {len(data)}")
        word, gid = _HW.unpack(data)
        return cls(word & QPN_MASK, gid, (word >> 24) & FLAGS_KNOWN)

    @property
    def rc(self) -> bool:
        return bool(self.flags & FLAG_RC)

    @property
    def uc(self) -> bool:
        return bool(self.flags & FLAG_UC)

    @property
    def multicast(self) -> bool:
        return self.qpn == MULTICAST_QPN and self.gid[0] == MGID_PREFIX

    def __str__(self) -> str:
        return ":".join(f"{b:02x}" for b in self.encode())


def _mgid(signature: int, pkey: int, tail: bytes) -> bytes:
    head = bytes((MGID_PREFIX, MGID_FLAGS_TRANSIENT | SCOPE_LINK_LOCAL))
    return head + struct.pack(">HH", signature, pkey | PKEY_FULL_MEMBER) + tail


def ipv4_broadcast_mgid(pkey: int = DEFAULT_PKEY) -> bytes:
    """``ff12:401b:<pkey>::ffff:ffff`` (RFC 4391 §4, Linux's broadcast address)."""
    return _mgid(SIGNATURE_IPV4, pkey, bytes(6) + b"\xff\xff\xff\xff")


def ipv4_mcast_mgid(group: bytes, pkey: int = DEFAULT_PKEY) -> bytes:
    """The MGID of IPv4 group ``group`` (4 bytes): its low 28 bits in bytes 12-15
    (RFC 4391 §4, Linux ``ip_ib_mc_map``)."""
    return _mgid(SIGNATURE_IPV4, pkey, bytes(6) + bytes((group[0] & 0x0F,)) + bytes(group[1:4]))


def ipv6_mcast_mgid(group: bytes, pkey: int = DEFAULT_PKEY) -> bytes:
    """The MGID of IPv6 group ``group`` (16 bytes): its low 80 bits (RFC 4391 §4,
    Linux ``ipv6_ib_mc_map``)."""
    return _mgid(SIGNATURE_IPV6, pkey, bytes(group[6:16]))


def solicited_node(addr: bytes) -> bytes:
    """The solicited-node multicast address of IPv6 ``addr`` (RFC 4291 §2.7.1)."""
    return bytes.fromhex("ff0200000000000000000001ff") + bytes(addr[13:16])


def interface_id(gid: bytes) -> bytes:
    """The IPv6 interface identifier: the port GUID (GID bytes 8-15) with the
    universal/local bit inverted (RFC 4391 §8)."""
    return bytes((gid[8] ^ GUID_UL_BIT,)) + bytes(gid[9:16])


def link_local(gid: bytes) -> ipaddress.IPv6Address:
    """``fe80::`` + :func:`interface_id` (RFC 4391 §8, RFC 4862)."""
    return ipaddress.IPv6Address(bytes.fromhex("fe80000000000000") + interface_id(gid))


def service_id(ud_qpn: int) -> int:
    """The Service ID a node listens on: prefix | Type 0 | Reserved 0 | UD QPN (§3.5)."""
    return IPOIB_CM_SERVICE_PREFIX | (ud_qpn & QPN_MASK)


@dataclass(frozen=True, slots=True)
class CmData:
    """The private data of every IPoIB-CM REQ, REP and REJ (RFC 4755 §6):
    ``|Reserved(8)|UD QPN(24)|`` then ``|Receive MTU(32)|``."""

    ud_qpn: int
    receive_mtu: int

    def encode(self) -> bytes:
        return _CM_DATA.pack(self.ud_qpn & QPN_MASK, self.receive_mtu)

    @classmethod
    def decode(cls, data: bytes | memoryview) -> CmData:
        """Parse the first 8 bytes (the rest of the CM's fixed-size private data field
        is padding); the reserved octet is ignored (§6)."""
        if len(data) < CM_DATA_SIZE:
            raise DecodeError(f"IPoIB-CM private data needs {CM_DATA_SIZE} bytes, "
                              f"got {len(data)}")
        word, mtu = _CM_DATA.unpack_from(data)
        return cls(word & QPN_MASK, mtu)
