"""Memory windows in the native API (issue 14): ``v.MW``, ``QP.bind_mw`` (type 1) and the
BIND_MW work request (type 2) give a peer RDMA access under the window's R_Key, a rebind
or invalidation revokes the old key, bad binds complete with MW_BIND_ERR, and
``query_device``/``devinfo`` report rxe's ``max_mw`` and the MW capability flags."""

from __future__ import annotations

import pytest
from harness.verbs_pair import UD, FabricPair, Side

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.errors import InvalidArgument, NotSupported
from softrdma.tools.ibverbs import devinfo

W = e.ibv_wr_opcode
ACC_BIND = int(e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
               | e.IBV_ACCESS_MW_BIND)
REMOTE_RW = int(e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ)


@pytest.fixture()
def fp():
    p = FabricPair()
    yield p
    p.close()


def _wc(p: FabricPair, side: Side) -> v.WC:
    p.run()
    n, wcs = side.cq.poll(1)
    assert n == 1
    return wcs[0]


def _write(p: FabricPair, data: bytes, rkey: int, addr: int) -> v.WC:
    a = p.a
    a.buf[:len(data)] = data
    w = v.SendWR(7, sg=[a.sge(0, len(data))], opcode=int(W.IBV_WR_RDMA_WRITE))
    w.set_wr_rdma(rkey, addr)
    a.qp.post_send(w)
    return _wc(p, a)


def _bind_mr(p: FabricPair) -> v.MR:
    b = p.b
    return v.MR(b.pd, 0, ACC_BIND, buffer=b.buf)


@pytest.mark.iba("10.6.7", "10.6.7.2.1")
def test_type1_bind_grants_access_to_its_range(fp: FabricPair) -> None:
    b = fp.b
    mr = _bind_mr(fp)
    mw = v.MW(b.pd, v.MW_TYPE_1)
    old = mw.rkey
    key = b.qp.bind_mw(mw, v.MWBindInfo(mr, mr.addr + 100, 50, REMOTE_RW), wr_id=9)
    assert key == mw.rkey == v.inc_rkey(old) and key >> 8 == old >> 8
    wc = _wc(fp, b)
    assert (wc.status, wc.opcode, wc.wr_id) == (e.IBV_WC_SUCCESS, e.IBV_WC_BIND_MW, 9)
    assert _write(fp, b"window", key, mr.addr + 120).status == e.IBV_WC_SUCCESS
    assert bytes(b.buf[120:126]) == b"window"
    # outside the window's 50 bytes: remote access error
    assert _write(fp, b"x" * 8, key, mr.addr + 148).status == e.IBV_WC_REM_ACCESS_ERR


@pytest.mark.iba("10.6.7")
def test_rebind_revokes_the_old_key(fp: FabricPair) -> None:
    b = fp.b
    mr = _bind_mr(fp)
    mw = v.MW(b.pd, v.MW_TYPE_1)
    key = b.qp.bind_mw(mw, v.MWBindInfo(mr, mr.addr, 64, REMOTE_RW))
    _wc(fp, b)
    b.qp.bind_mw(mw, v.MWBindInfo(mr, mr.addr, 64, REMOTE_RW))
    _wc(fp, b)
    assert _write(fp, b"stale", key, mr.addr).status == e.IBV_WC_REM_ACCESS_ERR


@pytest.mark.iba("10.6.7.2")
def test_type2_bind_work_request_and_errors(fp: FabricPair) -> None:
    b = fp.b
    mr = _bind_mr(fp)
    mw = v.MW(b.pd, v.MW_TYPE_2)
    w = v.SendWR(3, opcode=int(W.IBV_WR_BIND_MW))
    w.set_bind_wr(mw, v.MWBindInfo(mr, mr.addr + 8, 32, REMOTE_RW))
    w.rkey = v.inc_rkey(mw.rkey)
    b.qp.post_send(w)
    assert _wc(fp, b).status == e.IBV_WC_SUCCESS
    assert mw.rkey == w.rkey
    assert _write(fp, b"two", mw.rkey, mr.addr + 8).status == e.IBV_WC_SUCCESS
    assert bytes(b.buf[8:11]) == b"two"
    # a type 2 window still bound cannot be bound again: MW_BIND_ERR
    again = v.SendWR(4, opcode=int(W.IBV_WR_BIND_MW))
    again.set_bind_wr(mw, v.MWBindInfo(mr, mr.addr, 8, REMOTE_RW))
    again.rkey = v.inc_rkey(mw.rkey)
    b.qp.post_send(again)
    assert _wc(fp, b).status == e.IBV_WC_MW_BIND_ERR


@pytest.mark.iba("10.6.7")
def test_bind_without_mw_bind_access_fails(fp: FabricPair) -> None:
    b = fp.b
    mw = v.MW(b.pd, v.MW_TYPE_1)
    b.qp.bind_mw(mw, v.MWBindInfo(b.mr, b.mr.addr, 16, REMOTE_RW))  # MR lacks MW_BIND
    assert _wc(fp, b).status == e.IBV_WC_MW_BIND_ERR


def test_argument_checks(fp: FabricPair) -> None:
    b = fp.b
    mr = _bind_mr(fp)
    with pytest.raises(InvalidArgument, match="mw_type"):
        v.MW(b.pd, 3)
    mw2 = v.MW(b.pd, v.MW_TYPE_2)
    with pytest.raises(InvalidArgument, match="type 1"):
        b.qp.bind_mw(mw2, v.MWBindInfo(mr, mr.addr, 8, REMOTE_RW))
    mw1 = v.MW(b.pd, v.MW_TYPE_1)
    w = v.SendWR(1, opcode=int(W.IBV_WR_BIND_MW))
    w.set_bind_wr(mw1, v.MWBindInfo(mr, mr.addr, 8, REMOTE_RW))
    with pytest.raises(InvalidArgument, match="type 2"):
        b.qp.post_send(w)
    with pytest.raises(InvalidArgument, match="bind_info.mr"):
        v.MWBindInfo(None, 0, 8, REMOTE_RW)
    mw1.close()
    with pytest.raises(InvalidArgument, match="open MW"):
        b.qp.bind_mw(mw1, v.MWBindInfo(mr, mr.addr, 8, REMOTE_RW))
    ud = FabricPair(UD)
    try:
        mw = v.MW(ud.b.pd, v.MW_TYPE_1)
        with pytest.raises(InvalidArgument, match="RC and UC"):
            ud.b.qp.bind_mw(mw, v.MWBindInfo(None, 0, 0, 0))
    finally:
        ud.close()


def test_iwarp_has_no_memory_windows() -> None:
    ctx = v.Context("softrdma_iw_lo", transport="iwarp")
    try:
        assert ctx.query_device().max_mw == 0
        with pytest.raises(NotSupported):
            v.MW(v.PD(ctx), v.MW_TYPE_1)
    finally:
        ctx.close()


def test_device_limits_and_devinfo(fp: FabricPair) -> None:
    d = fp.a.ctx.query_device()
    assert d.max_mw == 0x1000  # rxe RXE_MAX_MW
    assert d.device_cap_flags & e.IBV_DEVICE_MEM_WINDOW
    assert d.device_cap_flags & e.IBV_DEVICE_MEM_WINDOW_TYPE_2B
    text = "\n".join(devinfo._verbose_device_lines(d))
    assert "\tmax_mw:\t\t\t\t4096" in text and "MEM_WINDOW_TYPE_2B" in text
