"""The RoCE Invariant CRC over a network header and a transport packet (IBA 7.8.1, Annex A17).

ICRC (IBA 7.8.1, Annex A17 §2): ``zlib``-style CRC-32 over ``8 x 0xFF`` (the masked LRH), the
network header with its variant fields set to ones (IPv4: TOS, TTL, header checksum; IPv6 and
GRH: traffic class, flow label, hop limit), the UDP header with its checksum set to ones,
the BTH with byte 4 (FECN, BECN, Resv6) set to ones, and everything after the BTH up to
the ICRC; stored on the wire least-significant byte first. :func:`icrc` is RoCEv2 over IPv4
or IPv6, :func:`icrc_v1` RoCEv1 (Annex A16), both computed incrementally over a list of
buffers (no payload concatenation). The same CRC from a UDP socket, which does not see the
IP header, is :mod:`softrdma.wire.icrc_udp`.

IPv4 options (never sent by rxe or Linux UDP sockets) are covered as sent, with the
masks at their usual offsets; unverified: rxe_icrc.c copies only a 20-byte base header and
takes the next 8 bytes as the UDP header, i.e. it assumes there are no options.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

from ..errors import DecodeError
from .crc import Buffer, crc32, crc32_raw
from .opcodes import BTH_SIZE

__all__ = ["icrc", "icrc_v1"]

# the 4 ICRC bytes, least-significant first (package-private: icrc_udp packs them too)
_ICRC = struct.Struct("<I")

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
