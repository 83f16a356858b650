"""UD and UC engine behaviour (IBA 9.8 UD, 9.7.4 UC), SRQ and QP state effects."""

from __future__ import annotations

from typing import Any

import pytest
from harness.engine import Endpoint, Net, Sink, connect

from softrdma import enums as e
from softrdma.errors import ResourceError, StateError
from softrdma.ib.port import RxMeta
from softrdma.ib.qp import AddressVector
from softrdma.seam.events import AsyncEventType
from softrdma.seam.types import SGE, RecvWQE, SendWQE
from softrdma.wire import ib as wib

SIG = int(e.IBV_SEND_SIGNALED)


def ud_pair(net: Net) -> tuple[Endpoint, Endpoint]:
    a = Endpoint(net.add_port(1), e.IBV_QPT_UD)
    b = Endpoint(net.add_port(2), e.IBV_QPT_UD)
    connect(a, b)
    return a, b


def ud_send(a: Endpoint, b: Endpoint, wr_id: int, length: int, qkey: int = 0x11111111,
            **kw: Any) -> None:
    a.qp.post_send(SendWQE(wr_id, int(kw.pop("opcode", e.IBV_WR_SEND)), SIG,
                           [SGE(a.mr.addr, length, a.mr.lkey)], ah=AddressVector(b.port.gids[0]),
                           remote_qpn=b.qp.qpn, remote_qkey=qkey, **kw), 0.0)


@pytest.mark.iba("9.8.2", "9.3.2", "11.4.1.1")
def test_ud_send_grh_and_src_qp() -> None:
    net = Net()
    a, b = ud_pair(net)
    a.buf[:100] = b"u" * 100
    b.qp.post_recv(RecvWQE(5, [SGE(b.mr.addr, 4096 + 40, b.mr.lkey)]))
    ud_send(a, b, 1, 100, opcode=e.IBV_WR_SEND_WITH_IMM, imm_data=0x55)
    net.run()
    assert a.scq[0].status == 0
    wc = b.rcq[0]
    assert wc.status == 0 and wc.byte_len == 140 and wc.src_qp == a.qp.qpn
    assert wc.wc_flags & e.IBV_WC_GRH and wc.wc_flags & e.IBV_WC_WITH_IMM and wc.imm_data == 0x55
    assert b.buf[40:140] == b"u" * 100


@pytest.mark.iba("10.2.5", "9.8.3")
def test_ud_bad_qkey_and_no_wqe_dropped_silently() -> None:
    net = Net()
    a, b = ud_pair(net)
    ud_send(a, b, 1, 10)  # no receive posted
    net.run()
    assert b.port.counters.ud_no_wqe == 1 and not b.rcq
    b.qp.post_recv(RecvWQE(5, [SGE(b.mr.addr, 1000, b.mr.lkey)]))
    ud_send(a, b, 2, 10, qkey=0x22)
    net.run()
    assert b.port.counters.rcvd_bad_qkey == 1 and not b.rcq
    # controlled Q_Key (bit 31) in the WR means "use the QP's own Q_Key" (IBA 10.2.5)
    ud_send(a, b, 3, 10, qkey=0x80000000)
    net.run()
    assert b.rcq and b.rcq[0].status == 0


@pytest.mark.iba("9.8.2", "10.3.1.6")
def test_ud_message_larger_than_mtu_fails_locally_and_qp_goes_to_sqe() -> None:
    net = Net()
    a, b = ud_pair(net)
    ud_send(a, b, 1, 5000)
    ud_send(a, b, 2, 10)
    net.run()
    assert [(w.wr_id, w.status) for w in a.scq] == [(1, e.IBV_WC_LOC_LEN_ERR),
                                                   (2, e.IBV_WC_WR_FLUSH_ERR)]
    # UD send error: Send Queue Error state, the receive side still works (IBA 10.3.1.6)
    assert a.qp.state == e.IBV_QPS_SQE
    a.qp.post_recv(RecvWQE(9, [SGE(a.mr.addr, 1000, a.mr.lkey)]))
    b.qp.post_send(SendWQE(3, int(e.IBV_WR_SEND), SIG, [SGE(b.mr.addr, 10, b.mr.lkey)],
                           ah=AddressVector(a.port.gids[0]), remote_qpn=a.qp.qpn,
                           remote_qkey=0x11111111), 0.0)
    net.run()
    assert a.rcq and a.rcq[0].wr_id == 9 and a.rcq[0].status == 0
    # SQE -> RTS resumes sending
    a.qp.modify({"qp_state": int(e.IBV_QPS_RTS)}, 0.0)
    b.qp.post_recv(RecvWQE(8, [SGE(b.mr.addr, 1000, b.mr.lkey)]))
    ud_send(a, b, 4, 10)
    net.run()
    assert a.scq[-1].wr_id == 4 and a.scq[-1].status == 0 and b.rcq[-1].wr_id == 8


