"""Queue pairs of the IB transport engine: state, queues, and the RC/UC/UD machinery.

An :class:`EngineQP` holds the QP attributes (IBA 11.2.5), its send and receive queues,
and three engines (IBA 9.7, the RC requester/completer/responder model; rxe_req.c,
rxe_comp.c, rxe_resp.c):

* :class:`~softrdma.ib.requester.Requester` turns send WQEs into request packets (PSN
  assignment, segmentation by path MTU, go-back-N retransmission, RNR waits) and
  completes them from ACKs, NAKs and responses (the "completer");
* :class:`~softrdma.ib.responder.Responder` executes incoming requests (placement,
  remote access checks, duplicate handling from responder resources) and generates
  ACKs, NAKs and read/atomic responses.

The state machine of IBA 10.3.1 (RESET, INIT, RTR, RTS, SQD, SQE, ERR) is enforced by the
verbs layer's transition table; here each state decides what the engines may do.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any

from ..enums import ibv_qp_state as QPS
from ..enums import ibv_qp_type as QPT
from ..enums import ibv_wc_opcode as WCO
from ..enums import ibv_wc_status as WCS
from ..errors import ClosedError, ResourceError, StateError
from .pacing import rate_bps
from .port import Port, TxPacket
from .types import CompletionSink, RecvWQE, SendWQE, WorkCompletion

RESET = int(QPS.IBV_QPS_RESET)
INIT = int(QPS.IBV_QPS_INIT)
RTR = int(QPS.IBV_QPS_RTR)
RTS = int(QPS.IBV_QPS_RTS)
SQD = int(QPS.IBV_QPS_SQD)
SQE = int(QPS.IBV_QPS_SQE)
ERR = int(QPS.IBV_QPS_ERR)

QPT_RC = int(QPT.IBV_QPT_RC)
QPT_UC = int(QPT.IBV_QPT_UC)
QPT_UD = int(QPT.IBV_QPT_UD)


def mtu_bytes(mtu_enum: int) -> int:
    """Bytes of payload per packet for an ``ibv_mtu`` value (IBA 9.2: 256 << (enum-1))."""
    return 128 << mtu_enum


def hash32(val: int, bits: int) -> int:
    """Linux ``hash_32`` (GOLDEN_RATIO_32 multiplicative hash)."""
    return ((val * 0x61C88647) & 0xFFFFFFFF) >> (32 - bits)


def rxe_udp_sport(qpn: int) -> int:
    """The RoCEv2 UDP source port rxe uses for a QP: 0xC000 + hash_32(qpn, 14)."""
    return 0xC000 + hash32(qpn, 14)


_QP_LOG = logging.getLogger("softrdma.qp")  # SOFTRDMA_TRACE=qp (softrdma.trace)


def _trace_state(qp: QPBase, old: int, new: int, why: str = "") -> None:
    """One trace line per QP state transition (IBA 10.3.1), when ``softrdma.qp`` is on."""
    if _QP_LOG.isEnabledFor(logging.DEBUG):
        kind = QPT(qp.qp_type).name.removeprefix("IBV_QPT_") if qp.qp_type in (
            t.value for t in QPT) else str(qp.qp_type)
        _QP_LOG.debug("QP 0x%06x %s: %s -> %s%s", qp.qpn, kind,
                      QPS(old).name.removeprefix("IBV_QPS_"),
                      QPS(new).name.removeprefix("IBV_QPS_"), why)


class AddressVector:
    """Where a QP's packets go (IBA 11.2.5.3 address vector; ``ibv_ah_attr`` + GRH)."""

    __slots__ = ("dgid", "sgid_index", "flow_label", "hop_limit", "traffic_class", "sl", "dlid",
                 "port_num", "is_global", "dmac", "static_rate", "rate_bps")

    def __init__(self, dgid: bytes, sgid_index: int = 0, flow_label: int = 0,
                 hop_limit: int = 64, traffic_class: int = 0, sl: int = 0, dlid: int = 0,
                 port_num: int = 1, is_global: bool = True, dmac: bytes = b"",
                 static_rate: int = 0) -> None:
        self.dgid = bytes(dgid)
        self.sgid_index = sgid_index
        self.flow_label = flow_label
        self.hop_limit = hop_limit
        self.traffic_class = traffic_class
        self.sl = sl
        self.dlid = dlid
        self.port_num = port_num
        self.is_global = is_global
        self.dmac = dmac
        self.static_rate = static_rate  # IBV_RATE_* (IBA 9.11 static rate control)
        self.rate_bps = rate_bps(static_rate)

    def __repr__(self) -> str:
        return f"AddressVector(dgid={self.dgid.hex()}, sgid_index={self.sgid_index})"


