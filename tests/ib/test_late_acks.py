"""Issue 25 (write-bw at load): a transport timer that expires because the peer's ACKs
are late, not lost (a loaded host runs the peer late), must not make the requester resend
packets that an ACK arriving during the resend has already acknowledged (IBA 9.7.5.1.2:
an ACK covers every earlier PSN). Engine tests on the in-memory fabric (virtual clock)."""

from __future__ import annotations

import heapq

import pytest
from harness.engine import Endpoint, Net, connect

from softrdma import enums as e
from softrdma.ib.packet import RxMeta
from softrdma.seam.types import SGE, SendWQE
from softrdma.wire import opcodes as op

SIG = int(e.IBV_SEND_SIGNALED)
MTU = 1024  # path_mtu 3


def _held_ack_net() -> tuple[Net, Endpoint, Endpoint, list[bytes]]:
    """``a`` -> ``b``; every ACK ``b`` sends is held (in the returned list), not delivered."""
    net = Net()
    a = Endpoint(net.add_port(1))
    b = Endpoint(net.add_port(2))
    connect(a, b, mtu=3, timeout=10)
    held: list[bytes] = []

    def hold(data: bytes) -> bool:
        if data[0] == op.RC_ACK:
            held.append(data)
            return True
        return False

    net.drop_rule = hold
    return net, a, b, held


def _drain(net: Net) -> None:
    """Deliver every packet in flight (and what they provoke), firing no timer."""
    while True:
        net._collect()
        if not net.q:
            return
        t, _, sgid, dgid, data = heapq.heappop(net.q)
        net.now = max(net.now, t)
        net.ports[dgid].receive(memoryview(data), RxMeta(sgid, dgid), net.now)


def _deliver(net: Net, src: Endpoint, dst: Endpoint, data: bytes) -> None:
    dst.port.receive(memoryview(data), RxMeta(src.port.gids[0], dst.port.gids[0]), net.now)


@pytest.mark.iba("9.7.5.1.2", "9.7.6.1.3")
def test_a_late_ack_during_the_resend_stops_resending_what_it_acknowledges() -> None:
    """A 512-packet WRITE: the first window (256 PSNs) arrives, its ACKs are late, the
    timer expires and go-back-N resends half a window; then the late ACK of the whole
    first window arrives. Before the fix the resend cursor stayed behind it and the
    requester resent the other 128 acknowledged packets too (duplicates the responder
    processes one by one: issue 25's duplicate_request == retransmitted_pkts)."""
    net, a, b, held = _held_ack_net()
    size = 512 * MTU
    a.qp.post_send(SendWQE(1, int(e.IBV_WR_RDMA_WRITE), SIG, [SGE(a.mr.addr, size, a.mr.lkey)],
                           remote_addr=b.mr.addr, rkey=b.mr.rkey), 0.0)
    _drain(net)  # the first window reaches b; b's ACKs are held; a's timer is pending
    window = a.qp.req.window.size()
    assert held and a.port.counters.retransmitted_pkts == 0
    last_ack = held[-1]
    held.clear()
    d = a.qp.deadline
    assert d is not None
    net.now = d
    a.port.on_timer(d)  # a spurious expiry: go back to the first PSN, resend half a window
    _drain(net)  # the resends arrive (their duplicate ACKs are held)
    resent = a.port.counters.retransmitted_pkts
    assert 0 < resent < window
    _deliver(net, b, a, last_ack)  # the late ACK of the whole first window
    net.drop_rule = None
    net.run(max_steps=100_000)
    assert [w.status for w in a.scq] == [e.IBV_WC_SUCCESS]
    assert b.buf[:size] == a.buf[:size]
    # nothing it acknowledged was sent again
    assert a.port.counters.retransmitted_pkts == resent, (a.port.counters.retransmitted_pkts,
                                                          resent)
    assert b.port.counters.duplicate_request == resent


