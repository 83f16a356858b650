"""Application-moved QPs through rdma_cm (librdmacm ``conn_param.qp_num``,
``rdma_init_qp_attr``, ``rdma_establish``; rping ``-q``): the CM announces the QP's
number, never touches it, and gives attributes that follow Linux's Starting PSN
convention (each side receives at the PSN it announces)."""

from __future__ import annotations

import errno
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness.rdma_cm import ACC, Ep, expect, next_non_timewait, setup_env

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.cm import rdma_cm as rc
from softrdma.cm.rdma_cm import EventChannel
from softrdma.errors import InvalidArgument, StateError

T = rc.RdmaCmEventType
INIT_MASK = int(e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT | e.IBV_QP_ACCESS_FLAGS)


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    yield from setup_env(tmp_path, monkeypatch)


class Own:
    """A QP created with ibv_create_qp on the id's device, in INIT with no access."""

    def __init__(self, cid: rc.CmId) -> None:
        self.pd = v.PD(cid.verbs)
        self.cq = v.CQ(cid.verbs, 16)
        self.qp = v.QP(self.pd, v.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq,
                                             cap=v.QPCap(8, 8, 1, 1)))
        self.qp.modify(v.QPAttr(qp_state=e.IBV_QPS_INIT, pkey_index=0, port_num=1,
                                qp_access_flags=0), INIT_MASK)
        self.mr = v.MR(self.pd, 4096, ACC)

    def move(self, cid: rc.CmId) -> dict[int, Any]:
        got = {}
        for st in (e.IBV_QPS_INIT, e.IBV_QPS_RTR, e.IBV_QPS_RTS):
            attr, mask = cid.init_qp_attr(int(st))
            self.qp.modify(attr, mask)
            got[int(st)] = attr
        return got

    def wait(self, timeout: float = 10.0) -> Any:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            _n, wcs = self.cq.poll(1)
            if wcs:
                return wcs[0]
            time.sleep(0.0005)
        raise AssertionError("no completion")

    def close(self) -> None:
        for obj in (self.qp, self.mr, self.cq, self.pd):
            obj.close()


class Pair:
    """Two ids connecting application-moved QPs, to the client's CONNECT_RESPONSE: the
    server's QP moved before its REP (as rping -q's rping_accept), the client's not yet."""

    def __init__(self) -> None:
        self.chs, self.chc = EventChannel(), EventChannel()
        self.lst = rc.CmId(self.chs, rc.RDMA_PS_TCP)
        self.lst.bind_addr(("127.0.0.1", 0), device="roce")
        self.lst.listen(2)
        assert self.lst.local_addr is not None
        self.cli = rc.CmId(self.chc, rc.RDMA_PS_TCP)
        self.cli.resolve_addr(None, ("127.0.0.1", self.lst.local_addr[1]), 2000, device="roce")
        expect(self.chc, T.ADDR_RESOLVED)
        self.cli.resolve_route(2000)
        expect(self.chc, T.ROUTE_RESOLVED)
        self.co = Own(self.cli)
        self.cli.connect(rc.ConnParam(qp_num=self.co.qp.qp_num))
        self.req = expect(self.chs, T.CONNECT_REQUEST)
        self.child = self.req.id
        self.so = Own(self.child)
        self.srv = self.so.move(self.child)
        self.so.qp.post_recv(v.RecvWR(1, 1, [v.SGE(self.so.mr.addr, 64, self.so.mr.lkey)]))
        self.child.accept(rc.ConnParam(qp_num=self.so.qp.qp_num))
        self.resp = expect(self.chc, T.CONNECT_RESPONSE)  # not ESTABLISHED: the app's QP

    def send_and_close(self) -> None:
        """One SEND client to server, checked; then disconnect and free everything."""
        co, so = self.co, self.so
        co.mr.write(b"self-moved", 10, 0)
        co.qp.post_send(v.SendWR(5, None, 1, [v.SGE(co.mr.addr, 10, co.mr.lkey)]))
        assert co.wait().status == 0
        wc = so.wait()
        assert wc.status == 0 and so.mr.read(10, 0) == b"self-moved"
        co.qp.modify(v.QPAttr(qp_state=e.IBV_QPS_ERR), int(e.IBV_QP_STATE))
        self.cli.disconnect()
        assert next_non_timewait(self.chc).event == T.DISCONNECTED
        assert next_non_timewait(self.chs).event == T.DISCONNECTED
        for cid in (self.cli, self.child, self.lst):
            cid.destroy()
        co.close()
        so.close()
        self.chs.close()
        self.chc.close()


