"""A CM connection identifier and its IBA 12.9 state machine (:mod:`.state`).

:class:`CmId` holds one connection's (or listener's) CM state: comm IDs, the path, the
QP, the message awaiting an answer and its retransmission timer. Every input goes
through :meth:`CmId._dispatch`, which looks the ``(state, event)`` pair up in
:data:`~softrdma.cm.state.TRANSITIONS` and runs the named ``_a_<action>`` method; the
actions build the messages (``softrdma.wire.cm``), move the QP (:mod:`.qpctl`) and queue
the consumer's events. See :mod:`softrdma.cm.ibcm` for the agent that owns the ids.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import InvalidArgument, SoftRdmaError, StateError
from ..ib.qp import AddressVector
from ..wire import cm as wcm
from ..wire.cm import AprStatus, MsgType, RejReason, TransportServiceType, time_code_s
from ..wire.ipcm import IP_CM_SERVICE_ID_MASK, is_ip_cm_service_id
from . import qpctl
from .events import CmEvent, CmEventType, RejectInfo, describe_rej
from .params import (
    ALL_ONES_MASK,
    AcceptParams,
    CmPath,
    ConnParams,
    Dialect,
    SidrParams,
    check_pd,
    make_rej,
)
from .state import API_EVENTS, CmEv, CmState, transition
from .userqp import passive_psn, qp_info

if TYPE_CHECKING:
    from .ibcm import CmAgent

__all__ = ["CmId", "PENDING_STATES"]

# A listener's half-open connections, which its backlog bounds (as listen(backlog) bounds
# SYN_RECV + the accept queue): REQ received and not yet accepted, or accepted (REP sent)
# and waiting for the RTU.
PENDING_STATES = (CmState.REQ_RCVD, CmState.MRA_REQ_SENT, CmState.SIDR_REQ_RCVD,
                  CmState.REP_SENT, CmState.MRA_REP_RCVD)


class CmId:
    """One connection (or listener) and its IBA 12.9 state (see :mod:`.state`).

    Events go to ``handler`` (an event's consumer; called under the device lock, so it
    must not block nor create or destroy verbs objects; CM calls are fine), else to the agent's ``on_event``, else to ``agent.events``.
    ``context`` is the consumer's. After ``TIMEWAIT_EXIT`` (or a rejection ending in
    IDLE) the id may connect again.
    """

    __slots__ = (
        "agent", "handler", "context", "state", "local_id", "remote_id", "remote_guid",
        "remote_qpn", "local_qpn", "qp", "path", "service_id", "mask", "tid", "msg",
        "last_reply", "retries", "max_retries", "timeout_s", "deadline", "_tseq",
        "listen_id", "pending", "backlog", "dialect", "params", "req", "rep", "local_psn",
        "ack_timeout", "local_ack_timeout", "destroyed", "_follow", "drep_tid", "auto_rtu", "sidr_key",
        "reject_info", "psn_drawn", "__weakref__",
    )

    def __init__(self, agent: CmAgent, handler: Callable[[CmEvent], None] | None = None,
                 context: Any = None) -> None:
        self.agent = agent
        self.handler = handler
        self.context = context
        self.state = CmState.IDLE
        self.local_id = 0
        self.remote_id = 0
        self.remote_guid = 0
        self.remote_qpn = 0
        self.local_qpn: int | None = None
        self.qp: Any = None
        self.path: CmPath | None = None
        self.service_id = 0
        self.mask = ALL_ONES_MASK
        self.tid = 0
        self.msg: bytes | None = None
        self.last_reply: bytes | None = None
        self.retries = 0
        self.max_retries = agent.config.max_cm_retries
        self.timeout_s = 0.0
        self.deadline: float | None = None
        self._tseq = 0
        self.listen_id: CmId | None = None
        self.pending = 0
        self.backlog = agent.config.default_backlog
        self.dialect: Dialect | None = None
        self.params: ConnParams | SidrParams | None = None
        self.req: wcm.Req | None = None
        self.rep: wcm.Rep | None = None
        self.local_psn = 0
        self.ack_timeout = 0
        #: the consumer's Local ACK Timeout for its own QP (librdmacm
        #: RDMA_OPTION_ID_ACK_TIMEOUT); None: the REQ's (IBA 12.7.34)
        self.local_ack_timeout: int | None = None
        self.destroyed = False
        self._follow: CmEv | None = None
        self.drep_tid = 0
        self.auto_rtu = True
        self.sidr_key: tuple[int, bytes] | None = None
        self.reject_info: RejectInfo | None = None
        self.psn_drawn = False

    def __repr__(self) -> str:
        return f"<CmId {self.local_id:#010x} {self.state.name}>"

    # ---- consumer requests --------------------------------------------------------------
    def listen(self, service_id: int, *, mask: int = ALL_ONES_MASK, backlog: int | None = None,
               dialect: Dialect | None = None, now: float | None = None) -> None:
        """Listen for REQs/SIDR_REQs whose Service ID matches under ``mask``
        (``ib_cm_listen``). ``backlog`` bounds the unanswered CONNECT_REQUESTs."""
        def run(t: float) -> None:
            if self.state != CmState.IDLE:
                raise StateError(f"listen in state {self.state.name}")
            if not 0 <= service_id <= ALL_ONES_MASK:
                raise InvalidArgument("service_id", "must be a 64-bit value")
            for other in self.agent.listeners:
                if other.service_id & other.mask == service_id & mask and other.mask == mask:
                    raise StateError(f"Service ID {service_id:#018x} already has a listener")
            self.service_id = service_id
            self.mask = mask
            self.backlog = self.agent.config.default_backlog if backlog is None else backlog
            d = dialect
            if d is None and is_ip_cm_service_id(service_id) and \
                    mask & IP_CM_SERVICE_ID_MASK == IP_CM_SERVICE_ID_MASK:
                # CA11-7: REQs to the A11 range are Table 1 formatted, whoever listens.
                from .ipcm import IpCmDialect  # noqa: PLC0415

                d = IpCmDialect()
            if self.agent.on_listen is not None:  # devd: REQs for it come here
                self.agent.on_listen(service_id, mask, True)
            self.dialect = d
            self.state = CmState.LISTEN
            self.agent.listeners.append(self)
        self.agent.api(run, now)

    def connect(self, qp: Any, params: ConnParams, *, dialect: Dialect | None = None,
                now: float | None = None) -> None:
        """Send a REQ for ``qp`` (RC or UC) with ``params`` (``ib_send_cm_req``)."""
        self.agent.api(lambda t: self._dispatch(CmEv.API_CONNECT, t, (qp, params, dialect)),
                       now)

    def accept(self, qp: Any = None, params: AcceptParams | None = None, *,
               now: float | None = None) -> None:
        """Answer a CONNECT_REQUEST: REP (the QP moved to RTS first) or, for SIDR, a
        SIDR_REP with the QP's number and Q_Key."""
        p = params if params is not None else AcceptParams()
        self.agent.api(lambda t: self._dispatch(CmEv.API_ACCEPT, t, (qp, p)), now)

    def reject(self, private_data: bytes = b"", *, reason: int = RejReason.CONSUMER_DEFINED,
               ari: bytes = b"", now: float | None = None) -> None:
        """REJ the REQ (or REP) this id received; reason 28 by default (``rdma_reject``)."""
        self.agent.api(lambda t: self._dispatch(CmEv.API_REJECT, t,
                                                (bytes(private_data), reason, bytes(ari))), now)

    def establish(self, private_data: bytes = b"", *, now: float | None = None) -> None:
        """Send the RTU after a CONNECT_RESPONSE (``ib_send_cm_rtu``)."""
        self.agent.api(lambda t: self._dispatch(CmEv.API_RTU, t, bytes(private_data)), now)

    def send_mra(self, service_timeout: int | None = None, private_data: bytes = b"", *,
                 now: float | None = None) -> None:
        """Ask the peer for more time to answer its REQ or REP (``ib_send_cm_mra``)."""
        st = self.agent.config.mra_service_timeout if service_timeout is None else service_timeout
        self.agent.api(lambda t: self._dispatch(CmEv.API_MRA, t, (st, bytes(private_data))), now)

    def disconnect(self, private_data: bytes = b"", *, now: float | None = None) -> None:
        """Release the connection: DREQ (QP to ERR), or the REJ/DREP the state calls for."""
        self.agent.api(lambda t: self._dispatch(CmEv.API_DISCONNECT, t, bytes(private_data)),
                       now)

    def sidr_resolve(self, params: SidrParams, *, dialect: Dialect | None = None,
                     now: float | None = None) -> None:
        """Send a SIDR_REQ (IBA 12.11); ESTABLISHED brings the remote UD QPN and Q_Key."""
        self.agent.api(lambda t: self._dispatch(CmEv.API_SIDR, t, (params, dialect)), now)

    def notify_comm_est(self, *, now: float | None = None) -> None:
        """The QP received data before the RTU (``ib_cm_notify(IB_EVENT_COMM_EST)``)."""
        self.agent.api(lambda t: self._dispatch(CmEv.COMM_EST, t, None), now)

    def destroy(self, *, now: float | None = None) -> None:
        """Forget the id (``ib_destroy_cm_id``): what ``disconnect`` would send is sent,
        no more events are delivered, TimeWait still runs out before the comm ID and
        QPN are free."""
        def run(t: float) -> None:
            self.destroyed = True
            if (self.state, CmEv.API_DISCONNECT) in _DESTROY_SENDS:
                self._dispatch(CmEv.API_DISCONNECT, t, b"")
            if self.state not in (CmState.TIMEWAIT, CmState.DREQ_SENT):
                self._set_state(CmState.IDLE, t)
        self.agent.api(run, now)

    # ---- the machine ------------------------------------------------------------------
    def _dispatch(self, ev: CmEv, now: float, arg: Any) -> None:
        row = transition(self.state, ev)
        if row is None:
            if ev in API_EVENTS:
                raise StateError(f"{ev.value} is not allowed in CM state {self.state.name}")
            self.agent.counters.ignored += 1
            return
        action, nxt = row
        got: CmState | None = getattr(self, "_a_" + action)(now, arg)
        self._set_state(nxt if got is None else got, now)
        follow = self._follow
        if follow is not None:
            self._follow = None
            self._dispatch(follow, now, b"")

    def _set_state(self, new: CmState, now: float) -> None:
        old = self.state
        if old == new:
            return
        self.state = new
        if old in PENDING_STATES and new not in PENDING_STATES and self.listen_id is not None:
            self.listen_id.pending -= 1
        if new == CmState.TIMEWAIT:
            self.msg = None
            self.agent._arm(self, now + self.agent.timewait_s(self))
        elif new == CmState.IDLE:
            self.deadline = None
            self.msg = None
            self.agent._unregister(self)
            self.local_qpn = None

    def _arm_msg(self, mad: bytes, now: float) -> None:
        self.msg = mad
        self.retries = 0
        self.agent._arm(self, now + self.timeout_s)

    def _send(self, msg: wcm.CmMessage, tid: int, now: float, *, retransmit: bool) -> bytes:
        assert self.path is not None
        mad = self.agent._send_raw(self.path.sgid, self.path.dgid, msg, tid, self.path)
        if retransmit:
            self._arm_msg(mad, now)
        else:
            self.last_reply = mad
        return mad

    def _cancel(self) -> None:
        self.deadline = None
        self.msg = None

    def _emit(self, kind: CmEventType, private_data: bytes = b"", **kw: Any) -> None:
        self.agent.emit(CmEvent(kind, self, private_data=private_data, **kw))

    def _qp_err(self, now: float) -> None:
        if self.qp is not None:
            qpctl.to_err(qpctl.engine_of(self.qp), now)

    def _av(self) -> AddressVector:
        p = self.path
        assert p is not None
        return AddressVector(p.dgid, self.agent.sgid_index(p.sgid), p.flow_label, p.hop_limit,
                             p.traffic_class)

    # ---- actions: active side ---------------------------------------------------------------
    def _a_send_req(self, now: float, arg: Any) -> None:
        qp, p, dialect = arg
        agent = self.agent
        cfg = agent.config
        if qp is None:
            raise InvalidArgument("qp", "connect needs an RC or UC QP")
        qpn, qpt, has_srq, eq = qp_info(qp)  # eq None: the consumer moves its QP
        if qpt == qpctl.QPT_RC:
            tst = TransportServiceType.RC
        elif qpt == qpctl.QPT_UC:
            tst = TransportServiceType.UC
        else:
            raise InvalidArgument("qp", "connect needs an RC or UC QP (UD services use "
                                        "sidr_resolve)")
        pd = check_pd(p.private_data, wcm.CmAttr.REQ)
        for name in ("responder_resources", "initiator_depth"):
            if not 0 <= getattr(p, name) <= 255:
                raise InvalidArgument(name, "must be 0..255")
        for name in ("retry_count", "rnr_retry_count"):
            if not 0 <= getattr(p, name) <= 7:
                raise InvalidArgument(name, "must be 0..7")
        sgid = agent.sgid_for(p.dgid, p.sgid)
        agent.claim_qpn(self, qpn)
        try:
            if eq is not None:
                qpctl.to_init(eq, now)
        except BaseException:
            agent.by_local_qpn.pop(qpn, None)
            self.local_qpn = None
            raise
        self.qp = qp if eq is not None else None
        self.params = p
        self.dialect = dialect
        self.auto_rtu = p.auto_rtu
        self.service_id = p.service_id
        self.path = CmPath(sgid, bytes(p.dgid), p.hop_limit, p.traffic_class, p.flow_label)
        self.local_id = agent._new_comm_id(self)
        self.remote_id = 0
        self.local_psn = agent.rng.getrandbits(24)
        self.ack_timeout = min(31, cfg.subnet_timeout + 1)
        mtu = min(p.path_mtu or agent.mtu, agent.mtu)
        # RoCE v2 (linux cm_format_req): LIDs permissive and Subnet Local 0 when the
        # path is routed (hop limit > 1). Receivers ignore them (CA16-10).
        routed = p.hop_limit > 1
        lid = wcm.PERMISSIVE_LID if routed else 0
        req = wcm.Req(
            local_comm_id=self.local_id, service_id=p.service_id, local_ca_guid=agent.guid,
            local_qpn=qpn, responder_resources=p.responder_resources,
            initiator_depth=p.initiator_depth,
            remote_cm_response_timeout=cfg.remote_cm_response_timeout,
            transport_service_type=tst, end_to_end_flow_control=int(p.flow_control),
            starting_psn=self.local_psn, local_cm_response_timeout=cfg.resp_time_value,
            retry_count=p.retry_count, pkey=0xFFFF, path_mtu=mtu,
            rnr_retry_count=p.rnr_retry_count, max_cm_retries=cfg.max_cm_retries,
            srq=int(has_srq), primary_local_lid=lid, primary_remote_lid=lid,
            primary_local_gid=sgid, primary_remote_gid=bytes(p.dgid),
            primary_flow_label=p.flow_label, primary_traffic_class=p.traffic_class,
            primary_hop_limit=p.hop_limit, primary_subnet_local=0 if routed else 1,
            primary_local_ack_timeout=self.ack_timeout, private_data=pd)
        self.req = req
        self.tid = agent.new_tid()
        self.max_retries = cfg.max_cm_retries
        self.timeout_s = 2 * cfg.packet_life_s + time_code_s(cfg.remote_cm_response_timeout)
        self._send(req, self.tid, now, retransmit=True)

    def _a_rep_received(self, now: float, arg: Any) -> CmState | None:
        rep: wcm.Rep = arg[0]
        agent = self.agent
        assert self.path is not None and self.req is not None
        self._cancel()
        self.remote_id = rep.local_comm_id
        self.remote_guid = rep.local_ca_guid
        self.remote_qpn = rep.local_qpn
        self.rep = rep
        rkey = (rep.local_comm_id, rep.local_ca_guid)
        qkey = (rep.local_qpn, self.path.dgid)
        clash = agent.by_remote.get(rkey) or agent.by_remote_qpn.get(qkey)
        if clash is not None and clash is not self:
            # IBA 12.9.8.3.2 / linux cm_rep_handler: the peer's comm ID or QPN is still
            # held by an older connection: stale.
            agent.counters.stale += 1
            rej = make_rej(self.local_id, rep.local_comm_id, MsgType.REP, RejReason.STALE_CONN)
            self._send(rej, self.tid, now, retransmit=False)
            self._qp_err(now)
            self.reject_info = RejectInfo(RejReason.STALE_CONN,
                                          "stale connection: the peer's QPN or comm ID is "
                                          "still in use here (STALE_CONN)")
            self._emit(CmEventType.REJECTED, reject=self.reject_info)
            return CmState.TIMEWAIT
        agent.by_remote[rkey] = self
        agent.by_remote_qpn[qkey] = self
        pd, info = bytes(rep.private_data), dict[str, Any]()
        if self.dialect is not None:
            pd, info = self.dialect.parse_rep(self, pd)
        info["rep"] = rep
        if self.auto_rtu and self.qp is not None:
            try:
                self._connect_qp(now)
            except SoftRdmaError as exc:
                # linux rdma_cm: REJ the REP and report CONNECT_ERROR
                rej = make_rej(self.local_id, self.remote_id, MsgType.REP,
                               RejReason.CONSUMER_DEFINED)
                self._send(rej, self.tid, now, retransmit=False)
                self._qp_err(now)
                self.reject_info = RejectInfo(None, f"the local QP could not be connected: {exc}")
                self._emit(CmEventType.CONNECT_ERROR, reject=self.reject_info)
                return CmState.TIMEWAIT
            rtu = wcm.Rtu(local_comm_id=self.local_id, remote_comm_id=self.remote_id)
            self._send(rtu, self.tid, now, retransmit=False)
            self._emit(CmEventType.ESTABLISHED, pd, info=info)
            return CmState.ESTABLISHED
        self._emit(CmEventType.CONNECT_RESPONSE, pd, info=info)
        return None

    def _connect_qp(self, now: float) -> None:
        """Active side, after the REP: the QP to RTR and RTS (linux cm_init_qp_*_attr).

        Starting PSN convention (Linux ``drivers/infiniband/core/cm.c``, followed by rxe and
        every RoCE NIC driver; ``../shared/specs/ib-cm.md`` REQ offset 44, REP offset 20):
        each side announces the PSN it will *receive* at. The active side's ``rq_psn`` is
        the REQ's Starting PSN (its own) and its ``sq_psn`` is the REP's Starting PSN.
        """
        rep, req, p = self.rep, self.req, self.params
        assert rep is not None and req is not None and isinstance(p, ConnParams)
        eq = qpctl.engine_of(self.qp)
        qpctl.to_rtr(eq, now, dest_qpn=rep.local_qpn, rq_psn=self.local_psn,
                     path_mtu=req.path_mtu,
                     max_dest_rd_atomic=min(rep.initiator_depth, p.responder_resources),
                     min_rnr_timer=p.min_rnr_timer, av=self._av())
        timeout = self.ack_timeout if self.local_ack_timeout is None else self.local_ack_timeout
        qpctl.to_rts(eq, now, sq_psn=rep.starting_psn, timeout=timeout,
                     retry_cnt=req.retry_count, rnr_retry=rep.rnr_retry_count,
                     max_rd_atomic=min(rep.responder_resources, p.initiator_depth))

    def _a_send_rtu(self, now: float, arg: Any) -> None:
        pd = check_pd(arg, wcm.CmAttr.RTU)
        if self.qp is not None:
            self._connect_qp(now)
        rtu = wcm.Rtu(local_comm_id=self.local_id, remote_comm_id=self.remote_id,
                      private_data=pd)
        self._send(rtu, self.tid, now, retransmit=False)
        self._emit(CmEventType.ESTABLISHED)

    def _a_mra_received(self, now: float, arg: Any) -> CmState | None:
        mra: wcm.Mra = arg[0]
        want = MsgType.REQ if self.state in (CmState.REQ_SENT, CmState.MRA_REQ_RCVD) \
            else MsgType.REP
        if mra.message_mraed != want or self.msg is None:
            self.agent.counters.ignored += 1
            return self.state
        # IBA 12.6.6: wait the service timeout (plus the packet's trip) before retrying.
        self.agent._arm(self, now + self.agent.config.packet_life_s
                        + time_code_s(mra.service_timeout))
        return None

    def _a_rej_received(self, now: float, arg: Any) -> CmState | None:
        rej: wcm.Rej = arg[0]
        self._cancel()
        self._qp_err(now)
        info = describe_rej(rej)
        self.reject_info = info
        self._emit(CmEventType.REJECTED, bytes(rej.private_data), reject=info,
                   info={"rej": rej})
        if rej.reason == RejReason.STALE_CONN and self.state in (
                CmState.REQ_SENT, CmState.MRA_REQ_RCVD, CmState.REQ_RCVD,
                CmState.MRA_REQ_SENT, CmState.REP_SENT, CmState.MRA_REP_RCVD):
            return CmState.TIMEWAIT
        return None

    def _a_retry_or_fail(self, now: float, arg: Any) -> CmState | None:
        agent = self.agent
        if self.msg is not None and self.retries < self.max_retries:
            self.retries += 1
            agent.counters.retransmits += 1
            assert self.path is not None
            agent._out(self.path.sgid, self.path.dgid, self.msg, self.path)
            agent._arm(self, now + self.timeout_s)
            return self.state
        self.msg = None
        st = self.state
        n = self.retries
        if st in (CmState.REQ_SENT, CmState.MRA_REQ_RCVD, CmState.REP_SENT,
                  CmState.MRA_REP_RCVD):
            active = st in (CmState.REQ_SENT, CmState.MRA_REQ_RCVD)
            # IBA 12.6.7: REJ "Timeout" carries the sender's CA GUID as ARI.
            rej = make_rej(self.local_id, self.remote_id, MsgType.REQ if active else MsgType.REP,
                           RejReason.TIMEOUT, agent.guid.to_bytes(8, "big"))
            self._send(rej, self.tid, now, retransmit=False)
            self._qp_err(now)
            what = "REQ" if active else "REP"
            self.reject_info = RejectInfo(RejReason.TIMEOUT, f"no answer to the {what} after "
                                                             f"{n} retransmissions (timeout)")
            self._emit(CmEventType.UNREACHABLE, reject=self.reject_info)
            return CmState.IDLE if active else CmState.TIMEWAIT
        if st == CmState.DREQ_SENT:
            self._emit(CmEventType.DISCONNECTED, info={"timeout": True})
            return CmState.TIMEWAIT
        # SIDR_REQ_SENT
        self.reject_info = RejectInfo(None, f"SIDR: no answer to the SIDR_REQ after {n} "
                                            "retransmissions (timeout)")
        self._emit(CmEventType.UNREACHABLE, reject=self.reject_info)
        return CmState.IDLE

    def _a_abort_req(self, now: float, arg: Any) -> None:
        # linux ib_destroy_cm_id in REQ_SENT: REJ Timeout with our CA GUID.
        rej = make_rej(self.local_id, 0, MsgType.REQ, RejReason.TIMEOUT,
                       self.agent.guid.to_bytes(8, "big"))
        self._send(rej, self.tid, now, retransmit=False)
        self._cancel()
        self._qp_err(now)

    # ---- actions: passive side -----------------------------------------------------------------
    def _a_send_rep(self, now: float, arg: Any) -> None:
        qp, a = arg
        agent = self.agent
        req = self.req
        assert req is not None and self.path is not None
        if qp is None:
            raise InvalidArgument("qp", "accept needs the QP of the connection")
        qpn, qpt, has_srq, eq = qp_info(qp)  # eq None: the consumer moves its QP
        want = qpctl.QPT_RC if req.transport_service_type == TransportServiceType.RC \
            else qpctl.QPT_UC
        if qpt != want:
            raise InvalidArgument("qp", f"the REQ asks for {TransportServiceType(req.transport_service_type).name}"
                                        f", the QP is of type {qpt}")
        resp = min(a.responder_resources, req.initiator_depth)
        depth = min(a.initiator_depth, req.responder_resources)
        pd = a.private_data
        if self.dialect is not None:
            pd = self.dialect.rep_private_data(self, pd)
        pd = check_pd(pd, wcm.CmAttr.REP)
        if not 0 <= a.rnr_retry_count <= 7:
            raise InvalidArgument("rnr_retry_count", "must be 0..7")
        agent.claim_qpn(self, qpn)
        self.qp = qp if eq is not None else None
        self.local_psn = passive_psn(self)
        self.ack_timeout = req.primary_local_ack_timeout
        mtu = min(req.path_mtu, agent.mtu) if req.path_mtu else agent.mtu
        try:
            if eq is not None:  # else the consumer's own QP (userqp.cm_qp_attr)
                self._rep_qp(eq, req, now, mtu, resp, depth, a)
        except BaseException:
            agent.by_local_qpn.pop(qpn, None)
            self.local_qpn = None
            self.qp = None
            raise
        has_alt = any(req.alt_local_gid) or req.alt_local_lid
        rep = wcm.Rep(local_comm_id=self.local_id, remote_comm_id=self.remote_id,
                      local_qpn=qpn, starting_psn=self.local_psn,
                      responder_resources=resp, initiator_depth=depth,
                      target_ack_delay=a.target_ack_delay,
                      failover_accepted=1 if has_alt else 0,
                      end_to_end_flow_control=int(a.flow_control),
                      rnr_retry_count=a.rnr_retry_count, srq=int(has_srq),
                      local_ca_guid=agent.guid, private_data=pd)
        self._send_rep(rep, req, now)

    def _rep_qp(self, eq: Any, req: wcm.Req, now: float, mtu: int, resp: int, depth: int,
                a: AcceptParams) -> None:
        """Passive side: the QP to INIT, RTR and RTS before the REP. Linux's Starting PSN
        convention (cm.c; see _connect_qp): the passive side receives at the PSN its REP
        announces and sends from the REQ's Starting PSN."""
        qpctl.to_init(eq, now)
        qpctl.to_rtr(eq, now, dest_qpn=req.local_qpn, rq_psn=self.local_psn, path_mtu=mtu,
                     max_dest_rd_atomic=resp, min_rnr_timer=a.min_rnr_timer, av=self._av())
        timeout = (req.primary_local_ack_timeout if self.local_ack_timeout is None
                   else self.local_ack_timeout)
        qpctl.to_rts(eq, now, sq_psn=req.starting_psn, timeout=timeout,
                     retry_cnt=req.retry_count, rnr_retry=req.rnr_retry_count,
                     max_rd_atomic=depth)

    def _send_rep(self, rep: wcm.Rep, req: wcm.Req, now: float) -> None:
        self.rep = rep
        # linux cm_req_handler: wait 2 * PacketLifeTime + the REQ's Local CM Response
        # Timeout for the RTU, retrying Max CM Retries times.
        plt = max(0, req.primary_local_ack_timeout - 1)
        self.timeout_s = 2 * time_code_s(plt) + time_code_s(req.local_cm_response_timeout)
        self.max_retries = req.max_cm_retries
        self._send(rep, self.tid, now, retransmit=True)

    def _a_send_rej(self, now: float, arg: Any) -> None:
        pd, reason, ari = arg
        st = self.state
        if st in (CmState.REQ_RCVD, CmState.MRA_REQ_SENT):
            what = MsgType.REQ
        elif st in (CmState.REP_RCVD, CmState.MRA_REP_SENT):
            what = MsgType.REP
        else:
            what = MsgType.OTHER
        rej = make_rej(self.local_id, self.remote_id, what, reason, ari,
                       check_pd(pd, wcm.CmAttr.REJ))
        self._send(rej, self.tid, now, retransmit=False)
        self._cancel()
        self._qp_err(now)

    def _a_send_mra(self, now: float, arg: Any) -> None:
        st, pd = arg
        what = MsgType.REQ if self.state == CmState.REQ_RCVD else MsgType.REP
        self._mra(what, st, check_pd(pd, wcm.CmAttr.MRA), now)

    def _mra(self, what: int, service_timeout: int, pd: bytes, now: float) -> None:
        if not 0 <= service_timeout <= 31:
            raise InvalidArgument("service_timeout", "an IBA time code is 0..31")
        mra = wcm.Mra(local_comm_id=self.local_id, remote_comm_id=self.remote_id,
                      message_mraed=what, service_timeout=service_timeout, private_data=pd)
        self._send(mra, self.tid, now, retransmit=False)

    def _a_dup_req_mra(self, now: float, arg: Any) -> None:
        self._mra(MsgType.REQ, self.agent.config.mra_service_timeout, b"", now)

    def _a_dup_rep_mra(self, now: float, arg: Any) -> None:
        self._mra(MsgType.REP, self.agent.config.mra_service_timeout, b"", now)

    def _a_resend(self, now: float, arg: Any) -> None:
        """Answer a duplicate from state: the last MRA/RTU we sent, or the pending REP."""
        self.agent.counters.duplicates += 1
        mad = self.msg if self.state == CmState.REP_SENT else self.last_reply
        if mad is not None and self.path is not None:
            self.agent._out(self.path.sgid, self.path.dgid, mad, self.path)

    def _a_rtu_received(self, now: float, arg: Any) -> None:
        self._cancel()
        pd = bytes(arg[0].private_data) if arg is not None else b""
        self._emit(CmEventType.ESTABLISHED, pd)

    # ---- actions: release -------------------------------------------------------------------------
    def _a_send_dreq(self, now: float, arg: Any) -> None:
        agent = self.agent
        self._cancel()
        self._qp_err(now)
        dreq = wcm.Dreq(local_comm_id=self.local_id, remote_comm_id=self.remote_id,
                        remote_qpn_eecn=self.remote_qpn,
                        private_data=check_pd(arg or b"", wcm.CmAttr.DREQ))
        cfg = agent.config
        self.timeout_s = 2 * cfg.packet_life_s + time_code_s(cfg.remote_cm_response_timeout)
        self.max_retries = cfg.max_cm_retries
        self._send(dreq, agent.new_tid(), now, retransmit=True)

    def _a_dreq_received(self, now: float, arg: Any) -> CmState | None:
        dreq: wcm.Dreq = arg[0]
        if self.local_qpn is not None and dreq.remote_qpn_eecn != self.local_qpn:
            self.agent.counters.ignored += 1  # linux cm_dreq_handler: not our QP
            return self.state
        self._cancel()
        self._qp_err(now)
        self.drep_tid = arg[1]
        self._emit(CmEventType.DISCONNECTED, bytes(dreq.private_data))
        self._follow = CmEv.API_DREP
        return None

    def _a_send_drep(self, now: float, arg: Any) -> None:
        drep = wcm.Drep(local_comm_id=self.local_id, remote_comm_id=self.remote_id,
                        private_data=check_pd(arg or b"", wcm.CmAttr.DREP))
        self._send(drep, self.drep_tid, now, retransmit=False)

    def _a_drep_again(self, now: float, arg: Any) -> None:
        self.agent.counters.duplicates += 1
        drep = wcm.Drep(local_comm_id=self.local_id, remote_comm_id=self.remote_id)
        self._send(drep, arg[1], now, retransmit=False)

    def _a_drep_received(self, now: float, arg: Any) -> None:
        self._cancel()
        self._emit(CmEventType.DISCONNECTED, bytes(arg[0].private_data))

    def _a_rej_stale(self, now: float, arg: Any) -> None:
        req, tid, src, dst = arg
        self.agent.counters.stale += 1
        self.agent._reject_req(req, tid, src, dst, RejReason.STALE_CONN)

    def _a_timewait_exit(self, now: float, arg: Any) -> None:
        self._emit(CmEventType.TIMEWAIT_EXIT)

    def _a_lap_received(self, now: float, arg: Any) -> None:
        # RoCE has no alternate path here: APR "unsupported" (never status 7, CA16-13);
        # the LAP's LID fields are not looked at (CA16-12).
        lap: wcm.Lap = arg[0]
        apr = wcm.Apr(local_comm_id=self.local_id, remote_comm_id=lap.local_comm_id,
                      status=AprStatus.UNSUPPORTED)
        self._send(apr, arg[1], now, retransmit=False)

    def _a_noop(self, now: float, arg: Any) -> None:
        return None

    def _a_stop_listen(self, now: float, arg: Any) -> None:
        return None

    # ---- actions: SIDR (softrdma.cm.sidr) -----------------------------------------------------------
    def _a_send_sidr_req(self, now: float, arg: Any) -> None:
        from .sidr import send_sidr_req  # noqa: PLC0415

        send_sidr_req(self, arg[0], arg[1], now)

    def _a_sidr_rep_received(self, now: float, arg: Any) -> None:
        from .sidr import sidr_rep_received  # noqa: PLC0415

        sidr_rep_received(self, arg[0], now)

    def _a_send_sidr_rep(self, now: float, arg: Any) -> None:
        from .sidr import send_sidr_rep  # noqa: PLC0415

        send_sidr_rep(self, arg[0], arg[1], now)

    def _a_send_sidr_rej(self, now: float, arg: Any) -> None:
        from .sidr import send_sidr_rej  # noqa: PLC0415

        send_sidr_rej(self, arg if isinstance(arg, tuple) else (bytes(arg or b""), 0, b""), now)

    def _a_cancel(self, now: float, arg: Any) -> None:
        self._cancel()


# States in which destroy() sends what disconnect() sends (linux ib_destroy_cm_id).
_DESTROY_SENDS = frozenset(
    (s, CmEv.API_DISCONNECT) for s in (
        CmState.REQ_SENT, CmState.MRA_REQ_RCVD, CmState.REQ_RCVD, CmState.MRA_REQ_SENT,
        CmState.REP_SENT, CmState.MRA_REP_RCVD, CmState.REP_RCVD, CmState.MRA_REP_SENT,
        CmState.ESTABLISHED, CmState.DREQ_RCVD, CmState.SIDR_REQ_SENT,
        CmState.SIDR_REQ_RCVD, CmState.LISTEN))
