"""Actions of connection establishment (IBA 12.9, Figures 149 and 150).

The active side sends the REQ (IBA 12.6.5), takes the REP (12.6.8) and answers the RTU
(12.6.9); a listener (IDLE -> LISTEN) takes a REQ by spawning a new id in REQ_RCVD (as
Linux ``cm_req_handler``; the agent only finds the listener: duplicates, stale QPNs, the
transport type and an unknown Service ID are answered before any id is involved); the
passive side answers a REQ with its REP and waits for the RTU or the QP's
communication-established event (12.9.7.3). Each function is an action of the table in
:mod:`softrdma.ibcm.state`: it takes the id, the time and its typed input and returns the
next state when its outcome decides it (None: the table's).

Starting PSN convention (Linux ``drivers/infiniband/core/cm.c``, followed by rxe and every
RoCE NIC driver; the Starting PSN of the REQ, IBA 12.6.5, and of the REP, 12.6.8): each side
announces the PSN it will *receive* at. We follow Linux, whose peers we talk to
(``tests/ibcm/test_cm_rping_capture.py`` checks it against a real capture).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import InvalidArgument, SoftRdmaError, StateError
from ..wire import cm as wcm
from ..wire.cm import MsgType, RejReason, TransportServiceType, time_code_s
from ..wire.ipcm import IP_CM_SERVICE_ID_MASK, is_ip_cm_service_id
from . import qpctl
from .events import CmEventType, RejectInfo
from .ipcm import IpCmDialect
from .model import (
    AcceptConn,
    CmState,
    CommEst,
    Connect,
    Disconnect,
    Establish,
    Listen,
    Received,
)
from .params import (
    AcceptParams,
    CmPath,
    ConnParams,
    DialectReject,
    check_pd,
    make_rej,
)
from .userqp import REQ_TRANSPORT, connects_as, passive_psn, qp_info, req_qp_type

if TYPE_CHECKING:
    from .cmid import IbCmId

__all__ = ["send_req", "rep_received", "connect_qp", "send_rtu", "abort_req", "send_rep",
           "rtu_received", "comm_est"]

_MAX_RETRY_COUNT = 7  # the 3-bit Retry Count / RNR Retry Count of a REQ (IBA 12.6.5)
_MAX_RESOURCES = 255  # the 8-bit Responder Resources / Initiator Depth (IBA 12.6.5)
_MAX_TIME_CODE = 31  # a 5-bit IBA time code


# ---- active side (IBA Figure 149) --------------------------------------------------------
def send_req(cid: IbCmId, now: float, inp: Connect) -> None:
    """IDLE -> REQ_SENT: move the QP to INIT and send the REQ (IBA 12.6.5)."""
    qp, p, dialect = inp.qp, inp.params, inp.dialect
    agent = cid.agent
    cfg = agent.config
    if qp is None:
        raise InvalidArgument("qp", "connect needs an RC, UC or XRC INI QP")
    qpn, qpt, has_srq, eq = qp_info(qp)  # eq None: the consumer moves its QP
    if qpt not in REQ_TRANSPORT:
        raise InvalidArgument("qp", "connect needs an RC, UC or XRC INI QP (UD services "
                                    "use sidr_resolve)")
    ctype = qpt if p.qp_type is None else p.qp_type
    if ctype not in REQ_TRANSPORT or not connects_as(qpt, ctype):
        raise InvalidArgument("qp_type", f"a QP of type {qpt} cannot be connected as "
                                         f"type {ctype}")
    tst, ext = REQ_TRANSPORT[ctype]
    xrc = ctype == qpctl.QPT_XRC_INI
    pd = check_pd(p.private_data, wcm.CmAttr.REQ)
    for name in ("responder_resources", "initiator_depth"):
        if not 0 <= getattr(p, name) <= _MAX_RESOURCES:
            raise InvalidArgument(name, "must be 0..255")
    for name in ("retry_count", "rnr_retry_count"):
        if not 0 <= getattr(p, name) <= _MAX_RETRY_COUNT:
            raise InvalidArgument(name, "must be 0..7")
    sgid = agent.sgid_for(p.dgid, p.sgid)
    agent.claim_qpn(cid, qpn)
    try:
        if eq is not None:
            qpctl.to_init(eq, now)
    except BaseException:
        agent.by_local_qpn.pop(qpn, None)
        cid.local_qpn = None
        raise
    cid.qp = qp if eq is not None else None
    cid.params = p
    cid.dialect = dialect
    cid.auto_rtu = p.auto_rtu
    cid.service_id = p.service_id
    cid.path = CmPath(sgid, bytes(p.dgid), p.hop_limit, p.traffic_class, p.flow_label)
    cid.local_id = agent.new_comm_id(cid)
    cid.remote_id = 0
    cid.local_psn = agent.rng.getrandbits(24)
    cid.ack_timeout = min(_MAX_TIME_CODE, cfg.subnet_timeout + 1)
    mtu = min(p.path_mtu or agent.mtu, agent.mtu)
    # RoCE v2 (linux cm_format_req): LIDs permissive and Subnet Local 0 when the
    # path is routed (hop limit > 1). Receivers ignore them (CA16-10).
    routed = p.hop_limit > 1
    lid = wcm.PERMISSIVE_LID if routed else 0
    req = wcm.Req(
        local_comm_id=cid.local_id, service_id=p.service_id, local_ca_guid=agent.guid,
        local_qpn=qpn, responder_resources=0 if xrc else p.responder_resources,
        initiator_depth=p.initiator_depth,
        remote_cm_response_timeout=cfg.remote_cm_response_timeout,
        transport_service_type=tst, end_to_end_flow_control=int(p.flow_control),
        starting_psn=cid.local_psn, local_cm_response_timeout=cfg.resp_time_value,
        retry_count=0 if xrc else p.retry_count, pkey=0xFFFF, path_mtu=mtu,
        rnr_retry_count=0 if xrc else p.rnr_retry_count, max_cm_retries=cfg.max_cm_retries,
        srq=0 if xrc else int(has_srq), extended_transport_type=ext,
        primary_local_lid=lid, primary_remote_lid=lid,
        primary_local_gid=sgid, primary_remote_gid=bytes(p.dgid),
        primary_flow_label=p.flow_label, primary_traffic_class=p.traffic_class,
        primary_hop_limit=p.hop_limit, primary_subnet_local=0 if routed else 1,
        primary_local_ack_timeout=cid.ack_timeout, private_data=pd)
    cid.req = req
    cid.tid = agent.new_tid()
    cid.max_retries = cfg.max_cm_retries
    cid.timeout_s = 2 * cfg.packet_life_s + time_code_s(cfg.remote_cm_response_timeout)
    cid.send(req, cid.tid, now, retransmit=True)


def rep_received(cid: IbCmId, now: float, inp: Received[wcm.Rep]) -> CmState | None:
    """REQ_SENT/MRA_REQ_RCVD -> REP_RCVD: the REP (IBA 12.6.8). With ``auto_rtu`` the
    QP goes to RTR and RTS and the RTU goes out at once (ESTABLISHED); otherwise the
    consumer gets CONNECT_RESPONSE and calls ``establish``."""
    rep = inp.msg
    agent = cid.agent
    assert cid.path is not None and cid.req is not None
    cid.cancel_timer()
    cid.remote_id = rep.local_comm_id
    cid.remote_guid = rep.local_ca_guid
    # an XRC TGT QP's number comes in the Local EE Context Number (linux cm_format_rep /
    # cm_rep_get_qpn; the REP's Local QPN is 0 then)
    xrc = cid.req.transport_service_type == TransportServiceType.EXTENDED
    cid.remote_qpn = rep.local_eecn if xrc else rep.local_qpn
    cid.rep = rep
    rkey = (rep.local_comm_id, rep.local_ca_guid)
    qkey = (cid.remote_qpn, cid.path.dgid)
    clash = agent.by_remote.get(rkey) or agent.by_remote_qpn.get(qkey)
    if clash is not None and clash is not cid:
        # IBA 12.9.8.3.2 / linux cm_rep_handler: the peer's comm ID or QPN is still
        # held by an older connection: stale.
        agent.counters.stale += 1
        rej = make_rej(cid.local_id, rep.local_comm_id, MsgType.REP, RejReason.STALE_CONN)
        cid.send(rej, cid.tid, now, retransmit=False)
        cid.qp_err(now)
        cid.reject_info = RejectInfo(RejReason.STALE_CONN,
                                     "stale connection: the peer's QPN or comm ID is "
                                     "still in use here (STALE_CONN)")
        cid.emit(CmEventType.REJECTED, reject=cid.reject_info)
        return CmState.TIMEWAIT
    agent.by_remote[rkey] = cid
    agent.by_remote_qpn[qkey] = cid
    pd, info = bytes(rep.private_data), dict[str, Any]()
    if cid.dialect is not None:
        pd, info = cid.dialect.parse_rep(cid, pd)
    info["rep"] = rep
    if cid.auto_rtu and cid.qp is not None:
        try:
            connect_qp(cid, now)
        except SoftRdmaError as exc:
            # linux rdma_cm: REJ the REP and report CONNECT_ERROR
            rej = make_rej(cid.local_id, cid.remote_id, MsgType.REP,
                           RejReason.CONSUMER_DEFINED)
            cid.send(rej, cid.tid, now, retransmit=False)
            cid.qp_err(now)
            cid.reject_info = RejectInfo(None, f"the local QP could not be connected: {exc}")
            cid.emit(CmEventType.CONNECT_ERROR, reject=cid.reject_info)
            return CmState.TIMEWAIT
        rtu = wcm.Rtu(local_comm_id=cid.local_id, remote_comm_id=cid.remote_id)
        cid.send(rtu, cid.tid, now, retransmit=False)
        cid.emit(CmEventType.ESTABLISHED, pd, info=info)
        return CmState.ESTABLISHED
    cid.emit(CmEventType.CONNECT_RESPONSE, pd, info=info)
    return None


def connect_qp(cid: IbCmId, now: float) -> None:
    """Active side, after the REP: the QP to RTR and RTS (linux cm_init_qp_*_attr).

    Linux's Starting PSN convention (see the module docstring): the active side's
    ``rq_psn`` is the REQ's Starting PSN (its own) and its ``sq_psn`` is the REP's.
    """
    rep, req, p = cid.rep, cid.req, cid.params
    assert rep is not None and req is not None and isinstance(p, ConnParams)
    eq = qpctl.engine_of(cid.qp)
    qpctl.to_rtr(eq, now, dest_qpn=cid.remote_qpn, rq_psn=cid.local_psn,
                 path_mtu=req.path_mtu,
                 max_dest_rd_atomic=min(rep.initiator_depth, p.responder_resources),
                 min_rnr_timer=p.min_rnr_timer, av=cid.av())
    timeout = cid.ack_timeout if cid.local_ack_timeout is None else cid.local_ack_timeout
    qpctl.to_rts(eq, now, sq_psn=rep.starting_psn, timeout=timeout,
                 retry_cnt=p.retry_count, rnr_retry=rep.rnr_retry_count,
                 max_rd_atomic=min(rep.responder_resources, p.initiator_depth))


def send_rtu(cid: IbCmId, now: float, inp: Establish) -> None:
    """REP_RCVD/MRA_REP_SENT -> ESTABLISHED: the consumer's RTU (IBA 12.6.9)."""
    pd = check_pd(inp.private_data, wcm.CmAttr.RTU)
    if cid.qp is not None:
        connect_qp(cid, now)
    rtu = wcm.Rtu(local_comm_id=cid.local_id, remote_comm_id=cid.remote_id, private_data=pd)
    cid.send(rtu, cid.tid, now, retransmit=False)
    cid.emit(CmEventType.ESTABLISHED)


