"""TCP stream reassembly from captured frames (for the iWARP capture checker).

:func:`parse_tcp` takes one captured frame (Ethernet with 802.1Q/802.1ad tags, Linux
SLL/SLL2, BSD null/loopback or raw IP; IPv4 per RFC 791 with options, IPv6 per RFC 8200
with its extension headers; TCP per RFC 9293 §3.1) to a :class:`TcpSegment`, or ``None``
when the frame is not an unfragmented TCP segment.

:class:`TcpReassembler` rebuilds each direction of each connection as a byte stream in
sequence order (:class:`TcpStream`): retransmissions and overlaps are dropped (the first
copy wins), out-of-order segments wait for the hole before them, and a hole that will
never be filled is reported once as a :class:`StreamGap`. A hole is declared permanent
when the peer acknowledges data beyond it while later data is waiting (the receiver had
it, so no retransmission will come), when too much data waits behind it, and at
:meth:`TcpReassembler.flush` (end of capture). Stream offset 0 is the octet after the
SYN when the SYN was captured, else the first octet seen. A SYN with a new ISN on a known
4-tuple starts a new :class:`TcpStream`.
"""

from __future__ import annotations

import ipaddress
import itertools
import struct
from dataclasses import dataclass

from ..errors import DecodeError
from .fields import U16
from .pcap import (
    LINKTYPE_ETHERNET,
    LINKTYPE_IPV4,
    LINKTYPE_IPV6,
    LINKTYPE_LINUX_SLL,
    LINKTYPE_LINUX_SLL2,
    LINKTYPE_NULL,
    LINKTYPE_RAW,
)
from .roce import ETH_P_IP, ETH_P_IPV6

__all__ = ["TcpSegment", "parse_tcp", "TcpStream", "StreamData", "StreamGap", "TcpReassembler"]

_VLAN = frozenset((0x8100, 0x88A8, 0x9100))
IPPROTO_TCP = 6
_IPV6_EXT = frozenset((0, 43, 60))  # hop-by-hop, routing, destination options
_IPV6_FRAG = 44
_IPV6_AH = 51

TCP_FIN = 0x01
TCP_SYN = 0x02
TCP_RST = 0x04
TCP_PSH = 0x08
TCP_ACK = 0x10

_TCP = struct.Struct("!HHIIBBHHH")
_MOD = 1 << 32
_HALF = 1 << 31


@dataclass(frozen=True, slots=True)
class TcpSegment:
    """One TCP segment: addresses as strings, ``payload`` as captured (possibly cut short
    by the snap length, in which case the missing tail shows up as a stream gap)."""

    frame: int
    src: str
    dst: str
    sport: int
    dport: int
    seq: int
    ack: int
    flags: int
    payload: bytes


def _l3(linktype: int, data: bytes) -> tuple[int, int] | None:
    """(ethertype, offset of the network header) for the supported link types."""
    if linktype == LINKTYPE_ETHERNET:
        off = 12
        if len(data) < off + 2:
            return None
        (et,) = U16.unpack_from(data, off)
        while et in _VLAN:
            off += 4
            if len(data) < off + 2:
                return None
            (et,) = U16.unpack_from(data, off)
        return et, off + 2
    if linktype == LINKTYPE_LINUX_SLL:
        return (U16.unpack_from(data, 14)[0], 16) if len(data) >= 16 else None
    if linktype == LINKTYPE_LINUX_SLL2:
        return (U16.unpack_from(data, 0)[0], 20) if len(data) >= 20 else None
    if linktype == LINKTYPE_NULL:
        if len(data) < 4:
            return None
        af = int.from_bytes(data[:4], "little")
        if af > 0xFFFF:
            af = int.from_bytes(data[:4], "big")
        return (ETH_P_IP if af == 2 else ETH_P_IPV6 if af in (10, 24, 28, 30) else 0), 4
    if linktype in (LINKTYPE_RAW, LINKTYPE_IPV4, LINKTYPE_IPV6):
        if not data:
            return None
        v = data[0] >> 4
        return (ETH_P_IP if v == 4 else ETH_P_IPV6 if v == 6 else 0), 0
    return None


