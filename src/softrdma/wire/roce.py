"""RoCE encapsulation: RoCEv2 (IPv4/IPv6 + UDP 4791), RoCEv1 (EtherType 0x8915 + GRH), ICRC.

Implements IBA Annex A16 and Annex A17:

* §1 encapsulations: :func:`ipv4_header`, :func:`ipv6_header`, :func:`udp_header`, the
  UDP source-port conventions of Linux (:func:`flow_label_from_qpns`,
  :func:`udp_sport_from_flow_label`, :func:`rxe_udp_sport`);
* §2 the ICRC: :func:`icrc` (RoCEv2 over IPv4 or IPv6), :func:`icrc_v1` (RoCEv1),
  computed incrementally over a list of buffers (no payload concatenation), and the
  send/receive helpers for a UDP socket (:func:`udp_send_icrc`, :func:`icrc_ok_udp`);
* a full-frame codec for captures: :func:`parse_frame`, :func:`build_frame`,
  :func:`frame_icrc_ok` (Ethernet with 802.1Q/802.1ad tags, Linux SLL/SLL2, raw IP).

ICRC (IBA 7.8.1, Annex A17): ``zlib``-style CRC-32 over ``8 x 0xFF`` (the masked LRH), the network
header with its variant fields set to ones (IPv4: TOS, TTL, header checksum; IPv6 and
GRH: traffic class, flow label, hop limit), the UDP header with its checksum set to ones,
the BTH with byte 4 (FECN, BECN, Resv6) set to ones, and everything after the BTH up to
the ICRC; stored on the wire least-significant byte first.

IPv4 options (never sent by rxe or Linux UDP sockets) are covered as sent, with the
masks at their usual offsets; unverified: rxe_icrc.c copies only a 20-byte base header and
takes the next 8 bytes as the UDP header, i.e. it assumes there are no options.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from functools import lru_cache

from ..errors import DecodeError, InvalidArgument
from . import ib
from .crc import Buffer, crc32, crc32_raw
from .gid import ipv4_mapped, unmap_ipv4
from .opcodes import BTH_SIZE, ICRC_SIZE

__all__ = [
    "ROCE_V2_UDP_PORT", "ROCE_V1_ETHERTYPE", "RXE_ROCE_V2_SPORT",
    "flow_label_from_qpns", "udp_sport_from_flow_label", "rxe_udp_sport",
    "ipv4_header", "ipv6_header", "udp_header", "inet_checksum", "udp_checksum",
    "icrc", "icrc_v1", "icrc_ok_udp", "icrc_ok_udp_id", "udp_send_icrc", "udp_payload_with_icrc",
    "udp_gso_iov", "udp_run_bodies", "GSO_IDS",
    "RoceFrame", "parse_frame", "build_frame", "frame_icrc", "frame_icrc_ok", "icrc_ok_frame",
    "ipv4_mapped", "unmap_ipv4", "recover_ipv4_id",
]

ROCE_V2_UDP_PORT = 4791
ROCE_V1_ETHERTYPE = 0x8915
RXE_ROCE_V2_SPORT = 0xC000  # rxe.h; also IB_ROCE_UDP_ENCAP_VALID_PORT_MIN (ib_verbs.h)
GRH_NEXT_HEADER_BTH = 0x1B  # ud_header.c: GRH next header when a BTH follows
IB_GRH_FLOWLABEL_MASK = 0xFFFFF

ETH_P_IP = 0x0800
ETH_P_IPV6 = 0x86DD
_VLAN_TYPES = frozenset((0x8100, 0x88A8, 0x9100))
IPPROTO_UDP = 17

_IPV4 = struct.Struct("!BBHHHBBH4s4s")
_IPV6 = struct.Struct("!IHBB16s16s")
_UDP = struct.Struct("!HHHH")
_U16 = struct.Struct("!H")
_ICRC = struct.Struct("<I")



# --------------------------------------------------------------------------- ports
def flow_label_from_qpns(lqpn: int, rqpn: int) -> int:
    """Symmetric 20-bit flow label of a QP pair (ib_verbs.h ``rdma_calc_flow_label``).

    ``v = lqpn * rqpn`` (64-bit), ``v ^= v >> 20``, ``v ^= v >> 40``, low 20 bits.
    """
    v = ((lqpn & 0xFFFFFFFF) * (rqpn & 0xFFFFFFFF)) & 0xFFFFFFFFFFFFFFFF
    v ^= v >> 20
    v ^= v >> 40
    return v & IB_GRH_FLOWLABEL_MASK


def udp_sport_from_flow_label(fl: int) -> int:
    """RoCEv2 UDP source port from a flow label (ib_verbs.h ``rdma_flow_label_to_udp_sport``).

    ``(fl & 0x3FFF) ^ ((fl & 0xFC000) >> 14)``, ORed with 0xC000.
    """
    lo = fl & 0x03FFF
    hi = fl & 0xFC000
    return ((lo ^ (hi >> 14)) | RXE_ROCE_V2_SPORT) & 0xFFFF


def rxe_udp_sport(lqpn: int, rqpn: int | None = None, flow_label: int = 0) -> int:
    """The RoCEv2 UDP source port rxe uses for QP ``lqpn``.

    At creation (no peer, ``rqpn`` None; the port a UD QP, never given an address vector,
    keeps): rxe_qp.c ``rxe_qp_init_req``, ``0xC000 + (hash_32(qpn, 14) & 0x3FFF)`` with
    ``hash_32(v, b) = (v * 0x61C88647 mod 2^32) >> (32 - b)`` (linux/hash.h).

    A connected QP after ``modify_qp`` with a GRH address (peer ``rqpn``): rxe_verbs.c
    ``rxe_modify_qp`` -> ib_verbs.h ``rdma_get_udp_sport``: the AH flow label, or if it
    is 0 the label computed from the two QPNs, mapped to a port.
    """
    if rqpn is None:
        return RXE_ROCE_V2_SPORT + ((((lqpn * 0x61C88647) & 0xFFFFFFFF) >> 18) & 0x3FFF)
    fl = flow_label or flow_label_from_qpns(lqpn, rqpn)
    return udp_sport_from_flow_label(fl)


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
    _U16.pack_into(hdr, 10, inet_checksum(hdr))
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
    length = _U16.unpack_from(uh, 4)[0]
    if len(src) == 4:
        pseudo = bytes(src) + bytes(dst) + struct.pack("!BBH", 0, IPPROTO_UDP, length)
    else:
        pseudo = bytes(src) + bytes(dst) + struct.pack("!IxxxB", length, IPPROTO_UDP)
    s = _sum16(pseudo)
    s = _sum16(uh, s)
    s = _sum16(b"".join(bytes(p) for p in parts), s)
    c = (~s) & 0xFFFF
    return c or 0xFFFF


# --------------------------------------------------------------------------- ICRC
_FF = b"\xff"  # BTH byte 4 (FECN, BECN, resv6) as the ICRC sees it
_FF8_STATE = crc32(b"\xff" * 8)  # CRC after the masked LRH: rxe's seed 0xDEBB20E3, inverted


def _mask_ip(ip_hdr: Buffer) -> bytes:
    """The network header with its ICRC-variant fields set to ones (IBA 7.8.1, Annex A17 step 2)."""
    ip = memoryview(ip_hdr).cast("B")
    ver = ip[0] >> 4 if len(ip) else 0
    if ver == 4:
        if len(ip) < 20:
            raise DecodeError(f"IPv4 header of {len(ip)} bytes")
        b = bytearray(ip)
        b[1] = 0xFF
        b[8] = 0xFF
        b[10] = 0xFF
        b[11] = 0xFF
        return bytes(b)
    if ver == 6:
        if len(ip) != 40:
            raise DecodeError(f"IPv6 header/GRH of {len(ip)} bytes, expected 40")
        return b"\x6f\xff\xff\xff" + bytes(ip[4:7]) + b"\xff" + bytes(ip[8:40])
    raise DecodeError(f"IP version {ver} in the ICRC's network header")


def _mask_udp(udp_hdr: Buffer) -> bytes:
    u = bytes(udp_hdr)
    if len(u) != 8:
        raise DecodeError(f"UDP header of {len(u)} bytes")
    return u[:6] + b"\xff\xff"


def _crc_ib(state: int, parts: Iterable[Buffer]) -> int:
    """Continue ``state`` over BTH .. pad given as buffers, BTH byte 4 set to ones."""
    if not isinstance(parts, (list, tuple)):
        parts = list(parts)
    first = parts[0] if parts else b""
    if isinstance(first, (bytes, bytearray)) and len(first) >= BTH_SIZE:
        # the usual case: the engine's header buffer holds the whole BTH (``state`` is
        # unsigned, so crc32_raw needs no mask: per packet, one call layer less)
        state = crc32_raw(first[5:], crc32_raw(_FF, crc32_raw(first[:4], state)))
        for p in parts[1:]:
            state = crc32_raw(p, state)
        return state
    need = BTH_SIZE
    head = bytearray()
    for p in parts:
        mv = memoryview(p).cast("B")
        if need:
            take = mv[:need]
            head += take
            need -= len(take)
            if need:
                continue
            head[4] = 0xFF
            state = crc32(head, state)
            mv = mv[len(take):]
        if len(mv):
            state = crc32(mv, state)
    if need:
        raise DecodeError(f"transport packet of {len(head)} bytes, shorter than a BTH")
    return state


def icrc(ip_hdr: Buffer, udp_hdr: Buffer, parts: Iterable[Buffer]) -> bytes:
    """The 4 wire bytes of a RoCEv2 ICRC (IBA 7.8.1, Annex A17).

    ``ip_hdr`` is the IPv4 (version 4) or IPv6 (version 6) header as sent, ``udp_hdr``
    the UDP header and ``parts`` the transport packet from the BTH through the pad, in
    any number of buffers (the payload is never concatenated).
    """
    state = crc32(_mask_ip(ip_hdr), _FF8_STATE)
    state = crc32(_mask_udp(udp_hdr), state)
    return _ICRC.pack(_crc_ib(state, parts))


def icrc_v1(grh40: Buffer, parts: Iterable[Buffer]) -> bytes:
    """The 4 wire bytes of a RoCEv1 ICRC: 8 x 0xFF, the masked GRH, BTH .. pad (IBA 7.8.1, Annex A16).

    Unverified against an independent RoCEv1 implementation (none was available; rxe has
    no RoCEv1): this is the rule of IBA 7.8.1 read with Annex A16, the native IB ICRC with the LRH as ones. The CRC
    of the masked GRH depends only on IPVer, PayLen, NxtHdr and the GIDs, and is cached.
    """
    g = memoryview(grh40).cast("B")
    if len(g) != 40:
        raise DecodeError(f"GRH of {len(g)} bytes, expected 40")
    key = bytes((g[0] & 0xF0,)) + bytes(g[4:7]) + bytes(g[8:40])
    state = _GRH_CRC.get(key)
    if state is None:
        masked = bytes([(g[0] & 0xF0) | 0x0F]) + b"\xff\xff\xff" + bytes(g[4:7]) + b"\xff" \
            + bytes(g[8:40])
        state = crc32(masked, _FF8_STATE)
        if len(_GRH_CRC) >= 8192:
            _GRH_CRC.clear()
        _GRH_CRC[key] = state
    return _ICRC.pack(_crc_ib(state, parts))


# CRC state after 8 x 0xFF and a masked GRH, per (IPVer byte, PayLen, NxtHdr, GIDs)
_GRH_CRC: dict[bytes, int] = {}


# ----------------------------------------------------------- UDP sockets (no IP header)
# The masked pseudo-header up to the BTH, packed in one go: 8 x 0xFF, IPv4 or IPv6 header
# with TOS/TTL/checksum or TClass/FlowLabel/HopLimit as ones, UDP header with checksum ones.
_PSEUDO_V4 = struct.Struct("!8sBBHHHBBH4s4sHHHH")
_PSEUDO_V6 = struct.Struct("!8sIHBB16s16sHHHH")
_FF8 = b"\xff" * 8
_DF = 0x4000


def _socket_addrs(src_ip: bytes, dst_ip: bytes) -> tuple[bytes, bytes]:
    if len(src_ip) == 4 and len(dst_ip) == 4:  # the per-packet case: already IPv4
        return src_ip, dst_ip
    s = unmap_ipv4(src_ip)
    d = unmap_ipv4(dst_ip)
    if len(s) != len(d):
        raise InvalidArgument("dst_ip", "source and destination address families differ")
    if len(s) not in (4, 16):
        raise InvalidArgument("src_ip", f"must be 4 or 16 bytes, got {len(src_ip)}")
    return s, d


def _pseudo(s: bytes, d: bytes, sport: int, dport: int, udp_len: int, ident: int = 0,
            flags: int = _DF) -> bytes:
    """Masked pseudo-header for what Linux sends from a UDP socket (IBA 7.8.1, Annex A17)."""
    if len(s) == 4:
        return _PSEUDO_V4.pack(_FF8, 0x45, 0xFF, 20 + udp_len, ident, flags, 0xFF, IPPROTO_UDP,
                               0xFFFF, s, d, sport, dport, udp_len, 0xFFFF)
    return _PSEUDO_V6.pack(_FF8, 0x6FFFFFFF, udp_len, IPPROTO_UDP, 0xFF, s, d, sport, dport,
                           udp_len, 0xFFFF)


# CRC of the masked pseudo-header with IPv4 ID 0 + DF, per flow and length: it is the
# same for every packet of a flow, so the per-packet work is the IB part only.
_PSEUDO_CRC: dict[tuple[bytes, bytes, int, int, int], int] = {}
# The same with IPv4 Identification ``ident`` != 0 (the segments of a UDP GSO send).
_PSEUDO_CRC_ID: dict[tuple[bytes, bytes, int, int, int, int], int] = {}


def _pseudo_crc(s: bytes, d: bytes, sport: int, dport: int, udp_len: int) -> int:
    """``crc32(_pseudo(s, d, sport, dport, udp_len))``, cached (bounded)."""
    key = (s, d, sport, dport, udp_len)
    c = _PSEUDO_CRC.get(key)
    if c is None:
        c = crc32(_pseudo(s, d, sport, dport, udp_len))
        if len(_PSEUDO_CRC) >= 8192:
            _PSEUDO_CRC.clear()
        _PSEUDO_CRC[key] = c
    return c


def _pseudo_crc_id(s: bytes, d: bytes, sport: int, dport: int, udp_len: int,
                   ident: int) -> int:
    """``crc32(_pseudo(..., ident))`` with DF, cached per (flow, length, ID); IPv6 (no
    Identification) and ID 0 share :func:`_pseudo_crc`'s cache."""
    if ident == 0 or len(s) != 4:
        return _pseudo_crc(s, d, sport, dport, udp_len)
    key = (s, d, sport, dport, udp_len, ident)
    c = _PSEUDO_CRC_ID.get(key)
    if c is None:
        c = crc32(_pseudo(s, d, sport, dport, udp_len, ident & 0xFFFF))
        if len(_PSEUDO_CRC_ID) >= 16384:
            _PSEUDO_CRC_ID.clear()
        _PSEUDO_CRC_ID[key] = c
    return c


