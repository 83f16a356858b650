"""A hand-made IPoIB peer for the namespace tests: it speaks to a running
``softrdma ipoib`` interface over the wire, as a misbehaving or Linux-style peer would.

``python ipoib_peer.py DEVICE PEER_GID PEER_UD_QPN ACTION [ARG]`` prints one JSON line:

* ``req-pd HEX``: send a REQ to the peer's IPoIB Service ID with private data HEX; report
  the answer (REJECTED: reason and the UD QPN in the REJ private data; or ESTABLISHED);
* ``linux-conn UD_QPN``: open a connection as a Linux peer opens its own (valid private
  data naming ``UD_QPN``), report whether it was accepted, keep it up until told, then
  close;
* ``ud-garbage``: send malformed IPoIB messages (short encapsulation header, unknown
  Type, truncated ARP, ARP with a wrong hardware type) to the peer's UD QPN;
* ``announce MY_IP PEER_IP``: wrong flags (RFC 4755 §8): an ARP request to the peer
  naming ``MY_IP`` at an address whose flags octet is 0xFF (RC, UC and reserved bits),
  with nobody listening on the Service ID, then silence until told;
* ``cross MY_IP PEER_IP``: a REQ crossing (RFC 4755 §3.3) made certain: announce itself
  as ``MY_IP`` (an ARP request to the peer, RC flag set), listen on its own IPoIB Service
  ID, and when the peer's REQ comes, hold it and send its own REQ; once that one is
  answered, answer the held one by the same rule (accept if our address is the smaller);
  report, and keep both up until told.

"Until told": until a line (or the end) on stdin, so that the test decides how long the
peer lives, not a guess at how long the test takes on a busy machine. While it waits, the
peer answers ARP requests for ``MY_IP`` as a live host does: the interface probes a
neighbour that it uses (RFC 4861 §7.3.3: STALE, DELAY, PROBE) and removes it, with its
connection (RFC 4755 §3.4), when nothing answers; on a busy machine the test may outlast
those seconds.
"""

from __future__ import annotations

import ipaddress
import json
import select
import sys
import time
from collections.abc import Callable

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.drivers.cm.gsi import CmBinding
from softrdma.errors import DecodeError
from softrdma.ibcm.agent import AcceptParams, ConnParams
from softrdma.ibcm.events import CmEvent, CmEventType
from softrdma.ipoib.encap import ArpOp, ArpPacket, EtherType, encap_header
from softrdma.ipoib.hwaddr import FLAG_RC, CmData, HwAddr, service_id

IPOIB_QKEY = 0x0000000B


def wait_event(events: list[CmEvent], timeout: float = 60.0) -> CmEvent:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for ev in list(events):
            if ev.type is not CmEventType.TIMEWAIT_EXIT:
                events.remove(ev)
                return ev
        time.sleep(0.02)
    raise SystemExit(json.dumps({"error": "no CM event"}))


def until_told(serve: Callable[[], None] | None = None) -> None:
    """Block until the test writes a line on stdin or closes it; call ``serve`` meanwhile."""
    if serve is None:
        sys.stdin.readline()
        return
    while not select.select([sys.stdin], [], [], 0.05)[0]:
        serve()
    sys.stdin.readline()


