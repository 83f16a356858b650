"""The IB CM state machine (IBA ch. 12) on the in-memory fabric: establishment, REQ/REP
parameters, MRA, retries, duplicates, stale connections, TimeWait, DREQ/DREP teardown,
and the RoCE rules of Annex A16.5.2 (CA16-10..13)."""

from __future__ import annotations

from typing import Any

import pytest
from harness import cm as cm_harness
from harness.cm import UD, Pair, T, is_attr
from harness.cm_ibcm import (
    RTS,
    SID,
    check_lap_lids_ignored,
    check_req_lids_are_not_validated,
    check_roce_forbidden_codes_are_never_sent,
    connect,
    server_id,
)

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.errors import InvalidArgument, StateError
from softrdma.ibcm import qpctl
from softrdma.ibcm.agent import CmConfig, ConnParams, IbCmId
from softrdma.ibcm.events import CmEvent
from softrdma.ibcm.model import (
    AcceptConn,
    CmInput,
    CmState,
    CommEst,
    Connect,
    Disconnect,
    Establish,
    Listen,
    Received,
    Reject,
    SendDrep,
    SendMra,
    SidrResolve,
    Timeout,
)
from softrdma.ibcm.params import ALL_ONES_MASK
from softrdma.ibcm.state import TRANSITIONS, input_kind, transition
from softrdma.wire import cm as wcm
from softrdma.wire.cm import CmAttr, RejReason, time_code_s

ERR = int(e.IBV_QPS_ERR)