class EngineSRQ:
    """A shared receive queue (IBA 10.2.9): receive WQEs taken by any QP attached to it."""

    def __init__(self, port: Port, pd: object, max_wr: int, max_sge: int,
                 srq_limit: int = 0) -> None:
        self.port = port
        self.pd = pd
        self.max_wr = max_wr
        self.max_sge = max_sge
        self.srq_limit = srq_limit
        self.q: deque[RecvWQE] = deque()
        self.closed = False
        self.error = False

    def __len__(self) -> int:
        return len(self.q)

    def post_recv(self, rwqe: RecvWQE) -> None:
        if self.closed:
            raise ClosedError("SRQ is destroyed")
        if len(self.q) >= self.max_wr:
            raise ResourceError(f"SRQ full ({self.max_wr} WQEs)")
        self.q.append(rwqe)

    def modify(self, max_wr: int | None = None, srq_limit: int | None = None) -> None:
        if max_wr is not None:
            self.max_wr = max_wr
        if srq_limit is not None:
            self.srq_limit = srq_limit

    def take(self) -> RecvWQE | None:
        """Next receive WQE; fires SRQ_LIMIT_REACHED once when the level drops below the limit."""
        if not self.q:
            return None
        rwqe = self.q.popleft()
        if self.srq_limit and len(self.q) < self.srq_limit:
            self.srq_limit = 0  # IBA 10.2.9.6: the limit is disarmed when it fires
            self.port.on_async_event("SRQ_LIMIT_REACHED", self)
        return rwqe

    def push_front(self, rwqe: RecvWQE) -> None:
        self.q.appendleft(rwqe)


class QPBase:
    """What every engine QP holds (IB and iWARP alike): the creation attributes the verbs
    layer passes (``ibv_qp_init_attr``), the QP number and the state."""

    def __init__(self, port: Port, qp_type: int, pd: object, send_cq: CompletionSink,
                 recv_cq: CompletionSink, srq: EngineSRQ | None, max_send_wr: int,
                 max_recv_wr: int, max_send_sge: int, max_recv_sge: int, max_inline_data: int,
                 sq_sig_all: bool, qpn: int | None = None) -> None:
        self.port = port
        self.qp_type = qp_type
        self.pd = pd
        self.send_cq = send_cq
        self.recv_cq = recv_cq
        self.srq = srq
        self.max_send_wr = max_send_wr
        self.max_recv_wr = max_recv_wr
        self.max_send_sge = max_send_sge
        self.max_recv_sge = max_recv_sge
        self.max_inline_data = max_inline_data
        self.sq_sig_all = sq_sig_all
        self.qpn = port.alloc_qpn() if qpn is None else qpn
        self.state = RESET