#: IPv4 Identifications :func:`_pseudo_crc_ids` tabulates per flow: the segments of one
#: UDP GSO send carry IDs 0, 1, ... (at most 64 segments per send, ``UDP_MAX_SEGMENTS``).
GSO_IDS = 64
# Per flow and length, :func:`_pseudo_crc_id` for IDs 0, 1, ... in one list (grown on
# demand up to GSO_IDS entries: a run computes no more IDs than it has segments).
_PSEUDO_CRC_IDS: dict[tuple[bytes, bytes, int, int, int], list[int]] = {}


def _pseudo_crc_ids(s: bytes, d: bytes, sport: int, dport: int, udp_len: int,
                    count: int) -> list[int]:
    """``_pseudo_crc_id(s, d, sport, dport, udp_len, i)`` for ``i`` in ``range(n)``,
    ``n >= min(count, GSO_IDS)``, cached per (flow, length) (bounded): the pseudo-header
    CRC of every segment of a GSO send or coalesced receive for one lookup (IPv6: the
    one CRC, no Identification)."""
    key = (s, d, sport, dport, udp_len)
    t = _PSEUDO_CRC_IDS.get(key)
    if t is None:
        t = [_pseudo_crc(s, d, sport, dport, udp_len)]
        if len(_PSEUDO_CRC_IDS) >= 1024:
            _PSEUDO_CRC_IDS.clear()
        _PSEUDO_CRC_IDS[key] = t
    if len(t) < count:
        v4 = len(s) == 4
        for i in range(len(t), min(count, GSO_IDS)):
            t.append(crc32(_pseudo(s, d, sport, dport, udp_len, i)) if v4 else t[0])
    return t