@pytest.fixture(autouse=True, params=["2", "1"], ids=["rocev2", "rocev1"])
def roce_ver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every CM test runs over RoCEv2 and over RoCEv1 (Annex A16.5.2: the CM on RoCE
    ports; CA16-10..13 proven on a RoCEv1 port as well)."""
    monkeypatch.setattr(cm_harness, "ROCE_VER", request.param)
    return str(request.param)


# ---------------------------------------------------------------------------- basics
@pytest.mark.iba("12.9")
def test_table_is_consistent() -> None:
    messages = set(wcm.MESSAGE_TYPES.values())
    for (state, kind), row in TRANSITIONS.items():
        assert callable(row.action), row
        assert isinstance(state, CmState) and isinstance(row.next_state, CmState)
        assert kind in messages or (isinstance(kind, type) and issubclass(kind, CmInput)), kind
        # the action is a plain module function, not a method looked up by name
        assert row.action.__module__.startswith("softrdma.ibcm."), row.action
    # every state is reachable from the table: a row's next state, or the state of the
    # new id a listener's row spawns (REQ_RCVD, SIDR_REQ_RCVD); IDLE is where ids start
    targets = {row.next_state for row in TRANSITIONS.values()} | {
        row.spawns for row in TRANSITIONS.values() if row.spawns is not None} | {CmState.IDLE}
    assert targets == set(CmState)


@pytest.mark.iba("12.9", "12.11.2")
def test_passive_open_is_rows_of_the_table() -> None:
    """Issue 23: listening, a REQ and a SIDR_REQ to a listener are rows of the table
    (IBA Figure 150, 12.11.2): the listener stays in LISTEN and spawns the new id."""
    req = wcm.Req(local_comm_id=1, service_id=SID)
    sreq = wcm.SidrReq(request_id=1, service_id=SID)
    listen = Listen(SID, ALL_ONES_MASK, 8)
    row = transition(CmState.IDLE, listen)
    assert row is not None and row.next_state == CmState.LISTEN and row.spawns is None
    for msg, child in ((req, CmState.REQ_RCVD), (sreq, CmState.SIDR_REQ_RCVD)):
        taken = transition(CmState.LISTEN, Received(msg, 1, bytes(16), bytes(16)))
        assert taken is not None, msg
        assert taken.next_state == CmState.LISTEN and taken.spawns == child
    # a SIDR_REQ reaches only a listener; a REQ also a spawned id (its duplicates)
    assert {st for st, k in TRANSITIONS if k is wcm.SidrReq} == {CmState.LISTEN}
    assert {st for st, k in TRANSITIONS if k is wcm.Req} == {
        CmState.LISTEN, CmState.REQ_RCVD, CmState.MRA_REQ_SENT, CmState.REP_SENT,
        CmState.TIMEWAIT}
    assert transition(CmState.LISTEN, listen) is None  # a second listen: StateError
    # through the agent: the rows run, the listener stays, the new ids are spawned
    p = Pair()
    lst = p.b.new_id()
    lst.listen(SID)
    assert lst.state == CmState.LISTEN
    with pytest.raises(StateError, match="listen is not allowed in CM state LISTEN"):
        lst.listen(SID + 1)
    qa, _ = p.a.qp()
    cid = p.a.new_id()
    cid.connect(qa, ConnParams(SID, p.b.gid))
    p.run(1)
    srv = server_id(p)
    assert srv is not lst and srv.listen_id is lst
    assert srv.state == CmState.REQ_RCVD and lst.state == CmState.LISTEN


def test_table_keys_follow_the_input() -> None:
    rep = wcm.Rep(local_comm_id=1, remote_comm_id=2)
    assert input_kind(Received(rep, 1, bytes(16), bytes(16))) is wcm.Rep
    assert input_kind(Disconnect()) is Disconnect
    row = transition(CmState.REQ_SENT, Received(rep, 1, bytes(16), bytes(16)))
    assert row is not None and row.next_state == CmState.REP_RCVD
    assert transition(CmState.IDLE, Received(rep, 1, bytes(16), bytes(16))) is None


def test_api_outside_the_table_raises() -> None:
    p = Pair()
    cid = p.a.new_id()
    with pytest.raises(StateError, match="accept is not allowed in CM state IDLE"):
        cid.accept(None)
    with pytest.raises(StateError):
        cid.establish()
    assert all(k.api for k in (Connect, AcceptConn, Reject, Establish, SendMra, Disconnect,
                               SendDrep, SidrResolve))
    assert not any(k.api for k in (Received, Timeout, CommEst))


@pytest.mark.iba("12.6.5", "12.6.8", "12.6.9", "12.6.10", "12.6.11")
def test_establish_data_and_teardown() -> None:
    p = Pair()
    cid, qa, qb, _ = connect(p, private_data=b"hello server")
    p.run(1)
    assert p.a.types(cid) == [T.ESTABLISHED]
    srv = server_id(p)
    assert p.b.types(srv) == [T.CONNECT_REQUEST, T.ESTABLISHED]
    assert p.b.of(T.CONNECT_REQUEST)[0].private_data[:12] == b"hello server"
    assert cid.state == srv.state == CmState.ESTABLISHED
    assert qa.qp_state == qb.qp_state == RTS
    ea, eb = qa.engine, qb.engine
    assert (ea.dest_qpn, eb.dest_qpn) == (qb.qp_num, qa.qp_num)
    # Linux's convention: each side's Starting PSN is the PSN it receives at, so the
    # passive side sends from the REQ's and the active side from the REP's
    assert cid.req is not None and srv.rep is not None
    assert eb.req.next_psn == ea.resp.epsn == cid.local_psn == cid.req.starting_psn
    assert ea.req.next_psn == eb.resp.epsn == srv.local_psn == srv.rep.starting_psn
    # a SEND over the connection
    rx = v.MR(p.b.pd, 64, int(e.IBV_ACCESS_LOCAL_WRITE))
    qb.post_recv(v.RecvWR(1, 1, [v.SGE(rx.addr, 64, rx.lkey)]))
    tx = v.MR(p.a.pd, 64, 0)
    tx.write(b"over the CM", 11)
    qa.post_send(v.SendWR(2, None, 1, [v.SGE(tx.addr, 11, tx.lkey)]))
    p.run(0.01)
    assert rx.read(11, 0) == b"over the CM"
    # teardown: DREQ/DREP, QPs to ERR, TimeWait, then IDLE everywhere
    qa.post_recv(v.RecvWR(7, 1, [v.SGE(tx.addr, 64, tx.lkey)]))
    cid.disconnect(b"bye")
    p.run(0.01)
    assert qa.qp_state == qb.qp_state == ERR
    assert cid.state == srv.state == CmState.TIMEWAIT
    assert p.b.of(T.DISCONNECTED)[0].private_data[:3] == b"bye"
    p.run(10)
    assert cid.state == srv.state == CmState.IDLE
    assert p.a.types(cid) == [T.ESTABLISHED, T.DISCONNECTED, T.TIMEWAIT_EXIT]
    assert p.b.types(srv)[-2:] == [T.DISCONNECTED, T.TIMEWAIT_EXIT]
    assert p.a.agent.live_ids() == 0 and p.b.agent.live_ids() == 1  # the listener
    assert [type(m) for m in (p.sent(CmAttr.DREQ) + p.sent(CmAttr.DREP))] == [wcm.Dreq, wcm.Drep]


@pytest.mark.iba("12.9.8", "10.3.1.7")
def test_disconnect_flushes_posted_receives() -> None:
    """IBA 12.9.8: DREQ received -> the QP goes to ERR and posted WQEs are flushed."""
    p = Pair()
    qb, _ = p.b.qp()
    p.listen_accepting(SID, qb)
    qa, cqa = p.a.qp()
    cid = p.a.new_id()
    cid.connect(qa, ConnParams(SID, p.b.gid))
    p.run(1)
    mr = v.MR(p.a.pd, 64, int(e.IBV_ACCESS_LOCAL_WRITE))
    for wr_id in (11, 12):
        qa.post_recv(v.RecvWR(wr_id, 1, [v.SGE(mr.addr, 64, mr.lkey)]))
    server_id(p).disconnect()
    p.run(0.01)
    assert qa.qp_state == ERR and p.a.types(cid)[-1] == T.DISCONNECTED
    n, wcs = cqa.poll(8)
    assert n == 2 and [w.wr_id for w in wcs] == [11, 12]
    assert all(w.status == e.IBV_WC_WR_FLUSH_ERR for w in wcs)


@pytest.mark.iba("12.6.5")
def test_req_fields_as_linux_puts_them() -> None:
    p = Pair()
    cid, qa, qb, _ = connect(p, responder_resources=4, initiator_depth=2, retry_count=6,
                             rnr_retry_count=5)
    p.run(1)
    (req,) = p.sent(CmAttr.REQ)
    (rep,) = p.sent(CmAttr.REP)
    (rtu,) = p.sent(CmAttr.RTU)
    assert req.local_qpn == qa.qp_num and rep.local_qpn == qb.qp_num
    assert req.service_id == SID and req.local_ca_guid == p.a.agent.guid
    assert (req.responder_resources, req.initiator_depth) == (4, 2)
    assert (req.retry_count, req.rnr_retry_count) == (6, 5)
    assert req.transport_service_type == 0 and req.pkey == 0xFFFF
    assert req.local_cm_response_timeout == 19  # CA16-9 RespTimeValue default
    assert req.max_cm_retries == 15
    assert req.primary_local_ack_timeout == 19  # SubnetTimeout 18 + 1
    assert req.primary_local_lid == req.primary_remote_lid == 0xFFFF  # routed RoCE v2
    assert req.primary_subnet_local == 0 and req.primary_hop_limit == 64
    assert req.primary_local_gid == p.a.gid and req.primary_remote_gid == p.b.gid
    assert req.path_mtu == p.a.agent.mtu
    # the REP answers within what the REQ offered (the receiver swaps the perspective)
    assert rep.remote_comm_id == req.local_comm_id
    assert (rep.responder_resources, rep.initiator_depth) == (min(1, 2), min(1, 4))
    assert rep.target_ack_delay == 15 and rep.local_ca_guid == p.b.agent.guid
    assert (rtu.local_comm_id, rtu.remote_comm_id) == (req.local_comm_id, rep.local_comm_id)
    ea, eb = qa.engine, qb.engine
    assert (ea.retry_cnt, eb.retry_cnt) == (6, 6)
    assert eb.rnr_retry == 5 and ea.rnr_retry == rep.rnr_retry_count
    assert ea.timeout == eb.timeout == 19
    assert ea.max_rd_atomic == 1 and eb.max_dest_rd_atomic == 1
    # the TIDs: REP and RTU reuse the REQ's (as Linux)
    tids = {m.hdr.tid for m in p.log if m.hdr.attr_id in (CmAttr.REQ, CmAttr.REP, CmAttr.RTU)}
    assert len(tids) == 1


# ---------------------------------------------------------------------------- rejections
@pytest.mark.iba("12.6.7")
def test_no_listener_is_rej_8() -> None:
    p = Pair()
    qa, _ = p.a.qp()
    cid = p.a.new_id()
    cid.connect(qa, ConnParams(0x777, p.b.gid))
    p.run(1)
    (ev,) = p.a.events
    assert ev.type == T.REJECTED and ev.reject is not None
    assert ev.reject.reason == RejReason.INVALID_SERVICE_ID
    assert "invalid Service ID" in ev.reject.text
    (rej,) = p.sent(CmAttr.REJ)
    assert rej.message_rejected == wcm.MsgType.REQ and rej.local_comm_id == 0
    assert cid.state == CmState.IDLE and qa.qp_state == ERR
    assert p.b.agent.counters.no_listener == 1


@pytest.mark.iba("12.6.7")
def test_consumer_reject_with_private_data() -> None:
    p = Pair()
    lst = p.b.new_id()
    lst.listen(SID)
    p.b.on = lambda ev: ev.cm_id.reject(b"go away", ari=b"\x01\x02") \
        if ev.type == T.CONNECT_REQUEST else None
    qa, _ = p.a.qp()
    cid = p.a.new_id()
    cid.connect(qa, ConnParams(SID, p.b.gid))
    p.run(1)
    (ev,) = p.a.events
    assert ev.type == T.REJECTED and ev.reject is not None and ev.reject.consumer_reject
    assert ev.private_data[:7] == b"go away"
    assert ev.reject.ulp_ari == b"\x02"  # Table 3 layer 0x01 = ULP
    assert server_id(p).state == CmState.IDLE and lst.pending == 0


@pytest.mark.iba("12.6.7", "12.8.2")
def test_roce_forbidden_codes_are_never_sent() -> None:
    """CA16-11 (REJ 13, 19) and CA16-13 (APR 7)."""
    check_roce_forbidden_codes_are_never_sent()


@pytest.mark.iba("12.6.5")
def test_req_lids_are_not_validated() -> None:
    """CA16-10: whatever the four LID fields of a REQ hold, the REQ is served."""
    check_req_lids_are_not_validated()


@pytest.mark.iba("12.8.1", "12.8.2")
def test_lap_gets_apr_unsupported_and_lids_ignored() -> None:
    """CA16-12/13: a LAP's LIDs are not examined; the APR never says 'invalid LID'."""
    check_lap_lids_ignored()


