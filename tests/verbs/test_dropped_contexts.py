"""Contexts an application drops without closing them, with their objects (PD, MR, MW,
CQ on a completion channel, SRQ, QPs): the collector takes them, and the device file's
release then closes the runtime and every descriptor, under manual progress (nobody
calls progress again) as under the progress thread.

The engine's objects outlive their verbs objects until a deferred release runs, which
under manual progress is never; they refer to a PD by its token and to a CQ through a
weak sink (softrdma.verbs.pd, softrdma.verbs.cq), so they keep no verbs object alive."""

from __future__ import annotations

import gc
import os
import threading
import weakref
from collections.abc import Callable

import pytest

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.drivers.links.fabric import Fabric
from softrdma.drivers.links.udp import UdpLink
from softrdma.drivers.runtime.clock import VirtualClock
from softrdma.drivers.runtime.progress import DeviceRuntime

ACC = int(e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ)
CAP = v.QPCap(max_send_wr=4, max_recv_wr=4, max_send_sge=1, max_recv_sge=1)
CONTEXTS = 3
DEADLINE_S = 60.0  # a busy machine


def _roce_fabric() -> v.Context:
    return v.Context(fabric=Fabric(VirtualClock()).link("10.2.0.1"))


def _roce_thread() -> v.Context:
    return v.Context(link=UdpLink("127.0.0.1", 0))


def _iwarp(progress: str) -> Callable[[], v.Context]:
    return lambda: v.Context(transport="iwarp", progress=progress)


def _drop(make: Callable[[], v.Context]
          ) -> tuple[weakref.ref[v.Context], DeviceRuntime, int]:
    """A context with one of each object, all dropped: a weak reference to the context,
    its runtime, and the completion channel's descriptor."""
    ctx = make()
    pd = v.PD(ctx)
    ch = v.CompChannel(ctx)
    cq = v.CQ(ctx, 8, channel=ch)
    cq.req_notify()
    mr = v.MR(pd, 4096, ACC)
    qp = v.QP(pd, v.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=CAP))
    qp.to_init(v.QPAttr(qp_access_flags=ACC))
    qp.post_recv([v.RecvWR(wr_id=1, sg=[v.SGE(mr.addr, 64, mr.lkey)], num_sge=1)])
    if ctx.transport != "iwarp":  # iWARP (siw): RC QPs only, no memory windows, SRQs
        srq = v.SRQ(pd, v.SrqInitAttr(v.SrqAttr(max_wr=4, max_sge=1)))
        v.QP(pd, v.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, srq=srq, cap=CAP))
        v.QP(pd, v.QPInitAttr(qp_type=e.IBV_QPT_UD, scq=cq, rcq=cq, cap=CAP))
        v.MW(pd)
    return weakref.ref(ctx), ctx.runtime, ch.fileno()


def _open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


@pytest.mark.parametrize("make", [_roce_fabric, _roce_thread, _iwarp("manual"),
                                  _iwarp("thread")],
                         ids=["roce-virtual-clock", "roce-thread", "iwarp-manual",
                              "iwarp-thread"])
def test_a_dropped_context_is_collected_and_released(make: Callable[[], v.Context]) -> None:
    dropped = [_drop(make) for _ in range(CONTEXTS)]
    gc.collect()
    assert [ref() for ref, _, _ in dropped] == [None] * CONTEXTS
    for _, runtime, fd in dropped:
        assert runtime.closed is True  # the device file's last user went
        assert not _open(fd)


def test_a_live_cq_still_gets_completions_through_its_sink() -> None:
    """The weak sink delivers while the CQ lives: a loopback SEND completes both ways."""
    fab = Fabric(VirtualClock())
    with v.Context(fabric=fab.link("10.2.0.1")) as ctx:
        pd = v.PD(ctx)
        cq = v.CQ(ctx, 8)
        mr = v.MR(pd, 4096, ACC)
        a, b = (v.QP(pd, v.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=CAP))
                for _ in range(2))
        gid = ctx.port.gids[0]
        for qp, peer in ((a, b), (b, a)):
            qp.to_rts(v.QPAttr(dest_qp_num=peer.qp_num, path_mtu=e.IBV_MTU_1024,
                               ah_attr=v.AHAttr(port_num=1, is_global=1,
                                                gr=v.GlobalRoute(dgid=v.GID(gid))),
                               qp_access_flags=ACC))
        b.post_recv([v.RecvWR(wr_id=2, sg=[v.SGE(mr.addr + 2048, 64, mr.lkey)], num_sge=1)])
        mr.write(b"dropped contexts", 16)
        a.post_send([v.SendWR(wr_id=1, opcode=e.IBV_WR_SEND,
                              send_flags=int(e.IBV_SEND_SIGNALED),
                              sg=[v.SGE(mr.addr, 16, mr.lkey)], num_sge=1)])
        got: dict[int, int] = {}
        for _ in range(200):
            fab.clock.advance(0.001)
            ctx.progress()
            n, wcs = cq.poll(8)
            got.update((int(wc.wr_id), int(wc.status)) for wc in wcs[:n])
            if len(got) == 2:
                break
        assert got == {1: 0, 2: 0}
        assert mr.read(16, 2048) == b"dropped contexts"


def test_a_dropped_context_that_watches_its_port_is_collected() -> None:
    """``watch_port``'s thread refers to the device file, not to the context (a running
    thread is a root), and it ends once the context is collected."""
    def dropped() -> tuple[weakref.ref[v.Context], threading.Thread]:
        ctx = _roce_thread()
        ctx.watch_port(0.05)
        threads = [t for t in threading.enumerate() if t.name == f"portwatch-{ctx.netdev}"]
        assert threads, "watch_port started no thread"
        return weakref.ref(ctx), threads[-1]
    ref, thread = dropped()
    gc.collect()
    assert ref() is None
    thread.join(timeout=DEADLINE_S)
    assert not thread.is_alive()
