"""The RDMAP parts of the iWARP engine alone: receive (softrdma.iwarp.rdmap), transmit
(softrdma.iwarp.rdmap_tx) and the ORQ/IRQ (softrdma.iwarp.orq_irq), RFC 5040.

Driven with stand-in QP, device and connection (tests/harness/iwarp_parts.py): segments are fed
as FPDUs without CRC or markers; each peer-caused error must raise the Terminate's layer,
type and code of RFC 5040 §4.8 / §7.
"""

from __future__ import annotations

import pytest
from harness.iwarp_parts import ADDR, QP, Dev, Owner

from softrdma import enums as e
from softrdma.iwarp.ddp_place import TxMsg
from softrdma.iwarp.orq_irq import ReadQueues
from softrdma.iwarp.rdmap import Rdmap
from softrdma.iwarp.rdmap_tx import W_DONE, RdmapTx
from softrdma.iwarp.terminate import IwarpFault, terminate_ulpdu
from softrdma.seam.events import AsyncEventType
from softrdma.wire.ddp import (
    READ_REQ,
    TAGGED,
    UNTAGGED,
    DdpEtype,
    DdpUntaggedErrorCode,
    RdmapErrorCode,
    RdmapEtype,
    RdmapOpcode,
    Terminate,
    TerminateLayer,
)
from softrdma.wire.mpa import FpduEncoder

OP = RdmapOpcode


class Stream:
    """One RDMAP stream's parts around stand-ins."""

    def __init__(self, *, ird: int = 4, ord_: int = 4) -> None:
        self.dev = Dev()
        self.pd = object()
        self.qp = QP(self.pd)
        self.owner = Owner()
        self.rq = ReadQueues(ird, ord_)
        self.tx = RdmapTx(self.owner, self.dev, self.rq, self.qp)
        self.rdmap = Rdmap(self.owner, self.dev, self.rq, self.tx, self.qp)
        self.enc = FpduEncoder(crc=False, markers=False)

    def feed(self, hdr: bytes, payload: bytes = b"") -> None:
        self.rdmap.rx.feed(memoryview(b"".join(bytes(b) for b in self.enc.encode([hdr, payload]))))


def tagged(op: int, stag: int, to: int, last: bool = True) -> bytes:
    return TAGGED.pack(0x81 | (0x40 if last else 0), 0x40 | op, stag, to)


def untagged(op: int, qn: int, msn: int, mo: int = 0, last: bool = True, inv: int = 0) -> bytes:
    return UNTAGGED.pack(0x01 | (0x40 if last else 0), 0x40 | op, inv, qn, msn, mo)


def _rdmap(f: IwarpFault, etype: RdmapEtype, code: int) -> None:
    assert (f.layer, f.etype, f.code) == (TerminateLayer.RDMAP, etype, code)


def test_send_with_invalidate_completes_and_invalidates() -> None:
    s = Stream()
    buf = s.dev.mr(s.pd, 64)
    target = s.dev.mr(s.pd, 16)
    s.qp.post_recv(buf, 64, wr_id=5)
    s.feed(untagged(OP.SEND_SE_INVALIDATE, 0, 1, inv=target.rkey), b"hello")
    assert s.qp.recvs == [(5, int(e.IBV_WC_SUCCESS), 5, target.rkey, True)]
    assert not target.valid and bytes(buf.buf[:5]) == b"hello"


def test_send_invalidating_another_pds_stag_is_a_remote_protection_error() -> None:
    s = Stream()
    s.qp.post_recv(s.dev.mr(s.pd, 64), 64, wr_id=5)
    other = s.dev.mr(object(), 16)
    with pytest.raises(IwarpFault) as ei:
        s.feed(untagged(OP.SEND_INVALIDATE, 0, 1, inv=other.rkey), b"x")
    _rdmap(ei.value, RdmapEtype.REMOTE_PROTECTION, RdmapErrorCode.STAG_CANNOT_BE_INVALIDATED)
    assert ei.value.rdmap_hdr is None and ei.value.ddp_hdr is not None  # M + D, no R
    assert s.qp.recvs == [(5, int(e.IBV_WC_REM_INV_REQ_ERR), 0, 0, False)] and other.valid


