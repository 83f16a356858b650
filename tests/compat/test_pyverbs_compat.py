"""The pyverbs compatibility layer: query shapes, libibverbs errno values, object
lifetimes and the data path (send/recv with immediate, RDMA write through memory
windows, atomic write, implicit on-demand paging, the extended post-send API), on a
private registry device over loopback."""

from __future__ import annotations

import errno
import gc
import socket
import time
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
from harness.ports import free_port
from harness.pyverbs import first_wc, rc_to_rts

from softrdma.compat.pyverbs import device as d
from softrdma.compat.pyverbs import enums as e
from softrdma.compat.pyverbs import mem_alloc
from softrdma.compat.pyverbs.addr import AH, AHAttr, GlobalRoute
from softrdma.compat.pyverbs.base import inc_rkey
from softrdma.compat.pyverbs.cq import CQ, CQEX, CompChannel, CqInitAttrEx, PollCqAttr
from softrdma.compat.pyverbs.mr import DMMR, MR, MW, MWBind, MWBindInfo
from softrdma.compat.pyverbs.pd import PD, ParentDomain, ParentDomainInitAttr
from softrdma.compat.pyverbs.pyverbs_error import PyverbsRDMAError, PyverbsUserError
from softrdma.compat.pyverbs.qp import QP, QPAttr, QPCap, QPEx, QPInitAttr, QPInitAttrEx
from softrdma.compat.pyverbs.srq import SRQ, SrqAttr, SrqInitAttr
from softrdma.compat.pyverbs.wr import SGE, RecvWR, SendWR
from softrdma.compat.pyverbs.xrcd import XRCD, XRCDInitAttr
from softrdma.drivers.host import registry


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    mp = pytest.MonkeyPatch()
    mp.setenv("SOFTRDMA_STATE_DIR", str(tmp_path_factory.mktemp("state")))
    mp.setenv("SOFTRDMA_PYVERBS_DEVICE", "pv0")
    registry.add("pv0", "lo", "roce", free_port())
    yield "pv0"
    mp.undo()


@pytest.fixture()
def ctx(dev: str) -> Iterator[d.Context]:
    c = d.Context(name=dev)
    yield c
    c.close()


def _err(fn: Any, *args: Any, **kw: Any) -> int:
    with pytest.raises(PyverbsRDMAError) as ei:
        fn(*args, **kw)
    return ei.value.error_code


# ---- device, port, GIDs -----------------------------------------------------------------------
def test_device_list_and_query_shapes(ctx: d.Context, dev: str) -> None:
    devs = d.get_device_list()
    assert devs[0].name == dev.encode()  # $SOFTRDMA_PYVERBS_DEVICE comes first
    assert devs[0].node_type == e.IBV_NODE_CA and devs[0].transport_type == e.IBV_TRANSPORT_IB
    attr = ctx.query_device()
    assert attr.node_guid and attr.max_qp > 0 and attr.phys_port_cnt == 1
    assert attr.device_cap_flags & e.IBV_DEVICE_MEM_WINDOW and attr.max_mw > 0
    ex = ctx.query_device_ex()
    assert ex.orig_attr.max_cqe == attr.max_cqe and ex.max_dm_size == d.MAX_DM_SIZE
    assert ex.odp_caps.general_caps & e.IBV_ODP_SUPPORT_IMPLICIT
    port = ctx.query_port(1)
    assert port.state == e.IBV_PORT_ACTIVE and port.link_layer == e.IBV_LINK_LAYER_ETHERNET
    assert port.gid_tbl_len == d.GID_TABLE_LEN and "Invalid" not in d.translate_mtu(port.active_mtu)
    gid = ctx.query_gid(1, 0)
    assert gid.gid == "0000:0000:0000:0000:0000:ffff:7f00:0001"
    assert ctx.query_gid_type(1, 0) == e.IBV_GID_TYPE_SYSFS_ROCE_V2
    assert ctx.query_gid(1, 1000).gid.replace("0", "").replace(":", "") == ""
    entry = ctx.query_gid_ex(1, 0)
    assert entry.gid_type == 2 and entry.gid_str() == gid.gid and entry.ndev_ifindex > 0
    table = ctx.query_gid_table(d.GID_TABLE_LEN)
    assert [t.gid_index for t in table] == list(range(len(table)))


