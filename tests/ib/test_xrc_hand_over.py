"""The owner's side of an XRC hand-over (softrdma.ib.xrc ``XrcSRQ.hand_over``; IBA 9.8.5,
10.2.9): SEND packets another process's TGT QP took for this process's XRC SRQ are
placed in receive WQEs and completed on the SRQ's CQ; messages of several TGT QPs
interleave; a too-small WQE, an abort, an unknown SRQ, an R_Key that cannot be
invalidated and a full backlog complete in error or are counted, never lost silently."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest
from harness.device import ib_port

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.drivers.links.fabric import Fabric
from softrdma.drivers.runtime.clock import VirtualClock
from softrdma.ib import xrc
from softrdma.ib.xrc import (
    XF_ABORT,
    XF_CREDIT,
    XF_FIRST,
    XF_IMM,
    XF_INV,
    XF_LAST,
    XF_SE,
    srq_table,
)

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


# ---- the TGT QP's side, on the in-memory fabric, with an in-memory relay ----------------------
class _Relay:
    """An XrcRelay that hands over straight into ``owner``'s engine (devd's part), and
    refuses one call in ``refuse`` (a full data channel): the TGT QP's RNR NAK path."""

    def __init__(self, owner: Owner, srqn: int, refuse: int, seed: int) -> None:
        self.owner, self.srqn, self.refuse = owner, srqn, refuse
        self.rng = random.Random(seed)
        self.calls = self.refused = 0

    def lookup(self, srqn: int) -> bool:
        return srqn == self.srqn

    def relay(self, flags: int, srqn: int, tgt_qpn: int, src_qp: int, word: int,
              payload: memoryview) -> bool:
        self.calls += 1
        if self.refuse and self.rng.randrange(self.refuse) == 0:
            self.refused += 1
            return False
        srq_table(ib_port(self.owner.ctx)).hand_over(flags, srqn, tgt_qpn, src_qp, word,
                                                     payload)
        return True

    def credit(self, srqn: int, tgt_qpn: int, count: int) -> bool:
        return True  # (the owner's side: not this relay's)


def _node(fab: Fabric, ip: str) -> tuple[v.Context, v.PD, v.CQ, bytearray, v.MR]:
    ctx = v.Context(fabric=fab.link(ip))
    pd = v.PD(ctx)
    buf = bytearray(1 << 16)
    return ctx, pd, v.CQ(ctx, 64), buf, v.MR(pd, 0, int(e.IBV_ACCESS_LOCAL_WRITE), buffer=buf)


def _ini_tgt(ctx_s: v.Context, pd_s: v.PD, cq_s: v.CQ, ctx_t: v.Context,
             relay: _Relay) -> tuple[v.QP, v.QP]:
    """An INI QP on ``ctx_s`` connected to a TGT QP on ``ctx_t`` whose (private) domain
    hands over through ``relay``, as a domain shared through devd does."""
    xrcd_t = v.XRCD(ctx_t)
    xrcd_t.domain.relay = relay
    ini = v.QP(pd_s, v.QPInitAttr(qp_type=int(e.IBV_QPT_XRC_SEND), scq=cq_s,
                                  cap=v.QPCap(16, 0, 1, 0)))
    tgt = v.QP(xrcd_t, v.QPInitAttr(qp_type=int(e.IBV_QPT_XRC_RECV)))
    common: dict[str, Any] = dict(path_mtu=1, max_dest_rd_atomic=1, min_rnr_timer=1,
                                  timeout=12, retry_cnt=7, rnr_retry=7, max_rd_atomic=1)
    t = v.QPAttr(qp_access_flags=0, dest_qp_num=ini.qp_num, rq_psn=0xFFFFFA, sq_psn=0,
                 **common)
    t.ah_attr = v.AHAttr(is_global=1, gr=v.GlobalRoute(dgid=ctx_s.query_gid(1, 0),
                                                        sgid_index=0), port_num=1)
    tgt.to_rts(t)
    i = v.QPAttr(qp_access_flags=0, dest_qp_num=tgt.qp_num, rq_psn=0, sq_psn=0xFFFFFA,
                 **common)
    i.ah_attr = v.AHAttr(is_global=1, gr=v.GlobalRoute(dgid=ctx_t.query_gid(1, 0),
                                                        sgid_index=0), port_num=1)
    ini.to_rts(i)
    return ini, tgt