@pytest.mark.iba("12.6.5", "12.6.8")
def test_self_moved_qps_connect_and_follow_the_psn_convention(env: Path) -> None:
    p = Pair()
    req_msg, rep_msg, srv = p.req.info["req"], p.resp.info["rep"], p.srv
    assert req_msg.local_qpn == p.co.qp.qp_num
    assert srv[int(e.IBV_QPS_RTR)].dest_qp_num == p.co.qp.qp_num
    assert srv[int(e.IBV_QPS_RTS)].sq_psn == req_msg.starting_psn
    assert rep_msg.local_qpn == p.so.qp.qp_num
    assert srv[int(e.IBV_QPS_RTR)].rq_psn == rep_msg.starting_psn  # announced = received
    assert p.co.qp.qp_state == e.IBV_QPS_INIT  # the CM left the client's QP alone
    cli_attrs = p.co.move(p.cli)
    assert cli_attrs[int(e.IBV_QPS_RTR)].rq_psn == req_msg.starting_psn
    assert cli_attrs[int(e.IBV_QPS_RTS)].sq_psn == rep_msg.starting_psn
    assert cli_attrs[int(e.IBV_QPS_RTR)].dest_qp_num == p.so.qp.qp_num
    p.cli.establish()
    expect(p.chs, T.ESTABLISHED)
    with pytest.raises(TimeoutError):  # rdma_establish reports nothing on the active side
        p.chc.get_cm_event(0.3)
    p.send_and_close()


@pytest.mark.iba("12.9.7.3")
def test_notify_comm_est_establishes_before_the_rtu(env: Path) -> None:
    """``rdma_notify(IBV_EVENT_COMM_EST)`` on the passive side before any RTU (the client
    has not called rdma_establish): ESTABLISHED follows; a second one is EISCONN, another
    event EINVAL (Linux ``ib_cm_notify``/``cm_establish``); the RTU that comes later
    changes nothing."""
    p = Pair()
    with pytest.raises(InvalidArgument, match="event"):
        p.child.notify(int(e.IBV_EVENT_QP_FATAL))
    with pytest.raises(TimeoutError):  # no RTU yet: the server is not established
        p.chs.get_cm_event(0.3)
    p.child.notify(int(e.IBV_EVENT_COMM_EST))
    expect(p.chs, T.ESTABLISHED)
    with pytest.raises(StateError) as again:
        p.child.notify(int(e.IBV_EVENT_COMM_EST))
    assert again.value.errno == errno.EISCONN
    p.co.move(p.cli)
    p.cli.establish()  # the RTU: ignored by an established server
    with pytest.raises(TimeoutError):
        p.chs.get_cm_event(0.3)
    p.send_and_close()


def test_notify_misuse(env: Path) -> None:
    """``rdma_notify`` on an id with no connection is EINVAL (a request's id before its REP
    too: tests/capi/cm_srq.c)."""
    ch = EventChannel()
    cli = rc.CmId(ch, rc.RDMA_PS_TCP)
    with pytest.raises(StateError) as none:
        cli.notify(int(e.IBV_EVENT_COMM_EST))
    assert none.value.errno == errno.EINVAL
    cli.destroy()
    ch.close()


