"""The send side of a QP: the requester (IBA 9.7.1-9.7.6, 9.9.2; rxe_req.c).

Send WQEs stay in ``sq`` until they complete, in order. ``tx_idx``/``tx_pkt`` point at
the next packet to (re)transmit; PSNs are given to a WQE when it is first started and
kept for retransmissions (go-back-N from the oldest unacknowledged PSN, IBA 9.7.6.1: the
cursor rules are softrdma.ib.go_back's, a base of :class:`Requester`).

* RC: the WQE completes when an ACK covers its last PSN (SEND, WRITE), when the last
  read response arrives (READ) or when the atomic acknowledge arrives: what comes back
  is the completer's (softrdma.ib.completer).
* UC and UD: the WQE completes once its last packet has been handed to the driver.

Every SEND/WRITE packet is queued by :meth:`Requester._send_pkt` (the first, last or
only packet's headers are built there; a MIDDLE's come from
:meth:`Requester._middle_headers`), except the runs of MIDDLE packets sent in one tight
loop (:meth:`Requester.emit_middles`: most packets of a large message, IBA 9.7.1), whose
headers come from :meth:`Requester._middle_headers` too. The general loop
(:meth:`Requester.pump`) and a message of one packet sent as it is posted
(:meth:`Requester.post_one`: the ping-pong's message, without the loop) both use
``_send_pkt``, so their bytes are the same (tests/ib/test_fastpath.py compares them with the
general path byte for byte). Per WR opcode tables, READ/atomic request packets and local
operations are softrdma.ib.send_ops'.
"""

from __future__ import annotations

from collections import deque

from ..enums import ibv_send_flags as SF
from ..enums import ibv_wc_status as WCS
from ..seam.events import AsyncEventType
from ..seam.memory import gather, resolve_sges
from ..seam.queues import take_done
from ..seam.states import QPT_RC, QPT_UC, QPT_UD, RTS, SQD, SQE
from ..seam.types import (
    PSN_MASK,
    WQE_DONE,
    WQE_SENDING,
    WQE_SENT,
    WQE_UNSENT,
    SendWQE,
    WorkCompletion,
    psn_diff,
)
from ..wire import ib as wib
from ..wire import opcodes as op
from ..wire.mad import GSI_QKEY
from . import req_fast
from .congestion import MAX_WINDOW, MIN_WINDOW, RetransmitTimer, Window
from .go_back import GoBackN
from .pacing import ICRC_BYTES, Pacer
from .packet import ICRC_SIZE, TxPacket
from .send_ops import MSG_OPS as _MSG_OPS
from .send_ops import ONE_PACKET as _ONE_PACKET
from .send_ops import RD_ATOMIC as _RD_ATOMIC
from .send_ops import W_BIND_MW as _W_BIND_MW
from .send_ops import W_LOCAL_INV as _W_LOCAL_INV
from .send_ops import W_READ as _W_READ
from .send_ops import WC_OPCODE, local_operation, send_request, ud_qkey
from .views import QpView

UNSENT, SENDING, SENT, DONE = WQE_UNSENT, WQE_SENDING, WQE_SENT, WQE_DONE

MAX_INFLIGHT = MAX_WINDOW  # unacknowledged PSNs (rxe: RXE_MAX_UNACKED_PSNS = 128)
_SIGNALED = int(SF.IBV_SEND_SIGNALED)  # plain ints: IntFlag '&' is slow per WR
_FENCE = int(SF.IBV_SEND_FENCE)
_SOLICITED = int(SF.IBV_SEND_SOLICITED)
MIN_CWND = MIN_WINDOW  # the send window never shrinks below this many PSNs

_ACCESS_LOCAL_WRITE = 1

#: AckReq every N packets of a long message (rxe: RXE_MAX_PKT_PER_ACK)
ACKREQ_EVERY = 32
_BTH = wib.bth
_BTH_SIZE = op.BTH_SIZE
_UC = int(op.Transport.UC)


