"""Static rate control (IBA 9.11; A16.7.3, CA16-15.1.1 "A RoCE port shall support static
rate control"): an AH or QP with a static rate paces its packets with an inter-packet
delay, so a fast sender never exceeds the rate.

On the fabric's virtual clock the sender is infinitely fast, so the pacing is the only
limit: the achieved rate equals the set one (to rounding), at two IBV_RATE_* values, for
UD (the AH's rate) and RC (the QP's address vector). The real-time check uses the QP
rate limit (``ibv_modify_qp_rate_limit``, kbit/s), since Python cannot reach even
IBV_RATE_2_5_GBPS on a real socket.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.drivers.clock import VirtualClock
from softrdma.drivers.fabric import Fabric
from softrdma.drivers.link import Datagram
from softrdma.drivers.runtime import Runtime
from softrdma.drivers.udp import UdpLink
from softrdma.errors import InvalidArgument
from softrdma.ib.pacing import RATE_MBPS, rate_bps

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


@pytest.fixture()
def net() -> Iterator[Net]:
    n = Net()
    yield n
    n.close()


def _qp(ctx: v.Context, qpt: int, depth: int = 256) -> tuple[v.PD, v.CQ, v.QP, v.MR]:
    pd = v.PD(ctx)
    cq = v.CQ(ctx, 2 * depth)
    qp = v.QP(pd, v.QPInitAttr(qpt, scq=cq, rcq=cq, cap=v.QPCap(depth, depth)))
    mr = v.MR(pd, 1 << 17, ALL)
    return pd, cq, qp, mr


@pytest.mark.parametrize("rate", [int(e.IBV_RATE_2_5_GBPS), int(e.IBV_RATE_10_GBPS)],
                         ids=["2.5G", "10G"])
def test_ud_ah_static_rate_is_kept(net: Net, rate: int) -> None:
    check_ud_ah_static_rate_is_kept(net, rate)


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


@pytest.mark.parametrize("rate", [int(e.IBV_RATE_5_GBPS), int(e.IBV_RATE_40_GBPS)],
                         ids=["5G", "40G"])
def test_rc_qp_static_rate_is_kept(net: Net, rate: int) -> None:
    check_rc_qp_static_rate_is_kept(net, rate)


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


def test_no_static_rate_is_not_paced(net: Net) -> None:
    """IBV_RATE_MAX: every packet leaves at once (the virtual clock does not move)."""
    pda, _cqa, qa, ma = _qp(net.a, UD)
    qa.to_rts(v.QPAttr(qkey=QKEY))
    ah = v.AH(pda, v.AHAttr(gr=v.GlobalRoute(dgid=net.b.query_gid(1, 0))))
    for i in range(20):
        wr = v.SendWR(i, sg=[v.SGE(ma.addr, 1000, ma.lkey)], send_flags=0)
        wr.set_wr_ud(ah, 0x99, QKEY)
        qa.post_send(wr)
    net.clock.run()
    assert len(net.sent.log) == 20 and net.sent.log[0][0] == net.sent.log[-1][0]


def test_bad_static_rate_is_rejected(net: Net) -> None:
    pd = v.PD(net.a)
    gr = v.GlobalRoute(dgid=net.b.query_gid(1, 0))
    for bad in (1, 25, -1):
        with pytest.raises(InvalidArgument) as ei:
            v.AH(pd, v.AHAttr(gr=gr, static_rate=bad))
        assert ei.value.argument == "attr.static_rate"
    assert rate_bps(int(e.IBV_RATE_MAX)) == 0.0


def test_real_time_rate_limit_is_kept() -> None:
    """Real UDP sockets on 127.0.0.1 (two in-process devices on their own ports): an RC
    WRITE of 128 KiB under a 20 Mbit/s QP rate limit takes as long as the rate says."""
    la, lb = UdpLink("127.0.0.1", 0), UdpLink("127.0.0.1", 0)
    ca, cb = v.Context(link=la), v.Context(link=lb)
    try:
        ra, rb = ca.runtime, cb.runtime
        assert isinstance(ra, Runtime) and isinstance(rb, Runtime)
        ra.udp_port = lb.port or 0
        rb.udp_port = la.port or 0
        _pda, cqa, qa, ma = _qp(ca, RC, 16)
        _pdb, _cqb, qb, mb = _qp(cb, RC, 16)
        for q, peer, ctx in ((qa, qb, cb), (qb, qa, ca)):
            at = v.QPAttr(path_mtu=e.IBV_MTU_4096, dest_qp_num=peer.qp_num, timeout=14,
                          retry_cnt=7, rnr_retry=7, max_rd_atomic=1, max_dest_rd_atomic=1)
            at.qp_access_flags = ALL
            at.ah_attr = v.AHAttr(gr=v.GlobalRoute(dgid=ctx.query_gid(1, 0), hop_limit=64))
            q.to_rts(at)
        kbps = 20_000
        qa.modify_rate_limit(kbps)
        size = 1 << 17
        wr = v.SendWR(1, opcode=int(e.IBV_WR_RDMA_WRITE), sg=[v.SGE(ma.addr, size, ma.lkey)])
        wr.set_wr_rdma(mb.rkey, mb.addr)
        t0 = time.monotonic()
        qa.post_send(wr)
        while True:
            _, wcs = cqa.poll(1)
            if wcs:
                break
            assert time.monotonic() - t0 < 30, "no completion"
            time.sleep(0.001)
        elapsed = time.monotonic() - t0
        assert wcs[0].status == e.IBV_WC_SUCCESS
        wire_bits = (size + 32 * (12 + ICRC)) * 8
        # never faster than the limit (the last packet's delay is not waited for)
        floor = (wire_bits - (4096 + 16) * 8) / (kbps * 1000)
        print(f"[static rate] limit {kbps / 1000:g} Mbit/s, achieved "
              f"{wire_bits / elapsed / 1e6:.2f} Mbit/s ({wire_bits / elapsed / kbps / 1000:.3f} "
              "of the limit)")
        assert elapsed >= floor * 0.999
        assert elapsed < floor * 3 + 1.0  # and paced, not stalled
        with pytest.raises(InvalidArgument):
            qa.modify_rate_limit(-1)
    finally:
        ca.close()
        cb.close()