# ---------------------------------------------------------------------------- timers, MRA
@pytest.mark.iba("12.6.5")
def test_req_unanswered_gives_unreachable_after_max_retries() -> None:
    p = Pair()
    p.fab.partition("10.9.0.2")
    qa, _ = p.a.qp()
    cid = p.a.new_id()
    cid.connect(qa, ConnParams(SID, p.b.gid))
    cfg = p.a.agent.config
    per_try = 2 * time_code_s(cfg.subnet_timeout) + time_code_s(cfg.remote_cm_response_timeout)
    p.run(per_try * 16 - 0.1)
    assert p.a.events == [] and cid.state == CmState.REQ_SENT
    assert len(p.sent(CmAttr.REQ)) == 0  # partitioned: dropped before the log (sender side)
    assert p.a.agent.counters.retransmits == 15
    p.run(0.2)
    (ev,) = p.a.events
    assert ev.type == T.UNREACHABLE and ev.reject is not None
    assert "no answer to the REQ after 15 retransmissions" in ev.reject.text
    assert cid.state == CmState.IDLE and qa.qp_state == ERR
    assert p.a.agent.timers() == 0 and p.a.agent.live_ids() == 0


@pytest.mark.iba("12.6.6")
def test_slow_consumer_gets_mra_on_duplicate_req() -> None:
    p = Pair()
    lst = p.b.new_id()
    lst.listen(SID)
    qa, _ = p.a.qp()
    qb, _ = p.b.qp()
    cid = p.a.new_id()
    cid.connect(qa, ConnParams(SID, p.b.gid))
    p.run(6)  # past the first REQ timeout (~4.3 s): the duplicate REQ is answered by an MRA
    child = server_id(p)
    assert child.state == CmState.MRA_REQ_SENT
    (mra,) = p.sent(CmAttr.MRA)
    assert mra.message_mraed == wcm.MsgType.REQ and mra.service_timeout == 24
    assert cid.state == CmState.MRA_REQ_RCVD
    n_req = len(p.sent(CmAttr.REQ))
    p.run(30)  # the MRA's 68 s service timeout holds the client back
    assert len(p.sent(CmAttr.REQ)) == n_req
    child.accept(qb)
    p.run(1)
    assert cid.state == child.state == CmState.ESTABLISHED
    assert len(p.b.of(T.CONNECT_REQUEST)) == 1  # the duplicate was not a new request


