"""Two contexts on one shared device with a connected RC pair, for the counters.

(Moved from tests/verbs/test_port_counters.py, which other test files imported.)"""

from __future__ import annotations

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.drivers.links.fabric import Fabric
from softrdma.drivers.runtime.clock import VirtualClock

RC = int(e.IBV_QPT_RC)


ALL = int(e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ | e.IBV_ACCESS_LOCAL_WRITE)


class Pair:
    """Two fabric contexts with a connected RC QP pair (MTU 1024)."""

    def __init__(self, **fabric_kw: object) -> None:
        self.clock = VirtualClock()
        self.fab = Fabric(self.clock, **fabric_kw)  # type: ignore[arg-type]
        self.a = v.Context(fabric=self.fab.link("10.5.0.1"))
        self.b = v.Context(fabric=self.fab.link("10.5.0.2"))
        self.sides = []
        for c in (self.a, self.b):
            pd = v.PD(c)
            cq = v.CQ(c, 64)
            qp = v.QP(pd, v.QPInitAttr(RC, scq=cq, rcq=cq, cap=v.QPCap(8, 8, 1, 1)))
            mr = v.MR(pd, 8192, ALL)
            self.sides.append((cq, qp, mr))
        for (_, qp, _), (_, peer, _), pc in ((self.sides[0], self.sides[1], self.b),
                                             (self.sides[1], self.sides[0], self.a)):
            at = v.QPAttr(path_mtu=e.IBV_MTU_1024, dest_qp_num=peer.qp_num, max_rd_atomic=1,
                          max_dest_rd_atomic=1, min_rnr_timer=1, timeout=8, retry_cnt=7,
                          rnr_retry=7)
            at.qp_access_flags = ALL
            at.ah_attr = v.AHAttr(gr=v.GlobalRoute(dgid=pc.query_gid(1, 0), hop_limit=64))
            qp.to_rts(at)

    def send(self, n: int, recv: bool = True) -> None:
        cqa, qa, ma = self.sides[0]
        _cqb, qb, mb = self.sides[1]
        if recv:
            qb.post_recv(v.RecvWR(1, 1, [v.SGE(mb.addr, 8192, mb.lkey)]))
        qa.post_send(v.SendWR(2, sg=[v.SGE(ma.addr, n, ma.lkey)]))

    def close(self) -> None:
        self.a.close()
        self.b.close()
