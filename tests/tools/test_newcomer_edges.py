"""Rough edges a newcomer meets first (issue 24 §4): the device list, how a GID prints,
who is talking in a loopback packet trace."""

from __future__ import annotations

import io
import re

from harness.trace import captured_trace

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.drivers.links.fabric import Fabric
from softrdma.drivers.runtime.clock import VirtualClock
from softrdma.verbs.device import IWARP_LOOPBACK


def test_device_list_has_every_device_context_opens() -> None:
    names = [d.name for d in v.get_device_list()]
    assert IWARP_LOOPBACK in names
    iw = next(d for d in v.get_device_list() if d.name == IWARP_LOOPBACK)
    assert iw.type == "iwarp" and iw.netdev == "lo"
    assert names.count(IWARP_LOOPBACK) == 1
    ctx = v.Context(IWARP_LOOPBACK)  # what the list offers opens
    try:
        assert ctx.name == IWARP_LOOPBACK
    finally:
        ctx.close()


def test_gid_prints_ipv4_mapped_dotted() -> None:
    assert str(v.GID("127.0.0.1")) == "::ffff:127.0.0.1"
    assert str(v.GID(bytes(10) + b"\xff\xff" + bytes([10, 0, 0, 1]))) == "::ffff:10.0.0.1"
    assert v.GID("::ffff:10.50.0.11").gid == "::ffff:10.50.0.11"
    assert repr(v.GID("10.0.0.1")) == "GID('::ffff:10.0.0.1')"
    assert str(v.GID("fe80::1")) == "fe80::1"
    assert str(v.GID("::1")) == "::1"


_ALL = int(e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE)


def test_loopback_trace_names_both_qps() -> None:
    """Two RC QPs of one device talk to each other over 127.0.0.1: each line names the
    sending and the receiving QP, so the two directions read apart."""
    fab = Fabric(VirtualClock())
    with captured_trace("pkt") as buf:
        ctx = v.Context(fabric=fab.link("127.0.0.1"))
        try:
            pd = v.PD(ctx)
            cq = v.CQ(ctx, 16)
            mr = v.MR(pd, 4096, _ALL)
            qa, qb = (v.QP(pd, v.QPInitAttr(e.IBV_QPT_RC, scq=cq, rcq=cq, cap=v.QPCap(4, 4)))
                      for _ in range(2))
            for qp, peer in ((qa, qb), (qb, qa)):
                at = v.QPAttr(path_mtu=e.IBV_MTU_1024, dest_qp_num=peer.qp_num, sq_psn=5,
                              rq_psn=5, min_rnr_timer=1, timeout=8, retry_cnt=7, rnr_retry=7)
                at.qp_access_flags = _ALL
                at.ah_attr = v.AHAttr(gr=v.GlobalRoute(dgid=ctx.query_gid(1, 0), hop_limit=64))
                qp.to_rts(at)
            qb.post_recv(v.RecvWR(1, 1, [v.SGE(mr.addr, 64, mr.lkey)]))
            qa.post_send(v.SendWR(2, None, 1, [v.SGE(mr.addr + 64, 32, mr.lkey)]))
            fab.clock.run()
            assert sorted(w.status for w in cq.poll(4)[1]) == [e.IBV_WC_SUCCESS] * 2
        finally:
            ctx.close()
    a, b = f"0x{qa.qp_num:06x}", f"0x{qb.qp_num:06x}"
    lines = _pkt_lines(buf)
    send = [x for x in lines if "RC_SEND_ONLY" in x]
    ack = [x for x in lines if "RC_ACKNOWLEDGE" in x]
    assert {x.split()[1] for x in send} == {"tx", "rx"}, lines
    assert all(re.search(rf"127\.0\.0\.1:\d+ \(QP {a}\) -> 127\.0\.0\.1:4791 \(QP {b}\) ", x)
               for x in send), send
    assert ack and all(f"(QP {b}) -> 127.0.0.1:4791 (QP {a}) " in x for x in ack), ack


def _pkt_lines(buf: io.StringIO) -> list[str]:
    return [x.removeprefix("softrdma.pkt: ") for x in buf.getvalue().splitlines()
            if x.startswith("softrdma.pkt: ")]