@pytest.mark.iba("12.6.6")
def test_consumer_mra_extends_the_client_timer() -> None:
    p = Pair(config_a=CmConfig(max_cm_retries=1))
    lst = p.b.new_id()
    lst.listen(SID)
    p.b.on = lambda ev: ev.cm_id.send_mra(22) if ev.type == T.CONNECT_REQUEST else None
    qa, _ = p.a.qp()
    qb, _ = p.b.qp()
    cid = p.a.new_id()
    cid.connect(qa, ConnParams(SID, p.b.gid))
    p.run(12)  # without the MRA the client would have given up after ~8.6 s
    assert cid.state == CmState.MRA_REQ_RCVD and p.a.events == []
    server_id(p).accept(qb)
    p.run(1)
    assert p.a.types(cid) == [T.ESTABLISHED]


@pytest.mark.iba("12.6.8")
def test_lost_rep_is_recovered() -> None:
    p = Pair()
    p.fab.add_rule(is_attr(CmAttr.REP), "drop", count=1)
    cid, qa, qb, _ = connect(p)
    p.run(30)
    srv = server_id(p)
    assert cid.state == srv.state == CmState.ESTABLISHED
    assert len(p.sent(CmAttr.REP)) >= 2 and p.a.types(cid) == [T.ESTABLISHED]
    assert p.b.types(srv) == [T.CONNECT_REQUEST, T.ESTABLISHED]


@pytest.mark.iba("12.6.9")
def test_lost_rtu_is_recovered_from_state() -> None:
    p = Pair()
    p.fab.add_rule(is_attr(CmAttr.RTU), "drop", count=1)
    cid, qa, qb, _ = connect(p)
    p.run(1)
    srv = server_id(p)
    assert cid.state == CmState.ESTABLISHED and srv.state == CmState.REP_SENT
    p.run(10)  # the REP is retransmitted; ESTABLISHED answers the duplicate with the RTU
    assert srv.state == CmState.ESTABLISHED
    assert len(p.sent(CmAttr.RTU)) == 2 and p.a.agent.counters.duplicates == 1


def test_rtu_never_arrives_both_sides_end_down() -> None:
    p = Pair(config_b=CmConfig(max_cm_retries=2))
    p.fab.add_rule(is_attr(CmAttr.RTU), "drop")
    cid, qa, qb, _ = connect(p, )
    p.run(200)
    srv = server_id(p)
    # the server gives up (REJ Timeout), the client, ESTABLISHED, takes the REJ: no half-open
    assert p.b.types(srv)[-2:] == [T.UNREACHABLE, T.TIMEWAIT_EXIT]
    assert p.a.types(cid)[:2] == [T.ESTABLISHED, T.REJECTED]
    assert qa.qp_state == qb.qp_state == ERR
    assert cid.state == srv.state == CmState.IDLE
    (rej,) = p.sent(CmAttr.REJ)
    assert rej.reason == RejReason.TIMEOUT and rej.ari_data == p.b.agent.guid.to_bytes(8, "big")


@pytest.mark.iba("12.9.7.3")
def test_comm_est_before_rtu() -> None:
    p = Pair()
    p.fab.add_rule(is_attr(CmAttr.RTU), "drop", count=1)
    cid, qa, qb, _ = connect(p)
    p.run(1)
    srv = server_id(p)
    assert srv.state == CmState.REP_SENT
    srv.notify_comm_est()  # IBA 12.9.7.3: data on the QP stands for the RTU
    assert srv.state == CmState.ESTABLISHED and p.b.types(srv)[-1] == T.ESTABLISHED


@pytest.mark.iba("12.6.9")
def test_connect_response_and_explicit_rtu() -> None:
    p = Pair()
    cid, qa, qb, _ = connect(p, auto_rtu=False)
    p.run(1)
    assert p.a.types(cid) == [T.CONNECT_RESPONSE] and cid.state == CmState.REP_RCVD
    cid.establish(b"rtu data")
    p.run(1)
    srv = server_id(p)
    assert cid.state == srv.state == CmState.ESTABLISHED
    assert p.b.of(T.ESTABLISHED)[0].private_data[:8] == b"rtu data"
    assert qa.qp_state == RTS


