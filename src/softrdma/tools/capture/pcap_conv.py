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

from collections import deque

from ...errors import SoftRdmaError
from ...wire import cm as wcm
from ...wire.opcodes import Transport
from ...wire.roce import RoceFrame
from .pcap_flow import (
    GSI_QPN,
    MAX_TRACKED,
    MTUS,
    PSN_MOD,
    SERVICE_NAME,
    Conn,
    Finding,
    Flow,
    FlowChecker,
    canon,
    ip_text,
    mtu_of,
    psn_delta,
)
from .pcap_oob import OobPair

__all__ = ["Finding", "ConversationChecker", "MTUS", "psn_delta"]

MAX_CLOSED = 4096  # closed connections remembered (for retransmitted DREQ/DREP)


class ConversationChecker(FlowChecker):
    """Feeds on RoCE frames and 18515 pairs; collects :class:`Finding` s in ``findings``
    (the caller drains the list as it goes: memory stays flat)."""

    def __init__(self) -> None:
        super().__init__()
        self.followed = 0
        self._keys: dict[tuple[bytes, bytes, int], tuple[Conn, int]] = {}
        self._reqs: dict[tuple[bytes, bytes, int], tuple[wcm.Req, int]] = {}
        self._conns: dict[tuple[bytes, bytes, int, int], Conn] = {}  # by comm IDs
        self._closed: deque[tuple[bytes, bytes, int, int]] = deque(maxlen=MAX_CLOSED)
        self._open: dict[Conn, None] = {}  # ordered: findings come in a stable order

    # ---- setup -------------------------------------------------------------------------
    def feed_oob(self, pair: OobPair) -> None:
        """A QP pair from the 18515 exchange: each side's PSN is the one it sends from."""
        c, s = pair.client, pair.server
        name = (f"{ip_text(c.ip)} QP {c.qpn:#x} <-> {ip_text(s.ip)} QP {s.qpn:#x}")
        conn = Conn(name, None, set(MTUS), ips=(c.ip, s.ip), qpns=(c.qpn, s.qpn))
        self._open_conn(conn, c.psn, f"its {c.tool} message (frame {c.frame})",
                        s.psn, f"its {s.tool} message (frame {s.frame})", max(c.frame, s.frame))

    def _open_conn(self, conn: Conn, psn0: int, src0: str, psn1: int, src1: str,
                   frame: int) -> None:
        a, b = conn.ips
        qa, qb = conn.qpns
        for side, (psn, src) in enumerate(((psn0, src0), (psn1, src1))):
            who = (f"{ip_text(a)} QP {qa:#x} -> {ip_text(b)} QP {qb:#x}" if side == 0
                   else f"{ip_text(b)} QP {qb:#x} -> {ip_text(a)} QP {qa:#x}")
            conn.flows[side] = Flow(who, psn, psn, src, conn, acked_x=(psn - 1) % PSN_MOD)
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
        self._note(frame, f"{conn.name}: opened; requests from {ip_text(a)} start at PSN "
                          f"{psn0:#08x} ({src0}), from {ip_text(b)} at {psn1:#08x} ({src1})")

    def _close(self, conn: Conn) -> None:
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
        hit = self._keys.get((canon(f.src_ip), canon(f.dst_ip), p.dqpn))
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
            self._fail(flow, index, f"{p.info.name} on {SERVICE_NAME[conn.transport]} connection")
            return
        if p.info.is_request:
            self._request(conn.flows[side], index, p)
        elif p.info.is_response:
            self._response(conn.flows[1 - side], index, p)

    def _mad(self, index: int, f: RoceFrame) -> None:
        try:
            mad = wcm.decode(f.packet.payload)
        except SoftRdmaError:
            return  # not a CM message, or a bad one the packet checks report
        m = mad.msg
        src, dst = canon(f.src_ip), canon(f.dst_ip)
        if isinstance(m, wcm.Req):
            if _service(m) is not None:
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
        mtu = mtu_of(req.path_mtu)
        tst = _service(req)
        assert tst is not None  # only such REQs are kept
        # an XRC TGT QP's number is the REP's Local EE Context Number (linux cm_format_rep)
        qpn = m.local_eecn if tst == Transport.XRC else m.local_qpn
        name = f"{ip_text(dst)} QP {req.local_qpn:#x} <-> {ip_text(src)} QP {qpn:#x}"
        conn = Conn(name, tst, {x for x in MTUS if not mtu or x <= mtu},
                     qpns=(req.local_qpn, qpn), ips=(dst, src))
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


def _service(req: wcm.Req) -> int | None:
    """The transport a REQ sets up (IBA 12.6.5 Transport Service Type: RC, UC, or 3 with
    Extended Transport Type 1 for XRC, Annex A14), None for one not followed."""
    tst = req.transport_service_type
    if tst == wcm.TransportServiceType.RC:
        return int(Transport.RC)
    if tst == wcm.TransportServiceType.UC:
        return int(Transport.UC)
    if tst == wcm.TransportServiceType.EXTENDED and req.extended_transport_type == 1:
        return int(Transport.XRC)
    return None
