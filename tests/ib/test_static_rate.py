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
from harness.static_rate import (
    ALL,
    ICRC,
    QKEY,
    RC,
    UD,
    Net,
    _qp,
    check_rc_qp_static_rate_is_kept,
    check_ud_ah_static_rate_is_kept,
)

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.drivers.links.udp import UdpLink
from softrdma.drivers.runtime.roce import Runtime
from softrdma.errors import InvalidArgument
from softrdma.ib.pacing import rate_bps


@pytest.fixture()
def net() -> Iterator[Net]:
    n = Net()
    yield n
    n.close()


@pytest.mark.parametrize("rate", [int(e.IBV_RATE_2_5_GBPS), int(e.IBV_RATE_10_GBPS)],
                         ids=["2.5G", "10G"])
@pytest.mark.iba("9.11")
def test_ud_ah_static_rate_is_kept(net: Net, rate: int) -> None:
    check_ud_ah_static_rate_is_kept(net, rate)


@pytest.mark.parametrize("rate", [int(e.IBV_RATE_5_GBPS), int(e.IBV_RATE_40_GBPS)],
                         ids=["5G", "40G"])
@pytest.mark.iba("9.11")
def test_rc_qp_static_rate_is_kept(net: Net, rate: int) -> None:
    check_rc_qp_static_rate_is_kept(net, rate)


@pytest.mark.iba("9.11")
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


@pytest.mark.iba("9.11")
def test_bad_static_rate_is_rejected(net: Net) -> None:
    pd = v.PD(net.a)
    gr = v.GlobalRoute(dgid=net.b.query_gid(1, 0))
    for bad in (1, 25, -1):
        with pytest.raises(InvalidArgument) as ei:
            v.AH(pd, v.AHAttr(gr=gr, static_rate=bad))
        assert ei.value.argument == "attr.static_rate"
    assert rate_bps(int(e.IBV_RATE_MAX)) == 0.0


@pytest.mark.iba("9.11")
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