@pytest.mark.iba("12.6.6")
def test_duplicate_rep_while_consumer_decides_gets_mra() -> None:
    p = Pair()
    cid, qa, qb, _ = connect(p, auto_rtu=False)
    p.run(6)  # the server retransmits its REP: the client answers with an MRA
    assert cid.state == CmState.MRA_REP_SENT
    (mra,) = p.sent(CmAttr.MRA)[:1]
    assert mra.message_mraed == wcm.MsgType.REP
    assert server_id(p).state == CmState.MRA_REP_RCVD
    cid.establish()
    p.run(1)
    assert server_id(p).state == CmState.ESTABLISHED


# ---------------------------------------------------------------------------- release
@pytest.mark.iba("12.6.11", "12.9.8.3")
def test_lost_drep_answered_from_timewait() -> None:
    p = Pair()
    p.fab.add_rule(is_attr(CmAttr.DREP), "drop", count=1)
    cid, qa, qb, _ = connect(p)
    p.run(1)
    cid.disconnect()
    p.run(1)
    srv = server_id(p)
    assert srv.state == CmState.TIMEWAIT and cid.state == CmState.DREQ_SENT
    p.run(5)  # DREQ retransmitted; the server, in TIMEWAIT, sends the DREP again
    assert len(p.sent(CmAttr.DREQ)) == 2 and len(p.sent(CmAttr.DREP)) == 2
    assert cid.state in (CmState.TIMEWAIT, CmState.IDLE)
    assert p.a.types(cid)[1] == T.DISCONNECTED


@pytest.mark.iba("12.6.10", "12.9.7")
def test_dreq_timeout_still_disconnects() -> None:
    p = Pair(config_a=CmConfig(max_cm_retries=2))
    cid, qa, qb, _ = connect(p)
    p.run(1)
    p.fab.partition("10.9.0.2")
    cid.disconnect()
    assert qa.qp_state == ERR  # flushed at once (IBA 12.9.8.1)
    p.run(15)
    assert p.a.types(cid) == [T.ESTABLISHED, T.DISCONNECTED]
    ev = p.a.of(T.DISCONNECTED)[0]
    assert ev.info.get("timeout") is True and cid.state == CmState.TIMEWAIT


@pytest.mark.iba("12.6.10", "12.6.11")
def test_simultaneous_disconnect() -> None:
    p = Pair()
    cid, qa, qb, _ = connect(p)
    p.run(1)
    srv = server_id(p)
    cid.disconnect()
    srv.disconnect()
    p.run(10)
    assert cid.state == srv.state == CmState.IDLE
    assert p.a.types(cid).count(T.DISCONNECTED) == 1
    assert p.b.types(srv).count(T.DISCONNECTED) == 1


@pytest.mark.iba("12.9.8.3")
def test_timewait_blocks_qpn_reuse_then_frees_it() -> None:
    p = Pair()
    cid, qa, qb, _ = connect(p)
    p.run(1)
    cid.disconnect()
    p.run(0.01)
    assert cid.state == CmState.TIMEWAIT
    assert p.a.agent.ids[cid.local_id] is cid  # the comm ID stays reserved
    qa.engine.modify({"qp_state": qpctl.RESET}, 0.0)
    again = p.a.new_id()
    with pytest.raises(StateError, match="TimeWait"):
        again.connect(qa, ConnParams(SID, p.b.gid))
    tw = p.a.agent.timewait_s(cid)
    assert tw == pytest.approx(time_code_s(19))
    p.run(tw + 0.1)
    assert p.a.types(cid)[-1] == T.TIMEWAIT_EXIT and cid.local_id not in p.a.agent.ids
    # the server's id has left TimeWait too: the same QP may connect again
    p.b.on = None
    qb2, _ = p.b.qp()
    p.listen_accepting(SID + 1, qb2)
    again.connect(qa, ConnParams(SID + 1, p.b.gid))
    p.run(1)
    assert p.a.types(again) == [T.ESTABLISHED]


@pytest.mark.iba("12.9.8.3")
def test_an_id_in_timewait_keeps_no_qp_and_once_destroyed_no_consumer() -> None:
    """TimeWait needs only the comm IDs, the QPN and the timer: an id entering it lets
    go of its QP (in ERR already), and a destroyed one of its consumer's handler and
    context too, so a closed connection's objects are freed when the consumer drops
    them, not when TimeWait runs out; TimeWait itself is unchanged (the DREP is sent
    again, the QPN stays reserved, the comm ID is freed at the end)."""
    p = Pair()
    cid, qa, qb, _ = connect(p)
    p.run(1)
    srv = server_id(p)
    assert (cid.qp, srv.qp) == (qa, qb)
    cid.disconnect()
    p.run(0.01)
    assert cid.state == srv.state == CmState.TIMEWAIT
    assert qa.qp_state == qb.qp_state == ERR
    assert cid.qp is None and srv.qp is None
    assert cid.handler is not None  # not destroyed: its consumer is kept
    assert cid.local_qpn == qa.qp_num and p.a.agent.ids[cid.local_id] is cid
    cid.destroy()
    assert cid.handler is None and cid.context is None and cid.state == CmState.TIMEWAIT
    p.run(p.a.agent.timewait_s(cid) + 0.1)
    assert cid.state == CmState.IDLE and cid.local_id not in p.a.agent.ids
    assert T.TIMEWAIT_EXIT not in p.a.types(cid)  # destroyed: no more events


