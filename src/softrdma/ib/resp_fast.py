"""The responder's fast receive paths (a base of :class:`softrdma.ib.responder.Responder`):
the packets of a large SEND or RDMA WRITE and the small messages, taken without decoding
an IBPacket when every check of the general path (``Responder.on_request``) would pass,
and with its effects: the same placement (``Responder._place``), completions, PSN and
ACK (IBA 9.7.4.1.5, 9.7.5.1), UD delivery (``Responder._ud_deliver``, IBA 10.2.5,
11.4.1.1). Anything else returns False (or 0) having changed nothing, and the general path
runs.

* :meth:`FastPaths.place_run`: a run of one coalesced receive (one packet is a run of
  one): a SEND FIRST, the MIDDLEs of the message in progress, a SEND LAST;
* :meth:`FastPaths.send_only`: an RC SEND ONLY (the ping-pong's message);
* :meth:`FastPaths.ud_only`: a UD SEND ONLY (IPoIB's datagram mode).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from ..enums import ibv_access_flags as ACC
from ..enums import ibv_wc_flags as WCF
from ..enums import ibv_wc_opcode as WCO
from ..enums import ibv_wc_status as WCS
from ..seam.memory import resolve_sges, scatter
from ..seam.states import RTR, SQE
from ..seam.types import PSN_MASK, RecvWQE, WorkCompletion
from ..wire import ib as wib
from ..wire import opcodes as op
from .packet import RxMeta
from .views import QpView

__all__ = ["FastPaths"]

_BTH_SIZE = op.BTH_SIZE
_IMMDT_SIZE = 4
_DETH_SIZE = 8
_U32 = wib.U32
_BTH_WORDS = struct.Struct("!III").unpack_from  # the BTH's three 32-bit words (IBA 9.2)
_DETH_AT = struct.Struct("!II").unpack_from  # DETH: Q_Key, Resv8 + SrcQP (IBA 9.3.3)
_W0_CHECKED = 0xFF3FFFFF  # OpCode, PadCnt, TVer, P_Key
_W1_CHECKED = wib.BTH_FECN | wib.BTH_BECN | 0xFFFFFF  # FECN, BECN, DestQP
_W0_LAST_CHECKED = 0xFF0FFFFF  # OpCode, TVer, P_Key (a LAST may carry a pad)
_SEND_FIRST_W0 = op.RC_SEND_FIRST << 24
_SEND_LAST_W0 = op.RC_SEND_LAST << 24
_ACKREQ = wib.BTH_ACKREQ
_BTH_SE = wib.BTH_SE
_RC_SEND_ONLY_IMM = op.RC_SEND_ONLY_IMM
_ACCESS_LOCAL_WRITE = int(ACC.IBV_ACCESS_LOCAL_WRITE)
_WC_WITH_IMM = int(WCF.IBV_WC_WITH_IMM)
_WC_SUCCESS = WCS.IBV_WC_SUCCESS
_WC_RECV = WCO.IBV_WC_RECV
K_SEND = op.Kind.SEND


class FastPaths:
    """The fast receive paths of one QP's responder (its state: the responder's)."""

    qp: QpView
    epsn: int
    msn: int
    nak_sent: bool
    cur: int
    mid: tuple[int, int, int] | None

    # the responder's (softrdma.ib.responder.Responder)
    def _place(self, payload: memoryview) -> bool:
        raise NotImplementedError

    def _start_send(self, rwqe: RecvWQE, segs: list[memoryview]) -> None:
        raise NotImplementedError

    def _complete_send(self, flags: int, imm: int, inv: int, se: bool) -> None:
        raise NotImplementedError

    def _clear_msg(self) -> None:
        raise NotImplementedError

    def schedule_ack(self, psn: int) -> None:
        raise NotImplementedError

    def _check_comm_est(self) -> None:
        raise NotImplementedError

    def _ud_deliver(self, qkey: int, src_qp: int, payload: memoryview, se: bool,
                    imm: int | None, meta: RxMeta) -> None:
        raise NotImplementedError

    def place_run(self, bodies: Sequence[memoryview]) -> int:
        """Execute the longest prefix of ``bodies`` that the fast paths take as one SEND
        or RDMA WRITE in sequence, and return its length (0: nothing done): a SEND FIRST
        that starts a message (:meth:`send_first`), the MIDDLEs of the message in
        progress (:meth:`place_middles`), then a SEND LAST that ends it
        (:meth:`send_last`). ``bodies`` are as :meth:`place_middles` has them; what is
        not taken is left, with the rest, to the general path. The caller counts the
        packets taken."""
        k = 0
        if self.cur == 0:
            if not self.send_first(bodies[0]):
                return 0
            k = 1
        if k < len(bodies):
            k += self.place_middles(bodies[k:] if k else bodies)
            if k < len(bodies) and self.cur == K_SEND and self.send_last(bodies[k]):
                k += 1
        return k

    def send_first(self, data: memoryview) -> bool:
        """Execute an RC SEND FIRST that starts a message, as :meth:`_send_data` does
        (IBA 9.7.4.1.5: a receive WQE taken, its scatter list resolved, the payload
        placed): with no message in progress, the expected PSN, BTH word 0 and 1 as
        :meth:`want_middles` has them for a MIDDLE (OpCode FIRST), a path MTU of payload
        and a receive WQE whose buffers take it. False, having changed nothing (a WQE
        taken is given back), for anything else: the general path then runs."""
        qp = self.qp
        st = qp.state
        if st < RTR or st > SQE or self.cur or len(data) != _BTH_SIZE + qp.mtu:
            return False
        w0, w1, w2 = _BTH_WORDS(data)
        psn = w2 & PSN_MASK
        if (psn != self.epsn or w0 & _W0_CHECKED != _SEND_FIRST_W0 | qp.fast_pkey
                or w1 & _W1_CHECKED != qp.qpn or qp.fast_pkey < 0):
            return False
        rwqe = qp.take_rwqe()
        if rwqe is None:
            return False  # the general path answers with an RNR NAK
        segs = resolve_sges(qp.port.mrs, qp.pd, rwqe.sg_list, _ACCESS_LOCAL_WRITE)
        if segs is None or not scatter(segs, 0, data[_BTH_SIZE:]):
            qp.return_rwqe(rwqe)
            return False
        self.nak_sent = False
        self._start_send(rwqe, segs)
        self.offset = qp.mtu
        self.epsn = (psn + 1) & PSN_MASK
        if w2 & _ACKREQ:
            self.schedule_ack(psn)
        if st == RTR:
            self._check_comm_est()
        return True

    def send_last(self, data: memoryview) -> bool:
        """Execute the RC SEND LAST (no immediate, no invalidate) of the SEND in progress,
        as :meth:`_send_data` does: the expected PSN, BTH word 0 (its PadCnt aside) and
        word 1 as for a MIDDLE, a payload of 1 .. path MTU octets that fits the receive
        WQE; placed, the WQE completed and the PSN acknowledged (IBA 9.7.4.1.5, 9.7.5.1).
        False, having changed nothing, for anything else."""
        qp = self.qp
        w0, w1, w2 = _BTH_WORDS(data)
        psn = w2 & PSN_MASK
        if (psn != self.epsn or w0 & _W0_LAST_CHECKED != _SEND_LAST_W0 | qp.fast_pkey
                or w1 & _W1_CHECKED != qp.qpn or qp.fast_pkey < 0):
            return False
        end = len(data) - (w0 >> 20 & 3)  # less the pad (IBA 9.2: PadCnt)
        plen = end - _BTH_SIZE
        if plen <= 0 or plen > qp.mtu or not self._place(data[_BTH_SIZE:end]):
            return False
        self.nak_sent = False
        self._complete_send(0, 0, 0, bool(data[1] & _BTH_SE))
        self.epsn = (psn + 1) & PSN_MASK
        if w2 & _ACKREQ:
            self.schedule_ack(psn)
        if qp.state == RTR:
            self._check_comm_est()
        return True

    def place_middles(self, bodies: Sequence[memoryview]) -> int:
        """Execute the longest prefix of ``bodies`` that are in-sequence RC SEND or RDMA
        WRITE MIDDLE packets of the message in progress, and return its length (0:
        nothing done). One packet is a run of length one (``Port.receive``); a run is the
        segments of one coalesced receive (``Port.receive_run``).

        ``bodies`` are transport packets (BTH .. pad, ICRC checked) addressed to this QP
        from its peer. A packet is taken when it has the MIDDLE opcode of the message in
        progress, the path MTU as payload, TVer 0, no pad, neither FECN nor BECN, the
        QP's full-member P_Key, its QPN, the expected PSN, and its payload fits the
        message's buffer (IBA 9.6, 9.7.1, 9.7.4.1.5): placed by :meth:`_place`, the PSN
        advanced and the AckReq of the run answered by one coalesced ACK (IBA 9.7.5.1.1),
        as the general path would. The first packet that is not is left, with the rest,
        to the general path, which handles (NAKs or drops) it. The caller counts the
        packets taken.
        """
        # a message in progress: the QP is in RTR, RTS, SQD or SQE (reset and to_error
        # end it)
        mid = self.mid
        if mid is None:  # no SEND or WRITE in progress
            return 0
        w0_want, w1_want, size = mid
        epsn = self.epsn
        ack_psn = -1
        k = 0
        for data in bodies:
            if len(data) != size:
                break
            w0, w1, w2 = _BTH_WORDS(data)
            if (w2 & PSN_MASK != epsn or w0 & _W0_CHECKED != w0_want
                    or w1 & _W1_CHECKED != w1_want or not self._place(data[_BTH_SIZE:])):
                break
            if w2 & _ACKREQ:
                ack_psn = epsn
            epsn = (epsn + 1) & PSN_MASK
            k += 1
        if k:
            self.nak_sent = False
            self.epsn = epsn
            if ack_psn >= 0:
                self.schedule_ack(ack_psn)
        return k

    def send_only(self, data: memoryview, opcode: int) -> bool:
        """Execute an RC SEND ONLY (with immediate when ``opcode`` is SEND_ONLY_IMM) whose
        header checks ``Port.receive`` has done (TVer, pad, P_Key, addresses): the
        expected PSN, no message in progress, a payload within the path MTU, a receive
        WQE whose buffers take it. It is completed as :meth:`_send_data` completes it
        (IBA 9.7.4.1.5, 9.7.5.1; the completion of IBA 11.4.2.1) and acknowledged by the
        same coalesced ACK, without decoding an IBPacket (the ping-pong's message).

        Returns False, having changed nothing, for anything else: the general path then
        runs (a receive WQE taken is given back first, so that path takes it again).
        """
        qp = self.qp
        st = qp.state
        if st < RTR or st > SQE or self.cur:
            return False
        w2 = _U32.unpack_from(data, 8)[0]
        psn = w2 & PSN_MASK
        if psn != self.epsn:
            return False
        imm = 0
        off = _BTH_SIZE
        with_imm = opcode == _RC_SEND_ONLY_IMM
        if with_imm:
            imm = _U32.unpack_from(data, _BTH_SIZE)[0]
            off += _IMMDT_SIZE
        plen = len(data) - off
        if plen < 0 or plen > qp.mtu:
            return False
        rwqe = qp.take_rwqe()
        if rwqe is None:
            return False  # the general path answers with an RNR NAK
        segs = resolve_sges(qp.port.mrs, qp.pd, rwqe.sg_list, _ACCESS_LOCAL_WRITE)
        if segs is None or (plen and not scatter(segs, 0, data[off:])):
            qp.return_rwqe(rwqe)
            return False
        self.nak_sent = False
        # byte_len, imm_data, src_qp, wc_flags: positional, 0.12 us less than by keyword
        wc = WorkCompletion(rwqe.wr_id, _WC_SUCCESS, _WC_RECV, qp.qpn, plen, imm,
                            qp.dest_qpn, _WC_WITH_IMM if with_imm else 0)
        wc.solicited = bool(data[1] & _BTH_SE)
        self.msn = (self.msn + 1) & PSN_MASK
        self._clear_msg()
        qp.complete_recv(wc)
        self.epsn = (psn + 1) & PSN_MASK
        if w2 & _ACKREQ:
            self.schedule_ack(psn)
        if st == RTR:  # only a QP in RTR raises COMM_EST
            self._check_comm_est()
        return True

    def ud_only(self, data: memoryview, meta: RxMeta) -> bool:
        """A UD SEND ONLY (BTH, DETH, payload, pad; no immediate) for this UD QP whose
        P_Key ``Port.receive`` has checked, taken without decoding an IBPacket: the other
        header checks of ``EngineQP.receive`` (the QP's state, TVer 0, IBA 9.6), then
        :meth:`_ud_deliver`, as the general path. False, having changed nothing, where the
        general path must run (it counts what it drops): another state or TVer, a short
        packet, QP1."""
        qp = self.qp
        st = qp.state
        b1 = data[1]
        if st < RTR or st > SQE or b1 & 0x0F or qp.qpn == 1:
            return False
        end = len(data) - (b1 >> 4 & 3)  # less the pad (IBA 9.2: PadCnt)
        if end < _BTH_SIZE + _DETH_SIZE:
            return False
        qkey, w = _DETH_AT(data, _BTH_SIZE)
        self._ud_deliver(qkey, w & 0xFFFFFF, data[_BTH_SIZE + _DETH_SIZE:end],
                         bool(b1 & _BTH_SE), None, meta)
        return True