class EngineQP(QPBase):
    """One queue pair in the engine (see the module docstring)."""

    def __init__(self, port: Port, qp_type: int, pd: object, send_cq: CompletionSink,
                 recv_cq: CompletionSink, srq: EngineSRQ | None, max_send_wr: int,
                 max_recv_wr: int, max_send_sge: int, max_recv_sge: int, max_inline_data: int,
                 sq_sig_all: bool, qpn: int | None = None) -> None:
        from .requester import Requester
        from .responder import Responder

        if qp_type not in (QPT_RC, QPT_UC, QPT_UD):
            raise ValueError(f"unsupported QP type {qp_type}")
        super().__init__(port, qp_type, pd, send_cq, recv_cq, srq, max_send_wr, max_recv_wr,
                         max_send_sge, max_recv_sge, max_inline_data, sq_sig_all, qpn)
        # attributes (IBA 11.2.5; ibv_qp_attr)
        self.path_mtu = 5 if qp_type == QPT_UD else 1
        self.qkey = 0
        self.pkey_index = 0
        self.port_num = 1
        self.access_flags = 0
        self.av: AddressVector | None = None
        self.timeout = 0
        self.retry_cnt = 7
        self.rnr_retry = 7
        self.rq_psn = 0
        self.sq_psn = 0
        self.max_rd_atomic = 0
        self.max_dest_rd_atomic = 0
        self.min_rnr_timer = 0
        self.dest_qpn = 0
        self.en_sqd_async_notify = False
        self.sport = rxe_udp_sport(self.qpn)
        self.mtu = 0
        self.pkey = 0
        # (source GID, destination GID) a connected QP accepts packets with; None: any
        self.peer_gids: tuple[bytes, bytes] | None = None
        # softrdma's ibv_modify_qp_rate_limit: a rate cap in bit/s on top of the AV's
        # static rate (0.0: none), ib/pacing.py
        self.rate_limit_bps = 0.0
        self._derive()
        self.rq: deque[RecvWQE] = deque()
        self.deadline: float | None = None
        self.ack_psn = -1
        self.destroyed = False
        self.sqd_notified = False
        self.req = Requester(self)
        self.resp = Responder(self)
        port.add_qp(self)

    # ---- helpers used by the engines -------------------------------------------------------
    def _derive(self) -> None:
        """Recompute the per-packet constants: payload MTU and P_Key (hot-path attributes)."""
        self.mtu = self.port.max_mtu if self.qp_type == QPT_UD else mtu_bytes(self.path_mtu)
        pk = self.port.pkeys
        self.pkey = pk[self.pkey_index] if self.pkey_index < len(pk) else pk[0]
        av = self.av
        if av is not None and self.qp_type != QPT_UD:
            gids = self.port.gids
            sgid = gids[av.sgid_index] if av.sgid_index < len(gids) else gids[0]
            self.peer_gids = (av.dgid, sgid)
        else:
            self.peer_gids = None

    def from_peer(self, meta: Any) -> bool:
        """Whether a packet comes from this connected QP's peer: its source GID is the
        address vector's DGID and its destination GID the QP's SGID (IBA 9.6: a connected
        QP's packets must carry its path's addresses; rxe ``check_addr`` drops the rest).
        UD QPs accept any source."""
        peer = self.peer_gids
        return peer is None or (meta.sgid == peer[0] and meta.dgid == peer[1])
    def tx(self, parts: list[Any], length: int, av: AddressVector | None = None) -> None:
        """Queue one packet (BTH .. pad) for the driver."""
        a = av if av is not None else self.av
        if a is None:
            return
        port = self.port
        gids = port.gids
        i = a.sgid_index if a.sgid_index < len(gids) else 0
        port.tx.append(TxPacket(gids[i], a.dgid, self.sport, parts, length, a.traffic_class,
                                a.hop_limit, a.flow_label, port.gid_v1[i], a.sl))
        c = port.counters
        c.sent_pkts += 1
        c.sent_bytes += length + 4  # BTH .. ICRC

    def set_deadline(self, t: float | None) -> None:
        self.deadline = t
        if t is not None:
            self.port.arm(self)

    def complete_send(self, wc: WorkCompletion) -> None:
        self.send_cq(wc)

    def complete_recv(self, wc: WorkCompletion) -> None:
        self.recv_cq(wc)

    def take_rwqe(self) -> RecvWQE | None:
        if self.srq is not None:
            return self.srq.take()
        return self.rq.popleft() if self.rq else None

    def return_rwqe(self, rwqe: RecvWQE) -> None:
        if self.srq is not None:
            self.srq.push_front(rwqe)
        else:
            self.rq.appendleft(rwqe)

    # ---- verbs entry points -----------------------------------------------------------------
    def modify(self, attrs: dict[str, Any], now: float) -> None:
        """Apply already-validated attributes and the state transition (IBA 10.3, 11.2.5.2)."""
        if self.destroyed:
            raise ClosedError("QP is destroyed")
        for key in ("path_mtu", "qkey", "pkey_index", "port_num", "timeout", "retry_cnt",
                    "rnr_retry", "max_rd_atomic", "max_dest_rd_atomic", "min_rnr_timer",
                    "en_sqd_async_notify"):
            if key in attrs:
                setattr(self, key, attrs[key])
        if "access_flags" in attrs:
            self.access_flags = int(attrs["access_flags"])
        if "ah" in attrs:
            self.av = attrs["ah"]
        if "dest_qp_num" in attrs:
            self.dest_qpn = int(attrs["dest_qp_num"]) & 0xFFFFFF
        if "rq_psn" in attrs:
            self.rq_psn = int(attrs["rq_psn"]) & 0xFFFFFF
            self.resp.set_epsn(self.rq_psn)
        if "sq_psn" in attrs:
            self.sq_psn = int(attrs["sq_psn"]) & 0xFFFFFF
            self.req.set_psn(self.sq_psn)
        self._derive()
        if "qp_state" not in attrs:
            return
        new = int(attrs["qp_state"])
        old = self.state
        if new == old and new not in (SQD,):
            return
        if new != ERR:
            _trace_state(self, old, new)
        if new == RESET:
            self._reset()
        elif new == ERR:
            self.to_error()
            return
        self.state = new
        if new == SQD:
            self.sqd_notified = False
            self.req.check_drained()
        elif new == RTS and old in (SQD, SQE, RTR):
            self.req.pump(now)

    def _reset(self) -> None:
        """To RESET: queues emptied without completions, PSN state cleared (IBA 10.3.1)."""
        self.req.reset()
        self.resp.reset()
        self.rq.clear()
        self.set_deadline(None)
        self.state = RESET

    def to_error(self, event: str | None = None) -> None:
        """Move to ERR and flush every outstanding WQE with IBV_WC_WR_FLUSH_ERR (IBA 10.3.1.7)."""
        if self.state == ERR:
            return
        _trace_state(self, self.state, ERR, f" ({event})" if event else "")
        # The requests this responder executed are acknowledged before the flush: rxe
        # ACKs each at once, a coalesced ACK would otherwise be lost (the peer's WQE
        # then completes with a flush error after a DREQ that overtook it).
        self.flush_ack()
        self.state = ERR
        self.set_deadline(None)
        self.req.flush()
        self.resp.abort()
        while self.rq:
            rwqe = self.rq.popleft()
            self.complete_recv(WorkCompletion(rwqe.wr_id, WCS.IBV_WC_WR_FLUSH_ERR, WCO.IBV_WC_RECV,
                                              self.qpn))
        if self.srq is not None:
            self.port.on_async_event("QP_LAST_WQE_REACHED", self)
        if event is not None:
            self.port.on_async_event(event, self)

    def post_send(self, wqe: SendWQE, now: float) -> None:
        if self.destroyed:
            raise ClosedError("QP is destroyed")
        st = self.state
        if st in (RESET, INIT, RTR):
            raise StateError(f"post_send in state {QPS(st).name}: the QP must be in RTS")
        if self.req.depth() >= self.max_send_wr:
            raise ResourceError(f"send queue full ({self.max_send_wr} WQEs)")
        if st == ERR or st == SQE:
            wqe.signaled = True
            self.req.flush_one(wqe)
            return
        self.req.post(wqe, now)

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
            self.complete_recv(WorkCompletion(rwqe.wr_id, WCS.IBV_WC_WR_FLUSH_ERR, WCO.IBV_WC_RECV,
                                              self.qpn))
            return
        self.rq.append(rwqe)

    def query(self) -> dict[str, Any]:
        return {
            "qp_state": self.state, "cur_qp_state": self.state, "path_mtu": self.path_mtu,
            "qkey": self.qkey, "pkey_index": self.pkey_index, "port_num": self.port_num,
            "access_flags": self.access_flags, "ah": self.av, "timeout": self.timeout,
            "retry_cnt": self.retry_cnt, "rnr_retry": self.rnr_retry,
            "rq_psn": self.resp.epsn, "sq_psn": self.req.next_psn,
            "max_rd_atomic": self.max_rd_atomic, "max_dest_rd_atomic": self.max_dest_rd_atomic,
            "min_rnr_timer": self.min_rnr_timer, "dest_qp_num": self.dest_qpn,
            "en_sqd_async_notify": self.en_sqd_async_notify,
            "sq_draining": self.state == SQD and self.req.outstanding() > 0,
            "cap": (self.max_send_wr, self.max_recv_wr, self.max_send_sge, self.max_recv_sge,
                    self.max_inline_data),
        }

    def destroy(self) -> None:
        if self.destroyed:
            return
        self.destroyed = True
        self.set_deadline(None)
        self.port.remove_qp(self)

    def attach_mcast(self, mgid: bytes) -> None:
        self.port.mcast.setdefault(bytes(mgid), set()).add(self)

    def detach_mcast(self, mgid: bytes) -> None:
        members = self.port.mcast.get(bytes(mgid))
        if members is not None:
            members.discard(self)
            if not members:
                del self.port.mcast[bytes(mgid)]

    # ---- engine entry points ------------------------------------------------------------------
    def receive(self, pkt: Any, meta: Any, now: float) -> None:
        st = self.state
        if st == RESET or st == INIT or st == ERR:
            self.port.counters.rcvd_bad_state += 1
            return
        info = pkt.info
        if info.transport != _TRANSPORT_OF[self.qp_type]:
            self.port.counters.rcvd_bad_opcode += 1
            return
        if not self.from_peer(meta):
            self.port.counters.rcvd_bad_addr += 1
            return
        if not self.port.pkey_ok(pkt.pkey, self.pkey, self.qpn == 1):
            self.port.counters.rcvd_bad_pkey += 1
            return
        if info.is_response:
            if st in (RTS, SQD, SQE):
                self.req.on_response(pkt, now)
            return
        self.resp.on_request(pkt, meta, now)

    def on_timer(self, now: float) -> None:
        self.req.on_timer(now)

    def flush_ack(self) -> None:
        """Send the coalesced ACK, if one is pending (called by Port.take_tx)."""
        if self.ack_psn >= 0:
            self.resp.send_ack(self.ack_psn)
            self.ack_psn = -1


_TRANSPORT_OF = {QPT_RC: 0x00, QPT_UC: 0x20, QPT_UD: 0x60}

__all__ = ["AddressVector", "EngineQP", "QPBase", "EngineSRQ", "mtu_bytes", "rxe_udp_sport"]