@pytest.mark.parametrize("to", ["ERR", "RESET"])
@pytest.mark.iba("9.8.5", "10.3.1.7")
def test_a_tgt_qp_leaving_a_message_unfinished_flushes_its_wqe(to: str) -> None:
    """The TGT QP goes to ERR (or RESET) with a handed-over message half done (its LAST
    packet lost for good): the owner completes that receive WQE with a flush error on
    the SRQ's CQ instead of holding it forever."""
    clock = VirtualClock()
    fab = Fabric(clock, seed=1)
    fab.add_rule(lambda d: d.data[0] == 0xA2, "drop")  # XRC SEND LAST (IBA Table 35)
    ctx_s, pd_s, cq_s, _, mr_s = _node(fab, "10.6.2.1")
    ctx_t, _, _, _, _ = _node(fab, "10.6.2.2")
    owner = Owner()
    try:
        relay = _Relay(owner, owner.srq.srq_num, refuse=0, seed=0)
        ini, tgt = _ini_tgt(ctx_s, pd_s, cq_s, ctx_t, relay)
        owner.post(1, 0, 4096)
        w = v.SendWR(1, sg=[v.SGE(mr_s.addr, 600, mr_s.lkey)])
        w.set_qp_type_xrc(owner.srq.srq_num)
        ini.post_send(w)
        clock.run(until=clock.now() + 0.01)
        assert relay.calls == 2 and owner.wcs() == []  # FIRST and MIDDLE handed over
        state = int(e.IBV_QPS_ERR if to == "ERR" else e.IBV_QPS_RESET)
        tgt.modify(v.QPAttr(qp_state=state), int(e.IBV_QP_STATE))
        assert [w[:4] for w in owner.wcs()] == [(1, e.IBV_WC_WR_FLUSH_ERR, 0, tgt.qp_num)]
    finally:
        fab.stop_capture()
        owner.ctx.close()
        ctx_s.close()
        ctx_t.close()


@pytest.mark.parametrize("faults", [dict(drop=0.15), dict(reorder=0.3), dict(duplicate=0.2)],
                         ids=["drop", "reorder", "duplicate"])
@pytest.mark.iba("9.8.5", "9.7.5.1.4", "9.7.5.2.8")
def test_tgt_qp_hands_each_message_over_once_despite_faults(faults: dict[str, float]) -> None:
    """SENDs (multi-packet, with immediate) through a TGT QP naming an SRQ of another
    process, on a lossy / reordering / duplicating fabric, with the relay refusing about
    one call in four (RNR NAK, sent again): each message reaches the owner's SRQ once,
    whole, in order; the TGT QP's own process places nothing."""
    clock = VirtualClock()
    fab = Fabric(clock, seed=5, **faults)  # type: ignore[arg-type]
    ctx_s, pd_s, cq_s, buf_s, mr_s = _node(fab, "10.6.1.1")
    ctx_t, _, _, _, _ = _node(fab, "10.6.1.2")
    owner = Owner()
    try:
        relay = _Relay(owner, owner.srq.srq_num, refuse=4, seed=3)
        ini, tgt = _ini_tgt(ctx_s, pd_s, cq_s, ctx_t, relay)
        sizes = [3000, 1, 700, 2048, 0, 1500]
        for k, n in enumerate(sizes):
            owner.post(100 + k, 8192 * k, 4096)
            buf_s[8192 * k:8192 * k + n] = bytes([k + 1]) * n
            w = v.SendWR(k, sg=[v.SGE(mr_s.addr + 8192 * k, n, mr_s.lkey)] if n else [],
                         opcode=int(e.IBV_WR_SEND_WITH_IMM if k == 2 else e.IBV_WR_SEND))
            w.imm_data = 0x5151 if k == 2 else 0
            w.set_qp_type_xrc(owner.srq.srq_num)
            ini.post_send(w)
        clock.run(max_events=500_000)
        assert [(w.wr_id, w.status) for w in cq_s.poll(16)[1]] == [
            (k, 0) for k in range(len(sizes))]
        got = owner.wcs()
        assert [(w[0], w[1], w[2], w[3], w[4]) for w in got] == [
            (100 + k, OK, n, tgt.qp_num, ini.qp_num) for k, n in enumerate(sizes)]
        assert got[2][5] == int(e.IBV_WC_WITH_IMM) and got[2][6] == 0x5151
        for k, n in enumerate(sizes):
            assert owner.buf[8192 * k:8192 * k + n] == bytes([k + 1]) * n
        assert relay.refused > 0
        assert fab.stats.dropped + fab.stats.reordered + fab.stats.duplicated > 0
    finally:
        fab.stop_capture()
        owner.ctx.close()
        ctx_s.close()
        ctx_t.close()


class _Holding(_Relay):
    """A relay whose channel to the owner is stalled while ``hold``: the records it
    takes wait (acknowledged by the TGT QP) until :meth:`release`."""

    def __init__(self, owner: Owner, srqn: int) -> None:
        super().__init__(owner, srqn, refuse=0, seed=0)
        self.hold = True
        self.held: list[tuple[int, int, int, int, int, bytes]] = []

    def relay(self, flags: int, srqn: int, tgt_qpn: int, src_qp: int, word: int,
              payload: memoryview) -> bool:
        if not self.hold:
            return super().relay(flags, srqn, tgt_qpn, src_qp, word, payload)
        self.calls += 1
        self.held.append((flags, srqn, tgt_qpn, src_qp, word, bytes(payload)))
        return True

    def release(self) -> None:
        self.hold = False
        table = srq_table(ib_port(self.owner.ctx))
        for flags, srqn, tgt, src, word, data in self.held:
            table.hand_over(flags, srqn, tgt, src, word, memoryview(data))
        self.held.clear()


