"""XRC (IBA 9.8.5 / Annex A14): the XRCETH codec, the XRC engine rules over the in-memory
fabric (with loss and reordering), the XRCD / XRC SRQ / XRC QP verbs, pcap-check and
tshark on XRC traffic (softrdma/ib/xrc.py, wire/xrc.py, verbs/xrcd.py)."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from harness.device import ib_port

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.drivers.links.fabric import Fabric
from softrdma.drivers.runtime.clock import VirtualClock
from softrdma.errors import DecodeError, InvalidArgument
from softrdma.ib.port import RxMeta
from softrdma.ib.xrc import srq_table
from softrdma.tools.capture import pcap_check
from softrdma.wire import ib as wib
from softrdma.wire.opcodes import OPCODES, Hdr, Transport
from softrdma.wire.xrc import (
    XRCETH_SIZE,
    pack_xrceth,
    unpack_xrceth,
    xrc_request_header,
    xrc_response_header,
    xrceth_srqn,
)

ACC = int(e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
          | e.IBV_ACCESS_REMOTE_ATOMIC)
QP_ACC = int(e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ | e.IBV_ACCESS_REMOTE_ATOMIC)
XRC_SEND, XRC_RECV = int(e.IBV_QPT_XRC_SEND), int(e.IBV_QPT_XRC_RECV)


# ---- wire ------------------------------------------------------------------------------------
def test_xrceth_is_an_exact_inverse() -> None:
    for srqn, resv in ((0, 0), (0x11, 0), (0xABCDEF, 0x5A), (0xFFFFFF, 0xFF)):
        raw = pack_xrceth(srqn, resv)
        assert len(raw) == XRCETH_SIZE == 4
        assert raw == bytes([resv]) + srqn.to_bytes(3, "big")
        assert unpack_xrceth(raw) == (resv, srqn)
        assert xrceth_srqn(int.from_bytes(raw, "big")) == srqn
        for short, off in ((raw[:3], 0), (raw, 1), (raw, -1)):
            with pytest.raises(DecodeError):  # not struct.error: a decoder's only error
                unpack_xrceth(short, off)


@pytest.mark.iba("9.2.3", "9.8.5")
def test_xrc_opcode_table_is_rc_with_xrceth_on_requests() -> None:
    """IBA Table 35: XRC (101b) has every RC operation; requests carry the XRCETH right
    after the BTH, responses do not."""
    for op in range(0x20):
        rc = OPCODES.get(op)
        xrc = OPCODES.get(int(Transport.XRC) | op)
        assert (rc is None) == (xrc is None)
        if rc is None or xrc is None:
            continue
        assert xrc.kind == rc.kind and xrc.pos == rc.pos and xrc.payload == rc.payload
        if rc.is_response:
            assert xrc.hdrs == rc.hdrs and xrc.hdr_len == rc.hdr_len
        else:
            assert xrc.hdrs == rc.hdrs | Hdr.XRCETH
            assert xrc.hdr_len == rc.hdr_len + XRCETH_SIZE


def test_xrc_headers_decode_and_reencode_byte_exact() -> None:
    """An RC header turned into the XRC one decodes with the XRCETH in place and the RC
    fields intact, and re-encodes to the same bytes, for each request and response."""
    for op, info in OPCODES.items():
        if op >= 0x20:
            continue
        p = wib.IBPacket(op, psn=0x123456, dqpn=0x654321,
                         payload=b"abcdef" if info.payload else b"")
        p.va, p.rkey, p.dma_len, p.imm, p.inv_rkey, p.msn = 0x1000, 0x77, 6, 9, 0x55, 3
        rc = bytes(wib.encode_headers(p))
        body = bytes(p.payload) + wib.pad_bytes(len(p.payload))
        if info.is_response:
            hdr = xrc_response_header(rc)
        else:
            hdr = xrc_request_header(rc, 0xABCDEF)
        q = wib.decode(memoryview(hdr + body))
        assert q.opcode == op | 0xA0 and q.info.name == "XRC_" + info.name[3:]
        assert (q.psn, q.dqpn, bytes(q.payload)) == (p.psn, p.dqpn, bytes(p.payload))
        assert (q.va, q.rkey, q.imm, q.inv_rkey, q.msn) == (
            p.va if info.hdrs & (Hdr.RETH | Hdr.ATMETH) else 0,
            p.rkey if info.hdrs & (Hdr.RETH | Hdr.ATMETH) else 0,
            p.imm if info.imm else 0, p.inv_rkey if info.inv else 0,
            p.msn if info.hdrs & Hdr.AETH else 0)
        assert xrceth_srqn(q.xrceth) == (0 if info.is_response else 0xABCDEF)
        assert wib.encode(q) == hdr + body


# ---- a pair of devices on the fabric -----------------------------------------------------------
class Node:
    """One host: PD, CQ, a registered buffer, an XRCD with ``n_srq`` XRC SRQs, an XRC INI
    QP and an XRC TGT QP."""

    def __init__(self, fab: Fabric, ip: str, n_srq: int = 1) -> None:
        self.ctx = v.Context(fabric=fab.link(ip))
        self.pd = v.PD(self.ctx)
        self.cq = v.CQ(self.ctx, 256)
        self.buf = bytearray(1 << 16)
        self.mr = v.MR(self.pd, 0, ACC, buffer=self.buf)
        self.xrcd = v.XRCD(self.ctx)
        self.srqs = [v.XrcSRQ(self.pd, self.xrcd, self.cq, v.SrqInitAttr(v.SrqAttr(64, 1)))
                     for _ in range(n_srq)]
        self.ini = v.QP(self.pd, v.QPInitAttr(qp_type=XRC_SEND, scq=self.cq,
                                              cap=v.QPCap(64, 0, 1, 0)))
        self.tgt = v.QP(self.xrcd, v.QPInitAttr(qp_type=XRC_RECV))

    def sge(self, off: int, n: int) -> v.SGE:
        return v.SGE(self.mr.addr + off, n, self.mr.lkey)

    def gid(self) -> Any:
        return self.ctx.query_gid(1, 0)


def _connect(ini: v.QP, tgt: v.QP, ini_node: Node, tgt_node: Node, psn: int) -> None:
    """INI -> TGT, moved with the attributes the kernel table requires for each type."""
    common = dict(path_mtu=1, max_dest_rd_atomic=4, min_rnr_timer=1, timeout=12, retry_cnt=7,
                  rnr_retry=7, max_rd_atomic=4)
    t = v.QPAttr(qp_access_flags=QP_ACC, dest_qp_num=ini.qp_num, rq_psn=psn, sq_psn=0, **common)
    t.ah_attr = v.AHAttr(is_global=1, gr=v.GlobalRoute(dgid=ini_node.gid(), sgid_index=0),
                         port_num=1)
    tgt.to_rts(t)
    i = v.QPAttr(qp_access_flags=0, dest_qp_num=tgt.qp_num, rq_psn=0, sq_psn=psn, **common)
    i.ah_attr = v.AHAttr(is_global=1, gr=v.GlobalRoute(dgid=tgt_node.gid(), sgid_index=0),
                         port_num=1)
    ini.to_rts(i)


class Pair:
    def __init__(self, n_srq: int = 1, **faults: Any) -> None:
        self.clock = VirtualClock()
        self.fab = Fabric(self.clock, seed=11, **faults)
        self.a = Node(self.fab, "10.5.0.1", n_srq)
        self.b = Node(self.fab, "10.5.0.2", n_srq)
        _connect(self.a.ini, self.b.tgt, self.a, self.b, 0xFFFFF0)  # PSNs wrap on the way
        _connect(self.b.ini, self.a.tgt, self.b, self.a, 0x100)

    def run(self) -> None:
        self.clock.run(max_events=500_000)

    def close(self) -> None:
        self.fab.stop_capture()
        self.a.ctx.close()
        self.b.ctx.close()


@pytest.fixture()
def pair():
    p = Pair()
    yield p
    p.close()


def _send(node: Node, wr_id: int, off: int, n: int, srqn: int,
          opcode: int = int(e.IBV_WR_SEND)) -> v.SendWR:
    w = v.SendWR(wr_id, sg=[node.sge(off, n)], opcode=opcode)
    w.set_qp_type_xrc(srqn)
    return w


def _poll_all(cq: v.CQ) -> list[Any]:
    out: list[Any] = []
    while True:
        n, wcs = cq.poll(64)
        if not n:
            return out
        out.extend(wcs)


@pytest.mark.iba("9.8.5", "10.2.9")
def test_send_goes_to_the_srq_named_by_the_xrceth() -> None:
    p = Pair(n_srq=2)
    try:
        a, b = p.a, p.b
        for k, srq in enumerate(b.srqs):
            srq.post_recv(v.RecvWR(100 + k, 1, [b.sge(8192 * k, 8192)]))
        a.buf[:5000] = bytes(range(256)) * 19 + bytes(136)
        a.ini.post_send(_send(a, 1, 0, 5000, b.srqs[1].srq_num))
        a.ini.post_send(_send(a, 2, 0, 100, b.srqs[0].srq_num))
        p.run()
        assert [(w.wr_id, w.status) for w in _poll_all(a.cq)] == [(1, 0), (2, 0)]
        got = _poll_all(b.cq)
        assert [(w.wr_id, w.status, w.byte_len, w.qp_num, w.src_qp) for w in got] == [
            (101, 0, 5000, b.tgt.qp_num, a.ini.qp_num), (100, 0, 100, b.tgt.qp_num, a.ini.qp_num)]
        assert b.buf[8192:8192 + 5000] == a.buf[:5000] and b.buf[:100] == a.buf[:100]
    finally:
        p.close()


@pytest.mark.parametrize("faults", [dict(drop=0.15), dict(reorder=0.3), dict(duplicate=0.2)],
                         ids=["drop", "reorder", "duplicate"])
@pytest.mark.iba("9.8.5")
def test_all_operations_survive_faults(faults: dict[str, float]) -> None:
    """SEND (with immediate), RDMA WRITE / READ and both atomics over XRC, both ways, on a
    lossy, reordering, duplicating fabric (go-back-N and duplicate detection as RC)."""
    p = Pair(**faults)  # type: ignore[arg-type]
    try:
        for src, dst in ((p.a, p.b), (p.b, p.a)):
            srqn = dst.srqs[0].srq_num
            for k in range(4):
                dst.srqs[0].post_recv(v.RecvWR(10 + k, 1, [dst.sge(4096 * k, 4096)]))
            src.buf[0:3000] = os.urandom(3000)
            src.buf[40000:40008] = (5).to_bytes(8, "little")
            src.ini.post_send(_send(src, 1, 0, 3000, srqn))
            w = _send(src, 2, 0, 2000, srqn, int(e.IBV_WR_SEND_WITH_IMM))
            w.imm_data = 0x1234
            src.ini.post_send(w)
            w = _send(src, 3, 0, 2500, srqn, int(e.IBV_WR_RDMA_WRITE))
            w.set_wr_rdma(dst.mr.rkey, dst.mr.addr + 20000)
            src.ini.post_send(w)
            dst.buf[30000:32000] = os.urandom(2000)
            w = _send(src, 4, 10000, 2000, srqn, int(e.IBV_WR_RDMA_READ))
            w.set_wr_rdma(dst.mr.rkey, dst.mr.addr + 30000)
            src.ini.post_send(w)
            dst.buf[50000:50008] = (40).to_bytes(8, "little")
            w = _send(src, 5, 40016, 8, srqn, int(e.IBV_WR_ATOMIC_FETCH_AND_ADD))
            w.set_wr_atomic(dst.mr.rkey, dst.mr.addr + 50000, 2)
            src.ini.post_send(w)
            w = _send(src, 6, 40024, 8, srqn, int(e.IBV_WR_ATOMIC_CMP_AND_SWP))
            w.set_wr_atomic(dst.mr.rkey, dst.mr.addr + 50000, 42, 7)
            src.ini.post_send(w)
            p.run()
            assert [(w.wr_id, w.status) for w in _poll_all(src.cq)] == \
                [(k, 0) for k in range(1, 7)]
            got = _poll_all(dst.cq)
            assert [(w.wr_id, w.byte_len) for w in got] == [(10, 3000), (11, 2000)]
            assert got[1].imm_data == 0x1234 and got[1].wc_flags & e.IBV_WC_WITH_IMM
            assert dst.buf[0:3000] == src.buf[0:3000]
            assert dst.buf[4096:6096] == src.buf[0:2000]
            assert dst.buf[20000:22500] == src.buf[0:2500]
            assert src.buf[10000:12000] == dst.buf[30000:32000]
            assert int.from_bytes(src.buf[40016:40024], "little") == 40
            assert int.from_bytes(src.buf[40024:40032], "little") == 42
            assert int.from_bytes(dst.buf[50000:50008], "little") == 7
        assert p.fab.stats.dropped + p.fab.stats.reordered + p.fab.stats.duplicated > 0
    finally:
        p.close()


@pytest.mark.iba("9.8.5", "9.7.5.2.8")
def test_rnr_on_an_empty_srq_then_delivery(pair: Pair) -> None:
    a, b = pair.a, pair.b
    a.ini.post_send(_send(a, 1, 0, 64, b.srqs[0].srq_num))
    pair.clock.run(until=pair.clock.now() + 0.002)
    assert b.ctx.counters()["send_rnr_nak"] >= 1 and _poll_all(a.cq) == []
    b.srqs[0].post_recv(v.RecvWR(9, 1, [b.sge(0, 64)]))
    pair.run()
    assert [(w.wr_id, w.status) for w in _poll_all(a.cq)] == [(1, 0)]
    assert [w.wr_id for w in _poll_all(b.cq)] == [9]


@pytest.mark.parametrize("which", ["unknown", "other-domain"])
@pytest.mark.iba("9.8.5", "11.6.3.2")
def test_bad_xrceth_is_a_remote_access_error(pair: Pair, which: str) -> None:
    """Annex A14: an XRCSRQ naming no SRQ, or an SRQ of another XRC domain, is NAKed with
    Remote Access Error; the TGT QP goes to ERR with QP_ACCESS_ERR; nothing is delivered."""
    a, b = pair.a, pair.b
    other = v.XrcSRQ(b.pd, v.XRCD(b.ctx), b.cq, v.SrqInitAttr(v.SrqAttr(4, 1)))
    other.post_recv(v.RecvWR(77, 1, [b.sge(0, 64)]))
    srqn = 0xFFFF00 if which == "unknown" else other.srq_num
    a.ini.post_send(_send(a, 1, 0, 64, srqn))
    pair.run()
    wcs = _poll_all(a.cq)
    assert [(w.wr_id, w.status) for w in wcs] == [(1, e.IBV_WC_REM_ACCESS_ERR)]
    assert b.tgt.qp_state == e.IBV_QPS_ERR and _poll_all(b.cq) == []
    events = []
    while True:
        try:
            ev = b.ctx.get_async_event(timeout=0)
        except TimeoutError:
            break
        events.append((ev.event_type, ev.element))
    assert (e.IBV_EVENT_QP_ACCESS_ERR, b.tgt) in events


@pytest.mark.iba("9.8.5", "9.6.1.2")
def test_wrong_direction_and_transport_are_dropped(pair: Pair) -> None:
    """A request to an INI QP and an RC packet to a TGT QP are dropped and counted."""
    a, b = pair.a, pair.b
    port = ib_port(b.ctx)
    before = b.ctx.counters()["rcvd_bad_opcode"]
    meta = RxMeta(bytes(a.gid().raw), bytes(b.gid().raw))
    req = xrc_request_header(bytes(wib.encode_headers(wib.IBPacket(0x04, dqpn=b.ini.qp_num))),
                             b.srqs[0].srq_num)
    rc = bytes(wib.encode_headers(wib.IBPacket(0x04, dqpn=b.tgt.qp_num, psn=0xFFFFF0)))
    with b.ctx.runtime.lock:
        port.receive(memoryview(req), meta, 0.0)
        port.receive(memoryview(rc), meta, 0.0)
    assert b.ctx.counters()["rcvd_bad_opcode"] == before + 2


# ---- verbs ---------------------------------------------------------------------------------------
def test_xrcd_file_domains(tmp_path: Path) -> None:
    ctx = v.Context(fabric=Fabric(VirtualClock()).link("10.5.1.1"))
    path = tmp_path / "xrcd"
    fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o400)
    fd2 = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(InvalidArgument, match="O_CREAT"):
            v.XRCD(ctx, fd, 0)
        x1 = v.XRCD(ctx, fd, os.O_CREAT)
        x2 = v.XRCD(ctx, fd2, 0)  # the same file: the same domain
        assert x1.domain is x2.domain and v.XRCD(ctx).domain is not x1.domain
        with pytest.raises(InvalidArgument, match="O_EXCL"):
            v.XRCD(ctx, fd2, os.O_CREAT | os.O_EXCL)
        with pytest.raises(InvalidArgument, match="fd"):
            v.XRCD(ctx, 100000, os.O_CREAT)
    finally:
        os.close(fd)
        os.close(fd2)
        ctx.close()


def test_xrc_verbs_arguments_and_lifetime(pair: Pair) -> None:
    a = pair.a
    with pytest.raises(InvalidArgument, match="init_attr.qp_type"):
        v.QP(a.xrcd, v.QPInitAttr(qp_type=int(e.IBV_QPT_RC)))
    with pytest.raises(InvalidArgument, match="qp"):
        a.tgt.post_send(v.SendWR(1, sg=[a.sge(0, 8)]))
    with pytest.raises(InvalidArgument, match="qp"):
        a.ini.post_recv(v.RecvWR(1, 1, [a.sge(0, 8)]))
    with pytest.raises(InvalidArgument, match="wr.remote_srqn"):
        a.ini.post_send(_send(a, 1, 0, 8, 1 << 24))
    with pytest.raises(InvalidArgument, match="cq"):
        v.XrcSRQ(a.pd, a.xrcd, None, v.SrqInitAttr())  # type: ignore[arg-type]
    assert a.ctx.query_device().device_cap_flags & e.IBV_DEVICE_XRC
    # ibv_open_qp: a second handle on the TGT QP; closing it leaves the QP
    h = v.QP.open(a.xrcd, a.tgt.qp_num)
    assert h.qp_num == a.tgt.qp_num and h.qp_state == a.tgt.qp_state
    h.close()
    assert a.tgt.qp_state == e.IBV_QPS_RTS
    with pytest.raises(InvalidArgument, match="qp_num"):
        v.QP.open(a.xrcd, 0xABCDE)
    # closing the XRCD closes its SRQs and TGT QPs
    srqn = a.srqs[0].srq_num
    a.xrcd.close()
    assert a.tgt.closed and a.srqs[0].closed
    assert srqn not in srq_table(ib_port(a.ctx)).by_srqn


# ---- captures: pcap-check and tshark -----------------------------------------------------------
def test_capture_passes_pcap_check_and_tshark_names_the_xrc_opcodes(pair: Pair,
                                                                    tmp_path: Path) -> None:
    a, b = pair.a, pair.b
    cap = tmp_path / "xrc.pcap"
    pair.fab.capture(cap)
    b.srqs[0].post_recv(v.RecvWR(1, 1, [b.sge(0, 4096)]))
    a.ini.post_send(_send(a, 1, 0, 1500, b.srqs[0].srq_num))
    w = _send(a, 2, 0, 8, b.srqs[0].srq_num, int(e.IBV_WR_ATOMIC_FETCH_AND_ADD))
    w.set_wr_atomic(b.mr.rkey, b.mr.addr + 8192, 1)
    a.ini.post_send(w)
    w = _send(a, 3, 100, 300, b.srqs[0].srq_num, int(e.IBV_WR_RDMA_READ))
    w.set_wr_rdma(b.mr.rkey, b.mr.addr)
    a.ini.post_send(w)
    pair.run()
    pair.fab.stop_capture()
    out = io.StringIO()
    assert pcap_check.run([str(cap)], out) == 0, out.getvalue()
    assert "0 failed" in out.getvalue()
    if shutil.which("tshark") is None:
        pytest.skip("tshark is not installed")
    res = subprocess.run(["tshark", "-r", str(cap), "-T", "fields", "-e", "infiniband.bth.opcode",
                          "-e", "infiniband.bth.destqp", "-e", "infiniband.vendor"],
                         capture_output=True, text=True, timeout=60, check=True)
    rows = [line.split("\t") for line in res.stdout.splitlines()]
    ops = [int(r[0]) for r in rows]
    # SEND FIRST/MIDDLE/LAST (MTU 256), FETCH_ADD, READ REQUEST, the ACK, the atomic
    # ACK and the READ response FIRST/LAST
    assert {0xA0, 0xA1, 0xA2, 0xB4, 0xAC, 0xB1, 0xB2, 0xAD, 0xAF} <= set(ops), ops
    xrceth = pack_xrceth(b.srqs[0].srq_num).hex()
    for r, op in zip(rows, ops, strict=True):
        if OPCODES[op].is_request:
            # tshark 4.0 names the XRC opcodes but leaves the headers after the BTH
            # undissected: the bytes it shows start with our XRCETH
            assert int(r[1], 16) == b.tgt.qp_num and r[2].split(",")[0] == xrceth
        else:
            assert int(r[1], 16) == a.ini.qp_num