def test_device_errno(ctx: d.Context) -> None:
    with pytest.raises(PyverbsRDMAError, match="Failed to query port.*Invalid argument"):
        ctx.query_port(2)
    assert _err(ctx.query_gid_ex, 1, 1000) == errno.ENODATA
    assert _err(ctx.query_gid, 1, d.GID_TABLE_LEN) == errno.EINVAL
    assert _err(ctx.query_gid_table, 0) == -errno.EINVAL
    assert _err(d.Context, name="no-such-device") == errno.ENODEV
    with pytest.raises(PyverbsUserError):
        d.Context()


# ---- errno of invalid calls ------------------------------------------------------------------
def test_create_errno(ctx: d.Context) -> None:
    pd = PD(ctx)
    max_cqe = ctx.query_device().max_cqe
    assert _err(CQ, ctx, max_cqe + 1, None, None, 0) == errno.EINVAL
    assert _err(CQ, ctx, 10, None, None, ctx.num_comp_vectors) == errno.EINVAL
    assert CQ(ctx, max_cqe / 2, None, None, 0).cqe == max_cqe // 2  # pyverbs truncates
    assert _err(MR, pd, 4096, e.IBV_ACCESS_REMOTE_WRITE) == errno.EINVAL
    assert _err(MR, pd, 4096, e.IBV_ACCESS_REMOTE_ATOMIC) == errno.EINVAL
    cq = CQ(ctx, 16)
    raw = QPInitAttr(qp_type=e.IBV_QPT_RAW_PACKET, scq=cq, rcq=cq, cap=QPCap())
    assert _err(QP, pd, raw) == errno.EOPNOTSUPP
    big = QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap(max_send_wr=0xFFFFFFFF))
    assert _err(QP, pd, big) == errno.EINVAL
    # ibv_open_xrcd: FD and OFLAGS both required (EINVAL), reserved mask bits EOPNOTSUPP
    assert _err(XRCD, ctx, XRCDInitAttr(e.IBV_XRCD_INIT_ATTR_FD, 0, -1)) == errno.EINVAL
    assert _err(XRCD, ctx, XRCDInitAttr(e.IBV_XRCD_INIT_ATTR_RESERVED | 3, 0, -1)) == \
        errno.EOPNOTSUPP
    assert _err(MW, pd, 3) == errno.EINVAL
    assert _err(AH, pd, attr=AHAttr(is_global=0, port_num=1)) == errno.EINVAL
    cvlan = CqInitAttrEx(cqe=8, wc_flags=e.IBV_WC_EX_WITH_CVLAN)
    assert _err(CQEX, ctx, cvlan) == errno.EOPNOTSUPP
    assert _err(CQEX, ctx, CqInitAttrEx(cqe=max_cqe + 1)) == errno.EINVAL
    with pytest.raises(PyverbsUserError):
        RecvWR(num_sge=0)
    ops = QPInitAttrEx(qp_type=e.IBV_QPT_UD, scq=cq, rcq=cq, pd=pd, cap=QPCap(),
                       comp_mask=e.IBV_QP_INIT_ATTR_PD | e.IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
                       send_ops_flags=e.IBV_QP_EX_WITH_RDMA_WRITE)
    assert _err(QPEx, ctx, ops) == errno.EOPNOTSUPP


