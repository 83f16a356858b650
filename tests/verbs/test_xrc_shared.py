"""XRC domains shared by processes (IBA 9.8.5, Annex A14; issue 22, ``ibv_xsrq_pingpong
-c 2``): contexts of a device shared through devd that open the same file share its XRC
domain, and a TGT QP of one delivers SENDs into an XRC SRQ of another, completed on that
SRQ's CQ with the TGT QP's number (softrdma.ib.xrc, softrdma.drivers.devd.xrc).

Each context is its own devd client with its own engine, as a process is."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness.device import ib_port, shared_device
from harness.wait import wait_until

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.drivers.devd.client import DevdLink
from softrdma.ib import xrc
from softrdma.ib.xrc import srq_table

ACC = int(e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE)
XRC_SEND, XRC_RECV = int(e.IBV_QPT_XRC_SEND), int(e.IBV_QPT_XRC_RECV)
SIZE = 1 << 16


@pytest.fixture()
def device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    yield from shared_device("xrcsh0", tmp_path / "state", monkeypatch)


class Proc:
    """What one process of ibv_xsrq_pingpong holds: a context on the shared device, an
    XRCD on the common file, an XRC SRQ with its CQ, INI and TGT QPs."""

    def __init__(self, name: str, path: Path, n_qps: int = 1, size: int = SIZE) -> None:
        self.ctx = v.Context(name)
        self.pd = v.PD(self.ctx)
        self.cq = v.CQ(self.ctx, 64)
        self.buf = bytearray(size)
        self.mr = v.MR(self.pd, 0, ACC, buffer=self.buf)
        self.fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o400)
        self.xrcd = v.XRCD(self.ctx, self.fd, os.O_CREAT)
        self.srq = v.XrcSRQ(self.pd, self.xrcd, self.cq, v.SrqInitAttr(v.SrqAttr(16, 1)))
        self.ini = [v.QP(self.pd, v.QPInitAttr(qp_type=XRC_SEND, scq=self.cq,
                                               cap=v.QPCap(16, 0, 1, 0))) for _ in range(n_qps)]
        self.tgt = [v.QP(self.xrcd, v.QPInitAttr(qp_type=XRC_RECV)) for _ in range(n_qps)]

    def post(self, wr_id: int, off: int, n: int) -> None:
        self.srq.post_recv(v.RecvWR(wr_id, 1, [v.SGE(self.mr.addr + off, n, self.mr.lkey)]))

    def send(self, qp: int, wr_id: int, off: int, n: int, srqn: int,
             opcode: int = int(e.IBV_WR_SEND), imm: int = 0) -> None:
        w = v.SendWR(wr_id, sg=[v.SGE(self.mr.addr + off, n, self.mr.lkey)], opcode=opcode,
                     send_flags=int(e.IBV_SEND_SIGNALED))
        w.imm_data = imm
        if opcode == e.IBV_WR_RDMA_READ:
            w.set_wr_rdma(self.mr.rkey, self.mr.addr)
        w.set_qp_type_xrc(srqn)
        self.ini[qp].post_send(w)

    def close(self) -> None:
        self.ctx.close()
        os.close(self.fd)


def _connect(ini: v.QP, ini_p: Proc, tgt: v.QP, tgt_p: Proc,
             mtu: int = int(e.IBV_MTU_1024), timeout: int = 14) -> None:
    common: dict[str, Any] = dict(path_mtu=mtu, max_dest_rd_atomic=1,
                                  min_rnr_timer=1, timeout=timeout, retry_cnt=7, rnr_retry=7,
                                  max_rd_atomic=1)
    t = v.QPAttr(qp_access_flags=ACC, dest_qp_num=ini.qp_num, rq_psn=0x77, sq_psn=0, **common)
    t.ah_attr = v.AHAttr(is_global=1, gr=v.GlobalRoute(dgid=ini_p.ctx.query_gid(1, 0),
                                                        sgid_index=0), port_num=1)
    tgt.to_rts(t)
    i = v.QPAttr(qp_access_flags=0, dest_qp_num=tgt.qp_num, rq_psn=0, sq_psn=0x77, **common)
    i.ah_attr = v.AHAttr(is_global=1, gr=v.GlobalRoute(dgid=tgt_p.ctx.query_gid(1, 0),
                                                        sgid_index=0), port_num=1)
    ini.to_rts(i)


def _wcs(cq: v.CQ, n: int) -> list[Any]:
    got: list[Any] = []

    def more() -> bool:
        got.extend(cq.poll(16)[1])
        return len(got) >= n

    wait_until(more, what=f"{n} completions")
    return got


@pytest.mark.iba("9.8.5", "10.2.9")
def test_tgt_qp_of_one_process_delivers_into_the_srq_of_another(device: str,
                                                                 tmp_path: Path) -> None:
    """ibv_xsrq_pingpong -c 2: the server sends client A's messages through the INI QP
    connected to client B's TGT QP; they land in A's SRQ (A's CQ, B's TGT QP number, the
    INI QP as source), data intact, multi-packet and with immediate, in order; a message
    sent while A's SRQ is empty waits for the receive WQE A posts next."""
    path = tmp_path / "xrc_domain"
    server, a, b = (Proc(device, path, 2), Proc(device, path), Proc(device, path))
    try:
        _connect(server.ini[0], server, a.tgt[0], a)
        _connect(server.ini[1], server, b.tgt[0], b)
        a.post(1, 0, 8192)
        a.post(2, 8192, 8192)
        server.buf[:5000] = bytes(range(256)) * 19 + bytes(136)
        server.buf[5000:5100] = b"z" * 100
        server.send(1, 10, 0, 5000, a.srq.srq_num)  # via B's TGT QP, 5 packets
        server.send(1, 11, 5000, 100, a.srq.srq_num, int(e.IBV_WR_SEND_WITH_IMM), 0xABCD)
        sent = _wcs(server.cq, 2)
        assert [(w.wr_id, w.status) for w in sent] == [(10, 0), (11, 0)]
        got = _wcs(a.cq, 2)
        b_tgt, ini = b.tgt[0].qp_num, server.ini[1].qp_num
        assert [(w.wr_id, w.status, w.opcode, w.byte_len, w.qp_num, w.src_qp, w.wc_flags)
                for w in got] == [
            (1, 0, e.IBV_WC_RECV, 5000, b_tgt, ini, 0),
            (2, 0, e.IBV_WC_RECV, 100, b_tgt, ini, int(e.IBV_WC_WITH_IMM))]
        assert got[1].imm_data == 0xABCD
        assert a.buf[:5000] == server.buf[:5000] and a.buf[8192:8292] == b"z" * 100
        assert b.cq.poll(4)[0] == 0  # nothing on the TGT process's own CQ
        # A's SRQ is empty: B's TGT QP acknowledges, A keeps the message until it posts
        server.buf[:3000] = b"q" * 3000
        server.send(1, 12, 0, 3000, a.srq.srq_num)
        assert [(w.wr_id, w.status) for w in _wcs(server.cq, 1)] == [(12, 0)]
        assert a.cq.poll(4)[0] == 0
        a.post(3, 16384, 4096)
        got = _wcs(a.cq, 1)
        assert [(w.wr_id, w.status, w.byte_len, w.qp_num) for w in got] == [
            (3, 0, 3000, b_tgt)]
        assert a.buf[16384:19384] == b"q" * 3000
        # the other way: A's own TGT QP into B's SRQ
        b.post(7, 0, 4096)
        server.send(0, 13, 0, 64, b.srq.srq_num)
        assert [(w.wr_id, w.status) for w in _wcs(server.cq, 1)] == [(13, 0)]
        got = _wcs(b.cq, 1)
        assert [(w.wr_id, w.status, w.byte_len, w.qp_num) for w in got] == [
            (7, 0, 64, a.tgt[0].qp_num)]
        # one domain id on the device for the three of them (devd's XRCD_OPEN)
        ids = {p.xrcd.shared.ident for p in (server, a, b) if p.xrcd.shared is not None}
        assert len(ids) == 1
    finally:
        for p in (server, a, b):
            p.close()


