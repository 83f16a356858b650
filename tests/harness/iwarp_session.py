"""An iWARP session written to a capture by ``Context(pcap=...)``.

(Moved from tests/drivers/test_trace_pcap_v1_iwarp.py, which other test files imported.)"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from harness import ports
from softrdma import enums as e
from softrdma import verbs as v
from softrdma.drivers.cm import iwconnect
from softrdma.iwarp.mpa_setup import MpaConfig

ALL = int(e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ)


# ---- iWARP -----------------------------------------------------------------------------------
def _iwarp_session(pcap: Path, markers: bool = False) -> int:
    """A send/RDMA write session between two QPs of the iWARP loopback device over real
    TCP; returns the number of messages sent."""
    port = ports.free_port()
    ctx = v.Context(transport="iwarp", pcap=pcap)
    sizes = (0, 100, 5000, 300000)
    try:
        pd = v.PD(ctx)
        cq = v.CQ(ctx, 64)
        qps = [v.QP(pd, v.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq,
                                     cap=v.QPCap(8, 8, 1, 1))) for _ in range(2)]
        mr = v.MR(pd, 1 << 20, ALL)
        cfg = MpaConfig(crc=True, markers=markers)
        lst = iwconnect.listen(ctx, port, cfg=cfg)
        t = threading.Thread(target=lambda: lst.accept(qps[1], b"srv"))
        t.start()
        conn = iwconnect.connect(qps[0], "127.0.0.1", port, b"cli", cfg=cfg)
        t.join(20)
        for size in sizes:
            qps[1].post_recv(v.RecvWR(1, 1, [v.SGE(mr.addr, 1 << 19, mr.lkey)]))
            qps[0].post_send(v.SendWR(2, None, 1, [v.SGE(mr.addr + (1 << 19), size,
                                                         mr.lkey)]))
            got = 0
            end = time.monotonic() + 30
            while got < 2 and time.monotonic() < end:
                n, _w = cq.poll(2)
                got += n
            assert got == 2
        w = v.SendWR(3, None, 1, [v.SGE(mr.addr, 64, mr.lkey)],
                     opcode=int(e.IBV_WR_RDMA_WRITE))
        w.set_wr_rdma(mr.rkey, mr.addr + 4096)
        qps[0].post_send(w)
        end = time.monotonic() + 30
        while not cq.poll(1)[0] and time.monotonic() < end:
            pass
        conn.disconnect()
        lst.close()
        time.sleep(0.3)
    finally:
        ctx.close()
    return len(sizes) + 1
