"""RDMAP transmit side of one iWARP stream: work requests to messages, in order (RFC 5040).

As siw's ``siw_qp_sq_process`` / ``siw_qp_prepare_tx`` (``siw_qp_tx.c``):

* messages go out in posting order (RFC 5040 §5.5 rule 13): the RFC 6581 RTR message
  first, then the Read Responses this side owes in Read Request order (rule 20, the IRQ),
  then the send queue, whose head waits for a Fence or an ORD slot
  (:meth:`~.orq_irq.ReadQueues.ready`);
* each message is cut into DDP segments (:func:`~.ddp_place.segment`) and framed into
  FPDUs (:func:`~.mpa_stream.frame`) as the driver pulls bytes; runs of segments of a
  message with one contiguous payload take the fused loop of
  :func:`~.fast_path.frame_run` (same bytes, fewer Python calls);
* a send WQE becomes one message (:class:`~.ddp_place.TxMsg`): RDMA Write (tagged,
  §4.3), RDMA Read Request (untagged QN 1 with the 28-octet header, §4.4; its sink goes
  on the ORQ), Send / Send with Invalidate / with Solicited Event (untagged QN 0, §4.6);
  Local Invalidate is done here (§6.9) without a message;
* a Send or RDMA Write completes once all its bytes were accepted by the LLP (rule 14),
  a Read when its response is in (the receive side); the QP reports completions in
  posting order (rule 15);
* an error in a local work request (a bad lkey, a Read with ORD 0) completes it in error
  and fails the stream with a local catastrophic Terminate (RFC 5040 §7.1 case 1).
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

from ..enums import ibv_access_flags as ACC
from ..enums import ibv_send_flags as SF
from ..enums import ibv_wc_status as WCS
from ..enums import ibv_wr_opcode as WR
from ..seam.memory import resolve_sges
from ..seam.types import RecvWQE, SendWQE
from ..wire.ddp import QN_READ_REQUEST, QN_SEND, READ_REQ, RdmapOpcode, Terminate
from ..wire.mpa import FpduEncoder
from .ddp_place import (
    MASK32,
    TAGGED_HDR_LEN,
    UNTAGGED_HDR_LEN,
    PlacementDevice,
    PlacementQP,
    ReadCtx,
    TxMsg,
    segment,
)
from .fast_path import fast_tx_ok, frame_run
from .mpa_setup import RTR_READ, RTR_WRITE
from .mpa_stream import Buf, frame
from .orq_irq import ReadQueues
from .terminate import IwarpFault

__all__ = ["RdmapTx", "RdmapOwner", "RdmapQP", "W_STARTED", "W_DONE", "RTR_STAG"]

# SendWQE.state values (the QP reports a WQE once it is W_DONE)
W_STARTED, W_DONE = 1, 2
RTR_STAG = 1  # the STag of RFC 6581 zero-length RTR messages (siw ``siw_qp_mpa_rts``)

_OP_WRITE = int(RdmapOpcode.RDMA_WRITE)
_OP_RREQ = int(RdmapOpcode.RDMA_READ_REQUEST)
_OP_SEND = int(RdmapOpcode.SEND)
_OP_SEND_INV = int(RdmapOpcode.SEND_INVALIDATE)
_OP_SEND_SE = int(RdmapOpcode.SEND_SE)
_OP_SEND_SE_INV = int(RdmapOpcode.SEND_SE_INVALIDATE)
_LOCAL_WRITE = int(ACC.IBV_ACCESS_LOCAL_WRITE)
_SOLICITED = int(SF.IBV_SEND_SOLICITED)
_READ = int(WR.IBV_WR_RDMA_READ)


class RdmapQP(PlacementQP, Protocol):
    """What RDMAP needs of its QP (:class:`~.qp.IwarpQP`): the receive side of
    :class:`~.ddp_place.PlacementQP`, completions, and the send queue's head."""

    def complete_recv(self, rwqe: RecvWQE, status: int, byte_len: int, invalidated: int,
                      solicited: bool) -> None:
        """Report a receive completion."""

    def complete_ready(self) -> None:
        """Report the send WQEs at the head of the queue that are W_DONE (rule 15)."""

    def peek_send(self) -> SendWQE | None:
        """The oldest posted send WQE not yet started."""

    def start_send(self) -> SendWQE:
        """Move the oldest posted send WQE in flight (it completes in this order)."""


