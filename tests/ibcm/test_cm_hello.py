"""iWARP/TCP connections mapped onto the IB CM (Hello/HelloReply draft v0.30): the
Service ID, both private data formats, FlowC 1, and the FlowC 0 byte stream with its
16-byte SDP-style header, credit-based flow control and the switch to RDMA mode."""

from __future__ import annotations

import ipaddress
import random
from typing import Any

from harness.cm import Pair, T

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.cm.hello import SdpStream, hello_accept, hello_connect, hello_listen
from softrdma.drivers.links.link import Datagram
from softrdma.ibcm.agent import ConnParams
from softrdma.ibcm.events import CmEvent
from softrdma.wire.cm import CmAttr, RejReason
from softrdma.wire.iwarp_ib import FlowControl, Hello, HelloReply, SdpHeader

PORT = 5001


def setup(p: Pair, *, flowc: int, streams: tuple[Any, Any] | None = None,
          a_bufs: int = 0, b_bufs: int = 0, rcv: int = 0) -> tuple[Any, Any, Any]:
    qa, _ = streams[0] if streams else p.a.qp()
    qb, _ = streams[1] if streams else p.b.qp()
    lst = p.b.new_id()
    hello_listen(lst, PORT)

    def on(ev: CmEvent) -> None:
        if ev.type == T.CONNECT_REQUEST:
            hello_accept(ev.cm_id, qb, bufs=b_bufs, act_rcv_sz=rcv, private_data=b"reply!")
    p.b.on = on
    cid = p.a.new_id()
    hello_connect(cid, qa, "10.9.0.1", "10.9.0.2", PORT, src_port=33000, flowc=flowc,
                  bufs=a_bufs, des_rem_rcv_sz=rcv, local_rcv_sz=rcv, private_data=b"hello!")
    p.run(1)
    return cid, qa, qb


def test_hello_exchange_flowc_1() -> None:
    p = Pair()
    cid, qa, qb = setup(p, flowc=FlowControl.ULP, a_bufs=3, b_bufs=5, rcv=1024)
    (req,) = p.sent(CmAttr.REQ)
    assert req.service_id == 0x0000000000020000 + PORT
    hello = Hello.decode(req.private_data)
    assert (hello.mid, hello.bufs, hello.majv, hello.minv) == (0, 3, 2, 2)
    assert (hello.ipv, hello.flowc, hello.local_port) == (4, 1, 33000)
    assert (hello.des_rem_rcv_sz, hello.local_rcv_sz) == (1024, 1024)
    assert hello.src_ip == bytes(12) + bytes((10, 9, 0, 1))
    assert req.private_data[64:70] == b"hello!"
    (rep,) = p.sent(CmAttr.REP)
    reply = HelloReply.decode(rep.private_data)
    assert (reply.mid, reply.bufs, reply.act_rcv_sz) == (1, 5, 1024)
    (cr,) = p.b.of(T.CONNECT_REQUEST)
    assert cr.remote_ip == ipaddress.ip_address("10.9.0.1") and cr.remote_port == 33000
    assert cr.local_port == PORT and cr.info["flowc"] == FlowControl.ULP
    assert cr.private_data[:6] == b"hello!" and len(cr.private_data) == 28
    (est,) = p.a.of(T.ESTABLISHED)
    assert est.private_data[:6] == b"reply!" and len(est.private_data) == 172
    assert est.info["hello_reply"].act_rcv_sz == 1024
    assert qa.qp_state == qb.qp_state == e.IBV_QPS_RTS


def test_malformed_hello_rejected() -> None:
    p = Pair()
    hello_listen(p.b.new_id(), PORT)
    qa, _ = p.a.qp()
    bad = HelloReply().encode() + bytes(40)  # MID 1 where a Hello (MID 0) belongs
    p.a.new_id().connect(qa, ConnParams(0x20000 + PORT, p.b.gid, private_data=bad))
    p.run(1)
    (ev,) = p.a.events
    assert ev.type == T.REJECTED and ev.reject is not None
    assert ev.reject.reason == RejReason.CONSUMER_DEFINED


def make_streams(p: Pair, nbufs: int, size: int) -> tuple[SdpStream, SdpStream, Any, Any]:
    qa, cqa = p.a.qp(depth=64)
    qb, cqb = p.b.qp(depth=64)
    sa = SdpStream(p.a.pd, qa, cqa, nbufs=nbufs, buf_size=size)
    sb = SdpStream(p.b.pd, qb, cqb, nbufs=nbufs, buf_size=size)
    cid, _, _ = setup(p, flowc=FlowControl.TRANSPORT, streams=((qa, cqa), (qb, cqb)),
                      a_bufs=sa.rx_posted, b_bufs=sb.rx_posted, rcv=size)
    est = p.a.of(T.ESTABLISHED)[0]
    hello = p.b.of(T.CONNECT_REQUEST)[0].info["hello"]
    assert hello.flowc == FlowControl.TRANSPORT
    sa.start(est.info["hello_reply"].bufs, est.info["hello_reply"].act_rcv_sz)
    sb.start(hello.bufs, hello.local_rcv_sz)
    return sa, sb, qa, qb


