"""UDP GSO batches in a capture: one frame that the kernel will cut into n RoCEv2 packets.

A capture taken where the kernel has not yet segmented a UDP GSO send (``UDP_SEGMENT``)
shows the whole batch as one UDP datagram: on ``lo`` always (the segments are cut only
at the receiving socket), on a veth or NIC with segmentation offload too. softrdma sends
runs of equal-sized packets to one QP that way (``docs/design.md``, "RoCEv2 batching").
Each segment is a whole RoCEv2 packet with its own ICRC, computed over the IPv4 header
the kernel gives that segment: Identification ``base + i`` for segment ``i`` (Linux
``inet_gso_segment``; the base is the batch's own Identification), total and UDP lengths
of the segment (IBA 7.8.1, Annex A17).

:func:`split_gso` finds the segment size (every segment but the last has it, the last is
no longer) by looking for the next BTH to the same DestQP and checking the first
segment's ICRC, then checks every segment and returns the frames the kernel would put on
the wire, which ``pcap-check`` then checks one by one like any other packet.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ...wire import roce
from ...wire.opcodes import BTH_SIZE, ICRC_SIZE

__all__ = ["GsoBatch", "split_gso"]

_BTH_DQPN = 5  # offset of the 24-bit DestQP in the BTH (IBA 9.2)
_MIN_SEG = BTH_SIZE + ICRC_SIZE
_MAX_SEGS = 64  # UDP_MAX_SEGMENTS (Linux include/linux/udp.h)
_IPV4_ID = 4
_IPV4_LEN = 2
_IPV4_CSUM = 10
_IPV6_PLEN = 4
_U16 = struct.Struct("!H")


@dataclass(eq=False, slots=True)
class GsoBatch:
    """A frame split into the frames of its segments (``frames``), ``size`` bytes of UDP
    payload each but the last; ``base_id`` is the first segment's IPv4 Identification
    (None for IPv6)."""

    frames: list[bytes]
    size: int
    base_id: int | None

    def __len__(self) -> int:
        return len(self.frames)


def _segment_headers(f: roce.RoceFrame, seg_len: int, index: int) -> tuple[bytes, bytes]:
    """(IP header, UDP header) of segment ``index`` of ``seg_len`` bytes of UDP payload."""
    ip = bytearray(f.ip)
    udp = bytearray(f.udp)
    _U16.pack_into(udp, 4, 8 + seg_len)
    _U16.pack_into(udp, 6, 0)
    if f.ip_version == 4:
        ihl = (ip[0] & 0x0F) * 4
        _U16.pack_into(ip, _IPV4_LEN, ihl + 8 + seg_len)
        base = _U16.unpack_from(f.ip, _IPV4_ID)[0]
        _U16.pack_into(ip, _IPV4_ID, (base + index) & 0xFFFF)
        _U16.pack_into(ip, _IPV4_CSUM, 0)
        _U16.pack_into(ip, _IPV4_CSUM, roce.inet_checksum(bytes(ip[:ihl])))
    else:
        _U16.pack_into(ip, _IPV6_PLEN, 8 + seg_len)
    return bytes(ip), bytes(udp)


def _segment_ok(f: roce.RoceFrame, payload: memoryview, seg_len: int, index: int) -> bool:
    ip, udp = _segment_headers(f, seg_len, index)
    body = payload[:seg_len - ICRC_SIZE]
    return roce.icrc(ip, udp, (body,)) == bytes(payload[seg_len - ICRC_SIZE:seg_len])


def _sizes(payload: memoryview) -> list[int]:
    """Candidate segment sizes: the offsets (multiples of 4) where a BTH to the first
    packet's DestQP could start."""
    data = bytes(payload)
    dqpn = data[_BTH_DQPN:_BTH_DQPN + 3]
    out = []
    at = data.find(dqpn, _MIN_SEG + _BTH_DQPN)
    while at >= 0:
        start = at - _BTH_DQPN
        if start % 4 == 0 and len(data) - start >= _MIN_SEG:
            out.append(start)
        at = data.find(dqpn, at + 1)
    return out


def split_gso(f: roce.RoceFrame) -> GsoBatch | None:
    """The segments of ``f`` if it is a UDP GSO batch of RoCEv2 packets whose every ICRC
    is right for the header the kernel gives it; None otherwise."""
    if f.version != 2 or not f.udp:
        return None
    payload = memoryview(b"".join((bytes(f.ib), f.icrc)))
    total = len(payload)
    for size in _sizes(payload):
        n = -(-total // size)
        if n > _MAX_SEGS or not _segment_ok(f, payload, size, 0):
            continue
        lens = [size] * (n - 1) + [total - size * (n - 1)]
        if lens[-1] < _MIN_SEG:
            continue
        frames: list[bytes] = []
        off = 0
        for i, seg_len in enumerate(lens):
            seg = payload[off:off + seg_len]
            if i and not _segment_ok(f, seg, seg_len, i):
                break
            ip, udp = _segment_headers(f, seg_len, i)
            frames.append(b"".join((f.l2, ip, udp, seg, f.trailer)))
            off += seg_len
        else:
            base = _U16.unpack_from(f.ip, _IPV4_ID)[0] if f.ip_version == 4 else None
            return GsoBatch(frames, size, base)
    return None
