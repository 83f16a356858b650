"""The completer of a QP: what comes back for its requests (IBA 9.7.5.1-9.7.6; rxe_comp.c).

An RC requester's packets are answered by ACKs, NAKs, RNR NAKs, read responses and atomic
acknowledges. The completer matches each to the send WQEs of ``Requester.sq`` by PSN:

* an ACK completes the SEND/WRITE WQEs whose last PSN it covers (coalesced, IBA 9.7.5.1.2);
* read responses are placed in PSN order and complete the READ with the last one
  (IBA 9.7.5.1.4); atomic acknowledges carry the original data (IBA 9.7.5.1.4);
* a PSN sequence NAK or the transport timer goes back to the first unacknowledged PSN
  (go-back-N, IBA 9.7.6.1.3), at most ``retry_cnt`` times in a row; an RNR NAK waits the
  responder's RNR timer and then resends (IBA 9.7.5.2.8), at most ``rnr_retry`` times;
* lost read/atomic responses are re-requested, once per loss episode (IBA 9.7.5.1.5);
* any other NAK completes the WQE in error (IBA 9.7.5.2.3, Table 44) and moves to ERR.

The send queue, PSNs, window and timer belong to :class:`~softrdma.ib.requester.Requester`;
the completer changes them only through its public attributes and methods.
"""

from __future__ import annotations

import struct

from ..enums import ibv_wc_status as WCS
from ..enums import ibv_wr_opcode as WRO
from ..seam.memory import scatter
from ..seam.states import ERR, RTS, SQD, SQE
from ..seam.types import PSN_MASK, WQE_DONE, WQE_SENDING, WQE_SENT, WQE_UNSENT, SendWQE, psn_diff
from ..wire import ib as wib
from ..wire import opcodes as op
from .requester import Requester

__all__ = ["Completer", "NAK_STATUS", "RETRY_FOREVER"]

#: a QP's ``retry_cnt`` that never runs out. IBA 9.7.6.1.3 (C9-138) makes every value of
#: the 3-bit Retry Count a finite limit, but Linux rxe (rxe_comp.c, COMPST_ERROR_RETRY)
#: does not decrement a count of 7, so a transport timeout never fails a QP whose
#: ``retry_cnt`` is 7 there: softrdma, the software twin of rxe, does the same, so a live
#: peer that a loaded host keeps from answering for seconds is waited for (perftest,
#: ibv_rc_pingpong, rping and rdma-core's tests all set 7). Any other value is the
#: spec's finite count; a PSN sequence NAK retry is charged the same way.
RETRY_FOREVER = 7

UNSENT, SENDING, SENT, DONE = WQE_UNSENT, WQE_SENDING, WQE_SENT, WQE_DONE
_POS_LAST = int(op.Pos.LAST)
_W_READ = int(WRO.IBV_WR_RDMA_READ)
_HOST_U64 = struct.Struct("=Q")
_BTH_W2 = wib.U32.unpack_from

# NAK code -> requester completion status (IBA 9.7.5.2.3, rxe_comp.c check_ack).
NAK_STATUS = {
    wib.NAK_INVALID_REQUEST: WCS.IBV_WC_REM_INV_REQ_ERR,
    wib.NAK_REMOTE_ACCESS: WCS.IBV_WC_REM_ACCESS_ERR,
    wib.NAK_REMOTE_OP_ERR: WCS.IBV_WC_REM_OP_ERR,
    wib.NAK_INVALID_RD_REQUEST: WCS.IBV_WC_REM_INV_RD_REQ_ERR,
}