@pytest.mark.iba("9.8.5", "11.6.3.2")
def test_an_srq_of_another_domain_is_still_an_invalid_xrceth(device: str,
                                                              tmp_path: Path) -> None:
    """An SRQ of another process in a domain of another file (and a READ naming an SRQ
    of another process: its R_Key is in that process's memory) is NAKed, Remote Access
    Error, as an unknown SRQ number is; nothing reaches the other process."""
    server = Proc(device, tmp_path / "one", 2)
    other = Proc(device, tmp_path / "two")
    same = Proc(device, tmp_path / "one", 2)
    try:
        _connect(server.ini[0], server, same.tgt[0], same)
        _connect(server.ini[1], server, same.tgt[1], same)
        other.post(1, 0, 4096)
        server.post(2, 0, 4096)
        server.send(0, 20, 0, 64, other.srq.srq_num)
        server.send(1, 21, 0, 64, server.srq.srq_num, int(e.IBV_WR_RDMA_READ))
        got = _wcs(server.cq, 2)
        assert sorted((w.wr_id, w.status) for w in got) == [
            (20, e.IBV_WC_REM_ACCESS_ERR), (21, e.IBV_WC_REM_ACCESS_ERR)]
        assert other.cq.poll(4)[0] == 0
        for tgt in same.tgt:
            assert tgt.query(int(e.IBV_QP_STATE))[0].qp_state == e.IBV_QPS_ERR
    finally:
        for p in (server, other, same):
            p.close()