def test_qp_state_and_queue_errno(ctx: d.Context) -> None:
    pd = PD(ctx)
    cq = CQ(ctx, 64)
    mr = MR(pd, 4096, e.IBV_ACCESS_LOCAL_WRITE)
    qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_UD, scq=cq, rcq=cq, cap=QPCap(4, 4, 1, 1)))
    assert qp.qp_state == e.IBV_QPS_RESET
    recv = RecvWR(sg=[SGE(mr.buf, 64, mr.lkey)], num_sge=1)
    assert _err(qp.post_recv, recv) == errno.EINVAL  # RESET
    # RESET -> RTR skips INIT: ib_modify_qp_is_ok refuses it
    assert _err(qp.modify, QPAttr(qp_state=e.IBV_QPS_RTR), e.IBV_QP_STATE) == errno.EINVAL
    attr = QPAttr()
    attr.qkey = 0x1234
    qp.to_rts(attr)
    assert qp.qp_state == e.IBV_QPS_RTS and qp.query(e.IBV_QP_QKEY)[0].qkey == 0x1234
    for _ in range(4):
        qp.post_recv(recv)
    assert _err(qp.post_recv, recv) == errno.ENOMEM  # the RQ is full
    two = RecvWR(sg=[SGE(mr.buf, 8, mr.lkey), SGE(mr.buf + 8, 8, mr.lkey)], num_sge=2)
    assert _err(qp.post_recv, two) == errno.EINVAL  # more SGEs than max_recv_sge
    rc = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap()), QPAttr())
    assert rc.qp_state == e.IBV_QPS_INIT  # pyverbs moves RC QPs to INIT
    cap = rc.query(e.IBV_QP_CAP)[1].cap
    assert (cap.max_send_wr, cap.max_recv_wr) == (1, 10)


def test_rereg_mr_checks(ctx: d.Context) -> None:
    pd = PD(ctx)
    mr = MR(pd, 4096, e.IBV_ACCESS_LOCAL_WRITE)
    assert _err(mr.rereg, 0) == errno.EINVAL
    assert _err(mr.rereg, e.IBV_REREG_MR_CHANGE_ACCESS, access=e.IBV_ACCESS_REMOTE_WRITE) \
        == errno.EINVAL
    key = mr.lkey
    pd2 = PD(ctx)
    mr.rereg(e.IBV_REREG_MR_CHANGE_PD | e.IBV_REREG_MR_CHANGE_ACCESS, pd2,
             access=e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_READ)
    assert mr.lkey == key and mr.pd is pd2 and mr.access & e.IBV_ACCESS_REMOTE_READ
    pd2.close()  # the re-registered MR now belongs to pd2 and closes with it
    assert mr.closed and not pd.closed


def test_device_memory(ctx: d.Context) -> None:
    dm = d.DM(ctx, d.AllocDmAttr(256))
    dm.copy_to_dm(4, b"abcd", 4)
    assert dm.copy_from_dm(4, 4) == b"abcd"
    assert _err(dm.copy_to_dm, 3, b"abcd", 4) == errno.EINVAL  # 4-byte alignment
    assert _err(dm.copy_from_dm, 252, 8) == errno.EINVAL  # past the end
    with pytest.raises(PyverbsRDMAError, match="Max available size"):
        d.DM(ctx, d.AllocDmAttr(d.MAX_DM_SIZE))  # 256 bytes are already taken
    assert _err(d.DM, ctx, d.AllocDmAttr(64, 0, 1)) == errno.EINVAL  # comp_mask
    pd = PD(ctx)
    zb = e.IBV_ACCESS_ZERO_BASED | e.IBV_ACCESS_LOCAL_WRITE
    assert _err(DMMR, pd, 64, e.IBV_ACCESS_LOCAL_WRITE, dm, 0) == errno.EINVAL
    assert _err(DMMR, pd, 200, zb, dm, 64) == errno.EINVAL
    mr = DMMR(pd, 64, zb, dm, 64)
    region = ctx.port.lookup_mr(mr.lkey)
    assert mr.buf == 0 and region is not None and region.zero_based
    mr.write(b"wxyz", 4, 4)
    assert dm.copy_from_dm(68, 4) == b"wxyz" and mr.read(4, 4) == b"wxyz"
    dm.close()
    assert mr.closed and not pd.closed


