"""Bytecodes the IB engine executes per operation: a load-independent cost figure.

Two in-memory RC QPs (tests/harness/engine.py: path MTU 4096, no I/O) and
``sys.settrace`` with opcode events count the Python bytecodes executed by:

* ``post+tx``: posting one signaled 64 B SEND and taking its packet (the ping-pong's
  send side: ``post_send`` down to the queued ``TxPacket``);
* ``recv SEND+ACK``: the responder receiving that SEND and its ACK being taken;
* ``ACK``: the requester receiving the ACK;
* ``WRITE tx/pkt``: a 1 MiB RDMA WRITE posted and its 256 packets taken, per packet;
* ``rx single/pkt``: those 256 packets received one ``Port.receive`` at a time;
* ``rx run/pkt``: the same received as runs of 16 (``Port.receive_run``, the GRO path).

Counts do not depend on the machine's load, so two trees can be compared anywhere:
``python bench/bytecodes.py [TREE ...]`` (default: this checkout) prints one line per
tree; the first tree is the baseline and the others get their ratio to it. With
``--functions`` the top functions of the three ping-pong phases and of ``rx single`` are listed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEYS = ("post+tx", "recv SEND+ACK", "ACK", "WRITE tx/pkt", "rx single/pkt", "rx run/pkt")


def measure_here(functions: bool) -> dict[str, float]:
    """Run the phases in this process (``sys.path`` already points at the tree)."""
    from harness.engine import Endpoint, Net, connect  # type: ignore[import-not-found]

    from softrdma import enums as e
    from softrdma.ib.port import RxMeta
    from softrdma.seam.types import SGE, RecvWQE, SendWQE

    sig = int(e.IBV_SEND_SIGNALED)
    net = Net(seed=0)
    a = Endpoint(net.add_port(1, max_mtu=4096), size=1 << 20, max_wr=64)
    b = Endpoint(net.add_port(2, max_mtu=4096), size=1 << 20, max_wr=64)
    connect(a, b, mtu=5, timeout=14)
    ma = RxMeta(a.port.gids[0], b.port.gids[0])
    mb = RxMeta(b.port.gids[0], a.port.gids[0])
    count = [0]
    per: dict[str, int] = {}

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        if event == "opcode":
            count[0] += 1
            name = frame.f_code.co_name
            per[name] = per.get(name, 0) + 1
        return tracer

    def run(f: Callable[[], Any]) -> tuple[Any, int]:
        count[0] = 0
        per.clear()
        sys.settrace(tracer)
        try:
            r = f()
        finally:
            sys.settrace(None)
        return r, count[0]

    def join(pkt: Any) -> memoryview:
        return memoryview(b"".join(bytes(p) for p in pkt.parts))

    def top(label: str) -> None:
        if functions:
            best = sorted(per.items(), key=lambda kv: -kv[1])[:24]
            print(f"  {label}: " + ", ".join(f"{k} {v}" for k, v in best))

    def ping(wr_id: int) -> SendWQE:
        b.qp.post_recv(RecvWQE(wr_id, [SGE(b.mr.addr, 64, b.mr.lkey)]))
        return SendWQE(wr_id, int(e.IBV_WR_SEND), sig, [SGE(a.mr.addr, 64, a.mr.lkey)])

    for r in range(3):  # warm up: caches, first-time paths
        w = ping(r)
        a.qp.post_send(w, 0.0)
        tx = a.port.take_tx()
        b.port.receive(join(tx[0]), ma, 0.0)
        a.port.receive(join(b.port.take_tx()[0]), mb, 0.0)
    w = ping(9)
    out: dict[str, float] = {}
    tx, out["post+tx"] = run(lambda: (a.qp.post_send(w, 0.0), a.port.take_tx())[1])
    top("post+tx")
    body = join(tx[0])
    acks, out["recv SEND+ACK"] = run(lambda: (b.port.receive(body, ma, 0.0), b.port.take_tx())[1])
    top("recv SEND+ACK")
    ack = join(acks[0])
    _, out["ACK"] = run(lambda: a.port.receive(ack, mb, 0.0))
    top("ACK")

    def write(wr_id: int) -> SendWQE:
        a.qp.req.cwnd = 1 << 20  # the whole message in one window
        return SendWQE(wr_id, int(e.IBV_WR_RDMA_WRITE), sig, [SGE(a.mr.addr, 1 << 20, a.mr.lkey)],
                       remote_addr=b.mr.addr, rkey=b.mr.rkey)

    wq = write(10)
    txw, n = run(lambda: (a.qp.post_send(wq, 0.0), a.port.take_tx(acks=False))[1])
    out["WRITE tx/pkt"] = n / len(txw)
    bodies = [join(x) for x in txw]

    def rx_single() -> None:
        for x in bodies:
            b.port.receive(x, ma, 0.0)

    _, n = run(rx_single)
    out["rx single/pkt"] = n / len(bodies)
    top("rx single")
    b.port.take_tx()
    wq = write(11)
    a.qp.post_send(wq, 0.0)
    bodies = [join(x) for x in a.port.take_tx(acks=False)]
    last = len(bodies) - 1

    def rx_run() -> None:
        b.port.receive(bodies[0], ma, 0.0)  # FIRST
        for j in range(1, last, 16):
            b.port.receive_run(bodies[j:min(j + 16, last)], ma)
        b.port.receive(bodies[last], ma, 0.0)  # LAST

    _, n = run(rx_run)
    out["rx run/pkt"] = n / len(bodies)
    return out


def measure_tree(tree: str, functions: bool) -> dict[str, float]:
    """Measure ``tree`` (a checkout with src/ and tests/) in a fresh interpreter."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", tree]
    if functions:
        cmd.append("--functions")
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    lines = res.stdout.splitlines()
    for line in lines[:-1]:
        print(line)
    vals = lines[-1].split()
    return dict(zip(KEYS, (float(v) for v in vals), strict=True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trees", nargs="*", help="checkouts to measure (first: the baseline)")
    ap.add_argument("--functions", action="store_true", help="list the top functions")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        sys.path[:0] = [os.path.join(args.child, "src"), os.path.join(args.child, "tests")]
        out = measure_here(args.functions)
        print(" ".join(f"{out[k]:.1f}" for k in KEYS))
        return
    trees = args.trees or [ROOT]
    base: dict[str, float] | None = None
    for tree in trees:
        out = measure_tree(tree, args.functions)
        figs = []
        for k in KEYS:
            s = f"{k} {out[k]:.1f}"
            if base is not None and base[k]:
                s += f" ({out[k] / base[k]:.2f}x)"
            figs.append(s)
        print(f"{tree}: " + ", ".join(figs))
        if base is None:
            base = out


if __name__ == "__main__":
    main()
