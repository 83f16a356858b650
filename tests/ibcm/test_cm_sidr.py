"""SIDR (IBA 12.11): Service ID -> UD QPN + Q_Key, with the A11 header of the rdma_cm
UDP port space, statuses, retries and duplicate answers."""

from __future__ import annotations

import ipaddress

import pytest
from harness.cm import UD, Pair, T, is_attr

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.ibcm.agent import AcceptParams, CmConfig, SidrParams
from softrdma.ibcm.events import CmEvent
from softrdma.ibcm.ipcm import IpCmClient, ip_listen
from softrdma.ibcm.state import CmState
from softrdma.wire.cm import CmAttr, SidrStatus
from softrdma.wire.ipcm import IPPROTO_UDP, RDMA_UDP_QKEY, IpCmAri, IpCmHeader, ip_cm_service_id

SID = 0x9999


def ud_server(p: Pair, qkey: int | None = None, sid: int = SID) -> tuple[v.QP, v.CQ]:
    qu, cq = p.b.qp(UD)
    lst = p.b.new_id()
    lst.listen(sid)

    def on(ev: CmEvent) -> None:
        if ev.type == T.CONNECT_REQUEST:
            assert ev.info["sidr"] is True
            ev.cm_id.accept(qu, AcceptParams(qkey=qkey, private_data=b"ud here"))
    p.b.on = on
    return qu, cq


@pytest.mark.iba("12.11", "12.11.1", "12.11.2")
def test_sidr_resolves_and_ud_traffic_flows() -> None:
    p = Pair()
    qu, cqb = ud_server(p, qkey=0x1111)
    cid = p.a.new_id()
    cid.sidr_resolve(SidrParams(SID, p.b.gid, private_data=b"who serves?"))
    assert cid.state == CmState.SIDR_REQ_SENT
    p.run(1)
    (ev,) = p.a.events
    assert ev.type == T.ESTABLISHED and ev.ud_qpn == qu.qp_num and ev.ud_qkey == 0x1111
    assert ev.private_data[:7] == b"ud here"
    assert p.b.of(T.CONNECT_REQUEST)[0].private_data[:11] == b"who serves?"
    assert cid.state == CmState.IDLE and p.a.agent.live_ids() == 0
    (req,) = p.sent(CmAttr.SIDR_REQ)
    (rep,) = p.sent(CmAttr.SIDR_REP)
    assert rep.request_id == req.request_id and rep.service_id == SID
    # use the answer: a UD send to the resolved QP (it was moved to RTS with the Q_Key)
    assert qu.qp_state == e.IBV_QPS_RTS
    rx = v.MR(p.b.pd, 128, int(e.IBV_ACCESS_LOCAL_WRITE))
    qu.post_recv(v.RecvWR(1, 1, [v.SGE(rx.addr, 128, rx.lkey)]))
    qa, _ = p.a.qp(UD)
    qa.to_rts(v.QPAttr(qkey=0x1111))
    ah = v.AH(p.a.pd, v.AHAttr(is_global=1, gr=v.GlobalRoute(dgid=v.GID(p.b.gid), sgid_index=0)))
    tx = v.MR(p.a.pd, 16, 0)
    tx.write(b"datagram", 8)
    wr = v.SendWR(1, None, 1, [v.SGE(tx.addr, 8, tx.lkey)])
    wr.set_wr_ud(ah, ev.ud_qpn, ev.ud_qkey)
    qa.post_send(wr)
    p.run(0.01)
    n, wcs = cqb.poll(4)
    assert n == 1 and wcs[0].status == e.IBV_WC_SUCCESS
    assert rx.read(8, 40) == b"datagram"


def test_default_qkey_is_rdma_udp_qkey() -> None:
    p = Pair()
    ud_server(p)
    cid = p.a.new_id()
    cid.sidr_resolve(SidrParams(SID, p.b.gid))
    p.run(1)
    assert p.a.events[0].ud_qkey == RDMA_UDP_QKEY


