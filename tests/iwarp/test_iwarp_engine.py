"""The sans-I/O iWARP engine over an in-memory byte stream (tests/harness/iwarp.py).

Every RDMAP operation (Write, Read, Send, Send with Invalidate, Send with SE, Send with SE
and Invalidate, LOCAL_INV) at sizes from 0 B to 16 MiB, with MPA v1 and v2, CRC on/off,
markers on/off in each direction, RFC 6581 RTR of each type, delivery in uneven chunks
and through the zero-copy rx_target path; RFC 5040 §5.5 ordering and completion rules;
IRD/ORD negotiation; STag properties (RFC 5040 §8.1). The data placed is compared with
what was sent, and the wire of each case is re-parsed independently with
softrdma.wire.mpa / softrdma.wire.ddp.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest
from harness.iwarp import ACC_ALL, Side, connect_pair, pump

from softrdma import enums as e
from softrdma.errors import InvalidArgument, StateError
from softrdma.iwarp.engine import ConnState, IwarpConn
from softrdma.iwarp.mpa_setup import ConnectionRejected, MpaConfig
from softrdma.iwarp.stag import stag_index
from softrdma.seam.events import AsyncEventType, EngineEvent
from softrdma.seam.queues import QPInit
from softrdma.seam.types import SGE, RecvWQE
from softrdma.wire import ddp, mpa

OK = int(e.IBV_WC_SUCCESS)
FLUSH = int(e.IBV_WC_WR_FLUSH_ERR)
KB = 1024
MB = 1024 * 1024


def pattern(n: int, seed: int = 1) -> bytes:
    return random.Random(seed).randbytes(n)


def fpdus_of(wire: bytes | bytearray, side_frame_len: int, crc: bool, markers: bool) -> list[ddp.Segment]:
    """Independent re-parse of one direction: skip the MPA frame, deframe, decode."""
    d = mpa.FpduDeframer(crc=crc, markers=markers)
    return [ddp.decode_segment(f.ulpdu) for f in d.feed(wire[side_frame_len:])]


def frame_len(wire: bytes | bytearray) -> int:
    return 20 + int.from_bytes(wire[18:20], "big")


# --- connection setup --------------------------------------------------------------------------


@pytest.mark.parametrize("rev", [1, 2])
@pytest.mark.parametrize("crc_i,crc_r", [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("mk_i,mk_r", [(False, False), (True, False), (False, True), (True, True)])
def test_setup_negotiation(rev: int, crc_i: bool, crc_r: bool, mk_i: bool, mk_r: bool) -> None:
    a, b = Side("a"), Side("b")
    connect_pair(a, b, MpaConfig(revision=rev, crc=crc_i, markers=mk_i, ird=4, ord=3),
                 MpaConfig(revision=2, crc=crc_r, markers=mk_r, ird=5, ord=9),
                 pd_a=b"from-a", pd_b=b"from-b")
    na, nb = a.conn.negotiated, b.conn.negotiated
    assert na is not None and nb is not None
    assert na.crc == nb.crc == (crc_i or crc_r)
    # M in a frame asks the peer to insert markers towards its sender
    assert na.markers_rx == nb.markers_tx == mk_i
    assert nb.markers_rx == na.markers_tx == mk_r
    assert na.peer_private_data == b"from-b" and nb.peer_private_data == b"from-a"
    req = mpa.decode_mpa_frame(bytes(a.wire[:frame_len(a.wire)]))
    rep = mpa.decode_mpa_frame(bytes(b.wire[:frame_len(b.wire)]))
    assert isinstance(req, mpa.MpaRequest) and isinstance(rep, mpa.MpaReply)
    assert req.revision == rev and rep.revision == rev
    if rev == 2:
        assert req.enhanced and rep.enhanced
        assert req.v2 == mpa.MpaV2Params(4, 3)
        # responder: IRD = its own, ORD = min(its ORD, initiator IRD)
        assert rep.v2 == mpa.MpaV2Params(5, 4)
        assert (nb.ird, nb.ord) == (5, 4)
        assert (na.ird, na.ord) == (4, 5)  # siw: IRD := reply ORD, ORD := reply IRD
        assert req.user_data == b"from-a" and req.private_data[4:] == b"from-a"
    else:
        assert not req.enhanced and req.private_data == b"from-a"
    # a Send both ways works with whatever was negotiated
    ma, mb = a.mr(4096), b.mr(4096)
    ma.buf[:] = pattern(4096, 3)
    b.post_recv(mb, 4096)
    a.post(e.IBV_WR_SEND, ma, 3000)
    pump(a, b, chunk=97)
    assert [w.status for w in a.scq] == [OK] and b.rcq[0].byte_len == 3000
    assert bytes(mb.buf[:3000]) == bytes(ma.buf[:3000])


def test_strict_ird_insufficient_sends_terminate() -> None:
    a, b = Side("a"), Side("b")
    a.conn = IwarpConn(a.dev, initiator=True, cfg=MpaConfig(ird=2, ord=8, strict_ird=True),
                       qp=a.qp)
    b.conn = IwarpConn(b.dev, initiator=False, cfg=MpaConfig(ird=4, ord=8))
    pump(a, b)
    b.conn.accept(b.qp)
    pump(a, b)
    assert a.conn.state == ConnState.FAILED
    term = _terminate_on_wire(bytes(a.wire[frame_len(a.wire):]), crc=False)
    assert (term.layer, term.etype, term.code) == (2, 0, ddp.MpaErrorCode.INSUFFICIENT_IRD)
    assert not (term.m or term.d or term.r)
    assert a.qp.state == int(e.IBV_QPS_ERR)


def test_relaxed_ird_takes_reply_values() -> None:
    a, b = Side("a"), Side("b")
    connect_pair(a, b, MpaConfig(ird=2, ord=8), MpaConfig(ird=4, ord=8))
    assert (a.conn.ird, a.conn.ord) == (2, 4)
    assert (b.conn.ird, b.conn.ord) == (4, 2)


def test_reject_carries_private_data() -> None:
    a, b = Side("a"), Side("b")
    a.conn = IwarpConn(a.dev, initiator=True, qp=a.qp, private_data=b"please")
    b.conn = IwarpConn(b.dev, initiator=False)
    pump(a, b)
    assert b.conn.peer_private_data == b"please"
    b.conn.reject(b"no thanks")
    pump(a, b)
    assert isinstance(a.conn.rejected, ConnectionRejected)
    assert a.conn.rejected.private_data == b"no thanks"
    rep = mpa.decode_mpa_frame(bytes(b.wire))
    assert rep.reject and rep.user_data == b"no thanks"
    assert a.conn.want_close and b.conn.want_close
    assert a.qp.state == int(e.IBV_QPS_ERR)


@pytest.mark.parametrize("rtr", ["write", "read", "send"])
def test_rtr_peer_to_peer(rtr: str) -> None:
    a, b = Side("a"), Side("b")
    cfg = MpaConfig(p2p=True, rtr_write=rtr == "write", rtr_read=rtr == "read",
                    rtr_send=rtr == "send")
    a.conn = IwarpConn(a.dev, initiator=True, cfg=cfg, qp=a.qp)
    b.conn = IwarpConn(b.dev, initiator=False)
    pump(a, b)
    mb = b.mr(64)
    b.post_recv(mb, 64, wr_id=9)
    b.conn.accept(b.qp)
    # the responder may not send before the RTR: its Send waits
    ma = a.mr(64)
    a.post_recv(ma, 64, wr_id=8)
    b.post(e.IBV_WR_SEND, mb, 5, wr_id=7)
    out = b"".join(bytes(x) for x in b.conn.pull_tx())
    assert b.conn.reply is not None and out == b.conn.reply.encode()  # gated until the RTR
    assert not b.conn.tx_pending()
    b.conn.tx_sent(len(out))
    b.wire += out
    a.conn.receive(out)
    pump(a, b)
    assert a.conn.state == b.conn.state == ConnState.RTS
    rep = b.conn.reply
    assert rep is not None and rep.v2 is not None and rep.v2.peer_to_peer
    assert (rep.v2.rtr_write, rep.v2.rtr_read, rep.v2.rtr_send) == \
        (rtr == "write", rtr == "read", rtr == "send")
    segs = fpdus_of(bytes(a.wire), frame_len(a.wire), False, False)
    first = segs[0]
    assert len(first.payload) == 0
    if rtr == "write":
        assert isinstance(first.ddp, ddp.DdpTagged) and first.ddp.opcode == 0
    elif rtr == "read":
        assert first.read_request is not None and first.read_request.size == 0
    else:
        assert first.ddp.opcode == ddp.RdmapOpcode.SEND
    # no completion for the RTR; the responder's Send went after it; b's receive untouched
    assert [(w.wr_id, w.status) for w in a.rcq] == [(8, OK)]
    assert [(w.wr_id, w.status) for w in b.scq] == [(7, OK)]
    assert b.rcq == [] and len(b.qp.rq) == 1


# --- data transfer -----------------------------------------------------------------------------

SIZES = [0, 1, 3, 4, 1431, 1432, 1433, 1446, 4096, 65536 + 5, 1 * MB + 7]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("mode", ["plain", "crc", "markers+crc"])
def test_every_operation(size: int, mode: str) -> None:
    crc = "crc" in mode
    mk = "markers" in mode
    a, b = Side("a"), Side("b")
    connect_pair(a, b, MpaConfig(crc=crc, markers=mk), MpaConfig(markers=mk))
    src = a.mr(size + 16)
    src.buf[:] = pattern(size + 16, size)
    dst = b.mr(size + 16)
    back = a.mr(size + 16)
    # Send, Send with SE (solicited), Write, Read back
    b.post_recv(dst, size + 16, wr_id=100)
    b.post_recv(dst, size + 16, wr_id=101)
    a.post(e.IBV_WR_SEND, src, size, wr_id=1)
    a.post(e.IBV_WR_SEND, src, size, 3, wr_id=2,
           flags=int(e.IBV_SEND_SIGNALED | e.IBV_SEND_SOLICITED))
    a.post(e.IBV_WR_RDMA_WRITE, src, size, wr_id=3, rkey=dst.rkey, raddr=dst.addr + 5)
    a.post(e.IBV_WR_RDMA_READ, back, size, 2, wr_id=4, rkey=dst.rkey, raddr=dst.addr + 5)
    pump(a, b, direct=size % 2 == 1)
    assert [(w.wr_id, w.status, w.byte_len) for w in a.scq] == \
        [(1, OK, size), (2, OK, size), (3, OK, size), (4, OK, size)]
    assert [(w.wr_id, w.status, w.byte_len, w.solicited) for w in b.rcq] == \
        [(100, OK, size, False), (101, OK, size, True)]
    assert [w.opcode for w in a.scq] == [int(e.IBV_WC_SEND), int(e.IBV_WC_SEND),
                                        int(e.IBV_WC_RDMA_WRITE), int(e.IBV_WC_RDMA_READ)]
    assert bytes(dst.buf[5:5 + size]) == bytes(src.buf[:size])
    assert bytes(back.buf[2:2 + size]) == bytes(src.buf[:size])
    # the wire, parsed independently: every segment follows RFC 5040/5041
    segs_a = fpdus_of(bytes(a.wire), frame_len(a.wire), crc, mk)
    segs_b = fpdus_of(bytes(b.wire), frame_len(b.wire), crc, mk)
    for s in segs_a + segs_b:
        assert ddp.check_segment(s) is None, s.describe()
    mul = mpa.mulpdu(1460, mk)
    assert max(14 + len(s.payload) for s in segs_b) <= mul
    sends = [s for s in segs_a if s.ddp.opcode in (3, 5)]
    assert {s.ddp.msn for s in sends if isinstance(s.ddp, ddp.DdpUntagged)} == {1, 2}
    assert all(s.ddp.opcode == 5 for s in sends if isinstance(s.ddp, ddp.DdpUntagged)
               and s.ddp.msn == 2)


def _bulk_pair(size: int, crc: bool, seed: int) -> tuple[Side, Side, Any, Any]:
    """Two sides connected over the loopback's MSS (64 KiB FPDUs), a source MR of
    ``size`` patterned octets on ``a`` and a destination MR of ``size`` on ``b``."""
    a, b = Side("a"), Side("b")
    connect_pair(a, b, MpaConfig(crc=crc), mss=65483)
    src = a.mr(size)
    src.buf[:] = pattern(size, seed)
    return a, b, src, b.mr(size)


@pytest.mark.parametrize("op", ["write", "read", "send"])
def test_16mib(op: str) -> None:
    size = 16 * MB
    a, b, src, dst = _bulk_pair(size, True, 16)
    if op == "send":
        b.post_recv(dst, size)
        a.post(e.IBV_WR_SEND, src, size, wr_id=1)
        pump(a, b, direct=True)
        assert b.rcq[0].byte_len == size
        assert dst.buf == src.buf
    elif op == "write":
        a.post(e.IBV_WR_RDMA_WRITE, src, size, wr_id=1, rkey=dst.rkey, raddr=dst.addr)
        pump(a, b, direct=True)
        assert dst.buf == src.buf
    else:
        dst.buf[:] = src.buf
        src.buf[:] = bytes(size)
        a.post(e.IBV_WR_RDMA_READ, src, size, wr_id=1, rkey=dst.rkey, raddr=dst.addr)
        pump(a, b, direct=True)
        assert dst.buf == src.buf
    assert [(w.wr_id, w.status) for w in a.scq] == [(1, OK)]


@pytest.mark.parametrize("crc", [False, True])
def test_direct_receive_places_payloads_in_their_target(crc: bool) -> None:
    """A receiver that reads as the TCP runtime does with SOFTRDMA_IWARP_DIRECT=1 (a
    payload with a target straight into it, with the next FPDU's PAD, CRC and headers
    in the same read; otherwise a read of what the stream wants, up to 256 KiB) gets
    nearly every payload octet of a bulk WRITE into the registered memory, not through
    reads that a carried FPDU keeps copying (before, 32 of 6,000 reads went direct)."""
    size = 4 * MB
    a, b, src, dst = _bulk_pair(size, crc, 7)
    a.post(e.IBV_WR_RDMA_WRITE, src, size, wr_id=1, rkey=dst.rkey, raddr=dst.addr)
    ca, cb = a.conn, b.conn
    stream = bytearray()
    while bufs := ca.pull_tx():
        data = b"".join(bytes(x) for x in bufs)
        ca.tx_sent(len(data))
        stream += data
    mv = memoryview(stream)
    i = direct = reads = 0
    while i < len(mv):
        reads += 1
        t = cb.rx_target()
        if t is not None:
            la = cb.rx_lookahead()
            n = min(len(t), len(mv) - i)
            t[:n] = mv[i:i + n]
            cb.rx_placed(n)
            i += n
            direct += n
            if n == len(t) and la:
                k = min(la, len(mv) - i)
                cb.receive(mv[i:i + k])
                i += k
        else:
            want = cb.rx_want()
            n = min(want if 0 < want < 1 << 18 else 1 << 18, len(mv) - i)
            cb.receive(mv[i:i + n])
            i += n
    assert cb.state == ConnState.RTS, cb.reason
    assert dst.buf == src.buf
    assert direct >= size * 9 // 10, (direct, reads)
    assert reads <= 2 * (size // 65000) + 8  # about one read an FPDU
    pump(a, b)
    assert [(w.wr_id, w.status) for w in a.scq] == [(1, OK)]


def test_uneven_chunks_and_scatter_gather() -> None:
    rng = random.Random(5)
    a, b = Side("a"), Side("b")
    connect_pair(a, b, MpaConfig(crc=True, markers=True), MpaConfig(markers=True),
                 chunk=7, rng=rng)
    src = a.mr(20000)
    src.buf[:] = pattern(20000, 9)
    dst = b.mr(20000)
    # three receive SGEs, two send SGEs
    b.qp.post_recv(RecvWQE(
        5, [SGE(dst.addr, 100, dst.lkey), SGE(dst.addr + 1000, 7000, dst.lkey),
            SGE(dst.addr + 9000, 11000, dst.lkey)]))
    a.post(e.IBV_WR_SEND, sges=[SGE(src.addr, 5000, src.lkey),
                                SGE(src.addr + 6000, 9000, src.lkey)], wr_id=1)
    pump(a, b, chunk=61, rng=rng)
    assert b.rcq[0].status == OK and b.rcq[0].byte_len == 14000
    got = bytes(dst.buf[:100]) + bytes(dst.buf[1000:8000]) + bytes(dst.buf[9000:15900])
    want = bytes(src.buf[:5000]) + bytes(src.buf[6000:15000])
    assert got == want


# --- ordering and completion rules (RFC 5040 §5.5) ------------------------------------------------


def test_completions_in_order_behind_a_read() -> None:
    a, b = Side("a"), Side("b")
    connect_pair(a, b)
    src, back = a.mr(4096), a.mr(4096)
    dst = b.mr(4096)
    a.post(e.IBV_WR_RDMA_READ, back, 100, wr_id=1, rkey=dst.rkey, raddr=dst.addr)
    a.post(e.IBV_WR_RDMA_WRITE, src, 100, wr_id=2, rkey=dst.rkey, raddr=dst.addr)
    # the Write is handed to the LLP, but its completion must wait for the Read (rule 15)
    out = b"".join(bytes(x) for x in a.conn.pull_tx())
    a.conn.tx_sent(len(out))
    assert a.scq == []
    a.wire += out
    b.conn.receive(out)
    pump(a, b)
    assert [w.wr_id for w in a.scq] == [1, 2]


def test_unsignaled_and_sq_sig_all() -> None:
    a, b = Side("a"), Side("b")
    connect_pair(a, b)
    src, dst = a.mr(64), b.mr(64)
    a.post(e.IBV_WR_RDMA_WRITE, src, 8, wr_id=1, rkey=dst.rkey, raddr=dst.addr, flags=0)
    a.post(e.IBV_WR_RDMA_WRITE, src, 8, wr_id=2, rkey=dst.rkey, raddr=dst.addr)
    pump(a, b)
    assert [w.wr_id for w in a.scq] == [2]
    a.qp.init = dataclasses.replace(a.qp.init, sq_sig_all=True)
    a.post(e.IBV_WR_RDMA_WRITE, src, 8, wr_id=3, rkey=dst.rkey, raddr=dst.addr, flags=0)
    pump(a, b)
    assert [w.wr_id for w in a.scq] == [2, 3]


def test_ord_limits_outstanding_reads_and_fence() -> None:
    a, b = Side("a"), Side("b")
    connect_pair(a, b, MpaConfig(ird=2, ord=2), MpaConfig(ird=2, ord=2))
    back, src = a.mr(4096), a.mr(4096)
    dst = b.mr(4096)
    for i in range(4):
        a.post(e.IBV_WR_RDMA_READ, back, 10, i * 10, wr_id=i, rkey=dst.rkey, raddr=dst.addr)
    a.post(e.IBV_WR_RDMA_WRITE, src, 10, wr_id=9, rkey=dst.rkey, raddr=dst.addr,
           flags=int(e.IBV_SEND_SIGNALED | e.IBV_SEND_FENCE))
    out = b"".join(bytes(x) for x in a.conn.pull_tx())
    segs = [ddp.decode_segment(f.ulpdu) for f in
            mpa.FpduDeframer(crc=False, markers=False).feed(out)]
    assert [s.read_request is not None for s in segs] == [True, True]  # ORD = 2
    a.conn.tx_sent(len(out))
    a.wire += out
    b.conn.receive(out)
    pump(a, b)
    assert [w.wr_id for w in a.scq] == [0, 1, 2, 3, 9]
    assert all(w.status == OK for w in a.scq)
    # the fenced Write went out only after every Read Response had arrived
    ops = [s.ddp.opcode for s in fpdus_of(bytes(a.wire), frame_len(a.wire), False, False)]
    assert ops[-1] == 0 and ops.count(1) == 4


def test_read_responses_in_request_order_and_interleaved_sends() -> None:
    a, b = Side("a"), Side("b")
    connect_pair(a, b, mss=600)
    back = a.mr(8192)
    dst = b.mr(8192)
    dst.buf[:] = pattern(8192, 4)
    rb = a.mr(64)
    a.post_recv(rb, 64, wr_id=50)
    a.post(e.IBV_WR_RDMA_READ, back, 3000, 0, wr_id=1, rkey=dst.rkey, raddr=dst.addr)
    a.post(e.IBV_WR_RDMA_READ, back, 3000, 4000, wr_id=2, rkey=dst.rkey, raddr=dst.addr + 3000)
    mb = b.mr(64)
    b.post(e.IBV_WR_SEND, mb, 10, wr_id=77)
    pump(a, b)
    assert [w.wr_id for w in a.scq] == [1, 2]
    assert bytes(back.buf[:3000]) == bytes(dst.buf[:3000])
    assert bytes(back.buf[4000:7000]) == bytes(dst.buf[3000:6000])
    assert [w.wr_id for w in a.rcq] == [50]


# --- invalidation and STags ------------------------------------------------------------------------


@pytest.mark.parametrize("se", [False, True])
def test_send_with_invalidate(se: bool) -> None:
    a, b = Side("a"), Side("b")
    connect_pair(a, b)
    target = b.mr(64)
    rb = b.mr(64)
    src = a.mr(64)
    b.post_recv(rb, 64, wr_id=3)
    flags = int(e.IBV_SEND_SIGNALED | (e.IBV_SEND_SOLICITED if se else 0))
    a.post(e.IBV_WR_SEND_WITH_INV, src, 9, wr_id=1, inv=target.rkey, flags=flags)
    pump(a, b)
    wc = b.rcq[0]
    assert wc.status == OK and wc.wc_flags & int(e.IBV_WC_WITH_INV)
    assert wc.invalidated_rkey == target.rkey and wc.solicited == se
    assert not target.valid
    seg = fpdus_of(bytes(a.wire), frame_len(a.wire), False, False)[0]
    assert isinstance(seg.ddp, ddp.DdpUntagged)
    assert seg.ddp.opcode == (6 if se else 4) and seg.ddp.rsvdulp == target.rkey
    # the invalidated STag can no longer be written: Terminate (DDP tagged, invalid STag)
    a.post(e.IBV_WR_RDMA_WRITE, src, 8, wr_id=2, rkey=target.rkey, raddr=target.addr)
    pump(a, b)
    assert b.conn.fault is not None and b.conn.fault.code == 0 and b.conn.fault.layer == 1


def test_local_invalidate() -> None:
    a, b = Side("a"), Side("b")
    connect_pair(a, b)
    mr = a.mr(64)
    a.post(e.IBV_WR_LOCAL_INV, wr_id=1, inv=mr.lkey)
    pump(a, b)
    assert [(w.wr_id, w.status, w.opcode) for w in a.scq] == [(1, OK, int(e.IBV_WC_LOCAL_INV))]
    assert not mr.valid


def test_zero_length_operations() -> None:
    a, b = Side("a"), Side("b")
    connect_pair(a, b, MpaConfig(crc=True))
    b.qp.post_recv(RecvWQE(4, []))
    a.post(e.IBV_WR_SEND, wr_id=1)
    a.post(e.IBV_WR_RDMA_WRITE, wr_id=2, rkey=0x12345678, raddr=0)  # no STag check at 0 B
    a.post(e.IBV_WR_RDMA_READ, wr_id=3, rkey=0x12345678, raddr=0)
    pump(a, b)
    assert [(w.wr_id, w.status, w.byte_len) for w in a.scq] == [(1, OK, 0), (2, OK, 0), (3, OK, 0)]
    assert [(w.wr_id, w.byte_len) for w in b.rcq] == [(4, 0)]


def test_stags_are_random_sparse_and_unique() -> None:
    s = Side("s")
    mrs = [s.mr(8) for _ in range(300)]
    keys = [m.lkey for m in mrs]
    assert len(set(keys)) == 300 and all(m.lkey == m.rkey for m in mrs)
    idx = [stag_index(k) for k in keys]
    assert len(set(idx)) == 300
    diffs = {b - a for a, b in zip(idx, idx[1:], strict=False)}
    assert len(diffs) > 250  # not sequential, not a fixed stride
    assert max(idx) - min(idx) > 1 << 22  # spread over the 24-bit space
    assert len({k & 0xFF for k in keys}) > 100  # the 8-bit key varies too
    for m in mrs[:10]:
        s.dev.deregister_mr(m)
    assert len(s.dev.stags) == 290


def test_post_send_checks() -> None:
    a = Side("a")
    with pytest.raises(StateError, match="connected"):
        a.post(e.IBV_WR_SEND, wr_id=1)
    with pytest.raises(InvalidArgument):
        a.qp.modify({"qp_state": int(e.IBV_QPS_RTS)}, 0.0)
    ro = a.mr(8, int(e.IBV_ACCESS_LOCAL_WRITE))
    assert ro.access == int(e.IBV_ACCESS_LOCAL_WRITE) != ACC_ALL


def _terminate_on_wire(wire: bytes, crc: bool) -> ddp.Terminate:
    segs = [ddp.decode_segment(f.ulpdu) for f in mpa.FpduDeframer(crc=crc, markers=False).feed(wire)]
    terms = [s.terminate for s in segs if s.terminate is not None]
    assert len(terms) == 1
    return terms[0]


# --- wire exactness with Linux siw (the captures of ../shared/captures) ---------------------------


def _mpa_frames_of(capture: str) -> list[bytes]:
    from pathlib import Path

    from softrdma.wire.pcap import read_pcap
    from softrdma.wire.tcpstream import parse_tcp

    out = []
    for r in read_pcap(Path("/work/shared/captures") / capture):
        seg = parse_tcp(r.linktype, r.data, r.index)
        if seg is not None and seg.payload[:16] in (mpa.KEY_REQ, mpa.KEY_REP):
            out.append(seg.payload)
    return out


@pytest.mark.parametrize("capture", ["iwarp_rping.pcap", "iwarp_crc_rping.pcap",
                                     "iwarp_write_bw.pcap"])
def test_mpa_exchange_bytes_match_siw(capture: str) -> None:
    """Our Request for siw's parameters is siw's Request byte for byte, and our Reply to
    siw's Request (as responder with siw's IRD/ORD) is siw's Reply byte for byte."""
    from softrdma.iwarp.mpa_setup import build_request, respond

    frames = _mpa_frames_of(capture)
    req_b, rep_b = frames[0], frames[1]
    req = mpa.decode_mpa_frame(req_b)
    assert isinstance(req, mpa.MpaRequest) and req.v2 is not None
    cfg = MpaConfig(crc=req.crc, ird=req.v2.ird, ord=req.v2.ord)
    assert build_request(cfg, req.user_data).encode() == req_b
    rep = mpa.decode_mpa_frame(rep_b)
    assert rep.v2 is not None
    ours, neg = respond(req, MpaConfig(ird=rep.v2.ird, ord=rep.v2.ord), rep.user_data)
    assert ours.encode() == rep_b
    assert neg.crc == req.crc


