"""Worked example for a protocol or NIC engineer: RC over a lossy in-memory fabric.

Two devices on :class:`softrdma.drivers.links.fabric.Fabric`, a simulated network on a
virtual clock: nothing waits for real time, and the same seed gives the same run, packet
for packet. The fabric drops and reorders datagrams at random; an RC QP pair moves a
64 KiB RDMA WRITE and a SEND across it anyway (IBA 9.7: PSN sequence checks, NAK
"PSN sequence error", go-back-N retransmission, the ACK timeout).

What it shows:

* the port counters of both sides (retransmissions, NAKs, out-of-sequence drops: the
  requester/responder behaviour of IBA 9.7.5-9.7.6, as ``rdma statistic`` names them);
* the fabric's own count of what it did to the traffic;
* a pcap of every delivered datagram, which ``softrdma pcap-check`` (and tshark)
  decode: each packet's ICRC, then the RC conversation (first PSNs, gaps explained by
  the retransmissions, ACK/NAK coherence).

Run it::

    python examples/nic_lossy_fabric.py --drop 0.05 --seed 7 --pcap /tmp/lossy.pcap
    softrdma pcap-check -v /tmp/lossy.pcap | head
"""

from __future__ import annotations

import argparse
import io
import tempfile
from pathlib import Path

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.drivers.links.fabric import Fabric
from softrdma.drivers.runtime.clock import VirtualClock
from softrdma.tools.capture import pcap_check

ALL = int(e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ)
SIZE = 64 * 1024


def endpoint(ctx: v.Context) -> tuple[v.CQ, v.QP, v.MR]:
    pd = v.PD(ctx)
    cq = v.CQ(ctx, 64)
    qp = v.QP(pd, v.QPInitAttr(e.IBV_QPT_RC, scq=cq, rcq=cq, cap=v.QPCap(8, 8, 1, 1)))
    return cq, qp, v.MR(pd, 2 * SIZE, ALL)


def connect(qp: v.QP, peer: v.QP, peer_ctx: v.Context) -> None:
    """RESET -> INIT -> RTR -> RTS towards ``peer`` (MTU 1024, 7 retries, a short ACK
    timeout: 4.096 us * 2^8 ~ 1 ms of virtual time)."""
    at = v.QPAttr(path_mtu=e.IBV_MTU_1024, dest_qp_num=peer.qp_num, max_rd_atomic=1,
                  max_dest_rd_atomic=1, min_rnr_timer=1, timeout=8, retry_cnt=7, rnr_retry=7)
    at.qp_access_flags = ALL
    at.ah_attr = v.AHAttr(gr=v.GlobalRoute(dgid=peer_ctx.query_gid(1, 0), hop_limit=64))
    qp.to_rts(at)


def run(drop: float, reorder: float, seed: int, pcap: Path) -> int:
    clock = VirtualClock()
    fab = Fabric(clock, seed=seed, drop=drop, reorder=reorder, latency=2e-6)
    fab.capture(pcap)
    a = v.Context(fabric=fab.link("10.7.0.1"))
    b = v.Context(fabric=fab.link("10.7.0.2"))
    (cqa, qpa, mra), (cqb, qpb, mrb) = endpoint(a), endpoint(b)
    connect(qpa, qpb, b)
    connect(qpb, qpa, a)

    pattern = bytes((i * 31 + 7) & 0xFF for i in range(SIZE))
    mra.write(pattern, SIZE, 0)
    qpb.post_recv(v.RecvWR(1, 1, [v.SGE(mrb.addr + SIZE, 64, mrb.lkey)]))
    write = v.SendWR(10, None, 1, [v.SGE(mra.addr, SIZE, mra.lkey)], e.IBV_WR_RDMA_WRITE)
    write.set_wr_rdma(mrb.rkey, mrb.addr)
    note = v.SendWR(11, None, 1, [v.SGE(mra.addr, 64, mra.lkey)])
    qpa.post_send([write, note])
    clock.run()  # until nothing is left to do: every packet, retry and timer

    wcs = cqa.poll(8)[1] + cqb.poll(8)[1]
    ok = all(w.status == e.IBV_WC_SUCCESS for w in wcs) and len(wcs) == 3
    placed = mrb.read(SIZE, 0) == pattern
    print(f"fabric: drop {drop:g}, reorder {reorder:g}, seed {seed}: "
          f"{fab.stats.sent} datagrams sent, {fab.stats.dropped} dropped, "
          f"{fab.stats.reordered} reordered, {fab.stats.delivered} delivered")
    print(f"completions: {len(wcs)} ({'all successful' if ok else 'FAILED'}), "
          f"64 KiB placed {'intact' if placed else 'CORRUPTED'}")
    for name, ctx in (("requester", a), ("responder", b)):
        c = ctx.query_port_counters()
        print(f"{name}: sent {c.sent_pkts} packets ({c.retransmitted_pkts} retransmitted), "
              f"received {c.rcvd_pkts}; NAKs sent {c['sent_nak']}, received "
              f"{c['rcvd_nak']}; dropped {c.total_drops} "
              f"({', '.join(f'{k} {n}' for k, n in c.drops.items() if n) or 'none'})")
    fab.stop_capture()
    a.close()
    b.close()
    out = io.StringIO()
    status = pcap_check.run([str(pcap)], out=out, err=out)
    for line in out.getvalue().splitlines():
        print(f"pcap-check: {line.split(': ', 1)[-1] if line.startswith(str(pcap)) else line}")
    return 0 if ok and placed and status == 0 else 1


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--drop", type=float, default=0.05)
    p.add_argument("--reorder", type=float, default=0.02)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--pcap", type=Path, default=None,
                   help="keep the capture here (default: a temporary file)")
    a = p.parse_args()
    if a.pcap is not None:
        raise SystemExit(run(a.drop, a.reorder, a.seed, a.pcap))
    with tempfile.TemporaryDirectory() as d:
        raise SystemExit(run(a.drop, a.reorder, a.seed, Path(d) / "lossy.pcap"))