def abort_req(cid: IbCmId, now: float, inp: Disconnect) -> None:
    """REQ_SENT -> IDLE on the consumer's disconnect: linux ib_destroy_cm_id in REQ_SENT
    sends REJ "Timeout" with our CA GUID as ARI (IBA 12.6.7)."""
    rej = make_rej(cid.local_id, 0, MsgType.REQ, RejReason.TIMEOUT,
                   cid.agent.guid.to_bytes(8, "big"))
    cid.send(rej, cid.tid, now, retransmit=False)
    cid.cancel_timer()
    cid.qp_err(now)


# ---- passive side (IBA Figure 150) -------------------------------------------------------
def send_rep(cid: IbCmId, now: float, inp: AcceptConn) -> None:
    """REQ_RCVD/MRA_REQ_SENT -> REP_SENT: the QP to RTS, then the REP (IBA 12.6.8, as
    Linux ``rdma_accept``)."""
    qp, a = inp.qp, inp.params
    agent = cid.agent
    req = cid.req
    assert req is not None and cid.path is not None
    if qp is None:
        raise InvalidArgument("qp", "accept needs the QP of the connection")
    qpn, qpt, has_srq, eq = qp_info(qp)  # eq None: the consumer moves its QP
    want = req_qp_type(req)
    if want is None or not connects_as(qpt, want):
        raise InvalidArgument("qp", f"the REQ asks for a QP of type {want} ("
                                    f"{TransportServiceType(req.transport_service_type).name}"
                                    f"), the QP is of type {qpt}")
    xrc = want == qpctl.QPT_XRC_TGT  # the REP's format is the REQ's type's (linux cm.c)
    resp = min(a.responder_resources, req.initiator_depth)
    depth = min(a.initiator_depth, req.responder_resources)
    pd = a.private_data
    if cid.dialect is not None:
        pd = cid.dialect.rep_private_data(cid, pd)
    pd = check_pd(pd, wcm.CmAttr.REP)
    if not 0 <= a.rnr_retry_count <= _MAX_RETRY_COUNT:
        raise InvalidArgument("rnr_retry_count", "must be 0..7")
    agent.claim_qpn(cid, qpn)
    cid.qp = qp if eq is not None else None
    cid.local_psn = passive_psn(cid)
    cid.ack_timeout = req.primary_local_ack_timeout
    mtu = min(req.path_mtu, agent.mtu) if req.path_mtu else agent.mtu
    try:
        if eq is not None:  # else the consumer's own QP (userqp.cm_qp_attr)
            _rep_qp(cid, eq, req, now, mtu, resp, depth, a)
    except BaseException:
        agent.by_local_qpn.pop(qpn, None)
        cid.local_qpn = None
        cid.qp = None
        raise
    has_alt = any(req.alt_local_gid) or req.alt_local_lid
    # XRC TGT (linux cm_format_rep): the QPN goes in the Local EE Context Number, SRQ is
    # 1, and Local QPN, Initiator Depth and End-to-End Flow Control stay 0
    rep = wcm.Rep(local_comm_id=cid.local_id, remote_comm_id=cid.remote_id,
                  local_qpn=0 if xrc else qpn, local_eecn=qpn if xrc else 0,
                  starting_psn=cid.local_psn,
                  responder_resources=resp, initiator_depth=0 if xrc else depth,
                  target_ack_delay=a.target_ack_delay,
                  failover_accepted=1 if has_alt else 0,
                  end_to_end_flow_control=0 if xrc else int(a.flow_control),
                  rnr_retry_count=a.rnr_retry_count, srq=int(has_srq),
                  local_ca_guid=agent.guid, private_data=pd)
    cid.rep = rep
    # IBA 12.6.5 / linux cm_req_handler: wait 2 * PacketLifeTime + the REQ's Local CM
    # Response Timeout for the RTU, retrying Max CM Retries times; each taken only up
    # to our local bound (CmConfig.max_peer_response_timeout), as a forged REQ names
    # them: 31/31/15 would hold the half-open connection for hours.
    cfg = agent.config
    plt = min(max(0, req.primary_local_ack_timeout - 1), cfg.subnet_timeout)
    resp_time = min(req.local_cm_response_timeout, cfg.max_peer_response_timeout)
    cid.timeout_s = 2 * time_code_s(plt) + time_code_s(resp_time)
    cid.max_retries = min(req.max_cm_retries, cfg.max_cm_retries)
    cid.opened_at = now
    cid.send(rep, cid.tid, now, retransmit=True)


