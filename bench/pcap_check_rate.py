"""What the conversation checks cost ``softrdma pcap-check``.

A capture of one CM connection between two softrdma nodes on the in-memory fabric (SENDs,
RDMA READs and WRITEs of 4000/8000 bytes at MTU 1024: about 8 packets per operation) is
checked with the conversation checks and without them (the baseline: decoding, ICRC and
byte-exact re-encoding only), alternately, ``-r`` times. Prints packets per second of
both and their time ratio, best and median.

Run: ``python bench/pcap_check_rate.py [-n 1500] [-r 7]``.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

from harness.cm import Pair  # noqa: E402

from softrdma import enums as e  # noqa: E402
from softrdma import verbs as v  # noqa: E402
from softrdma.ibcm.agent import ConnParams  # noqa: E402
from softrdma.tools.capture import pcap_check, pcap_conv  # noqa: E402

ACCESS = int(e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_READ | e.IBV_ACCESS_REMOTE_WRITE)
SID = 0x4242


def make_capture(path: Path, n: int) -> None:
    p = Pair(seed=5)
    p.fab.capture(path)
    qb, cqb = p.b.qp()
    p.listen_accepting(SID, qb)
    qa, cqa = p.a.qp()
    cid = p.a.new_id()
    cid.connect(qa, ConnParams(SID, p.b.gid))
    p.run(1)
    ma, mb = v.MR(p.a.pd, 1 << 16, ACCESS), v.MR(p.b.pd, 1 << 16, ACCESS)
    for i in range(n):
        qb.post_recv(v.RecvWR(i, 1, [v.SGE(mb.addr, 1 << 15, mb.lkey)]))
        qa.post_send(v.SendWR(i, None, 1, [v.SGE(ma.addr, 4000, ma.lkey)]))
        for op in (e.IBV_WR_RDMA_READ, e.IBV_WR_RDMA_WRITE):
            wr = v.SendWR(i, None, 1, [v.SGE(ma.addr, 8000, ma.lkey)], opcode=int(op))
            wr.set_wr_rdma(mb.rkey, mb.addr)
            qa.post_send(wr)
        p.run(0.01)
        cqa.poll(16)
        cqb.poll(16)
    cid.disconnect()
    p.run(1)
    p.fab.stop_capture()


def check(path: Path) -> tuple[float, int, str]:
    out = io.StringIO()
    t = time.perf_counter()
    rc = pcap_check.run([str(path)], out, err=out)
    return time.perf_counter() - t, rc, out.getvalue()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=1500, help="operations of each kind")
    ap.add_argument("-r", type=int, default=7, help="repetitions")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.pcap"
        make_capture(path, args.n)
        feed = pcap_conv.ConversationChecker.feed
        full: list[float] = []
        base: list[float] = []
        summary = ""
        try:
            for _ in range(args.r):
                pcap_conv.ConversationChecker.feed = feed  # type: ignore[method-assign]
                t, rc, summary = check(path)
                assert rc == 0, summary
                full.append(t)
                pcap_conv.ConversationChecker.feed = (  # type: ignore[method-assign]
                    lambda self, index, f: None)
                base.append(check(path)[0])
        finally:
            pcap_conv.ConversationChecker.feed = feed  # type: ignore[method-assign]
    packets = int(summary.splitlines()[0].split(": ")[1].split()[0])
    ratios = [a / b for a, b in zip(full, base, strict=True)]
    print(summary.strip())
    print(f"packet checks only:        {packets / min(base):10.0f} packets/s (best)")
    print(f"with conversation checks:  {packets / min(full):10.0f} packets/s (best)")
    print(f"time ratio (with / without): best {min(ratios):.2f}, "
          f"median {statistics.median(ratios):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
