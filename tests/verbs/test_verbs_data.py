"""Data movement through the verbs API: SEND/WRITE/READ/atomics/UD end to end over the
in-memory fabric (manual progress, virtual clock) and over UDP on loopback (progress
thread), plus the runtime's ICRC and GRH handling."""

from __future__ import annotations

import asyncio
import socket
import struct
import time

import numpy as np
import pytest
from harness.verbs_pair import (
    ACC,
    RC,
    ROCE_VER,
    UD,
    FabricPair,
    Side,
    _wait,
    connect,
    udp_pair,  # noqa: F401  (fixtures)
)

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.drivers.links.link import Datagram
from softrdma.drivers.runtime.roce import build_grh, icrc_v2
from softrdma.ib.port import Port
from softrdma.wire import roce, rocev1
from softrdma.wire.gid import gid_to_ip, ip_to_gid

W = e.ibv_wr_opcode
SIG = int(e.IBV_SEND_SIGNALED)


@pytest.fixture(autouse=True, params=["2", "1"], ids=["rocev2", "rocev1"])
def roce_ver(request: pytest.FixtureRequest):
    """Every test here runs over RoCEv2 and over RoCEv1 (Annex A16, CA16-15)."""
    ROCE_VER["v"] = request.param
    yield request.param
    ROCE_VER["v"] = "2"


@pytest.fixture()
def fp():
    p = FabricPair()
    yield p
    p.close()


def _one(cq: v.CQ) -> v.WC:
    n, wcs = cq.poll(8)
    assert n == 1, wcs
    return wcs[0]


@pytest.mark.iba("9.2.1", "9.3.7")
def test_send_with_imm_multi_packet(fp: FabricPair) -> None:
    a, b = fp.a, fp.b
    payload = bytes(range(256)) * 12  # 3072 bytes: 3 packets at MTU 1024
    a.buf[:len(payload)] = payload
    b.qp.post_recv(v.RecvWR(21, 2, [b.sge(0, 1000), b.sge(5000, 4000)]))
    w = v.SendWR(11, opcode=int(W.IBV_WR_SEND_WITH_IMM), sg=[a.sge(0, len(payload))])
    w.imm_data = 0xDEADBEEF
    a.qp.post_send(w)
    fp.run()
    s = _one(a.cq)
    assert (s.wr_id, s.status, s.opcode) == (11, 0, e.IBV_WC_SEND)
    r = _one(b.cq)
    assert (r.wr_id, r.status, r.opcode, r.byte_len) == (21, 0, e.IBV_WC_RECV, 3072)
    assert r.imm_data == 0xDEADBEEF and r.wc_flags & e.IBV_WC_WITH_IMM
    assert r.qp_num == b.qp.qp_num and r.src_qp == a.qp.qp_num
    assert bytes(b.buf[:1000]) + bytes(b.buf[5000:7072]) == payload


@pytest.mark.iba("9.4.1.2", "9.7.4.1.4")
def test_rdma_write_read_and_write_imm(fp: FabricPair) -> None:
    a, b = fp.a, fp.b
    a.buf[:5000] = b"w" * 5000
    w = v.SendWR(1, opcode=int(W.IBV_WR_RDMA_WRITE), sg=[a.sge(0, 5000)])
    w.set_wr_rdma(b.mr.rkey, b.mr.addr + 100)
    a.qp.post_send(w)
    b.buf[20000:22000] = b"r" * 2000
    rd = v.SendWR(2, opcode=int(W.IBV_WR_RDMA_READ), sg=[a.sge(30000, 2000)])
    rd.set_wr_rdma(b.mr.rkey, b.mr.addr + 20000)
    a.qp.post_send(rd)
    fp.run()
    n, wcs = a.cq.poll(8)
    assert [(x.wr_id, x.status, x.opcode) for x in wcs] == [
        (1, 0, e.IBV_WC_RDMA_WRITE), (2, 0, e.IBV_WC_RDMA_READ)]
    assert wcs[1].byte_len == 2000
    assert bytes(b.buf[100:5100]) == b"w" * 5000 and b.buf[99] == 0 and b.buf[5100] == 0
    assert bytes(a.buf[30000:32000]) == b"r" * 2000
    assert b.cq.poll() == (0, [])  # a plain WRITE consumes no receive
    b.qp.post_recv(v.RecvWR(9, 1, [b.sge(0, 16)]))
    wi = v.SendWR(3, opcode=int(W.IBV_WR_RDMA_WRITE_WITH_IMM), sg=[a.sge(0, 10)])
    wi.set_wr_rdma(b.mr.rkey, b.mr.addr + 40000)
    wi.imm_data = 77
    a.qp.post_send(wi)
    fp.run()
    r = _one(b.cq)
    assert (r.wr_id, r.opcode, r.imm_data, r.byte_len) == (9, e.IBV_WC_RECV_RDMA_WITH_IMM, 77, 10)
    assert bytes(b.buf[40000:40010]) == b"w" * 10


