"""A full-frame codec for RoCE captures: :func:`parse_frame`, :func:`build_frame`,
:func:`frame_icrc_ok`.

Link types: Ethernet with 802.1Q/802.1ad tags, Linux SLL/SLL2, raw IP. RoCEv2 is UDP to
port 4791 over IPv4 or IPv6 (Annex A17.2), RoCEv1 EtherType 0x8915 and a GRH (Annex A16.3.1,
IBA 8.3.1); the ICRC is checked with the frame's real network header (IBA 7.8.1,
:mod:`softrdma.wire.icrc`).
"""

from __future__ import annotations

import struct

from ..errors import DecodeError
from . import ib
from .crc import Buffer
from .fields import U16
from .icrc import icrc, icrc_v1
from .ipudp import ETH_P_IP, ETH_P_IPV6, IPPROTO_UDP, ROCE_V2_UDP_PORT
from .opcodes import BTH_SIZE, ICRC_SIZE
from .rocev1 import ETH_P_ROCE_V1, GRH_NEXT_HEADER_BTH

__all__ = [
    "RoceFrame", "parse_frame", "build_frame", "frame_icrc", "frame_icrc_ok", "icrc_ok_frame",
]

_VLAN_TYPES = frozenset((0x8100, 0x88A8, 0x9100))


# --------------------------------------------------------------------------- frames
class RoceFrame:
    """A RoCE frame from a capture, split into its layers (no copies of the payload).

    ``l2``: link-layer header bytes (Ethernet with any VLAN tags, SLL/SLL2, or empty for
    raw IP); ``ip``: IPv4 header with options, IPv6 header, or the RoCEv1 GRH; ``udp``: the
    UDP header (empty for RoCEv1); ``ib``: BTH .. pad; ``icrc``: the 4 ICRC bytes;
    ``trailer``: bytes after the IP packet (Ethernet padding); ``packet``: ``ib`` decoded.
    """

    __slots__ = ("linktype", "l2", "ip", "udp", "ib", "icrc", "trailer", "packet", "version")

    def __init__(self, linktype: int, l2: bytes, ip: bytes, udp: bytes, ib_part: memoryview,
                 icrc_bytes: bytes, trailer: bytes, packet: ib.IBPacket, version: int) -> None:
        self.linktype = linktype
        self.l2 = l2
        self.ip = ip
        self.udp = udp
        self.ib = ib_part
        self.icrc = icrc_bytes
        self.trailer = trailer
        self.packet = packet
        self.version = version

    @property
    def ip_version(self) -> int:
        """4 or 6 (a RoCEv1 GRH counts as 6)."""
        return self.ip[0] >> 4

    @property
    def src_ip(self) -> bytes:
        return self.ip[12:16] if self.ip_version == 4 else self.ip[8:24]

    @property
    def dst_ip(self) -> bytes:
        return self.ip[16:20] if self.ip_version == 4 else self.ip[24:40]

    @property
    def sport(self) -> int:
        return U16.unpack_from(self.udp, 0)[0] if self.udp else 0

    @property
    def dport(self) -> int:
        return U16.unpack_from(self.udp, 2)[0] if self.udp else 0

    def __repr__(self) -> str:
        return f"RoceFrame(v{self.version}, {ib.describe(self.packet)})"


