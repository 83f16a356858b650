"""Worked example for a student: watch the InfiniBand transport at work, packet by packet.

Two RC queue pairs talk over an in-memory network (a virtual clock: every run is the
same). Three exchanges, each printed as the packets that carried it, decoded from the
capture the way a protocol analyser does it: Ethernet -> IPv4 -> UDP 4791 -> BTH and
the extension headers (IBA 9.2-9.3), then the ICRC checked (IBA 7.8.1, RoCEv2 as in
docs/protocols.md §2):

1. a SEND of 3000 bytes with a path MTU of 1024: SEND_FIRST, SEND_MIDDLE, SEND_LAST,
   consecutive PSNs (IBA 9.5), acknowledged by one coalesced ACK (IBA 9.7.5.1.2);
2. an RDMA READ of 2000 bytes: one READ_REQUEST (with RETH: VA, R_Key, length), answered
   by READ_RESPONSE_FIRST and _LAST, which carry the AETH (IBA 9.4.3, 9.7.5.1.4);
3. the same SEND again, with the network losing its SEND_MIDDLE once: the responder sees
   a PSN it did not expect, answers NAK "PSN sequence error" (IBA 9.7.5.2.2) and the
   requester goes back to that PSN (go-back-N, IBA 9.7.6.1.3).

Run it::

    python examples/student_packets.py
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.drivers.links.fabric import Fabric
from softrdma.drivers.runtime.clock import VirtualClock
from softrdma.wire import ib, roce
from softrdma.wire.opcodes import Hdr
from softrdma.wire.pcap import read_pcap

ALL = int(e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ)
SEND_MIDDLE = 0x01  # RC SEND_MIDDLE opcode (IBA Table 38)
NAMES = {bytes([10, 9, 0, 1]): "A", bytes([10, 9, 0, 2]): "B"}


def make_pair(fab: Fabric) -> tuple[list[v.Context], list[tuple[v.CQ, v.QP, v.MR]]]:
    ctxs = [v.Context(fabric=fab.link(ip)) for ip in ("10.9.0.1", "10.9.0.2")]
    sides = []
    for ctx in ctxs:
        pd = v.PD(ctx)
        cq = v.CQ(ctx, 16)
        qp = v.QP(pd, v.QPInitAttr(e.IBV_QPT_RC, scq=cq, rcq=cq, cap=v.QPCap(4, 4, 1, 1)))
        sides.append((cq, qp, v.MR(pd, 8192, ALL)))
    for (_, qp, _), (_, peer, _), peer_ctx in ((sides[0], sides[1], ctxs[1]),
                                               (sides[1], sides[0], ctxs[0])):
        at = v.QPAttr(path_mtu=e.IBV_MTU_1024, dest_qp_num=peer.qp_num, sq_psn=100,
                      rq_psn=100, max_rd_atomic=1, max_dest_rd_atomic=1, min_rnr_timer=1,
                      timeout=8, retry_cnt=7, rnr_retry=7)
        at.qp_access_flags = ALL
        at.ah_attr = v.AHAttr(gr=v.GlobalRoute(dgid=peer_ctx.query_gid(1, 0), hop_limit=64))
        qp.to_rts(at)
    return ctxs, sides


def explain(pkt: ib.IBPacket) -> str:
    """What the headers say, in words."""
    extra = []
    if pkt.info.hdrs & Hdr.RETH:
        extra.append(f"RETH VA=0x{pkt.va:x} R_Key=0x{pkt.rkey:x} length={pkt.dma_len}")
    if pkt.ackreq:
        extra.append("AckReq")
    return ib.describe(pkt) + ("  [" + ", ".join(extra) + "]" if extra else "")


def show(pcap: Path) -> None:
    """Print every frame of ``pcap``, decoded."""
    for n, rec in enumerate(read_pcap(pcap), 1):
        frame = roce.parse_frame(rec.data, rec.linktype)
        assert frame is not None
        src, dst = NAMES[bytes(frame.ip[12:16])], NAMES[bytes(frame.ip[16:20])]
        icrc = "ICRC ok" if roce.icrc_ok_frame(rec.data) else "ICRC BAD"
        print(f"  {n:2d}  t={rec.ts * 1e6:7.1f} us  {src} -> {dst}  {explain(frame.packet)}"
              f"  ({icrc})")


def main() -> int:
    clock = VirtualClock()
    fab = Fabric(clock, latency=2e-6)
    ctxs, ((cqa, qpa, mra), (cqb, qpb, mrb)) = make_pair(fab)
    ok = True
    with tempfile.TemporaryDirectory() as tmp:

        def step(title: str, name: str, post: Callable[[], None]) -> None:
            nonlocal ok
            pcap = Path(tmp) / f"{name}.pcap"
            fab.capture(pcap)  # what the network delivers during this step
            post()
            clock.run()  # until nothing is left to do
            fab.stop_capture()
            wcs = [("A", w) for w in cqa.poll(8)[1]] + [("B", w) for w in cqb.poll(8)[1]]
            ok = ok and bool(wcs) and all(w.status == e.IBV_WC_SUCCESS for _, w in wcs)
            print(title)
            show(pcap)
            print("  completions: " + ", ".join(
                f"{side} {e.ibv_wc_opcode(w.opcode).name} {v.wc_status_str(w.status)}"
                for side, w in wcs))

        def send() -> None:
            qpb.post_recv(v.RecvWR(1, 1, [v.SGE(mrb.addr, 4096, mrb.lkey)]))
            qpa.post_send(v.SendWR(2, None, 1, [v.SGE(mra.addr, 3000, mra.lkey)]))

        def read() -> None:
            wr = v.SendWR(3, None, 1, [v.SGE(mra.addr + 4096, 2000, mra.lkey)],
                          e.IBV_WR_RDMA_READ)
            wr.set_wr_rdma(mrb.rkey, mrb.addr)
            qpa.post_send(wr)

        step("1. SEND of 3000 bytes, path MTU 1024", "send", send)
        step("2. RDMA READ of 2000 bytes from B's memory", "read", read)
        fab.add_rule(lambda d: d.data[0] == SEND_MIDDLE, "drop", count=1)
        step("3. the same SEND, its SEND_MIDDLE lost once on the way", "loss", send)
    for ctx in ctxs:
        ctx.close()
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
