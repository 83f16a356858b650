"""The DDP part of the iWARP engine alone (softrdma.iwarp.ddp_place, RFC 5041).

Segmentation is checked against the header codec of :mod:`softrdma.wire.ddp`; placement
(:class:`DdpRx`) against stand-in QP and device (tests/harness/iwarp_parts.py): every rule of the
tagged and untagged buffer models ends in the DDP error type and code of RFC 5041 §7.2.
"""

from __future__ import annotations

import pytest
from harness.iwarp_parts import ACC_ALL, ADDR, QP, Dev

from softrdma import enums as e
from softrdma.iwarp.ddp_place import DdpRx, ReadCtx, TxMsg, segment
from softrdma.iwarp.terminate import IwarpFault
from softrdma.wire.ddp import (
    DdpEtype,
    DdpTagged,
    DdpTaggedErrorCode,
    DdpUntagged,
    DdpUntaggedErrorCode,
    RdmapErrorCode,
    RdmapEtype,
    RdmapOpcode,
    TerminateLayer,
    decode_ddp,
)

HDR = b"\x81\x40" + bytes(12)  # a tagged header, as the fault's D field


def _ddp(f: IwarpFault, etype: DdpEtype, code: int) -> None:
    assert (f.layer, f.etype, f.code) == (TerminateLayer.DDP, etype, code)


def test_segment_cuts_a_tagged_message_at_the_mulpdu() -> None:
    data = memoryview(bytes(range(256)) * 10)
    msg = TxMsg(int(RdmapOpcode.RDMA_WRITE), [data[:1000], data[1000:]], len(data),
                tagged=True, stag=0xABCD01, to=ADDR)
    got = b""
    offs = []
    while True:
        parts, n, last = segment(msg, 700, 680)
        h = decode_ddp(bytes(parts[0]))
        assert isinstance(h, DdpTagged) and h.stag == 0xABCD01 and h.last == last
        offs.append(h.to - ADDR)
        got += b"".join(bytes(p) for p in parts[1:])
        assert n == len(b"".join(bytes(p) for p in parts[1:])) <= 700
        if last:
            break
    assert got == bytes(data)
    assert offs == list(range(0, 2560, 700))


def test_segment_untagged_carries_qn_msn_mo_and_the_read_request() -> None:
    msg = TxMsg(int(RdmapOpcode.SEND_INVALIDATE), [memoryview(bytes(100))], 100,
                tagged=False, rsvdulp=0x5500, qn=0, msn=7)
    mos = []
    while True:
        parts, _n, last = segment(msg, 64, 40)
        h = decode_ddp(bytes(parts[0]))
        assert isinstance(h, DdpUntagged) and (h.qn, h.msn, h.rsvdulp) == (0, 7, 0x5500)
        mos.append(h.mo)
        if last:
            break
    assert mos == [0, 40, 80]
    rr = TxMsg(int(RdmapOpcode.RDMA_READ_REQUEST), [], 0, tagged=False, qn=1, msn=3,
               extra=bytes(28))
    parts, n, last = segment(rr, 64, 40)
    assert len(parts) == 1 and len(parts[0]) == 18 + 28 and n == 0 and last


def _write(ddp: DdpRx, qp: QP, stag: int, to: int, n: int, last: bool = True) -> list[memoryview]:
    return ddp.write(qp, int(RdmapOpcode.RDMA_WRITE), stag, to, n, last, HDR)


def test_tagged_write_places_in_the_stag_region() -> None:
    dev, pd = Dev(), object()
    qp = QP(pd)
    mr = dev.mr(pd, 4096)
    ddp = DdpRx(dev)
    (t,) = _write(ddp, qp, mr.rkey, ADDR + 100, 50, last=False)
    t[:] = b"a" * 50
    assert bytes(mr.buf[100:150]) == b"a" * 50
    assert ddp.mid_message
    with pytest.raises(IwarpFault) as ei:  # the next segment must continue at TO + 50
        _write(ddp, qp, mr.rkey, ADDR + 200, 10)
    _ddp(ei.value, DdpEtype.TAGGED_BUFFER, DdpTaggedErrorCode.BASE_OR_BOUNDS_VIOLATION)
    assert ei.value.ddp_hdr == HDR and ei.value.seg_len == 10  # M + D (RFC 5040 §4.8)
    _write(ddp, qp, mr.rkey, ADDR + 150, 10)
    assert not ddp.mid_message


@pytest.mark.parametrize(("case", "code", "event"), [
    ("unknown", DdpTaggedErrorCode.INVALID_STAG, False),
    ("bounds", DdpTaggedErrorCode.BASE_OR_BOUNDS_VIOLATION, False),
    ("pd", DdpTaggedErrorCode.STAG_NOT_ASSOCIATED, True),
    ("access", DdpTaggedErrorCode.INVALID_STAG, True),
    ("wrap", DdpTaggedErrorCode.TO_WRAP, False),
])
def test_tagged_write_access_errors(case: str, code: int, event: bool) -> None:
    dev, pd = Dev(), object()
    qp = QP(pd)
    mr = dev.mr(object() if case == "pd" else pd, 4096,
                access=int(e.IBV_ACCESS_REMOTE_READ) if case == "access" else ACC_ALL)
    stag, to = mr.rkey, ADDR
    if case == "unknown":
        stag += 1
    elif case == "bounds":
        to = ADDR + 4090
    elif case == "wrap":
        to = (1 << 64) - 4
    with pytest.raises(IwarpFault) as ei:
        _write(DdpRx(dev), qp, stag, to, 16)
    _ddp(ei.value, DdpEtype.TAGGED_BUFFER, code)
    assert bool(dev.async_events) == event  # QP_ACCESS_ERR on a protection violation