@pytest.mark.iba("12.9.8.3.2")
def test_stale_req_from_a_qpn_in_timewait() -> None:
    p = Pair(config_b=CmConfig(timewait_s=100.0))
    cid, qa, qb, _ = connect(p)
    p.run(1)
    cid.disconnect()
    p.run(1)
    srv = server_id(p)
    assert srv.state == CmState.TIMEWAIT
    # a REQ from the same remote QPN with another comm ID: stale (IBA 12.9.8.3.2)
    req = wcm.Req(local_comm_id=0x5555, service_id=SID, local_ca_guid=p.a.agent.guid,
                  local_qpn=qa.qp_num, path_mtu=3, primary_local_gid=p.a.gid,
                  primary_remote_gid=p.b.gid)
    mad = wcm.encode(req, tid=77)
    p.b.ctx.runtime.call_now(lambda now: p.b.agent.on_mad(mad, p.a.gid, 1, now,
                                                          dst_gid=p.b.gid))
    p.run(0.001)
    rej = p.sent(CmAttr.REJ)[-1]
    assert rej.reason == RejReason.STALE_CONN and rej.remote_comm_id == 0x5555
    assert p.b.agent.counters.stale == 1


@pytest.mark.iba("12.9.8.3.2")
def test_stale_req_tears_down_the_old_established_connection() -> None:
    p = Pair()
    cid, qa, qb, _ = connect(p)
    p.run(1)
    srv = server_id(p)
    req = wcm.Req(local_comm_id=0x6666, service_id=SID, local_ca_guid=0x77,
                  local_qpn=qa.qp_num, path_mtu=3)
    mad = wcm.encode(req, tid=78)
    p.b.ctx.runtime.call_now(lambda now: p.b.agent.on_mad(mad, p.a.gid, 1, now,
                                                          dst_gid=p.b.gid))
    p.run(0.01)
    assert p.sent(CmAttr.REJ)[-1].reason == RejReason.STALE_CONN
    assert p.sent(CmAttr.DREQ)[-1].local_comm_id == srv.local_id
    assert cid.state == CmState.TIMEWAIT and p.a.types(cid)[-1] == T.DISCONNECTED


def test_duplicate_req_during_rep_sent_resends_rep() -> None:
    p = Pair()
    cid, qa, qb, _ = connect(p)
    p.run(1)
    srv = server_id(p)
    (req,) = p.sent(CmAttr.REQ)
    mad = wcm.encode(req, tid=1)
    p.b.ctx.runtime.call_now(lambda now: p.b.agent.on_mad(mad, p.a.gid, 1, now,
                                                          dst_gid=p.b.gid))
    p.run(0.01)
    assert srv.state == CmState.ESTABLISHED and len(p.b.of(T.CONNECT_REQUEST)) == 1
    assert p.b.agent.counters.duplicates == 1


@pytest.mark.iba("12.6.11")
def test_unknown_dreq_gets_a_drep() -> None:
    p = Pair()
    dreq = wcm.Dreq(local_comm_id=0x10, remote_comm_id=0x20, remote_qpn_eecn=5)
    mad = wcm.encode(dreq, tid=3)
    p.b.ctx.runtime.call_now(lambda now: p.b.agent.on_mad(mad, p.a.gid, 1, now,
                                                          dst_gid=p.b.gid))
    p.run(0.01)
    (drep,) = p.sent(CmAttr.DREP)
    assert (drep.local_comm_id, drep.remote_comm_id) == (0x20, 0x10)


@pytest.mark.iba("12.6.11")
def test_spoofed_dreq_flood_gets_bounded_dreps() -> None:
    """Issue 21 item 10: DREQs naming no connection are answered (linux cm_issue_drep),
    but at most REJ_BURST per source and then REJ_PER_SECOND, as devd's REJ: 300
    spoofed DREQs in 2 s draw 8 + 2 * 8 DREPs, not one each. Another source keeps its
    own budget."""
    from softrdma.drivers.devd.cm_reject import REJ_BURST, REJ_PER_SECOND

    p = Pair()
    agent = p.b.agent
    forged = bytes(10) + b"\xff\xff" + bytes((10, 9, 0, 77))
    t0 = p.clock.now()
    for i in range(300):
        dreq = wcm.Dreq(local_comm_id=0x100 + i, remote_comm_id=0x200 + i, remote_qpn_eecn=5)
        mad = wcm.encode(dreq, tid=i)
        p.b.ctx.runtime.call_now(lambda now, m=mad: agent.on_mad(m, forged, 1, now,
                                                                 dst_gid=p.b.gid))
        p.run(2.0 / 300)
    took = p.clock.now() - t0
    n = agent.counters.mads_out
    assert REJ_BURST <= n <= REJ_BURST + int(took * REJ_PER_SECOND) + 1
    assert agent.counters.drep_limited == 300 - n
    before = agent.counters.mads_out
    one = wcm.encode(wcm.Dreq(local_comm_id=0x10, remote_comm_id=0x20, remote_qpn_eecn=5),
                     tid=3)
    p.b.ctx.runtime.call_now(lambda now: agent.on_mad(one, p.a.gid, 1, now,
                                                      dst_gid=p.b.gid))
    assert agent.counters.mads_out == before + 1


def test_bad_mads_are_counted_not_raised() -> None:
    p = Pair()
    agent = p.b.agent
    for junk in (b"", b"\x01" * 256, wcm.encode(wcm.Rtu(remote_comm_id=99), tid=1)):
        p.b.ctx.runtime.call_now(lambda now, j=junk: agent.on_mad(j, p.a.gid, 1, now))
    assert agent.counters.bad_mads == 2 and agent.counters.unknown_id == 1