def _rep_qp(cid: IbCmId, eq: qpctl.CmQp, req: wcm.Req, now: float, mtu: int, resp: int,
            depth: int, a: AcceptParams) -> None:
    """Passive side: the QP to INIT, RTR and RTS before the REP. Linux's Starting PSN
    convention (module docstring): the passive side receives at the PSN its REP
    announces and sends from the REQ's Starting PSN."""
    qpctl.to_init(eq, now)
    qpctl.to_rtr(eq, now, dest_qpn=req.local_qpn, rq_psn=cid.local_psn, path_mtu=mtu,
                 max_dest_rd_atomic=resp, min_rnr_timer=a.min_rnr_timer, av=cid.av())
    timeout = (req.primary_local_ack_timeout if cid.local_ack_timeout is None
               else cid.local_ack_timeout)
    qpctl.to_rts(eq, now, sq_psn=req.starting_psn, timeout=timeout,
                 retry_cnt=req.retry_count, rnr_retry=req.rnr_retry_count,
                 max_rd_atomic=depth)


def rtu_received(cid: IbCmId, now: float, inp: Received[wcm.Rtu]) -> None:
    """REP_SENT/MRA_REP_RCVD -> ESTABLISHED: the RTU (IBA 12.6.9)."""
    cid.cancel_timer()
    cid.emit(CmEventType.ESTABLISHED, bytes(inp.msg.private_data))


