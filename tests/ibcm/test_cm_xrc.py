"""XRC connections through the IB CM (IBA Annex A14 with ch. 12; Linux cm.c's encoding):
an XRC INI QP connects to an XRC TGT QP with a REQ of Transport Service Type 3 and
Extended Transport Type 1, the REP names the TGT QP in its Local EE Context Number, and
SENDs then reach the XRC SRQ each one names. On the in-memory fabric, RoCEv2 and v1."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from harness import cm as cm_harness
from harness.cm import Pair, T
from harness.cm_ibcm import SID, server_id

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.errors import InvalidArgument
from softrdma.ibcm.agent import AcceptParams, ConnParams, IbCmId
from softrdma.ibcm.model import CmState
from softrdma.ibcm.userqp import UserQp, qp_info, req_qp_type
from softrdma.wire import cm as wcm
from softrdma.wire.cm import CmAttr, RejReason, TransportServiceType

XRC_SEND, XRC_RECV = int(e.IBV_QPT_XRC_SEND), int(e.IBV_QPT_XRC_RECV)
RTS = int(e.IBV_QPS_RTS)
ERR = int(e.IBV_QPS_ERR)


@pytest.fixture(autouse=True, params=["2", "1"], ids=["rocev2", "rocev1"])
def roce_ver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(cm_harness, "ROCE_VER", request.param)
    return str(request.param)


def _ini(p: Pair) -> tuple[Any, Any]:
    cq = v.CQ(p.a.ctx, 16)
    qp = v.QP(p.a.pd, v.QPInitAttr(qp_type=XRC_SEND, scq=cq, rcq=cq,
                                   cap=v.QPCap(8, 0, 1, 0)))
    return qp, cq


def _tgt(p: Pair) -> tuple[Any, Any, Any]:
    """b's XRC domain with a TGT QP and an XRC SRQ (and the SRQ's CQ)."""
    xrcd = v.XRCD(p.b.ctx)
    cq = v.CQ(p.b.ctx, 16)
    srq = v.XrcSRQ(p.b.pd, xrcd, cq, v.SrqInitAttr(v.SrqAttr(8, 1)))
    tgt = v.QP(xrcd, v.QPInitAttr(qp_type=XRC_RECV))
    return tgt, srq, cq


def _connect(p: Pair, **conn: Any) -> tuple[Any, Any, Any, Any, Any, Any]:
    tgt, srq, scq = _tgt(p)
    p.listen_accepting(SID, tgt, private_data=srq.srq_num.to_bytes(4, "big"))
    ini, icq = _ini(p)
    cid = p.a.new_id()
    cid.connect(ini, ConnParams(SID, p.b.gid, **conn))
    p.run(1)
    return cid, ini, icq, tgt, srq, scq


@pytest.mark.iba("12.6.5", "12.6.8")
def test_xrc_req_and_rep_as_linux_encodes_them() -> None:
    p = Pair()
    cid, ini, _, tgt, srq, _ = _connect(p, responder_resources=4, initiator_depth=2,
                                     retry_count=6, rnr_retry_count=5)
    (req,) = p.sent(CmAttr.REQ)
    (rep,) = p.sent(CmAttr.REP)
    assert len(p.sent(CmAttr.RTU)) == 1
    # REQ: Transport Service Type 3 ("see Extended Transport Type"), Extended 1 = XRC;
    # linux cm_format_req leaves Responder Resources, the retry counts and SRQ at 0
    assert (req.transport_service_type, req.extended_transport_type) == (3, 1)
    assert req.local_qpn == ini.qp_num and req.initiator_depth == 2
    assert (req.responder_resources, req.retry_count, req.rnr_retry_count, req.srq) == \
        (0, 0, 0, 0)
    # REP: the TGT QP in the Local EE Context Number, Local QPN 0, SRQ 1
    assert rep.local_qpn == 0 and rep.local_eecn == tgt.qp_num and rep.srq == 1
    assert rep.initiator_depth == 0 and rep.end_to_end_flow_control == 0
    assert int.from_bytes(bytes(rep.private_data[:4]), "big") == srq.srq_num
    srv = server_id(p)
    assert cid.state == srv.state == CmState.ESTABLISHED
    assert p.a.types(cid) == [T.ESTABLISHED]
    assert ini.qp_state == tgt.qp_state == RTS
    # each QP names the other; the INI QP retries as its consumer asked (the REQ does not
    # carry it) and RNR-retries as the REP says (linux cm_init_qp_rts_attr)
    assert ini.engine.dest_qpn == tgt.qp_num and tgt.engine.dest_qpn == ini.qp_num
    assert ini.engine.retry_cnt == 6 and ini.engine.rnr_retry == rep.rnr_retry_count
    assert cid.remote_qpn == tgt.qp_num
    assert req_qp_type(req) == XRC_RECV


@pytest.mark.iba("9.8.5")
def test_sends_over_a_cm_connection_reach_the_named_srq() -> None:
    p = Pair()
    cid, ini, icq, tgt, srq, scq = _connect(p)
    srqn = int.from_bytes(bytes(p.a.of(T.ESTABLISHED)[0].private_data[:4]), "big")
    assert srqn == srq.srq_num
    rx = v.MR(p.b.pd, 256, int(e.IBV_ACCESS_LOCAL_WRITE))
    for i in range(2):
        srq.post_recv(v.RecvWR(10 + i, 1, [v.SGE(rx.addr + 128 * i, 128, rx.lkey)]))
    tx = v.MR(p.a.pd, 64, 0)
    for i, msg in enumerate((b"first over XRC", b"second")):
        tx.write(msg, len(msg), 32 * i)
        wr = v.SendWR(20 + i, None, 1, [v.SGE(tx.addr + 32 * i, len(msg), tx.lkey)],
                      e.IBV_WR_SEND, e.IBV_SEND_SIGNALED)
        wr.set_qp_type_xrc(srqn)
        ini.post_send(wr)
    p.run(0.05)
    n, wcs = scq.poll(8)
    assert n == 2 and [w.wr_id for w in wcs] == [10, 11]
    assert all(w.status == e.IBV_WC_SUCCESS and w.qp_num == tgt.qp_num for w in wcs)
    assert [w.byte_len for w in wcs] == [14, 6]
    assert rx.read(14, 0) == b"first over XRC" and rx.read(6, 128) == b"second"
    n, swcs = icq.poll(8)
    assert n == 2 and all(w.status == e.IBV_WC_SUCCESS for w in swcs)
    # teardown as for RC: DREQ/DREP, both QPs to ERR
    cid.disconnect()
    p.run(0.05)
    assert ini.qp_state == tgt.qp_state == ERR
    assert p.b.types(server_id(p))[-1] == T.DISCONNECTED


def test_accepting_an_xrc_req_needs_an_xrc_tgt_qp() -> None:
    """The REQ asks for XRC: accepting it with an RC QP is the consumer's error, named."""
    p = Pair()
    lst = p.b.new_id()
    lst.listen(SID)
    ini, _ = _ini(p)
    p.a.new_id().connect(ini, ConnParams(SID, p.b.gid))
    p.run(1)
    child = server_id(p)
    rc, _ = p.b.qp()
    with pytest.raises(InvalidArgument, match="qp"):
        child.accept(rc, AcceptParams())
    assert child.state == CmState.REQ_RCVD
    tgt, _, _ = _tgt(p)
    child.accept(tgt, AcceptParams())
    p.run(1)
    assert child.state == CmState.ESTABLISHED and ini.qp_state == RTS