@pytest.mark.iba("9.4.4")
def test_atomics_native_byte_order() -> None:
    p = FabricPair()
    try:
        arr = np.zeros(4, dtype=np.uint64)
        arr[0] = 40
        arr[1] = 5
        tgt = Side(p.b.ctx, RC, arr)
        src = Side(p.a.ctx, RC, bytearray(64))
        connect(src, tgt)
        fa = v.SendWR(1, opcode=int(W.IBV_WR_ATOMIC_FETCH_AND_ADD), sg=[src.sge(0, 8)])
        fa.set_wr_atomic(tgt.mr.rkey, tgt.mr.addr, 2)
        cs = v.SendWR(2, opcode=int(W.IBV_WR_ATOMIC_CMP_AND_SWP), sg=[src.sge(8, 8)])
        cs.set_wr_atomic(tgt.mr.rkey, tgt.mr.addr + 8, 5, 99)
        cs_miss = v.SendWR(3, opcode=int(W.IBV_WR_ATOMIC_CMP_AND_SWP), sg=[src.sge(16, 8)])
        cs_miss.set_wr_atomic(tgt.mr.rkey, tgt.mr.addr + 8, 5, 1234)
        src.qp.post_send([fa, cs, cs_miss])
        p.run()
        wcs = src.cq.poll(8)[1]
        assert [(x.wr_id, x.status, x.opcode) for x in wcs] == [
            (1, 0, e.IBV_WC_FETCH_ADD), (2, 0, e.IBV_WC_COMP_SWAP), (3, 0, e.IBV_WC_COMP_SWAP)]
        old = struct.unpack("<3Q", bytes(src.buf[:24]))
        assert old == (40, 5, 99)
        assert list(arr[:2]) == [42, 99]
    finally:
        p.close()


@pytest.mark.iba("10.6.3.1")
def test_remote_access_error(fp: FabricPair) -> None:
    a, b = fp.a, fp.b
    w = v.SendWR(4, opcode=int(W.IBV_WR_RDMA_WRITE), sg=[a.sge(0, 8)])
    w.set_wr_rdma(b.mr.rkey ^ 0x100, b.mr.addr)
    a.qp.post_send(w)
    fp.run()
    wc = _one(a.cq)
    assert wc.status == e.IBV_WC_REM_ACCESS_ERR
    assert a.qp.qp_state == e.IBV_QPS_ERR
    a.qp.post_send(v.SendWR(5, sg=[a.sge(0, 8)]))  # after ERR: flushed
    fp.run()
    assert _one(a.cq).status == e.IBV_WC_WR_FLUSH_ERR


@pytest.mark.iba("9.7.6.1.3")
def test_retransmission_uses_virtual_timers() -> None:
    p = FabricPair()
    try:
        dropped: list[int] = []

        def drop(d: object) -> bool:
            dropped.append(1)
            return True
        p.fab.add_rule(drop, "drop", count=1)
        p.b.qp.post_recv(v.RecvWR(1, 1, [p.b.sge(0, 64)]))
        p.a.qp.post_send(v.SendWR(2, sg=[p.a.sge(0, 32)]))
        t0 = p.clock.now()
        p.run()  # the requester's timer (timeout 8: ~1 ms) fires from the virtual clock
        assert dropped and _one(p.a.cq).status == 0 and _one(p.b.cq).byte_len == 32
        assert p.clock.now() - t0 >= 4.096e-6 * (1 << 8)
    finally:
        p.close()


@pytest.mark.iba("9.2.1", "11.4.2.2")
def test_solicited_event_over_the_wire(fp: FabricPair) -> None:
    a, b = fp.a, fp.b
    assert b.ch is not None
    b.qp.post_recv([v.RecvWR(i, 1, [b.sge(64 * i, 64)]) for i in range(3)])
    b.cq.req_notify(solicited_only=True)
    a.qp.post_send(v.SendWR(1, sg=[a.sge(0, 8)]))
    fp.run()
    with pytest.raises(TimeoutError):
        b.ch.get_cq_event(timeout=0)
    a.qp.post_send(v.SendWR(2, sg=[a.sge(0, 8)], send_flags=SIG | int(e.IBV_SEND_SOLICITED)))
    fp.run()
    assert b.ch.get_cq_event(timeout=0) is b.cq
    b.cq.ack_events(1)
    got = b.cq.poll(8)[1]
    assert [x.wr_id for x in got] == [0, 1] and got[1].solicited and not got[0].solicited


