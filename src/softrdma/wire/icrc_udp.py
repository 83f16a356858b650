"""The ICRC of RoCEv2 packets sent and received on a UDP socket (IBA 7.8.1, Annex A17).

A UDP socket hands over the UDP payload only (BTH .. ICRC): the IP and UDP headers the
ICRC covers (:mod:`softrdma.wire.icrc`) are rebuilt as a masked pseudo-header from the
addresses and ports, as Linux sends them from an unconnected socket with
``IP_PMTUDISC_DO`` (IPv4 ID 0 with DF). Its CRC is cached per flow and length, so the
per-packet work is the IB part only. Also here: the segments of a UDP GSO send
(:func:`udp_gso_iov`: IPv4 IDs 0, 1, ...), the runs of a coalesced (GRO) receive
(:func:`udp_run_bodies`), and the recovery of an IPv4 Identification the socket does not
show (:func:`icrc_ok_udp`, :func:`recover_ipv4_id`, by CRC linearity over GF(2)).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from functools import lru_cache

from ..errors import InvalidArgument
from .crc import Buffer, crc32, crc32_raw
from .gid import V4_MAPPED_PREFIX, unmap_ipv4
from .icrc import _FF, _ICRC, _crc_ib
from .ipudp import IPPROTO_UDP
from .opcodes import BTH_SIZE, ICRC_SIZE

__all__ = [
    "GSO_IDS", "udp_send_icrc", "udp_gso_iov", "udp_payload_with_icrc", "icrc_ok_udp",
    "icrc_ok_udp_id", "icrc_ok_udp_run", "udp_run_bodies", "recover_ipv4_id",
]

# The masked pseudo-header up to the BTH, packed in one go: 8 x 0xFF, IPv4 or IPv6 header
# with TOS/TTL/checksum or TClass/FlowLabel/HopLimit as ones, UDP header with checksum ones.
_PSEUDO_V4 = struct.Struct("!8sBBHHHBBH4s4sHHHH")
_PSEUDO_V6 = struct.Struct("!8sIHBB16s16sHHHH")
_FF8 = b"\xff" * 8
_DF = 0x4000


def _socket_addrs(src_ip: bytes, dst_ip: bytes) -> tuple[bytes, bytes]:
    if len(src_ip) == 4 and len(dst_ip) == 4:  # the per-packet case: already IPv4
        return src_ip, dst_ip
    if (type(src_ip) is bytes and type(dst_ip) is bytes and len(src_ip) == 16
            and len(dst_ip) == 16 and not src_ip.startswith(V4_MAPPED_PREFIX)
            and not dst_ip.startswith(V4_MAPPED_PREFIX)):  # IPv6 (IPoIB's GIDs), as given
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
    # The per-packet case first: a flow whose pseudo-header CRC is cached, a byte
    # memoryview; IPv4: ID 0 with DF. Anything else (or a mismatch) takes the full check.
    # The cache holds IPv4-mapped addresses under their 4 IPv4 bytes (_socket_addrs), so
    # a 16-byte key found there is a real IPv6 flow, whose check is exact (IPoIB's RC and
    # UD traffic: its GID is an IPv6 one).
    if (type(datagram) is memoryview and type(src_ip) is bytes and type(dst_ip) is bytes
            and len(src_ip) == len(dst_ip)):
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