class RdmapOwner(Protocol):
    """The connection that ends the stream (:class:`~.engine.IwarpConn`)."""

    def fail(self, f: IwarpFault) -> None:
        """This side detected an error: Terminate and tear down (RFC 5040 §7.1)."""

    def peer_terminated(self, term: Terminate | None) -> None:
        """The peer sent a Terminate (None: malformed): tear down (RFC 5040 §5.4)."""


class RdmapTx:
    """The transmit side of RDMAP on one stream (see the module docstring).

    ``tx_msn[qn]`` is the MSN of the last message sent on queue ``qn`` (RFC 5041 §5.3);
    ``rtr_msg`` the initiator's pending RTR; ``gate`` holds everything back until a
    responder has received the RTR (RFC 6581 §4).
    """

    __slots__ = ("owner", "dev", "qp", "rq", "tx_msn", "rtr_msg", "gate", "_failed", "cur",
                 "offset", "_acked", "_done", "_maxpay_t", "_maxpay_u", "fpdus")

    def __init__(self, owner: RdmapOwner, dev: PlacementDevice, rq: ReadQueues,
                 qp: RdmapQP | None = None) -> None:
        self.owner = owner
        self.dev = dev
        self.qp = qp
        self.rq = rq
        self.tx_msn = [0, 0, 0]
        self.rtr_msg: TxMsg | None = None
        self.gate = False
        self._failed = False
        self.cur: TxMsg | None = None  # the message being cut into FPDUs
        self.offset = 0  # octets of the stream pulled so far (MPA frames included)
        self._acked = 0  # ... and accepted by the LLP
        self._done: deque[tuple[int, TxMsg]] = deque()  # (stream end offset, message)
        self._maxpay_t = self._maxpay_u = 1
        self.fpdus = 0  # FPDUs cut so far (the device's sent_pkts)

    def set_mulpdu(self, mul: int) -> None:
        """Segments cut from now on fit in FPDUs of ``mul`` ULPDU octets (RFC 5044 §4.2)."""
        self._maxpay_t = max(mul - TAGGED_HDR_LEN, 1)
        self._maxpay_u = max(mul - UNTAGGED_HDR_LEN, 1)

    def pull(self, enc: FpduEncoder, out: list[Buf], room: int, max_bufs: int) -> int:
        """Append whole FPDUs of the next messages to ``out`` while fewer than ``room``
        octets and ``max_bufs`` buffers were added; returns the octets added."""
        total = 0
        while total < room and len(out) < max_bufs and not self._failed:
            msg = self.cur
            if msg is None:
                msg = self.next_msg()
                if msg is None:
                    break
            if fast_tx_ok(enc, msg):  # the fused loop, byte-identical (fast_path)
                had = len(out)
                n, last = frame_run(enc, msg, self._maxpay_t, self._maxpay_u, out,
                                    room - total, max_bufs)
                self.fpdus += (len(out) - had) // 3  # [header, payload, PAD + CRC] each
            else:
                parts, paylen, last = segment(msg, self._maxpay_t, self._maxpay_u)
                bufs, n = frame(enc, parts, paylen)
                out.extend(bufs)
                self.fpdus += 1
            total += n
            self.offset += n
            if last:
                self.cur = None
                if msg.read_resp:
                    self.rq.response_sent()
                if msg.wqe is not None:
                    self._done.append((self.offset, msg))
            else:
                self.cur = msg
        return total

    def acked(self, n: int) -> None:
        """``n`` more octets were accepted by the LLP: a Send or RDMA Write whose last
        octet is among them is done (rule 14); report what completed in order."""
        self._acked += n
        done = self._done
        completed = False
        while done and done[0][0] <= self._acked:
            w = done.popleft()[1].wqe
            if w is not None and w.opcode != _READ:
                w.state = W_DONE
                completed = True
        if completed and self.qp is not None:
            self.qp.complete_ready()

    def has_tx(self) -> bool:
        """A message could start now."""
        if self.rtr_msg is not None:
            return True
        if self.gate:
            return False
        if self.rq.irq:
            return True
        qp = self.qp
        if qp is None:
            return False
        w = qp.peek_send()
        return w is not None and self.rq.ready(w)

    def next_msg(self) -> TxMsg | None:
        """Next message: the RTR, then Read Responses, then the send queue (RFC 5040 §5.5)."""
        rtr = self.rtr_msg
        if rtr is not None:
            self.rtr_msg = None
            return rtr
        if self.gate or self._failed:
            return None
        resp = self.rq.next_response()
        if resp is not None:
            return resp
        qp = self.qp
        if qp is None:
            return None
        while True:
            w = qp.peek_send()
            if w is None or not self.rq.ready(w):
                return None
            qp.start_send()
            w.state = W_STARTED
            msg = self._start_wqe(qp, w)
            if msg is not None or self._failed:
                return msg

    def _next_msn(self, qn: int) -> int:
        self.tx_msn[qn] = (self.tx_msn[qn] + 1) & MASK32
        return self.tx_msn[qn]

    def send_rtr(self, kind: str) -> None:
        """Queue the initiator's zero-length RTR message (RFC 6581 §4; siw
        ``siw_qp_mpa_rts``): an RDMA Write to STag 1, a Read Request of nothing, or an
        empty Send."""
        if kind == RTR_WRITE:
            msg = TxMsg(_OP_WRITE, [], 0, tagged=True, stag=RTR_STAG, to=0, rtr=True)
        elif kind == RTR_READ:
            msn = self._next_msn(QN_READ_REQUEST)
            self.rq.issue(ReadCtx(None, RTR_STAG, 0, 0, []))
            rr = READ_REQ.pack(RTR_STAG, 0, 0, RTR_STAG, 0)
            msg = TxMsg(_OP_RREQ, [], 0, tagged=False, qn=QN_READ_REQUEST, msn=msn, extra=rr,
                        rtr=True)
        else:
            msg = TxMsg(_OP_SEND, [], 0, tagged=False, qn=QN_SEND,
                        msn=self._next_msn(QN_SEND), rtr=True)
        self.rtr_msg = msg

    def _start_wqe(self, qp: RdmapQP, w: SendWQE) -> TxMsg | None:
        """Turn a send WQE into its RDMAP message (or execute a local operation)."""
        op = w.opcode
        if op == WR.IBV_WR_LOCAL_INV:
            mr = self.dev.mrs.get(w.invalidate_rkey)
            if mr is None or mr.pd is not qp.pd:
                self._local_error(w, int(WCS.IBV_WC_LOC_PROT_ERR), "LOCAL_INV of an unknown STag")
                return None
            mr.valid = False
            w.state = W_DONE
            qp.complete_ready()
            return None
        if w.inline_data is not None:
            segs: list[memoryview] | None = [memoryview(w.inline_data)] if w.inline_data else []
        else:
            need = _LOCAL_WRITE if op == _READ else 0
            segs = resolve_sges(self.dev.mrs, qp.pd, w.sg_list, need)
        if segs is None:
            self._local_error(w, int(WCS.IBV_WC_LOC_PROT_ERR), "local protection error")
            return None
        n = w.length
        if op == WR.IBV_WR_RDMA_WRITE:
            return TxMsg(_OP_WRITE, segs, n, tagged=True, stag=w.rkey, to=w.remote_addr, wqe=w)
        if op == _READ:
            if self.rq.ord == 0:
                self._local_error(w, int(WCS.IBV_WC_LOC_QP_OP_ERR), "RDMA Read with ORD 0")
                return None
            sge = w.sg_list[0] if w.sg_list else None
            sink_stag = sge.lkey if sge is not None else 0
            sink_to = sge.addr if sge is not None else 0
            msn = self._next_msn(QN_READ_REQUEST)
            self.rq.issue(ReadCtx(w, sink_stag, sink_to, n, segs))
            rr = READ_REQ.pack(sink_stag, sink_to, n, w.rkey, w.remote_addr)
            return TxMsg(_OP_RREQ, [], 0, tagged=False, qn=QN_READ_REQUEST, msn=msn, extra=rr,
                         wqe=w)
        se = bool(w.send_flags & _SOLICITED)
        if op == WR.IBV_WR_SEND_WITH_INV:
            opcode = _OP_SEND_SE_INV if se else _OP_SEND_INV
            inv = w.invalidate_rkey
        else:
            opcode = _OP_SEND_SE if se else _OP_SEND
            inv = 0
        return TxMsg(opcode, segs, n, tagged=False, rsvdulp=inv, qn=QN_SEND,
                     msn=self._next_msn(QN_SEND), wqe=w)

    def _local_error(self, w: SendWQE, status: int, reason: str) -> None:
        """RFC 5040 §7.1 case 1: an error creating a request sends a Terminate instead."""
        w.error = status
        w.state = W_DONE
        self._failed = True
        self.owner.fail(IwarpFault.local_catastrophic(reason))