def test_unsignaled_and_sq_sig_all(fp: FabricPair) -> None:
    a, b = fp.a, fp.b
    b.qp.post_recv([v.RecvWR(i, 1, [b.sge(64 * i, 64)]) for i in range(2)])
    a.qp.post_send(v.SendWR(1, sg=[a.sge(0, 8)], send_flags=0))
    a.qp.post_send(v.SendWR(2, sg=[a.sge(0, 8)], send_flags=SIG))
    fp.run()
    assert [x.wr_id for x in a.cq.poll(8)[1]] == [2]
    assert len(b.cq.poll(8)[1]) == 2


@pytest.mark.iba("11.4.1.1", "10.2.5")
def test_ud_send_grh_area() -> None:
    p = FabricPair(UD)
    try:
        a, b = p.a, p.b
        ah = v.AH(a.pd, v.AHAttr(gr=v.GlobalRoute(dgid=b.ctx.query_gid(1, 0), hop_limit=33,
                                                 traffic_class=0x20)))
        b.qp.post_recv(v.RecvWR(5, 1, [b.sge(0, 40 + 512)]))
        a.buf[:100] = b"u" * 100
        w = v.SendWR(6, opcode=int(W.IBV_WR_SEND_WITH_IMM), sg=[a.sge(0, 100)])
        w.imm_data = 0x01020304
        w.set_wr_ud(ah, b.qp.qp_num, 0x11223344)
        a.qp.post_send(w)
        p.run()
        assert _one(a.cq).status == 0
        r = _one(b.cq)
        assert (r.status, r.byte_len, r.src_qp, r.imm_data) == (0, 140, a.qp.qp_num, 0x01020304)
        assert r.wc_flags & e.IBV_WC_GRH
        grh = bytes(b.buf[:40])
        if ROCE_VER["v"] == "1":  # Annex A16: the packet's own GRH, every field as sent
            g = rocev1.parse_grh(grh)
            assert (g.ipver, g.tclass, g.flow_label, g.hop_limit, g.next_header) == (
                6, 0x20, 0, 33, 0x1B)
            assert g.paylen == 12 + 8 + 4 + 100 + 4  # BTH DETH ImmDt payload ICRC
            assert g.sgid == a.ctx.query_gid(1, 0).raw and g.dgid == b.ctx.query_gid(1, 0).raw
        else:
            assert grh[:20] == bytes(20)
            ip = grh[20:40]
            assert ip[0] == 0x45 and ip[1] == 0x20 and ip[8] == 33 and ip[9] == 17
            assert ip[12:16] == bytes([10, 4, 0, 1]) and ip[16:20] == bytes([10, 4, 0, 2])
            assert roce.inet_checksum(ip) == 0
        assert bytes(b.buf[40:140]) == b"u" * 100
        # wrong Q_Key: silently dropped and counted (IBA 10.2.5)
        b.qp.post_recv(v.RecvWR(7, 1, [b.sge(0, 600)]))
        w.set_wr_ud(ah, b.qp.qp_num, 0x5)
        a.qp.post_send(w)
        p.run()
        assert b.cq.poll() == (0, []) and b.ctx.counters()["rcvd_bad_qkey"] == 1
    finally:
        p.close()


@pytest.mark.iba("10.2.9", "10.2.9.6")
def test_srq_shared_by_two_qps_and_limit_event() -> None:
    p = FabricPair()
    try:
        pd, cq = p.b.pd, p.b.cq
        srq = v.SRQ(pd, v.SrqInitAttr(v.SrqAttr(max_wr=8, srq_limit=2)))
        q1 = v.QP(pd, v.QPInitAttr(RC, scq=cq, rcq=cq, srq=srq))
        q2 = v.QP(pd, v.QPInitAttr(RC, scq=cq, rcq=cq, srq=srq))
        s1 = Side(p.a.ctx, RC, bytearray(256))
        s2 = Side(p.a.ctx, RC, bytearray(256))
        for me, peer in ((s1, q1), (s2, q2)):
            for x, y, pc in ((me.qp, peer, p.b.ctx), (peer, me.qp, p.a.ctx)):
                a = v.QPAttr(path_mtu=3, dest_qp_num=y.qp_num, max_dest_rd_atomic=1,
                             max_rd_atomic=1, timeout=8, retry_cnt=3, rnr_retry=3)
                a.qp_access_flags = ACC
                a.ah_attr = v.AHAttr(gr=v.GlobalRoute(dgid=pc.query_gid(1, 0)))
                x.to_rts(a)
        srq.post_recv([v.RecvWR(100 + i, 1, [p.b.sge(64 * i, 64)]) for i in range(3)])
        s1.qp.post_send(v.SendWR(1, sg=[s1.sge(0, 4)]))
        s2.qp.post_send(v.SendWR(2, sg=[s2.sge(0, 4)]))
        p.run()
        got = sorted((x.qp_num, x.wr_id) for x in cq.poll(8)[1])
        assert sorted(w for _, w in got) == [100, 101]
        assert {q for q, _ in got} == {q1.qp_num, q2.qp_num}
        ev = p.b.ctx.get_async_event(timeout=0)
        assert ev.event_type == e.IBV_EVENT_SRQ_LIMIT_REACHED and ev.element is srq
        assert srq.query().srq_limit == 0
    finally:
        p.close()


