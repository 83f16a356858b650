"""Scale: 10,000 QPs and 100,000 MRs in one process, with the memory each costs.

The README's test command runs it at a tenth of that size (the same checks: unique numbers
and keys, the memory per object, the last object still works); the slow job (``.ci/slow``)
at full size."""

from __future__ import annotations

import gc
import tracemalloc

import pytest

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.drivers.links.fabric import Fabric
from softrdma.drivers.runtime.clock import VirtualClock

N_QP = 10_000
N_MR = 100_000


@pytest.mark.parametrize(("n_qp", "n_mr"), [
    pytest.param(N_QP // 10, N_MR // 10, id="tenth"),
    pytest.param(N_QP, N_MR, id="full", marks=pytest.mark.slow)])
def test_ten_thousand_qps_and_hundred_thousand_mrs(n_qp: int, n_mr: int) -> None:
    clock = VirtualClock()
    fab = Fabric(clock)
    ctx = v.Context(fabric=fab.link("10.7.0.1"))
    try:
        pd = v.PD(ctx)
        cq = v.CQ(ctx, 1024)
        buf = bytearray(1 << 20)
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        qps = [v.QP(pd, v.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq,
                                      cap=v.QPCap(16, 16, 1, 1)))
               for _ in range(n_qp)]
        per_qp = (tracemalloc.get_traced_memory()[0] - base) / n_qp
        base = tracemalloc.get_traced_memory()[0]
        view = memoryview(buf)
        access = int(e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE)
        mrs = [v.MR(pd, 0, access, buffer=view[(i % 256) * 4096:(i % 256 + 1) * 4096])
               for i in range(n_mr)]
        per_mr = (tracemalloc.get_traced_memory()[0] - base) / n_mr
        tracemalloc.stop()
        print(f"\nmemory per QP: {per_qp:.0f} bytes, per MR: {per_mr:.0f} bytes")
        assert len({qp.qp_num for qp in qps}) == n_qp  # QP numbers are unique
        assert len({mr.rkey for mr in mrs}) == n_mr  # so are keys
        assert per_qp < 16_000 and per_mr < 4_000
        # the last of them still works: a QP moves to RTS, an MR is found by its key
        qp = qps[-1]
        qp.modify(v.QPAttr(qp_state=e.IBV_QPS_INIT, pkey_index=0, port_num=1,
                           qp_access_flags=0),
                  int(e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT
                      | e.IBV_QP_ACCESS_FLAGS))
        assert qp.qp_state == e.IBV_QPS_INIT
        for mr in mrs[:1000]:
            mr.close()
        for q in qps[:1000]:
            q.close()
    finally:
        ctx.close()