def test_rtr_write_bytes_match_the_worked_example() -> None:
    """../shared/specs/iwarp.md §3 worked example: zero-length RDMA Write RTR, STag 1, TO 0, CRC on:
    ``000e c1 40 00000001 0000000000000000 eb d3 4c 5f``."""
    a, b = Side("a"), Side("b")
    connect_pair(a, b, MpaConfig(crc=True, p2p=True, rtr_read=False))
    first = bytes(a.wire[frame_len(a.wire):frame_len(a.wire) + 20])
    assert first == bytes.fromhex("000ec14000000001000000000000000" "0ebd34c5f")


def test_accepts_512_bytes_of_private_data_and_sends_at_most_256() -> None:
    a, b = Side("a"), Side("b")
    b.conn = IwarpConn(b.dev, initiator=False)
    user = (bytes(range(256)) * 2)[:508]
    big = mpa.MpaRequest(private_data=mpa.MpaV2Params(4, 4).encode() + user, enhanced=True)
    b.conn.receive(big.encode())
    assert b.conn.state == ConnState.ACCEPT_WAIT and b.conn.peer_private_data == user
    with pytest.raises(InvalidArgument):
        IwarpConn(a.dev, initiator=True, qp=a.qp, private_data=bytes(253))
    IwarpConn(a.dev, initiator=True, qp=a.qp, private_data=bytes(252))  # 4 + 252 = 256