@pytest.mark.iba("9.8.5", "9.7.5.2.8")
def test_a_hand_over_devd_cannot_take_is_sent_again(device: str, tmp_path: Path) -> None:
    """When the data channel to devd is full (here: its send refused twice, on the first
    and on a middle packet of a 5-packet SEND), the TGT QP answers with an RNR NAK and
    the INI QP sends from that packet again: the message arrives whole, once."""
    path = tmp_path / "xrc_domain"
    server, a, b = (Proc(device, path), Proc(device, path), Proc(device, path))
    try:
        _connect(server.ini[0], server, b.tgt[0], b)
        link = b.ctx.runtime.link
        assert isinstance(link, DevdLink)
        real = link.xrc_send
        calls: list[int] = []

        def flaky(flags: int, *rest: Any) -> bool:
            calls.append(flags)
            return len(calls) not in (1, 3) and bool(real(flags, *rest))

        link.xrc_send = flaky  # type: ignore[method-assign,assignment]
        a.post(1, 0, 8192)
        server.buf[:5000] = bytes(range(250)) * 20
        server.send(0, 30, 0, 5000, a.srq.srq_num)
        assert [(w.wr_id, w.status) for w in _wcs(server.cq, 1)] == [(30, 0)]
        got = _wcs(a.cq, 1)
        assert [(w.wr_id, w.status, w.byte_len) for w in got] == [(1, 0, 5000)]
        assert a.buf[:5000] == server.buf[:5000]
        assert calls[0] == calls[1] == 1  # XF_FIRST refused, then sent again
        assert len(calls) == 7 and calls[-1] == 2  # 5 packets + 2 refused; XF_LAST
        assert b.ctx.query_port_counters().send_rnr_nak == 2
        assert a.cq.poll(4)[0] == 0
    finally:
        for p in (server, a, b):
            p.close()


@pytest.mark.iba("9.8.5", "9.7.5.2.8")
def test_a_stalled_owner_stops_the_sender_instead_of_losing_sends(device: str,
                                                                  tmp_path: Path) -> None:
    """The SRQ's owner takes nothing from devd for a while (its engine busy; here its lock
    held) while another process's TGT QP hands it 8 MiB, more than the owner's data
    channel holds. Before flow control devd dropped what did not fit (``client_full``)
    after the TGT QP had acknowledged it: the sender saw all 16 SENDs complete, the owner
    got part of them. Now the TGT QP stops at its credit with RNR NAKs until the owner
    consumes (its credit used up, RNR NAKs sent), and every SEND arrives whole, once, in
    order."""
    n, size = 16, 512 << 10
    path = tmp_path / "xrc_domain"
    server, a = Proc(device, path, size=n * size), Proc(device, path, size=n * size)
    b = Proc(device, path)
    try:
        # Local ACK Timeout 10 (4 ms; retry_cnt 7 never runs out): after an RNR NAK the
        # sender's next try waits for it, ~30 times in this run (67 ms each at 14: ~10 s)
        _connect(server.ini[0], server, b.tgt[0], b, int(e.IBV_MTU_4096), timeout=10)
        for k in range(n):
            a.post(k, k * size, size)
            server.buf[k * size:(k + 1) * size] = bytes([k + 1]) * size
        sent: list[Any] = []
        key = (b.tgt[0].qp_num, a.srq.srq_num)
        with a.ctx.runtime.lock:  # the owner reads nothing meanwhile
            for k in range(n):
                server.send(0, 100 + k, k * size, size, a.srq.srq_num)

            def stalled() -> bool:
                sent.extend(server.cq.poll(16)[1])
                held = getattr(srq_table(ib_port(b.ctx)), "in_flight", {}).get(key, 0)
                return len(sent) == n or (held >= xrc.HANDOVER_CREDITS
                                          and b.ctx.query_port_counters().send_rnr_nak > 0)

            wait_until(stalled, timeout=120, what="the sender done or held back")
            # the window (64 packets) is less than one SEND: none completes meanwhile
            assert sent == []
        sent += _wcs(server.cq, n)
        assert [(w.wr_id, w.status) for w in sent] == [(100 + k, 0) for k in range(n)]
        got: list[Any] = []

        def arrived() -> bool:
            got.extend(a.cq.poll(16)[1])
            return len(got) >= n

        wait_until(arrived, timeout=60, what=f"{n} SENDs at the owner")
        assert [(w.wr_id, w.status, w.byte_len) for w in got] == [
            (k, 0, size) for k in range(n)]
        for k in range(n):
            assert a.buf[k * size:(k + 1) * size] == bytes([k + 1]) * size
    finally:
        for p in (server, a, b):
            p.close()
