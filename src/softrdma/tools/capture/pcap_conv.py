"""Conversation checks of ``softrdma pcap-check``: each RC/UC/XRC connection, PSN by PSN.

A connection is followed from its setup in the capture: the CM REQ/REP (IBA 12.6.5,
12.6.8) on QP1, or the TCP 18515 exchange of ``ibv_*_pingpong`` and perftest
(:mod:`softrdma.tools.capture.pcap_oob`). Traffic of connections whose setup is not in the capture
is not followed. Each connection has two *flows*: the requests of one side with the
responses (ACK/NAK, RDMA READ responses, atomic ACKs) of the other (IBA 9.7).

What the setup announces (Linux, ``drivers/infiniband/core/cm.c``, which rxe and RoCE NICs
follow; the Starting PSN of IBA 12.6.5 and 12.6.8): the REQ's Starting PSN is the PSN the active side
receives at, so the passive side's first request carries it; the REP's Starting PSN is
the one the active side's first request carries. In the 18515 exchange each side sends
the PSN it sends from.

Checks, each reported once per flow as ``frame N: <connection>: <reason>``, after which
that flow is no longer checked (later faults would be consequences):

1. **First PSN** (IBA 9.7.1): the first request of a flow carries the announced PSN.
2. **Sequence** (IBA 9.7.1, 9.7.2): each new request carries the next PSN; an RDMA READ
   request takes ``ceil(length / PMTU)`` PSNs (at least 1; IBA 9.7.4.1.3). A PSN behind
   the next one is a retransmission and must not precede the first PSN (UC never
   retransmits). The PMTU is what packets show (FIRST/MIDDLE payloads are exactly one
   PMTU: the BTH OpCode table, IBA 9.2), bounded by the REQ's path MTU;
   until packets show it, every PMTU the READ spans allow.
3. **Gaps**: a capture may miss packets that tcpdump dropped. A PSN ahead of the next one
   opens a gap, which counts as *explained* only when a later response proves the missing
   requests existed and were received: an ACK, NAK, READ response or atomic ACK whose PSN
   covers the gap (its PSN, less one for a NAK, is at or beyond the gap's end), **and**
   whose MSN (the responder's count of completed request messages when it sent the
   response, IBA 9.7.5.1.1) exceeds the count of completed messages seen up to that PSN
   by no less than the number of gaps that must hold a message end (a gap followed by a
   FIRST/ONLY packet). Every MSN must also lie between the messages completed up to its
   PSN and all the messages sent (those seen plus one per missing PSN). (Past 65536
   unacknowledged messages in a flow the MSN part is dropped and PSN coverage alone
   explains a gap.) A gap still unexplained at the end of the capture, or contradicted by
   an MSN, is reported at the frame after it; so is a first request that is not at the
   announced PSN (a first PSN *behind* the announced one is reported at once). UC has no responses: a UC gap counts as
   explained only when the packet after it continues a message (MIDDLE/LAST) whose start
   is missing from the capture with it; otherwise it is reported at once.
4. **Responses**: an ACK/NAK/atomic ACK refers to a PSN the requester sent (first PSN ..
   next PSN - 1). A positive ACK (or atomic ACK) *ahead* of the next PSN is capture loss,
   not an error, when nothing contradicts it: tcpdump can miss the last requests of a
   capture yet catch their ACKs (rxe under perftest). The missing PSNs (next PSN .. the
   ACK's PSN) then count as a gap the ACK explains, its MSN checked as for any gap; if the
   requester later sends a new request inside that range, the ACK came before the request
   it acknowledges and is reported as acknowledging a PSN never sent (at the ACK's frame).
   A NAK ahead of the next PSN is reported at once. An RDMA READ response ahead of the
   next PSN is capture loss the same way (its READ request was lost). An RDMA READ response lies in the PSN range of an RDMA READ request and
   has the position (FIRST/MIDDLE/LAST/ONLY) and payload length that range implies
   (IBA 9.7.4.1.3); a READ response in an unexplained gap is accepted when its MSN check
   passes (the request was lost from the capture).
5. **CM**: a REP answers a REQ, an RTU a REP; a DREQ names an established connection (comm
   IDs and the receiver's QPN, IBA 12.6.9); a DREP answers a DREQ. A DREP closes the
   connection; a repeated DREQ/DREP of a closed one is a retransmission. The gap rule
   does not apply to the CM: a capture must hold the REQ and REP of each connection whose
   later messages it holds (a REP, RTU, DREQ or DREP for no REQ/REP is reported).
"""

