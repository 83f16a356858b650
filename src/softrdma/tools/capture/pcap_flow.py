"""One flow of a RoCE capture checked against the transport rules (IBA 9.7): its model
(:class:`Finding`, the flows and connections) and :class:`FlowChecker`, which checks a
flow's requests (first PSN, sequence, gaps, RDMA READ spans; IBA 9.7.1, 9.7.2, 9.7.4.1.3)
and the peer's responses (ACK/NAK, READ responses, atomic ACKs, MSN; IBA 9.7.5.1.1).
The rules are listed in :mod:`.pcap_conv`, whose :class:`~.pcap_conv.ConversationChecker`
follows the connections' setup (the CM, the 18515 exchange) on top of it.
"""

from __future__ import annotations

import ipaddress
from collections import deque
from dataclasses import dataclass, field

from ...wire import ib
from ...wire.opcodes import Hdr, Kind, Pos, Transport
from .pcap_oob import gid_to_ip

__all__ = ["Finding", "FlowChecker", "MTUS", "GSI_QPN", "psn_delta"]

PSN_MOD = 1 << 24
PSN_HALF = 1 << 23
MTUS = (256, 512, 1024, 2048, 4096)  # the PMTUs (REQ path MTU codes 1..5, IBA 12.6 REQ, body offset 50)
GSI_QPN = 1
MAX_TRACKED = 1 << 16  # per flow: unacknowledged messages, gaps
MAX_READS = 1024  # per flow: the READ requests remembered (retries and duplicates answered)
_LAST = Pos.LAST
_FIRST = Pos.FIRST


def psn_delta(a: int, b: int) -> int:
    """``a - b`` in the 24-bit PSN space, in ``[-2^23, 2^23)`` (IBA 9.7.2)."""
    return ((a - b + PSN_HALF) % PSN_MOD) - PSN_HALF


def ip_text(b: bytes) -> str:
    return str(ipaddress.ip_address(b))


def canon(addr: bytes) -> bytes:
    """One key per node: a RoCEv1 GRH's IPv4-mapped GID is its IPv4 address (RoCEv2)."""
    return gid_to_ip(addr) or addr


def mtu_of(code: int) -> int:
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
class Flow:
    """One side's requests (``requester``) and the peer's responses."""

    name: str
    next: int  # the next new request PSN
    first: int
    source: str  # where ``first`` was announced
    conn: Conn
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


SERVICE_NAME: dict[int, str] = {Transport.RC: "an RC", Transport.UC: "a UC",
                                 Transport.XRC: "an XRC"}


@dataclass(eq=False, slots=True)
class Conn:
    name: str
    transport: int | None  # Transport.RC / UC / XRC; None until the first packet (18515)
    mtus: set[int]
    keys: list[tuple[bytes, bytes, int]] = field(default_factory=list)
    flows: dict[int, Flow] = field(default_factory=dict)  # side 0 / 1
    qpns: tuple[int, int] = (0, 0)
    ips: tuple[bytes, bytes] = (b"", b"")
    #: the sides that sent a DREQ (both, when the two ends disconnect at once: each
    #: answers the other's DREQ with a DREP, IBA 12.9.8.3 / Linux cm.c cm_dreq_handler
    #: in IB_CM_DREQ_SENT)
    dreq_from: set[int] = field(default_factory=set)


class FlowChecker:
    """The per-flow checks; collects :class:`Finding` s in ``findings``."""

    def __init__(self) -> None:
        self.findings: list[Finding] = []

    def _flow_end(self, f: Flow) -> None:
        if f.failed or not f.gaps:
            return
        g = f.gaps[0]
        self._fail(f, g.frame, self._gap_text(f, g) + " and no response accounts for them")

    def _gap_text(self, f: Flow, g: _Gap) -> str:
        if g.frame == f.first_frame and g.start == f.first:
            return (f"first request PSN {g.end:#08x} is not the Starting PSN {f.first:#08x} "
                    f"announced in {f.source}")
        n = (g.end - g.start) % PSN_MOD
        return (f"PSN {g.start:#08x}..{(g.end - 1) % PSN_MOD:#08x} ({n} PSNs) missing "
                f"before this request")

    # ---- findings ---------------------------------------------------------------------
    def _note(self, frame: int, text: str) -> None:
        self.findings.append(Finding(frame, text, note=True))

    def _fail(self, f: Flow, frame: int, text: str) -> None:
        if f.failed:
            return
        f.failed = True
        self.findings.append(Finding(frame, f"{f.name}: {text}"))


    # ---- packets ----------------------------------------------------------------------
    def _learn_mtu(self, f: Flow, index: int, size: int, what: str) -> bool:
        mtus = f.conn.mtus
        if size in mtus:
            if len(mtus) > 1:
                mtus.intersection_update((size,))
            return True
        self._fail(f, index, f"{what} of {size} bytes is not a message's last packet, so it "
                             f"must be one PMTU ({'/'.join(map(str, sorted(mtus)))})")
        return False

    @staticmethod
    def _spans(f: Flow, length: int) -> list[int]:
        """The PSNs an RDMA READ of ``length`` bytes may take, for each PMTU still possible."""
        mtus = f.conn.mtus
        if len(mtus) == 1:
            for m in mtus:
                return [max(1, -(-length // m))]
        return sorted({max(1, -(-length // m)) for m in mtus})

    def _request(self, f: Flow, index: int, p: ib.IBPacket) -> None:
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
    def _add_read(f: Flow, r: _Read) -> None:
        f.reads.pop(r.psn, None)
        if len(f.reads) >= MAX_READS:  # far more than any responder keeps outstanding
            del f.reads[next(iter(f.reads))]
        f.reads[r.psn] = r

    def _advance(self, f: Flow, index: int, p: ib.IBPacket) -> None:
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
    def _sent(self, f: Flow, psn: int) -> bool:
        return f.started and psn_delta(psn, f.first) >= 0 and psn_delta(psn, f.next) < 0

    def _response(self, f: Flow, index: int, p: ib.IBPacket) -> None:
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

    def _lost_requests(self, f: Flow, index: int, psn: int, text: str) -> None:
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

    def _read_response(self, f: Flow, index: int, p: ib.IBPacket) -> None:
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
    def _read_fit(f: Flow, r: _Read, p: ib.IBPacket, spans: list[int], off: int) -> str:
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

    def _msn(self, f: Flow, index: int, through: int, msn: int, what: str) -> None:
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