def parse_tcp(linktype: int, data: bytes, frame: int = 0) -> TcpSegment | None:
    """The TCP segment in a captured frame, or ``None`` if it holds none (or a fragment).

    Raises :class:`DecodeError` for an IP or TCP header that is cut short or inconsistent.
    """
    l3 = _l3(linktype, data)
    if l3 is None:
        return None
    et, off = l3
    if et == ETH_P_IP:
        if len(data) < off + 20:
            raise DecodeError(f"frame {frame}: truncated IPv4 header")
        vihl = data[off]
        ihl = (vihl & 0x0F) * 4
        if vihl >> 4 != 4 or ihl < 20:
            raise DecodeError(f"frame {frame}: bad IPv4 version/IHL {vihl:#04x}")
        (total,) = U16.unpack_from(data, off + 2)
        (frag,) = U16.unpack_from(data, off + 6)
        if data[off + 9] != IPPROTO_TCP:
            return None
        if frag & 0x3FFF:  # MF or a fragment offset: not a whole segment
            return None
        if total < ihl:
            raise DecodeError(f"frame {frame}: IPv4 total length {total} < header {ihl}")
        end = min(len(data), off + total)
        src = str(ipaddress.IPv4Address(data[off + 12:off + 16]))
        dst = str(ipaddress.IPv4Address(data[off + 16:off + 20]))
        off += ihl
    elif et == ETH_P_IPV6:
        if len(data) < off + 40:
            raise DecodeError(f"frame {frame}: truncated IPv6 header")
        (plen,) = U16.unpack_from(data, off + 4)
        nh = data[off + 6]
        src = str(ipaddress.IPv6Address(data[off + 8:off + 24]))
        dst = str(ipaddress.IPv6Address(data[off + 24:off + 40]))
        end = min(len(data), off + 40 + plen)
        off += 40
        while nh != IPPROTO_TCP:
            if nh == _IPV6_FRAG or (nh not in _IPV6_EXT and nh != _IPV6_AH):
                return None
            if end < off + 2:
                raise DecodeError(f"frame {frame}: truncated IPv6 extension header")
            hl = (data[off + 1] + 2) * 4 if nh == _IPV6_AH else (data[off + 1] + 1) * 8
            nh = data[off]
            off += hl
    else:
        return None
    if end < off + 20:
        raise DecodeError(f"frame {frame}: truncated TCP header")
    sport, dport, seq, ack, doff, flags, _win, _csum, _urg = _TCP.unpack_from(data, off)
    hl = (doff >> 4) * 4
    if hl < 20 or off + hl > end:
        raise DecodeError(f"frame {frame}: bad TCP data offset {hl}")
    return TcpSegment(frame, src, dst, sport, dport, seq, ack, flags, bytes(data[off + hl:end]))


class TcpStream:
    """One direction of one TCP connection, as rebuilt so far."""

    _ids = itertools.count(1)

    def __init__(self, src: tuple[str, int], dst: tuple[str, int]) -> None:
        self.id = next(TcpStream._ids)
        self.src = src
        self.dst = dst
        self.syn_seen = False
        self.base: int | None = None  # sequence number of stream offset 0
        self.next_offset = 0  # next in-order offset to deliver
        self.peer_ack = 0  # highest offset acknowledged by the other side
        self.fin_offset: int | None = None
        self.high = 0  # highest end offset any segment of this direction claimed
        self.high_frame = 0
        self.peer_ack_frame = 0
        self.pending: dict[int, tuple[bytes, int]] = {}  # offset -> (data, frame)
        self.pending_bytes = 0
        self.gaps: list[tuple[int, int]] = []  # (offset, length) declared missing

    def __repr__(self) -> str:
        return f"{self.src[0]}:{self.src[1]} -> {self.dst[0]}:{self.dst[1]}"

    def offset_of(self, seq: int) -> int:
        """Stream offset of sequence number ``seq``, unwrapped near :attr:`next_offset`."""
        assert self.base is not None
        delta = ((seq - self.base - self.next_offset + _HALF) % _MOD) - _HALF
        return self.next_offset + delta


@dataclass(frozen=True, slots=True)
class StreamData:
    """In-order bytes of ``stream`` at ``offset``, from capture frame ``frame``."""

    stream: TcpStream
    offset: int
    data: bytes
    frame: int


@dataclass(frozen=True, slots=True)
class StreamGap:
    """Octets ``[offset, offset + length)`` of ``stream`` are missing from the capture;
    ``frame`` is the frame whose data follows the hole (or that revealed it)."""

    stream: TcpStream
    offset: int
    length: int
    frame: int


StreamEvent = StreamData | StreamGap