def test_icrc_errors_are_counted_and_dropped() -> None:
    p = FabricPair(corrupt=1.0)
    try:
        p.b.qp.post_recv(v.RecvWR(1, 1, [p.b.sge(0, 64)]))
        p.a.qp.post_send(v.SendWR(2, sg=[p.a.sge(0, 32)]))
        p.clock.run(until=p.clock.now() + 0.0005)
        assert p.b.ctx.counters()["rcvd_icrc_err"] >= 1
        assert p.b.cq.poll() == (0, [])
        p.fab.corrupt = 0.0
        p.run()  # the retransmission gets through
        assert _one(p.b.cq).byte_len == 32
    finally:
        p.close()


# ---- the runtime's wire helpers ---------------------------------------------------------------
def test_icrc_matches_wire_roce() -> None:
    parts = [bytes.fromhex("0440ffff00000011000000aa"), b"payload!", b""]
    for src, dst in ((bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2])),
                     (bytes.fromhex("fd00" + "00" * 13 + "01"), bytes.fromhex("fd00" + "00" * 13 + "02"))):
        mine = icrc_v2(src, dst, 0xC123, 4791, parts, 20)
        assert mine == roce.udp_send_icrc(src, dst, 0xC123, 4791, parts)
        dg = memoryview(b"".join(parts) + mine)
        assert roce.icrc_ok_udp(src, dst, 0xC123, 4791, dg)
    # BTH split across buffers gives the same result
    assert icrc_v2(bytes(4), bytes(4), 1, 2, [b"\x04\x40", b"\xff\xff\x00\x00\x00\x11", b"\0\0\0\xaa"], 12) == \
        icrc_v2(bytes(4), bytes(4), 1, 2, [bytes.fromhex("0440ffff00000011000000aa")], 12)


def test_gid_ip_and_grh_helpers() -> None:
    g = ip_to_gid(bytes([1, 2, 3, 4]))
    assert gid_to_ip(g) == bytes([1, 2, 3, 4]) and len(g) == 16
    six = bytes.fromhex("fe80" + "00" * 13 + "07")
    assert ip_to_gid(six) == six == gid_to_ip(six)
    d = Datagram(memoryview(bytes(60)), bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2]), 5, 4791, 3, 9)
    grh = build_grh(d, 0x1234, True)
    assert len(grh) == 40 and grh[:20] == bytes(20)
    assert struct.unpack("!H", grh[22:24])[0] == 20 + 8 + 60 and grh[24:26] == b"\x12\x34"
    assert roce.inet_checksum(grh[20:]) == 0
    d6 = Datagram(memoryview(bytes(60)), six, six, 5, 4791, 0x28, 9)
    g6 = build_grh(d6)
    assert g6[0] >> 4 == 6 and struct.unpack("!H", g6[4:6])[0] == 68 and g6[7] == 9
    assert ((struct.unpack("!I", g6[:4])[0] >> 20) & 0xFF) == 0x28