def test_read_response_goes_to_the_oldest_reads_sink() -> None:
    dev, pd = Dev(), object()
    qp = QP(pd)
    sink = bytearray(100)
    rd = ReadCtx(None, 0x4242, 0x9000, 100, [memoryview(sink)])
    ddp = DdpRx(dev)
    op = int(RdmapOpcode.RDMA_READ_RESPONSE)
    (t,) = ddp.read_response(rd, op, 0x4242, 0x9000, 60, False, HDR)
    t[:] = b"r" * 60
    rd.received += 60
    with pytest.raises(IwarpFault) as ei:  # an RDMA Write may not interleave
        ddp.write(qp, int(RdmapOpcode.RDMA_WRITE), 1, 0, 0, True, HDR)
    assert (ei.value.layer, ei.value.etype, ei.value.code) == (
        TerminateLayer.RDMAP, RdmapEtype.REMOTE_OPERATION, RdmapErrorCode.UNEXPECTED_OPCODE)
    with pytest.raises(IwarpFault) as ei:  # the last segment must fill the Read exactly
        ddp.read_response(rd, op, 0x4242, 0x9000 + 60, 30, True, HDR)
    _ddp(ei.value, DdpEtype.TAGGED_BUFFER, DdpTaggedErrorCode.BASE_OR_BOUNDS_VIOLATION)
    with pytest.raises(IwarpFault) as ei:
        ddp.read_response(rd, op, 0x4243, 0x9000 + 60, 40, True, HDR)
    _ddp(ei.value, DdpEtype.TAGGED_BUFFER, DdpTaggedErrorCode.INVALID_STAG)
    (t,) = ddp.read_response(rd, op, 0x4242, 0x9000 + 60, 40, True, HDR)
    t[:] = b"s" * 40
    assert bytes(sink) == b"r" * 60 + b"s" * 40
    with pytest.raises(IwarpFault) as ei:
        ddp.read_response(None, op, 0x4242, 0, 1, True, HDR)
    _ddp(ei.value, DdpEtype.LOCAL_CATASTROPHIC, 0)


def test_untagged_send_consumes_a_receive_wqe_per_message() -> None:
    dev, pd = Dev(), object()
    qp = QP(pd)
    buf = dev.mr(pd, 64)
    qp.post_recv(buf, 64, wr_id=9)
    ddp = DdpRx(dev)
    op = int(RdmapOpcode.SEND)
    assert ddp.send_check(op, 0, 1, 0, 40, HDR)
    (t,) = ddp.send(qp, True, op, 0, 1, 40, HDR)
    t[:] = b"p" * 40
    assert not ddp.send_check(op, 0, 1, 40, 24, HDR)  # same message, next MO
    (t,) = ddp.send(qp, False, op, 0, 1, 24, HDR)
    t[:] = b"q" * 24
    rwqe, done_op, _inv, length = ddp.send_done()
    assert (rwqe.wr_id, done_op, length) == (9, op, 64)
    assert bytes(buf.buf) == b"p" * 40 + b"q" * 24
    assert ddp.rx_msn[0] == 2


@pytest.mark.parametrize(("qn", "msn", "mo", "posted", "code"), [
    (1, 1, 0, 1, DdpUntaggedErrorCode.INVALID_QN),
    (0, 2, 0, 1, DdpUntaggedErrorCode.INVALID_MSN_RANGE),
    (0, 1, 8, 1, DdpUntaggedErrorCode.INVALID_MO),
    (0, 1, 0, 0, DdpUntaggedErrorCode.INVALID_MSN_NO_BUFFER),
])
def test_untagged_errors(qn: int, msn: int, mo: int, posted: int, code: int) -> None:
    dev, pd = Dev(), object()
    qp = QP(pd)
    for _ in range(posted):
        qp.post_recv(dev.mr(pd, 64), 64)
    ddp = DdpRx(dev)
    op = int(RdmapOpcode.SEND)
    with pytest.raises(IwarpFault) as ei:
        new = ddp.send_check(op, qn, msn, mo, 10, HDR)
        ddp.send(qp, new, op, 0, msn, 10, HDR)
    _ddp(ei.value, DdpEtype.UNTAGGED_BUFFER, code)
    assert ei.value.ddp_hdr == HDR and ei.value.seg_len == 10


def test_send_longer_than_the_buffer_is_message_too_long() -> None:
    dev, pd = Dev(), object()
    qp = QP(pd)
    qp.post_recv(dev.mr(pd, 64), 32)
    ddp = DdpRx(dev)
    with pytest.raises(IwarpFault) as ei:
        ddp.send(qp, True, int(RdmapOpcode.SEND), 0, 1, 33, HDR)
    _ddp(ei.value, DdpEtype.UNTAGGED_BUFFER, DdpUntaggedErrorCode.MESSAGE_TOO_LONG)
    assert ei.value.wc_status == int(e.IBV_WC_LOC_LEN_ERR)
    rwqe = ddp.abort_recv()  # the stream ends: the WQE goes back for an error completion
    assert rwqe is not None and ddp.abort_recv() is None


def test_read_request_is_one_whole_segment_with_the_next_msn() -> None:
    ddp = DdpRx(Dev())
    ddp.read_request_check(1, 1, 0, True, HDR, 0)
    for qn, msn, mo, last, code in ((0, 1, 0, True, DdpUntaggedErrorCode.INVALID_QN),
                                    (1, 5, 0, True, DdpUntaggedErrorCode.INVALID_MSN_RANGE),
                                    (1, 1, 0, False, DdpUntaggedErrorCode.INVALID_MO)):
        with pytest.raises(IwarpFault) as ei:
            ddp.read_request_check(qn, msn, mo, last, HDR, 0)
        _ddp(ei.value, DdpEtype.UNTAGGED_BUFFER, code)
