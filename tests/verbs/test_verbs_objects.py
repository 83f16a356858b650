"""Verbs objects: device attributes, GIDs, lifetimes and close cascades, MR registration of
every buffer kind, CQ polling/overrun/notification/channels/asyncio."""

from __future__ import annotations

import asyncio
import ctypes
import errno
import gc
import mmap
import select
import threading

import numpy as np
import pytest
from harness.device import ib_port

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.drivers.links.fabric import Fabric
from softrdma.drivers.runtime.clock import VirtualClock
from softrdma.errors import ClosedError, DeviceError, InvalidArgument, StateError
from softrdma.seam.types import WorkCompletion
from softrdma.verbs.device import gid_table, mtu_enum_for_netdev_mtu

RC, UD = int(e.IBV_QPT_RC), int(e.IBV_QPT_UD)
LW, RW, RR, RA = (int(e.IBV_ACCESS_LOCAL_WRITE), int(e.IBV_ACCESS_REMOTE_WRITE),
                  int(e.IBV_ACCESS_REMOTE_READ), int(e.IBV_ACCESS_REMOTE_ATOMIC))


@pytest.fixture()
def ctx():
    fab = Fabric(VirtualClock())
    c = v.Context(fabric=fab.link("10.2.0.1"))
    yield c
    c.close()


# ---- device -------------------------------------------------------------------------------------
def test_gid_parsing_and_equality() -> None:
    g = v.GID("::ffff:10.0.0.1")
    assert g.raw == bytes(10) + b"\xff\xff" + bytes([10, 0, 0, 1])
    assert v.GID("10.0.0.1") == g == v.GID(g.raw) == v.GID(bytes([10, 0, 0, 1]))
    assert str(v.GID("fe80::1")) == "fe80::1"
    assert g == "::ffff:10.0.0.1" and g != v.GID("::1")
    with pytest.raises(InvalidArgument):
        v.GID("not-a-gid")
    with pytest.raises(InvalidArgument):
        v.GID(b"\x01\x02\x03")


def test_gid_table_order_like_rxe() -> None:
    ll = bytes.fromhex("fe800000000000000000000000000001")
    glob = bytes.fromhex("fd000000000000000000000000000002")
    v4 = bytes([10, 50, 0, 11])
    t = gid_table([v4, glob, ll, v4])
    assert t == [ll, bytes(10) + b"\xff\xff" + v4, glob]  # link-local first, dups removed
    assert gid_table([v4]) == [bytes(10) + b"\xff\xff" + v4]


def test_mtu_enum_like_rxe() -> None:
    assert mtu_enum_for_netdev_mtu(1500) == e.IBV_MTU_1024  # captures README: active 1024
    assert mtu_enum_for_netdev_mtu(65536) == e.IBV_MTU_4096
    assert mtu_enum_for_netdev_mtu(2200) == e.IBV_MTU_2048
    with pytest.raises(DeviceError):
        mtu_enum_for_netdev_mtu(300)


@pytest.mark.iba("11.2.1.2", "11.2.2")
def test_query_device_port_gid(ctx: v.Context) -> None:
    d = ctx.query_device()
    assert d.max_qp_wr == 0x4000 and d.max_sge == 32 and d.max_cqe == (1 << 15) - 1
    assert d.atomic_caps == e.IBV_ATOMIC_HCA and d.phys_port_cnt == 1
    p = ctx.query_port(1)
    assert p.state == e.IBV_PORT_ACTIVE and p.link_layer == 2
    assert p.gid_tbl_len == 1024 and p.max_msg_sz == 1 << 31  # rxe's table size
    assert ctx.query_gid(1, 0) == v.GID("::ffff:10.2.0.1")
    assert ctx.query_gid_type(1, 0) == e.IBV_GID_TYPE_ROCE_V2
    assert ctx.gids == [v.GID("10.2.0.1")]
    assert ctx.query_pkey(1, 0) == 0xFFFF
    assert ctx.query_gid(1, 1) == v.GID(bytes(16))  # an empty entry
    with pytest.raises(InvalidArgument):
        ctx.query_gid_type(1, 1)
    with pytest.raises(InvalidArgument):
        ctx.query_gid(1, 1024)
    with pytest.raises(InvalidArgument):
        ctx.query_port(2)
    assert ctx.counters()["rcvd_pkts"] == 0


