"""XRC vs RC: the engine's cost of a SEND stream, measured in the same run.

Two devices on the in-memory fabric (virtual clock, no loss), one XRC INI -> TGT QP pair
delivering into an XRC SRQ, and as the baseline one RC QP pair delivering into a basic
SRQ. Each round streams ``--messages`` SENDs of ``--size`` bytes (path MTU 1024, so a
4 KiB message is 4 packets) and times the wall clock of posting and running the fabric
until every completion is in; the figure is messages per second and the ratio XRC/RC
(1.0: XRC costs what RC does; the XRCETH and SRQ binding are per packet, and XRC's
MIDDLE packets take the full receive path, not RC's fast one). Prints the best and the
median over ``--rounds`` and their ratios. Run: ``python bench/xrc_bench.py``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from softrdma import enums as e  # noqa: E402
from softrdma import verbs as v  # noqa: E402
from softrdma.drivers.links.fabric import Fabric  # noqa: E402
from softrdma.drivers.runtime.clock import VirtualClock  # noqa: E402

ACC = int(e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE)
DEPTH = 512


def _setup(xrc: bool, size: int) -> tuple[Any, ...]:
    clock = VirtualClock()
    fab = Fabric(clock, seed=1)
    ends = []
    for ip in ("10.9.0.1", "10.9.0.2"):
        ctx = v.Context(fabric=fab.link(ip))
        pd = v.PD(ctx)
        cq = v.CQ(ctx, 2 * DEPTH)
        mr = v.MR(pd, 0, ACC, buffer=bytearray(size))
        if xrc:
            xrcd = v.XRCD(ctx)
            srq: Any = v.XrcSRQ(pd, xrcd, cq, v.SrqInitAttr(v.SrqAttr(DEPTH, 1)))
            qp = v.QP(pd, v.QPInitAttr(qp_type=int(e.IBV_QPT_XRC_SEND), scq=cq,
                                       cap=v.QPCap(DEPTH, 0, 1, 0)))
            tgt = v.QP(xrcd, v.QPInitAttr(qp_type=int(e.IBV_QPT_XRC_RECV)))
        else:
            srq = v.SRQ(pd, v.SrqInitAttr(v.SrqAttr(DEPTH, 1)))
            qp = v.QP(pd, v.QPInitAttr(qp_type=int(e.IBV_QPT_RC), scq=cq, rcq=cq, srq=srq,
                                       cap=v.QPCap(DEPTH, 0, 1, 0)))
            tgt = qp
        ends.append((ctx, cq, mr, srq, qp, tgt))
    (ca, _, _, _, qa, _), (cb, _, _, _, _, tb) = ends
    common = dict(path_mtu=3, max_dest_rd_atomic=1, min_rnr_timer=1, timeout=14, retry_cnt=7,
                  rnr_retry=7, max_rd_atomic=1, qp_access_flags=ACC & ~1)
    for qp, peer, ctx in ((tb, qa, ca), (qa, tb, cb)):
        a = v.QPAttr(dest_qp_num=peer.qp_num, rq_psn=0, sq_psn=0, **common)
        a.ah_attr = v.AHAttr(is_global=1, gr=v.GlobalRoute(dgid=ctx.query_gid(1, 0)), port_num=1)
        qp.to_rts(a)
    return clock, ends


def _round(xrc: bool, n: int, size: int) -> float:
    clock, ends = _setup(xrc, size)
    (ca, cqa, mra, _, qa, _), (cb, cqb, mrb, srqb, _, _) = ends
    try:
        srqn = srqb.srq_num if xrc else 0
        sent = got = 0
        t0 = time.perf_counter()
        while got < n:
            while sent < n and sent - got < DEPTH // 2:
                srqb.post_recv(v.RecvWR(sent, 1, [v.SGE(mrb.addr, size, mrb.lkey)]))
                w = v.SendWR(sent, sg=[v.SGE(mra.addr, size, mra.lkey)])
                if xrc:
                    w.set_qp_type_xrc(srqn)
                qa.post_send(w)
                sent += 1
            clock.run(max_events=1_000_000)
            while True:
                k, wcs = cqb.poll(64)
                if not k:
                    break
                assert all(wc.status == 0 for wc in wcs)
                got += k
            while cqa.poll(64)[0]:
                pass
        return n / (time.perf_counter() - t0)
    finally:
        ca.close()
        cb.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=2000)
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    xs, rs = [], []
    for _ in range(args.rounds):
        rs.append(_round(False, args.messages, args.size))
        xs.append(_round(True, args.messages, args.size))
    print(f"SEND {args.size} B to an SRQ, {args.messages} messages x {args.rounds} rounds "
          "(in-memory fabric)")
    print(f"  RC  (baseline): best {max(rs):8.0f} msg/s  median {statistics.median(rs):8.0f}")
    print(f"  XRC           : best {max(xs):8.0f} msg/s  median {statistics.median(xs):8.0f}")
    print(f"  XRC / RC      : best {max(xs) / max(rs):.3f}  median "
          f"{statistics.median(xs) / statistics.median(rs):.3f}")


if __name__ == "__main__":
    main()
