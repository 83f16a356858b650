"""The receive side of a QP: the responder (IBA 9.7.4-9.7.5, 9.8, 9.9.3; rxe_resp.c).

RC: requests are executed in PSN order. A PSN ahead of the expected one draws one
PSN-sequence NAK; a PSN behind it is a duplicate: SEND/WRITE are re-acknowledged,
READ is re-executed from the responder resource that covers it and an atomic's saved
result is sent again (never re-executed, IBA 9.7.5.1.4; C9-105, as rxe ``duplicate_request``:
READ and atomics are softrdma.ib.rd_atomic's). Errors are NAKed with
the code of IBA Table 44 and, for class B/C/D errors, the QP moves to ERR. Most packets
of a large SEND or WRITE are MIDDLEs (IBA 9.7.1): :meth:`Responder.place_middles` takes
a run of them (one packet is a run of one) without decoding; every byte of a SEND or
WRITE is placed by :meth:`Responder._place`.

UC: no ACKs; a missing packet drops the rest of the message (IBA 9.9.4; rxe ``check_psn``).
UD: one-packet messages, Q_Key check (IBA 10.2.5), 40-byte GRH area at the front of the
receive buffer (IBA 11.4.1.1), silently dropped when no receive WQE is posted.
"""

from __future__ import annotations

from collections import deque

from ..enums import ibv_access_flags as ACC
from ..enums import ibv_wc_flags as WCF
from ..enums import ibv_wc_opcode as WCO
from ..enums import ibv_wc_status as WCS
from ..seam.events import AsyncEventType
from ..seam.memory import resolve_sges, scatter
from ..seam.states import QPT_RC, QPT_UD, RTR
from ..seam.types import PSN_MASK, RecvWQE, WorkCompletion, psn_diff
from ..wire import ib as wib
from ..wire import opcodes as op
from ..wire.mad import GSI_QKEY
from .mw import remotely_invalidatable
from .packet import RxMeta
from .rd_atomic import (
    ACK_SYNDROME,
    MAX_MSG,
    Resource,
    execute_atomic,
    execute_atomic_write,
    execute_read,
    replay,
    rkey_view,
)
from .rd_atomic import RequestNak as _NAK
from .resp_fast import FastPaths
from .views import QpView

_POS_FIRST = int(op.Pos.FIRST)
_POS_LAST = int(op.Pos.LAST)
_POS_ONLY = int(op.Pos.ONLY)


_BTH_SIZE = op.BTH_SIZE
_ACCESS_REMOTE_WRITE = int(ACC.IBV_ACCESS_REMOTE_WRITE)  # plain ints on the hot path
_ACCESS_LOCAL_WRITE = int(ACC.IBV_ACCESS_LOCAL_WRITE)
_WC_WITH_IMM = int(WCF.IBV_WC_WITH_IMM)
_WC_WITH_INV = int(WCF.IBV_WC_WITH_INV)
_WC_GRH = int(WCF.IBV_WC_GRH)
_WC_SUCCESS = WCS.IBV_WC_SUCCESS
_WC_RECV = WCO.IBV_WC_RECV

K_SEND = op.Kind.SEND
K_WRITE = op.Kind.WRITE
K_READ = op.Kind.READ_REQ
K_CAS = op.Kind.CMP_SWAP
K_FAA = op.Kind.FETCH_ADD
K_ATOMIC_WRITE = op.Kind.ATOMIC_WRITE
# the message in progress -> BTH word 0 of its MIDDLE packets, less the P_Key
_MIDDLE_W0: dict[int, int] = {K_SEND: op.RC_SEND_MIDDLE << 24, K_WRITE: op.RC_WRITE_MIDDLE << 24}