def test_bad_progress_mode() -> None:
    fab = Fabric(VirtualClock())
    with pytest.raises(InvalidArgument):
        v.Context(fabric=fab.link("10.2.0.9"), progress="turbo")


# ---- lifetimes ------------------------------------------------------------------------------------
def _stack(ctx: v.Context):
    pd = v.PD(ctx)
    ch = v.CompChannel(ctx)
    cq = v.CQ(ctx, 8, channel=ch)
    mr = v.MR(pd, 64, LW)
    srq = v.SRQ(pd, v.SrqInitAttr(v.SrqAttr(max_wr=4)))
    qp = v.QP(pd, v.QPInitAttr(RC, scq=cq, rcq=cq, srq=srq))
    ah = v.AH(pd, v.AHAttr(gr=v.GlobalRoute(dgid="10.2.0.2")))
    return pd, ch, cq, mr, srq, qp, ah


def test_context_close_cascades(ctx: v.Context) -> None:
    objs = _stack(ctx)
    qp, mr = objs[5], objs[3]
    port = ib_port(ctx)
    assert port.qps[qp.qp_num] is qp.engine and port.lookup_mr(mr.lkey) is not None
    ctx.close()
    assert all(o.closed for o in objs)
    assert qp.qp_num not in port.qps and port.lookup_mr(mr.lkey) is None
    with pytest.raises(ClosedError):
        v.PD(ctx)
    with pytest.raises(ClosedError):
        qp.post_recv(v.RecvWR(1))
    with pytest.raises(ClosedError):
        mr.read(1, 0)
    ctx.close()  # idempotent


@pytest.mark.iba("10.2.3")
def test_pd_close_closes_its_objects_only(ctx: v.Context) -> None:
    pd, ch, cq, mr, srq, qp, ah = _stack(ctx)
    pd.close()
    assert qp.closed and mr.closed and srq.closed and ah.closed
    assert not cq.closed and not ch.closed and not ctx.closed
    assert cq.poll() == (0, [])


def test_cq_srq_channel_close_close_dependents(ctx: v.Context) -> None:
    pd, ch, cq, mr, srq, qp, ah = _stack(ctx)
    srq.close()
    assert qp.closed and not pd.closed and not cq.closed
    qp2 = v.QP(pd, v.QPInitAttr(RC, scq=cq, rcq=cq))
    ch.close()
    assert cq.closed and qp2.closed and not mr.closed
    with pytest.raises(ClosedError):
        cq.poll()


def test_context_manager(ctx: v.Context) -> None:
    with v.PD(ctx) as pd, v.MR(pd, 16, 0) as mr:
        key = mr.lkey
        assert ctx.port.lookup_mr(key) is not None
    assert pd.closed and ctx.port.lookup_mr(key) is None


def test_garbage_collected_objects_release_engine_state(ctx: v.Context) -> None:
    pd = v.PD(ctx)
    cq = v.CQ(ctx, 4)
    mr = v.MR(pd, 32, LW)
    qp = v.QP(pd, v.QPInitAttr(RC, scq=cq, rcq=cq))
    key, qpn = mr.lkey, qp.qp_num
    del mr, qp
    gc.collect()
    ctx.progress()  # deferred releases run at the next engine operation
    assert ctx.port.lookup_mr(key) is None and qpn not in ib_port(ctx).qps


def test_wrong_parent_types(ctx: v.Context) -> None:
    with pytest.raises(InvalidArgument):
        v.PD(object())  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        v.MR(ctx, 16, 0)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        v.CQ(ctx, 0)
    with pytest.raises(InvalidArgument):
        v.CQ(ctx, 1 << 15)
    with pytest.raises(InvalidArgument):
        v.CQ(ctx, 4, comp_vector=1)