# BTH byte 4 (FECN, BECN, Resv6) enters the ICRC as ones. CRC-32 is affine over GF(2):
# for two inputs of one length, crc(a, s) ^ crc(b, s) depends only on a ^ b, and not on
# the state ``s`` or on what precedes the difference. So the CRC over a packet with its
# byte 4 as sent, XORed with the difference that byte's masking makes
# (:func:`_mask_delta`), is the CRC over the masked packet: one call over the packet,
# where the masked byte would otherwise split it into three.
_MASK_DELTA: dict[tuple[int, int], int] = {}


def _mask_delta(b4: int, after: int) -> int:
    """The CRC-32 difference between a byte of value ``b4`` and 0xFF (its ICRC mask)
    when ``after`` more bytes follow it to the end of the CRC (cached, bounded)."""
    key = (b4, after)
    d = _MASK_DELTA.get(key)
    if d is None:
        tail = bytes(after)
        d = crc32(bytes((b4,)) + tail) ^ crc32(_FF + tail)
        if len(_MASK_DELTA) >= 4096:
            _MASK_DELTA.clear()
        _MASK_DELTA[key] = d
    return d


def _crc_body(state: int, body: memoryview) -> int:
    """Continue the pseudo-header CRC ``state`` over ``body`` (BTH .. pad, no ICRC), BTH
    byte 4 masked."""
    return crc32_raw(body, state) ^ _mask_delta(body[4], len(body) - 5)