def test_a_spurious_timeout_gives_the_window_back() -> None:
    """The same late ACK proves the expiry spurious: the window it halved is restored
    (RFC 4015's Eifel response). Before, each spurious expiry at load halved the window
    for good (regrowing by about one PSN per window), and a run of them left a 4 MiB
    write-bw crawling at a few hundred packets a second."""
    net, a, b, held = _held_ack_net()
    size = 512 * MTU
    a.qp.post_send(SendWQE(1, int(e.IBV_WR_RDMA_WRITE), SIG, [SGE(a.mr.addr, size, a.mr.lkey)],
                           remote_addr=b.mr.addr, rkey=b.mr.rkey), 0.0)
    _drain(net)
    w = a.qp.req.window
    before = (w.cwnd, w.ssthresh)
    last_ack = held[-1]
    held.clear()
    d = a.qp.deadline
    assert d is not None
    net.now = d
    a.port.on_timer(d)
    assert w.cwnd < before[0] and w.losses == 1  # the expiry cut it
    _drain(net)
    _deliver(net, b, a, last_ack)
    assert (w.cwnd, w.ssthresh) == before and w.undone == 1
    assert a.qp.req.cwnd == w.size()
    net.drop_rule = None
    net.run(max_steps=100_000)
    assert [x.status for x in a.scq] == [e.IBV_WC_SUCCESS]


def test_a_real_loss_keeps_its_window_cut() -> None:
    """The undo needs an ACK beyond the resend cursor: after a real loss (the first
    window lost whole) the resend is answered in order, and the cut stays."""
    net = Net()
    a = Endpoint(net.add_port(1))
    b = Endpoint(net.add_port(2))
    connect(a, b, mtu=3, timeout=10)
    net.drop_rule = lambda data: True
    size = 512 * MTU
    a.qp.post_send(SendWQE(1, int(e.IBV_WR_RDMA_WRITE), SIG, [SGE(a.mr.addr, size, a.mr.lkey)],
                           remote_addr=b.mr.addr, rkey=b.mr.rkey), 0.0)
    _drain(net)  # all lost
    net.drop_rule = None
    w = a.qp.req.window
    d = a.qp.deadline
    assert d is not None
    net.now = d
    a.port.on_timer(d)
    net.run(max_steps=100_000)
    assert [x.status for x in a.scq] == [e.IBV_WC_SUCCESS]
    assert b.buf[:size] == a.buf[:size]
    assert w.losses == 1 and w.undone == 0 and w.ssthresh < 256


def test_late_acks_one_by_one_after_a_timeout_resend_only_the_probe() -> None:
    """What write-bw -s 4M showed at load: the timer expires, then the peer's late ACKs
    arrive one by one (one per AckReq, every 32 PSNs). A timeout restarts from the least
    window (RFC 5681 §3.1's loss window), so the first late ACK already overtakes the few
    packets resent: the expiry is found spurious, the window comes back and nothing else
    is resent. Before, the halved window (128 PSNs) went out at once, each late ACK
    trailed the resend cursor, and the whole window (256 packets) was sent twice."""
    net, a, b, held = _held_ack_net()
    size = 512 * MTU
    a.qp.post_send(SendWQE(1, int(e.IBV_WR_RDMA_WRITE), SIG, [SGE(a.mr.addr, size, a.mr.lkey)],
                           remote_addr=b.mr.addr, rkey=b.mr.rkey), 0.0)
    _drain(net)
    late = list(held)
    held.clear()
    assert len(late) >= 8  # one ACK per AckReq: the first window asks several
    w = a.qp.req.window
    before = (w.cwnd, w.ssthresh)
    d = a.qp.deadline
    assert d is not None
    net.now = d
    a.port.on_timer(d)
    _drain(net)
    for ack in late:
        _deliver(net, b, a, ack)
    net.drop_rule = None
    net.run(max_steps=100_000)
    assert [x.status for x in a.scq] == [e.IBV_WC_SUCCESS]
    assert b.buf[:size] == a.buf[:size]
    assert w.undone == 1 and w.ssthresh == before[1]
    assert a.port.counters.retransmitted_pkts <= 8, a.port.counters.retransmitted_pkts
