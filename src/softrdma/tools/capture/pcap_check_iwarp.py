"""The iWARP part of ``softrdma pcap-check``: verify every MPA frame and FPDU of a capture.

:class:`IwarpChecker` is fed capture records one by one (``feed``) and reports
``results() -> (checked, ok, failure_lines)``; ``tools/capture/pcap_check.py`` adds the counts
to its summary. For each TCP connection, per direction (:mod:`softrdma.wire.tcpstream`):

1. A stream whose first octets are not an MPA key is not MPA (rdma_cm/perftest side
   channels, any other TCP) and is ignored. Otherwise the MPA Request or Reply is parsed
   (RFC 5044 §7.1, RFC 6581), re-encoded and compared byte for byte.
2. Once both frames are known, the FPDUs of the direction are deframed with the
   negotiated options (CRC if either frame has C; markers towards a side whose frame has
   M; RFC 5044 §7.1, RFC 6581), their CRC32c checked when negotiated, the ULPDU decoded as DDP +
   RDMAP and checked against RFC 5040/5041 (:func:`softrdma.wire.ddp.check_segment`), and
   the FPDU re-encoded from the decoded fields (markers, pad and CRC included) and
   compared with the captured bytes.

With ``verbose``, one decoded line per MPA frame and per FPDU is printed as it is checked
(``frame N TIME SRC:PORT -> DST:PORT`` then the MPA frame's key, revision, flags and
private data length, or the FPDU's length, the RDMAP opcode, STag and TO (tagged), QN, MSN
and MO (untagged), the payload length and the CRC), the counterpart of the RoCE lines.

Each MPA frame and each FPDU counts as one checked packet; a failure line names the
frame that completed it (``frame 12: ...``). Octets missing from the capture are not
failures: the gap is reported once in :meth:`IwarpChecker.notes`, the checker
resynchronises at the first later TCP segment that starts with a valid FPDU (a whole
FPDU that decodes, with a good CRC when CRC is on, and a consistent walk to the end of
that segment), and if none comes the rest of the stream is reported as unverifiable.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TextIO

from ...errors import DecodeError, SoftRdmaError
from ...wire import ddp
from ...wire.mpa import (
    KEY_LEN,
    KEY_REP,
    KEY_REQ,
    FpduDeframer,
    FpduEncoder,
    MpaCrcError,
    MpaError,
    MpaFrame,
    MpaFrameParser,
    MpaReply,
    MpaRequest,
)
from ...wire.pcap import PcapRecord
from ...wire.tcpstream import (
    StreamData,
    StreamEvent,
    StreamGap,
    TcpReassembler,
    TcpStream,
    parse_tcp,
)

__all__ = ["IwarpChecker"]

# Direction phases.
_DETECT = "detect"  # no octet seen yet
_FRAME = "frame"  # collecting the MPA Request/Reply
_WAIT = "wait"  # own frame done, the peer's frame not yet seen
_FPDU = "fpdu"  # full operation
_RESYNC = "resync"  # after a gap or framing error, looking for an FPDU start
_REJECTED = "rejected"  # the connection was refused (Reply R=1): nothing may follow
_IGNORE = "ignore"  # not MPA
_STOPPED = "stopped"  # cannot be checked any further


@dataclass(eq=False)
class _Dir:
    stream: TcpStream
    phase: str = _DETECT
    parser: MpaFrameParser | None = None
    raw: bytearray = field(default_factory=bytearray)
    frame: MpaFrame | None = None
    fpdu_base: int = 0  # TCP stream offset of the first FPDU octet
    deframer: FpduDeframer | None = None
    held: list[StreamEvent] = field(default_factory=list)
    gap_frame: int = 0
    skipped: int = 0  # octets passed over while resynchronising
    pad_noted: bool = False
    gap_offset: int = 0
    missing: int = 0  # octets of the current gap episode absent from the capture


def _mismatch(a: bytes, b: bytes) -> str:
    i = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
    return f"re-encoded bytes differ from the capture at byte {i} ({len(b)} vs {len(a)} bytes)"


class IwarpChecker:
    """Checks the iWARP (MPA/DDP/RDMAP) traffic of a capture; see the module docstring."""

    def __init__(self, verbose: TextIO | None = None, prefix: str = "") -> None:
        self._verbose = verbose
        self._prefix = prefix
        self._t0: float | None = None
        self._now = 0.0  # the time of the record being fed, from the first record
        self._tcp = TcpReassembler()
        self._dirs: dict[int, _Dir] = {}
        self.checked = 0
        self.ok = 0
        self._failures: list[str] = []
        self._notes: list[str] = []
        self._gap_notes: list[str] = []
        self._finished = False

    # -- public API ------------------------------------------------------------------------

    def feed(self, record: PcapRecord) -> None:
        """Take the next capture record (any link type; non-TCP frames are ignored)."""
        self._finished = False
        if self._t0 is None:
            self._t0 = record.ts
        self._now = record.ts - self._t0
        try:
            seg = parse_tcp(record.linktype, record.data, record.index)
        except DecodeError as e:
            self._note(str(e), gap=False)
            return
        if seg is not None:
            self._handle(self._tcp.feed(seg))

    def results(self) -> tuple[int, int, list[str]]:
        """``(packets checked, packets ok, lines)``; ends the capture.

        The lines are one per failed packet not yet taken by :meth:`drain`, then one
        ``note: ...`` line per capture gap or unverifiable stream (these count as neither
        ok nor failed)."""
        self._finish()
        return self.checked, self.ok, self._failures + [f"note: {n}" for n in self._gap_notes]

    def drain(self) -> list[str]:
        """The failure lines found since the last call (so that a caller can stream them
        and the checker keeps none)."""
        out, self._failures = self._failures, []
        return out

    def notes(self) -> list[str]:
        """Everything noticed that is not a failure: capture gaps, resynchronisations,
        unverifiable streams, frames that are not decodable TCP, nonzero pad octets."""
        self._finish()
        return list(self._notes)

    def _note(self, line: str, *, gap: bool = True) -> None:
        self._notes.append(line)
        if gap:
            self._gap_notes.append(line)

    # -- plumbing --------------------------------------------------------------------------

    def _finish(self) -> None:
        if self._finished:
            return
        self._finished = True
        self._handle(self._tcp.flush())
        for d in self._dirs.values():
            if d.phase == _RESYNC:
                self._note(f"frame {d.gap_frame}: {d.stream}: {self._lost(d)}; no FPDU "
                                   f"start found after it: the remaining {d.skipped} octets of "
                                   f"the stream are unverifiable")
                d.phase = _STOPPED
            elif d.phase == _WAIT and d.held:
                self._note(f"{d.stream}: the peer's MPA frame is not in the capture; "
                                   f"the FPDUs sent are unverifiable")
                d.phase = _STOPPED
            elif d.phase == _FRAME:
                self._note(f"{d.stream}: capture ends inside the MPA frame")
                d.phase = _STOPPED
            elif d.phase == _FPDU and d.deframer is not None and d.deframer.buffered:
                self._note(f"{d.stream}: capture ends inside an FPDU "
                                   f"({d.deframer.buffered} octets unchecked)")

    def _dir(self, st: TcpStream) -> _Dir:
        d = self._dirs.get(st.id)
        if d is None:
            d = self._dirs[st.id] = _Dir(st)
        return d

    def _peer(self, d: _Dir) -> _Dir | None:
        s = d.stream
        rev = self._tcp.streams.get((s.dst[0], s.dst[1], s.src[0], s.src[1]))
        return self._dirs.get(rev.id) if rev is not None else None

    def _show(self, frame: int, d: _Dir, what: str) -> None:
        """The ``-v`` line of one MPA frame or FPDU, completed by capture frame ``frame``."""
        if self._verbose is not None:
            print(f"{self._prefix}frame {frame} {self._now:.6f} {d.stream} {what}",
                  file=self._verbose)

    def _fail(self, frame: int, d: _Dir, msg: str) -> None:
        self._failures.append(f"frame {frame}: {d.stream}: {msg}")

    def _handle(self, events: list[StreamEvent]) -> None:
        for ev in events:
            self._event(self._dir(ev.stream), ev)

    def _event(self, d: _Dir, ev: StreamEvent) -> None:
        if d.phase in (_IGNORE, _STOPPED):
            return
        if d.phase == _DETECT:
            if isinstance(ev, StreamGap) or ev.offset != 0:
                d.phase = _IGNORE  # the start of the stream is not in the capture
                return
            head = ev.data[:KEY_LEN]
            if not (KEY_REQ.startswith(head) or KEY_REP.startswith(head)):
                d.phase = _IGNORE
                return
            d.phase = _FRAME
            d.parser = MpaFrameParser(None, revisions=(0, 1, 2))
        if d.phase == _FRAME:
            self._frame_event(d, ev)
        elif d.phase == _WAIT:
            d.held.append(ev)
        elif d.phase == _REJECTED:
            if isinstance(ev, StreamData):
                self.checked += 1
                self._fail(ev.frame, d, f"{len(ev.data)} octets after the MPA exchange was rejected")
                d.phase = _STOPPED
        elif isinstance(ev, StreamGap):
            self._gap(d, ev)
        elif d.phase == _RESYNC:
            self._resync(d, ev)
        else:
            self._fpdu_data(d, ev)

    # -- MPA Request/Reply -----------------------------------------------------------------

    def _frame_event(self, d: _Dir, ev: StreamEvent) -> None:
        if isinstance(ev, StreamGap):
            self._note(f"frame {ev.frame}: {d.stream}: {ev.length} octets missing inside "
                               f"the MPA frame; stream unverifiable")
            d.phase = _STOPPED
            return
        assert d.parser is not None
        d.raw += ev.data
        try:
            frame = d.parser.feed(ev.data)
        except MpaError as e:
            self.checked += 1
            self._fail(ev.frame, d, f"MPA frame: {e}")
            d.phase = _STOPPED
            return
        if frame is None:
            return
        self.checked += 1
        raw = bytes(d.raw[:len(d.raw) - len(d.parser.remainder)])
        self._show(ev.frame, d, f"{frame.describe()} len {len(raw)}")
        enc = frame.encode()
        if enc != raw:
            self._fail(ev.frame, d, f"{frame.describe()}: {_mismatch(enc, raw)}")
        else:
            self.ok += 1
        d.frame = frame
        d.fpdu_base = len(raw)
        d.raw = bytearray()
        d.phase = _WAIT
        if d.parser.remainder:
            d.held.append(StreamData(ev.stream, ev.offset + len(ev.data) - len(d.parser.remainder),
                                     d.parser.remainder, ev.frame))
        peer = self._peer(d)
        if peer is not None and peer.phase == _WAIT:
            self._start(d, peer)
            self._start(peer, d)

    def _start(self, d: _Dir, peer: _Dir) -> None:
        """Both frames known: enter full operation with the negotiated options."""
        assert d.frame is not None and peer.frame is not None
        req, rep = (d.frame, peer.frame) if isinstance(d.frame, MpaRequest) else (peer.frame, d.frame)
        held, d.held = d.held, []
        if type(req) is type(rep) or not isinstance(rep, MpaReply):
            if held:
                self._note(f"{d.stream}: both sides sent an MPA "
                                   f"{'Request' if isinstance(req, MpaRequest) else 'Reply'}; "
                                   f"FPDUs unverifiable")
            d.phase = _STOPPED
            return
        if rep.reject:
            d.phase = _REJECTED
        else:
            crc = req.crc or rep.crc
            markers = peer.frame.markers  # the receiver of this direction asked for them
            d.deframer = FpduDeframer(crc=crc, markers=markers)
            d.phase = _FPDU
        for ev in held:
            self._event(d, ev)

    # -- FPDUs -----------------------------------------------------------------------------

    def _fpdu_data(self, d: _Dir, ev: StreamData) -> None:
        dfr = d.deframer
        assert dfr is not None
        dfr.push(ev.data)
        while True:
            try:
                f = dfr.pop()
            except MpaCrcError as e:
                self.checked += 1
                self._fail(ev.frame, d, f"bad CRC32c (field {e.fpdu.crc:#010x}, "
                                        f"computed {e.computed:#010x})")
                continue
            except MpaError as e:
                self.checked += 1
                self._fail(ev.frame, d, f"MPA framing: {e}")
                # Framing lost without a capture gap: look for the next FPDU start.
                d.phase = _RESYNC
                d.gap_frame = ev.frame
                d.gap_offset = d.fpdu_base + dfr.offset
                d.missing = 0
                d.skipped = dfr.buffered
                return
            if f is None:
                return
            self.checked += 1
            self._show(ev.frame, d, self._describe_fpdu(dfr, f.raw, f.ulpdu, f.crc))
            problem = self._check_fpdu(dfr, f.offset, f.raw, f.ulpdu, f.pad)
            if problem is None:
                self.ok += 1
            else:
                self._fail(ev.frame, d, problem)
            if not d.pad_noted and f.pad.count(0) != len(f.pad):
                d.pad_noted = True
                self._note(f"frame {ev.frame}: {d.stream}: nonzero FPDU pad octets "
                           f"{f.pad.hex()} (RFC 5044 §4.1: zero on transmit, ignored on "
                           f"receipt; Linux siw leaves them uninitialised)", gap=False)

    @staticmethod
    def _describe_fpdu(dfr: FpduDeframer, raw: bytes, ulpdu: bytes | memoryview,
                       crc: int) -> str:
        """``FPDU len N ULPDU len N`` and the DDP/RDMAP fields (RFC 5044 §4, RFC 5041 §4,
        RFC 5040 §4), e.g. ``... RDMA Write STag=0x00000102 TO=0x0 L len=64 CRC ...``."""
        s = f"FPDU len {len(raw)} ULPDU len {len(ulpdu)}"
        try:
            s += " " + ddp.describe(ddp.decode_segment(ulpdu))
        except DecodeError as e:
            s += f" (undecodable DDP/RDMAP: {e})"
        if dfr.crc:
            s += f" CRC {crc:#010x}"
        return s

    @staticmethod
    def _check_fpdu(dfr: FpduDeframer, offset: int, raw: bytes, ulpdu: bytes | memoryview,
                    pad: bytes) -> str | None:
        try:
            seg = ddp.decode_segment(ulpdu)
        except DecodeError as e:
            return f"DDP/RDMAP: {e}"
        what = ddp.describe(seg)
        rule = ddp.check_segment(seg)
        if rule is not None:
            return f"{what}: {rule}"
        try:
            enc = b"".join(FpduEncoder(crc=dfr.crc, markers=dfr.markers, stream_offset=offset)
                           .encode(ddp.encode_segment(seg), pad))
        except SoftRdmaError as e:
            return f"{what}: cannot re-encode: {e}"
        if enc != raw:
            return f"{what}: {_mismatch(enc, raw)}"
        return None

    def _gap(self, d: _Dir, ev: StreamGap) -> None:
        if d.phase == _FPDU:
            assert d.deframer is not None
            d.skipped = d.deframer.buffered
            d.missing = 0
            d.gap_frame = ev.frame
            d.gap_offset = ev.offset
            d.phase = _RESYNC
        d.skipped += ev.length
        d.missing += ev.length

    @staticmethod
    def _lost(d: _Dir) -> str:
        if d.missing:
            return f"{d.missing} octets from stream offset {d.gap_offset} missing from the capture"
        return f"FPDU framing lost at stream offset {d.gap_offset}"

    def _resync(self, d: _Dir, ev: StreamData) -> None:
        dfr = d.deframer
        assert dfr is not None
        rel = ev.offset - d.fpdu_base
        if self._fpdu_starts(dfr, rel, ev.data):
            self._note(f"frame {d.gap_frame}: {d.stream}: {self._lost(d)}; "
                               f"resynchronised at frame {ev.frame} (stream offset {ev.offset}), "
                               f"{d.skipped} octets unchecked")
            dfr.resync(rel)
            d.phase = _FPDU
            d.skipped = 0
            self._fpdu_data(d, ev)
        else:
            d.skipped += len(ev.data)

    def _fpdu_starts(self, dfr: FpduDeframer, rel: int, data: bytes) -> bool:
        """Does ``data`` (one TCP segment's worth, at FPDU-stream offset ``rel``) start with
        an FPDU? It must hold at least one whole FPDU that passes every check, and the
        FPDUs must tile it up to its end or to a partial FPDU with a sane length."""
        trial = FpduDeframer(crc=dfr.crc, markers=dfr.markers, stream_offset=rel,
                             min_ulpdu=dfr.min_ulpdu, max_ulpdu=dfr.max_ulpdu)
        trial.push(data)
        whole = 0
        while True:
            try:
                f = trial.pop()
            except MpaError:
                return False
            if f is None:
                break
            if self._check_fpdu(trial, f.offset, f.raw, f.ulpdu, f.pad) is not None:
                return False
            whole += 1
        return whole > 0