# ---- MRs -----------------------------------------------------------------------------------------
def test_mr_bytearray_address_and_rw(ctx: v.Context) -> None:
    pd = v.PD(ctx)
    buf = bytearray(b"abcdefgh" * 8)
    mr = v.MR(pd, 0, LW | RW | RR, buffer=buf)
    real = ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))
    assert mr.addr == real == mr.real_address and mr.length == 64
    assert mr.read(4, 8) == b"abcd"
    mr.write(b"XYZ", 3, 1)
    assert buf[:5] == b"aXYZe"  # in place
    mr.buf[0] = ord("Q")
    assert buf[0] == ord("Q")
    with pytest.raises(InvalidArgument):
        mr.read(8, 60)
    with pytest.raises(InvalidArgument):
        mr.write(b"12", 3)
    em = ctx.port.lookup_mr(mr.lkey)
    assert em is not None and em.rkey == mr.rkey and em.offset_of(real + 10, 4) == 10


def test_mr_mmap_numpy_memoryview(ctx: v.Context) -> None:
    pd = v.PD(ctx)
    mm = mmap.mmap(-1, 4096)
    m1 = v.MR(pd, 4096, LW | RW, buffer=mm)
    assert m1.addr == ctypes.addressof(ctypes.c_char.from_buffer(mm))
    arr = np.arange(32, dtype=np.uint64)
    m2 = v.MR(pd, 0, LW | RA, buffer=arr)
    assert m2.addr == arr.ctypes.data and m2.length == 256
    assert int.from_bytes(m2.read(8, 8), "little") == 1
    m2.write((7).to_bytes(8, "little"), 8, 16)
    assert arr[2] == 7
    big = bytearray(100)
    m3 = v.MR(pd, 10, LW, buffer=memoryview(big)[20:])  # a slice: first 10 bytes of it
    assert m3.length == 10
    assert m3.addr == ctypes.addressof((ctypes.c_char * 100).from_buffer(big)) + 20
    m4 = v.MR(pd, 0, RR | LW, buffer=np.zeros((4, 4), dtype=np.float32))  # 2-D C-contiguous
    assert m4.length == 64
    with pytest.raises(InvalidArgument):
        v.MR(pd, 0, LW, buffer=np.zeros((4, 4))[:, 1])  # not contiguous
    lib = v.MR(pd, 300, LW)
    assert lib.length == 300 and len(lib.buf) == 300
    lib.write(b"hi", 2, 298)
    assert lib.read(2, 298) == b"hi"


def test_mr_access_rules(ctx: v.Context) -> None:
    pd = v.PD(ctx)
    for bad in (RW, RA, RW | RR):
        with pytest.raises(InvalidArgument) as ei:
            v.MR(pd, 16, bad)
        assert ei.value.argument == "access" and ei.value.errno == errno.EINVAL
    with pytest.raises(InvalidArgument):
        v.MR(pd, 16, 1 << 30)
    odp = v.MR(pd, 16, LW | int(e.IBV_ACCESS_ON_DEMAND))  # accepted, as pyverbs does
    assert odp.on_demand and odp.access == LW | int(e.IBV_ACCESS_ON_DEMAND)
    assert not v.MR(pd, 16, LW).on_demand
    ro = b"read only bytes!"
    with pytest.raises(InvalidArgument) as ei:
        v.MR(pd, 0, LW, buffer=ro)
    assert ei.value.errno == errno.EFAULT
    mr = v.MR(pd, 0, RR, buffer=ro)  # remote read of a read-only buffer is fine
    assert mr.read(4, 0) == b"read"
    with pytest.raises(InvalidArgument):
        mr.write(b"x", 1)
    with pytest.raises(InvalidArgument):
        v.MR(pd, 17, LW, buffer=bytearray(16))
    with pytest.raises(InvalidArgument):
        v.MR(pd, 0, LW)
    with pytest.raises(InvalidArgument):
        v.MR(pd, 0, LW, buffer=12)
    zb = v.MR(pd, 64, LW | int(e.IBV_ACCESS_ZERO_BASED))
    assert zb.addr == 0
    custom = v.MR(pd, 64, LW, address=0x10000)
    assert custom.addr == 0x10000


# ---- CQs -----------------------------------------------------------------------------------------
def _wc(i: int, solicited: bool = False, status: int = 0) -> WorkCompletion:
    wc = WorkCompletion(i, status, int(e.IBV_WC_RECV), 0x11)
    wc.solicited = solicited
    return wc