@pytest.mark.iba("12.6.7")
def test_destroy_in_req_sent_rejects_and_stays_quiet() -> None:
    p = Pair()
    lst = p.b.new_id()
    lst.listen(SID)
    qa, _ = p.a.qp()
    cid = p.a.new_id()
    cid.connect(qa, ConnParams(SID, p.b.gid))
    cid.destroy()
    p.run(1)
    rej = p.sent(CmAttr.REJ)[-1]
    assert rej.reason == RejReason.TIMEOUT
    assert server_id(p).state == CmState.IDLE and p.b.types()[-1] == T.REJECTED
    assert p.a.events == [] and p.a.agent.live_ids() == 0


def test_ud_qp_cannot_connect_and_rc_cannot_sidr_accept() -> None:
    p = Pair()
    qu, _ = p.a.qp(UD)
    with pytest.raises(InvalidArgument, match="sidr_resolve"):
        p.a.new_id().connect(qu, ConnParams(SID, p.b.gid))
    with pytest.raises(InvalidArgument, match="92 bytes"):
        qa, _ = p.a.qp()
        p.a.new_id().connect(qa, ConnParams(SID, p.b.gid, private_data=bytes(93)))


@pytest.mark.iba("12.6.7")
def test_backlog_full_rejects_with_no_resources() -> None:
    """Beyond the backlog a REQ gets REJ No resources (reason 3) at once (issue 13)."""
    p = Pair()
    lst = p.b.new_id()
    lst.listen(SID, backlog=1)
    ids = []
    for _ in range(2):
        qa, _ = p.a.qp()
        cid = p.a.new_id()
        cid.connect(qa, ConnParams(SID, p.b.gid))
        ids.append(cid)
    p.run(0.01)
    assert lst.pending == 1 and p.b.agent.counters.backlog_drops == 1
    rej = [ev for ev in p.a.events if ev.cm_id is ids[1]]
    assert [ev.type for ev in rej] == [T.REJECTED]
    assert rej[0].reject is not None and rej[0].reject.reason == RejReason.NO_RESOURCES
    qb, _ = p.b.qp()
    server_id(p).accept(qb)
    p.run(1)
    assert ids[0].state == CmState.ESTABLISHED and lst.pending == 0
    qa, _ = p.a.qp()  # room again: the next REQ gets through
    again = p.a.new_id()
    again.connect(qa, ConnParams(SID, p.b.gid))
    qb2, _ = p.b.qp()
    p.b.on = lambda ev: ev.cm_id.accept(qb2) if ev.type == T.CONNECT_REQUEST else None
    p.run(1)
    assert again.state == CmState.ESTABLISHED


def test_req_flood_against_accepting_listener_is_bounded_by_its_backlog() -> None:
    """Half-open connections (REP sent, no RTU) count against the backlog: a flood of
    REQs whose senders never send the RTU holds at most ``backlog`` of them; the others
    get REJ No resources at once instead of being held for the REP timeout."""
    p = Pair()
    p.fab.add_rule(is_attr(wcm.CmAttr.RTU), "drop")  # the flooders never complete
    lst = p.b.new_id()
    lst.listen(SID, backlog=4)
    spare = [p.b.qp()[0] for _ in range(20)]  # not made in the callback: the runtime is busy
    server_qps = []

    def on(ev: CmEvent) -> None:
        if ev.type == T.CONNECT_REQUEST:
            qb = spare.pop()
            server_qps.append(qb)
            ev.cm_id.accept(qb)
    p.b.on = on
    flood = []
    for _ in range(20):
        qa, _ = p.a.qp()
        cid = p.a.new_id()
        cid.connect(qa, ConnParams(SID, p.b.gid))
        flood.append(cid)
    p.run(0.05)
    assert len(server_qps) == 4 and lst.pending == 4  # half-open, waiting for RTUs
    rejected = [ev for ev in p.a.events if ev.type == T.REJECTED]
    assert len(rejected) == 16
    assert all(ev.reject is not None and ev.reject.reason == RejReason.NO_RESOURCES
               for ev in rejected)
    assert p.b.agent.counters.backlog_drops == 16


def _forged_reqs(p: Pair, n: int) -> None:
    """``n`` REQs to SID on b from sources that never answer (the REP is lost), asking
    for the longest waits a REQ can name: Local CM Response Timeout and Local ACK
    Timeout 31, Max CM Retries 15 (issue 21 item 2)."""
    for i in range(n):
        src = bytes(10) + b"\xff\xff" + bytes((10, 9, 1, 10 + i))
        req = wcm.Req(local_comm_id=0x5000 + i, service_id=SID, local_ca_guid=0x77 + i,
                      local_qpn=0x100 + i, starting_psn=1, path_mtu=3,
                      local_cm_response_timeout=31, remote_cm_response_timeout=31,
                      primary_local_ack_timeout=31, max_cm_retries=15,
                      primary_local_gid=src, primary_remote_gid=p.b.gid, primary_hop_limit=64)
        mad = wcm.encode(req, tid=0x9000 + i)
        p.b.ctx.runtime.call_now(lambda now, m=mad, s=src: p.b.agent.on_mad(
            m, s, 1, now, dst_gid=p.b.gid))


def _accepting_listener(p: Pair, backlog: int) -> IbCmId:
    lst = p.b.new_id()
    lst.listen(SID, backlog=backlog)
    spare = [p.b.qp()[0] for _ in range(backlog + 4)]

    def on(ev: CmEvent) -> None:
        if ev.type == T.CONNECT_REQUEST:
            ev.cm_id.accept(spare.pop())
    p.b.on = on
    return lst