from __future__ import annotations

import ipaddress
from collections import deque
from dataclasses import dataclass, field

from ...errors import SoftRdmaError
from ...wire import cm as wcm
from ...wire import ib
from ...wire.opcodes import Hdr, Kind, Pos, Transport
from ...wire.roce import RoceFrame
from .pcap_oob import OobPair, gid_to_ip

__all__ = ["Finding", "ConversationChecker", "MTUS", "psn_delta"]

PSN_MOD = 1 << 24
PSN_HALF = 1 << 23
MTUS = (256, 512, 1024, 2048, 4096)  # the PMTUs (REQ path MTU codes 1..5, IBA 12.6 REQ, body offset 50)
GSI_QPN = 1
MAX_TRACKED = 1 << 16  # per flow: unacknowledged messages, gaps
MAX_READS = 1024  # per flow: the READ requests remembered (retries and duplicates answered)
MAX_CLOSED = 4096  # closed connections remembered (for retransmitted DREQ/DREP)
_LAST = Pos.LAST
_FIRST = Pos.FIRST


def psn_delta(a: int, b: int) -> int:
    """``a - b`` in the 24-bit PSN space, in ``[-2^23, 2^23)`` (IBA 9.7.2)."""
    return ((a - b + PSN_HALF) % PSN_MOD) - PSN_HALF


def _ip(b: bytes) -> str:
    return str(ipaddress.ip_address(b))


def _canon(addr: bytes) -> bytes:
    """One key per node: a RoCEv1 GRH's IPv4-mapped GID is its IPv4 address (RoCEv2)."""
    return gid_to_ip(addr) or addr


def _mtu_of(code: int) -> int:
    """Path MTU code (IBA Table 165: 1 = 256 .. 5 = 4096) to bytes; 0 if not one."""
    return 128 << code if 1 <= code <= len(MTUS) else 0


@dataclass(frozen=True, slots=True)
class Finding:
    """One conversation inconsistency (``note``: an observation, not a failure)."""

    frame: int
    text: str
    note: bool = False

    def line(self) -> str:
        return f"frame {self.frame}: {self.text}"


@dataclass(eq=False, slots=True)
class _Read:
    psn: int
    length: int
    frame: int


@dataclass(eq=False, slots=True)
class _Gap:
    start: int
    end: int  # exclusive
    frame: int  # the frame after the gap
    must_end: bool  # the gap holds at least one message end


@dataclass(eq=False, slots=True)
class _Lost:
    """Requests an ACK ahead of the next PSN shows were lost from the capture (PSNs
    ``start`` .. ``end - 1``), until a later request contradicts it."""

    start: int
    end: int  # exclusive
    frame: int  # the (first) ACK ahead
    text: str  # its failure line, should a later request fall in the range


@dataclass(eq=False, slots=True)
class _Flow:
    """One side's requests (``requester``) and the peer's responses."""

    name: str
    next: int  # the next new request PSN
    first: int
    source: str  # where ``first`` was announced
    conn: _Conn
    started: bool = False
    failed: bool = False
    first_frame: int = 0
    done: deque[int] = field(default_factory=deque)  # completion PSNs, not yet acked
    acked_x: int = 0  # the PSN of the last MSN-checked response
    acked_msgs: int = 0  # messages seen completed through acked_x
    hidden_lo: int = 0  # messages in the explained gaps: at least
    hidden_hi: int = 0  # at most (their PSNs)
    msn_ok: bool = True
    reads: dict[int, _Read] = field(default_factory=dict)
    gaps: deque[_Gap] = field(default_factory=deque)
    read_after: _Read | None = None  # a READ whose span the PMTU does not fix yet
    lost: _Lost | None = None  # requests only an ACK ahead of them shows