def _crc_datagram(state: int, dg: memoryview) -> int:
    """Continue the pseudo-header CRC ``state`` over BTH (byte 4 masked) and the rest of
    ``dg`` minus its ICRC."""
    return _crc_body(state, dg[:len(dg) - ICRC_SIZE])


def udp_send_icrc(src_ip: bytes, dst_ip: bytes, sport: int, dport: int,
                  parts: Sequence[Buffer], length: int | None = None, ident: int = 0) -> bytes:
    """The 4-byte ICRC to append to ``parts`` (BTH .. pad) sent from a UDP socket.

    Assumes what Linux sends from an unconnected socket with ``IP_PMTUDISC_DO``: IPv4 ID 0
    with DF; TOS/TTL/flow label do not matter (masked). IPv4-mapped addresses are IPv4.
    ``length`` (bytes of BTH .. pad) saves summing the parts when the caller knows it.
    ``ident``: the IPv4 Identification the packet will carry instead of 0 (segment
    ``i`` of a UDP GSO send from such a socket carries ``i``: Linux ``inet_gso_segment``
    numbers the segments from the super-packet's ID); ignored for IPv6.
    """
    if ((ident == 0 or len(src_ip) == 16) and length is not None and type(src_ip) is bytes
            and type(dst_ip) is bytes):
        # The per-packet case: a flow whose pseudo-header CRC is cached (its key holds the
        # addresses as given: an IPv4-mapped pair is never one, so it takes the long way;
        # IPv6 has no Identification, so a GSO segment of an IPv6 flow takes it too).
        state = _PSEUDO_CRC.get((src_ip, dst_ip, sport, dport, 12 + length))
        if state is not None:
            return _ICRC.pack(_crc_ib(state, parts))
    s, d = _socket_addrs(src_ip, dst_ip)
    n = sum(memoryview(p).nbytes for p in parts) if length is None else length
    udp_len = 8 + n + ICRC_SIZE
    state = (_pseudo_crc(s, d, sport, dport, udp_len) if ident == 0
             else _pseudo_crc_id(s, d, sport, dport, udp_len, ident))
    return _ICRC.pack(_crc_ib(state, parts))