@pytest.mark.iba("11.4.2")
def test_cq_poll_order_and_batches(ctx: v.Context) -> None:
    cq = v.CQ(ctx, 8)
    for i in range(5):
        cq.push(_wc(i))
    n, wcs = cq.poll(3)
    assert n == 3 and [w.wr_id for w in wcs] == [0, 1, 2]
    assert [w.wr_id for w in cq.poll(10)[1]] == [3, 4]
    assert cq.poll() == (0, [])


def test_cq_completion_timestamps(ctx: v.Context) -> None:
    """A CQ made with timestamps stamps each completion with the completion clock
    (CLOCK_MONOTONIC ns) as it is queued, in order; another CQ leaves 0."""
    from softrdma.verbs.cq import completion_clock

    stamped, plain = v.CQ(ctx, 8, timestamps=True), v.CQ(ctx, 8)
    before = completion_clock()
    for i in range(3):
        stamped.push(_wc(i))
        plain.push(_wc(i))
    after = completion_clock()
    stamps = [w.timestamp for w in stamped.poll(8)[1]]
    assert before <= stamps[0] <= stamps[1] <= stamps[2] <= after
    assert [w.timestamp for w in plain.poll(8)[1]] == [0, 0, 0]
    assert stamped.timestamps and not plain.timestamps


@pytest.mark.iba("11.4.2.1", "11.6.3.1")
def test_cq_overrun_error_and_async_event(ctx: v.Context) -> None:
    cq = v.CQ(ctx, 2)
    for i in range(4):
        cq.push(_wc(i))
    assert cq.error
    ev = ctx.get_async_event(timeout=1)
    assert ev.event_type == e.IBV_EVENT_CQ_ERR and ev.element is cq
    assert [w.wr_id for w in cq.poll(8)[1]] == [0, 1]  # queued entries survive
    cq.push(_wc(9))
    assert cq.poll() == (0, [])  # no completions after the overrun (IBA 11.4.2.1)
    with pytest.raises(StateError):
        cq.req_notify()
    with pytest.raises(TimeoutError):
        ctx.get_async_event(timeout=0.01)


@pytest.mark.iba("11.4.2.2")
def test_notify_channel_and_solicited(ctx: v.Context) -> None:
    ch = v.CompChannel(ctx)
    cq = v.CQ(ctx, 16, cq_context="mine", channel=ch)
    cq.push(_wc(0))  # not armed: no event
    r, _, _ = select.select([ch.fileno()], [], [], 0)
    assert r == []
    cq.req_notify()
    cq.push(_wc(1))
    cq.push(_wc(2))  # one event per arming
    assert select.select([ch.fileno()], [], [], 0)[0] == [ch.fileno()]
    got = ch.get_cq_event(timeout=1)
    assert got is cq and got.cq_context == "mine"
    with pytest.raises(TimeoutError):
        ch.get_cq_event(timeout=0.01)
    cq.req_notify(solicited_only=True)
    cq.push(_wc(3))
    with pytest.raises(TimeoutError):
        ch.get_cq_event(timeout=0.01)
    cq.push(_wc(4, solicited=True))
    assert ch.get_cq_event(timeout=1) is cq
    cq.req_notify(solicited_only=True)
    cq.push(_wc(5, status=int(e.IBV_WC_WR_FLUSH_ERR)))  # errors fire a solicited arm too
    assert ch.get_cq_event(timeout=1) is cq
    cq.ack_events(3)
    with pytest.raises(InvalidArgument):
        cq.ack_events(1)
    assert [w.wr_id for w in cq.poll(16)[1]] == [0, 1, 2, 3, 4, 5]


def test_cq_asyncio_wait(ctx: v.Context) -> None:
    cq = v.CQ(ctx, 4)

    async def main() -> list[int]:
        loop = asyncio.get_running_loop()
        loop.call_later(0.005, cq.push, _wc(7))
        wcs = await cq.wait(timeout=2)
        with pytest.raises(TimeoutError):
            await cq.wait(timeout=0.01)
        return [w.wr_id for w in wcs]

    assert asyncio.run(main()) == [7]


