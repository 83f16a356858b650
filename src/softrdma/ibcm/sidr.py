"""Service ID Resolution for UD services (IBA Vol 1 §12.11, Figure 153).

A client sends a SIDR_REQ naming a Service ID (and private data: for the rdma_cm UDP
port space the A11 IP CM header, cma.c ``cma_resolve_ib_udp``); the server answers a
SIDR_REP with the UD QPN and Q_Key of the service (status 0) or a status saying why
not (IBA Table 121): 1 when nobody listens on the Service ID, 2 when the service (or the
A11 checks, with the Table 4 ARI in the Additional Information) rejects it.

The client side is the IbCmId states IDLE -> SIDR_REQ_SENT -> IDLE (retransmitting the
SIDR_REQ like a REQ); the server side creates an IbCmId in SIDR_REQ_RCVD per request and
reports CONNECT_REQUEST with ``info["sidr"] = True``; ``accept(qp)`` answers. A
duplicate SIDR_REQ is dropped while the consumer decides and answered with the same
SIDR_REP afterwards (the last answers are cached). The functions taking an id are
actions of the table in :mod:`softrdma.ibcm.state`; they use the id's and the agent's
public interface only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import InvalidArgument
from ..wire import cm as wcm
from ..wire.cm import RejReason, SidrStatus, time_code_s
from ..wire.ipcm import RDMA_UDP_QKEY
from . import qpctl
from .events import CmEventType, describe_sidr_status
from .model import AcceptConn, CmState, Disconnect, Received, Reject, SidrResolve
from .params import CmPath, DialectReject

if TYPE_CHECKING:
    from .cmid import CmAgentView, IbCmId

__all__ = ["handle_sidr_req", "send_sidr_req", "sidr_rep_received", "send_sidr_rep",
           "send_sidr_rej", "cancel", "SIDR_CACHE_SIZE"]

SIDR_CACHE_SIZE = 1024
_SIDR_STATUS_MAX = SidrStatus.UNSUPPORTED_VERSION  # the highest status of IBA Table 121


def _sidr_rep_mad(agent: CmAgentView, sgid: bytes, dgid: bytes, rep: wcm.SidrRep, tid: int,
                  key: tuple[int, bytes]) -> None:
    mad = agent.send_msg(sgid, dgid, rep, tid)
    cache = agent.sidr_cache
    cache[key] = mad
    while len(cache) > SIDR_CACHE_SIZE:
        del cache[next(iter(cache))]


# ---- server side (IBA 12.11.2) -----------------------------------------------------------
def handle_sidr_req(agent: CmAgentView, msg: wcm.SidrReq, tid: int, src: bytes, dst: bytes,
                    now: float) -> None:
    """Server side of a received SIDR_REQ: answered from the cache, refused (status 1
    nobody listens, 2 the dialect refuses), or a new id in SIDR_REQ_RCVD and
    CONNECT_REQUEST for the listener's consumer."""
    key = (msg.request_id, src)
    cached = agent.sidr_cache.get(key)
    if cached is not None:
        agent.counters.duplicates += 1
        agent.out(dst, src, cached)
        return
    if key in agent.sidr_server:
        agent.counters.duplicates += 1  # the consumer is still deciding
        return
    listener = agent.find_listener(msg.service_id)
    if listener is None:
        agent.counters.no_listener += 1
        if agent.exclusive:
            rep = wcm.SidrRep(request_id=msg.request_id, status=SidrStatus.UNSUPPORTED,
                              service_id=msg.service_id)
            _sidr_rep_mad(agent, dst, src, rep, tid, key)
        return
    # the table's (LISTEN, SIDR_REQ) row: backlog, dialect, the new id in SIDR_REQ_RCVD
    listener.handle(Received(msg, tid, src, dst), now)


def sidr_req_received(lst: IbCmId, now: float, inp: Received[wcm.SidrReq]) -> None:
    """LISTEN, a SIDR_REQ for this listener (IBA 12.11.2): dropped when the backlog is
    full (the client retries), refused by the listener's dialect (SIDR_REP status 1 or
    2), else a new id in SIDR_REQ_RCVD and CONNECT_REQUEST for the listener's consumer."""
    agent, msg = lst.agent, inp.msg
    src, dst, tid = inp.src, inp.dst, inp.tid
    key = (msg.request_id, src)
    if lst.pending >= lst.backlog:
        agent.counters.backlog_drops += 1
        return
    verdict = lst.check_req(msg.service_id, bytes(msg.private_data), True)
    if isinstance(verdict, DialectReject):
        status = verdict.sidr_status
        if status is None:
            status = (SidrStatus.UNSUPPORTED if verdict.reason == RejReason.INVALID_SERVICE_ID
                      else SidrStatus.REJECT)
        rep = wcm.SidrRep(request_id=msg.request_id, status=status,
                          info_length=len(verdict.ari), service_id=msg.service_id,
                          info=verdict.ari,
                          private_data=verdict.private_data[:_rep_pd_max()])
        _sidr_rep_mad(agent, dst, src, rep, tid, key)
        return
    child = agent.passive_id(lst, msg.service_id, tid, msg.request_id, CmPath(dst, src),
                             CmState.SIDR_REQ_RCVD)
    child.sidr_key = key
    agent.sidr_server[key] = child
    lst.emit_connect_request(child, verdict, {"sidr": True, "sidr_req": msg})