def udp_gso_iov(src_ip: bytes, dst_ip: bytes, sport: int, dport: int,
                packets: Sequence[Sequence[Buffer]], length: int) -> list[Buffer]:
    """The buffers of one UDP GSO send: each of ``packets`` (BTH .. pad in buffers,
    ``length`` bytes each) then its ICRC, for segment ``i`` with IPv4 Identification
    ``i`` (IPv6: none): each ICRC is ``udp_send_icrc(..., parts=packets[i],
    length=length, ident=i)``, for one pseudo-header lookup per send instead of one per
    segment, and one CRC call per buffer (:func:`_mask_delta`)."""
    s, d = _socket_addrs(src_ip, dst_ip)
    udp_len = 8 + length + ICRC_SIZE
    states = _pseudo_crc_ids(s, d, sport, dport, udp_len, len(packets))
    pack = _ICRC.pack
    iov: list[Buffer] = []
    append = iov.append
    b4 = -1  # BTH byte 4 that ``delta`` is for (_mask_delta)
    delta = 0
    for i, parts in enumerate(packets):
        state = states[i] if i < GSO_IDS else _pseudo_crc_id(s, d, sport, dport, udp_len, i)
        first = parts[0] if parts else b""
        if type(first) is bytes and len(first) >= BTH_SIZE:  # the engine's header buffer
            for p in parts:
                state = crc32_raw(p, state)
                append(p)
            if first[4] != b4:
                b4 = first[4]
                delta = _mask_delta(b4, length - 5)
            append(pack(state ^ delta))
        else:
            iov += parts
            append(pack(_crc_ib(state, parts)))
    return iov