def test_read_request_queues_a_read_response_then_ird_is_enforced() -> None:
    s = Stream(ird=1)
    src = s.dev.mr(s.pd, 256, fill=0x5A)
    s.feed(untagged(OP.RDMA_READ_REQUEST, 1, 1) + READ_REQ.pack(0x77, 0x9000, 100, src.rkey,
                                                                  ADDR + 10))
    assert s.tx.has_tx()
    msg = s.tx.next_msg()
    assert isinstance(msg, TxMsg) and msg.read_resp and (msg.stag, msg.to) == (0x77, 0x9000)
    assert bytes(msg.segs[0]) == b"\x5a" * 100
    with pytest.raises(IwarpFault) as ei:  # the first response is not sent yet: IRD 1 is full
        s.feed(untagged(OP.RDMA_READ_REQUEST, 1, 2) + READ_REQ.pack(0x77, 0, 1, src.rkey, ADDR))
    _rdmap(ei.value, RdmapEtype.REMOTE_OPERATION, RdmapErrorCode.CATASTROPHIC_LOCALIZED)


def test_read_request_of_a_bad_stag_carries_the_read_request_header() -> None:
    s = Stream()
    rr = READ_REQ.pack(0x77, 0x9000, 100, 0xDEAD00, ADDR)
    with pytest.raises(IwarpFault) as ei:
        s.feed(untagged(OP.RDMA_READ_REQUEST, 1, 1) + rr)
    _rdmap(ei.value, RdmapEtype.REMOTE_PROTECTION, RdmapErrorCode.INVALID_STAG)
    assert ei.value.rdmap_hdr == rr  # R: the terminated Read Request header (§4.8)
    assert s.dev.async_events and s.dev.async_events[0].type == AsyncEventType.QP_ACCESS_ERR


def test_received_terminate_goes_to_the_owner() -> None:
    s = Stream()
    f = IwarpFault.ddp_untagged(DdpUntaggedErrorCode.INVALID_MSN_NO_BUFFER, "x",
                                untagged(OP.SEND, 0, 1), 3)
    ulpdu = terminate_ulpdu(f.terminate())
    s.feed(ulpdu[:18], ulpdu[18:])
    (term,) = s.owner.terms
    assert isinstance(term, Terminate)
    assert (term.layer, term.etype, term.code) == (TerminateLayer.DDP, DdpEtype.UNTAGGED_BUFFER,
                                                   DdpUntaggedErrorCode.INVALID_MSN_NO_BUFFER)


@pytest.mark.parametrize(("hdr", "etype", "code"), [
    (tagged(OP.SEND, 1, 0), RdmapEtype.REMOTE_OPERATION, RdmapErrorCode.UNEXPECTED_OPCODE),
    (untagged(OP.RDMA_WRITE, 0, 1), RdmapEtype.REMOTE_OPERATION,
     RdmapErrorCode.UNEXPECTED_OPCODE),
    (TAGGED.pack(0xC1, 0x80, 1, 0), RdmapEtype.REMOTE_OPERATION,
     RdmapErrorCode.INVALID_RDMAP_VERSION),
])
def test_header_errors(hdr: bytes, etype: RdmapEtype, code: int) -> None:
    s = Stream()
    with pytest.raises(IwarpFault) as ei:
        s.feed(hdr, b"abcd")
    _rdmap(ei.value, etype, code)
    assert ei.value.ddp_hdr == hdr and ei.value.seg_len == 4


def test_bad_ddp_version_carries_no_header() -> None:
    s = Stream()
    with pytest.raises(IwarpFault) as ei:
        s.feed(TAGGED.pack(0xC2, 0x40, 1, 0), b"abcd")
    assert (ei.value.layer, ei.value.etype) == (TerminateLayer.DDP, DdpEtype.TAGGED_BUFFER)
    assert ei.value.ddp_hdr is None


def test_read_completes_when_its_last_response_segment_is_placed() -> None:
    s = Stream()
    sink = s.dev.mr(s.pd, 64)
    w = s.qp.post(e.IBV_WR_RDMA_READ, sink, 40, wr_id=3, rkey=0x99, raddr=0x5000)
    msg = s.tx.next_msg()
    assert msg is not None and msg.extra == READ_REQ.pack(sink.lkey, ADDR, 40, 0x99, 0x5000)
    assert s.rq.oldest() is not None
    s.feed(tagged(OP.RDMA_READ_RESPONSE, sink.lkey, ADDR, last=False), b"a" * 30)
    assert s.qp.sends == []
    s.feed(tagged(OP.RDMA_READ_RESPONSE, sink.lkey, ADDR + 30), b"b" * 10)
    assert s.qp.sends == [(3, 0)] and w.state == W_DONE and s.rq.oldest() is None
    assert bytes(sink.buf[:40]) == b"a" * 30 + b"b" * 10