def test_forged_reqs_cannot_lock_a_listener_out() -> None:
    """Issue 21 item 2: REQs naming the longest waits fill a backlog-3 listener (rping's)
    with half-open connections. Once they have waited a (locally bounded) response
    time, a real client's REQ evicts the oldest of them instead of getting REJ No
    resources, and connects."""
    p = Pair()
    lst = _accepting_listener(p, backlog=3)
    _forged_reqs(p, 3)
    p.run(0.05)
    assert lst.pending == 3
    p.run(30)  # far less than one try of the REQs' own timeouts (2.3 h)
    cid, qa = p.a.new_id(), p.a.qp()[0]
    cid.connect(qa, ConnParams(SID, p.b.gid))
    p.run(1)
    assert cid.state == CmState.ESTABLISHED, p.a.events
    assert p.b.agent.counters.half_open_evicted == 1
    assert p.b.agent.counters.backlog_drops == 0
    gave_up = p.b.of(T.UNREACHABLE)
    assert len(gave_up) == 1 and lst.pending == 2


def test_forged_reqs_half_open_wait_is_bounded_locally() -> None:
    """The RTU wait takes the REQ's timeouts only up to the local bound
    (CmConfig.max_peer_response_timeout 20, PacketLifeTime up to subnet_timeout, 15
    retries): 16 tries of 2 * 1.07 s + 4.3 s, not 16 of 2.3 h. Fresh half-open entries
    are not evicted: a REQ flood is still refused (REJ No resources)."""
    p = Pair()
    lst = _accepting_listener(p, backlog=3)
    _forged_reqs(p, 3)
    p.run(0.05)
    cfg = p.b.agent.config
    one_try = 2 * cfg.packet_life_s + time_code_s(cfg.max_peer_response_timeout)
    cid, qa = p.a.new_id(), p.a.qp()[0]
    cid.connect(qa, ConnParams(SID, p.b.gid))
    p.run(0.05)
    assert cid.state == CmState.IDLE and p.b.agent.counters.backlog_drops == 1
    p.run(16 * one_try + 1)
    assert lst.pending == 0 and len(p.b.of(T.UNREACHABLE)) == 3
    assert p.b.agent.counters.half_open_evicted == 0


def test_client_qp_broken_before_rep_gives_connect_error() -> None:
    p = Pair()
    cid, qa, qb, _ = connect(p)
    qa.engine.modify({"qp_state": ERR}, 0.0)  # the consumer broke its QP meanwhile
    p.run(1)
    (ev,) = p.a.events
    assert ev.type == T.CONNECT_ERROR and ev.reject is not None
    assert "must be in INIT" in ev.reject.text
    assert p.b.types(server_id(p))[-1] == T.REJECTED  # the REP was rejected
    assert cid.state == CmState.TIMEWAIT and p.a.agent.errors == type(p.a.agent.errors)()


def test_failing_handler_does_not_break_the_cm() -> None:
    p = Pair()
    qb, _ = p.b.qp()
    p.listen_accepting(SID, qb)
    inner = p.b.on

    def on(ev: Any) -> None:
        assert inner is not None
        inner(ev)
        raise RuntimeError("consumer bug")
    p.b.on = on
    qa, _ = p.a.qp()
    cid = p.a.new_id()
    cid.connect(qa, ConnParams(SID, p.b.gid))
    p.run(1)
    assert cid.state == server_id(p).state == CmState.ESTABLISHED
    assert p.b.agent.counters.errors == 2  # CONNECT_REQUEST and ESTABLISHED handlers
    assert all(isinstance(x, RuntimeError) for x in p.b.agent.errors)


@pytest.mark.parametrize("how", ["disconnect", "destroy"])
@pytest.mark.iba("12.6.7")
def test_disconnect_or_destroy_before_accept_is_a_consumer_rej(how: str) -> None:
    # linux cm_destroy_id in REQ_RCVD: REJ "consumer defined" (IBA 12.6.7 reason 28). The
    # untyped table once handed this row the disconnect's bytes where the REJ's
    # (private data, reason, ARI) triple was expected, and the call raised ValueError.
    p = Pair()
    lst = p.b.new_id()
    lst.listen(SID)
    qa, _ = p.a.qp()
    cid = p.a.new_id()
    cid.connect(qa, ConnParams(SID, p.b.gid))
    p.run(0.01)
    child = server_id(p)
    assert child.state == CmState.REQ_RCVD
    getattr(child, how)()
    p.run(0.01)
    assert [r.reason for r in p.sent(wcm.CmAttr.REJ)] == [wcm.RejReason.CONSUMER_DEFINED]
    assert p.a.types(cid) == [T.REJECTED] and cid.state == CmState.IDLE
    assert lst.pending == 0 and not p.b.agent.errors


def test_events_are_frozen_and_carry_their_messages_typed() -> None:
    p = Pair()
    cid, qa, qb, _ = connect(p, private_data=b"typed")
    p.run(0.05)
    req_ev = p.b.of(T.CONNECT_REQUEST)[0]
    assert isinstance(req_ev.req, wcm.Req) and req_ev.req.local_comm_id == cid.local_id
    assert req_ev.rep is None and req_ev.rej is None and not req_ev.sidr
    est = p.a.of(T.ESTABLISHED)[0]
    assert isinstance(est.rep, wcm.Rep) and est.rep.local_qpn == qb.qp_num
    with pytest.raises(AttributeError):
        est.private_data = b"changed"  # type: ignore[misc]
