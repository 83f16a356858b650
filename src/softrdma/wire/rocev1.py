"""RoCEv1 link and network headers: Ethernet (+ 802.1Q), the GRH, and v1 GIDs.

Annex A16 (IBA 1.2.1 Annex A16, "RoCE"):

* A16.3.1: a RoCE packet is an IB packet with a MAC header in place of the LRH, and every
  packet carries a GRH (IBA 8.3: IPVer 6, TClass, FlowLabel, PayLen, NxtHdr 0x1B, HopLmt,
  SGID, DGID; 40 bytes). EtherType 0x8915 (A16.3.1).
* A16.8.1: SL 0-7 map to Ethernet priorities 0-7 (the 802.1Q PCP where a VLAN tag is
  sent); SL 8-15 are reserved.
* A16.5.1: the MAC of a GID comes from Ethernet means (ARP/ND): see
  :mod:`softrdma.drivers.host.neigh`. The link-local GID of a port is ``fe80::/64`` plus the
  modified EUI-64 of its MAC (RFC 4291 appendix A), from which Linux
  (``rdma_get_ll_mac``) reads the MAC back without asking the network.

The ICRC of a RoCEv1 packet is :func:`softrdma.wire.roce.icrc_v1` (8 bytes of 0xFF for the
LRH, the GRH with TClass/FlowLabel/HopLmt masked, the BTH with resv8a masked). No
independent RoCEv1 implementation was at hand to confirm it (rxe has no RoCEv1); it
follows the native IB ICRC rule (IBA 7.8.1) with Annex A16.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ..errors import DecodeError, InvalidArgument
from .crc import Buffer
from .fields import check_bits

__all__ = [
    "ETH_HLEN", "ETH_P_8021Q", "ETH_P_ROCE_V1", "GRH_SIZE", "GRH_NEXT_HEADER_BTH",
    "VLAN_HLEN", "MAX_SL", "RESERVED_SL_MIN", "Grh", "EthHeader", "build_grh", "parse_grh",
    "build_grh_v1", "ethernet_header", "parse_ethernet", "link_local_gid", "mac_of_link_local_gid",
    "multicast_mac", "is_multicast_gid", "LOOPBACK_GID",
]

ETH_P_ROCE_V1 = 0x8915  # Annex A16
ETH_P_8021Q = 0x8100  # IEEE 802.1Q
ETH_P_8021AD = 0x88A8
ETH_HLEN = 14
VLAN_HLEN = 4
GRH_SIZE = 40
GRH_IPVER = 6  # IBA 8.3.1: IPVer 6
GRH_NEXT_HEADER_BTH = 0x1B  # IBA 8.3.1 / ud_header.c: an IBA transport header follows
FLOW_LABEL_MASK = 0xFFFFF
MAX_SL = 7  # A16.8.1: SL 0-7 map to priorities 0-7
RESERVED_SL_MIN = 8  # A16.8.1: SL 8-15 are reserved (CA16-18)
VLAN_VID_MASK = 0x0FFF
VLAN_PCP_SHIFT = 13
LOOPBACK_GID = bytes(15) + b"\x01"  # IBA 4.1.1: ::1, reserved (A16.7.2)
_LINK_LOCAL_PREFIX = b"\xfe\x80" + bytes(6)
_EUI64_MIDDLE = b"\xff\xfe"
_UL_BIT = 0x02  # RFC 4291 appendix A: invert the universal/local bit

_GRH = struct.Struct("!IHBB16s16s")
_ETH = struct.Struct("!6s6sH")
_VLAN = struct.Struct("!HH")


@dataclass(frozen=True, slots=True)
class Grh:
    """The fields of a GRH (IBA 8.3.1)."""

    sgid: bytes
    dgid: bytes
    paylen: int
    tclass: int = 0
    flow_label: int = 0
    hop_limit: int = 0xFF
    next_header: int = GRH_NEXT_HEADER_BTH
    ipver: int = GRH_IPVER


def build_grh(sgid: bytes, dgid: bytes, paylen: int, *, tclass: int = 0, flow_label: int = 0,
              hop_limit: int = 0xFF) -> bytes:
    """The 40-byte GRH of a RoCEv1 packet (A16.3.1, IBA 8.3.1).

    ``paylen`` counts the bytes after the GRH: BTH through the ICRC (IBA 8.3.1 PayLen:
    "the number of bytes starting from the first byte after the GRH, up to and including
    the last byte of the ICRC").
    """
    if len(sgid) != 16 or len(dgid) != 16:
        raise InvalidArgument("sgid" if len(sgid) != 16 else "dgid", "a GID has 16 bytes")
    check_bits("paylen", paylen, 16)
    check_bits("tclass", tclass, 8)
    check_bits("flow_label", flow_label, 20)
    check_bits("hop_limit", hop_limit, 8)
    w0 = (GRH_IPVER << 28) | (tclass << 20) | flow_label
    return _GRH.pack(w0, paylen, GRH_NEXT_HEADER_BTH, hop_limit, bytes(sgid), bytes(dgid))


def parse_grh(data: Buffer) -> Grh:
    """Decode a GRH; :class:`DecodeError` unless it is 40 bytes, IPVer 6, NxtHdr 0x1B."""
    mv = memoryview(data).cast("B")
    if len(mv) < GRH_SIZE:
        raise DecodeError(f"truncated GRH: {len(mv)} bytes")
    w0, paylen, nxt, hop, sgid, dgid = _GRH.unpack_from(mv, 0)
    if w0 >> 28 != GRH_IPVER:
        raise DecodeError(f"GRH IPVer {w0 >> 28}, expected 6")
    if nxt != GRH_NEXT_HEADER_BTH:
        raise DecodeError(f"GRH next header {nxt:#04x}, expected 0x1b (BTH)")
    return Grh(sgid, dgid, paylen, (w0 >> 20) & 0xFF, w0 & FLOW_LABEL_MASK, hop, nxt, 6)


@dataclass(frozen=True, slots=True)
class EthHeader:
    """An Ethernet header with at most one 802.1Q tag (``vlan`` None when untagged)."""

    dst: bytes
    src: bytes
    ethertype: int
    vlan: int | None = None  # VID
    pcp: int = 0  # 802.1Q priority code point
    length: int = ETH_HLEN


def ethernet_header(dst: bytes, src: bytes, ethertype: int = ETH_P_ROCE_V1, *,
                    vlan: int | None = None, pcp: int = 0) -> bytes:
    """Ethernet II header, with an 802.1Q tag when ``vlan`` is given (0: priority tag).

    A16.8.1: the priority (PCP) carries the SL; :class:`InvalidArgument` for SL/PCP > 7.
    """
    if len(dst) != 6 or len(src) != 6:
        raise InvalidArgument("dst" if len(dst) != 6 else "src", "a MAC address has 6 bytes")
    if vlan is None:
        return _ETH.pack(dst, src, ethertype)
    if not 0 <= vlan <= VLAN_VID_MASK:
        raise InvalidArgument("vlan", f"VLAN ID must be 0..4095, got {vlan}")
    if not 0 <= pcp <= MAX_SL:
        raise InvalidArgument("pcp", f"802.1Q priority must be 0..7, got {pcp}")
    return (_ETH.pack(dst, src, ETH_P_8021Q)
            + _VLAN.pack((pcp << VLAN_PCP_SHIFT) | vlan, ethertype))


def parse_ethernet(data: Buffer) -> EthHeader:
    """Decode an Ethernet header and its first 802.1Q/802.1ad tag (outer tags of a
    QinQ stack are skipped; the innermost one is reported)."""
    mv = memoryview(data).cast("B")
    if len(mv) < ETH_HLEN:
        raise DecodeError(f"truncated Ethernet header: {len(mv)} bytes")
    dst, src, etype = _ETH.unpack_from(mv, 0)
    off = ETH_HLEN
    vlan: int | None = None
    pcp = 0
    while etype in (ETH_P_8021Q, ETH_P_8021AD):
        if len(mv) < off + VLAN_HLEN:
            raise DecodeError("truncated 802.1Q tag")
        tci, etype = _VLAN.unpack_from(mv, off)
        vlan = tci & VLAN_VID_MASK
        pcp = tci >> VLAN_PCP_SHIFT
        off += VLAN_HLEN
    return EthHeader(dst, src, etype, vlan, pcp, off)


# --------------------------------------------------------------------------- GIDs
def link_local_gid(mac: bytes) -> bytes:
    """The RoCEv1 link-local GID of a MAC: ``fe80::`` + modified EUI-64 (Annex A16,
    RFC 4291 appendix A): ``aa:bb:cc:dd:ee:ff`` -> ``fe80::a8bb:ccff:fedd:eeff``."""
    if len(mac) != 6:
        raise InvalidArgument("mac", f"a MAC address has 6 bytes, got {len(mac)}")
    return (_LINK_LOCAL_PREFIX + bytes([mac[0] ^ _UL_BIT]) + mac[1:3] + _EUI64_MIDDLE
            + mac[3:6])


def mac_of_link_local_gid(gid: bytes) -> bytes | None:
    """The MAC inside a link-local GID built by :func:`link_local_gid`, else None.

    Linux ``rdma_get_ll_mac`` (ib_addr.h) resolves such GIDs without asking the network.
    """
    if len(gid) != 16 or gid[:8] != _LINK_LOCAL_PREFIX or gid[11:13] != _EUI64_MIDDLE:
        return None
    return bytes([gid[8] ^ _UL_BIT]) + gid[9:11] + gid[13:16]


def is_multicast_gid(gid: bytes) -> bool:
    """IBA 4.1.1: a multicast GID starts with 0xFF."""
    return len(gid) == 16 and gid[0] == 0xFF


def multicast_mac(mgid: bytes) -> bytes:
    """The Ethernet multicast MAC of an MGID: ``33:33`` + its last 4 bytes (RFC 2464 §7,
    as for IPv6 multicast; Annex A17, Linux ``rdma_get_mcast_mac``)."""
    if not is_multicast_gid(mgid):
        raise InvalidArgument("mgid", "not a multicast GID (must start with 0xff)")
    return b"\x33\x33" + bytes(mgid[12:16])


def build_grh_v1(sgid: bytes, dgid: bytes, paylen: int, tclass: int, flow_label: int,
                 hop_limit: int) -> bytes:
    """:func:`build_grh` for the transmit path (fields already validated by the verbs
    layer; masked to their widths instead of re-checked per packet)."""
    return _GRH.pack((GRH_IPVER << 28) | ((tclass & 0xFF) << 20) | (flow_label & FLOW_LABEL_MASK),
                     paylen & 0xFFFF, GRH_NEXT_HEADER_BTH, hop_limit & 0xFF, sgid, dgid)