def _l2_split(data: memoryview, linktype: int) -> tuple[int, int] | None:
    """(offset of the network header, EtherType) or None if the link type is not handled."""
    n = len(data)
    if linktype == 1:  # Ethernet (IEEE 802.3)
        if n < 14:
            raise DecodeError(f"truncated Ethernet header: {n} bytes")
        off = 12
    elif linktype == 113:  # Linux cooked capture v1
        if n < 16:
            raise DecodeError(f"truncated Linux SLL header: {n} bytes")
        off = 14
    elif linktype == 276:  # Linux cooked capture v2
        if n < 20:
            raise DecodeError(f"truncated Linux SLL2 header: {n} bytes")
        etype = U16.unpack_from(data, 0)[0]
        return _skip_vlans(data, 20, etype)
    elif linktype in (101, 228, 229, 12, 14):  # raw IP (12/14: old BSD values for RAW)
        if n < 1:
            raise DecodeError("empty raw IP frame")
        ver = data[0] >> 4
        if linktype == 228 and ver != 4 or linktype == 229 and ver != 6:
            raise DecodeError(f"IP version {ver} on link type {linktype}")
        return 0, {4: ETH_P_IP, 6: ETH_P_IPV6}.get(ver, 0)
    else:
        return None
    etype = U16.unpack_from(data, off)[0]
    return _skip_vlans(data, off + 2, etype)


def _skip_vlans(data: memoryview, off: int, etype: int) -> tuple[int, int]:
    while etype in _VLAN_TYPES:
        if len(data) < off + 4:
            raise DecodeError("truncated 802.1Q tag")
        etype = U16.unpack_from(data, off + 2)[0]
        off += 4
    return off, etype


def _ib_split(linktype: int, data: memoryview, l2_end: int, ip: bytes, udp: bytes,
              body: memoryview, trailer: memoryview, version: int) -> RoceFrame:
    n = len(body)
    if n < BTH_SIZE + ICRC_SIZE:
        raise DecodeError(f"RoCE payload of {n} bytes is too short for a BTH and an ICRC")
    ib_part = body[:n - ICRC_SIZE]
    try:
        pkt = ib.decode(ib_part)
    except DecodeError as e:
        raise DecodeError(f"IB transport: {e}") from None
    return RoceFrame(linktype, bytes(data[:l2_end]), ip, udp, ib_part,
                     bytes(body[n - ICRC_SIZE:]), bytes(trailer), pkt, version)


def parse_frame(data: Buffer, linktype: int,
                ports: frozenset[int] = frozenset((ROCE_V2_UDP_PORT,))) -> RoceFrame | None:
    """Split a captured frame into a :class:`RoceFrame`; None if it is not RoCE.

    RoCE means UDP destination port 4791 (or one of ``ports``, for devices configured on
    another port) over IPv4 or IPv6 (RoCEv2), or EtherType 0x8915
    (RoCEv1). Link types: 1 (Ethernet, any number of 802.1Q/802.1ad tags), 113 (SLL),
    276 (SLL2), 101/228/229 (raw IP). Raises :class:`DecodeError` for a RoCE frame (or a
    frame too short to tell) that is truncated or whose lengths disagree. Bytes after the
    IP packet (Ethernet minimum-size padding) are kept in ``trailer``.
    """
    mv = memoryview(data).cast("B")
    split = _l2_split(mv, linktype)
    if split is None:
        return None
    off, etype = split
    n = len(mv)
    if etype == ETH_P_IP:
        if n < off + 20:
            raise DecodeError(f"truncated IPv4 header: {n - off} bytes")
        vihl, _tos, total, _ident, frag, _ttl, proto = struct.unpack_from("!BBHHHBB", mv, off)
        if vihl >> 4 != 4:
            raise DecodeError(f"IP version {vihl >> 4} in an IPv4 (EtherType 0x0800) frame")
        if proto != IPPROTO_UDP:
            return None
        ihl = (vihl & 0x0F) * 4
        if ihl < 20:
            raise DecodeError(f"IPv4 header length {ihl} < 20")
        if frag & 0x1FFF:
            return None  # a non-first fragment has no UDP header
        if n < off + ihl + 8:
            raise DecodeError(f"truncated IPv4/UDP headers: {n - off} bytes")
        dport = U16.unpack_from(mv, off + ihl + 2)[0]
        if dport not in ports:
            return None
        if frag & 0x2000:
            raise DecodeError("fragmented IPv4 packet (MF set) to UDP port 4791")
        if total < ihl + 8:
            raise DecodeError(f"IPv4 total length {total} too small for the headers")
        if off + total > n:
            raise DecodeError(f"IPv4 total length {total} exceeds the {n - off} bytes captured")
        ip = bytes(mv[off:off + ihl])
        udp_off = off + ihl
        end = off + total
    elif etype == ETH_P_IPV6:
        plen, nxt = _v6_header(mv, off, n, "IPv6 header")
        if nxt != IPPROTO_UDP:
            return None  # extension headers are not used by RoCEv2 senders
        if n < off + 48:
            raise DecodeError(f"truncated IPv6/UDP headers: {n - off} bytes")
        if U16.unpack_from(mv, off + 42)[0] not in ports:
            return None
        if plen < 8:
            raise DecodeError(f"IPv6 payload length {plen} too small for a UDP header")
        _v6_payload(mv, off, n, plen, "IPv6")
        ip = bytes(mv[off:off + 40])
        udp_off = off + 40
        end = udp_off + plen
    elif etype == ETH_P_ROCE_V1:
        plen, nxt = _v6_header(mv, off, n, "GRH")
        if nxt != GRH_NEXT_HEADER_BTH:
            raise DecodeError(f"GRH next header {nxt:#04x}, expected 0x1b (BTH)")
        body = _v6_payload(mv, off, n, plen, "GRH")
        return _ib_split(linktype, mv, off, bytes(mv[off:off + 40]), b"", body,
                         mv[off + 40 + plen:], 1)
    else:
        return None
    udp = bytes(mv[udp_off:udp_off + 8])
    ulen = U16.unpack_from(udp, 4)[0]
    if ulen != end - udp_off:
        raise DecodeError(f"UDP length {ulen} disagrees with the IP payload length {end - udp_off}")
    return _ib_split(linktype, mv, off, ip, udp, mv[udp_off + 8:end], mv[end:], 2)


