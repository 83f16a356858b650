"""A plain pyverbs rdma_cm program (no softrdma import): a server and a client connect
with rdma_cm (asynchronous ids), exchange one message each way and disconnect.

    python3 pyverbs_cm_pingpong.py server ADDR PORT
    python3 pyverbs_cm_pingpong.py client ADDR PORT
"""

import sys

import pyverbs.cm_enums as ce
import pyverbs.enums as e
from pyverbs.cmid import CMID, AddrInfo, CMEvent, CMEventChannel, ConnParam
from pyverbs.qp import QPCap, QPInitAttr

SIZE = 64


def expect(ch, want):
    ev = CMEvent(ch)
    if ev.event_type != want:
        raise SystemExit(f"expected event {want}, got {ev.event_str()}")
    ev.ack_cm_event()
    return ev


def main():
    role, addr, port = sys.argv[1], sys.argv[2], sys.argv[3]
    ch = CMEventChannel()
    cmid = CMID(creator=ch, port_space=ce.RDMA_PS_TCP)
    init = QPInitAttr(qp_type=e.IBV_QPT_RC, cap=QPCap(max_send_wr=4, max_recv_wr=4))
    if role == "server":
        cmid.bind_addr(AddrInfo(src=addr, src_service=port, flags=ce.RAI_PASSIVE))
        cmid.listen()
        print("listening", flush=True)
        ev = CMEvent(ch)
        assert ev.event_type == ce.RDMA_CM_EVENT_CONNECT_REQUEST, ev.event_str()
        conn = CMID(creator=ev, listen_id=cmid)
        ev.ack_cm_event()
        conn.create_qp(init)
        mr = conn.reg_msgs(SIZE)
        conn.post_recv(mr)
        conn.accept(ConnParam())
        expect(ch, ce.RDMA_CM_EVENT_ESTABLISHED)
        conn.get_recv_comp()
        got = mr.read(SIZE, 0)
        mr.write(b"pong".ljust(SIZE, b"."), SIZE)
        conn.post_send(mr)
        conn.get_send_comp()
        expect(ch, ce.RDMA_CM_EVENT_DISCONNECTED)
        print("server got", got[:4].decode(), "on", conn.context.name, flush=True)
        conn.close()
    else:
        cmid.resolve_addr(AddrInfo(src=addr, dst=addr, dst_service=port))
        expect(ch, ce.RDMA_CM_EVENT_ADDR_RESOLVED)
        cmid.resolve_route()
        expect(ch, ce.RDMA_CM_EVENT_ROUTE_RESOLVED)
        cmid.create_qp(init)
        mr = cmid.reg_msgs(SIZE)
        cmid.post_recv(mr)
        cmid.connect(ConnParam())
        expect(ch, ce.RDMA_CM_EVENT_ESTABLISHED)
        smr = cmid.reg_msgs(SIZE)
        smr.write(b"ping".ljust(SIZE, b"."), SIZE)
        cmid.post_send(smr)
        cmid.get_send_comp()
        cmid.get_recv_comp()
        print("client got", mr.read(4, 0).decode(), "on", cmid.context.name, flush=True)
        cmid.disconnect()
        expect(ch, ce.RDMA_CM_EVENT_DISCONNECTED)
    cmid.close()
    ch.close()


if __name__ == "__main__":
    main()