def test_an_xrc_tgt_qp_cannot_connect_and_user_qps_name_xrc_types() -> None:
    p = Pair()
    tgt, _, _ = _tgt(p)
    with pytest.raises(InvalidArgument, match="qp"):
        p.b.new_id().connect(tgt, ConnParams(SID, p.a.gid))
    assert qp_info(tgt)[1:3] == (XRC_RECV, True)
    ini, _ = _ini(p)
    assert qp_info(ini)[1:3] == (XRC_SEND, False)
    assert qp_info(UserQp(5, XRC_SEND))[1] == XRC_SEND
    with pytest.raises(InvalidArgument, match="qp_type"):
        UserQp(5, int(e.IBV_QPT_UD))


@pytest.mark.parametrize("tst,ext", [(3, 0), (3, 2), (3, 7), (2, 0)])
def test_unknown_transport_types_are_rejected(tst: int, ext: int) -> None:
    """IBA 12.6.7: a REQ for a transport the CM does not connect gets REJ "Invalid
    Transport Service Type" (reason 21) and no CONNECT_REQUEST; only Transport Service
    Type 3 with Extended Transport Type 1 is XRC."""
    p = Pair()
    lst = p.b.new_id()
    lst.listen(SID)
    src = p.a.gid
    req = wcm.Req(local_comm_id=0x5000, service_id=SID, local_ca_guid=0x77, local_qpn=0x100,
                  starting_psn=1, path_mtu=3, transport_service_type=tst,
                  extended_transport_type=ext, primary_local_gid=src,
                  primary_remote_gid=p.b.gid, primary_hop_limit=64)
    assert req_qp_type(req) is None
    mad = wcm.encode(req, tid=0x9000)
    p.b.ctx.runtime.call_now(lambda now: p.b.agent.on_mad(mad, src, 1, now, dst_gid=p.b.gid))
    p.run(1)
    (rej,) = p.sent(CmAttr.REJ)
    assert rej.reason == RejReason.INVALID_TRANSPORT_TYPE and rej.remote_comm_id == 0x5000
    assert not p.b.of(T.CONNECT_REQUEST) and lst.state == CmState.LISTEN
    assert TransportServiceType.EXTENDED == 3


