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
from collections.abc import Sequence

from ..errors import ClosedError, InvalidArgument
from ..seam.attrs import ModifyAttrs, QueryAttrs, apply_port_attrs
from ..seam.counters import QpCounters
from ..seam.events import AsyncEventType
from ..seam.queues import EngineSRQ, QPInit, ReceiveQueue, RecvFeed, check_post_send, error_events
from ..seam.states import (
    ERR,
    INIT,
    QPT_RC,
    QPT_UC,
    QPT_UD,
    RESET,
    RTR,
    RTS,
    SQD,
    SQE,
    state_name,
)
from ..seam.types import AddressHandle, RecvWQE, SendWQE
from ..wire import ib as wib
from ..wire.opcodes import CNP as CNP_OPCODE
from ..wire.roce import rxe_udp_sport
from .av import AddressVector
from .completer import Completer
from .packet import RxMeta, TxPacket
from .requester import Requester
from .responder import Responder
from .views import QpPort

#: the PSN fields are 24 bits (IBA 9.7.1)
_PSN_MASK = 0xFFFFFF
#: the destination QPN field is 24 bits (IBA 9.2 BTH)
_QPN_MASK = 0xFFFFFF
#: the path MTU a UD QP starts with (ibv_mtu 4096: UD sends up to the port MTU)
_UD_PATH_MTU = 5
#: the path MTU a connected QP starts with (ibv_mtu 256) until RTR sets it
_DEFAULT_PATH_MTU = 1
#: the retry counts a QP starts with (IBA 11.2.5.2: 7 = the most)
_DEFAULT_RETRY = 7
#: a QP sends at most one CNP per this many seconds (a DCQCN notification point's
#: per-QP CNP rate limit; ConnectX's default min_time_between_cnps is 4 us..50 us)
CNP_INTERVAL_S = 50e-6
#: a RoCEv2 CNP (Annex A17, the Congestion Notification Packet): BTH opcode 0x81, P_Key 0xFFFF, BECN set,
#: PSN 0, then 16 reserved bytes
_CNP_RESERVED = bytes(16)
#: bytes around a packet's payload in a receive buffer: IPv4 + UDP + BTH + RETH + ICRC
_PACKET_OVERHEAD = 64


def mtu_bytes(mtu_enum: int) -> int:
    """Bytes of payload per packet for an ``ibv_mtu`` value (IBA 9.2: 256 << (enum-1))."""
    return 128 << mtu_enum


_QP_LOG = logging.getLogger("softrdma.qp")  # SOFTRDMA_TRACE=qp (softrdma.trace)
_QPT_NAMES = {QPT_RC: "RC", QPT_UC: "UC", QPT_UD: "UD"}


def _trace_state(qp: EngineQP, old: int, new: int, why: str = "") -> None:
    """One trace line per QP state transition (IBA 10.3.1), when ``softrdma.qp`` is on."""
    if _QP_LOG.isEnabledFor(logging.DEBUG):
        kind = _QPT_NAMES.get(qp.qp_type, str(qp.qp_type))
        _QP_LOG.debug("QP 0x%06x %s: %s -> %s%s", qp.qpn, kind,
                      state_name(old).removeprefix("IBV_QPS_"),
                      state_name(new).removeprefix("IBV_QPS_"), why)