def test_shared_receive_queue() -> None:
    """Receives come from the SRQ (checked against the SRQ's PD); a QP error does not
    flush the SRQ but raises QP_LAST_WQE_REACHED (IBA 10.2.9.5)."""
    from softrdma.iwarp.qp import IwarpQP

    a, b = Side("a"), Side("b")
    srq = b.dev.create_srq(b.pd, 8, 1, 0)
    b.qp = IwarpQP(b.dev, QPInit(int(e.IBV_QPT_RC), b.pd, b.scq.append, b.rcq.append, srq, 8,
                                 0, 1, 0, 0, False))
    b.qp.modify({"qp_state": int(e.IBV_QPS_INIT)}, 0.0)
    connect_pair(a, b)
    dst = b.mr(64)
    for i in range(3):
        srq.post_recv(RecvWQE(i, [SGE(dst.addr, 64, dst.lkey)]))
    src = a.mr(64)
    a.post(e.IBV_WR_SEND, src, 7, wr_id=1)
    pump(a, b)
    assert [(w.wr_id, w.status, w.byte_len) for w in b.rcq] == [(0, OK, 7)]
    b.qp.modify({"qp_state": int(e.IBV_QPS_ERR)}, 0.0)
    assert len(srq) == 2
    assert EngineEvent(AsyncEventType.QP_LAST_WQE_REACHED, b.qp) in b.events