@pytest.mark.iba("9.9.4")
def test_uc_write_and_send_loss_drops_message() -> None:
    net = Net()
    a = Endpoint(net.add_port(1), e.IBV_QPT_UC)
    b = Endpoint(net.add_port(2), e.IBV_QPT_UC)
    connect(a, b)
    first: list[int] = []

    def rule(data: bytes) -> bool:
        p = wib.decode(memoryview(data))
        if p.opcode == 0x21 and not first:  # drop one UC SEND_MIDDLE
            first.append(1)
            return True
        return False

    net.drop_rule = rule
    b.qp.post_recv(RecvWQE(1, [SGE(b.mr.addr, 20000, b.mr.lkey)]))
    a.buf[:10000] = b"a" * 10000
    a.qp.post_send(SendWQE(1, int(e.IBV_WR_SEND), SIG, [SGE(a.mr.addr, 10000, a.mr.lkey)]), 0.0)
    a.qp.post_send(SendWQE(2, int(e.IBV_WR_SEND), SIG, [SGE(a.mr.addr, 300, a.mr.lkey)]), 0.0)
    net.run()
    assert [w.status for w in a.scq] == [0, 0]  # UC completes on transmission
    # the first message was dropped; its receive WQE was reused by the second one
    assert len(b.rcq) == 1 and b.rcq[0].wr_id == 1 and b.rcq[0].byte_len == 300
    assert b.port.counters.dropped_uc >= 1


@pytest.mark.iba("10.2.9", "10.2.9.6", "11.6.3.1")
def test_srq_shared_by_two_qps_and_limit_event() -> None:
    net = Net()
    pa = net.add_port(1)
    pb = net.add_port(2)
    events: list[AsyncEventType] = []
    pb.events.subscribe(lambda ev: events.append(ev.type))
    b_pd = object()
    srq = pb.create_srq(b_pd, 10, 1, srq_limit=3)
    a1, a2 = Endpoint(pa), Endpoint(pa)
    b1, b2 = Endpoint(pb, srq=srq), Endpoint(pb, srq=srq)
    for ep in (b1, b2):
        ep.pd = b_pd
        ep.qp.pd = b_pd
    b1.mr.pd = b_pd
    connect(a1, b1)
    connect(a2, b2)
    for i in range(5):
        srq.post_recv(RecvWQE(i, [SGE(b1.mr.addr + i * 100, 100, b1.mr.lkey)]))
    try:
        b1.qp.post_recv(RecvWQE(99, []))
        raise AssertionError("post_recv on an SRQ-attached QP must fail")
    except StateError:
        pass
    a1.qp.post_send(SendWQE(1, int(e.IBV_WR_SEND), SIG, [SGE(a1.mr.addr, 10, a1.mr.lkey)]), 0.0)
    a2.qp.post_send(SendWQE(2, int(e.IBV_WR_SEND), SIG, [SGE(a2.mr.addr, 10, a2.mr.lkey)]), 0.0)
    a1.qp.post_send(SendWQE(3, int(e.IBV_WR_SEND), SIG, [SGE(a1.mr.addr, 10, a1.mr.lkey)]), 0.0)
    net.run()
    got = sorted(w.wr_id for w in b1.rcq + b2.rcq)
    assert got == [0, 1, 2] and len(srq) == 2
    assert events == [AsyncEventType.SRQ_LIMIT_REACHED]


@pytest.mark.iba("10.3.1")
def test_state_rules() -> None:
    net = Net()
    p = net.add_port(1)
    ep = Endpoint(p, max_wr=2)
    try:
        ep.qp.post_send(SendWQE(1, int(e.IBV_WR_SEND), SIG, []), 0.0)
        raise AssertionError("post_send in RESET must fail")
    except StateError:
        pass
    ep.qp.modify({"qp_state": 1}, 0.0)
    ep.qp.post_recv(RecvWQE(1, []))
    ep.qp.post_recv(RecvWQE(2, []))
    try:
        ep.qp.post_recv(RecvWQE(3, []))
        raise AssertionError("RQ overflow must fail")
    except ResourceError:
        pass
    ep.qp.modify({"qp_state": 6}, 0.0)
    assert [(w.wr_id, w.status) for w in ep.rcq] == [(1, 5), (2, 5)]
    ep.qp.modify({"qp_state": 0}, 0.0)
    assert ep.qp.state == 0


@pytest.mark.iba("9.6", "9.6.1.4")
def test_unknown_qp_and_garbage_are_counted() -> None:
    net = Net()
    p = net.add_port(1)
    sink = Sink()
    assert not sink
    p.receive(memoryview(b"\x04\x00\xff\xff\x00\x00\x00\x99\x00\x00\x00\x00"),
              RxMeta(bytes(16), p.gids[0]), 0.0)
    assert p.counters.rcvd_unknown_qp == 1
    p.receive(memoryview(b"\x15" + bytes(20)), RxMeta(bytes(16), p.gids[0]), 0.0)
    p.receive(memoryview(b"\x04\x00"), RxMeta(bytes(16), p.gids[0]), 0.0)
    assert p.counters.rcvd_malformed == 2
    # nothing at all (the engine's own check; the driver drops short datagrams before it)
    p.receive(memoryview(b""), RxMeta(bytes(16), p.gids[0]), 0.0)
    assert p.counters.rcvd_malformed == 3