_SERVICE_NAME: dict[int, str] = {Transport.RC: "an RC", Transport.UC: "a UC",
                                 Transport.XRC: "an XRC"}


@dataclass(eq=False, slots=True)
class _Conn:
    name: str
    transport: int | None  # Transport.RC / UC / XRC; None until the first packet (18515)
    mtus: set[int]
    keys: list[tuple[bytes, bytes, int]] = field(default_factory=list)
    flows: dict[int, _Flow] = field(default_factory=dict)  # side 0 / 1
    qpns: tuple[int, int] = (0, 0)
    ips: tuple[bytes, bytes] = (b"", b"")
    #: the sides that sent a DREQ (both, when the two ends disconnect at once: each
    #: answers the other's DREQ with a DREP, IBA 12.9.8.3 / Linux cm.c cm_dreq_handler
    #: in IB_CM_DREQ_SENT)
    dreq_from: set[int] = field(default_factory=set)


class ConversationChecker:
    """Feeds on RoCE frames and 18515 pairs; collects :class:`Finding` s in ``findings``
    (the caller drains the list as it goes: memory stays flat)."""

    def __init__(self) -> None:
        self.findings: list[Finding] = []
        self.followed = 0
        self._keys: dict[tuple[bytes, bytes, int], tuple[_Conn, int]] = {}
        self._reqs: dict[tuple[bytes, bytes, int], tuple[wcm.Req, int]] = {}
        self._conns: dict[tuple[bytes, bytes, int, int], _Conn] = {}  # by comm IDs
        self._closed: deque[tuple[bytes, bytes, int, int]] = deque(maxlen=MAX_CLOSED)
        self._open: dict[_Conn, None] = {}  # ordered: findings come in a stable order

    # ---- setup -------------------------------------------------------------------------
    def feed_oob(self, pair: OobPair) -> None:
        """A QP pair from the 18515 exchange: each side's PSN is the one it sends from."""
        c, s = pair.client, pair.server
        name = (f"{_ip(c.ip)} QP {c.qpn:#x} <-> {_ip(s.ip)} QP {s.qpn:#x}")
        conn = _Conn(name, None, set(MTUS), ips=(c.ip, s.ip), qpns=(c.qpn, s.qpn))
        self._open_conn(conn, c.psn, f"its {c.tool} message (frame {c.frame})",
                        s.psn, f"its {s.tool} message (frame {s.frame})", max(c.frame, s.frame))

    def _open_conn(self, conn: _Conn, psn0: int, src0: str, psn1: int, src1: str,
                   frame: int) -> None:
        a, b = conn.ips
        qa, qb = conn.qpns
        for side, (psn, src) in enumerate(((psn0, src0), (psn1, src1))):
            who = (f"{_ip(a)} QP {qa:#x} -> {_ip(b)} QP {qb:#x}" if side == 0
                   else f"{_ip(b)} QP {qb:#x} -> {_ip(a)} QP {qa:#x}")
            conn.flows[side] = _Flow(who, psn, psn, src, conn, acked_x=(psn - 1) % PSN_MOD)
        conn.keys = [(a, b, qb), (b, a, qa)]
        for k in conn.keys:
            old = self._keys.get(k)
            if old is not None and old[0] is not conn:
                self._close(old[0])  # the QPN was reused: the old one is over
        for side, k in enumerate(conn.keys):
            self._keys[k] = (conn, side)
        self._open[conn] = None
        if conn.transport is not None:
            self.followed += 1
        self._note(frame, f"{conn.name}: opened; requests from {_ip(a)} start at PSN "
                          f"{psn0:#08x} ({src0}), from {_ip(b)} at {psn1:#08x} ({src1})")

    def _close(self, conn: _Conn) -> None:
        for f in conn.flows.values():
            self._flow_end(f)
        for k in conn.keys:
            if self._keys.get(k, (None, 0))[0] is conn:
                del self._keys[k]
        self._open.pop(conn, None)

    def finish(self) -> None:
        """End of the capture: report the gaps nothing explained."""
        for conn in list(self._open):
            self._close(conn)

    def _flow_end(self, f: _Flow) -> None:
        if f.failed or not f.gaps:
            return
        g = f.gaps[0]
        self._fail(f, g.frame, self._gap_text(f, g) + " and no response accounts for them")

    def _gap_text(self, f: _Flow, g: _Gap) -> str:
        if g.frame == f.first_frame and g.start == f.first:
            return (f"first request PSN {g.end:#08x} is not the Starting PSN {f.first:#08x} "
                    f"announced in {f.source}")
        n = (g.end - g.start) % PSN_MOD
        return (f"PSN {g.start:#08x}..{(g.end - 1) % PSN_MOD:#08x} ({n} PSNs) missing "
                f"before this request")

    # ---- findings ---------------------------------------------------------------------
    def _note(self, frame: int, text: str) -> None:
        self.findings.append(Finding(frame, text, note=True))

    def _fail(self, f: _Flow, frame: int, text: str) -> None:
        if f.failed:
            return
        f.failed = True
        self.findings.append(Finding(frame, f"{f.name}: {text}"))

    def _cm_fail(self, frame: int, text: str) -> None:
        self.findings.append(Finding(frame, f"CM: {text}"))

    # ---- packets ----------------------------------------------------------------------
    def feed(self, index: int, f: RoceFrame) -> None:
        """One RoCE frame (already decoded, ICRC checked by the caller)."""
        p = f.packet
        if p.dqpn == GSI_QPN:
            self._mad(index, f)
            return
        t = p.opcode & 0xE0
        hit = self._keys.get((_canon(f.src_ip), _canon(f.dst_ip), p.dqpn))
        if hit is None:
            return
        conn, side = hit
        if conn.transport is None:  # an 18515 pair: its first packet tells the service
            if t not in (Transport.RC, Transport.UC, Transport.XRC):
                self._close(conn)
                self._note(index, f"{conn.name}: {p.info.name}: not a connection (not followed)")
                return
            conn.transport = t
            self.followed += 1
        elif t != conn.transport:
            flow = conn.flows[side if p.info.is_request else 1 - side]
            self._fail(flow, index, f"{p.info.name} on {_SERVICE_NAME[conn.transport]} connection")
            return
        if p.info.is_request:
            self._request(conn.flows[side], index, p)
        elif p.info.is_response:
            self._response(conn.flows[1 - side], index, p)

    def _learn_mtu(self, f: _Flow, index: int, size: int, what: str) -> bool:
        mtus = f.conn.mtus
        if size in mtus:
            if len(mtus) > 1:
                mtus.intersection_update((size,))
            return True
        self._fail(f, index, f"{what} of {size} bytes is not a message's last packet, so it "
                             f"must be one PMTU ({'/'.join(map(str, sorted(mtus)))})")
        return False

    @staticmethod
    def _spans(f: _Flow, length: int) -> list[int]:
        """The PSNs an RDMA READ of ``length`` bytes may take, for each PMTU still possible."""
        mtus = f.conn.mtus
        if len(mtus) == 1:
            for m in mtus:
                return [max(1, -(-length // m))]
        return sorted({max(1, -(-length // m)) for m in mtus})

    def _request(self, f: _Flow, index: int, p: ib.IBPacket) -> None:
        if f.failed:
            return
        info = p.info
        if not info.pos & _LAST and not self._learn_mtu(f, index, len(p.payload), info.name):
            return
        ra = f.read_after
        if ra is not None and f.started:
            spans = self._spans(f, ra.length)
            d = psn_delta(p.psn, ra.psn)
            if d in spans:
                f.conn.mtus.intersection_update(
                    m for m in list(f.conn.mtus) if max(1, -(-ra.length // m)) == d)
                f.next = p.psn
                f.read_after = None
            elif 0 < d < spans[-1]:
                self._fail(f, index, f"PSN {p.psn:#08x} lies inside the RDMA READ at "
                                     f"{ra.psn:#08x} (frame {ra.frame}: {ra.length} bytes "
                                     f"take {'/'.join(map(str, spans))} PSNs)")
                return
            elif d > 0:
                f.next = (ra.psn + spans[0]) % PSN_MOD
                f.read_after = None
        lost = f.lost
        if lost is not None:
            if 0 <= psn_delta(p.psn, lost.start) < psn_delta(lost.end, lost.start):
                self._fail(f, lost.frame, f"{lost.text}; the requester sends PSN {p.psn:#08x} "
                                          f"after it (frame {index})")
                return
            if psn_delta(p.psn, lost.end) >= 0:
                f.lost = None  # the requester goes on past them: they were lost from the capture
        d = psn_delta(p.psn, f.next)
        uc = f.conn.transport == Transport.UC
        first = not f.started
        if first:
            f.started = True
            f.first_frame = index
            if d < 0:
                self._fail(f, index, f"first request PSN {p.psn:#08x} is not the Starting PSN "
                                     f"{f.first:#08x} announced in {f.source}")
                return
        if d < 0:
            if uc:
                self._fail(f, index, f"PSN {p.psn:#08x} goes back (next is {f.next:#08x}); "
                                     f"UC never retransmits")
            elif psn_delta(p.psn, f.first) < 0:
                self._fail(f, index, f"PSN {p.psn:#08x} precedes the first PSN {f.first:#08x} "
                                     f"({f.source})")
            elif info.kind == Kind.READ_REQ:  # answered again (IBA 9.7.5.1.4)
                self._add_read(f, _Read(p.psn, p.dma_len, index))
            return  # a retransmission (IBA 9.7.7)
        if d > 0:
            cont = bool(info.pos & Pos.MIDDLE or info.pos == Pos.LAST)
            if uc and not cont:
                text = (f"first request PSN {p.psn:#08x} is not the Starting PSN "
                        f"{f.first:#08x} announced in {f.source}" if first else
                        f"PSN {f.next:#08x}..{(p.psn - 1) % PSN_MOD:#08x} missing before this "
                        f"request")
                self._fail(f, index, text + " (UC has no responses to explain a gap, and "
                                            "this packet starts a message)")
                return
            if not uc:
                if len(f.gaps) >= MAX_TRACKED:
                    self._fail(f, index, f"more than {MAX_TRACKED} unexplained PSN gaps")
                    return
                # A gap followed by a message start holds the end of the message before
                # it (or whole messages): at least one message end.
                f.gaps.append(_Gap(f.next, p.psn, index, bool(info.pos & _FIRST)))
        self._advance(f, index, p)

    @staticmethod
    def _add_read(f: _Flow, r: _Read) -> None:
        f.reads.pop(r.psn, None)
        if len(f.reads) >= MAX_READS:  # far more than any responder keeps outstanding
            del f.reads[next(iter(f.reads))]
        f.reads[r.psn] = r

    def _advance(self, f: _Flow, index: int, p: ib.IBPacket) -> None:
        info = p.info
        span = 1
        if info.kind == Kind.READ_REQ:
            r = _Read(p.psn, p.dma_len, index)
            spans = self._spans(f, p.dma_len)
            span = spans[0]
            if len(spans) > 1:
                f.read_after = r
            self._add_read(f, r)
        f.next = (p.psn + span) % PSN_MOD
        if f.conn.transport != Transport.UC and info.pos & _LAST:  # RC, XRC: acknowledged
            if len(f.done) >= MAX_TRACKED:
                f.msn_ok = False
                f.done.clear()
            f.done.append(p.psn)

    # ---- responses --------------------------------------------------------------------
    def _sent(self, f: _Flow, psn: int) -> bool:
        return f.started and psn_delta(psn, f.first) >= 0 and psn_delta(psn, f.next) < 0

    def _response(self, f: _Flow, index: int, p: ib.IBPacket) -> None:
        if f.failed:
            return
        info = p.info
        kind = info.kind
        if not f.started:
            self._fail(f, index, f"{info.name} PSN {p.psn:#08x} before any request")
            return
        if kind == Kind.READ_RESP:
            self._read_response(f, index, p)
            return
        syn = p.syndrome & ib.AETH_TYPE_MASK
        if not self._sent(f, p.psn):
            what = "ACK" if syn == ib.AETH_ACK else ("RNR NAK" if syn == ib.AETH_RNR_NAK
                                                    else "NAK")
            if f.gaps and f.gaps[0].frame == f.first_frame:  # the first PSN was wrong
                g = f.gaps[0]
                self._fail(f, g.frame, f"{self._gap_text(f, g)}; the peer answers with an "
                                       f"{what} for PSN {p.psn:#08x} (frame {index})")
                return
            text = (f"{what} ({info.name}) for PSN {p.psn:#08x}, which was never sent (sent: "
                    f"{f.first:#08x}..{(f.next - 1) % PSN_MOD:#08x})")
            if syn != ib.AETH_ACK or psn_delta(p.psn, f.next) < 0:
                self._fail(f, index, text)
                return
            self._lost_requests(f, index, p.psn, text)
        through = p.psn if syn == ib.AETH_ACK else (p.psn - 1) % PSN_MOD
        self._msn(f, index, through, p.msn, info.name)

    def _lost_requests(self, f: _Flow, index: int, psn: int, text: str) -> None:
        """An ACK (or READ response) for PSN ``psn`` at or past the next PSN: the requests
        up to it were lost
        from the capture. They become a gap (which the ACK's MSN check then explains) and
        are remembered in ``f.lost`` until a request past them confirms the loss."""
        if len(f.gaps) >= MAX_TRACKED:
            self._fail(f, index, f"more than {MAX_TRACKED} unexplained PSN gaps")
            return
        ra = f.read_after
        if ra is not None:  # the last READ's span, if the PMTU now fixes it
            spans = self._spans(f, ra.length)
            if len(spans) == 1 and psn_delta((ra.psn + spans[0]) % PSN_MOD, f.next) > 0:
                f.next = (ra.psn + spans[0]) % PSN_MOD
            f.read_after = None
            if psn_delta(psn, f.next) < 0:
                return  # inside that READ after all
        end = (psn + 1) % PSN_MOD
        f.gaps.append(_Gap(f.next, end, index, False))
        if f.lost is None:
            f.lost = _Lost(f.next, end, index, text)
        else:
            f.lost.end = end
        f.next = end

    def _read_response(self, f: _Flow, index: int, p: ib.IBPacket) -> None:
        """Match an RDMA READ response with a READ request (the newest first: a retried
        READ asks again from its first missing packet, IBA 9.7.5.1.5, and the network may
        still deliver the first answer or duplicates of it)."""
        info = p.info
        if not info.pos & _LAST and not self._learn_mtu(f, index, len(p.payload), info.name):
            return
        why = ""
        match: _Read | None = None
        for r in reversed(f.reads.values()):
            off = psn_delta(p.psn, r.psn)
            if off < 0:
                continue
            spans = self._spans(f, r.length)
            if off >= spans[-1]:
                continue
            w = self._read_fit(f, r, p, spans, off)
            if not w:
                match = r
                break
            why = why or w
        if match is not None:
            if info.hdrs & Hdr.AETH:
                self._msn(f, index, match.psn, p.msn, info.name)
        elif why:
            self._fail(f, index, why)
        elif any(self._in_gap(g, p.psn) for g in f.gaps):  # its READ is missing too
            if info.hdrs & Hdr.AETH:
                self._msn(f, index, p.psn, p.msn, info.name)
        elif psn_delta(p.psn, f.next) >= 0:  # its READ was lost from the capture's end
            self._lost_requests(f, index, p.psn, f"{info.name} PSN {p.psn:#08x} answers no "
                                                 f"RDMA READ request")
            if info.hdrs & Hdr.AETH:
                self._msn(f, index, p.psn, p.msn, info.name)
        else:
            self._fail(f, index, f"{info.name} PSN {p.psn:#08x} answers no RDMA READ request")

    @staticmethod
    def _read_fit(f: _Flow, r: _Read, p: ib.IBPacket, spans: list[int], off: int) -> str:
        """Why response ``p`` at offset ``off`` cannot belong to READ ``r`` ("" if it can)."""
        if len(spans) > 1:
            return ""  # the PMTU is not known yet: any position may fit
        span = spans[0]
        info = p.info
        want = (Pos.ONLY if span == 1 else Pos.FIRST if off == 0
                else Pos.LAST if off == span - 1 else Pos.MIDDLE)
        if info.pos != want:
            return (f"{info.name} at offset {off} of the RDMA READ at {r.psn:#08x} (frame "
                    f"{r.frame}) of {span} packets")
        if info.pos & _LAST:
            size = r.length - (span - 1) * min(f.conn.mtus)
            if len(p.payload) != size:
                return (f"{info.name} carries {len(p.payload)} bytes; the RDMA READ at "
                        f"{r.psn:#08x} (frame {r.frame}) of {r.length} bytes leaves {size} "
                        f"for it")
        return ""

    @staticmethod
    def _in_gap(g: _Gap, psn: int) -> bool:
        return 0 <= psn_delta(psn, g.start) < psn_delta(g.end, g.start)

    def _msn(self, f: _Flow, index: int, through: int, msn: int, what: str) -> None:
        """Check the responder's MSN for requests up to PSN ``through``; explain gaps.

        The AETH carries the responder's MSN when it sends (IBA 9.7): at least the messages completed up to ``through``, at most
        all the messages sent so far."""
        if f.failed or psn_delta(through, f.acked_x) <= 0:
            return  # a duplicate or older response: nothing new to account for
        seen = 0
        while f.done and psn_delta(f.done[0], through) <= 0:
            f.done.popleft()
            seen += 1
        lo = hi = 0
        covered: list[_Gap] = []
        for g in f.gaps:
            if psn_delta(g.start, through) > 0:
                break
            covered.append(g)
            if g.must_end and psn_delta(g.end, through) <= 1:
                lo += 1
            hi += min(psn_delta(g.end, g.start), psn_delta(through, g.start) + 1)
        if f.msn_ok:
            least = f.acked_msgs + seen + f.hidden_lo  # completed up to ``through``, at least
            most = (f.acked_msgs + seen + len(f.done) + f.hidden_hi
                    + sum(psn_delta(g.end, g.start) for g in f.gaps))  # all sent, at most
            extra = psn_delta(msn, least % PSN_MOD)  # MSN is 24 bits (IBA 9.3.5)
            if extra < lo:
                if covered:
                    g = covered[0]
                    self._fail(f, g.frame, f"{self._gap_text(f, g)}; {what} (frame {index}, "
                                           f"MSN {msn}) counts {extra} messages in them, at "
                                           f"least {lo} needed")
                else:
                    self._fail(f, index, f"{what} MSN {msn} for PSN {through:#08x}: {least} "
                                         f"messages were completed up to it")
                return
            if extra > most - least:
                self._fail(f, index, f"{what} MSN {msn} for PSN {through:#08x}: only {most} "
                                     f"messages were sent")
                return
            f.hidden_lo += lo
            f.hidden_hi += hi
        f.acked_msgs += seen
        f.acked_x = through
        if covered:
            g = covered[0]
            self._note(index, f"{f.name}: {what} (MSN {msn}) accounts for {hi} PSNs missing "
                              f"from the capture, from {g.start:#08x} (before frame {g.frame})")
        for g in covered:
            if psn_delta(g.end, through) <= 1:
                f.gaps.popleft()
            else:
                g.start = (through + 1) % PSN_MOD
                g.must_end = False  # its message end may have been in the part covered

    # ---- CM -----------------------------------------------------------------------------
    def _mad(self, index: int, f: RoceFrame) -> None:
        try:
            mad = wcm.decode(f.packet.payload)
        except SoftRdmaError:
            return  # not a CM message, or a bad one the packet checks report
        m = mad.msg
        src, dst = _canon(f.src_ip), _canon(f.dst_ip)
        if isinstance(m, wcm.Req):
            if m.transport_service_type in (wcm.TransportServiceType.RC,
                                            wcm.TransportServiceType.UC):
                if len(self._reqs) >= MAX_TRACKED:  # unanswered REQs: forget the oldest
                    del self._reqs[next(iter(self._reqs))]
                self._reqs.setdefault((src, dst, m.local_comm_id), (m, index))
        elif isinstance(m, wcm.Rep):
            self._rep(index, src, dst, m)
        elif isinstance(m, wcm.Rej):
            self._reqs.pop((dst, src, m.remote_comm_id), None)
        elif isinstance(m, wcm.Rtu):
            key = (src, dst, m.local_comm_id, m.remote_comm_id)
            if key not in self._conns and key not in self._closed:
                self._cm_fail(index, f"RTU (comm IDs {m.local_comm_id:#x}/{m.remote_comm_id:#x}) "
                                     f"answers no REP")
        elif isinstance(m, wcm.Dreq):
            self._dreq(index, src, dst, m)
        elif isinstance(m, wcm.Drep):
            self._drep(index, src, dst, m)

    def _rep(self, index: int, src: bytes, dst: bytes, m: wcm.Rep) -> None:
        key = (dst, src, m.remote_comm_id, m.local_comm_id)
        if key in self._conns or key in self._closed:
            return  # a repeated REP (IBA 12.9.5)
        hit = self._reqs.pop((dst, src, m.remote_comm_id), None)
        if hit is None:
            self._cm_fail(index, f"REP (comm ID {m.local_comm_id:#x}) answers no REQ (remote "
                                 f"comm ID {m.remote_comm_id:#x})")
            return
        req, rframe = hit
        mtu = _mtu_of(req.path_mtu)
        tst = Transport.UC if req.transport_service_type == wcm.TransportServiceType.UC \
            else Transport.RC
        name = f"{_ip(dst)} QP {req.local_qpn:#x} <-> {_ip(src)} QP {m.local_qpn:#x}"
        conn = _Conn(name, tst, {x for x in MTUS if not mtu or x <= mtu},
                     qpns=(req.local_qpn, m.local_qpn), ips=(dst, src))
        self._conns[key] = conn
        # Linux's convention (cm.c): the active side sends from the REP's Starting PSN,
        # the passive side from the REQ's.
        self._open_conn(conn, m.starting_psn, f"the REP (frame {index})",
                        req.starting_psn, f"the REQ (frame {rframe})", index)

    def _dreq(self, index: int, src: bytes, dst: bytes, m: wcm.Dreq) -> None:
        for key, side in (((src, dst, m.local_comm_id, m.remote_comm_id), 0),
                          ((dst, src, m.remote_comm_id, m.local_comm_id), 1)):
            if key in self._closed:
                return  # a repeated DREQ (IBA 12.9.7)
            conn = self._conns.get(key)
            if conn is None:
                continue
            if m.remote_qpn_eecn != conn.qpns[1 - side]:
                self._cm_fail(index, f"DREQ names QPN {m.remote_qpn_eecn:#x}; {conn.name} "
                                     f"has {conn.qpns[1 - side]:#x} there")
            elif side not in conn.dreq_from:
                conn.dreq_from.add(side)
                self._note(index, f"{conn.name}: DREQ")
            return
        self._cm_fail(index, f"DREQ (comm IDs {m.local_comm_id:#x}/{m.remote_comm_id:#x}) for "
                             f"no connection the capture opened")

    def _drep(self, index: int, src: bytes, dst: bytes, m: wcm.Drep) -> None:
        for key, side in (((src, dst, m.local_comm_id, m.remote_comm_id), 0),
                          ((dst, src, m.remote_comm_id, m.local_comm_id), 1)):
            if key in self._closed:
                return  # a repeated DREP
            conn = self._conns.get(key)
            if conn is None:
                continue
            if 1 - side not in conn.dreq_from:
                self._cm_fail(index, f"DREP on {conn.name} without a DREQ from the peer")
                return
            del self._conns[key]
            self._closed.append(key)
            self._close(conn)
            self._note(index, f"{conn.name}: closed (DREP)")
            return
        self._cm_fail(index, f"DREP (comm IDs {m.local_comm_id:#x}/{m.remote_comm_id:#x}) for "
                             f"no connection the capture opened")
