"""A softrdma UD multicast endpoint run inside a host of :mod:`harness.netns`.

``python netns_endpoint.py recv MGID [--shared 0|1] [--device DEV]``: opens the host's
``DEV`` (default ``rxe0``), creates
a UD QP, attaches it to MGID (``ibv_attach_mcast``), prints ``{"ready": QPN}`` and then
one JSON line per received message ``{"msg": TEXT, "sgid": GID, "slid": N}``. Commands
on stdin, one a line: ``detach`` (prints ``{"detached": true}``), ``attach`` (prints
``{"attached": true}``), ``quit``.

``python netns_endpoint.py send MGID SGID_INDEX TEXT...``: sends each TEXT to the group
(DestQP 0xFFFFFF, IBA 10.5) and prints ``{"sent": N}``.

Every message is a UD SEND with Q_Key :data:`QKEY`; a receive buffer holds the 40-byte
GRH area first (IBA 11.4.1.2).
"""

from __future__ import annotations

import argparse
import json
import select
import sys
import threading
import time

from softrdma import enums as e
from softrdma import verbs as v

QKEY = 0x11111111
MCAST_QPN = 0xFFFFFF
GRH = 40
BUF = 4096
DEPTH = 64


def _emit(obj: object) -> None:
    print(json.dumps(obj), flush=True)


def _ud_qp(ctx: v.Context) -> tuple[v.PD, v.CQ, v.QP, v.MR]:
    pd = v.PD(ctx)
    cq = v.CQ(ctx, 2 * DEPTH)
    qp = v.QP(pd, v.QPInitAttr(qp_type=int(e.IBV_QPT_UD), scq=cq, rcq=cq,
                               cap=v.QPCap(DEPTH, DEPTH)))
    attr = v.QPAttr(qkey=QKEY)
    qp.to_rts(attr)
    mr = v.MR(pd, BUF * DEPTH, int(e.IBV_ACCESS_LOCAL_WRITE))
    return pd, cq, qp, mr


def recv(args: argparse.Namespace) -> int:
    ctx = v.Context(args.device, shared=bool(args.shared))
    _pd, cq, qp, mr = _ud_qp(ctx)
    for i in range(DEPTH):
        qp.post_recv(v.RecvWR(i, 1, [v.SGE(mr.addr + i * BUF, BUF, mr.lkey)]))
    qp.attach_mcast(args.mgid)
    _emit({"ready": qp.qp_num})
    lock = threading.Lock()
    stop = threading.Event()

    def commands() -> None:
        for line in sys.stdin:
            cmd = line.strip()
            with lock:
                if cmd == "detach":
                    qp.detach_mcast(args.mgid)
                    _emit({"detached": True})
                elif cmd == "attach":
                    qp.attach_mcast(args.mgid)
                    _emit({"attached": True})
                elif cmd == "quit":
                    break
        stop.set()

    threading.Thread(target=commands, daemon=True).start()
    while not stop.is_set():
        # polled and printed under the lock: a message taken before a detach is printed
        # before its {"detached": true}, never after it
        with lock:
            _, wcs = cq.poll(16)
            for wc in wcs:
                if wc.status != e.IBV_WC_SUCCESS:
                    _emit({"error": int(wc.status)})
                    continue
                i = int(wc.wr_id)
                data = mr.read(wc.byte_len - GRH, i * BUF + GRH)
                _emit({"msg": data.decode(), "slid": wc.slid, "src_qp": wc.src_qp,
                       "grh": bool(wc.wc_flags & e.IBV_WC_GRH)})
                qp.post_recv(v.RecvWR(i, 1, [v.SGE(mr.addr + i * BUF, BUF, mr.lkey)]))
        if not wcs:
            time.sleep(0.005)
    return 0


def send(args: argparse.Namespace) -> int:
    ctx = v.Context(args.device, shared=bool(args.shared))
    pd, cq, qp, mr = _ud_qp(ctx)
    ah = v.AH(pd, v.AHAttr(gr=v.GlobalRoute(dgid=args.mgid, sgid_index=args.sgid_index),
                           is_global=1))
    for n, text in enumerate(args.text):
        raw = text.encode()
        mr.write(raw, len(raw), 0)
        wr = v.SendWR(n, sg=[v.SGE(mr.addr, len(raw), mr.lkey)])
        wr.set_wr_ud(ah, MCAST_QPN, QKEY)
        qp.post_send(wr)
        deadline = time.monotonic() + 5
        while True:
            _, wcs = cq.poll(1)
            if wcs:
                if wcs[0].status != e.IBV_WC_SUCCESS:
                    _emit({"error": int(wcs[0].status)})
                    return 1
                break
            if time.monotonic() > deadline:
                _emit({"error": "no send completion"})
                return 1
            select.select([], [], [], 0.001)
    _emit({"sent": len(args.text)})
    return 0


def main() -> int:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="role", required=True)
    r = sub.add_parser("recv")
    r.add_argument("mgid")
    r.add_argument("--shared", type=int, default=1)
    r.add_argument("--device", default="rxe0")
    s = sub.add_parser("send")
    s.add_argument("mgid")
    s.add_argument("sgid_index", type=int)
    s.add_argument("text", nargs="+")
    s.add_argument("--shared", type=int, default=1)
    s.add_argument("--device", default="rxe0")
    args = p.parse_args()
    return recv(args) if args.role == "recv" else send(args)


if __name__ == "__main__":
    sys.exit(main())