def _v6_header(mv: memoryview, off: int, n: int, name: str) -> tuple[int, int]:
    """The payload length and next header of the 40-byte IPv6 header (RoCEv2) or GRH
    (RoCEv1, IBA 8.3.1: the same layout) at ``off``, checked: whole and version 6."""
    if n < off + 40:
        raise DecodeError(f"truncated {name}: {n - off} bytes")
    w0, plen, nxt = struct.unpack_from("!IHB", mv, off)
    if w0 >> 28 != 6:
        raise DecodeError(f"{name}: IP version {w0 >> 28}, expected 6")
    return plen, nxt


def _v6_payload(mv: memoryview, off: int, n: int, plen: int, name: str) -> memoryview:
    """The ``plen`` bytes after the IPv6 header or GRH at ``off``, all captured."""
    if off + 40 + plen > n:
        raise DecodeError(f"{name} payload length {plen} exceeds the {n - off - 40} bytes "
                          "captured")
    return mv[off + 40:off + 40 + plen]


def build_frame(f: RoceFrame) -> bytes:
    """Rebuild the whole frame of ``f``, re-encoding the transport part from ``f.packet``."""
    return b"".join((f.l2, f.ip, f.udp, ib.encode(f.packet), f.icrc, f.trailer))


def frame_icrc(f: RoceFrame) -> bytes:
    """The ICRC that ``f`` should carry, computed from its real network header."""
    if f.version == 1:
        return icrc_v1(f.ip, (f.ib,))
    return icrc(f.ip, f.udp, (f.ib,))


def frame_icrc_ok(f: RoceFrame) -> bool:
    """True if the ICRC of ``f`` is correct (IBA 7.8.1, Annex A17)."""
    return frame_icrc(f) == f.icrc


def icrc_ok_frame(data: Buffer, linktype: int = 1) -> bool:
    """Parse a captured frame and check its ICRC. Raises DecodeError if it is not RoCE."""
    f = parse_frame(data, linktype)
    if f is None:
        raise DecodeError("not a RoCE frame (neither UDP port 4791 nor EtherType 0x8915)")
    return frame_icrc_ok(f)
