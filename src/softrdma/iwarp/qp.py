"""The iWARP device and queue pair behind the verbs API (sans-I/O).

:class:`IwarpDevice` implements :class:`~softrdma.seam.protocols.DeviceEngine` beside
the IB :class:`~softrdma.ib.port.Port` (no inheritance between them; the tables they keep
alike are :class:`~softrdma.seam.tables.DeviceTables`): the QP table and the memory
table, whose keys are STags (``lkey == rkey == STag``, allocated by
:class:`~.stag.StagAllocator`: random, sparse, never sequential, RFC 5040 §8.1.1 item 8).
:class:`IwarpQP` implements :class:`~softrdma.seam.protocols.QPEngine`, the interface the
verbs layer drives (``modify``, ``post_send``, ``post_recv``, ``query``, ``destroy``);
its receive queue and flush are :mod:`softrdma.seam.queues`'; its data path is the
:class:`~.engine.IwarpConn` it is bound to by the connection manager (:mod:`.cm`), as
siw's QP is bound to its socket by the iWARP CM.

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
from typing import TYPE_CHECKING

from ..enums import ibv_qp_state as QPS
from ..enums import ibv_send_flags as SF
from ..enums import ibv_wc_flags as WCF
from ..enums import ibv_wc_opcode as WCO
from ..enums import ibv_wc_status as WCS
from ..enums import ibv_wr_opcode as WR
from ..errors import ClosedError, InvalidArgument, NotSupported
from ..seam.attrs import ModifyAttrs, QueryAttrs, apply_port_attrs
from ..seam.counters import Counters
from ..seam.events import AsyncEventType
from ..seam.queues import (
    FLUSH_ERR,
    WC_RECV,
    EngineSRQ,
    QPInit,
    ReceiveQueue,
    RecvFeed,
    check_post_send,
    error_events,
    take_done,
)
from ..seam.states import ERR, INIT, QPT_RC, RESET, RTR, RTS
from ..seam.tables import DEFAULT_PKEY, GID_TYPE_ROCE_V2, DeviceTables
from ..seam.types import RecvWQE, SendWQE, WorkCompletion
from ..wire.ddp import Terminate
from .stag import StagAllocator
from .terminate import wc_status_for

if TYPE_CHECKING:
    from .engine import IwarpConn

__all__ = ["IwarpDevice", "IwarpQP", "SEND_OPCODES", "RESET", "INIT", "RTR", "RTS", "ERR"]

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
_FLUSH = FLUSH_ERR
_SUCCESS = int(WCS.IBV_WC_SUCCESS)
_RECV = WC_RECV
_WITH_INV = int(WCF.IBV_WC_WITH_INV)
_W_DONE = 2


class IwarpDevice(DeviceTables["IwarpQP"]):
    """One iWARP device port: QPs, STag-keyed memory regions, counters (sans-I/O); a
    :class:`~softrdma.seam.protocols.DeviceEngine` beside the IB
    :class:`~softrdma.ib.port.Port`. It carries no IB packets: its QPs' data path is
    their TCP connection (:mod:`.engine`)."""

    def __init__(self, gids: list[bytes], *, max_mtu: int = 4096) -> None:
        self.stags = StagAllocator()
        super().__init__(key_alloc=self.stags.alloc, key_free=self.stags.free)
        self.gids = list(gids)
        # iWARP GIDs are the netdev's addresses (siw); reported with the type of an IP
        # GID (libibverbs has no iWARP GID type)
        self.gid_types: list[int] = [GID_TYPE_ROCE_V2] * len(self.gids)
        self.max_mtu = max_mtu
        self.pkeys: tuple[int, ...] = (DEFAULT_PKEY,)
        self.counters = Counters()
        #: iWARP has no multicast (RFC 5040 is point-to-point): always empty
        self.mcast: dict[bytes, set[IwarpQP]] = {}

    def create_qp(self, init: QPInit) -> IwarpQP:
        """A new RC QP in RESET (iWARP has RC only, siw ``siw_create_qp``)."""
        return IwarpQP(self, init)


class IwarpQP:
    """An iWARP queue pair (see the module docstring); a
    :class:`~softrdma.seam.protocols.QPEngine`, same constructor as the IB EngineQP."""

    send_opcodes: frozenset[int] | None = SEND_OPCODES
    #: an RDMA Read has one sink buffer (siw)
    max_read_sge = 1

    #: iWARP has one service type, reliable connected (RFC 5040 §1; siw)
    qp_type = QPT_RC

    def __init__(self, port: IwarpDevice, init: QPInit, qpn: int | None = None) -> None:
        if init.qp_type != QPT_RC:
            raise NotSupported("iWARP devices support RC QPs only")
        self.sq: deque[SendWQE] = deque()  # posted, not yet started by the connection
        self.inflight: deque[SendWQE] = deque()  # started, completed in posting order
        self.init = init
        self.port = port
        self.pd = init.pd
        self.send_cq = init.send_cq
        self.state = RESET
        self.qpn = port.alloc_qpn() if qpn is None else qpn
        self.access_flags = 0
        self.port_num = 1
        self.pkey_index = 0
        self.rate_limit_bps = 0.0
        self.rq = ReceiveQueue(self.qpn, init)
        self.take_rwqe = self.rq.take
        self.conn: IwarpConn | None = None
        self.destroyed = False
        self.last_error = ""
        port.qps[self.qpn] = self

    # ---- helpers for the engine ------------------------------------------------------------
    @property
    def rx_pd(self) -> object:
        """The PD receive buffers are checked against (the SRQ's, if any)."""
        srq = self.init.srq
        return srq.pd if srq is not None else self.pd

    @property
    def srq(self) -> EngineSRQ | None:
        return self.init.srq

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
        push = self.send_cq
        for w in take_done(self.inflight, _W_DONE):
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
        self.init.recv_cq(wc)

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
        self.to_error(AsyncEventType.QP_FATAL)

    # ---- verbs entry points -----------------------------------------------------------------
    def modify(self, attrs: ModifyAttrs, now: float) -> None:
        if self.destroyed:
            raise ClosedError("QP is destroyed")
        apply_port_attrs(self, attrs)
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
                                  "connection (softrdma.drivers.cm.iwconnect.connect / Listener.accept)")
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

    def to_error(self, event: AsyncEventType | None = None) -> None:
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
        self.rq.flush()
        conn = self.conn
        if conn is not None:
            conn.close()
        error_events(self.port.events, self, self.init.srq, event)

    def post_send(self, wqe: SendWQE, now: float) -> None:
        st = self.state
        check_post_send(st, self.destroyed, len(self.sq) + len(self.inflight), self.init.max_send_wr,
                        "the QP must be connected")
        wqe.send_flags = flags = int(wqe.send_flags)  # plain ints on the data path
        wqe.opcode = int(wqe.opcode)
        wqe.signaled = bool(self.init.sq_sig_all or flags & _SIGNALED)
        if st == ERR:
            self.send_cq(WorkCompletion(wqe.wr_id, _FLUSH, _WC_OF.get(wqe.opcode, 0), self.qpn))
            return
        self.sq.append(wqe)

    def post_recv(self, rwqe: RecvWQE) -> None:
        self.rq.post(rwqe, self.state, self.destroyed)

    def set_recv_feed(self, feed: RecvFeed | None) -> None:
        """Receives stored in ``feed`` reach the receive queue (:class:`RecvFeed`)."""
        self.rq.set_feed(feed)

    def post_recvs(self, rwqes: list[RecvWQE]) -> None:
        """:meth:`post_recv` of each, in order (the ones before a refused one stay)."""
        self.rq.post_many(rwqes, self.state, self.destroyed)

    def query(self) -> QueryAttrs:
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
            "cap": self.init.cap,
        }

    def destroy(self) -> None:
        if self.destroyed:
            return
        self.destroyed = True
        if self.conn is not None:
            self.conn.close()
        if self.port.qps.get(self.qpn) is self:
            del self.port.qps[self.qpn]

    def attach_mcast(self, mgid: bytes) -> None:
        raise NotSupported("iWARP has no multicast")

    def detach_mcast(self, mgid: bytes) -> None:
        raise NotSupported("iWARP has no multicast")
