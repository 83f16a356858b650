"""IB CM connections on the fabric (tests/harness/cm.py's Pair).

(Moved from tests/ibcm/test_cm_ibcm.py, which other test files imported.)"""

from __future__ import annotations

from typing import Any

import pytest

from harness.cm import Pair, T
from softrdma import enums as e
from softrdma.errors import InvalidArgument
from softrdma.ibcm.agent import ConnParams, IbCmId, check_roce_message
from softrdma.ibcm.model import (
    CmState,
)
from softrdma.wire import cm as wcm
from softrdma.wire.cm import AprStatus, CmAttr, RejReason

SID = 0x0000_0000_0000_4242


RTS = int(e.IBV_QPS_RTS)


def connect(p: Pair, **conn: Any) -> tuple[IbCmId, Any, Any, Any]:
    """Listener on b accepting with a fresh QP; a connects. Returns (client id, qa, qb, lst)."""
    qb, _ = p.b.qp()
    lst = p.listen_accepting(SID, qb)
    qa, _ = p.a.qp()
    cid = p.a.new_id()
    cid.connect(qa, ConnParams(SID, p.b.gid, **conn))
    return cid, qa, qb, lst


def server_id(p: Pair) -> IbCmId:
    reqs = p.b.of(T.CONNECT_REQUEST)
    assert reqs, p.b.events
    return reqs[-1].cm_id


def check_roce_forbidden_codes_are_never_sent() -> None:
    """CA16-11 (REJ 13, 19) and CA16-13 (APR 7)."""
    p = Pair()
    lst = p.b.new_id()
    lst.listen(SID)
    qa, _ = p.a.qp()
    p.a.new_id().connect(qa, ConnParams(SID, p.b.gid))
    p.run(1)
    child = server_id(p)
    for reason in (RejReason.INVALID_LID, RejReason.INVALID_ALT_LID):
        with pytest.raises(InvalidArgument, match="CA16-11"):
            child.reject(reason=reason)
        assert child.state == CmState.REQ_RCVD
    with pytest.raises(InvalidArgument, match="CA16-13"):
        check_roce_message(wcm.Apr(status=AprStatus.INVALID_LID))
    check_roce_message(wcm.Apr(status=AprStatus.UNSUPPORTED))
    child.reject()
    p.run(1)
    assert all(r.reason not in (13, 19) for r in p.sent(CmAttr.REJ))


def check_req_lids_are_not_validated() -> None:
    """CA16-10: whatever the four LID fields of a REQ hold, the REQ is served."""
    p = Pair()
    qb, _ = p.b.qp()
    p.listen_accepting(SID, qb)
    req = wcm.Req(local_comm_id=0x1234, service_id=SID, local_ca_guid=0xABCD, local_qpn=0x99,
                  starting_psn=7, path_mtu=3, max_cm_retries=3, local_cm_response_timeout=19,
                  primary_local_lid=0x0BAD, primary_remote_lid=0xBEEF, alt_local_lid=0x1111,
                  alt_remote_lid=0x2222, primary_local_gid=p.a.gid, primary_remote_gid=p.b.gid,
                  primary_hop_limit=64, primary_local_ack_timeout=19)
    mad = wcm.encode(req, tid=5)
    p.b.ctx.runtime.call_now(lambda now: p.b.agent.on_mad(mad, p.a.gid, 1, now,
                                                          dst_gid=p.b.gid))
    p.run(0.001)
    (rep,) = p.sent(CmAttr.REP)
    assert rep.remote_comm_id == 0x1234 and qb.qp_state == RTS
    assert qb.engine.dest_qpn == 0x99


def check_lap_lids_ignored() -> None:
    """CA16-12/13 (also run by test_roce_a16_compliance.py): a LAP with alternate LIDs
    gets APR "unsupported", never "invalid LID", and the connection stays ESTABLISHED."""
    p = Pair()
    cid, qa, qb, _ = connect(p)
    p.run(1)
    srv = server_id(p)
    lap = wcm.Lap(local_comm_id=cid.local_id, remote_comm_id=srv.local_id,
                  remote_qpn_eecn=qb.qp_num, alt_local_lid=0xDEAD, alt_remote_lid=0xBEEF)
    mad = wcm.encode(lap, tid=9)
    p.b.ctx.runtime.call_now(lambda now: p.b.agent.on_mad(mad, p.a.gid, 1, now,
                                                          dst_gid=p.b.gid))
    p.run(0.001)
    (apr,) = p.sent(CmAttr.APR)
    assert apr.status == AprStatus.UNSUPPORTED and apr.remote_comm_id == cid.local_id
    assert srv.state == CmState.ESTABLISHED