def test_transmit_order_rtr_then_read_responses_then_the_send_queue() -> None:
    s = Stream()
    src = s.dev.mr(s.pd, 64)
    s.qp.post(e.IBV_WR_SEND, src, 8, wr_id=1)
    s.tx.gate = True  # a responder waiting for the RTR sends nothing
    assert not s.tx.has_tx() and s.tx.next_msg() is None
    s.tx.gate = False
    s.feed(untagged(OP.RDMA_READ_REQUEST, 1, 1) + READ_REQ.pack(1, 0, 8, src.rkey, ADDR))
    s.tx.send_rtr("write")
    kinds = []
    while (m := s.tx.next_msg()) is not None:
        kinds.append("rtr" if m.rtr else "resp" if m.read_resp else m.wqe.wr_id
                     if m.wqe is not None else "?")
    assert kinds == ["rtr", "resp", 1]


def test_fence_waits_for_outstanding_reads_and_ord_limits_reads() -> None:
    s = Stream(ord_=1)
    mr = s.dev.mr(s.pd, 64)
    s.qp.post(e.IBV_WR_RDMA_READ, mr, 8, wr_id=1)
    s.qp.post(e.IBV_WR_RDMA_READ, mr, 8, wr_id=2)
    assert s.tx.next_msg() is not None
    assert s.tx.next_msg() is None  # ORD 1: the second Read waits
    s.rq.retire()
    s.qp.sq.clear()
    s.qp.post(e.IBV_WR_RDMA_READ, mr, 8, wr_id=3)
    assert s.tx.next_msg() is not None
    s.qp.post(e.IBV_WR_SEND, mr, 8, wr_id=4, flags=int(e.IBV_SEND_FENCE))
    assert not s.tx.has_tx() and s.tx.next_msg() is None
    s.rq.retire()
    assert s.tx.has_tx()


def test_read_with_ord_zero_fails_the_wr_and_the_stream() -> None:
    s = Stream(ord_=0)
    w = s.qp.post(e.IBV_WR_RDMA_READ, s.dev.mr(s.pd, 8), 8, wr_id=1)
    assert s.tx.next_msg() is None
    assert w.error == int(e.IBV_WC_LOC_QP_OP_ERR) and w.state == W_DONE
    (f,) = s.owner.faults
    assert (f.layer, f.etype) == (TerminateLayer.RDMAP, RdmapEtype.LOCAL_CATASTROPHIC)


def test_write_completes_only_once_the_llp_accepted_its_last_octet() -> None:
    s = Stream()
    src = s.dev.mr(s.pd, 3000)
    s.tx.set_mulpdu(1000)
    s.qp.post(e.IBV_WR_RDMA_WRITE, src, 3000, wr_id=7, rkey=0x42, raddr=0)
    out: list[bytes | bytearray | memoryview] = []
    n = s.tx.pull(FpduEncoder(crc=True, markers=False), out, 1 << 20, 512)
    assert n == s.tx.offset and len(out) == 4 * 3  # 4 FPDUs: header, payload, trailer
    s.tx.acked(n - 1)
    assert s.qp.sends == []
    s.tx.acked(1)
    assert s.qp.sends == [(7, 0)]


def test_orq_irq_counts() -> None:
    rq = ReadQueues(2, 2)
    rq.owe(TxMsg(int(OP.RDMA_READ_RESPONSE), [], 0, tagged=True, read_resp=True))
    rq.owe(TxMsg(int(OP.RDMA_READ_RESPONSE), [], 0, tagged=True, read_resp=True))
    with pytest.raises(IwarpFault):
        rq.check_room(b"")
    assert rq.next_response() is not None
    with pytest.raises(IwarpFault):  # dequeued, not yet sent: still counted
        rq.check_room(b"")
    rq.response_sent()
    rq.check_room(b"")
