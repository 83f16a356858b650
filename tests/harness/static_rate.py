"""Two contexts on a fabric that records when each packet left; static rate checks.

(Moved from tests/ib/test_static_rate.py, which other test files imported.)"""

from __future__ import annotations

import pytest

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.drivers.links.fabric import Fabric
from softrdma.drivers.links.link import Datagram
from softrdma.drivers.runtime.clock import VirtualClock
from softrdma.ib.pacing import RATE_MBPS

UD, RC = int(e.IBV_QPT_UD), int(e.IBV_QPT_RC)


ALL = int(e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE)


QKEY = 0x2222


ICRC = 4


class Sent:
    """Send times and sizes (BTH .. ICRC) of the datagrams one link puts on the fabric."""

    def __init__(self, fab: Fabric, src: bytes) -> None:
        self.clock = fab.clock
        self.log: list[tuple[float, int]] = []

        def watch(d: Datagram) -> bool:
            if d.src_ip == src:
                self.log.append((self.clock.now(), len(d.data)))
            return False

        fab.add_rule(watch, "drop")

    def achieved_bps(self) -> float:
        """Bits of every packet but the last over the time from the first to the last."""
        (t0, _), (t1, _) = self.log[0], self.log[-1]
        return sum(n for _, n in self.log[:-1]) * 8 / (t1 - t0)

    def max_window_bps(self, k: int = 8) -> float:
        """The highest rate over any k consecutive packets (a burst would show here)."""
        best = 0.0
        for i in range(len(self.log) - k):
            bits = sum(n for _, n in self.log[i:i + k]) * 8
            best = max(best, bits / (self.log[i + k][0] - self.log[i][0]))
        return best


class Net:
    def __init__(self) -> None:
        self.clock = VirtualClock()
        self.fab = Fabric(self.clock)
        self.a = v.Context(fabric=self.fab.link("10.6.0.1"))
        self.b = v.Context(fabric=self.fab.link("10.6.0.2"))
        self.sent = Sent(self.fab, bytes([10, 6, 0, 1]))

    def close(self) -> None:
        self.a.close()
        self.b.close()


def _qp(ctx: v.Context, qpt: int, depth: int = 256) -> tuple[v.PD, v.CQ, v.QP, v.MR]:
    pd = v.PD(ctx)
    cq = v.CQ(ctx, 2 * depth)
    qp = v.QP(pd, v.QPInitAttr(qpt, scq=cq, rcq=cq, cap=v.QPCap(depth, depth)))
    mr = v.MR(pd, 1 << 17, ALL)
    return pd, cq, qp, mr


def check_ud_ah_static_rate_is_kept(net: Net, rate: int) -> None:
    pda, cqa, qa, ma = _qp(net.a, UD)
    _pdb, _cqb, qb, mb = _qp(net.b, UD)
    for q in (qa, qb):
        q.to_rts(v.QPAttr(qkey=QKEY))
    for i in range(200):
        qb.post_recv(v.RecvWR(i, 1, [v.SGE(mb.addr, 2048, mb.lkey)]))
    ah = v.AH(pda, v.AHAttr(gr=v.GlobalRoute(dgid=net.b.query_gid(1, 0)), static_rate=rate))
    n, size = 200, 1000
    for i in range(n):
        wr = v.SendWR(i, sg=[v.SGE(ma.addr, size, ma.lkey)], send_flags=0)
        wr.set_wr_ud(ah, qb.qp_num, QKEY)
        qa.post_send(wr)
    net.clock.run()
    assert len(net.sent.log) == n
    assert all(s == 12 + 8 + size + ICRC for _, s in net.sent.log)  # BTH + DETH + data
    want = RATE_MBPS[rate] * 1e6
    assert net.sent.achieved_bps() == pytest.approx(want, rel=1e-9)
    assert net.sent.max_window_bps() <= want * (1 + 1e-9)


def check_rc_qp_static_rate_is_kept(net: Net, rate: int) -> None:
    _pda, cqa, qa, ma = _qp(net.a, RC)
    _pdb, _cqb, qb, mb = _qp(net.b, RC)
    for q, peer, ctx in ((qa, qb, net.b), (qb, qa, net.a)):
        at = v.QPAttr(path_mtu=e.IBV_MTU_4096, dest_qp_num=peer.qp_num, timeout=14,
                      retry_cnt=7, rnr_retry=7, max_rd_atomic=1, max_dest_rd_atomic=1)
        at.qp_access_flags = ALL
        at.ah_attr = v.AHAttr(gr=v.GlobalRoute(dgid=ctx.query_gid(1, 0)), static_rate=rate)
        q.to_rts(at)
    wr = v.SendWR(1, opcode=int(e.IBV_WR_RDMA_WRITE), sg=[v.SGE(ma.addr, 1 << 17, ma.lkey)])
    wr.set_wr_rdma(mb.rkey, mb.addr)
    qa.post_send(wr)
    net.clock.run()
    assert cqa.poll(1)[1][0].status == e.IBV_WC_SUCCESS
    assert len(net.sent.log) == 32  # 128 KiB at MTU 4096
    want = RATE_MBPS[rate] * 1e6
    assert net.sent.achieved_bps() == pytest.approx(want, rel=1e-9)
    assert net.sent.max_window_bps() <= want * (1 + 1e-9)
