"""Actions for MRA, duplicates and LAP (IBA 12.6.6; 12.9 Figures 149-150; 12.8).

An MRA (Message Receipt Acknowledgement, IBA 12.6.6) asks the peer for more time: the
consumer sends one while it decides, and a duplicate REQ or REP while it decides is
answered with one (rdma_cm's ``CMA_CM_MRA_SETTING``); a received MRA replaces the
retransmission wait by its service timeout. Other duplicates are answered from state
(linux ``cm_dup_req_handler``/``cm_dup_rep_handler``). A LAP (IBA 12.8) is answered
with APR "unsupported": RoCE has no alternate path here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import InvalidArgument
from ..wire import cm as wcm
from ..wire.cm import AprStatus, MsgType, time_code_s
from .model import CmInput, CmState, Received, SendMra
from .params import check_pd

if TYPE_CHECKING:
    from .cmid import IbCmId

__all__ = ["mra_received", "send_mra", "dup_req_mra", "dup_rep_mra", "resend",
           "lap_received"]

_MAX_TIME_CODE = 31  # a 5-bit IBA time code (IBA 12.6.6 Service Timeout)


def mra_received(cid: IbCmId, now: float, inp: Received[wcm.Mra]) -> CmState | None:
    """The peer's MRA for our REQ or REP: wait its service timeout plus the packet's
    trip before retrying (IBA 12.6.6). An MRA for another message is dropped."""
    mra = inp.msg
    want = MsgType.REQ if cid.state in (CmState.REQ_SENT, CmState.MRA_REQ_RCVD) \
        else MsgType.REP
    if mra.message_mraed != want or cid.msg is None:
        cid.agent.counters.ignored += 1
        return cid.state
    cid.agent.arm(cid, now + cid.agent.config.packet_life_s
                  + time_code_s(mra.service_timeout))
    return None


def send_mra(cid: IbCmId, now: float, inp: SendMra) -> None:
    """The consumer's MRA for the REQ (passive) or REP (active) it received."""
    what = MsgType.REQ if cid.state == CmState.REQ_RCVD else MsgType.REP
    _mra(cid, what, inp.service_timeout, check_pd(inp.private_data, wcm.CmAttr.MRA), now)


def _mra(cid: IbCmId, what: int, service_timeout: int, pd: bytes, now: float) -> None:
    if not 0 <= service_timeout <= _MAX_TIME_CODE:
        raise InvalidArgument("service_timeout", "an IBA time code is 0..31")
    mra = wcm.Mra(local_comm_id=cid.local_id, remote_comm_id=cid.remote_id,
                  message_mraed=what, service_timeout=service_timeout, private_data=pd)
    cid.send(mra, cid.tid, now, retransmit=False)


def dup_req_mra(cid: IbCmId, now: float, inp: Received[wcm.Req]) -> None:
    """A duplicate REQ while the consumer decides: MRA (linux cm_dup_req_handler)."""
    _mra(cid, MsgType.REQ, cid.agent.config.mra_service_timeout, b"", now)


def dup_rep_mra(cid: IbCmId, now: float, inp: Received[wcm.Rep]) -> None:
    """A duplicate REP while the consumer decides: MRA (linux cm_dup_rep_handler)."""
    _mra(cid, MsgType.REP, cid.agent.config.mra_service_timeout, b"", now)


def resend(cid: IbCmId, now: float, inp: CmInput) -> None:
    """Answer a duplicate from state: the last MRA/RTU we sent, or the pending REP."""
    cid.agent.counters.duplicates += 1
    mad = cid.msg if cid.state == CmState.REP_SENT else cid.last_reply
    if mad is not None and cid.path is not None:
        cid.agent.out(cid.path.sgid, cid.path.dgid, mad, cid.path)


def lap_received(cid: IbCmId, now: float, inp: Received[wcm.Lap]) -> None:
    """RoCE has no alternate path here: APR "unsupported" (never status 7, CA16-13);
    the LAP's LID fields are not looked at (CA16-12)."""
    lap = inp.msg
    apr = wcm.Apr(local_comm_id=cid.local_id, remote_comm_id=lap.local_comm_id,
                  status=AprStatus.UNSUPPORTED)
    cid.send(apr, inp.tid, now, retransmit=False)
