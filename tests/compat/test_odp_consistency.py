"""On-demand paging is answered the same way by the native API and the pyverbs layer:
pyverbs reports ODP capabilities (``query_device_ex().odp_caps``), so both accept
``IBV_ACCESS_ON_DEMAND`` and mark the region on-demand (softrdma never pins memory)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from harness.ports import free_port

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.compat.pyverbs import device as d
from softrdma.compat.pyverbs import enums as pe
from softrdma.compat.pyverbs.mr import MR
from softrdma.compat.pyverbs.pd import PD
from softrdma.drivers.host import registry

ODP = int(e.IBV_ACCESS_ON_DEMAND)
LW = int(e.IBV_ACCESS_LOCAL_WRITE)
RW = int(e.IBV_ACCESS_REMOTE_WRITE)


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    mp = pytest.MonkeyPatch()
    mp.setenv("SOFTRDMA_STATE_DIR", str(tmp_path_factory.mktemp("state")))
    registry.add("odp0", "lo", "roce", free_port())
    yield "odp0"
    mp.undo()


def test_both_layers_accept_what_pyverbs_reports(dev: str) -> None:
    with d.Context(name=dev) as pctx:
        caps = pctx.query_device_ex().odp_caps
        assert caps.general_caps & pe.IBV_ODP_SUPPORT
        assert caps.rc_odp_caps & pe.ibv_odp_transport_cap_bits.IBV_ODP_SUPPORT_WRITE
        pmr = MR(PD(pctx), 4096, LW | RW | ODP)
        assert pmr.on_demand and pmr.access & ODP
        engine_mr = pctx.port.lookup_mr(pmr.lkey)
        assert engine_mr is not None and engine_mr.access & ODP == 0  # the engine's view
    with v.Context(dev) as ctx:
        mr = v.MR(v.PD(ctx), 4096, LW | RW | ODP)
        assert mr.on_demand and mr.access == LW | RW | ODP
        assert mr.engine_mr.access == LW | RW


def test_native_odp_region_takes_an_rdma_write(dev: str) -> None:
    """An ODP region is written in place like any other (loopback RC pair, native API)."""
    with v.Context(dev) as ctx:
        pd = v.PD(ctx)
        cq = v.CQ(ctx, 16)
        src = v.MR(pd, 4096, LW)
        dst = v.MR(pd, 4096, LW | RW | ODP)
        qps = [v.QP(pd, v.QPInitAttr(int(e.IBV_QPT_RC), scq=cq, rcq=cq, cap=v.QPCap(4, 4)))
               for _ in range(2)]
        for me, peer in ((qps[0], qps[1]), (qps[1], qps[0])):
            a = v.QPAttr(path_mtu=int(e.IBV_MTU_1024), dest_qp_num=peer.qp_num,
                         max_dest_rd_atomic=1, max_rd_atomic=1, min_rnr_timer=1, timeout=14,
                         retry_cnt=7, rnr_retry=7)
            a.qp_access_flags = RW
            a.ah_attr = v.AHAttr(gr=v.GlobalRoute(dgid=ctx.query_gid(1, 0), hop_limit=64))
            me.to_rts(a)
        src.write(b"on demand", 9)
        wr = v.SendWR(1, opcode=int(e.IBV_WR_RDMA_WRITE), sg=[v.SGE(src.addr, 9, src.lkey)])
        wr.set_wr_rdma(dst.rkey, dst.addr)
        qps[0].post_send(wr)
        end = time.monotonic() + 20
        wcs: list[v.WC] = []
        while not wcs and time.monotonic() < end:
            _, wcs = cq.poll()
        assert wcs and wcs[0].status == e.IBV_WC_SUCCESS
        assert dst.read(9, 0) == b"on demand"
