"""The retransmission timer's action (IBA 12.6.5 timeouts and retries, A16 CA16-9).

A message that expects an answer (REQ, REP, DREQ, SIDR_REQ) is sent again, the same MAD
with the same TID, every ``timeout_s`` until Max CM Retries (IBA 12.6.5) is spent; then
the connection gives up: REJ "Timeout" with our CA GUID as ARI (IBA 12.6.7) and
UNREACHABLE while it is being set up, DISCONNECTED after a DREQ, UNREACHABLE for SIDR.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..wire.cm import MsgType, RejReason
from .events import CmEventType, RejectInfo
from .model import CmState, Timeout
from .params import make_rej

if TYPE_CHECKING:
    from .cmid import IbCmId

__all__ = ["retry_or_fail"]

_ACTIVE_SETUP = (CmState.REQ_SENT, CmState.MRA_REQ_RCVD)
_SETUP = (*_ACTIVE_SETUP, CmState.REP_SENT, CmState.MRA_REP_RCVD)


def retry_or_fail(cid: IbCmId, now: float, inp: Timeout) -> CmState | None:
    """Retransmit (staying in the state) or give up (the state's way out)."""
    agent = cid.agent
    if cid.msg is not None and cid.retries < cid.max_retries:
        cid.retries += 1
        agent.counters.retransmits += 1
        assert cid.path is not None
        agent.out(cid.path.sgid, cid.path.dgid, cid.msg, cid.path)
        agent.arm(cid, now + cid.timeout_s)
        return cid.state
    cid.msg = None
    st = cid.state
    n = cid.retries
    if st in _SETUP:
        active = st in _ACTIVE_SETUP
        # IBA 12.6.7: REJ "Timeout" carries the sender's CA GUID as ARI.
        rej = make_rej(cid.local_id, cid.remote_id, MsgType.REQ if active else MsgType.REP,
                       RejReason.TIMEOUT, agent.guid.to_bytes(8, "big"))
        cid.send(rej, cid.tid, now, retransmit=False)
        cid.qp_err(now)
        what = "REQ" if active else "REP"
        cid.reject_info = RejectInfo(RejReason.TIMEOUT, f"no answer to the {what} after "
                                                        f"{n} retransmissions (timeout)")
        cid.emit(CmEventType.UNREACHABLE, reject=cid.reject_info)
        return CmState.IDLE if active else CmState.TIMEWAIT
    if st == CmState.DREQ_SENT:
        cid.emit(CmEventType.DISCONNECTED, info={"timeout": True})
        return CmState.TIMEWAIT
    # SIDR_REQ_SENT (IBA 12.11.1)
    cid.reject_info = RejectInfo(None, f"SIDR: no answer to the SIDR_REQ after {n} "
                                       "retransmissions (timeout)")
    cid.emit(CmEventType.UNREACHABLE, reject=cid.reject_info)
    return CmState.IDLE