def icrc_ok_udp_run(src_ip: bytes, dst_ip: bytes, sport: int, dport: int,
                    datagrams: Sequence[memoryview], first_ident: int) -> int:
    """How many of ``datagrams`` (BTH .. ICRC, byte memoryviews), counted from the first,
    are right when the i-th left with IPv4 Identification ``first_ident + i`` and DF:
    the segments of one coalesced (UDP GRO) receive from a GSO sender (see
    :func:`icrc_ok_udp_id`). Stops at the first that is not (IPv6: the exact check, no
    ID). :func:`udp_run_bodies` gives their bodies."""
    return len(udp_run_bodies(src_ip, dst_ip, sport, dport, datagrams, first_ident))


def udp_run_bodies(src_ip: bytes, dst_ip: bytes, sport: int, dport: int,
                   datagrams: Sequence[memoryview], first_ident: int) -> list[memoryview]:
    """The bodies (BTH .. pad: the ICRC cut off) of the leading ``datagrams`` that
    :func:`icrc_ok_udp_run` counts right, the i-th checked with IPv4 Identification
    ``first_ident + i`` (one pseudo-header table per length, :func:`_pseudo_crc_ids`)."""
    s, d = _socket_addrs(src_ip, dst_ip)
    unpack = _ICRC.unpack_from
    out: list[memoryview] = []
    append = out.append
    size = -1  # the length ``states`` and ``delta`` are for
    states: list[int] = []
    b4 = -1  # the BTH byte 4 ``delta`` is for (_mask_delta: :func:`_crc_body`'s rule)
    delta = 0
    ident = first_ident
    for dg in datagrams:
        n = dg.nbytes - ICRC_SIZE
        if n < BTH_SIZE:
            break
        ident &= 0xFFFF
        if n != size:
            size = n
            b4 = -1
            states = (_pseudo_crc_ids(s, d, sport, dport, 8 + n + ICRC_SIZE,
                                      ident + len(datagrams)) if ident < GSO_IDS else [])
        # a softrdma GSO sender's segment: the table; another sender's: the cached CRC
        state = (states[ident] if ident < len(states)
                 else _pseudo_crc_id(s, d, sport, dport, 8 + n + ICRC_SIZE, ident))
        body = dg[:n]
        if body[4] != b4:
            b4 = body[4]
            delta = _mask_delta(b4, n - 5)
        if crc32_raw(body, state) ^ delta != unpack(dg, n)[0]:
            break
        append(body)
        ident += 1
    return out


def icrc_ok_udp_id(src_ip: bytes, dst_ip: bytes, sport: int, dport: int,
                   datagram: Buffer, ident: int) -> bool:
    """True if ``datagram`` (BTH .. ICRC) is right under IPv4 Identification ``ident``
    with DF (IPv6: the exact check). The cheap first try for a segment of a coalesced
    (UDP GRO) receive, whose ID the socket does not show (see :func:`icrc_ok_udp`)."""
    dg = memoryview(datagram).cast("B")
    n = len(dg)
    if n < BTH_SIZE + ICRC_SIZE:
        return False
    s, d = _socket_addrs(src_ip, dst_ip)
    state = _pseudo_crc_id(s, d, sport, dport, 8 + n, ident)
    return bool(_crc_datagram(state, dg) == _ICRC.unpack_from(dg, n - ICRC_SIZE)[0])


