"""One side of the RoCEv1 verbs exchange of ``tests/drivers/test_rocev1_netns.py`` (run inside a
network namespace by ``ip netns exec``): RC SEND, RDMA WRITE/READ, ATOMIC CMP_AND_SWP and
FETCH_AND_ADD, and a UD SEND, between two hosts over RoCEv1 (Annex A16, CA16-15).

    python rocev1_peer.py server DEV GID_INDEX PORT
    python rocev1_peer.py client DEV GID_INDEX PORT SERVER_IP

The QP numbers, GIDs and keys go over a TCP connection as JSON lines. Prints ``OK ...``
and exits 0 when every check passed; a failed check exits non-zero with the reason.
"""

from __future__ import annotations

import json
import socket
import struct
import sys
import time

from softrdma import enums as e
from softrdma import verbs as v

W = e.ibv_wr_opcode
ACC = int(e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
          | e.IBV_ACCESS_REMOTE_ATOMIC)
SIG = int(e.IBV_SEND_SIGNALED)
QKEY = 0x11223344
SIZE = 1 << 16
ATOMIC_OFF = 8192


def wait_wc(ctx: v.Context, cq: v.CQ, timeout: float = 60.0) -> v.WC:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        n, wcs = cq.poll(1)
        if n:
            if wcs[0].status != 0:
                raise SystemExit(f"completion error: {wcs[0]}")
            return wcs[0]
        time.sleep(0.0005)
    raise SystemExit("timed out waiting for a completion")


def main() -> int:
    role, dev, gid_index, port = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    ctx = v.Context(dev)
    if ctx.query_gid_type(1, gid_index) != e.IBV_GID_TYPE_ROCE_V1:
        raise SystemExit(f"GID {gid_index} of {dev} is not a RoCE v1 GID")
    pd = v.PD(ctx)
    buf = bytearray(SIZE)
    mr = v.MR(pd, 0, ACC, buffer=buf)
    cq = v.CQ(ctx, 64)
    rc = v.QP(pd, v.QPInitAttr(qp_type=int(e.IBV_QPT_RC), scq=cq, rcq=cq, cap=v.QPCap(16, 16)))
    ud = v.QP(pd, v.QPInitAttr(qp_type=int(e.IBV_QPT_UD), scq=cq, rcq=cq, cap=v.QPCap(16, 16)))
    gid = ctx.query_gid(1, gid_index)
    me = {"gid": str(gid), "rc": rc.qp_num, "ud": ud.qp_num, "rkey": mr.rkey, "addr": mr.addr}
    if role == "server":
        lsock = socket.create_server(("", port))
        lsock.settimeout(120)
        conn, _ = lsock.accept()
    else:
        deadline = time.monotonic() + 120  # the server starts slowly on a loaded host
        while True:
            try:
                conn = socket.create_connection((sys.argv[5], port), timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
    f = conn.makefile("rw")
    f.write(json.dumps(me) + "\n")
    f.flush()
    peer = json.loads(f.readline())
    a = v.QPAttr(path_mtu=int(e.IBV_MTU_1024), dest_qp_num=peer["rc"], rq_psn=0, sq_psn=0,
                 max_dest_rd_atomic=4, max_rd_atomic=4, min_rnr_timer=1, timeout=14,
                 retry_cnt=7, rnr_retry=7)
    a.qp_access_flags = ACC
    a.ah_attr = v.AHAttr(gr=v.GlobalRoute(dgid=v.GID(peer["gid"]), sgid_index=gid_index,
                                          hop_limit=1), sl=2)
    rc.to_rts(a)
    ud.to_rts(v.QPAttr(qkey=QKEY))
    if role == "server":
        rc.post_recv(v.RecvWR(1, 1, [v.SGE(mr.addr + 4096, 1024, mr.lkey)]))
        ud.post_recv(v.RecvWR(2, 1, [v.SGE(mr.addr + 6144, 40 + 1024, mr.lkey)]))
        struct.pack_into("=Q", buf, ATOMIC_OFF, 100)
        f.write("ready\n")
        f.flush()
        got = sorted((wait_wc(ctx, cq), wait_wc(ctx, cq)), key=lambda w: w.wr_id)
        assert got[0].byte_len == 11 and bytes(buf[4096:4107]) == b"rc over v1!"
        assert got[1].byte_len == 40 + 11 and bytes(buf[6184:6195]) == b"ud over v1!"
        grh = bytes(buf[6144:6184])  # A16.3.1: the UD receive holds the packet's GRH
        assert grh[0] >> 4 == 6 and grh[6] == 0x1B and grh[8:24] == v.GID(peer["gid"]).raw
        f.readline()  # the client is done with its one-sided operations
        counter = struct.unpack_from("=Q", buf, ATOMIC_OFF)[0]
        assert counter == 100 + 5 + 7, counter  # CMP_AND_SWP 100 -> 105, then FAA 7
        assert bytes(buf[:300]) == bytes(range(256)) + bytes(range(44))
        f.write("verified\n")
        f.flush()
        print("OK server", counter)
        return 0
    f.readline()  # "ready"
    src = bytes(range(256)) + bytes(range(44))
    buf[:300] = src
    w = v.SendWR(10, opcode=int(W.IBV_WR_RDMA_WRITE), sg=[v.SGE(mr.addr, 300, mr.lkey)],
                 send_flags=SIG)
    w.set_wr_rdma(peer["rkey"], peer["addr"])
    rc.post_send(w)
    wait_wc(ctx, cq)
    r = v.SendWR(11, opcode=int(W.IBV_WR_RDMA_READ), sg=[v.SGE(mr.addr + 1024, 300, mr.lkey)],
                 send_flags=SIG)
    r.set_wr_rdma(peer["rkey"], peer["addr"])
    rc.post_send(r)
    wait_wc(ctx, cq)
    assert bytes(buf[1024:1324]) == src
    for op, wr_id, cmp_add, swap, old in ((W.IBV_WR_ATOMIC_CMP_AND_SWP, 12, 100, 105, 100),
                                          (W.IBV_WR_ATOMIC_FETCH_AND_ADD, 13, 7, 0, 105)):
        at = v.SendWR(wr_id, opcode=int(op), sg=[v.SGE(mr.addr + 2048, 8, mr.lkey)],
                      send_flags=SIG)
        at.set_wr_atomic(peer["rkey"], peer["addr"] + ATOMIC_OFF, cmp_add, swap)
        rc.post_send(at)
        wait_wc(ctx, cq)
        got = struct.unpack_from("=Q", buf, 2048)[0]
        assert got == old, (op, got)
    buf[3000:3011] = b"rc over v1!"
    rc.post_send(v.SendWR(14, sg=[v.SGE(mr.addr + 3000, 11, mr.lkey)], send_flags=SIG))
    wait_wc(ctx, cq)
    ah = v.AH(pd, v.AHAttr(gr=v.GlobalRoute(dgid=v.GID(peer["gid"]), sgid_index=gid_index,
                                           hop_limit=1), sl=4))
    buf[3100:3111] = b"ud over v1!"
    u = v.SendWR(15, sg=[v.SGE(mr.addr + 3100, 11, mr.lkey)], send_flags=SIG)
    u.set_wr_ud(ah, peer["ud"], QKEY)
    ud.post_send(u)
    wait_wc(ctx, cq)
    f.write("done\n")
    f.flush()
    if f.readline().strip() != "verified":
        raise SystemExit("the server did not verify")
    print("OK client")
    return 0


if __name__ == "__main__":
    sys.exit(main())