def test_cq_asyncio_wait_thread_mode_push_from_thread() -> None:
    fab = Fabric(VirtualClock())
    link = fab.link("10.2.0.7")
    c = v.Context(link=link, progress="thread")
    try:
        cq = v.CQ(c, 4)

        async def main() -> list[int]:
            t = threading.Timer(0.02, cq.push, args=(_wc(3),))
            t.start()
            wcs = await cq.wait(timeout=5)
            t.join()
            return [w.wr_id for w in wcs]

        assert asyncio.run(main()) == [3]
    finally:
        c.close()
    assert c.runtime.closed


def test_async_fileno_selectable(ctx: v.Context) -> None:
    fd = ctx.async_fileno()
    assert select.select([fd], [], [], 0)[0] == []
    cq = v.CQ(ctx, 1)
    cq.push(_wc(0))
    cq.push(_wc(1))
    assert select.select([fd], [], [], 0)[0] == [fd]
    assert ctx.get_async_event(0).event_type == e.IBV_EVENT_CQ_ERR
    assert select.select([fd], [], [], 0)[0] == []


def test_wc_status_str() -> None:
    assert v.wc_status_str(e.IBV_WC_SUCCESS) == "success"
    assert v.wc_status_str(e.IBV_WC_WR_FLUSH_ERR) == "Work Request Flushed Error"
    assert v.wc_status_str(e.IBV_WC_RETRY_EXC_ERR) == "transport retry counter exceeded"
    assert v.wc_status_str(99) == "unknown"


# ---- AH / SRQ --------------------------------------------------------------------------------------
def test_ah_checks(ctx: v.Context) -> None:
    pd = v.PD(ctx)
    ah = v.AH(pd, v.AHAttr(gr=v.GlobalRoute(dgid="10.2.0.5", hop_limit=64, traffic_class=8)))
    assert ah.av.dgid == v.GID("10.2.0.5").raw and ah.av.hop_limit == 64
    assert ah.av.traffic_class == 8
    with pytest.raises(InvalidArgument):
        v.AH(pd, v.AHAttr(is_global=0))
    with pytest.raises(InvalidArgument):
        v.AH(pd, v.AHAttr(gr=v.GlobalRoute(dgid="10.2.0.5", sgid_index=3)))
    with pytest.raises(InvalidArgument):
        v.AH(pd, v.AHAttr(gr=v.GlobalRoute(dgid="10.2.0.5", flow_label=1 << 20)))
    with pytest.raises(InvalidArgument):
        v.AH(pd, v.AHAttr(gr=v.GlobalRoute(dgid="::")))


@pytest.mark.iba("10.2.9")
def test_srq_attrs_and_modify(ctx: v.Context) -> None:
    pd = v.PD(ctx)
    with pytest.raises(InvalidArgument):
        v.SRQ(pd, v.SrqInitAttr(v.SrqAttr(max_wr=0)))
    with pytest.raises(InvalidArgument):
        v.SRQ(pd, v.SrqInitAttr(v.SrqAttr(max_wr=4, max_sge=28)))
    with pytest.raises(InvalidArgument):
        v.SRQ(pd, v.SrqInitAttr(v.SrqAttr(max_wr=4, srq_limit=5)))
    srq = v.SRQ(pd, v.SrqInitAttr(v.SrqAttr(max_wr=4, max_sge=2, srq_limit=1)))
    q = srq.query()
    assert (q.max_wr, q.max_sge, q.srq_limit) == (4, 2, 1)
    for i in range(3):
        srq.post_recv(v.RecvWR(i, 1, [v.SGE(0, 8, 0)]))
    with pytest.raises(InvalidArgument):
        srq.modify(v.SrqAttr(max_wr=2), e.IBV_SRQ_MAX_WR)  # below the 3 queued
    srq.modify(v.SrqAttr(max_wr=8, srq_limit=6), e.IBV_SRQ_MAX_WR | e.IBV_SRQ_LIMIT)
    q = srq.query()
    assert (q.max_wr, q.srq_limit) == (8, 6)
    with pytest.raises(InvalidArgument):
        srq.post_recv(v.RecvWR(9, 3, [v.SGE(0, 1, 0)] * 3))
    with pytest.raises(InvalidArgument):
        srq.modify(v.SrqAttr(), 4)