def test_udp_loopback_send_write_read(udp_pair) -> None:  # noqa: F811
    a, b = udp_pair
    assert a.ctx.query_port().active_mtu == e.IBV_MTU_4096  # lo
    assert a.ctx.gids == [v.GID("127.0.0.1")]
    data = bytes(range(256)) * 64  # 16 KiB
    a.buf[:len(data)] = data
    b.qp.post_recv(v.RecvWR(1, 1, [b.sge(0, 1 << 15)]))
    a.qp.post_send(v.SendWR(2, sg=[a.sge(0, len(data))]))
    assert _wait(a.cq)[0].status == 0
    r = _wait(b.cq)[0]
    assert r.status == 0 and r.byte_len == len(data) and bytes(b.buf[:len(data)]) == data
    w = v.SendWR(3, opcode=int(W.IBV_WR_RDMA_WRITE), sg=[a.sge(0, len(data))])
    w.set_wr_rdma(b.mr.rkey, b.mr.addr + 100000)
    a.qp.post_send(w)
    b.buf[500000:700000] = bytes(range(200)) * 1000
    rd = v.SendWR(4, opcode=int(W.IBV_WR_RDMA_READ), sg=[a.sge(300000, 200000)])
    rd.set_wr_rdma(b.mr.rkey, b.mr.addr + 500000)
    a.qp.post_send(rd)
    wcs = _wait(a.cq, 2)
    assert [(x.wr_id, x.status) for x in wcs] == [(3, 0), (4, 0)]
    assert bytes(b.buf[100000:100000 + len(data)]) == data
    assert bytes(a.buf[300000:500000]) == bytes(b.buf[500000:700000])
    assert a.ctx.counters()["rcvd_icrc_err"] == 0 and b.ctx.counters()["rcvd_icrc_err"] == 0


def test_udp_loopback_channel_and_asyncio(udp_pair) -> None:  # noqa: F811
    a, b = udp_pair
    assert b.ch is not None
    b.qp.post_recv([v.RecvWR(i, 1, [b.sge(64 * i, 64)]) for i in range(2)])
    b.cq.req_notify()
    a.qp.post_send(v.SendWR(1, sg=[a.sge(0, 8)]))
    assert b.ch.get_cq_event(timeout=5) is b.cq  # delivered by the progress thread
    b.cq.ack_events(1)
    assert [x.wr_id for x in b.cq.poll(4)[1]] == [0]

    async def recv_async() -> list[int]:
        loop = asyncio.get_running_loop()
        loop.call_later(0.01, a.qp.post_send, v.SendWR(2, sg=[a.sge(0, 8)]))
        return [x.wr_id for x in await b.cq.wait(timeout=5)]

    assert asyncio.run(recv_async()) == [1]
    assert len(_wait(a.cq, 2)) == 2


def test_udp_bad_icrc_datagram_counted(udp_pair) -> None:  # noqa: F811
    a, b = udp_pair
    pkt = bytes.fromhex("0440ffff00") + struct.pack("!I", b.qp.qp_num)[1:] + bytes(4) + b"x" * 8
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        s.sendto(pkt + b"\0\0\0\0", ("127.0.0.2", b.ctx.runtime.udp_port))
    end = time.monotonic() + 5
    while b.ctx.counters()["rcvd_icrc_err"] == 0:
        assert time.monotonic() < end
        b.ctx.progress(0.01)
    assert b.ctx.counters()["rcvd_pkts"] == 0


def test_udp_loopback_coalesced_reads_take_the_middle_run(udp_pair, monkeypatch) -> None:  # noqa: F811
    """Over loopback a GSO batch arrives as one coalesced (UDP GRO) read; its MIDDLE
    packets are placed by the run path (Port.receive_run) and the data is right."""
    a, b = udp_pair
    if not (b.ctx.runtime.link.gro and a.ctx.runtime.link.gso):
        pytest.skip("this kernel refuses UDP GSO or GRO on loopback")
    taken = []
    real = Port.receive_run

    def spy(*args):
        k = real(*args)
        taken.append(k)
        return k

    monkeypatch.setattr(Port, "receive_run", spy)
    data = bytes((i * 11 + 1) & 0xFF for i in range(1 << 19))  # 512 KiB: 128 packets
    a.buf[:len(data)] = data
    w = v.SendWR(5, opcode=int(W.IBV_WR_RDMA_WRITE), sg=[a.sge(0, len(data))])
    w.set_wr_rdma(b.mr.rkey, b.mr.addr)
    a.qp.post_send(w)
    b.qp.post_recv(v.RecvWR(6, 1, [b.sge(1 << 19, 1 << 19)]))
    a.qp.post_send(v.SendWR(7, sg=[a.sge(0, len(data))]))
    assert [(x.wr_id, x.status) for x in _wait(a.cq, 2)] == [(5, 0), (7, 0)]
    r = _wait(b.cq)[0]
    assert r.status == 0 and r.byte_len == len(data)
    assert bytes(b.buf[:len(data)]) == data and bytes(b.buf[1 << 19:]) == data
    assert sum(taken) > 0, taken
    assert b.ctx.counters()["rcvd_icrc_err"] == 0
