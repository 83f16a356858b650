"""Connections established per second through the rdma_cm API on the loopback.

One process, one event channel per side; each connection is: resolve address and route,
create a QP on each side, connect with private data, accept, ESTABLISHED on both sides,
disconnect, DISCONNECTED on both sides, QPs and ids destroyed. Transports:

* RoCE: the IB CM + Annex A11 over a RoCE device on ``lo`` (its UDP port free-chosen,
  shared through devd like ``softrdma_lo``: every MAD takes the devd hop);
* iWARP: TCP connect + the MPA Request/Reply on the built-in ``softrdma_iw_lo``.

Run: ``python bench/cm_rate.py [-n 200]``; prints connections/s and the mean time per
connection for each transport.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

from rdma_cm_harness import make_state_dir  # noqa: E402

from softrdma import enums as e  # noqa: E402
from softrdma import verbs as v  # noqa: E402
from softrdma.cm import rdma_cm as rc  # noqa: E402
from softrdma.ibcm.params import CmConfig  # noqa: E402

T = rc.RdmaCmEventType


def wait(ch: rc.EventChannel, kind: int) -> rc.RdmaCmEvent:
    while True:
        ev = ch.get_cm_event(10)
        ch.ack(ev)
        if ev.event == kind:
            return ev
        if ev.event != T.TIMEWAIT_EXIT:
            raise RuntimeError(f"expected {rc.event_str(kind)}, got {ev.text}")


def rate(transport: str, n: int) -> float:
    chs, chc = rc.EventChannel(), rc.EventChannel()
    lst = rc.CmId(chs)
    lst.bind_addr(("127.0.0.1", 0), device=transport)
    lst.listen(64)
    assert lst.local_addr is not None
    port = lst.local_addr[1]
    ctx = None
    cqs: list[v.CQ] = []

    def qp_attr(c: v.CQ) -> v.QPInitAttr:
        return v.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=c, rcq=c, cap=v.QPCap(4, 4, 1, 1))

    t0 = 0.0
    for i in range(n + 5):
        if i == 5:  # 5 warm-up connections (device open, devd start)
            t0 = time.perf_counter()
        cli = rc.CmId(chc)
        cli.resolve_addr(None, ("127.0.0.1", port), 2000, device=transport)
        wait(chc, T.ADDR_RESOLVED)
        cli.resolve_route()
        wait(chc, T.ROUTE_RESOLVED)
        if ctx is None:
            ctx = cli.verbs
            cqs = [v.CQ(ctx, 16), v.CQ(ctx, 16)]
            pd = v.PD(ctx)
        cli.create_qp(pd, qp_attr(cqs[0]))
        cli.connect(rc.ConnParam(private_data=b"rate"))
        req = wait(chs, T.CONNECT_REQUEST)
        req.id.create_qp(pd, qp_attr(cqs[1]))
        req.id.accept()
        wait(chc, T.ESTABLISHED)
        wait(chs, T.ESTABLISHED)
        cli.disconnect()
        wait(chc, T.DISCONNECTED)
        wait(chs, T.DISCONNECTED)
        for cid in (cli, req.id):
            cid.destroy_qp()
            cid.destroy()
    dt = time.perf_counter() - t0
    lst.destroy()
    for ch in (chs, chc):
        ch.close()
    return n / dt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=200, help="connections per transport")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        make_state_dir(Path(d))
        os.environ["SOFTRDMA_STATE_DIR"] = d
        # default CM timers; TimeWait shortened so QPNs recycle quickly in the loop
        rc.configure(cm_config=CmConfig(timewait_s=0.01))
        try:
            for transport in ("roce", "iwarp"):
                r = rate(transport, a.n)
                print(f"[cm_rate] {transport:5s}: {r:7.1f} connections/s "
                      f"(connect + accept + disconnect, {1e3 / r:.2f} ms each, n={a.n})")
        finally:
            rc.release_devices()
    return 0


if __name__ == "__main__":
    sys.exit(main())
