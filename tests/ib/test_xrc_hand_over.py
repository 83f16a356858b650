"""The owner's side of an XRC hand-over (softrdma.ib.xrc ``XrcSRQ.hand_over``; IBA 9.8.5,
10.2.9): SEND packets another process's TGT QP took for this process's XRC SRQ are
placed in receive WQEs and completed on the SRQ's CQ; messages of several TGT QPs
interleave; a too-small WQE, an abort, an unknown SRQ, an R_Key that cannot be
invalidated and a full backlog complete in error or are counted, never lost silently."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from harness.device import ib_port

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.drivers.links.fabric import Fabric
from softrdma.drivers.runtime.clock import VirtualClock
from softrdma.ib import xrc
from softrdma.ib.xrc import XF_ABORT, XF_FIRST, XF_IMM, XF_INV, XF_LAST, XF_SE, srq_table

FIRST, MID, LAST, ONLY = XF_FIRST, 0, XF_LAST, XF_FIRST | XF_LAST


class Owner:
    def __init__(self) -> None:
        self.ctx = v.Context(fabric=Fabric(VirtualClock()).link("10.6.0.1"))
        self.pd = v.PD(self.ctx)
        self.cq = v.CQ(self.ctx, 64)
        self.buf = bytearray(1 << 16)
        self.mr = v.MR(self.pd, 0, int(e.IBV_ACCESS_LOCAL_WRITE), buffer=self.buf)
        self.xrcd = v.XRCD(self.ctx)
        self.srq = v.XrcSRQ(self.pd, self.xrcd, self.cq, v.SrqInitAttr(v.SrqAttr(16, 1)))

    def post(self, wr_id: int, off: int, n: int) -> None:
        self.srq.post_recv(v.RecvWR(wr_id, 1, [v.SGE(self.mr.addr + off, n, self.mr.lkey)]))

    def give(self, flags: int, tgt: int, data: bytes, word: int = 0, srqn: int = -1) -> None:
        with self.ctx.runtime.lock:
            srq_table(ib_port(self.ctx)).hand_over(
                flags, self.srq.srq_num if srqn < 0 else srqn, tgt, 0x99, word,
                memoryview(data))

    def wcs(self) -> list[tuple[Any, ...]]:
        return [(w.wr_id, w.status, w.byte_len, w.qp_num, w.src_qp, w.wc_flags, w.imm_data)
                for w in self.cq.poll(16)[1]]


@pytest.fixture()
def owner() -> Iterator[Owner]:
    o = Owner()
    yield o
    o.ctx.close()


OK, RECV_FLAGS = int(e.IBV_WC_SUCCESS), 0


def test_interleaved_messages_of_two_tgt_qps(owner: Owner) -> None:
    owner.post(1, 0, 4096)
    owner.post(2, 4096, 4096)
    owner.give(FIRST, 0x21, b"a" * 1024)
    owner.give(FIRST, 0x22, b"b" * 1024)
    owner.give(MID, 0x21, b"c" * 1024)
    owner.give(LAST | XF_IMM | XF_SE, 0x22, b"d" * 10, word=0x1234)
    owner.give(LAST, 0x21, b"e" * 5)
    assert owner.wcs() == [(2, OK, 1034, 0x22, 0x99, int(e.IBV_WC_WITH_IMM), 0x1234),
                           (1, OK, 2053, 0x21, 0x99, 0, 0)]
    assert owner.buf[:2053] == b"a" * 1024 + b"c" * 1024 + b"e" * 5
    assert owner.buf[4096:4096 + 1034] == b"b" * 1024 + b"d" * 10


def test_waits_for_a_receive_wqe_in_order(owner: Owner) -> None:
    owner.give(ONLY, 0x21, b"one")
    owner.give(FIRST, 0x22, b"tw")
    owner.give(LAST, 0x22, b"o")
    assert owner.wcs() == []
    owner.post(1, 0, 100)
    assert owner.wcs() == [(1, OK, 3, 0x21, 0x99, 0, 0)]
    owner.post(2, 100, 100)
    assert owner.wcs() == [(2, OK, 3, 0x22, 0x99, 0, 0)]
    assert owner.buf[:3] == b"one" and owner.buf[100:103] == b"two"


def test_errors_complete_on_the_srq_cq(owner: Owner) -> None:
    port = ib_port(owner.ctx)
    owner.post(1, 0, 10)  # too small for 20 bytes
    owner.give(FIRST, 0x21, b"x" * 8)
    owner.give(LAST, 0x21, b"x" * 12)
    owner.post(2, 0, 100)  # aborted by its TGT QP (it went to ERR)
    owner.give(FIRST, 0x21, b"y")
    owner.give(XF_ABORT, 0x21, b"")
    owner.post(3, 0, 100)  # SEND with Invalidate of an ordinary MR's key (IBA o10-37.2.26)
    owner.give(ONLY | XF_INV, 0x21, b"z", word=owner.mr.rkey)
    assert [w[:2] for w in owner.wcs()] == [
        (1, e.IBV_WC_LOC_LEN_ERR), (2, e.IBV_WC_WR_FLUSH_ERR), (3, e.IBV_WC_REM_INV_REQ_ERR)]
    before = port.counters.rcvd_unknown_qp
    owner.give(ONLY, 0x21, b"?", srqn=owner.srq.srq_num + 1)  # no such SRQ here
    assert port.counters.rcvd_unknown_qp == before + 1


def test_a_full_backlog_drops_new_messages_and_fails_a_started_one(
        owner: Owner, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(xrc, "MAX_HANDOVER_BYTES", 100)
    port = ib_port(owner.ctx)
    before = port.counters.rcvd_no_buffer
    owner.give(FIRST, 0x21, b"a" * 60)  # waits: no WQE
    owner.give(MID, 0x21, b"b" * 60)  # does not fit: that message will fail
    owner.give(LAST, 0x21, b"c" * 10)  # (dropped with the rest of its message)
    owner.give(ONLY, 0x22, b"d" * 60)  # a new message that does not fit: dropped
    owner.give(ONLY, 0x23, b"e" * 30)  # fits
    assert port.counters.rcvd_no_buffer == before + 2
    for k in range(3):
        owner.post(k + 1, 1000 * k, 1000)
    assert [w[:4] for w in owner.wcs()] == [
        (1, e.IBV_WC_GENERAL_ERR, 0, 0x21), (2, OK, 30, 0x23)]
    assert owner.buf[1000:1030] == b"e" * 30