class TcpReassembler:
    """Per-direction TCP reassembly of a capture; see the module docstring."""

    def __init__(self, *, max_pending_segments: int = 256, max_pending_bytes: int = 1 << 22) -> None:
        self.max_pending_segments = max_pending_segments
        self.max_pending_bytes = max_pending_bytes
        self.streams: dict[tuple[str, int, str, int], TcpStream] = {}

    def feed(self, seg: TcpSegment) -> list[StreamEvent]:
        key = (seg.src, seg.sport, seg.dst, seg.dport)
        st = self.streams.get(key)
        syn = bool(seg.flags & TCP_SYN)
        if syn and (st is None or not st.syn_seen or st.base != (seg.seq + 1) % _MOD):
            st = TcpStream((seg.src, seg.sport), (seg.dst, seg.dport))
            st.syn_seen = True
            st.base = (seg.seq + 1) % _MOD
            self.streams[key] = st
        elif st is None:
            st = TcpStream((seg.src, seg.sport), (seg.dst, seg.dport))
            st.base = seg.seq
            self.streams[key] = st
        out: list[StreamEvent] = []
        off = st.offset_of((seg.seq + 1) % _MOD if syn else seg.seq)
        if off + len(seg.payload) > st.high:
            st.high = off + len(seg.payload)
            st.high_frame = seg.frame
        if seg.payload:
            self._add(st, off, seg.payload, seg.frame, out)
        if seg.flags & TCP_FIN and st.fin_offset is None:
            st.fin_offset = st.offset_of((seg.seq + len(seg.payload) + (1 if syn else 0)) % _MOD)
        if seg.flags & TCP_ACK:
            rev = self.streams.get((seg.dst, seg.dport, seg.src, seg.sport))
            if rev is not None and rev.base is not None:
                a = rev.offset_of(seg.ack)
                if a > rev.peer_ack:
                    rev.peer_ack = a
                    rev.peer_ack_frame = seg.frame
                    self._check_hole(rev, seg.frame, out)
        return out

    def flush(self) -> list[StreamEvent]:
        """End of capture: every hole with data behind it is a gap; deliver what waits.

        A missing tail is a gap too when a later segment's sequence number or the peer's
        ACK shows that the sender got further (a FIN's own octet excluded; when no FIN was
        captured a 1-octet shortfall is taken to be the FIN, and a longer one may count
        the FIN's octet as data)."""
        out: list[StreamEvent] = []
        for st in self.streams.values():
            while st.pending:
                first = min(st.pending)
                self._declare_gap(st, first, st.pending[first][1], out)
            end, frame = (st.high, st.high_frame) if st.high >= st.peer_ack else (st.peer_ack, st.peer_ack_frame)
            slack = 1  # the octet may be an uncaptured FIN's
            if st.fin_offset is not None:
                end = min(end, st.fin_offset)
                slack = 0
            if end - st.next_offset > slack:
                self._declare_gap(st, end, frame, out)
        return out

    def _add(self, st: TcpStream, off: int, data: bytes, frame: int, out: list[StreamEvent]) -> None:
        end = off + len(data)
        if end <= st.next_offset:
            return  # retransmission of delivered data
        if off <= st.next_offset:
            out.append(StreamData(st, st.next_offset, data[st.next_offset - off:], frame))
            st.next_offset = end
            self._drain(st, out)
            return
        old = st.pending.get(off)
        if old is None or len(old[0]) < len(data):
            st.pending_bytes += len(data) - (len(old[0]) if old else 0)
            st.pending[off] = (data, frame)
        self._check_hole(st, frame, out)

    def _drain(self, st: TcpStream, out: list[StreamEvent]) -> None:
        while st.pending:
            first = min(st.pending)
            if first > st.next_offset:
                return
            data, frame = st.pending.pop(first)
            st.pending_bytes -= len(data)
            end = first + len(data)
            if end > st.next_offset:
                out.append(StreamData(st, st.next_offset, data[st.next_offset - first:], frame))
                st.next_offset = end

    def _check_hole(self, st: TcpStream, frame: int, out: list[StreamEvent]) -> None:
        while st.pending:
            first = min(st.pending)
            if st.peer_ack > st.next_offset:
                # The receiver has the octets up to peer_ack: the hole below it is final.
                self._declare_gap(st, min(first, st.peer_ack), st.pending[first][1], out)
                continue
            if len(st.pending) > self.max_pending_segments or st.pending_bytes > self.max_pending_bytes:
                self._declare_gap(st, first, st.pending[first][1], out)
                continue
            return

    def _declare_gap(self, st: TcpStream, upto: int, frame: int, out: list[StreamEvent]) -> None:
        if upto > st.next_offset:
            n = upto - st.next_offset
            st.gaps.append((st.next_offset, n))
            out.append(StreamGap(st, st.next_offset, n, frame))
            st.next_offset = upto
        self._drain(st, out)