# ---- lifetimes ----------------------------------------------------------------------------------
def test_closing_pd_closes_its_objects(ctx: d.Context) -> None:
    pd = PD(ctx)
    cq = CQ(ctx, 8)
    mr = MR(pd, 4096, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_MW_BIND)
    mw = MW(pd, e.IBV_MW_TYPE_2)
    qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap()))
    srq = SRQ(pd, SrqInitAttr(SrqAttr(16, 1)))
    ah = AH(pd, attr=AHAttr(is_global=1, port_num=1, gr=GlobalRoute(ctx.query_gid(1, 0))))
    lkey = mr.lkey
    pd.close()
    assert all(o.closed for o in (pd, mr, mw, qp, srq, ah)) and not cq.closed
    assert ctx.port.lookup_mr(lkey) is None
    pd.close()  # idempotent, as pyverbs
    with pytest.raises(Exception):  # noqa: B017 - any error: the MR is gone
        _ = mr.buf


def test_context_close_cascades(dev: str) -> None:
    c = d.Context(name=dev)
    pd = PD(c)
    ch = CompChannel(c)
    cq = CQ(c, 8, None, ch, 0)
    mr = MR(pd, 64, e.IBV_ACCESS_LOCAL_WRITE)
    par = ParentDomain(c, ParentDomainInitAttr(pd=pd))
    qp = QP(par, QPInitAttr(qp_type=e.IBV_QPT_UD, scq=cq, rcq=cq, cap=QPCap()))
    # a parent domain's objects are checked against its PD
    assert qp.engine.pd is pd.protection_domain
    with c:
        pass
    assert all(o.closed for o in (c, pd, ch, cq, mr, par, qp))
    assert c.runtime.closed


def test_a_dropped_context_is_collected(dev: str) -> None:
    """A context dropped unclosed, a parent domain's QP on it, is collected at once and
    closes its device (the engine holds PD tokens and weak CQ sinks, not the objects)."""
    def drop() -> tuple[weakref.ref[d.Context], Any]:
        c = d.Context(name=dev)
        pd = PD(c)
        cq = CQ(c, 8, None, CompChannel(c), 0)
        MR(pd, 64, e.IBV_ACCESS_LOCAL_WRITE)
        par = ParentDomain(c, ParentDomainInitAttr(pd=pd))
        QP(par, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap()))
        return weakref.ref(c), c.runtime
    dropped = [drop() for _ in range(3)]
    gc.collect()
    assert [ref() for ref, _ in dropped] == [None] * 3
    assert all(runtime.closed for _, runtime in dropped)


# ---- data path ------------------------------------------------------------------------------------
class Side:
    """One RC (or UD) endpoint: context, PD, CQ, a 4 KiB MR and a QP."""

    def __init__(self, dev: str, qp_type: int = e.IBV_QPT_RC, ex_ops: int = 0,
                 mr_access: int = 0, implicit: bool = False) -> None:
        self.ctx = d.Context(name=dev)
        self.pd = PD(self.ctx)
        self.cq = CQ(self.ctx, 64)
        acc = e.IBV_ACCESS_LOCAL_WRITE | mr_access
        self.mr = MR(self.pd, 4096, acc, implicit=implicit)
        qa = QPAttr()
        qa.qp_access_flags = (e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
                              | e.IBV_ACCESS_REMOTE_ATOMIC)
        qa.qkey = 0x11111111
        cap = QPCap(16, 16, 2, 2)
        if ex_ops:
            ia = QPInitAttrEx(qp_type=qp_type, scq=self.cq, rcq=self.cq, pd=self.pd, cap=cap,
                              comp_mask=e.IBV_QP_INIT_ATTR_PD | e.IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
                              send_ops_flags=ex_ops)
            self.qp: Any = QPEx(self.ctx, ia, qa)
        else:
            self.qp = QP(self.pd, QPInitAttr(qp_type=qp_type, scq=self.cq, rcq=self.cq,
                                             cap=cap), qa)

    def connect(self, peer: Side) -> None:
        rc_to_rts(self.ctx, self.qp, peer.qp)

    def wc(self, timeout: float = 10.0) -> Any:
        return first_wc(self.cq, timeout)

    def close(self) -> None:
        self.ctx.close()