@pytest.mark.iba("12.11.2")
def test_sidr_no_listener_status_1() -> None:
    p = Pair()
    cid = p.a.new_id()
    cid.sidr_resolve(SidrParams(SID, p.b.gid))
    p.run(1)
    (ev,) = p.a.events
    assert ev.type == T.REJECTED and ev.reject is not None
    assert ev.reject.sidr_status == SidrStatus.UNSUPPORTED
    assert "Service ID not supported" in ev.reject.text


@pytest.mark.iba("12.11.2")
def test_sidr_consumer_reject_status_2() -> None:
    p = Pair()
    lst = p.b.new_id()
    lst.listen(SID)
    p.b.on = lambda ev: ev.cm_id.reject(b"nope") if ev.type == T.CONNECT_REQUEST else None
    cid = p.a.new_id()
    cid.sidr_resolve(SidrParams(SID, p.b.gid))
    p.run(1)
    (ev,) = p.a.events
    assert ev.reject is not None and ev.reject.sidr_status == SidrStatus.REJECT
    assert ev.private_data[:4] == b"nope"


@pytest.mark.iba("12.11.2")
def test_lost_sidr_rep_replayed_from_cache() -> None:
    p = Pair()
    ud_server(p)
    p.fab.add_rule(is_attr(CmAttr.SIDR_REP), "drop", count=1)
    cid = p.a.new_id()
    cid.sidr_resolve(SidrParams(SID, p.b.gid))
    p.run(10)
    assert p.a.types(cid) == [T.ESTABLISHED]
    assert len(p.sent(CmAttr.SIDR_REQ)) == 2 and len(p.sent(CmAttr.SIDR_REP)) == 2
    assert len(p.b.of(T.CONNECT_REQUEST)) == 1  # the retry was answered from the cache
    assert p.b.agent.counters.duplicates == 1


@pytest.mark.iba("12.11.1")
def test_sidr_unanswered_unreachable() -> None:
    p = Pair(config_a=CmConfig(max_cm_retries=2))
    p.fab.partition("10.9.0.2")
    cid = p.a.new_id()
    cid.sidr_resolve(SidrParams(SID, p.b.gid))
    p.run(20)
    (ev,) = p.a.events
    assert ev.type == T.UNREACHABLE and "SIDR" in ev.text
    assert p.a.agent.counters.retransmits == 2 and p.a.agent.live_ids() == 0


def test_sidr_with_ip_cm_udp_port_space() -> None:
    p = Pair()
    qu, _ = p.b.qp(UD)
    lst = p.b.new_id()
    ip_listen(lst, 4791 + 1, proto=IPPROTO_UDP)
    p.b.on = lambda ev: ev.cm_id.accept(qu) if ev.type == T.CONNECT_REQUEST else None
    cid = p.a.new_id()
    IpCmClient(cid).resolve("10.9.0.1", "10.9.0.2", 4792, src_port=999,
                            private_data=b"u" * 180)
    p.run(1)
    (req,) = p.sent(CmAttr.SIDR_REQ)
    assert req.service_id == ip_cm_service_id(IPPROTO_UDP, 4792)
    hdr, consumer = IpCmHeader.decode_private_data(req.private_data)
    assert hdr.src_port == 999 and hdr.dst_addr == ipaddress.ip_address("10.9.0.2")
    (cr,) = p.b.of(T.CONNECT_REQUEST)
    assert cr.private_data == b"u" * 180 and cr.remote_port == 999
    assert p.a.events[0].ud_qpn == qu.qp_num


def test_sidr_ip_cm_rejection_carries_the_ari() -> None:
    p = Pair()
    lst = p.b.new_id()
    ip_listen(lst, 4792, proto=IPPROTO_UDP)
    cid = p.a.new_id()
    # the SIDR_REQ goes to b, but names an address that is not b's
    IpCmClient(cid).resolve("10.9.0.1", "10.9.0.77", 4792, dgid=p.b.gid)
    p.run(1)
    (ev,) = p.a.events
    assert ev.reject is not None and ev.reject.ip_cm is not None
    assert ev.reject.ip_cm.code == IpCmAri.UNKNOWN_IP and "unknown IP address" in ev.text
