"""Receive coalescing of TCP segments on their way to the host (the rules of Linux GRO,
net/ipv4/tcp_offload.c ``tcp_gro_receive``), sans-I/O.

In datagram mode every TCP segment arrives on its own (the UD MTU, 4092 on a 4096 IB
MTU): written to the TUN device one by one, each costs the host stack a whole receive
(and every second one an ACK, which crosses IPoIB back). Consecutive in-order segments
of one flow, of one size (the last may be shorter), with the same IP and TCP header
but for the sequence number, PSH and the checksums, are handed over as one packet
instead, with a ``virtio_net_hdr`` of GSO type TCPV4/TCPV6 and ``gso_size`` the segment
size, as a NIC's LRO or the kernel's own GRO would.

Checksums stay end to end: the merged packet's TCP checksum (RFC 9293 §3.1) is derived
from the checksums the sender put on the segments (the Internet checksum is a sum,
RFC 1071 §2: a segment's payload sums to the complement of its header and pseudo-header
sums), never from the payload, so the kernel, which verifies the merged packet over all
its bytes, drops it if any segment was damaged. IPv4 fragments, IP options, IPv6
extension headers, segments without payload and flags other than ACK and PSH are never
merged; PSH ends a run.
"""

from __future__ import annotations

import functools
import struct

__all__ = ["TcpCoalescer", "Merged", "Buffer", "GSO_NONE", "GSO_TCPV4", "GSO_TCPV6", "MAX_MERGED"]

GSO_NONE = 0     # VIRTIO_NET_HDR_GSO_NONE (include/uapi/linux/virtio_net.h)
GSO_TCPV4 = 1    # VIRTIO_NET_HDR_GSO_TCPV4
GSO_TCPV6 = 4    # VIRTIO_NET_HDR_GSO_TCPV6
MAX_MERGED = 0xFFFF  # IPv4 Total Length / IPv6 Payload Length
TCP_ACK = 0x10
TCP_PSH = 0x08
PROTO_TCP = 6
_U32 = struct.Struct(">I")
_U16 = struct.Struct(">H")
# What push reads of an IPv4 (IHL 5) / IPv6 TCP segment in one call: version/IHL, total
# length, flags/fragment offset, protocol; version, payload length, next header; then the
# TCP sequence number, data offset and flags
_V4_TCP = struct.Struct(">BxH2xBBxB10x4xI4xBB")
_V6_TCP = struct.Struct(">B3xHB33x4xI4xBB")
_MASKS: dict[int, int] = {}  # _mask(iphl, hl) by hl + (iphl << 8)

Buffer = bytes | bytearray | memoryview


class Merged:
    """One coalesced packet: ``head`` (the IP and TCP headers), then ``payloads``;
    ``gso_type`` and ``gso_size`` for the ``virtio_net_hdr``."""

    __slots__ = ("head", "payloads", "gso_type", "gso_size")

    def __init__(self, head: bytes, payloads: list[Buffer], gso_type: int,
                 gso_size: int) -> None:
        self.head = head
        self.payloads = payloads
        self.gso_type = gso_type
        self.gso_size = gso_size


def _field_mask(hl: int, varying: tuple[tuple[int, int], ...]) -> int:
    """An ``hl``-byte big-endian mask, zero over the byte ranges ``varying``."""
    m = bytearray(b"\xff" * hl)
    for a, b in varying:
        m[a:b] = bytes(b - a)
    return int.from_bytes(m, "big")


@functools.cache
def _mask(iphl: int, hl: int) -> int:
    """The header bits a run's segments share (IPv4: ``iphl`` 20, else IPv6)."""
    ip = ((2, 6), (10, 12)) if iphl == 20 else ((4, 6),)
    tcp = ((iphl + 4, iphl + 8), (iphl + 13, iphl + 14), (iphl + 16, iphl + 18))
    return _field_mask(hl, ip + tcp)


class _Run:
    __slots__ = ("key", "pkts", "hl", "iphl", "v4", "next_seq", "mss", "size", "limit",
                 "closed")

    def __init__(self, key: int, pkt: Buffer, hl: int, iphl: int, v4: bool, seq: int,
                 plen: int, closed: bool) -> None:
        self.key = key
        self.pkts = [pkt]
        self.hl = hl
        self.iphl = iphl
        self.v4 = v4
        self.next_seq = (seq + plen) & 0xFFFFFFFF
        self.mss = plen
        self.size = hl + plen
        # the largest ``size`` the IP length field can carry: IPv4's Total Length counts
        # the IP header, IPv6's Payload Length does not (RFC 791 §3.1, RFC 8200 §3)
        self.limit = MAX_MERGED if v4 else MAX_MERGED + iphl
        self.closed = closed


