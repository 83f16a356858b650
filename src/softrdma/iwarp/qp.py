"""The iWARP device and queue pair behind the verbs API (sans-I/O).

:class:`IwarpDevice` is the iWARP counterpart of :class:`~softrdma.ib.port.Port`: it
owns the QP table and the memory table, whose keys are STags (``lkey == rkey == STag``,
allocated by :class:`~.stag.StagAllocator`: random, sparse, never sequential,
RFC 5040 §8.1.1 item 8). :class:`IwarpQP` has the :class:`~softrdma.ib.qp.EngineQP`
interface the verbs layer drives (``modify``, ``post_send``, ``post_recv``, ``query``,
``destroy``); its data path is the :class:`~.engine.IwarpConn` it is bound to by the
connection manager (:mod:`.cm`), as siw's QP is bound to its socket by the iWARP CM.

State rules (siw ``siw_qp_modify``; IBA 10.3 where they agree):

* an iWARP QP is always RC; it goes RESET -> INIT through ``modify`` and INIT -> RTS
  only through its connection (``modify`` to RTR/RTS raises InvalidArgument: the
  connection manager does it when MPA completes); SQD is not supported;
* ERR (by ``modify``, a fault, a Terminate or the peer closing) completes every posted
  work request: the one an error hit with its error status, all others with
  IBV_WC_WR_FLUSH_ERR (send queue in posting order, then the receive queue), and closes
  the connection;
* send completions are reported in posting order (RFC 5040 §5.5 rule 15); a WR is
  signaled if the QP has ``sq_sig_all`` or the WR has IBV_SEND_SIGNALED; errors always
  complete.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from ..enums import ibv_qp_state as QPS
from ..enums import ibv_qp_type as QPT
from ..enums import ibv_send_flags as SF
from ..enums import ibv_wc_flags as WCF
from ..enums import ibv_wc_opcode as WCO
from ..enums import ibv_wc_status as WCS
from ..enums import ibv_wr_opcode as WR
from ..errors import (
    ClosedError,
    DecodeError,
    InvalidArgument,
    NotSupported,
    ResourceError,
    StateError,
)
from ..ib.port import Port, RxMeta
from ..ib.qp import EngineSRQ, QPBase
from ..ib.types import CompletionSink, MemoryRegion, RecvWQE, SendWQE, WorkCompletion
from ..wire.ddp import Terminate
from .stag import StagAllocator
from .terminate import wc_status_for

if TYPE_CHECKING:
    from .engine import IwarpConn

__all__ = ["IwarpDevice", "IwarpQP", "SEND_OPCODES"]

RESET, INIT, RTR, RTS = int(QPS.IBV_QPS_RESET), int(QPS.IBV_QPS_INIT), int(QPS.IBV_QPS_RTR), \
    int(QPS.IBV_QPS_RTS)
SQD, SQE, ERR = int(QPS.IBV_QPS_SQD), int(QPS.IBV_QPS_SQE), int(QPS.IBV_QPS_ERR)

#: The send opcodes RDMAP carries (siw ``siw_post_send``); immediate data and atomics
#: have no RFC 5040 message.
SEND_OPCODES = frozenset(int(o) for o in (WR.IBV_WR_SEND, WR.IBV_WR_SEND_WITH_INV,
                                           WR.IBV_WR_RDMA_WRITE, WR.IBV_WR_RDMA_READ,
                                           WR.IBV_WR_LOCAL_INV))
_WC_OF = {
    int(WR.IBV_WR_SEND): int(WCO.IBV_WC_SEND),
    int(WR.IBV_WR_SEND_WITH_INV): int(WCO.IBV_WC_SEND),
    int(WR.IBV_WR_RDMA_WRITE): int(WCO.IBV_WC_RDMA_WRITE),
    int(WR.IBV_WR_RDMA_READ): int(WCO.IBV_WC_RDMA_READ),
    int(WR.IBV_WR_LOCAL_INV): int(WCO.IBV_WC_LOCAL_INV),
}
_SIGNALED = int(SF.IBV_SEND_SIGNALED)
_FLUSH = int(WCS.IBV_WC_WR_FLUSH_ERR)
_SUCCESS = int(WCS.IBV_WC_SUCCESS)
_RECV = int(WCO.IBV_WC_RECV)
_WITH_INV = int(WCF.IBV_WC_WITH_INV)
_W_DONE = 2


class IwarpDevice(Port):
    """One iWARP device port: QPs, STag-keyed memory regions, counters (sans-I/O).

    It is a :class:`~softrdma.ib.port.Port` for the verbs layer (MR registration, GIDs,
    P_Keys, counters, async events, SRQs); it carries no IB packets.
    """

    def __init__(self, gids: list[bytes], *, max_mtu: int = 4096) -> None:
        self.stags = StagAllocator()
        super().__init__(gids, max_mtu=max_mtu, key_alloc=self.stags.alloc)
        self.iw_qps: dict[int, IwarpQP] = {}

    def alloc_qpn(self) -> int:
        qpn = super().alloc_qpn()
        while qpn in self.iw_qps:
            qpn = super().alloc_qpn()
        return qpn

    def register_mr(self, buf: memoryview, addr: int, access: int, pd: object,
                    zero_based: bool = False) -> MemoryRegion:
        # a plain int: the access checks of the data path are then plain int operations
        return super().register_mr(buf, addr, int(access), pd, zero_based)

    def deregister_mr(self, mr: Any) -> None:
        super().deregister_mr(mr)
        self.stags.free(mr.lkey)

    def receive(self, data: memoryview, meta: RxMeta, now: float) -> None:
        raise DecodeError("an iWARP device receives TCP byte streams, not IB packets")


class IwarpQP(QPBase):
    """An iWARP queue pair (see the module docstring); same constructor as EngineQP."""

    port: IwarpDevice

    def __init__(self, port: IwarpDevice, qp_type: int, pd: object, send_cq: CompletionSink,
                 recv_cq: CompletionSink, srq: EngineSRQ | None, max_send_wr: int,
                 max_recv_wr: int, max_send_sge: int, max_recv_sge: int, max_inline_data: int,
                 sq_sig_all: bool, qpn: int | None = None) -> None:
        if qp_type != int(QPT.IBV_QPT_RC):
            raise NotSupported("iWARP devices support RC QPs only")
        super().__init__(port, qp_type, pd, send_cq, recv_cq, srq, max_send_wr, max_recv_wr,
                         max_send_sge, max_recv_sge, max_inline_data, sq_sig_all, qpn)
        self.access_flags = 0
        self.port_num = 1
        self.pkey_index = 0
        self.sq: deque[SendWQE] = deque()
        self.inflight: deque[SendWQE] = deque()
        self.rq: deque[RecvWQE] = deque()
        self.conn: IwarpConn | None = None
        self.destroyed = False
        self.last_error = ""
        port.iw_qps[self.qpn] = self

    # ---- helpers for the engine ------------------------------------------------------------
    @property
    def rx_pd(self) -> object:
        """The PD receive buffers are checked against (the SRQ's, if any)."""
        return self.srq.pd if self.srq is not None else self.pd

    def take_rwqe(self) -> RecvWQE | None:
        if self.srq is not None:
            return self.srq.take()
        return self.rq.popleft() if self.rq else None

    def peek_send(self) -> SendWQE | None:
        """The oldest posted send WQE not yet started (the connection's next message)."""
        return self.sq[0] if self.sq else None

    def start_send(self) -> SendWQE:
        """Move the oldest posted send WQE in flight: it completes in posting order."""
        w = self.sq.popleft()
        self.inflight.append(w)
        return w

    def complete_ready(self) -> None:
        """Report the finished send WQEs at the head of the queue (RFC 5040 §5.5 rule 15)."""
        inflight = self.inflight
        push = self.send_cq
        while inflight and inflight[0].state == _W_DONE:
            w = inflight.popleft()
            if w.error:
                push(WorkCompletion(w.wr_id, w.error, _WC_OF.get(w.opcode, 0), self.qpn))
            elif w.signaled:
                push(WorkCompletion(w.wr_id, _SUCCESS, _WC_OF.get(w.opcode, 0), self.qpn,
                                    w.length))

    def complete_recv(self, rwqe: RecvWQE, status: int, byte_len: int, invalidated: int,
                      solicited: bool) -> None:
        wc = WorkCompletion(rwqe.wr_id, status, _RECV, self.qpn,
                            byte_len if status == _SUCCESS else 0,
                            wc_flags=_WITH_INV if invalidated else 0,
                            invalidated_rkey=invalidated)
        wc.solicited = solicited
        self.recv_cq(wc)

    def on_established(self, conn: IwarpConn) -> None:
        """The connection reached full operation: the QP is in RTS (iw_cm)."""
        self.conn = conn
        if self.state in (RESET, INIT, RTR):
            self.state = RTS

    def on_conn_failed(self, conn: IwarpConn, term: Terminate | None) -> None:
        """The stream ended (fault, Terminate, EOF): error the QP (RFC 5040 §6.2.1)."""
        self.last_error = conn.reason
        if self.state == ERR:
            return
        if term is not None or conn.term_received is not None:
            status = wc_status_for(term)
            for w in self.inflight:
                if w.state != _W_DONE or w.opcode == WR.IBV_WR_RDMA_READ:
                    if not w.error:
                        w.error = status
                    break
        self.to_error("QP_FATAL")

    # ---- verbs entry points -----------------------------------------------------------------
    def modify(self, attrs: dict[str, Any], now: float) -> None:
        if self.destroyed:
            raise ClosedError("QP is destroyed")
        for key in ("port_num", "pkey_index"):
            if key in attrs:
                setattr(self, key, attrs[key])
        if "access_flags" in attrs:
            self.access_flags = int(attrs["access_flags"])
        if "qp_state" not in attrs:
            return
        new = int(attrs["qp_state"])
        if new == self.state:
            return
        if new == RESET:
            self._reset()
        elif new == INIT:
            self.state = INIT
        elif new == ERR:
            self.to_error()
        elif new in (RTR, RTS):
            raise InvalidArgument("qp_attr.qp_state", "an iWARP QP enters RTS through its "
                                  "connection (softrdma.cm.iwconnect.connect / Listener.accept)")
        else:
            raise NotSupported(f"QP state {QPS(new).name} is not supported on iWARP")

    def _reset(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        self.sq.clear()
        self.inflight.clear()
        self.rq.clear()
        self.state = RESET

    def to_error(self, event: str | None = None) -> None:
        """To ERR: complete everything outstanding (error or flush), close the stream."""
        if self.state == ERR:
            return
        self.state = ERR
        push = self.send_cq
        for queue in (self.inflight, self.sq):
            while queue:
                w = queue.popleft()
                status = w.error if w.error else _FLUSH
                push(WorkCompletion(w.wr_id, status, _WC_OF.get(w.opcode, 0), self.qpn))
        while self.rq:
            self.complete_recv(self.rq.popleft(), _FLUSH, 0, 0, False)
        conn = self.conn
        if conn is not None:
            conn.close()
        if self.srq is not None:
            self.port.on_async_event("QP_LAST_WQE_REACHED", self)
        if event is not None:
            self.port.on_async_event(event, self)

    def post_send(self, wqe: SendWQE, now: float) -> None:
        if self.destroyed:
            raise ClosedError("QP is destroyed")
        st = self.state
        if st in (RESET, INIT, RTR):
            raise StateError(f"post_send in state {QPS(st).name}: the QP must be connected")
        if len(self.sq) + len(self.inflight) >= self.max_send_wr:
            raise ResourceError(f"send queue full ({self.max_send_wr} WQEs)")
        wqe.send_flags = flags = int(wqe.send_flags)  # plain ints on the data path
        wqe.opcode = int(wqe.opcode)
        wqe.signaled = bool(self.sq_sig_all or flags & _SIGNALED)
        if st == ERR:
            self.send_cq(WorkCompletion(wqe.wr_id, _FLUSH, _WC_OF.get(wqe.opcode, 0), self.qpn))
            return
        self.sq.append(wqe)

    def post_recv(self, rwqe: RecvWQE) -> None:
        if self.destroyed:
            raise ClosedError("QP is destroyed")
        if self.srq is not None:
            raise StateError("the QP is attached to an SRQ: post receives to the SRQ")
        if self.state == RESET:
            raise StateError("post_recv in state RESET")
        if len(self.rq) >= self.max_recv_wr:
            raise ResourceError(f"receive queue full ({self.max_recv_wr} WQEs)")
        if self.state == ERR:
            self.complete_recv(rwqe, _FLUSH, 0, 0, False)
            return
        self.rq.append(rwqe)

    def query(self) -> dict[str, Any]:
        conn = self.conn
        ird = conn.ird if conn is not None else 0
        ord_ = conn.ord if conn is not None else 0
        return {
            "qp_state": self.state, "cur_qp_state": self.state, "path_mtu": 5,
            "qkey": 0, "pkey_index": self.pkey_index, "port_num": self.port_num,
            "access_flags": self.access_flags, "ah": None, "timeout": 0, "retry_cnt": 0,
            "rnr_retry": 0, "rq_psn": 0, "sq_psn": 0, "max_rd_atomic": ord_,
            "max_dest_rd_atomic": ird, "min_rnr_timer": 0, "dest_qp_num": 0,
            "en_sqd_async_notify": False, "sq_draining": False,
            "cap": (self.max_send_wr, self.max_recv_wr, self.max_send_sge, self.max_recv_sge,
                    self.max_inline_data),
        }

    def destroy(self) -> None:
        if self.destroyed:
            return
        self.destroyed = True
        if self.conn is not None:
            self.conn.close()
        if self.port.iw_qps.get(self.qpn) is self:
            del self.port.iw_qps[self.qpn]

    def attach_mcast(self, mgid: bytes) -> None:
        raise NotSupported("iWARP has no multicast")

    def detach_mcast(self, mgid: bytes) -> None:
        raise NotSupported("iWARP has no multicast")