def wait_disconnected(events: list[CmEvent], timeout: float = 30.0) -> None:
    """Until our DREQ is answered (DISCONNECTED), so the peer sees a clean close."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(ev.type is CmEventType.DISCONNECTED for ev in events):
            return
        time.sleep(0.02)


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
            until_told()
            cid.disconnect()
            wait_disconnected(events)
        cm.close()
    elif action == "announce":
        rcq = v.CQ(ctx, 64)
        ud = v.QP(pd, v.QPInitAttr(qp_type=e.IBV_QPT_UD, scq=cq, rcq=rcq,
                                   cap=v.QPCap(4, ARP_RECVS, 1, 1)), v.QPAttr(qkey=IPOIB_QKEY))
        hw = bytearray(HwAddr(ud.qp_num, sgid).encode())
        hw[0] = 0xFF  # the flags octet
        arp = _arp(ArpOp.REQUEST, bytes(hw), arg, bytes(20), sys.argv[6])
        serve_arp = _arp_answerer(ctx, pd, rcq, ud, bytes(hw), arg)
        _ud_send(ctx, pd, cq, ud, sgid, peer_gid, peer_qpn, encap_header(EtherType.ARP) + arp)
        print(json.dumps({"announced": arg}), flush=True)
        until_told(lambda: serve_arp(cq, sgid, peer_gid, peer_qpn))
    elif action == "cross":
        cross(ctx, pd, cq, sgid, peer_gid, peer_qpn, arg, sys.argv[6])
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


def _ud_send(ctx: v.Context, pd: v.PD, cq: v.CQ, qp: v.QP, sgid: bytes, dgid: bytes,
             dqpn: int, msg: bytes) -> None:
    buf = bytearray(msg)
    mr = v.MR(pd, len(buf), int(e.IBV_ACCESS_LOCAL_WRITE), buffer=buf)
    gi = list(ctx.port.gids).index(sgid)
    ah = v.AH(pd, v.AHAttr(port_num=1, is_global=1,
                           gr=v.GlobalRoute(dgid=v.GID(dgid), sgid_index=gi, hop_limit=64)))
    wr = v.SendWR(wr_id=1, sg=[v.SGE(mr.addr, len(buf), mr.lkey)], num_sge=1)
    wr.set_wr_ud(ah, dqpn, IPOIB_QKEY)
    qp.post_send(wr)
    deadline = time.monotonic() + 5
    while not cq.poll()[0] and time.monotonic() < deadline:
        ctx.progress(0.01)


ARP_RECVS = 8
GRH_LEN = 40


def _arp(op: int, sender_hw: bytes, sender_ip: str, target_hw: bytes, target_ip: str) -> bytes:
    """An InfiniBand ARP packet; the hardware addresses are given as their 20 bytes, so
    that a sender may claim any flags octet."""
    pkt = bytearray(ArpPacket(op, HwAddr(0, bytes(16)), ipaddress.IPv4Address(sender_ip).packed,
                              HwAddr(0, bytes(16)), ipaddress.IPv4Address(target_ip).packed
                              ).encode())
    pkt[8:28] = sender_hw
    pkt[32:52] = target_hw
    return bytes(pkt)


def _arp_answerer(ctx: v.Context, pd: v.PD, rcq: v.CQ, ud: v.QP, my_hw: bytes,
                  my_ip: str) -> Callable[[v.CQ, bytes, bytes, int], None]:
    """Post receives on ``ud`` (completing on ``rcq``); the function returned answers the
    ARP requests for ``my_ip`` that arrived (sending on its CQ argument), then reposts."""
    size = GRH_LEN + 4096
    buf = bytearray(ARP_RECVS * size)
    mr = v.MR(pd, len(buf), int(e.IBV_ACCESS_LOCAL_WRITE), buffer=buf)
    for i in range(ARP_RECVS):
        ud.post_recv(v.RecvWR(wr_id=i, sg=[v.SGE(mr.addr + i * size, size, mr.lkey)], num_sge=1))
    mine = ipaddress.IPv4Address(my_ip).packed

    def answer(scq: v.CQ, sgid: bytes, peer_gid: bytes, peer_qpn: int) -> None:
        ctx.progress(0.01)
        n, wcs = rcq.poll(ARP_RECVS)
        for wc in wcs[:n]:
            i = wc.wr_id
            body = bytes(buf[i * size + GRH_LEN:i * size + wc.byte_len])
            ud.post_recv(v.RecvWR(wr_id=i, sg=[v.SGE(mr.addr + i * size, size, mr.lkey)],
                                  num_sge=1))
            if wc.status != e.IBV_WC_SUCCESS or body[:2] != encap_header(EtherType.ARP)[:2]:
                continue
            try:
                req = ArpPacket.decode(body[4:])
            except DecodeError:
                continue
            if req.op == ArpOp.REQUEST and req.target_ip == mine:
                reply = _arp(ArpOp.REPLY, my_hw, my_ip, req.sender_hw.encode(),
                             str(ipaddress.IPv4Address(req.sender_ip)))
                _ud_send(ctx, pd, scq, ud, sgid, peer_gid, peer_qpn,
                         encap_header(EtherType.ARP) + reply)

    return answer


def _rc_qp(pd: v.PD, cq: v.CQ) -> v.QP:
    return v.QP(pd, v.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=v.QPCap(4, 8, 1, 1)))


def _absorb(pd: v.PD, qp: v.QP) -> v.MR:
    """Receive buffers (after the CM moved the QP out of RESET) for what the peer sends."""
    mr = v.MR(pd, 8 * 65536, int(e.IBV_ACCESS_LOCAL_WRITE))
    for i in range(8):
        qp.post_recv(v.RecvWR(wr_id=i, sg=[v.SGE(mr.addr + i * 65536, 65536, mr.lkey)],
                              num_sge=1))
    return mr


def cross(ctx: v.Context, pd: v.PD, cq: v.CQ, sgid: bytes, peer_gid: bytes, peer_qpn: int,
          my_ip: str, peer_ip: str) -> None:
    rcq = v.CQ(ctx, 64)
    ud = v.QP(pd, v.QPInitAttr(qp_type=e.IBV_QPT_UD, scq=cq, rcq=rcq,
                               cap=v.QPCap(4, ARP_RECVS, 1, 1)), v.QPAttr(qkey=IPOIB_QKEY))
    me = HwAddr(ud.qp_num, sgid, FLAG_RC)
    serve_arp = _arp_answerer(ctx, pd, rcq, ud, me.encode(), my_ip)
    cm = CmBinding.attach(ctx)
    events: list[CmEvent] = []
    listener = cm.agent.create_id(events.append)
    listener.listen(service_id(ud.qp_num))
    arp = ArpPacket(ArpOp.REQUEST, me, ipaddress.IPv4Address(my_ip).packed,
                    HwAddr(0, bytes(16)), ipaddress.IPv4Address(peer_ip).packed)
    _ud_send(ctx, pd, cq, ud, sgid, peer_gid, peer_qpn, encap_header(EtherType.ARP) + arp.encode())
    print(json.dumps({"ready": True, "ud_qpn": ud.qp_num,
                      "gid": str(ipaddress.IPv6Address(sgid))}), flush=True)
    held = wait_event(events, 60)
    assert held.type is CmEventType.CONNECT_REQUEST, held
    qp = _rc_qp(pd, cq)
    own = cm.agent.create_id(events.append)
    own.connect(qp, ConnParams(service_id=service_id(peer_qpn), dgid=peer_gid, sgid=sgid,
                               private_data=CmData(ud.qp_num, 65524).encode()))
    mrs = [_absorb(pd, qp)]
    answer = wait_event(events)
    out: dict[str, object] = {"own": answer.type.value}
    if answer.reject is not None:
        out["own_reason"] = answer.reject.reason
    peer = HwAddr(peer_qpn, peer_gid)
    if me.key < peer.key:  # §3.3: the smaller address accepts
        qp2 = _rc_qp(pd, cq)
        held.cm_id.accept(qp2, AcceptParams(private_data=CmData(ud.qp_num, 65524).encode()))
        mrs.append(_absorb(pd, qp2))
        out["answered"] = "accept"
    else:
        held.cm_id.reject(CmData(ud.qp_num, 65524).encode())
        out["answered"] = "reject"
    print(json.dumps(out), flush=True)
    until_told(lambda: serve_arp(cq, sgid, peer_gid, peer_qpn))
    cm.close()
    del mrs


if __name__ == "__main__":
    main()
