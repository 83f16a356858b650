"""A hand-made IPoIB peer for the namespace tests: it speaks to a running
``softrdma ipoib`` interface over the wire, as a misbehaving or Linux-style peer would.

``python ipoib_peer.py DEVICE PEER_GID PEER_UD_QPN ACTION [ARG]`` prints one JSON line:

* ``req-pd HEX``: send a REQ to the peer's IPoIB Service ID with private data HEX; report
  the answer (REJECTED: reason and the UD QPN in the REJ private data; or ESTABLISHED);
* ``linux-conn UD_QPN``: open a connection as a Linux peer opens its own (valid private
  data naming ``UD_QPN``), report whether it was accepted, keep it up 3 s, then close;
* ``ud-garbage``: send malformed IPoIB messages (short encapsulation header, unknown
  Type, truncated ARP, ARP with a wrong hardware type) to the peer's UD QPN.
"""

from __future__ import annotations

import ipaddress
import json
import sys
import time

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.cm.events import CmEvent, CmEventType
from softrdma.cm.gsi import CmBinding
from softrdma.cm.ibcm import ConnParams
from softrdma.ipoib.hwaddr import CmData, service_id

IPOIB_QKEY = 0x0000000B


def wait_event(events: list[CmEvent], timeout: float = 20.0) -> CmEvent:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for ev in list(events):
            if ev.type is not CmEventType.TIMEWAIT_EXIT:
                events.remove(ev)
                return ev
        time.sleep(0.02)
    raise SystemExit(json.dumps({"error": "no CM event"}))


def main() -> None:
    dev, gid_text, qpn_text, action = sys.argv[1:5]
    arg = sys.argv[5] if len(sys.argv) > 5 else ""
    peer_gid = ipaddress.IPv6Address(gid_text).packed
    peer_qpn = int(qpn_text, 0)
    ctx = v.Context(dev)
    pd = v.PD(ctx)
    cq = v.CQ(ctx, 64)
    sgid = next(g for g in ctx.port.gids if g[:12] != bytes(10) + b"\xff\xff"
                and g[:2] != b"\xfe\x80")
    if action in ("req-pd", "linux-conn"):
        cm = CmBinding.attach(ctx)
        events: list[CmEvent] = []
        qp = v.QP(pd, v.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=v.QPCap(4, 4, 1, 1)))
        cid = cm.agent.create_id(events.append)
        data = (bytes.fromhex(arg) if action == "req-pd"
                else CmData(int(arg, 0), 65524).encode())
        cid.connect(qp, ConnParams(service_id=service_id(peer_qpn), dgid=peer_gid, sgid=sgid,
                                   private_data=data))
        ev = wait_event(events)
        out: dict[str, object] = {"event": ev.type.value}
        if ev.type is CmEventType.REJECTED and ev.reject is not None:
            out["reason"] = ev.reject.reason
            out["rej_ud_qpn"] = CmData.decode(ev.private_data).ud_qpn
        elif ev.type is CmEventType.ESTABLISHED:
            out["rep"] = CmData.decode(ev.private_data).receive_mtu
        print(json.dumps(out), flush=True)
        if ev.type is CmEventType.ESTABLISHED:
            time.sleep(3)
            cid.disconnect()
            time.sleep(0.5)
        cm.close()
    elif action == "ud-garbage":
        qp = v.QP(pd, v.QPInitAttr(qp_type=e.IBV_QPT_UD, scq=cq, rcq=cq, cap=v.QPCap(16, 1, 1, 1)),
                  v.QPAttr(qkey=IPOIB_QKEY))
        buf = bytearray(256)
        mr = v.MR(pd, len(buf), int(e.IBV_ACCESS_LOCAL_WRITE), buffer=buf)
        gi = list(ctx.port.gids).index(sgid)
        ah = v.AH(pd, v.AHAttr(port_num=1, is_global=1,
                               gr=v.GlobalRoute(dgid=v.GID(peer_gid), sgid_index=gi, hop_limit=64)))
        arp_bad_htype = b"\x08\x06\x00\x00" + b"\x00\x01\x08\x00\x14\x04\x00\x01" + bytes(48)
        msgs = [b"\x08", b"\x12\x34\x00\x00" + bytes(40), b"\x08\x06\x00\x00" + bytes(20),
                arp_bad_htype]
        for i, m in enumerate(msgs):
            buf[:len(m)] = m
            wr = v.SendWR(wr_id=i, sg=[v.SGE(mr.addr, len(m), mr.lkey)], num_sge=1)
            wr.set_wr_ud(ah, peer_qpn, IPOIB_QKEY)
            qp.post_send(wr)
            deadline = time.monotonic() + 5
            while not cq.poll()[0] and time.monotonic() < deadline:
                ctx.progress(0.01)
        print(json.dumps({"sent": len(msgs)}), flush=True)
    ctx.close()


if __name__ == "__main__":
    main()
