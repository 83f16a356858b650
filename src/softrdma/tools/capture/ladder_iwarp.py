"""The iWARP rows of ``softrdma ladder``: MPA Request/Reply, DDP segments (a run of
non-last segments of one message is one arrow, RFC 5041 §5), Terminates (RFC 5040 §7.2)
TCP retransmissions (a segment whose octets the stream already delivered) and capture
gaps, per TCP connection.

Each direction's stream is rebuilt by :class:`softrdma.wire.tcpstream.TcpReassembler`;
a stream that starts with an MPA key is read with :class:`softrdma.wire.mpa.MpaFrameParser`
(RFC 5044 §7.1), then, once both frames are known, its FPDUs with
:class:`~softrdma.wire.mpa.FpduDeframer` (CRC if either frame asked for it, markers
towards a side whose frame has M) and :func:`softrdma.wire.ddp.decode_segment`. Octets
missing from the capture end that direction with a gap row (``softrdma pcap-check``
resynchronises; a picture need not).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...errors import DecodeError
from ...wire import ddp
from ...wire.mpa import (
    KEY_LEN,
    KEY_REP,
    KEY_REQ,
    FpduDeframer,
    MpaError,
    MpaFrame,
    MpaFrameParser,
    MpaReply,
    MpaRequest,
)
from ...wire.tcpstream import (
    TCP_SYN,
    StreamData,
    StreamEvent,
    StreamGap,
    TcpReassembler,
    TcpSegment,
    TcpStream,
)
from .ladder_model import End, Row, RowSink

__all__ = ["IwarpLadder"]


@dataclass(eq=False)
class _IwDir:
    stream: TcpStream
    phase: str = "detect"
    parser: MpaFrameParser | None = None
    frame: MpaFrame | None = None
    deframer: FpduDeframer | None = None
    held: list[StreamEvent] = field(default_factory=list)
    run_label: str = ""


class IwarpLadder:
    """Turns TCP segments into iWARP rows on ``sink``; lanes are (IP address, TCP port)."""

    def __init__(self, sink: RowSink) -> None:
        self.sink = sink
        self._tcp = TcpReassembler()
        self._iw: dict[int, _IwDir] = {}

    def feed(self, t: float, seg: TcpSegment) -> None:
        """One TCP segment, captured ``t`` seconds after the first frame."""
        st = self._tcp.streams.get((seg.src, seg.sport, seg.dst, seg.dport))
        if st is not None and st.base is not None and seg.payload and not seg.flags & TCP_SYN:
            off = st.offset_of(seg.seq)
            d = self._iw.get(st.id)
            if off + len(seg.payload) <= st.next_offset and d is not None and d.phase in (
                    "frame", "wait", "fpdu"):  # octets already delivered: sent again
                self.sink.add(Row(seg.frame, t, ("", ""), ("", ""),
                                  f"TCP retransmission: {len(seg.payload)} octets at stream "
                                  f"offset {off}", "retrans"), *self._iw_ends(st))
        self._events(t, self._tcp.feed(seg))

    def flush(self, t: float) -> None:
        """The end of the capture: what the reassembler still holds."""
        self._events(t, self._tcp.flush())

    def _events(self, t: float, events: list[StreamEvent]) -> None:
        for ev in events:
            d = self._iw.get(ev.stream.id)
            if d is None:
                d = self._iw[ev.stream.id] = _IwDir(ev.stream)
            self._iw_event(t, d, ev)

    def _iw_ends(self, st: TcpStream) -> tuple[End, End]:
        return (("lane", st.src[0], f"port {st.src[1]}"), ("lane", st.dst[0], f"port {st.dst[1]}"))

    def _iw_event(self, t: float, d: _IwDir, ev: StreamEvent) -> None:
        if d.phase == "ignore":
            return
        if isinstance(ev, StreamGap):
            if d.phase != "detect":
                self.sink.add(Row(ev.frame, t, ("", ""), ("", ""),
                              f"capture gap: {ev.length} octets missing at stream offset "
                              f"{ev.offset}; the rest of this direction is not decoded",
                              "gap"), *self._iw_ends(d.stream))
            d.phase = "ignore"
            return
        if d.phase == "detect":
            head = ev.data[:KEY_LEN]
            if ev.offset != 0 or not (KEY_REQ.startswith(head) or KEY_REP.startswith(head)):
                d.phase = "ignore"
                return
            d.phase = "frame"
            d.parser = MpaFrameParser(None, revisions=(0, 1, 2))
        if d.phase == "frame":
            assert d.parser is not None
            try:
                frame = d.parser.feed(ev.data)
            except MpaError as e:
                self.sink.notes.append(f"frame {ev.frame}: {d.stream}: MPA frame: {e}")
                d.phase = "ignore"
                return
            if frame is None:
                return
            d.frame = frame
            self.sink.add(Row(ev.frame, t, ("", ""), ("", ""), frame.describe(), "cm"),
                      *self._iw_ends(d.stream))
            d.phase = "wait"
            if d.parser.remainder:
                d.held.append(StreamData(ev.stream, ev.offset + len(ev.data)
                                         - len(d.parser.remainder), d.parser.remainder, ev.frame))
            peer = self._iw_peer(d)
            if peer is not None and peer.phase == "wait":
                self._iw_start(t, d, peer)
                self._iw_start(t, peer, d)
            return
        if d.phase == "wait":
            d.held.append(ev)
            return
        self._fpdus(t, d, ev)

    def _iw_peer(self, d: _IwDir) -> _IwDir | None:
        s = d.stream
        rev = self._tcp.streams.get((s.dst[0], s.dst[1], s.src[0], s.src[1]))
        return self._iw.get(rev.id) if rev is not None else None

    def _iw_start(self, t: float, d: _IwDir, peer: _IwDir) -> None:
        assert d.frame is not None and peer.frame is not None
        req, rep = (d.frame, peer.frame) if isinstance(d.frame, MpaRequest) else (peer.frame, d.frame)
        held, d.held = d.held, []
        if type(req) is type(rep) or not isinstance(rep, MpaReply) or rep.reject:
            d.phase = "ignore"
            return
        d.deframer = FpduDeframer(crc=req.crc or rep.crc, markers=peer.frame.markers)
        d.phase = "fpdu"
        for ev in held:
            self._iw_event(t, d, ev)

    def _fpdus(self, t: float, d: _IwDir, ev: StreamEvent) -> None:
        assert isinstance(ev, StreamData) and d.deframer is not None
        d.deframer.push(ev.data)
        while True:
            try:
                f = d.deframer.pop()
            except MpaError as e:
                self.sink.notes.append(f"frame {ev.frame}: {d.stream}: {e}; the rest of "
                                         f"this direction is not decoded")
                d.phase = "ignore"
                return
            if f is None:
                return
            try:
                seg = ddp.decode_segment(f.ulpdu)
            except DecodeError as e:
                self.sink.notes.append(f"frame {ev.frame}: {d.stream}: DDP/RDMAP: {e}")
                continue
            self._segment(ev.frame, t, d, seg)

    def _segment(self, frame: int, t: float, d: _IwDir, seg: ddp.Segment) -> None:
        h = seg.ddp
        op = ddp.opcode_name(h.opcode)
        if seg.terminate is not None:
            self.sink.add(Row(frame, t, ("", ""), ("", ""),
                          f"Terminate: {seg.terminate.describe()}", "term"),
                      *self._iw_ends(d.stream))
            return
        kind = "read" if h.opcode in (ddp.RdmapOpcode.RDMA_READ_REQUEST,
                                      ddp.RdmapOpcode.RDMA_READ_RESPONSE) else "data"
        last = self.sink.last()
        if (last is not None and last._run is not None and last._run[0] is d
                and last._run[1] == h.opcode):
            last.count += 1
            last.label = f"{d.run_label} x{last.count}" + ("" if h.last else " (more)")
            last._run = None if h.last else (d, h.opcode, 0, 0)
            return
        if isinstance(h, ddp.DdpUntagged):
            label = f"{op} MSN {h.msn}"
        else:
            label = f"{op} STag {h.stag:#x}"
        if seg.read_request is not None:
            label += f" size {seg.read_request.size}"
        elif len(seg.payload):
            label += f" len {len(seg.payload)}"
        d.run_label = label
        row = Row(frame, t, ("", ""), ("", ""), label + ("" if h.last else " (more)"), kind)
        if not h.last:
            row._run = (d, h.opcode, 0, 0)
        self.sink.add(row, *self._iw_ends(d.stream))