class Requester(GoBackN):
    """Requester of one QP (its completer: softrdma.ib.completer.Completer)."""

    def __init__(self, qp: QpView) -> None:
        self.qp = qp
        self.sq: deque[SendWQE] = deque()
        self.tx_idx = 0
        self.tx_pkt = 0
        self.next_psn = 0
        self.rnr_wait = False  # waiting out an RNR NAK's timer (set by the completer)
        self.rnr_psn = 0
        self.rd_atomic_out = 0
        self.acked_psn = PSN_MASK  # last PSN covered by an ACK
        # Send window in PSNs (softrdma.ib.congestion): AIMD, cut on loss signals and
        # CNPs, capped by the peer's budget. Not a wire rule (IBA leaves the window to the
        # requester, rxe uses a fixed 128); ``cwnd`` is ``window.size()``, read per packet.
        self.window = Window()
        self.cwnd = self.window.size()
        # the transport timer's period (IBA 9.7.6.1.3, adaptive: softrdma.ib.congestion)
        self.timer = RetransmitTimer(qp.qpn)
        self._timer_code = -1  # the QP ``timeout`` the timer was configured for
        self.ack_edge = False
        # After a go-back: packets sent before the PSN in here are retransmissions
        # (counted in ``retransmitted_pkts``); None while sending new packets.
        self.resend_until: int | None = None
        self.pacer = Pacer(self.pump)

    # ---- queue management ---------------------------------------------------------------
    def depth(self) -> int:
        return len(self.sq)

    def outstanding(self) -> int:
        return sum(1 for w in self.sq if w.state in (SENDING, SENT))

    def in_flight(self) -> bool:
        """Whether any WQE has packets in flight (``outstanding() > 0``, without counting)."""
        for w in self.sq:
            s = w.state
            if s == SENDING or s == SENT:
                return True
        return False

    def set_psn(self, psn: int) -> None:
        self.next_psn = psn & PSN_MASK
        self.acked_psn = (psn - 1) & PSN_MASK

    def reset(self) -> None:
        self.sq.clear()
        self.qp.acked_ahead = False
        self.tx_idx = self.tx_pkt = 0
        self.rnr_wait = False
        self.rd_atomic_out = 0
        self.resend_until = None
        budget = self.window.budget  # the driver's cap outlives a reset
        self.window = Window()
        self.window.budget = budget
        self.cwnd = self.window.size()
        self._timer_code = -1

    @staticmethod
    def _admit(wqe: SendWQE, sig_all: bool) -> None:
        """A WQE joins the send queue: whether it completes signaled (IBA 10.8.3; the
        QP's sq_sig_all), and whether it is a READ or atomic (an atomic's 8 bytes)."""
        wqe.signaled = wqe.send_flags & _SIGNALED != 0 or sig_all
        o = wqe.opcode
        if o in _RD_ATOMIC:
            wqe.rd_atomic = True
            if o != _W_READ:
                wqe.length = 8
        else:
            wqe.rd_atomic = False

    def post(self, wqe: SendWQE, now: float) -> None:
        qp = self.qp
        self._admit(wqe, qp.init.sq_sig_all)
        sq = self.sq
        sq.append(wqe)
        qp.acked_ahead = False
        n = len(sq)
        if n == 1 or self.tx_idx == n - 1:
            if (self.resend_until is None and not self.rnr_wait and qp.state == RTS
                    and qp.fast_post and qp.port.fast_paths and self.post_one(wqe, now)):
                return
            self.pump(now)

    def post_ud_run(self, wqes: list[SendWQE], now: float) -> None:
        """:meth:`post` of each of ``wqes`` (UD sends the caller checked as
        ``EngineQP.post_sends`` does: QP in RTS, room in the queue), then one
        :meth:`pump` for the run: the general path on a batch. A UD WQE is one packet
        that completes when it is sent (IBA 9.8.2, 10.8.3), so posting them one by one
        would pump and complete each on its own; here the loop of :meth:`pump` sends the
        run's packets and its :meth:`complete_head` completes them, in posting order."""
        qp = self.qp
        sig_all = qp.init.sq_sig_all
        sq = self.sq
        idle = self.tx_idx == len(sq)  # as post's test for the first of the run
        admit = self._admit
        for wqe in wqes:
            admit(wqe, sig_all)
            sq.append(wqe)
        qp.acked_ahead = False
        if idle:
            if qp.port.fast_paths:  # the run's packets in one loop, then pump for the rest
                self.tx_idx, self.next_psn = req_fast.emit_ud_run(qp, sq, self.tx_idx,
                                                                  self.next_psn)
                self.tx_pkt = 0
            self.pump(now)

    # ---- transmission -----------------------------------------------------------------------
    def pump(self, now: float) -> None:
        """Send as many packets as the window, rd_atomic limit and fences allow."""
        qp = self.qp
        st = qp.state
        if st != RTS and st != SQD:
            return
        sq = self.sq
        rc = qp.qp_type == QPT_RC
        sent = False
        while self.tx_idx < len(sq) and not self.rnr_wait:
            wqe = sq[self.tx_idx]
            s = wqe.state
            if s == DONE:  # completed under the cursor (an ACK overtook a retransmission)
                idx = self.tx_idx
                self._overtaken()  # may move the cursor on
                if self.tx_idx == idx:
                    self.tx_idx += 1
                    self.tx_pkt = 0  # the packet cursor belonged to that WQE
                continue
            if s == UNSENT:
                if qp.state != RTS:
                    break
                if wqe.opcode == _W_LOCAL_INV or wqe.opcode == _W_BIND_MW:
                    status = local_operation(qp, wqe)
                    if status:
                        self.fail(wqe, status)
                        return
                    wqe.state = DONE
                    self.tx_idx += 1
                    continue
                if rc:
                    if wqe.send_flags & _FENCE and self.rd_atomic_out > 0:
                        break
                    if wqe.rd_atomic and self.rd_atomic_out >= max(1, qp.max_rd_atomic):
                        break
                if not self._start(wqe):
                    return
            head = None
            if rc and sq[0].state != UNSENT:
                head = self.una()
                if head is not None:
                    d = psn_diff((wqe.first_psn + self.tx_pkt) & PSN_MASK, head)
                    if d < 0 and not wqe.rd_atomic:
                        # An ACK overtook the resend cursor inside this WQE (the loss
                        # signal was spurious: the ACK was late, not lost): the packets
                        # before ``head`` are acknowledged, resending them only makes
                        # duplicates (IBA 9.7.5.1.2: an ACK covers every earlier PSN).
                        self.tx_pkt -= d
                        if self.resend_until is not None:
                            self._overtaken()  # may move the cursor on
                            continue
                        d = 0
                    if d >= self.cwnd:
                        break
                    self.ack_edge = d + 1 >= self.cwnd
            if self.resend_until is not None:
                self._count_resend(wqe)
            av = wqe.ah if wqe.ah is not None else qp.av
            bps = av.rate_bps if av is not None else 0.0
            lim = qp.rate_limit_bps
            if lim and (not bps or lim < bps):
                bps = lim
            k = self.tx_pkt
            if (head is not None and not bps and 0 < k < wqe.npkts - 1 and qp.av is not None
                    and self.resend_until is None and wqe.segs and qp.fast_rc
                    and qp.port.fast_paths and wqe.opcode in _MSG_OPS):
                self.tx_pkt = self.emit_middles(wqe, k, head)  # a run of MIDDLEs at once
                sent = True
                continue
            if bps:  # static rate control (IBA 9.11, CA16-15.1.1)
                pacer = self.pacer
                if pacer.must_wait(now):
                    pacer.deadline = pacer.next_at
                    qp.port.arm(pacer)
                    break
                tx = qp.port.tx
                n_before = len(tx)
                self._send_pkt(wqe)
                if len(tx) > n_before:
                    pacer.sent(tx[-1].length + ICRC_BYTES, bps, now)
                sent = True
                continue
            self._send_pkt(wqe)
            sent = True
        if rc and sent and qp.deadline is None and qp.timeout:
            qp.set_deadline(now + self.timer_period())
        if not rc or (sq and sq[0].state == DONE):  # local operations (LOCAL_INV, BIND_MW)
            self.complete_head()

    def timer_period(self) -> float:
        """Seconds the transport timer runs now: at least the Local ACK Timeout, at most
        four times it (IBA 9.7.6.1.3; adaptive, softrdma.ib.congestion.RetransmitTimer)."""
        t = self.timer
        code = self.qp.timeout
        if code != self._timer_code:
            self._timer_code = code
            t.configure(wib.ack_timeout_s(code))
        return t.period

    def set_peer_budget(self, packets: int | None) -> None:
        """Cap the send window at ``packets`` PSNs: what the peer's receive buffer can
        absorb, as the driver knows it (None: no cap). Takes effect on the next packet."""
        self.window.set_peer_budget(packets)
        self.cwnd = self.window.size()

    def on_cnp(self, now: float) -> None:
        """A RoCEv2 CNP for this QP (DCQCN reaction point): cut the window, resend nothing."""
        self.window.on_cnp(self.next_psn)
        self.cwnd = self.window.size()

    def una(self) -> int | None:
        """Oldest unacknowledged PSN, or None when nothing is outstanding."""
        for w in self.sq:
            if w.state == SENDING or w.state == SENT:
                if w.opcode == _W_READ:
                    return (w.first_psn + w.read_received // self.qp.mtu) & PSN_MASK
                nxt = (self.acked_psn + 1) & PSN_MASK
                if psn_diff(nxt, w.first_psn) > 0 and psn_diff(nxt, w.last_psn) <= 0:
                    return nxt
                return w.first_psn
            if w.state == UNSENT:
                return None
        return None

    def _start(self, wqe: SendWQE) -> bool:
        """Resolve local keys and assign PSNs (IBA 9.7.1); False on a local error."""
        qp = self.qp
        inline = wqe.inline_data
        rd = wqe.rd_atomic
        if inline is not None:
            wqe.segs = [memoryview(inline)]
        else:
            segs = resolve_sges(qp.port.mrs, qp.pd, wqe.sg_list, _ACCESS_LOCAL_WRITE if rd else 0)
            if segs is None:
                self.fail(wqe, WCS.IBV_WC_LOC_PROT_ERR)
                return False
            wqe.segs = segs
        length = wqe.length
        mtu = qp.mtu
        psn = self.next_psn
        wqe.first_psn = psn
        if length <= mtu or (rd and wqe.opcode != _W_READ):  # one packet (an atomic: 8 bytes)
            wqe.npkts = 1
            wqe.last_psn = psn
            self.next_psn = (psn + 1) & PSN_MASK
        elif qp.qp_type == QPT_UD:  # UD: one packet per message (IBA 9.8.2)
            self.fail(wqe, WCS.IBV_WC_LOC_LEN_ERR)
            return False
        else:
            npkts = (length + mtu - 1) // mtu
            wqe.npkts = npkts
            wqe.last_psn = (psn + npkts - 1) & PSN_MASK
            self.next_psn = (psn + npkts) & PSN_MASK
        wqe.state = SENDING
        if rd:
            self.rd_atomic_out += 1
        self.tx_pkt = 0
        return True

    def post_one(self, wqe: SendWQE, now: float) -> bool:
        """Send RC ``wqe``, just posted as the only unsent WQE of an RTS QP, if it is a
        message of one packet (SEND, SEND with immediate, RDMA WRITE, RDMA WRITE with
        immediate, at most the path MTU) that the window admits, without the general
        loop; returns False, having changed nothing, for anything else (:meth:`pump`
        then runs). The caller checked: RC fast paths on (``qp.fast_post``: an RC QP with
        an address vector without static rate), QP in RTS, no RNR wait, not retransmitting.

        It is :meth:`pump` for that one case: :meth:`_start` (PSN, IBA 9.7.1), the
        window check, :meth:`_send_pkt` (an ONLY opcode, IBA 9.2.1, with AckReq: the
        end of a message), the ACK timer (IBA 9.7.6.1.3).
        """
        qp = self.qp
        if (wqe.opcode not in _ONE_PACKET or wqe.length > qp.mtu or wqe.send_flags & _FENCE
                or wqe.ah is not None or qp.rate_limit_bps):
            return False
        # The window (as in pump): the oldest unacknowledged PSN is an older WQE's, or
        # this one's own (distance 0) when nothing older is outstanding.
        cwnd = self.cwnd
        first = self.sq[0]
        if first is wqe:
            self.ack_edge = cwnd <= 1
        else:
            una = self.una()
            d = 0 if una is None else psn_diff(self.next_psn, una)
            if d >= cwnd:
                return False
            self.ack_edge = d + 1 >= cwnd
        if not self._start(wqe):
            return True  # completed in error, as pump would have
        self._send_pkt(wqe)
        if qp.deadline is None and qp.timeout:
            qp.set_deadline(now + self.timer_period())
        if first is not wqe and first.state == DONE:
            self.complete_head()
        return True

    def emit_middles(self, wqe: SendWQE, k: int, head: int) -> int:
        """Queue the MIDDLE packets of RC ``wqe`` from packet index ``k`` (0 < k < npkts-1)
        up to its last packet (excluded) or the send window's edge, in one loop (no opcode
        dispatch, no window recomputation, no per-packet counter updates); returns the
        index of the next packet to send. Their headers are :meth:`_middle_headers`' for the run.

        ``head`` is the oldest unacknowledged PSN: it does not move while packets are
        queued (ACKs are processed between calls), so the window is checked by counting.
        The caller has checked that packet ``k`` fits in the window, so at least one is sent.
        """
        qp = self.qp
        port = qp.port
        av = qp.av
        assert av is not None
        gids = port.gids
        i = av.sgid_index if av.sgid_index < len(gids) else 0
        sgid, dgid, sport = gids[i], av.dgid, qp.sport
        tclass, hop, flow, v1, sl = av.traffic_class, av.hop_limit, av.flow_label, port.gid_v1[i], av.sl
        mtu = qp.mtu
        length = _BTH_SIZE + mtu
        room = self.cwnd - psn_diff((wqe.first_psn + k) & PSN_MASK, head)
        n = wqe.npkts - 1 - k
        if room < n:
            n = room
        self.ack_edge = n == room  # the run fills the window: its last packet asks an ACK
        segs = wqe.segs or []
        seg = segs[0] if len(segs) == 1 else None
        append = port.tx.append
        off = k * mtu
        for hdr in self._middle_headers(wqe, k, n):
            if seg is not None:
                parts: list[bytes | bytearray | memoryview] = [hdr, seg[off:off + mtu]]
            else:
                parts = [hdr, *gather(segs, off, mtu)]
            append(TxPacket(sgid, dgid, sport, parts, length, tclass, hop, flow, v1, sl))
            off += mtu
        c = port.counters
        c.sent_pkts += n
        c.sent_bytes += n * (length + ICRC_SIZE)
        qp.counters.sent_pkts += n
        return k + n

    def _middle_headers(self, wqe: SendWQE, k: int, n: int) -> list[bytes]:
        """The BTHs of MIDDLE packets ``k`` .. ``k + n - 1`` of SEND/WRITE ``wqe`` (IBA
        9.2.1, Table 35; 0 < k, k + n < npkts): the transport's MIDDLE opcode, no SE, no
        pad, and for RC the AckReq bit every :data:`ACKREQ_EVERY` packets of the message
        and on the last packet of the run when it fills the window (``ack_edge``; IBA
        9.7.5.1.1). The other packets' headers are :meth:`_send_pkt`'s."""
        qp = self.qp
        qtype = qp.qp_type
        middle = _MSG_OPS[wqe.opcode][0][0]
        ackreq = [False] * n
        if qtype == QPT_RC:
            for j in range((ACKREQ_EVERY - 1 - k) % ACKREQ_EVERY, n, ACKREQ_EVERY):
                ackreq[j] = True
            if self.ack_edge:
                ackreq[-1] = True
        elif qtype == QPT_UC:
            middle |= _UC
        return wib.bth_run(middle, qp.pkey, qp.dest_qpn, wqe.first_psn + k, ackreq)

    def _send_pkt(self, wqe: SendWQE) -> None:
        """Queue the next packet (``tx_pkt``) of the started ``wqe``.

        A SEND/WRITE packet's headers: a MIDDLE's are :meth:`_middle_headers`' (a run of
        one); the first, last or only packet gets the opcode of its position and transport
        (IBA 9.2.1, Table 35), an RETH on a WRITE's first packet (IBA 9.3.3), a DETH for UD
        (IBA 9.8.3), ImmDt or IETH on the last (IBA 9.3.7-9.3.8), the Solicited Event bit
        on the last as asked (a WRITE sets it only with immediate), PadCnt, and for RC the
        AckReq bit at the end of the message, every :data:`ACKREQ_EVERY` packets and when
        the packet fills the window (``ack_edge``; IBA 9.7.5.1.1)."""
        pkts = _MSG_OPS.get(wqe.opcode)
        if pkts is None:  # an RDMA READ or atomic: one request packet, with AckReq
            send_request(self.qp, wqe)
            wqe.state = SENT
            self.tx_idx += 1
            self.tx_pkt = 0
            return
        qp = self.qp
        qtype = qp.qp_type
        k = self.tx_pkt
        mtu = qp.mtu
        off = k * mtu
        plen = wqe.length - off
        if plen > mtu:
            plen = mtu
            last = False
            ops = pkts[1] if not k else None  # the first, or a MIDDLE
        else:  # the last (plen > 0) or the only packet
            last = True
            ops = pkts[2] if k else pkts[3]
        if ops is None:
            hdr = self._middle_headers(wqe, k, 1)[0]
        else:
            opcode, reth, after, se_ok = ops
            ext = wib.reth(wqe.remote_addr, wqe.rkey, wqe.length) if reth else b""
            if qtype == QPT_RC:
                ackreq = last or self.ack_edge or k % ACKREQ_EVERY == ACKREQ_EVERY - 1
                dqpn = qp.dest_qpn
            elif qtype == QPT_UC:
                opcode |= _UC
                ackreq = False
                dqpn = qp.dest_qpn
            else:  # UD: SEND_ONLY(_IMM) + DETH (IBA 9.8.3)
                opcode = op.UD_SEND_ONLY_IMM if after == 1 else op.UD_SEND_ONLY
                if qp.qpn == 1:
                    qkey = GSI_QKEY
                else:
                    qkey = ud_qkey(wqe.remote_qkey, qp.qkey)
                ext = wib.deth(qkey, qp.qpn)
                dqpn = wqe.remote_qpn
                ackreq = False
            if after:
                ext += wib.immdt(wqe.imm_data if after == 1 else wqe.invalidate_rkey)
            # SE as asked, on the last packet; a WRITE sets it only with immediate (IBA 9.2.1)
            se = se_ok and wqe.send_flags & _SOLICITED != 0
            hdr = _BTH(opcode, qp.pkey, dqpn, wqe.first_psn + k, se, -plen & 3, ackreq) + ext
        segs = wqe.segs
        if not plen or not segs:
            parts: list[bytes | bytearray | memoryview] = [hdr]
        elif not off and last:  # the whole message: its buffers as they are
            parts = [hdr, *segs]
        else:
            parts = [hdr, *gather(segs, off, plen)]
        pad = -plen & 3
        if pad:
            parts.append(wib.pad_bytes(plen))
        if qtype == QPT_UD:
            qp.tx(parts, len(hdr) + plen + pad, wqe.ah)
        else:
            qp.tx(parts, len(hdr) + plen + pad)
        if last:  # the message is sent (_advance)
            wqe.state = SENT if qtype == QPT_RC else DONE
            self.tx_idx += 1
            self.tx_pkt = 0
        else:
            self.tx_pkt = k + 1

    # ---- completion (the completer calls it; going back: softrdma.ib.go_back) -------------
    def complete_head(self) -> None:
        qp = self.qp
        done = False
        for w in take_done(self.sq, DONE):
            done = True
            if self.tx_idx:
                self.tx_idx -= 1
            else:
                # The cursor was on the WQE just completed (an ACK covered it while it was
                # being retransmitted): the next WQE starts at its first packet, not at the
                # old WQE's packet index (which would send past the end of its message).
                self.tx_pkt = 0
            if w.signaled:
                qp.complete_send(WorkCompletion(w.wr_id, WCS.IBV_WC_SUCCESS, WC_OPCODE[w.opcode],
                                                qp.qpn, w.length))  # byte_len
        if done and not self.sq:
            qp.acked_ahead = True  # every request acknowledged (Responder.schedule_ack)

    # ---- errors -----------------------------------------------------------------------------
    def fail(self, wqe: SendWQE, status: int) -> None:
        """Complete ``wqe`` in error (always, even unsignaled: IBA 10.7.3.1) and go to ERR."""
        qp = self.qp
        self.complete_head()
        try:
            self.sq.remove(wqe)
        except ValueError:
            pass
        qp.complete_send(WorkCompletion(wqe.wr_id, status, WC_OPCODE.get(wqe.opcode, 0), qp.qpn))
        if qp.qp_type != QPT_RC and qp.state in (RTS, SQD):
            # UC/UD: a send error stops the send queue only (SQE, IBA 10.3.1.6); the
            # receive queue keeps working and SQE -> RTS resumes sending.
            self.flush()
            qp.state = SQE
            return
        qp.to_error()

    def flush(self) -> None:
        """Flush every WQE not yet completed with IBV_WC_WR_FLUSH_ERR."""
        self.complete_head()
        sq = self.sq
        self.sq = deque()
        self.tx_idx = self.tx_pkt = 0
        self.rd_atomic_out = 0
        self.rnr_wait = False
        for w in sq:
            self.flush_one(w)

    def flush_one(self, wqe: SendWQE) -> None:
        qp = self.qp
        qp.complete_send(WorkCompletion(wqe.wr_id, WCS.IBV_WC_WR_FLUSH_ERR,
                                        WC_OPCODE.get(wqe.opcode, 0), qp.qpn))

    def check_drained(self) -> None:
        """SQD: raise SQ_DRAINED once no WQE is in flight (IBA 10.3.1.5)."""
        qp = self.qp
        if qp.state == SQD and not qp.sqd_notified and self.outstanding() == 0:
            qp.sqd_notified = True
            if qp.en_sqd_async_notify:
                qp.port.events.raise_event(AsyncEventType.SQ_DRAINED, qp)