class Responder(FastPaths):
    """Responder of one QP (its fast receive paths: :class:`~softrdma.ib.resp_fast.FastPaths`)."""

    def __init__(self, qp: QpView) -> None:
        self.qp = qp
        self.epsn = 0
        self.msn = 0
        self.nak_sent = False
        self.comm_est = False  # COMM_EST raised for this connection (IBA 11.6.3)
        self.resources: deque[Resource] = deque(maxlen=16)
        self._clear_msg()

    def _clear_msg(self) -> None:
        self.cur: int = 0  # kind of the message in progress (0 = none)
        self.rwqe: RecvWQE | None = None
        self.segs: list[memoryview] | None = None
        self.offset = 0
        self.wbuf: memoryview | None = None
        self.wlen = 0
        self.mid: tuple[int, int, int] | None = None  # see want_middles

    def want_middles(self) -> None:
        """What :meth:`place_middles` requires of each MIDDLE of the SEND or WRITE in
        progress: BTH word 0 (OpCode, SE M PadCnt TVer, P_Key) with SE and M masked off,
        word 1 (FECN BECN Resv6 DestQP) with Resv6 masked off, as they must be (IBA 9.6,
        9.7.1), and the packet's size (a path MTU of payload); None when no SEND or WRITE
        is in progress or the fast paths do not take the QP's P_Key. Recomputed when a
        message starts and when the QP is modified."""
        w0 = _MIDDLE_W0.get(self.cur)
        qp = self.qp
        if w0 is None or qp.fast_pkey < 0:
            self.mid = None
        else:
            self.mid = (w0 | qp.fast_pkey, qp.qpn, _BTH_SIZE + qp.mtu)

    def set_epsn(self, psn: int) -> None:
        self.epsn = psn & PSN_MASK

    def reset(self) -> None:
        self.msn = 0
        self.nak_sent = False
        self.comm_est = False
        self.resources.clear()
        self._clear_msg()

    def abort(self) -> None:
        """QP to ERR: a receive WQE in use is flushed with the rest (IBA 10.3.1.7)."""
        rwqe = self.rwqe
        self._clear_msg()
        if rwqe is not None:
            qp = self.qp
            qp.complete_recv(WorkCompletion(rwqe.wr_id, WCS.IBV_WC_WR_FLUSH_ERR, WCO.IBV_WC_RECV,
                                            qp.qpn))

    # ---- outgoing responses -------------------------------------------------------------------
    def send_ack(self, psn: int, syndrome: int = ACK_SYNDROME) -> None:
        qp = self.qp
        hdr = wib.bth(op.RC_ACK, qp.pkey, qp.dest_qpn, psn) + wib.aeth(syndrome, self.msn)
        qp.tx([hdr], 16)

    def schedule_ack(self, psn: int) -> None:
        """Acknowledge up to ``psn`` with the next coalesced ACK (IBA 9.7.5.1.1).

        The first request since every request of ours was acknowledged, with none of
        ours outstanding, asks for a prompt ACK (``Port.ack_prompt``): the peer
        acknowledged ours before it sent this one, as a peer does that awaits each
        request's completion before its next (``ibv_rc_pingpong``, perftest's latency
        tests); it then awaits this ACK too. The runtime sends a prompt ACK at the end
        of the receive step, before the application answers, so that the peer takes
        it while the answer is being made, not after the answer."""
        qp = self.qp
        ahead = qp.acked_ahead
        if ahead:
            qp.acked_ahead = False
        if qp.ack_psn < 0:
            port = qp.port
            port.ack_pending.append(qp)
            if ahead:
                port.ack_prompt = True
        qp.ack_psn = psn

    def flush_pending_ack(self) -> None:
        qp = self.qp
        if qp.ack_psn >= 0:
            self.send_ack(qp.ack_psn)
            qp.ack_psn = -1
            port = qp.port
            try:
                port.ack_pending.remove(qp)
            except ValueError:
                pass
            if not port.ack_pending:
                port.ack_prompt = False

    def _nak(self, psn: int, code: int) -> None:
        self.flush_pending_ack()
        self.qp.port.counters.sent_nak += 1
        self.qp.counters.sent_nak += 1
        self.send_ack(psn, code)

    def _check_comm_est(self) -> None:
        """IBA 11.6.3: the first valid request received while the QP is in RTR raises
        the Communication Established event, once (the CM then treats the connection
        as established even if the RTU was lost, IBA 12.9.7.3)."""
        qp = self.qp
        if qp.state == RTR and not self.comm_est:
            self.comm_est = True
            qp.port.events.raise_event(AsyncEventType.COMM_EST, qp)

    # ---- dispatch ---------------------------------------------------------------------------------
    def on_request(self, pkt: wib.IBPacket, meta: RxMeta, now: float) -> None:
        t = self.qp.qp_type
        if t == QPT_RC:
            self._rc(pkt)
        elif t == QPT_UD:
            self._ud(pkt, meta)
        else:
            self._uc(pkt)

    # ---- RC -----------------------------------------------------------------------------------
    def _place(self, payload: memoryview) -> bool:
        """Place ``payload`` at the current offset of the SEND (the receive WQE's scatter
        list) or RDMA WRITE (the R_Key's region) in progress and advance the offset
        (IBA 9.7.4.1.5); False, with nothing written, when it does not fit."""
        off = self.offset
        end = off + len(payload)
        wbuf = self.wbuf
        if wbuf is not None:
            if end > self.wlen:
                return False
            wbuf[off:end] = payload
        elif end > off:
            segs = self.segs
            if segs is None or not scatter(segs, off, payload):
                return False
        self.offset = end
        return True

    def _rc(self, pkt: wib.IBPacket) -> None:
        qp = self.qp
        d = psn_diff(pkt.psn, self.epsn)
        if d > 0:
            qp.count("out_of_seq_request")
            if not self.nak_sent:  # one NAK per sequence error (IBA 9.7.5.1.3; rxe sent_psn_nak)
                self.nak_sent = True
                self._nak(self.epsn, wib.NAK_PSN_SEQ_ERR)
            return
        # XRC TGT QP: the SRQ named by the XRCETH gives the receive WQE, PD and CQ
        # (softrdma.ib.xrc); a bad XRCETH is an access violation (Annex A14).
        bound = qp.xrcd is None or qp.bind_srq(pkt)
        if d < 0:
            qp.count("duplicate_request")
            if bound:
                self._duplicate(pkt)
            return
        self.nak_sent = False
        try:
            if not bound:
                raise _NAK(wib.NAK_REMOTE_ACCESS)
            self._execute(pkt)
            self._check_comm_est()
        except _NAK as e:
            self._error(pkt, e)
        except _RNR:
            # Receiver not ready (IBA 9.7.5.2.8): RNR NAK with our min_rnr_timer; the
            # requester resends this PSN after the timer.
            qp.count("send_rnr_nak")
            self.flush_pending_ack()
            self.send_ack(pkt.psn, wib.AETH_RNR_NAK | (qp.min_rnr_timer & 0x1F))

    def _error(self, pkt: wib.IBPacket, e: _NAK) -> None:
        """NAK the request; class B/C/D errors complete the receive WQE in use and move to ERR."""
        qp = self.qp
        self._nak(pkt.psn, e.code)
        rwqe = self.rwqe
        self._clear_msg()
        if rwqe is not None and e.wc_status:
            qp.complete_recv(WorkCompletion(rwqe.wr_id, e.wc_status, WCO.IBV_WC_RECV, qp.qpn))
        elif rwqe is not None:
            qp.return_rwqe(rwqe)
        event = (AsyncEventType.QP_ACCESS_ERR if e.code == wib.NAK_REMOTE_ACCESS
                 else AsyncEventType.QP_REQ_ERR)
        qp.to_error(event)

    def _check_seq(self, info: op.OpInfo, kind: int) -> None:
        """Opcode sequence check (IBA 9.7.4.1.5; rxe check_op_seq)."""
        if self.cur == 0:
            if not info.pos_int & _POS_FIRST:
                raise _NAK(wib.NAK_INVALID_REQUEST, WCS.IBV_WC_REM_INV_REQ_ERR)
        elif info.pos_int & _POS_FIRST or kind != self.cur:
            raise _NAK(wib.NAK_INVALID_REQUEST, WCS.IBV_WC_REM_INV_REQ_ERR)

    def _check_len(self, info: op.OpInfo, plen: int) -> None:
        """Payload length rules (IBA 9.7.4.1.5; rxe check_length)."""
        mtu = self.qp.mtu
        pos = info.pos_int
        if pos == _POS_ONLY:
            ok = plen <= mtu
        elif pos & _POS_LAST:
            ok = 0 < plen <= mtu
        else:
            ok = plen == mtu
        if not ok:
            self.qp.count("rcvd_bad_length")  # CA16-23: its own reason
            raise _NAK(wib.NAK_INVALID_REQUEST, WCS.IBV_WC_REM_INV_REQ_ERR)

    def _execute(self, pkt: wib.IBPacket) -> None:
        info = pkt.info
        kind = info.kind
        if kind == K_SEND or kind == K_WRITE:
            self._place_data(pkt, info, kind)
            self.epsn = (self.epsn + 1) & PSN_MASK
            if pkt.ackreq:
                self.schedule_ack(pkt.psn)
            return
        if self.cur != 0:  # a new request in the middle of a message
            raise _NAK(wib.NAK_INVALID_REQUEST, WCS.IBV_WC_REM_INV_REQ_ERR)
        if kind == K_READ:
            execute_read(self, pkt)
        elif kind == K_CAS or kind == K_FAA:
            execute_atomic(self, pkt, kind)
        elif kind == K_ATOMIC_WRITE:
            execute_atomic_write(self, pkt)
        else:
            raise _NAK(wib.NAK_INVALID_REQUEST, WCS.IBV_WC_REM_INV_REQ_ERR)

    def _place_data(self, pkt: wib.IBPacket, info: op.OpInfo, kind: int) -> None:
        """A SEND or RDMA WRITE packet of the message in progress: its place in the
        sequence (IBA 9.7.5.1.3) and its length (C9-95), then its payload into the
        receive WQE or the region (RC and UC alike)."""
        self._check_seq(info, kind)
        plen = len(pkt.payload)
        self._check_len(info, plen)
        if kind == K_SEND:
            self._send_data(pkt, plen)
        else:
            self._write_data(pkt, plen)

    def _send_data(self, pkt: wib.IBPacket, plen: int) -> None:
        qp = self.qp
        if self.cur == 0:
            rwqe = qp.take_rwqe()
            if rwqe is None:
                raise _RNR()
            segs = resolve_sges(qp.port.mrs, qp.pd, rwqe.sg_list, _ACCESS_LOCAL_WRITE)
            if segs is None:
                self.rwqe = rwqe
                raise _NAK(wib.NAK_REMOTE_OP_ERR, WCS.IBV_WC_LOC_PROT_ERR)
            self._start_send(rwqe, segs)
        if not self._place(pkt.payload):
            raise _NAK(wib.NAK_INVALID_REQUEST, WCS.IBV_WC_LOC_LEN_ERR)
        if pkt.info.pos_int & _POS_LAST:
            flags = 0
            imm = 0
            inv = 0
            if pkt.info.imm:
                flags = _WC_WITH_IMM
                imm = pkt.imm
            elif pkt.info.inv:
                mr = qp.port.lookup_mr(pkt.inv_rkey)
                if mr is None or mr.pd is not qp.pd or not remotely_invalidatable(mr):
                    raise _NAK(wib.NAK_INVALID_REQUEST, WCS.IBV_WC_REM_INV_REQ_ERR)
                mr.valid = False
                flags = _WC_WITH_INV
                inv = pkt.inv_rkey
            self._complete_send(flags, imm, inv, pkt.se)

    def _start_send(self, rwqe: RecvWQE, segs: list[memoryview]) -> None:
        """A SEND starts: its receive WQE and resolved scatter list (IBA 9.7.4.1.5). A
        list of one buffer (the usual receive) is placed into as a WRITE's region is, by
        :meth:`_place`'s slice assignment, without :func:`scatter`'s walk per packet."""
        self.rwqe = rwqe
        self.segs = segs
        if len(segs) == 1:
            self.wbuf = segs[0]
            self.wlen = len(segs[0])
        self.offset = 0
        self.cur = K_SEND
        self.want_middles()

    def _complete_send(self, flags: int, imm: int, inv: int, se: bool) -> None:
        """The SEND in progress has its last packet placed: complete its receive WQE
        (IBA 11.4.2.1) and count the message (MSN, IBA 9.7.5.1.2)."""
        qp = self.qp
        rwqe = self.rwqe
        assert rwqe is not None
        # byte_len, imm_data, src_qp, wc_flags, vendor_err, pkey_index, invalidated_rkey:
        # positional, 0.12 us less than by keyword
        wc = WorkCompletion(rwqe.wr_id, _WC_SUCCESS, _WC_RECV, qp.qpn, self.offset, imm,
                            qp.dest_qpn, int(flags), 0, 0, inv)
        wc.solicited = se
        self.msn = (self.msn + 1) & PSN_MASK
        self._clear_msg()
        qp.complete_recv(wc)

    def _write_data(self, pkt: wib.IBPacket, plen: int) -> None:
        qp = self.qp
        info = pkt.info
        if self.cur == 0:
            if pkt.dma_len > MAX_MSG:
                raise _NAK(wib.NAK_INVALID_REQUEST, WCS.IBV_WC_REM_INV_REQ_ERR)
            self.wbuf = rkey_view(qp, pkt.rkey, pkt.va, pkt.dma_len, _ACCESS_REMOTE_WRITE)
            self.wlen = pkt.dma_len
            self.offset = 0
            self.cur = K_WRITE
            self.want_middles()
        end = self.offset + plen
        last = bool(info.pos_int & _POS_LAST)
        if end > self.wlen or (last and end != self.wlen):
            raise _NAK(wib.NAK_INVALID_REQUEST, WCS.IBV_WC_REM_INV_REQ_ERR)
        if last and info.imm:
            # Write with immediate consumes a receive WQE (IBA 9.4.1.2): RNR if none.
            rwqe = qp.take_rwqe()
            if rwqe is None:
                raise _RNR()
            self.rwqe = rwqe
        self._place(pkt.payload)  # fits: checked above
        if last:
            rwqe = self.rwqe
            length = self.wlen
            self.msn = (self.msn + 1) & PSN_MASK
            self._clear_msg()
            if rwqe is not None:
                wc = WorkCompletion(rwqe.wr_id, WCS.IBV_WC_SUCCESS, WCO.IBV_WC_RECV_RDMA_WITH_IMM,
                                    qp.qpn, byte_len=length, imm_data=pkt.imm, src_qp=qp.dest_qpn,
                                    wc_flags=int(WCF.IBV_WC_WITH_IMM))
                wc.solicited = pkt.se
                qp.complete_recv(wc)

    def _duplicate(self, pkt: wib.IBPacket) -> None:
        """A duplicate request (IBA 9.7.5.1.4): a SEND or WRITE is acknowledged again with
        the last PSN received; a READ or atomic is answered again from its resource
        (:func:`~softrdma.ib.rd_atomic.replay`)."""
        kind = pkt.info.kind
        if kind == K_SEND or kind == K_WRITE:
            self.schedule_ack((self.epsn - 1) & PSN_MASK)
            return
        replay(self, pkt)

    # ---- UC -----------------------------------------------------------------------------------------
    def _uc(self, pkt: wib.IBPacket) -> None:
        """UC responder (IBA 9.9.4): a PSN gap drops the current message."""
        qp = self.qp
        info = pkt.info
        if pkt.psn != self.epsn:
            qp.count("out_of_seq_request")
            if self.cur != 0:
                self._drop_uc_msg()
        self.epsn = (pkt.psn + 1) & PSN_MASK
        if self.cur == 0 and not info.pos_int & _POS_FIRST:
            qp.count("dropped_uc")
            return
        try:
            self._place_data(pkt, info, info.kind)
            self._check_comm_est()
        except (_NAK, _RNR):
            # UC errors are silent: drop the message (IBA 9.9.4); the WQE is reused.
            self._drop_uc_msg()

    def _drop_uc_msg(self) -> None:
        """UC: drop the message in progress (IBA 9.9.4); its receive WQE goes back to the
        front of the queue for the next message."""
        self.qp.count("dropped_uc")
        rwqe = self.rwqe
        self._clear_msg()
        if rwqe is not None:
            self.qp.return_rwqe(rwqe)

    # ---- UD -----------------------------------------------------------------------------------------
    def _ud(self, pkt: wib.IBPacket, meta: RxMeta) -> None:
        self._ud_deliver(pkt.qkey, pkt.src_qp, pkt.payload, pkt.se,
                         pkt.imm if pkt.info.imm else None, meta)

    def _ud_deliver(self, qkey: int, src_qp: int, payload: memoryview, se: bool,
                    imm: int | None, meta: RxMeta) -> None:
        """A UD message (one packet) that passed the header checks: the Q_Key (IBA
        10.2.5), its length, a receive WQE (none: silently dropped), the 40-byte GRH area
        then the payload placed (IBA 11.4.1.1), the completion."""
        qp = self.qp
        c = qp.port.counters
        expected = GSI_QKEY if qp.qpn == 1 else qp.qkey
        if qkey != expected:  # IBA 10.2.5: Q_Key violation, silently dropped
            c.rcvd_bad_qkey += 1
            return
        plen = len(payload)
        if plen > qp.port.max_mtu:
            c.rcvd_bad_length += 1
            return
        rwqe = qp.take_rwqe()
        if rwqe is None:
            c.ud_no_wqe += 1
            return
        segs = resolve_sges(qp.port.mrs, qp.pd, rwqe.sg_list, _ACCESS_LOCAL_WRITE)
        if segs is None:
            qp.complete_recv(WorkCompletion(rwqe.wr_id, WCS.IBV_WC_LOC_PROT_ERR, WCO.IBV_WC_RECV,
                                            qp.qpn))
            return
        grh = meta.grh if len(meta.grh) == 40 else bytes(40)
        one = segs[0] if len(segs) == 1 else None
        if one is not None and plen + 40 <= len(one):  # the usual one buffer
            one[:40] = grh
            one[40:40 + plen] = payload
        elif not scatter(segs, 0, memoryview(grh)) or not scatter(segs, 40, payload):
            qp.complete_recv(WorkCompletion(rwqe.wr_id, WCS.IBV_WC_LOC_LEN_ERR, WCO.IBV_WC_RECV,
                                            qp.qpn))
            return
        flags = _WC_GRH
        if imm is not None:
            flags |= _WC_WITH_IMM
        # byte_len, imm_data, src_qp, wc_flags: positional, 0.12 us less than by keyword
        wc = WorkCompletion(rwqe.wr_id, _WC_SUCCESS, _WC_RECV, qp.qpn, plen + 40, imm or 0,
                            src_qp, flags)
        wc.solicited = se
        qp.complete_recv(wc)


class _RNR(Exception):
    """Internal: no receive WQE for a SEND (or WRITE with immediate)."""


__all__ = ["Responder", "Resource"]