@pytest.mark.iba("12.6.5", "12.6.8")
def test_xrc_qps_connected_as_rc_as_linux_does_for_a_tcp_id() -> None:
    """Linux's rdma_cm names its id's type in the REQ (``cma_connect_ib``), RC for an
    RDMA_PS_TCP id whatever the QP: libfabric's XRC endpoints connect an XRC INI QP so,
    and the passive side accepts with an XRC TGT QP. The REQ and REP are then RC's (the
    TGT QPN in the REP's Local QPN), and the SENDs still reach the SRQ they name."""
    p = Pair()
    tgt, srq, scq = _tgt(p)
    p.listen_accepting(SID, tgt)
    ini, _ = _ini(p)
    cid = p.a.new_id()
    cid.connect(ini, ConnParams(SID, p.b.gid, qp_type=int(e.IBV_QPT_RC)))
    p.run(1)
    (req,) = p.sent(CmAttr.REQ)
    (rep,) = p.sent(CmAttr.REP)
    assert (req.transport_service_type, req.extended_transport_type) == (0, 0)
    assert rep.local_qpn == tgt.qp_num and rep.local_eecn == 0
    assert cid.state == CmState.ESTABLISHED and ini.qp_state == tgt.qp_state == RTS
    assert ini.engine.dest_qpn == tgt.qp_num and tgt.engine.dest_qpn == ini.qp_num
    rx = v.MR(p.b.pd, 64, int(e.IBV_ACCESS_LOCAL_WRITE))
    srq.post_recv(v.RecvWR(1, 1, [v.SGE(rx.addr, 64, rx.lkey)]))
    tx = v.MR(p.a.pd, 64, 0)
    tx.write(b"as RC", 5)
    wr = v.SendWR(2, None, 1, [v.SGE(tx.addr, 5, tx.lkey)], e.IBV_WR_SEND,
                  e.IBV_SEND_SIGNALED)
    wr.set_qp_type_xrc(srq.srq_num)
    ini.post_send(wr)
    p.run(0.05)
    n, wcs = scq.poll(4)
    assert n == 1 and wcs[0].status == 0 and rx.read(5, 0) == b"as RC"
    # an RC QP cannot be connected as XRC, nor a UC one as RC
    with pytest.raises(InvalidArgument, match="qp_type"):
        p.a.new_id().connect(p.a.qp()[0], ConnParams(SID, p.b.gid, qp_type=XRC_SEND))
    with pytest.raises(InvalidArgument, match="qp_type"):
        p.a.new_id().connect(p.a.qp(int(e.IBV_QPT_UC))[0],
                             ConnParams(SID, p.b.gid, qp_type=int(e.IBV_QPT_RC)))


def test_a_released_qp_outlives_its_cm_connection() -> None:
    """A QP the consumer took back from the CM (``qp`` None: librdmacm moves only
    ``id->qp``, libfabric clears it) stays in RTS through the DREQ/DREP."""
    p = Pair()
    cid, ini, _, tgt, _, _ = _connect(p)
    srv = server_id(p)
    def release(c: IbCmId) -> Callable[[float], None]:
        return lambda _now: setattr(c, "qp", None)

    for c in (cid, srv):
        c.agent.api(release(c), None)
    srv.disconnect()
    p.run(1)
    assert cid.state == srv.state == CmState.TIMEWAIT
    assert ini.qp_state == tgt.qp_state == RTS
