"""Bulk RC WRITE flows over a :class:`harness.bottleneck.BottleneckNet` (congestion tests and
the lossy-goodput bench): each flow keeps ``depth`` WRITEs of ``size`` bytes posted."""

from __future__ import annotations

from harness.bottleneck import BottleneckNet
from harness.engine import Endpoint, connect
from softrdma import enums as e
from softrdma.seam.types import SGE, SendWQE

SIG = int(e.IBV_SEND_SIGNALED)


class Flow:
    """One RC QP pair sending WRITEs from ``a`` to ``b`` back to back."""

    def __init__(self, a: Endpoint, b: Endpoint, size: int, depth: int) -> None:
        self.a, self.b, self.size, self.depth = a, b, size, depth
        self.posted = 0
        self.done_bytes = 0
        self.errors = 0
        self.active = True

    def top_up(self, now: float) -> None:
        scq = self.a.scq
        for wc in scq:
            if wc.status:
                self.errors += 1
            else:
                self.done_bytes += self.size
        done = len(scq)
        scq.clear()
        self.posted -= done
        while self.active and self.posted < self.depth:
            w = SendWQE(self.posted, int(e.IBV_WR_RDMA_WRITE), SIG,
                        [SGE(self.a.mr.addr, self.size, self.a.mr.lkey)],
                        remote_addr=self.b.mr.addr, rkey=self.b.mr.rkey)
            self.a.qp.post_send(w, now)
            self.posted += 1


def flows(net: BottleneckNet, n: int, *, size: int = 64 * 1024, depth: int = 4, mtu: int = 3,
          timeout: int = 10) -> list[Flow]:
    """``n`` flows, each its own QP pair, all from port 1 to port 2 (one bottleneck)."""
    p1, p2 = net.add_port(1), net.add_port(2)
    out = []
    for _ in range(n):
        a = Endpoint(p1, size=size, max_wr=depth + 4)
        b = Endpoint(p2, size=size, max_wr=depth + 4)
        connect(a, b, mtu=mtu, timeout=timeout, retry_cnt=7)
        out.append(Flow(a, b, size, depth))
    return out


def drive(net: BottleneckNet, fl: list[Flow], until: float) -> None:
    """Run the net to virtual time ``until``, keeping every active flow's queue full."""
    while net.now < until:
        for f in fl:
            f.top_up(net.now)
        if not net.step():
            return
    for f in fl:
        f.top_up(net.now)


def jain(xs: list[float]) -> float:
    """Jain's fairness index: 1.0 when all shares are equal, 1/n when one takes all."""
    s = sum(xs)
    return s * s / (len(xs) * sum(x * x for x in xs)) if s else 0.0