@pytest.fixture()
def pair(request: pytest.FixtureRequest, dev: str) -> Iterator[tuple[Side, Side]]:
    kw = getattr(request, "param", {})
    a, b = Side(dev, **kw), Side(dev, **kw)
    if kw.get("qp_type", e.IBV_QPT_RC) == e.IBV_QPT_RC:
        a.connect(b)
        b.connect(a)
    yield a, b
    a.close()
    b.close()


@pytest.mark.iba("9.3.7")
def test_send_with_immediate_byte_order(pair: tuple[Side, Side]) -> None:
    a, b = pair
    b.qp.post_recv(RecvWR(wr_id=7, sg=[SGE(b.mr.buf, 64, b.mr.lkey)], num_sge=1))
    a.mr.write(b"hello pyverbs", 13)
    wr = SendWR(wr_id=3, opcode=e.IBV_WR_SEND_WITH_IMM, num_sge=1,
                sg=[SGE(a.mr.buf, 13, a.mr.lkey)])
    wr.imm_data = socket.htonl(1234)  # the raw __be32 field, as pyverbs programs set it
    a.qp.post_send(wr)
    sw = a.wc()
    assert (sw.wr_id, sw.status, sw.opcode) == (3, e.IBV_WC_SUCCESS, e.IBV_WC_SEND)
    rw = b.wc()
    assert rw.status == e.IBV_WC_SUCCESS and rw.byte_len == 13 and rw.wr_id == 7
    assert rw.wc_flags & e.IBV_WC_WITH_IMM and socket.ntohl(rw.imm_data) == 1234
    assert b.mr.read(13, 0) == b"hello pyverbs"


@pytest.mark.parametrize("pair", [{"mr_access": e.IBV_ACCESS_MW_BIND}], indirect=True)
@pytest.mark.iba("10.6.7")
def test_memory_windows(pair: tuple[Side, Side]) -> None:
    a, b = pair
    # type 2, bound with a BIND_MW work request; remote writes go through its key
    mw = MW(b.pd, e.IBV_MW_TYPE_2)
    old = mw.rkey
    bind = SendWR(opcode=e.IBV_WR_BIND_MW)
    bind.set_bind_wr(mw, MWBindInfo(b.mr, b.mr.buf, 256, e.IBV_ACCESS_REMOTE_WRITE))
    b.qp.post_send(bind)
    w = b.wc()
    assert (w.status, w.opcode) == (e.IBV_WC_SUCCESS, e.IBV_WC_BIND_MW)
    assert bind.rkey == inc_rkey(old) and mw.rkey == bind.rkey
    a.mr.write(b"window", 6)
    write = SendWR(opcode=e.IBV_WR_RDMA_WRITE, num_sge=1, sg=[SGE(a.mr.buf, 6, a.mr.lkey)])
    write.set_wr_rdma(mw.rkey, b.mr.buf + 16)
    a.qp.post_send(write)
    assert a.wc().status == e.IBV_WC_SUCCESS and b.mr.read(6, 16) == b"window"
    # outside the window: remote access error
    write.set_wr_rdma(mw.rkey, b.mr.buf + 300)
    a.qp.post_send(write)
    assert a.wc().status == e.IBV_WC_REM_ACCESS_ERR


@pytest.mark.parametrize("pair", [{"mr_access": e.IBV_ACCESS_MW_BIND}], indirect=True)
@pytest.mark.iba("10.6.7")
def test_type1_window_bind_and_dealloc(pair: tuple[Side, Side]) -> None:
    a, b = pair
    mw = MW(b.pd, e.IBV_MW_TYPE_1)
    old = mw.rkey
    b.qp.bind_mw(mw, MWBind(MWBindInfo(b.mr, b.mr.buf, 64, e.IBV_ACCESS_REMOTE_WRITE),
                            e.IBV_SEND_SIGNALED))
    assert mw.rkey == inc_rkey(old) and b.wc().opcode == e.IBV_WC_BIND_MW
    write = SendWR(opcode=e.IBV_WR_RDMA_WRITE, num_sge=1, sg=[SGE(a.mr.buf, 8, a.mr.lkey)])
    write.set_wr_rdma(mw.rkey, b.mr.buf)
    a.qp.post_send(write)
    assert a.wc().status == e.IBV_WC_SUCCESS
    mw.close()  # the key stops working
    a.qp.post_send(write)
    assert a.wc().status == e.IBV_WC_REM_ACCESS_ERR


