"""A connected pair on the fabric for work-request checks, and SGEs.

(Moved from tests/verbs/test_verbs_wr.py, which other test files imported.)"""

from __future__ import annotations

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.drivers.links.fabric import Fabric
from softrdma.drivers.runtime.clock import VirtualClock

RC, UC, UD = int(e.IBV_QPT_RC), int(e.IBV_QPT_UC), int(e.IBV_QPT_UD)


LW = int(e.IBV_ACCESS_LOCAL_WRITE)


class Pair:
    """Two contexts on a fabric with connected QPs of one type."""

    def __init__(self, qpt: int, cap: v.QPCap | None = None) -> None:
        self.clock = VirtualClock()
        self.fab = Fabric(self.clock)
        self.a = v.Context(fabric=self.fab.link("10.3.0.1"))
        self.b = v.Context(fabric=self.fab.link("10.3.0.2"))
        self.sides = []
        for c in (self.a, self.b):
            pd = v.PD(c)
            cq = v.CQ(c, 64)
            qp = v.QP(pd, v.QPInitAttr(qpt, scq=cq, rcq=cq, cap=cap or v.QPCap(4, 8, 2, 2, 64)))
            mr = v.MR(pd, 4096, LW | int(e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
                                         | e.IBV_ACCESS_REMOTE_ATOMIC))
            self.sides.append((pd, cq, qp, mr))
        for (_, _, qp, _), (_, _, peer, _), pc in ((self.sides[0], self.sides[1], self.b),
                                                  (self.sides[1], self.sides[0], self.a)):
            at = v.QPAttr(qkey=0x1234, path_mtu=e.IBV_MTU_1024, dest_qp_num=peer.qp_num,
                          max_dest_rd_atomic=4, max_rd_atomic=4, min_rnr_timer=1, timeout=10,
                          retry_cnt=3, rnr_retry=3)
            at.qp_access_flags = int(e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
                                     | e.IBV_ACCESS_REMOTE_ATOMIC | e.IBV_ACCESS_LOCAL_WRITE)
            at.ah_attr = v.AHAttr(gr=v.GlobalRoute(dgid=pc.query_gid(1, 0), hop_limit=64))
            qp.to_rts(at)

    def close(self) -> None:
        self.a.close()
        self.b.close()


def _sge(mr: v.MR, n: int = 8, off: int = 0) -> v.SGE:
    return v.SGE(mr.addr + off, n, mr.lkey)
