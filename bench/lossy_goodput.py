"""Goodput of an RC QP on a lossy link, against the same link without loss (issue 25).

One RC QP pair keeps 8 RDMA WRITEs of 256 KiB posted across a 1 Gbit/s link (5 us of
propagation, a 300-packet queue that marks ECN CE from 16 packets on, as a DCQCN switch
port does) that loses packets at random: 0 %, 1 %, 5 %. Everything runs on the engine's
virtual clock (tests/harness/bottleneck.py), so the figure is the protocol's (go-back-N,
the congestion window, CNPs, the adaptive transport timer), not the machine's: goodput is
the bytes of completed WRITEs per virtual second over 100 ms. ``python
bench/lossy_goodput.py`` prints goodput, retransmitted packets and window cuts per loss rate.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from harness.bottleneck import BottleneckNet  # noqa: E402
from harness.cc_flows import drive, flows  # noqa: E402

RATE_BPS = 1e9
DURATION_S = 0.1


def goodput(loss: float, seed: int = 0, duration: float = DURATION_S) -> dict[str, float]:
    """One run: goodput (bit/s of completed WRITE payload) and what it cost."""
    net = BottleneckNet(rate_bps=RATE_BPS, latency=5e-6, queue=300, ecn_k=16, loss=loss,
                        seed=seed)
    (f,) = flows(net, 1, size=256 * 1024, depth=8, mtu=5, timeout=8)
    drive(net, [f], duration)
    if f.errors:
        raise RuntimeError(f"{f.errors} WRITEs failed at {loss:.0%} loss")
    c = f.a.port.counters
    return {"goodput_bps": f.done_bytes * 8 / duration, "sent": float(net.sent),
            "retransmitted": float(c.retransmitted_pkts),
            "window_cuts": float(f.a.qp.req.window.losses + f.a.qp.req.window.cnps)}


def pair(loss: float, seed: int, duration: float = DURATION_S) -> tuple[float, float]:
    """(goodput at ``loss``, goodput without loss), in Mbit/s, for one seed."""
    return (goodput(loss, seed, duration)["goodput_bps"] / 1e6,
            goodput(0.0, seed, duration)["goodput_bps"] / 1e6)


def main() -> None:
    for loss in (0.0, 0.01, 0.05):
        for seed in range(3):
            r = goodput(loss, seed)
            print(f"loss {loss:4.0%} seed {seed}: {r['goodput_bps'] / 1e6:7.1f} Mbit/s, "
                  f"{r['sent']:.0f} packets sent, {r['retransmitted']:.0f} retransmitted, "
                  f"{r['window_cuts']:.0f} window cuts")


if __name__ == "__main__":
    main()