@pytest.mark.parametrize("pair", [{"ex_ops": e.IBV_QP_EX_WITH_ATOMIC_WRITE
                                   | e.IBV_QP_EX_WITH_SEND_WITH_IMM,
                                   "mr_access": e.IBV_ACCESS_REMOTE_WRITE}], indirect=True)
def test_extended_post_send_and_atomic_write(pair: tuple[Side, Side]) -> None:
    a, b = pair
    qp = a.qp
    qp.wr_start()
    qp.wr_id, qp.wr_flags = 0x55, e.IBV_SEND_SIGNALED
    qp.wr_atomic_write(b.mr.rkey, b.mr.buf + 8, b"ABCDEFGH")
    qp.wr_complete()
    w = a.wc()
    assert (w.wr_id, w.status, w.opcode) == (0x55, e.IBV_WC_SUCCESS, e.IBV_WC_ATOMIC_WRITE)
    assert b.mr.read(8, 8) == b"ABCDEFGH"
    qp.wr_start()
    qp.wr_atomic_write(b.mr.rkey, b.mr.buf + 4, b"12345678")  # unaligned: rejected
    assert _err(qp.wr_complete) == errno.EINVAL
    b.qp.post_recv(RecvWR(sg=[SGE(b.mr.buf, 16, b.mr.lkey)], num_sge=1))
    qp.wr_start()
    qp.wr_flags = e.IBV_SEND_SIGNALED
    qp.wr_send_imm(99)  # the extended API takes host order
    qp.wr_set_sge(SGE(a.mr.buf, 4, a.mr.lkey))
    qp.wr_complete()
    assert a.wc().status == e.IBV_WC_SUCCESS
    assert socket.ntohl(b.wc().imm_data) == 99


@pytest.mark.parametrize("pair", [{"mr_access": e.IBV_ACCESS_ON_DEMAND, "implicit": True}],
                         indirect=True)
def test_implicit_odp_mr_reaches_any_mapped_memory(pair: tuple[Side, Side]) -> None:
    a, b = pair
    assert a.mr.length == (1 << 64) - 1
    buf = mem_alloc.posix_memalign(4096, 4096)  # memory that was never registered
    try:
        b.qp.post_recv(RecvWR(sg=[SGE(buf, 32, b.mr.lkey)], num_sge=1))
        a.mr.write(b"on demand", 9)
        a.qp.post_send(SendWR(num_sge=1, sg=[SGE(a.mr.buf, 9, a.mr.lkey)]))
        assert a.wc().status == e.IBV_WC_SUCCESS and b.wc().byte_len == 9
        assert mem_alloc.read(buf, 9) == b"on demand"
        a.pd.advise_mr(e._IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, e._IBV_ADVISE_MR_FLAG_FLUSH,
                       [SGE(a.mr.buf, 64, a.mr.lkey)])
        assert _err(a.pd.advise_mr, 7, 0, [SGE(a.mr.buf, 64, a.mr.lkey)]) == errno.EINVAL
        # an unmapped address fails the work request instead of faulting the process
        a.qp.post_send(SendWR(num_sge=1, sg=[SGE(8, 9, a.mr.lkey)]))
        assert a.wc().status == e.IBV_WC_LOC_PROT_ERR
    finally:
        mem_alloc.free(buf)