class Completer:
    """Completer of one QP, beside its :class:`Requester`."""

    def __init__(self, req: Requester) -> None:
        self.req = req
        self.qp = req.qp
        # the transport and RNR retries left (IBA 9.7.6.1.3, 9.7.5.2.8): full again on
        # every progress, set by modify_qp
        self.retry_left = 7
        self.rnr_left = 7
        # Late expiries not charged to retry_left (see on_timer), left in this episode
        # (full again on every progress), and their total for the QP's life.
        self.stall_left = 7
        self.stalled_expiries = 0
        # The read/atomic WQE whose lost responses were re-requested (IBA 9.7.5.1.5) and
        # not yet answered: further gaps or ACKs beyond it re-request it no more until it
        # completes or the transport timer expires (once per loss episode, as rxe's
        # completer does). Without this, every response of the re-requested stream that
        # moved the expected PSN re-armed the gap check: a READ request storm (issue 21).
        self.reread: SendWQE | None = None

    def reset(self) -> None:
        self.reread = None

    def on_response(self, pkt: wib.IBPacket, now: float) -> None:
        """Process an ACK, NAK, read response or atomic acknowledge (IBA 9.7.5.1; rxe_comp.c)."""
        req = self.req
        qp = self.qp
        psn = pkt.psn
        if psn_diff(psn, req.next_psn) >= 0:
            qp.count("rcvd_seq_err")  # acknowledges a PSN never sent: ghost
            return
        kind = pkt.info.kind
        if kind == op.Kind.ACK:
            self._on_aeth(psn, pkt.syndrome, now)
            return
        if kind == op.Kind.READ_RESP:
            self._read_response(pkt, now)
            return
        if kind == op.Kind.ATOMIC_ACK:
            self._ack_upto((psn - 1) & PSN_MASK, now)
            w = self._oldest()
            if w is None or w.state == UNSENT or w.first_psn != psn or not w.rd_atomic \
                    or w.opcode == _W_READ:
                qp.count("rcvd_malformed")
                return
            if w.state != DONE:
                segs = w.segs
                if segs:
                    scatter(segs, 0, memoryview(_HOST_U64.pack(pkt.orig)))
                w.state = DONE
                req.rd_atomic_out -= 1
            self._progress(now)

    def _on_aeth(self, psn: int, syn: int, now: float) -> None:
        """An ACK, RNR NAK or NAK with AETH syndrome ``syn`` for ``psn`` (IBA 9.7.5.2)."""
        req = self.req
        qp = self.qp
        t = syn & wib.AETH_TYPE_MASK
        if t == wib.AETH_ACK:
            self._ack_upto(psn, now)
        elif t == wib.AETH_RNR_NAK:
            qp.count("rcvd_rnr_nak")
            self._ack_upto((psn - 1) & PSN_MASK, now)
            self._rnr(psn, syn & 0x1F, now)
        elif t == wib.AETH_NAK:
            qp.count("rcvd_nak")
            self._ack_upto((psn - 1) & PSN_MASK, now)
            if syn == wib.NAK_PSN_SEQ_ERR:
                self._retry(psn, now)
            else:
                w = self._wqe_at(psn)
                if w is not None:
                    req.fail(w, NAK_STATUS.get(syn, WCS.IBV_WC_REM_OP_ERR))

    def fast_ack(self, data: memoryview, now: float) -> bool:
        """Fast path for a 16-byte RC ACKNOWLEDGE (BTH + AETH, IBA 9.7.5.2) whose header
        checks ``Port.receive`` has done: what :meth:`on_response` does with it, without
        building an IBPacket. False (nothing done) where the general path must run."""
        req = self.req
        st = self.qp.state
        if st != RTS and st != SQD and st != SQE:
            return False
        psn = _BTH_W2(data, 8)[0] & PSN_MASK  # BTH word 2: AckReq, Resv7, PSN (IBA 9.2)
        if psn_diff(psn, req.next_psn) >= 0:
            return False  # a ghost: the general path counts it
        self._on_aeth(psn, data[12], now)
        return True

    def _oldest(self) -> SendWQE | None:
        req = self.req
        for w in req.sq:
            if w.state != DONE:
                return w
        return None

    def _wqe_at(self, psn: int) -> SendWQE | None:
        req = self.req
        for w in req.sq:
            if w.state == SENDING or w.state == SENT:
                if psn_diff(psn, w.first_psn) >= 0 and psn_diff(psn, w.last_psn) <= 0:
                    return w
        return None

    def _ack_upto(self, psn: int, now: float) -> None:
        """Complete SEND/WRITE WQEs whose last PSN <= psn (ACK coalescing, IBA 9.7.5.1.2)."""
        req = self.req
        progressed = False
        d = psn_diff(psn, req.acked_psn)
        if d > 0:
            req.acked_psn = psn
            progressed = True
            req.window.on_ack(d, psn)
            req.cwnd = req.window.size()
        for i, w in enumerate(req.sq):
            s = w.state
            if s == DONE:
                continue
            if s == UNSENT:
                break
            if psn_diff(w.last_psn, psn) > 0:
                break
            if w.rd_atomic:
                # An ACK beyond an unanswered read/atomic: its responses were lost
                # (IBA 9.7.5.1.5): re-request it, once per loss episode.
                self._reread(w, i, now)
                break
            w.state = DONE
            progressed = True
        if progressed:
            self._progress(now)

    def _progress(self, now: float) -> None:
        req = self.req
        qp = self.qp
        self.retry_left = self.stall_left = qp.retry_cnt
        self.rnr_left = qp.rnr_retry
        req.timer.on_progress()
        req.complete_head()
        if qp.state == ERR:  # the QP went to ERR while completing
            return
        if req.in_flight():
            if qp.timeout and not req.rnr_wait:
                qp.set_deadline(now + req.timer_period())
        elif not req.rnr_wait:
            qp.set_deadline(None)
        if req.tx_idx < len(req.sq):  # something left to send
            req.pump(now)
        if qp.state == SQD:  # draining: the last ACK raises SQ_DRAINED
            req.check_drained()

    def _read_response(self, pkt: wib.IBPacket, now: float) -> None:
        req = self.req
        qp = self.qp
        psn = pkt.psn
        self._ack_upto((psn - 1) & PSN_MASK, now)
        w = self._oldest()
        if w is None or w.opcode != _W_READ or w.state == UNSENT:
            qp.count("rcvd_malformed")
            return
        mtu = qp.mtu
        got = w.read_received
        expected = (w.first_psn + got // mtu) & PSN_MASK
        d = psn_diff(psn, expected)
        if d < 0:
            qp.count("duplicate_request")
            return
        if d > 0:
            # a response packet was lost: re-request from the first missing one (go-back-N)
            self._reread(w, req.sq.index(w), now)
            if psn_diff(psn, w.last_psn) > 0:
                self._later_read_response(pkt)
            return
        if not self._take_read_data(w, pkt):
            return
        req.window.on_ack(1, psn)
        req.cwnd = req.window.size()
        if w.state == DONE:
            self.reread = None
        self._progress(now)

    def _take_read_data(self, w: SendWQE, pkt: wib.IBPacket) -> bool:
        """Place the in-sequence read response ``pkt`` of READ ``w`` (IBA 9.7.5.1.4); False
        (and ``w`` failed) if its length does not fit the READ."""
        req = self.req
        mtu = self.qp.mtu
        got = w.read_received
        plen = len(pkt.payload)
        remaining = w.length - got
        last = bool(pkt.info.pos_int & _POS_LAST)
        if (last and plen != remaining) or (not last and (plen != mtu or plen >= remaining)):
            req.fail(w, WCS.IBV_WC_BAD_RESP_ERR)
            return False
        segs = w.segs
        if plen and segs is not None:
            scatter(segs, got, pkt.payload)
        w.read_received = got + plen
        if last:
            w.state = DONE
            req.rd_atomic_out -= 1
        return True

    def _later_read_response(self, pkt: wib.IBPacket) -> None:
        """A response of a READ behind the oldest one, whose responses were lost: place it
        if it is the next one that READ expects. The responder answers READs in order, so
        those responses are the ones it sends while the oldest READ is re-requested; kept,
        they spare re-reading them (the READ's re-request, if any, starts after them: its
        PSN and RETH offset follow ``read_received``). It completes in order later."""
        r = self._wqe_at(pkt.psn)
        if r is None or r.opcode != _W_READ:
            return
        if (r.first_psn + r.read_received // self.qp.mtu) & PSN_MASK != pkt.psn:
            return  # out of its sequence too: recovered when it is the oldest
        self._take_read_data(r, pkt)

    def _reread(self, w: SendWQE, i: int, now: float) -> None:
        """Re-request read/atomic ``w`` (at ``sq[i]``) whose responses were lost, from its
        first missing PSN (IBA 9.7.5.1.5), unless that was done already in this loss
        episode: the responses still in flight from the earlier request(s) arrive out of
        sequence too, and must not re-request it again (the timer recovers further losses)."""
        req = self.req
        if self.reread is w:
            return
        req.go_back_to(i)
        self.reread = w
        self.qp.port.counters.completer_retry += 1
        self.qp.counters.completer_retry += 1
        req.pump(now)

    def _rnr(self, psn: int, timer: int, now: float) -> None:
        """RNR NAK: wait the responder's RNR timer, then resend from ``psn`` (IBA 9.7.5.2.8)."""
        req = self.req
        qp = self.qp
        w = self._wqe_at(psn)
        if w is None:
            return
        if qp.rnr_retry != 7:
            if self.rnr_left <= 0:
                qp.count("rnr_nak_retry_err")
                req.fail(w, WCS.IBV_WC_RNR_RETRY_EXC_ERR)
                return
            self.rnr_left -= 1
        req.rnr_wait = True
        req.rnr_psn = psn
        qp.set_deadline(now + wib.RNR_TIMER_S[timer])

    def _retry(self, psn: int, now: float, charged: bool = True, timeout: bool = False) -> None:
        """Go back to ``psn`` after a PSN sequence NAK or a timeout (IBA 9.7.6.1.3); an
        uncharged retry (a late expiry, see :meth:`on_timer`) uses no ``retry_cnt``, and
        a ``retry_cnt`` of 7 (:data:`RETRY_FOREVER`) is never used up, as in Linux rxe."""
        req = self.req
        qp = self.qp
        w = self._wqe_at(psn)
        if w is None:
            return
        if charged and qp.retry_cnt != RETRY_FOREVER:
            if self.retry_left <= 0:
                qp.count("retry_exceeded_err")
                req.fail(w, WCS.IBV_WC_RETRY_EXC_ERR)
                return
            self.retry_left -= 1
        qp.count("completer_retry")
        req.window.on_loss(req.next_psn, timeout)
        req.cwnd = req.window.size()
        req.go_back(psn)
        if qp.timeout:
            qp.set_deadline(now + req.timer_period())
        req.pump(now)

    def on_timer(self, now: float) -> None:
        req = self.req
        qp = self.qp
        due = qp.deadline
        qp.deadline = None
        if req.rnr_wait:
            req.rnr_wait = False
            req.go_back(req.rnr_psn)
            if qp.timeout:
                qp.set_deadline(now + req.timer_period())
            req.pump(now)
            return
        una = req.una()
        if una is None:
            return
        # One expiry, however late ``now`` is (the process may not have run for a while):
        # one resend, and the next period doubles (IBA 9.7.6.1.3; see congestion).
        period = req.timer.period
        req.timer.on_expiry()
        self.reread = None  # a new loss episode
        # An expiry that runs more than its own period late ran on a host that did not
        # run this process for that long: the answer to our last resend may not have been
        # sent (a peer on this host, or its devd, is as starved as we are) or read, so the
        # silence says nothing of the peer; IBA 9.7.6.1.3 bounds the wait for the peer's
        # answer, not our descheduling (issue 25: write-bw at load 23 ended a live peer).
        # Such an expiry resends without using a retry, at most retry_cnt times per
        # episode, so a dead peer still ends the QP (after at most 2 * retry_cnt + 1).
        late = due is not None and now - due > period
        if late and self.stall_left > 0:
            self.stall_left -= 1
            self.stalled_expiries += 1
            self._retry(una, now, charged=False, timeout=True)
            return
        self._retry(una, now, timeout=True)
