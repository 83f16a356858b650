"""Actions of rejection and connection release (IBA 12.9, Figure 151; 12.9.8.3).

REJ (IBA 12.6.7) ends a connection being set up, DREQ/DREP (12.6.10, 12.6.11) one that
is up; both leave the QP in ERR. TimeWait (Figure 151) holds the comm ID and QPN until it
ends. The choices where IBA leaves room follow Linux ``drivers/infiniband/core/cm.c``
(see :mod:`softrdma.ibcm.state`). Each function is an action of that table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..wire import cm as wcm
from ..wire.cm import MsgType, RejReason, time_code_s
from .events import CmEventType, describe_rej
from .model import CmInput, CmState, Disconnect, Received, Reject, SendDrep, Timeout
from .params import check_pd, make_rej
from .qpctl import drained

if TYPE_CHECKING:
    from .cmid import IbCmId

__all__ = ["send_rej", "rej_received", "rej_stale", "send_dreq", "dreq_received",
           "send_drep", "drep_again", "drep_received", "timewait_exit", "noop"]

# States a REJ "stale connection" sends to TimeWait rather than IDLE (linux cm_rej_handler)
_STALE_TO_TIMEWAIT = (CmState.REQ_SENT, CmState.MRA_REQ_RCVD, CmState.REQ_RCVD,
                      CmState.MRA_REQ_SENT, CmState.REP_SENT, CmState.MRA_REP_RCVD)


# ---- REJ (IBA 12.6.7) ----------------------------------------------------------------
def send_rej(cid: IbCmId, now: float, inp: Reject | Disconnect) -> None:
    """The consumer rejects the REQ (or REP) it received; a disconnect before the
    connection is up is a REJ too (reason 28, Consumer Reject)."""
    if isinstance(inp, Reject):
        pd, reason, ari = inp.private_data, inp.reason, inp.ari
    else:
        pd, reason, ari = inp.private_data, RejReason.CONSUMER_DEFINED, b""
    st = cid.state
    if st in (CmState.REQ_RCVD, CmState.MRA_REQ_SENT):
        what = MsgType.REQ
    elif st in (CmState.REP_RCVD, CmState.MRA_REP_SENT):
        what = MsgType.REP
    else:
        what = MsgType.OTHER
    rej = make_rej(cid.local_id, cid.remote_id, what, reason, ari,
                   check_pd(pd, wcm.CmAttr.REJ))
    cid.send(rej, cid.tid, now, retransmit=False)
    cid.cancel_timer()
    cid.qp_err(now)


def rej_received(cid: IbCmId, now: float, inp: Received[wcm.Rej]) -> CmState | None:
    """The peer's REJ: QP to ERR, REJECTED with the readable reason (IBA Table 109,
    A11 Table 5 ARI); "stale connection" goes to TimeWait (linux cm_rej_handler)."""
    rej = inp.msg
    cid.cancel_timer()
    cid.qp_err(now)
    info = describe_rej(rej)
    cid.reject_info = info
    cid.emit(CmEventType.REJECTED, bytes(rej.private_data), reject=info, info={"rej": rej})
    if rej.reason == RejReason.STALE_CONN and cid.state in _STALE_TO_TIMEWAIT:
        return CmState.TIMEWAIT
    return None


def rej_stale(cid: IbCmId, now: float, inp: Received[wcm.Req]) -> None:
    """A REQ for a connection in TimeWait is stale (IBA 12.9.8.3.2; linux
    ``cm_dup_req_handler``): REJ reason 10 with Local Communication ID 0."""
    cid.agent.counters.stale += 1
    cid.agent.reject_req(inp.msg, inp.tid, inp.src, inp.dst, RejReason.STALE_CONN)


# ---- DREQ / DREP (IBA 12.6.10, 12.6.11) ------------------------------------------------
def send_dreq(cid: IbCmId, now: float, inp: Disconnect) -> None:
    """ESTABLISHED (or REP_SENT) -> DREQ_SENT: QP to ERR, DREQ retransmitted until the
    DREP comes or the retries run out."""
    agent = cid.agent
    cid.cancel_timer()
    cid.dreq_drained = drained(cid.qp)  # before the flush (CmAgent.takes)
    cid.qp_err(now)
    dreq = wcm.Dreq(local_comm_id=cid.local_id, remote_comm_id=cid.remote_id,
                    remote_qpn_eecn=cid.remote_qpn,
                    private_data=check_pd(inp.private_data, wcm.CmAttr.DREQ))
    cfg = agent.config
    cid.timeout_s = 2 * cfg.packet_life_s + time_code_s(cfg.remote_cm_response_timeout)
    cid.max_retries = cfg.max_cm_retries
    cid.send(dreq, agent.new_tid(), now, retransmit=True)


def dreq_received(cid: IbCmId, now: float, inp: Received[wcm.Dreq]) -> CmState | None:
    """The peer's DREQ: QP to ERR, DISCONNECTED, and the DREP at once (the connection
    is gone either way; linux cm_dreq_handler). A DREQ naming another QPN is dropped."""
    dreq = inp.msg
    if cid.local_qpn is not None and dreq.remote_qpn_eecn != cid.local_qpn:
        cid.agent.counters.ignored += 1  # linux cm_dreq_handler: not our QP
        return cid.state
    cid.cancel_timer()
    cid.qp_err(now)
    cid.drep_tid = inp.tid
    cid.emit(CmEventType.DISCONNECTED, bytes(dreq.private_data))
    cid.follow = SendDrep()
    return None


def send_drep(cid: IbCmId, now: float, inp: SendDrep | Disconnect) -> None:
    """DREQ_RCVD -> TIMEWAIT: the DREP answering the DREQ (with the DREQ's TID)."""
    drep = wcm.Drep(local_comm_id=cid.local_id, remote_comm_id=cid.remote_id,
                    private_data=check_pd(inp.private_data, wcm.CmAttr.DREP))
    cid.send(drep, cid.drep_tid, now, retransmit=False)


def drep_again(cid: IbCmId, now: float, inp: Received[wcm.Dreq]) -> None:
    """A DREQ received in TimeWait gets the DREP again (linux cm_dreq_handler)."""
    cid.agent.counters.duplicates += 1
    drep = wcm.Drep(local_comm_id=cid.local_id, remote_comm_id=cid.remote_id)
    cid.send(drep, inp.tid, now, retransmit=False)


def drep_received(cid: IbCmId, now: float, inp: Received[wcm.Drep]) -> None:
    """DREQ_SENT -> TIMEWAIT: the peer's DREP."""
    cid.cancel_timer()
    cid.emit(CmEventType.DISCONNECTED, bytes(inp.msg.private_data))


def timewait_exit(cid: IbCmId, now: float, inp: Timeout) -> None:
    """TIMEWAIT -> IDLE: the comm ID and the QPN may be used again (IBA 12.9, Figure 151)."""
    cid.emit(CmEventType.TIMEWAIT_EXIT)


def noop(cid: IbCmId, now: float, inp: CmInput) -> None:
    """A legal input with nothing to do (a second disconnect; a listener stopping)."""
    return None