def _ud_wqes(a: Endpoint, b: Endpoint, lengths: list[int], flags: list[int]) -> list[SendWQE]:
    return [SendWQE(i + 1, int(e.IBV_WR_SEND), f, [SGE(a.mr.addr + 64 * i, n, a.mr.lkey)],
                    ah=AddressVector(b.port.gids[0]), remote_qpn=b.qp.qpn, remote_qkey=0x11111111)
            for i, (n, f) in enumerate(zip(lengths, flags, strict=True))]


def _ud_outcome(batch: bool, lengths: list[int], flags: list[int], max_wr: int = 256,
                rate_bps: float = 0.0) -> tuple[Any, ...]:
    """Post a run of UD SENDs in one call (``post_sends``) or one by one; what happened."""
    net = Net()
    a = Endpoint(net.add_port(1), e.IBV_QPT_UD, max_wr=max_wr)
    b = Endpoint(net.add_port(2), e.IBV_QPT_UD)
    connect(a, b)
    a.qp.rate_limit_bps = rate_bps
    for i in range(len(lengths)):
        b.qp.post_recv(RecvWQE(100 + i, [SGE(b.mr.addr + i * 4200, 4200, b.mr.lkey)]))
    for i in range(len(lengths)):
        a.buf[64 * i:64 * i + 64] = bytes([i + 1]) * 64
    wqes = _ud_wqes(a, b, lengths, flags)
    refused: str | None = None
    try:
        if batch:
            a.qp.post_sends(wqes, 0.0)
        else:
            for w in wqes:
                a.qp.post_send(w, 0.0)
    except ResourceError as exc:
        refused = str(exc)
    posted = len(a.qp.req.sq)
    net.run()
    return (refused, posted, [(w.wr_id, w.status) for w in a.scq],
            [(w.wr_id, w.status, w.byte_len) for w in b.rcq],
            bytes(b.buf[40:104]), a.qp.state, a.port.counters.sent_pkts)


@pytest.mark.iba("9.8.2", "10.8.3", "11.4.1.1")
def test_ud_post_sends_is_post_send_of_each() -> None:
    """A run of UD SENDs posted in one call (the batch path: one pump, one completion
    pass) does what posting them one by one does: the same packets, the same completions
    in posting order (unsignaled ones none), the same local length error and flush."""
    sig, quiet = SIG, 0
    cases = [
        ([100] * 8, [sig, quiet, sig, quiet, quiet, sig, sig, quiet]),
        ([100, 64, 5000, 10, 10], [sig] * 5),  # LOC_LEN_ERR in the middle: SQE, flush
        ([64] * 40, [sig] * 40),                # more WQEs than the send queue holds
    ]
    for lengths, flags in cases:
        one = _ud_outcome(False, lengths, flags, max_wr=16)
        run = _ud_outcome(True, lengths, flags, max_wr=16)
        assert run == one
        assert run[0] is None
    # what the first case delivered, checked directly
    refused, _, sent, got, data, state, pkts = _ud_outcome(True, [100] * 8, cases[0][1])
    assert sent == [(1, 0), (3, 0), (6, 0), (7, 0)] and state == e.IBV_QPS_RTS and pkts == 8
    assert [w[0] for w in got] == list(range(100, 108)) and data == b"\x01" * 64


@pytest.mark.iba("11.4.1.1")
def test_ud_post_sends_refuses_past_a_full_queue_as_post_send() -> None:
    """Rate-limited (IBA 9.11), sends stay queued: a run longer than the queue's room
    posts what fits and is refused at the first that does not, as one by one."""
    one = _ud_outcome(False, [64] * 24, [SIG] * 24, max_wr=16, rate_bps=1e6)
    run = _ud_outcome(True, [64] * 24, [SIG] * 24, max_wr=16, rate_bps=1e6)
    assert run[0] is not None and "send queue full" in run[0]
    assert run == one and run[1] == 16


@pytest.mark.parametrize("room", [40 + 100, 40 + 99, 4096])
@pytest.mark.iba("11.4.1.1", "9.8.2")
def test_ud_receive_of_one_buffer_fits_or_fails_at_its_edge(room: int) -> None:
    """A 100-byte UD SEND into one receive buffer: the GRH area and the payload fit
    exactly or with room to spare; one byte short, the receive completes with a local
    length error and nothing is written past the buffer (IBA 11.4.1.1)."""
    net = Net()
    a, b = ud_pair(net)
    a.buf[:100] = bytes(range(100))
    b.buf[:8192] = b"\xee" * 8192
    b.qp.post_recv(RecvWQE(5, [SGE(b.mr.addr + 64, room, b.mr.lkey)]))
    ud_send(a, b, 1, 100)
    net.run()
    wc = b.rcq[0]
    if room >= 140:
        assert wc.status == 0 and wc.byte_len == 140 and b.buf[104:204] == bytes(range(100))
        assert b.buf[204:8192] == b"\xee" * (8192 - 204)
    else:
        assert wc.status == e.IBV_WC_LOC_LEN_ERR
        assert b.buf[64 + room:8192] == b"\xee" * (8192 - 64 - room)