def comm_est(cid: IbCmId, now: float, inp: CommEst) -> None:
    """REP_SENT/MRA_REP_RCVD -> ESTABLISHED: data arrived before the RTU (IBA 12.9.7.3)."""
    cid.cancel_timer()
    cid.emit(CmEventType.ESTABLISHED)


# ---- the passive open: IBA Figure 150 (a listener and the REQs it takes)
def start_listen(cid: IbCmId, now: float, inp: Listen) -> None:
    """IDLE -> LISTEN (``ib_cm_listen``): one listener per Service ID and mask; devd is
    told (its hook may refuse a Service ID another process listens on)."""
    agent = cid.agent
    for other in agent.listeners:
        if other.service_id & other.mask == inp.service_id & inp.mask and other.mask == inp.mask:
            raise StateError(f"Service ID {inp.service_id:#018x} already has a listener")
    cid.service_id = inp.service_id
    cid.mask = inp.mask
    cid.backlog = inp.backlog
    if agent.on_listen is not None:  # devd: REQs for it come here
        agent.on_listen(inp.service_id, inp.mask, True)
    d = inp.dialect
    if d is None and is_ip_cm_service_id(inp.service_id) and \
            inp.mask & IP_CM_SERVICE_ID_MASK == IP_CM_SERVICE_ID_MASK:
        # CA11-7: REQs to the A11 range are Table 1 formatted, whoever listens.
        d = IpCmDialect()
    cid.dialect = d
    agent.listeners.append(cid)