class _CreditBack:
    """The owner's side of the relay: its credit records straight to the TGT QP's
    engine (devd's part), counted."""

    def __init__(self, ctx_t: v.Context) -> None:
        self.ctx_t = ctx_t
        self.returned = 0

    def lookup(self, srqn: int) -> bool:
        return False

    def relay(self, flags: int, srqn: int, tgt_qpn: int, src_qp: int, word: int,
              payload: memoryview) -> bool:
        return False

    def credit(self, srqn: int, tgt_qpn: int, count: int) -> bool:
        self.returned += count
        srq_table(ib_port(self.ctx_t)).hand_over(XF_CREDIT, srqn, tgt_qpn, 0, count,
                                                 memoryview(b""))
        return True


@pytest.mark.iba("9.8.5", "9.7.5.2.8")
def test_a_stalled_owner_holds_the_tgt_qp_to_its_credit() -> None:
    """The owner takes nothing (its channel stalled): the TGT QP hands over no more than
    HANDOVER_CREDITS packets it has not got back as consumed, and RNR NAKs the rest,
    instead of acknowledging packets that may not fit on the way. Once the owner
    consumes, its credit records (one per CREDIT_BATCH packets) let the rest through:
    each SEND arrives once, whole, in order."""
    clock = VirtualClock()
    fab = Fabric(clock, seed=2)
    ctx_s, pd_s, cq_s, buf_s, mr_s = _node(fab, "10.6.3.1")
    ctx_t, _, _, _, _ = _node(fab, "10.6.3.2")
    owner = Owner()
    try:
        relay = _Holding(owner, owner.srq.srq_num)
        back = owner.xrcd.domain.relay = _CreditBack(ctx_t)
        ini, tgt = _ini_tgt(ctx_s, pd_s, cq_s, ctx_t, relay)
        n, size = 10, 4096  # 16 packets each (path MTU 256)
        for k in range(n):
            owner.post(100 + k, size * k, size)
            buf_s[size * k:size * (k + 1)] = bytes([k + 1]) * size
            w = v.SendWR(k, sg=[v.SGE(mr_s.addr + size * k, size, mr_s.lkey)])
            w.set_qp_type_xrc(owner.srq.srq_num)
            ini.post_send(w)
        clock.run(until=clock.now() + 0.05)
        assert relay.calls == xrc.HANDOVER_CREDITS
        assert ctx_t.query_port_counters().send_rnr_nak > 0
        assert owner.wcs() == []
        relay.release()
        clock.run(max_events=500_000)
        assert [(w.wr_id, w.status) for w in cq_s.poll(16)[1]] == [(k, 0) for k in range(n)]
        assert [w[:4] for w in owner.wcs()] == [(100 + k, OK, size, tgt.qp_num)
                                                for k in range(n)]
        for k in range(n):
            assert owner.buf[size * k:size * (k + 1)] == bytes([k + 1]) * size
        packets = n * size // 256
        assert relay.calls == packets
        assert packets - xrc.CREDIT_BATCH < back.returned <= packets
        assert back.returned % xrc.CREDIT_BATCH == 0
    finally:
        fab.stop_capture()
        owner.ctx.close()
        ctx_s.close()
        ctx_t.close()


class _Refusing(_CreditBack):
    """A credit relay whose channel is full for its first ``refuse`` records."""

    def __init__(self, ctx_t: v.Context, refuse: int) -> None:
        super().__init__(ctx_t)
        self.refuse = refuse
        self.calls: list[tuple[int, int]] = []

    def credit(self, srqn: int, tgt_qpn: int, count: int) -> bool:
        self.calls.append((tgt_qpn, count))
        return len(self.calls) > self.refuse


def test_credit_batches_and_a_refused_credit_record_is_sent_again(owner: Owner) -> None:
    """The owner returns credit per TGT QP once CREDIT_BATCH of its packets are consumed
    (placed; one waiting for a receive WQE is not yet, an abort takes none); a record
    the channel refuses is kept and sent with the next packet or receive WQE, not lost
    (the sender would wait for it for ever)."""
    ctx_t = v.Context(fabric=Fabric(VirtualClock()).link("10.6.4.1"))
    try:
        back = owner.xrcd.domain.relay = _Refusing(ctx_t, refuse=2)
        batch = xrc.CREDIT_BATCH
        assert batch == 16  # the SRQ's 16 WQEs below
        for k in range(16):
            owner.post(k, 100 * k, 100)
        owner.give(FIRST, 0x22, b"y")
        owner.give(XF_ABORT, 0x22, b"")  # its packet is consumed (one), the abort is not
        for _ in range(batch):  # 15 placed, the 16th waits for a WQE
            owner.give(ONLY, 0x21, b"x")
        assert back.calls == []
        owner.post(99, 5000, 100)  # placed: 16 consumed; refused, and again at once
        assert back.calls == [(0x21, batch)] * 2
        owner.give(ONLY, 0x23, b"z")  # the next packet (waits): sent with it
        assert back.calls == [(0x21, batch)] * 3
        owner.post(98, 6000, 100)
        assert len(back.calls) == 3
        assert len(owner.wcs() + owner.wcs()) == batch + 2  # (16 per poll)
    finally:
        ctx_t.close()
