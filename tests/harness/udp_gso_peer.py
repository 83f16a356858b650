"""One side of the RC RDMA WRITE of ``tests/drivers/test_udp_gso_netns.py`` (run inside a network
namespace by ``ip netns exec``), over RoCEv2 with UDP GSO/GRO as configured.

    python udp_gso_peer.py IP writer|target MSG COUNT MTU

Each side prints one JSON line (QPN, GID, MR address and key), reads the peer's, and
connects an RC QP (path MTU enum ``MTU``) and says ``{"ready": ROLE}``. The writer, told
"go", posts ``COUNT`` RDMA WRITEs of
``MSG`` bytes, waits for their completions and prints its UdpLink counters as a JSON
line. The target waits for a line on stdin, then prints the SHA-256 of its buffer and
its counters.
"""

from __future__ import annotations

import hashlib
import json
import sys

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.drivers.links.udp import UdpLink

ACC = int(e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE)
DEPTH = 4


def pattern(size: int) -> bytes:
    return bytes((i * 7 + (i >> 10)) & 0xFF for i in range(size))


def main(argv: list[str]) -> int:
    ip, role, msg, count, mtu = argv[0], argv[1], int(argv[2]), int(argv[3]), int(argv[4])
    link = UdpLink(ip)
    ctx = v.Context("gso", link=link)
    try:
        pd = v.PD(ctx)
        buf = bytearray(pattern(msg)) if role == "writer" else bytearray(msg)
        mr = v.MR(pd, msg, ACC, buffer=buf)
        cq = v.CQ(ctx, 64)
        cap = v.QPCap(max_send_wr=DEPTH, max_recv_wr=4, max_send_sge=1, max_recv_sge=1)
        qp = v.QP(pd, v.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap))
        gid = ctx.query_gid(1, 0)
        print(json.dumps({"qpn": qp.qp_num, "gid": gid.raw.hex(), "addr": int(mr.addr),
                          "rkey": mr.rkey}), flush=True)
        peer = json.loads(sys.stdin.readline())
        qp.modify(v.QPAttr(qp_state=e.IBV_QPS_INIT, pkey_index=0, port_num=1,
                           qp_access_flags=int(e.IBV_ACCESS_REMOTE_WRITE)),
                  int(e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT
                      | e.IBV_QP_ACCESS_FLAGS))
        ah = v.AHAttr(port_num=1, is_global=1,
                      gr=v.GlobalRoute(dgid=v.GID(bytes.fromhex(peer["gid"])), sgid_index=0,
                                       hop_limit=64))
        qp.modify(v.QPAttr(qp_state=e.IBV_QPS_RTR, path_mtu=mtu, dest_qp_num=peer["qpn"],
                           rq_psn=0, max_dest_rd_atomic=1, min_rnr_timer=1, ah_attr=ah),
                  int(e.IBV_QP_STATE | e.IBV_QP_AV | e.IBV_QP_PATH_MTU | e.IBV_QP_DEST_QPN
                      | e.IBV_QP_RQ_PSN | e.IBV_QP_MAX_DEST_RD_ATOMIC
                      | e.IBV_QP_MIN_RNR_TIMER))
        qp.modify(v.QPAttr(qp_state=e.IBV_QPS_RTS, timeout=14, retry_cnt=7, rnr_retry=7,
                           sq_psn=0, max_rd_atomic=1),
                  int(e.IBV_QP_STATE | e.IBV_QP_TIMEOUT | e.IBV_QP_RETRY_CNT
                      | e.IBV_QP_RNR_RETRY | e.IBV_QP_SQ_PSN | e.IBV_QP_MAX_QP_RD_ATOMIC))
        print(json.dumps({"ready": role}), flush=True)  # RTS: the test says "go" after both
        if role == "writer":
            sys.stdin.readline()  # "go": the capture is running
            wr = v.SendWR(wr_id=1, opcode=e.IBV_WR_RDMA_WRITE, num_sge=1,
                          sg=[v.SGE(mr.addr, msg, mr.lkey)], send_flags=e.IBV_SEND_SIGNALED)
            wr.set_wr_rdma(peer["rkey"], peer["addr"])
            posted = done = 0
            while done < count:
                while posted < count and posted - done < DEPTH:
                    qp.post_send(wr)
                    posted += 1
                got, wcs = cq.poll(16)
                for wc in wcs[:got]:
                    if wc.status:
                        print(json.dumps({"error": str(wc)}), flush=True)
                        return 1
                done += got
        else:
            sys.stdin.readline()  # "check"
            print(json.dumps({"sha256": hashlib.sha256(buf).hexdigest()}), flush=True)
        print(json.dumps({"stats": link.stats.as_dict(), "gso": link.gso, "gro": link.gro}),
              flush=True)
        sys.stdin.readline()  # "bye"
        return 0
    finally:
        ctx.close()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