def pump(p: Pair, streams: tuple[SdpStream, ...], cond: Any, limit: int = 5000) -> None:
    for _ in range(limit):
        if cond():
            return
        for s in streams:
            s.progress()
            assert s.credits >= 0
        p.run(0.0005)
    raise AssertionError("stream did not finish")


def test_flowc_0_byte_stream_with_credits() -> None:
    p = Pair()
    sa, sb, qa, qb = make_streams(p, nbufs=4, size=256)
    rng = random.Random(5)
    a_data = rng.randbytes(30000)
    b_data = rng.randbytes(7000)
    sa.send(a_data)
    sb.send(b_data)
    got_b = bytearray()
    got_a = bytearray()

    def done() -> bool:
        got_b.extend(sb.recv())
        got_a.extend(sa.recv(1000))
        return len(got_b) == len(a_data) and len(got_a) == len(b_data)
    pump(p, (sa, sb), done)
    assert bytes(got_b) == a_data and bytes(got_a) == b_data
    # 240 payload bytes per message, and never more in flight than buffers posted:
    assert sa.sent_messages >= len(a_data) // 240
    for ctx in (p.a.ctx, p.b.ctx):
        c = ctx.counters()
        assert c["send_rnr_nak"] == 0 and c["rcvd_rnr_nak"] == 0  # credits did their job


def test_receiver_that_does_not_read_stalls_the_sender_safely() -> None:
    p = Pair()
    sa, sb, qa, qb = make_streams(p, nbufs=4, size=64)
    sa.send(bytes(2000))
    for _ in range(50):
        sa.progress()
        p.run(0.001)
    # b's CQ is not polled: a stops at its last credit (kept for credit updates)
    assert sa.credits == 1 and sa.pending > 0
    got = bytearray()

    def all_read() -> bool:
        got.extend(sb.recv())
        return len(got) == 2000
    pump(p, (sa, sb), all_read)
    assert bytes(got) == bytes(2000) and p.b.ctx.counters()["send_rnr_nak"] == 0


def test_header_on_the_wire() -> None:
    p = Pair()
    sa, sb, qa, qb = make_streams(p, nbufs=4, size=128)
    seen: list[bytes] = []
    def record(dg: Datagram) -> bool:  # keeps every datagram, records the SENDs (0x04)
        if dg.data[0] == 0x04:
            seen.append(bytes(dg.data))
        return False
    p.fab.add_rule(record, "drop")
    sa.send(b"abc")
    p.run(0.01)
    (pkt,) = seen  # RC SEND ONLY: BTH (12) then the 16-byte header
    h = SdpHeader.decode(pkt[12:28])
    assert (h.mid, h.bufs, h.length, h.mseq, h.mseq_ack) == (0xFF, 4, 19, 1, 0)
    assert pkt[28:31] == b"abc"


def test_switch_to_rdma_mode() -> None:
    p = Pair()
    sa, sb, qa, qb = make_streams(p, nbufs=4, size=128)
    sa.send(b"before the switch")
    sa.switch_to_rdma()
    sb.switch_to_rdma()
    got = bytearray()

    def switched() -> bool:
        got.extend(sb.recv())
        return sb.rx_rdma and sa.rx_rdma
    pump(p, (sa, sb), switched)
    assert bytes(got) == b"before the switch" and sa.tx_rdma and sb.tx_rdma
    # the application's own Send, no header: delivered whole
    mr = v.MR(p.a.pd, 64, 0)
    mr.write(b"raw message", 11)
    qa.post_send(v.SendWR(9, None, 1, [v.SGE(mr.addr, 11, mr.lkey)]))
    msg: list[bytes] = []

    def message() -> bool:
        m = sb.recv_message()
        if m is not None:
            msg.append(m)
        return bool(msg)
    pump(p, (sb,), message)
    assert msg == [b"raw message"]
    # and RDMA WRITE into the peer's buffer (iWARP's RDMA mode)
    dst = v.MR(p.b.pd, 32, int(e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE))
    wr = v.SendWR(10, None, 1, [v.SGE(mr.addr, 11, mr.lkey)], opcode=e.IBV_WR_RDMA_WRITE)
    wr.set_wr_rdma(dst.rkey, dst.addr)
    qa.post_send(wr)
    p.run(0.01)
    assert dst.read(11, 0) == b"raw message"