def test_cq_ex_polling(dev: str) -> None:
    a = Side(dev, qp_type=e.IBV_QPT_UD)
    try:
        cqx = CQEX(a.ctx, CqInitAttrEx(cqe=16, wc_flags=e.IBV_WC_STANDARD_FLAGS))
        assert cqx.start_poll(PollCqAttr()) == errno.ENOENT
        # a UD QP sending to itself: one completion on each side of the extended CQ
        qp = QP(a.pd, QPInitAttr(qp_type=e.IBV_QPT_UD, scq=cqx, rcq=cqx, cap=QPCap()),
                QPAttr())
        qp.post_recv(RecvWR(wr_id=1, sg=[SGE(a.mr.buf, 128, a.mr.lkey)], num_sge=1))
        ah = AH(a.pd, attr=AHAttr(is_global=1, port_num=1, gr=GlobalRoute(a.ctx.query_gid(1, 0))))
        wr = SendWR(wr_id=2, num_sge=1, sg=[SGE(a.mr.buf + 64, 16, a.mr.lkey)])
        wr.set_wr_ud(ah, qp.qp_num, 0)
        qp.post_send(wr)
        seen: dict[int, tuple[int, int, int]] = {}
        end = time.monotonic() + 10
        while len(seen) < 2 and time.monotonic() < end:
            if cqx.start_poll(PollCqAttr()) == 0:
                rc = 0
                while rc == 0:
                    seen[cqx.wr_id] = (cqx.status, cqx.read_opcode(), cqx.read_byte_len())
                    rc = cqx.poll_next()
                cqx.end_poll()
        assert seen[1] == (e.IBV_WC_SUCCESS, e.IBV_WC_RECV, 16 + 40)
        assert seen[2][:2] == (e.IBV_WC_SUCCESS, e.IBV_WC_SEND)
    finally:
        a.close()


def test_cq_ex_completion_timestamps(dev: str) -> None:
    """IBV_WC_EX_WITH_COMPLETION_TIMESTAMP(_WALLCLOCK): each completion carries the
    device's clock (CLOCK_MONOTONIC ns, ibv_query_rt_values_ex's raw clock) at the time it
    was queued, and the same instant on CLOCK_REALTIME; the device reports the clock
    (completion_timestamp_mask, hca_core_clock 1 GHz); a CQ without the flag has none."""
    a = Side(dev, qp_type=e.IBV_QPT_UD)
    try:
        attr = a.ctx.query_device_ex()
        assert attr.completion_timestamp_mask == (1 << 64) - 1
        assert attr.hca_core_clock == 1_000_000  # kHz
        flags = int(e.IBV_WC_STANDARD_FLAGS | e.IBV_WC_EX_WITH_COMPLETION_TIMESTAMP
                    | e.IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK)
        cqx = CQEX(a.ctx, CqInitAttrEx(cqe=16, wc_flags=flags))
        plain = CQEX(a.ctx, CqInitAttrEx(cqe=16, wc_flags=e.IBV_WC_STANDARD_FLAGS))
        qp = QP(a.pd, QPInitAttr(qp_type=e.IBV_QPT_UD, scq=cqx, rcq=plain, cap=QPCap()),
                QPAttr())
        qp.post_recv(RecvWR(wr_id=1, sg=[SGE(a.mr.buf, 128, a.mr.lkey)], num_sge=1))
        ah = AH(a.pd, attr=AHAttr(is_global=1, port_num=1, gr=GlobalRoute(a.ctx.query_gid(1, 0))))
        wr = SendWR(wr_id=2, num_sge=1, sg=[SGE(a.mr.buf + 64, 16, a.mr.lkey)])
        wr.set_wr_ud(ah, qp.qp_num, 0)
        before_s, before_ns = a.ctx.query_rt_values_ex()
        wall_before = time.time_ns()
        qp.post_send(wr)
        end = time.monotonic() + 10
        while cqx.start_poll(PollCqAttr()) != 0:
            assert time.monotonic() < end
        stamp, wall = cqx.read_timestamp(), cqx.read_completion_wallclock_ns()
        assert cqx.wr_id == 2
        cqx.end_poll()
        after_s, after_ns = a.ctx.query_rt_values_ex()
        assert before_s == after_s == 0 and before_ns <= stamp <= after_ns
        assert wall_before <= wall <= time.time_ns()
        while plain.start_poll(PollCqAttr()) != 0:
            assert time.monotonic() < end
        assert plain.wr_id == 1
        with pytest.raises(PyverbsUserError):
            plain.read_timestamp()
        plain.end_poll()
        assert _err(a.ctx.query_rt_values_ex, 2) == errno.EINVAL
    finally:
        a.close()