def test_init_qp_attr_and_establish_misuse(env: Path) -> None:
    ch = EventChannel()
    cli = rc.CmId(ch, rc.RDMA_PS_TCP)
    with pytest.raises(StateError):
        cli.init_qp_attr(int(e.IBV_QPS_RTR))  # nothing to base it on yet
    with pytest.raises(StateError):
        cli.establish()
    cli.resolve_addr(None, ("127.0.0.1", 9), 2000, device="roce")
    expect(ch, T.ADDR_RESOLVED)
    with pytest.raises(StateError, match="ConnParam.qp_num"):
        cli.connect(rc.ConnParam())  # neither create_qp nor qp_num
    with pytest.raises(InvalidArgument):
        cli.connect(rc.ConnParam(qp_num=0x1000000))
    cli.destroy()
    ch.close()


def test_migrate_moves_pending_and_later_events(env: Path) -> None:
    """``rdma_migrate_id`` (ucmatose -m): events not yet taken and every later one go to
    the new channel."""
    old, new = EventChannel(), EventChannel()
    cid = rc.CmId(old, rc.RDMA_PS_TCP)
    cid.resolve_addr(None, ("127.0.0.1", 9), 2000, device="roce")
    assert old.poll(5)
    cid.migrate(new)
    assert old.pending() == 0
    expect(new, T.ADDR_RESOLVED)
    cid.resolve_route(2000)
    expect(new, T.ROUTE_RESOLVED)
    assert old.pending() == 0
    with pytest.raises(InvalidArgument):
        cid.migrate("not a channel")  # type: ignore[arg-type]
    cid.destroy()
    old.close()
    new.close()


@pytest.mark.iba("9.7.6.1.3")
def test_set_option_tos_and_ack_timeout(env: Path) -> None:
    """``rdma_set_option``: TOS becomes the REQ's traffic class (and so the passive QP's
    path), ACK_TIMEOUT the active QP's local ACK timeout (ucmatose -t / -a)."""
    chs, chc = EventChannel(), EventChannel()
    lst = rc.CmId(chs, rc.RDMA_PS_TCP)
    lst.bind_addr(("127.0.0.1", 0), device="roce")
    lst.listen(2)
    assert lst.local_addr is not None
    cli = rc.CmId(chc, rc.RDMA_PS_TCP)
    cli.resolve_addr(None, ("127.0.0.1", lst.local_addr[1]), 2000, device="roce")
    expect(chc, T.ADDR_RESOLVED)
    cli.set_option(rc.RDMA_OPTION_ID, rc.RDMA_OPTION_ID_TOS, 0x28)
    cli.set_option(rc.RDMA_OPTION_ID, rc.RDMA_OPTION_ID_ACK_TIMEOUT, 16)
    for bad in ((1, rc.RDMA_OPTION_ID_TOS, 0), (rc.RDMA_OPTION_ID, 2, 1),
                (rc.RDMA_OPTION_ID, rc.RDMA_OPTION_ID_TOS, 256),
                (rc.RDMA_OPTION_ID, rc.RDMA_OPTION_ID_ACK_TIMEOUT, 32)):
        with pytest.raises(InvalidArgument):
            cli.set_option(*bad)
    cli.resolve_route(2000)
    expect(chc, T.ROUTE_RESOLVED)
    ce = Ep(cli)
    cli.connect(rc.ConnParam())
    req = expect(chs, T.CONNECT_REQUEST)
    assert req.info["req"].primary_traffic_class == 0x28
    se = Ep(req.id)
    req.id.accept(rc.ConnParam())
    expect(chc, T.ESTABLISHED)
    expect(chs, T.ESTABLISHED)
    attr, _ = ce.qp.query(int(e.IBV_QP_TIMEOUT))
    assert attr.timeout == 16
    sattr, _ = se.qp.query(int(e.IBV_QP_TIMEOUT))
    assert sattr.timeout == req.info["req"].primary_local_ack_timeout  # not set there
    cli.disconnect()
    assert next_non_timewait(chc).event == T.DISCONNECTED
    for cid in (cli, req.id, lst):
        cid.destroy_qp()
        cid.destroy()
    chs.close()
    chc.close()