def req_received(lst: IbCmId, now: float, inp: Received[wcm.Req]) -> None:
    """LISTEN, a REQ for this listener: refused when the backlog of half-open connections
    is full (REJ No resources, IBA 12.6.7 Table 109 reason 3) or by the listener's dialect,
    else a new id in REQ_RCVD and CONNECT_REQUEST for the listener's consumer."""
    agent, req = lst.agent, inp.msg
    src, dst, tid = inp.src, inp.dst, inp.tid
    if lst.pending >= lst.backlog and not agent.evict_half_open(lst, now):
        # The backlog (half-open connections: not yet accepted, or waiting for the
        # RTU) is full: REJ "No resources available" frees the peer at once instead of
        # holding it for its full REQ timeout. Linux drops such a REQ silently (ucma
        # backlog exhausted: ENOMEM, cm_destroy_id does not reject) so that it is
        # retried; we reject so that a flood of REQs cannot hold a listener for that long.
        agent.counters.backlog_drops += 1
        agent.reject_req(req, tid, src, dst, RejReason.NO_RESOURCES)
        return
    verdict = lst.check_req(req.service_id, bytes(req.private_data), False)
    if isinstance(verdict, DialectReject):
        agent.reject_req(req, tid, src, dst, verdict.reason, verdict.ari,
                         verdict.private_data)
        return
    path = CmPath(dst, src, req.primary_hop_limit or 64, req.primary_traffic_class,
                  req.primary_flow_label)
    child = agent.passive_id(lst, req.service_id, tid, req.local_comm_id, path,
                             CmState.REQ_RCVD)
    child.req = req
    child.remote_guid = req.local_ca_guid
    child.remote_qpn = req.local_qpn
    child.local_id = agent.new_comm_id(child)
    agent.by_remote[(child.remote_id, child.remote_guid)] = child
    agent.by_remote_qpn[(child.remote_qpn, src)] = child
    lst.emit_connect_request(child, verdict, {"req": req})