def _rep_pd_max() -> int:
    return wcm.PRIVATE_DATA_SIZE[wcm.CmAttr.SIDR_REP]


def send_sidr_rep(cid: IbCmId, now: float, inp: AcceptConn) -> None:
    """SIDR_REQ_RCVD -> IDLE: SIDR_REP status 0 with the UD QP's number and Q_Key."""
    qp, a = inp.qp, inp.params
    if qp is None:
        raise InvalidArgument("qp", "a SIDR accept needs the UD QP of the service")
    eq = qpctl.engine_of(qp)
    if eq.qp_type != qpctl.QPT_UD:
        raise InvalidArgument("qp", "a SIDR service is a UD QP")
    qkey = a.qkey if a.qkey is not None else (eq.qkey or RDMA_UDP_QKEY)
    qpctl.ud_to_rts(eq, now, qkey)
    pd = a.private_data
    if cid.dialect is not None:
        pd = cid.dialect.rep_private_data(cid, pd)
    if len(pd) > _rep_pd_max():
        raise InvalidArgument("private_data", f"at most {_rep_pd_max()} bytes fit in a "
                                              f"SIDR_REP, got {len(pd)}")
    rep = wcm.SidrRep(request_id=cid.remote_id, status=SidrStatus.SUCCESS, qpn=eq.qpn,
                      service_id=cid.service_id, qkey=qkey, private_data=bytes(pd))
    _finish(cid, rep)


def send_sidr_rej(cid: IbCmId, now: float, inp: Reject | Disconnect) -> None:
    """SIDR_REQ_RCVD -> IDLE: SIDR_REP with status 2 (rejected by the service provider),
    or the status given as ``reason`` when it is a SIDR status (IBA Table 121)."""
    if isinstance(inp, Reject):
        pd, reason, ari = inp.private_data, inp.reason, inp.ari
    else:
        pd, reason, ari = inp.private_data, 0, b""
    status = reason if SidrStatus.UNSUPPORTED <= reason <= _SIDR_STATUS_MAX \
        else SidrStatus.REJECT
    rep = wcm.SidrRep(request_id=cid.remote_id, status=status, info_length=len(ari),
                      service_id=cid.service_id, info=ari,
                      private_data=bytes(pd[:_rep_pd_max()]))
    _finish(cid, rep)


def _finish(cid: IbCmId, rep: wcm.SidrRep) -> None:
    assert cid.path is not None and cid.sidr_key is not None
    _sidr_rep_mad(cid.agent, cid.path.sgid, cid.path.dgid, rep, cid.tid, cid.sidr_key)


# ---- client side (IBA 12.11.1) -----------------------------------------------------------
def send_sidr_req(cid: IbCmId, now: float, inp: SidrResolve) -> None:
    """IDLE -> SIDR_REQ_SENT: the SIDR_REQ for ``service_id``, retransmitted on timeout."""
    p = inp.params
    agent = cid.agent
    cfg = agent.config
    pd = bytes(p.private_data)
    limit = wcm.PRIVATE_DATA_SIZE[wcm.CmAttr.SIDR_REQ]
    if len(pd) > limit:
        raise InvalidArgument("private_data", f"at most {limit} bytes fit in a SIDR_REQ, "
                                              f"got {len(pd)}")
    sgid = agent.sgid_for(p.dgid, p.sgid)
    rid = agent.random_id()
    cid.local_id = rid
    agent.sidr_pending[rid] = cid
    cid.params = p
    cid.dialect = inp.dialect
    cid.service_id = p.service_id
    cid.path = CmPath(sgid, bytes(p.dgid))
    cid.tid = agent.new_tid()
    cid.max_retries = cfg.max_cm_retries
    cid.timeout_s = 2 * cfg.packet_life_s + time_code_s(cfg.remote_cm_response_timeout)
    req = wcm.SidrReq(request_id=rid, pkey=p.pkey, service_id=p.service_id, private_data=pd)
    cid.send(req, cid.tid, now, retransmit=True)


def sidr_rep_received(cid: IbCmId, now: float, inp: Received[wcm.SidrRep]) -> None:
    """SIDR_REQ_SENT -> IDLE: status 0 is ESTABLISHED with the UD QPN and Q_Key, any
    other REJECTED with the status's text (IBA Table 121)."""
    rep = inp.msg
    cid.cancel_timer()
    pd = bytes(rep.private_data)
    if rep.status == SidrStatus.SUCCESS:
        info: dict[str, Any] = {"sidr_rep": rep}
        cid.emit(CmEventType.ESTABLISHED, pd, ud_qpn=rep.qpn, ud_qkey=rep.qkey, info=info)
        return
    ri = describe_sidr_status(rep.status,
                              bytes(rep.info[:min(rep.info_length, wcm.ADDITIONAL_INFO_SIZE)]))
    cid.reject_info = ri
    cid.emit(CmEventType.REJECTED, pd, reject=ri, info={"sidr_rep": rep})


def cancel(cid: IbCmId, now: float, inp: Disconnect) -> None:
    """SIDR_REQ_SENT -> IDLE: the consumer gives up (no message: SIDR has no REJ)."""
    cid.cancel_timer()