class TcpCoalescer:
    """Feed the packets of one receive batch to :meth:`push`, then :meth:`flush`;
    :attr:`ready` holds, in order, what to write: each a packet as it came, or a
    :class:`Merged`. The buffers pushed are referenced, not copied, until the flush.
    ``merged_segments``/``merged_packets`` count what was coalesced."""

    def __init__(self) -> None:
        self.ready: list[Buffer | Merged] = []
        self._run: _Run | None = None
        self.merged_segments = 0
        self.merged_packets = 0

    def push(self, pkt: Buffer) -> None:
        """One whole IP packet for the host (its length is its IP length)."""
        n = len(pkt)
        if n < 40:
            self._plain(pkt)
            return
        b0 = pkt[0]
        if b0 == 0x45:
            _b0, total, f6, f7, proto, seq, doff, flags = _V4_TCP.unpack_from(pkt)
            if proto != PROTO_TCP or f6 & 0x3F or f7 or total != n:
                self._plain(pkt)  # not TCP, a fragment, or trailing bytes
                return
            iphl = 20
        elif b0 >> 4 == 6 and n >= 60:
            _b0, plen6, nh, seq, doff, flags = _V6_TCP.unpack_from(pkt)
            if nh != PROTO_TCP or plen6 + 40 != n:
                self._plain(pkt)
                return
            iphl = 40
        else:
            self._plain(pkt)
            return
        hl = iphl + (doff >> 4) * 4
        plen = n - hl
        if doff & 0x0F or doff < 0x50 or plen <= 0 or flags & ~TCP_PSH != TCP_ACK:
            self._plain(pkt)
            return
        # the flow and every header field that must match: all but the lengths, the IPv4
        # ID, the sequence number, the flags (ACK, maybe PSH) and the checksums
        mask = _MASKS.get(hl + (iphl << 8))
        if mask is None:
            mask = _MASKS[hl + (iphl << 8)] = _mask(iphl, hl)
        key = int.from_bytes(pkt[:hl], "big") & mask
        run = self._run
        if run is not None and not run.closed and run.key == key and seq == run.next_seq \
                and plen <= run.mss and run.size + plen <= run.limit:
            run.pkts.append(pkt)
            run.next_seq = (seq + plen) & 0xFFFFFFFF
            run.size += plen
            if plen < run.mss or flags & TCP_PSH:
                run.closed = True
            return
        if run is not None:
            self._emit(run)
        # an odd segment size would put the next payload at an odd offset: no run then
        self._run = _Run(key, pkt, hl, iphl, iphl == 20, seq, plen,
                         bool(flags & TCP_PSH) or plen & 1 == 1)

    def flush(self) -> None:
        """End the batch: the open run goes to :attr:`ready`."""
        if self._run is not None:
            self._emit(self._run)
            self._run = None

    def take(self) -> list[Buffer | Merged]:
        """What is ready to write, oldest first (after :meth:`flush`: everything)."""
        out, self.ready = self.ready, []
        return out

    def _plain(self, pkt: Buffer) -> None:
        if self._run is not None:
            self._emit(self._run)
            self._run = None
        self.ready.append(pkt)

    def _emit(self, run: _Run) -> None:
        pkts = run.pkts
        k = len(pkts)
        if k == 1:
            self.ready.append(pkts[0])
            return
        hl, iphl = run.hl, run.iphl
        first = pkts[0]
        head = bytearray(first[:hl])
        tcp_len = run.size - iphl
        # RFC 1071: sums of 16-bit words, modulo 0xFFFF (2**16 == 1 mod 0xFFFF)
        claimed = 0  # the segments' pseudo-header + TCP header sums (checksum included)
        for p in pkts:
            claimed += int.from_bytes(p[iphl:hl], "big") + len(p) - iphl
        if run.v4:
            struct.pack_into(">H", head, 2, run.size)
            head[10:12] = b"\0\0"
            struct.pack_into(">H", head, 10, 0xFFFF - int.from_bytes(head[:20], "big") % 0xFFFF)
            addrs = int.from_bytes(head[12:20], "big")
        else:
            struct.pack_into(">H", head, 4, tcp_len)
            addrs = int.from_bytes(head[8:40], "big")
        head[iphl + 13] |= pkts[-1][iphl + 13] & TCP_PSH
        head[iphl + 16:iphl + 18] = b"\0\0"
        pseudo = addrs + PROTO_TCP
        # payload sums = -(claimed); the merged packet's sum, then its complement
        total = pseudo + tcp_len + int.from_bytes(head[iphl:hl], "big") - claimed - k * pseudo
        struct.pack_into(">H", head, iphl + 16, 0xFFFF - total % 0xFFFF)
        self.merged_packets += 1
        self.merged_segments += k
        self.ready.append(Merged(bytes(head), [p[hl:] for p in pkts],
                                 GSO_TCPV4 if run.v4 else GSO_TCPV6, run.mss))