def udp_payload_with_icrc(src_ip: bytes, dst_ip: bytes, sport: int, dport: int,
                          parts: Sequence[Buffer]) -> bytes:
    """The UDP payload to send: ``parts`` (BTH .. pad) joined, plus :func:`udp_send_icrc`."""
    return b"".join(bytes(p) for p in parts) + udp_send_icrc(src_ip, dst_ip, sport, dport, parts)


# The IPv4 field the ICRC covers but a UDP socket cannot see: Identification (16 bits),
# at offset 8 (masked LRH) + 4 of the pseudo-packet; DF is bit 0x40 of offset 8 + 6.
_ID_OFFSET = 8 + 4
_FLAGS_OFFSET = 8 + 6


@lru_cache(maxsize=128)
def _id_solver(pseudo_len: int) -> tuple[tuple[tuple[int, int, int], ...], int]:
    """Elimination table for the 16 bits of the IPv4 Identification, and the DF vector.

    The ICRC is affine over GF(2) in its input bits, so flipping input bit ``j`` changes
    the CRC by a vector ``v_j`` that only depends on how many bytes follow it, i.e. on
    the pseudo-packet length. Returns rows ``(pivot_bit, vector, combination)`` in
    reduced echelon form (``vector`` is the CRC change caused by flipping the ID bits in
    ``combination``; no other row has ``pivot_bit`` set), and the change caused by DF.
    """
    base = crc32(bytes(pseudo_len))
    buf = bytearray(pseudo_len)
    buf[_FLAGS_OFFSET] = _DF >> 8
    df_vec = crc32(buf) ^ base
    buf[_FLAGS_OFFSET] = 0
    rows: list[tuple[int, int, int]] = []
    for bit in range(16):
        pos = _ID_OFFSET + (1 - bit // 8)
        buf[pos] = 1 << (bit % 8)
        vec = crc32(buf) ^ base
        buf[pos] = 0
        comb = 1 << bit
        for pivot, rv, rc in rows:
            if vec >> pivot & 1:
                vec ^= rv
                comb ^= rc
        if vec == 0:  # cannot happen: CRC-32 detects every burst of <= 32 bits
            continue
        pivot = vec.bit_length() - 1
        rows = [(p, rv ^ vec, rc ^ comb) if rv >> pivot & 1 else (p, rv, rc)
                for p, rv, rc in rows]
        rows.append((pivot, vec, comb))
    return tuple(rows), df_vec


def _udp_check(src_ip: bytes, dst_ip: bytes, sport: int, dport: int,
               datagram: Buffer) -> tuple[bool, int | None, bool]:
    """(ok, recovered IPv4 ID or None, DF) for :func:`icrc_ok_udp`."""
    dg = memoryview(datagram).cast("B")
    n = len(dg)
    if n < BTH_SIZE + ICRC_SIZE:
        return False, None, True
    s, d = _socket_addrs(src_ip, dst_ip)
    got = _ICRC.unpack_from(dg, n - ICRC_SIZE)[0]
    udp_len = 8 + n
    want = _crc_datagram(_pseudo_crc(s, d, sport, dport, udp_len), dg)
    if want == got:
        return True, (0 if len(s) == 4 else None), True
    if len(s) != 4:
        return False, None, True
    rows, df_vec = _id_solver(8 + 20 + udp_len - ICRC_SIZE)
    diff = want ^ got
    if diff == df_vec:  # ID 0 without DF
        ok = _crc_datagram(crc32(_pseudo(s, d, sport, dport, udp_len, 0, 0)), dg) == got
        return ok, (0 if ok else None), False
    ident = 0
    for pivot, vec, comb in rows:
        if diff >> pivot & 1:
            diff ^= vec
            ident ^= comb
    if diff:
        return False, None, True
    # Recompute with the recovered ID: accept only on an exact match.
    ok = _crc_datagram(crc32(_pseudo(s, d, sport, dport, udp_len, ident)), dg) == got
    return ok, (ident if ok else None), True


def icrc_ok_udp(src_ip: bytes, dst_ip: bytes, sport: int, dport: int,
                datagram: Buffer) -> bool:
    """Check the ICRC of a datagram received on a UDP socket (``datagram`` = BTH .. ICRC).

    IPv6: exact. IPv4: the socket does not show the Identification field, which the ICRC
    covers. Tries ID 0 with DF (what a Linux unconnected socket with ``IP_PMTUDISC_DO``
    sends) and ID 0 without DF; otherwise solves, by CRC linearity over GF(2), for the
    16-bit ID that explains the difference (a cached elimination table per length: a few
    XORs), and accepts iff one exists and the ICRC recomputed with it matches exactly.

    Weakened detection: a corruption confined to the ID field is invisible (the ID is
    unknown anyway), and any other corruption is missed when its CRC change equals that
    of some ID value: probability about 2^-16 instead of 2^-32 for a random corruption;
    for single-bit errors, a fixed ~1/65536 of the bit positions of a given packet length
    (never within 32 bits of the ID field, as CRC-32 catches every burst of <= 32 bits).
    IPv4-mapped IPv6 addresses count as IPv4.
    """
    # The per-packet case first: an IPv4 flow whose pseudo-header CRC is cached, a byte
    # memoryview, ID 0 with DF. Anything else (or a mismatch) takes the full check.
    if (type(datagram) is memoryview and type(src_ip) is bytes and type(dst_ip) is bytes
            and len(src_ip) == 4 and len(dst_ip) == 4):
        n = datagram.nbytes
        if n >= BTH_SIZE + ICRC_SIZE and datagram.itemsize == 1:
            state = _PSEUDO_CRC.get((src_ip, dst_ip, sport, dport, 8 + n))
            if (state is not None and _crc_datagram(state, datagram)
                    == _ICRC.unpack_from(datagram, n - ICRC_SIZE)[0]):
                return True
    return _udp_check(src_ip, dst_ip, sport, dport, datagram)[0]


def recover_ipv4_id(src_ip: bytes, dst_ip: bytes, sport: int, dport: int,
                    datagram: Buffer) -> tuple[int, bool] | None:
    """The IPv4 (Identification, DF) under which the datagram's ICRC is correct, or None.

    DF is assumed set unless ID 0 without DF is what matches (see :func:`icrc_ok_udp`).
    None also for IPv6, which has no such field.
    """
    ok, ident, df = _udp_check(src_ip, dst_ip, sport, dport, datagram)
    return (ident, df) if ok and ident is not None else None


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
        return _U16.unpack_from(self.udp, 0)[0] if self.udp else 0

    @property
    def dport(self) -> int:
        return _U16.unpack_from(self.udp, 2)[0] if self.udp else 0

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
        etype = _U16.unpack_from(data, 0)[0]
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
    etype = _U16.unpack_from(data, off)[0]
    return _skip_vlans(data, off + 2, etype)


def _skip_vlans(data: memoryview, off: int, etype: int) -> tuple[int, int]:
    while etype in _VLAN_TYPES:
        if len(data) < off + 4:
            raise DecodeError("truncated 802.1Q tag")
        etype = _U16.unpack_from(data, off + 2)[0]
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
        dport = _U16.unpack_from(mv, off + ihl + 2)[0]
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
        if _U16.unpack_from(mv, off + 42)[0] not in ports:
            return None
        if plen < 8:
            raise DecodeError(f"IPv6 payload length {plen} too small for a UDP header")
        _v6_payload(mv, off, n, plen, "IPv6")
        ip = bytes(mv[off:off + 40])
        udp_off = off + 40
        end = udp_off + plen
    elif etype == ROCE_V1_ETHERTYPE:
        plen, nxt = _v6_header(mv, off, n, "GRH")
        if nxt != GRH_NEXT_HEADER_BTH:
            raise DecodeError(f"GRH next header {nxt:#04x}, expected 0x1b (BTH)")
        body = _v6_payload(mv, off, n, plen, "GRH")
        return _ib_split(linktype, mv, off, bytes(mv[off:off + 40]), b"", body,
                         mv[off + 40 + plen:], 1)
    else:
        return None
    udp = bytes(mv[udp_off:udp_off + 8])
    ulen = _U16.unpack_from(udp, 4)[0]
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