class EngineQP:
    """One queue pair in the engine (see the module docstring); a
    :class:`~softrdma.seam.protocols.QPEngine`."""

    #: every IB opcode (the verbs layer checks them against the QP type)
    send_opcodes: frozenset[int] | None = None
    #: an XRC TGT QP's domain (softrdma.ib.xrc.XrcTgtQP); None for every other QP
    xrcd: object | None = None
    #: an RDMA Read scatters into as many SGEs as the QP allows
    max_read_sge = 1 << 30
    #: the RC fast paths (``Port.fast_paths``) may run for this QP; the XRC QPs,
    #: whose headers and opcodes differ, say False
    fast_rc = True

    def __init__(self, port: QpPort[EngineQP], init: QPInit,
                 qpn: int | None = None) -> None:
        qp_type = init.qp_type
        if qp_type not in (QPT_RC, QPT_UC, QPT_UD):
            raise ValueError(f"unsupported QP type {qp_type}")
        self.port = port
        self.init = init
        # the creation attributes the data path reads per packet or per completion
        self.qp_type = qp_type
        # the transport bits of the opcodes this QP takes (IBA 9.2.3, Table 35); the XRC
        # QPs say XRC
        self.bth_transport = _TRANSPORT_OF[qp_type]
        self.pd = init.pd
        self.complete_send = init.send_cq
        self.complete_recv = init.recv_cq
        self.qpn = port.alloc_qpn() if qpn is None else qpn
        self.state = RESET
        # attributes (IBA 11.2.5; ibv_qp_attr)
        self.path_mtu = _UD_PATH_MTU if qp_type == QPT_UD else _DEFAULT_PATH_MTU
        self.qkey = 0
        self.pkey_index = 0
        self.port_num = 1
        self.access_flags = 0
        self.av: AddressVector | None = None
        # the peer: its QPN and the first PSN each way (set by RTR/RTS, IBA 11.2.5.3)
        self.dest_qpn = 0
        self.rq_psn = 0
        self.sq_psn = 0
        # reliability: timers, retries and RDMA READ/atomic depths (IBA 9.7.6, 9.7.5.1.4)
        self.timeout = 0
        self.retry_cnt = _DEFAULT_RETRY
        self.rnr_retry = _DEFAULT_RETRY
        self.min_rnr_timer = 0
        self.max_rd_atomic = 0
        self.max_dest_rd_atomic = 0
        self.en_sqd_async_notify = False
        self.sport = rxe_udp_sport(self.qpn)  # rxe's port at creation (wire.roce)
        self.mtu = 0
        self.pkey = 0
        # (source GID, destination GID) a connected QP accepts packets with; None: any
        self.peer_gids: tuple[bytes, bytes] | None = None
        # softrdma's ibv_modify_qp_rate_limit: a rate cap in bit/s on top of the AV's
        # static rate (0.0: none), ib/pacing.py
        self.rate_limit_bps = 0.0
        self._derive()
        self.rq = ReceiveQueue(self.qpn, init)
        self.take_rwqe = self.rq.take
        self.return_rwqe = self.rq.give_back
        self.deadline: float | None = None
        self.ack_psn = -1
        # the completer emptied the send queue since the last request received
        # (Responder.schedule_ack: a prompt ACK)
        self.acked_ahead = False
        self.destroyed = False
        self.sqd_notified = False
        self.cnp_next_at = 0.0  # no CNP before this time (CNP_INTERVAL_S)
        self.cnps_sent = 0
        self.counters = QpCounters()  # this QP's share of the port counters
        self.req = Requester(self)
        self.comp = Completer(self.req)
        self.resp = Responder(self)
        port.add_qp(self)

    # ---- helpers used by the engines -------------------------------------------------------
    def _derive(self) -> None:
        """Recompute the per-packet constants: payload MTU and P_Key (hot-path attributes)."""
        self.mtu = self.port.max_mtu if self.qp_type == QPT_UD else mtu_bytes(self.path_mtu)
        pk = self.port.pkeys
        self.pkey = pk[self.pkey_index] if self.pkey_index < len(pk) else pk[0]
        # the one BTH P_Key the fast receive paths accept: the QP's own, if it is a full
        # member key (then ``Port.pkey_ok`` accepts it too, IBA 10.9.3) and the QP an RC
        # one they serve; else none (-1)
        fast = self.fast_rc and self.qp_type == QPT_RC
        self.fast_pkey = self.pkey if fast and self.pkey & 0x8000 and self.pkey & 0x7FFF else -1
        # whether Requester.post_one may send a message as it is posted: an RC QP on the
        # fast paths with an address vector without static rate (IBA 9.11: paced by pump)
        av = self.av
        self.fast_post = fast and av is not None and not av.rate_bps
        self.peer_meta: RxMeta | None = None  # the last RxMeta from_peer accepted
        if av is not None and self.qp_type != QPT_UD:
            gids = self.port.gids
            sgid = gids[av.sgid_index] if av.sgid_index < len(gids) else gids[0]
            self.peer_gids = (av.dgid, sgid)
        else:
            self.peer_gids = None

    def from_peer(self, meta: RxMeta) -> bool:
        """Whether a packet comes from this connected QP's peer: its source GID is the
        address vector's DGID and its destination GID the QP's SGID (IBA 9.6: a connected
        QP's packets must carry its path's addresses; rxe ``check_addr`` drops the rest).
        UD QPs accept any source."""
        if meta is self.peer_meta:  # the runtime reuses one RxMeta per flow
            return True
        peer = self.peer_gids
        if peer is None or (meta.sgid == peer[0] and meta.dgid == peer[1]):
            self.peer_meta = meta
            return True
        return False

    def tx(self, parts: list[bytes | bytearray | memoryview], length: int, av: AddressHandle | None = None) -> None:
        """Queue one packet (BTH .. pad) for the driver."""
        a = av if av is not None else self.av
        if a is None:
            return
        port = self.port
        gids = port.gids
        i = a.sgid_index
        if i >= len(gids):
            i = 0
        port.tx.append(TxPacket(gids[i], a.dgid, self.sport, parts, length, a.traffic_class,
                                a.hop_limit, a.flow_label, port.gid_v1[i], a.sl))
        c = port.counters
        c.sent_pkts += 1
        c.sent_bytes += length + 4  # BTH .. ICRC
        self.counters.sent_pkts += 1

    def send_cnp(self, now: float) -> None:
        """Tell the peer QP that its packets met congestion (a RoCEv2 CNP, DCQCN's
        notification point), rate limited per QP."""
        if now < self.cnp_next_at or self.av is None:
            return
        self.cnp_next_at = now + CNP_INTERVAL_S
        self.cnps_sent += 1
        self.tx([wib.bth(CNP_OPCODE, 0xFFFF, self.dest_qpn, 0, becn=True),
                 _CNP_RESERVED], wib.BTH.size + len(_CNP_RESERVED))

    def set_peer_budget(self, packets: int | None = None, *, nbytes: int | None = None) -> None:
        """What the peer can absorb (the driver knows its receive buffer), in ``packets`` or
        in bytes (``nbytes``: counted as packets of the path MTU plus their headers): the
        requester keeps no more PSNs than this outstanding. Neither: no cap."""
        if nbytes is not None:
            if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 1:
                raise InvalidArgument("nbytes", f"must be a positive byte count, got {nbytes!r}")
            if packets is not None:
                raise InvalidArgument("nbytes", "give packets or nbytes, not both")
            packets = max(1, nbytes // (self.mtu + _PACKET_OVERHEAD))
        self.req.set_peer_budget(packets)

    def set_deadline(self, t: float | None) -> None:
        self.deadline = t
        if t is not None:
            self.port.arm(self)

    @property
    def srq(self) -> EngineSRQ | None:
        return self.init.srq

    # ---- verbs entry points -----------------------------------------------------------------
    def modify(self, attrs: ModifyAttrs, now: float) -> None:
        """Apply already-validated attributes and the state transition (IBA 10.3, 11.2.5.2)."""
        if self.destroyed:
            raise ClosedError("QP is destroyed")
        if "path_mtu" in attrs:
            self.path_mtu = attrs["path_mtu"]
        if "qkey" in attrs:
            self.qkey = attrs["qkey"]
        apply_port_attrs(self, attrs)
        if "timeout" in attrs:
            self.timeout = attrs["timeout"]
        if "retry_cnt" in attrs:  # the counters start full (IBA 9.7.6.1.3, 9.7.5.2.8)
            self.retry_cnt = self.comp.retry_left = self.comp.stall_left = attrs["retry_cnt"]
        if "rnr_retry" in attrs:
            self.rnr_retry = self.comp.rnr_left = attrs["rnr_retry"]
        if "max_rd_atomic" in attrs:
            self.max_rd_atomic = attrs["max_rd_atomic"]
        if "max_dest_rd_atomic" in attrs:
            self.max_dest_rd_atomic = attrs["max_dest_rd_atomic"]
        if "min_rnr_timer" in attrs:
            self.min_rnr_timer = attrs["min_rnr_timer"]
        if "en_sqd_async_notify" in attrs:
            self.en_sqd_async_notify = attrs["en_sqd_async_notify"]
        if "ah" in attrs:
            av = attrs["ah"]
            if av is not None and not isinstance(av, AddressVector):
                raise InvalidArgument("qp_attr.ah_attr", "not an address vector")
            self.av = av
        if "dest_qp_num" in attrs:
            self.dest_qpn = int(attrs["dest_qp_num"]) & _QPN_MASK
        if "rq_psn" in attrs:
            self.rq_psn = int(attrs["rq_psn"]) & _PSN_MASK
            self.resp.set_epsn(self.rq_psn)
        if "sq_psn" in attrs:
            self.sq_psn = int(attrs["sq_psn"]) & _PSN_MASK
            self.req.set_psn(self.sq_psn)
        self._derive()
        self.resp.want_middles()  # the P_Key or path MTU may have changed
        if "qp_state" not in attrs:
            return
        new = int(attrs["qp_state"])
        old = self.state
        if new == old and new != SQD:
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
        self.comp.reset()
        self.resp.reset()
        self.rq.clear()
        self.ack_psn = -1  # a coalesced ACK owed before the reset is owed no more
        self.set_deadline(None)
        self.state = RESET

    def to_error(self, event: AsyncEventType | None = None) -> None:
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
        self.rq.flush()
        error_events(self.port.events, self, self.init.srq, event)

    def post_send(self, wqe: SendWQE, now: float) -> None:
        st = self.state
        check_post_send(st, self.destroyed, len(self.req.sq), self.init.max_send_wr,
                        "the QP must be in RTS")
        if st == ERR or st == SQE:
            wqe.signaled = True
            self.req.flush_one(wqe)
            return
        self.req.post(wqe, now)

    def post_sends(self, wqes: Sequence[SendWQE], now: float) -> None:
        """:meth:`post_send` of each of ``wqes``, in order; on a UD QP in RTS the run is
        posted and sent in one go (:meth:`Requester.post_ud_run`). Each WQE is checked
        as :meth:`post_send` checks it, and the ones before a refused one stay posted."""
        if self.qp_type != QPT_UD or self.state != RTS or self.destroyed or len(wqes) < 2:
            for w in wqes:
                self.post_send(w, now)
            return
        i, n = 0, len(wqes)
        while i < n:
            room = self.init.max_send_wr - len(self.req.sq)
            if room <= 0:  # the queue is full: refused as post_send refuses it
                check_post_send(self.state, self.destroyed, len(self.req.sq),
                                self.init.max_send_wr, "the QP must be in RTS")
            j = min(n, i + room)
            self.req.post_ud_run(list(wqes[i:j]), now)  # sent ones leave the queue
            i = j

    def post_recv(self, rwqe: RecvWQE) -> None:
        self.rq.post(rwqe, self.state, self.destroyed)

    def set_recv_feed(self, feed: RecvFeed | None) -> None:
        """Receives stored in ``feed`` reach the receive queue (:class:`RecvFeed`)."""
        self.rq.set_feed(feed)

    def post_recvs(self, rwqes: list[RecvWQE]) -> None:
        """:meth:`post_recv` of each, in order (the ones before a refused one stay)."""
        self.rq.post_many(rwqes, self.state, self.destroyed)

    def query(self) -> QueryAttrs:
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
            "cap": self.init.cap,
        }

    def destroy(self) -> None:
        if self.destroyed:
            return
        if self.state in (RTR, RTS, SQD, SQE):
            # as in to_error: the requests this responder executed are acknowledged
            # before it goes (a program that destroys its QP, then its rdma_cm id, sends
            # the DREQ after it: the peer's last SEND would complete with a flush error)
            self.flush_ack()
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

    def count(self, name: str) -> None:
        """One more of counter ``name`` for this QP and for its port (``rdma statistic``
        shows both; used on the drop and error paths, not per packet)."""
        pc = self.port.counters
        setattr(pc, name, getattr(pc, name) + 1)
        qc = self.counters
        setattr(qc, name, getattr(qc, name) + 1)

    # ---- engine entry points ------------------------------------------------------------------
    def receive(self, pkt: wib.IBPacket, meta: RxMeta, now: float) -> None:
        st = self.state
        if st == RESET or st == INIT or st == ERR:
            self.count("rcvd_bad_state")
            return
        info = pkt.info
        if info.transport != self.bth_transport:
            self.count("rcvd_bad_opcode")
            return
        if not self.from_peer(meta):
            self.count("rcvd_bad_addr")
            return
        if not self.port.pkey_ok(pkt.pkey, self.pkey, self.qpn == 1):
            self.count("rcvd_bad_pkey")
            return
        if info.is_response:
            if st in (RTS, SQD, SQE):
                self.comp.on_response(pkt, now)
            return
        self.resp.on_request(pkt, meta, now)

    def on_timer(self, now: float) -> None:
        self.comp.on_timer(now)

    def bind_srq(self, pkt: wib.IBPacket) -> bool:
        """XRC TGT QPs bind the SRQ a request's XRCETH names (softrdma.ib.xrc)."""
        return True

    def ack_rides_with(self, posted: int) -> bool:
        """True if the coalesced ACK this QP owes (IBA 9.7.5.1.1) should leave with the
        ``posted`` requests just posted, in one batch, rather than right after them.

        So when its send queue holds only those requests: every earlier request of this
        QP was acknowledged before the application posted again, as by an application
        that awaits each SEND's completion (``ibv_rc_pingpong``, perftest's latency
        tests), whose peer, awaiting its own, then finds the request and the ACK it
        needs in one read instead of waking twice. A QP with earlier requests still
        unacknowledged (a pipelining application) sends its request first."""
        return self.ack_psn >= 0 and len(self.req.sq) == posted

    def awaits_acks(self) -> bool:
        """True if, before new requests are posted, every earlier request of this QP
        was acknowledged (its send queue is empty): the application awaited
        their completions (IBA 9.7.5.1's ACKs) before it posted again."""
        return not self.req.sq

    def acks_due(self) -> bool:
        """True while requests of this QP, in RTS, await their ACK or response (IBA
        9.7.5.1)."""
        return self.state == RTS and bool(self.req.sq)

    def flush_ack(self) -> None:
        """Send the coalesced ACK, if one is pending (called by Port.take_output)."""
        if self.ack_psn >= 0:
            self.resp.send_ack(self.ack_psn)
            self.ack_psn = -1


_TRANSPORT_OF = {QPT_RC: 0x00, QPT_UC: 0x20, QPT_UD: 0x60}

__all__ = ["AddressVector", "EngineQP", "EngineSRQ", "RESET", "INIT", "RTR", "RTS", "SQD", "SQE",
           "ERR", "QPT_RC", "QPT_UC", "QPT_UD", "mtu_bytes"]
