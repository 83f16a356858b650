"""Where the coalesced ACK a QP owes leaves when the application posts its next request
(issue 26, "the tools are as fast as the bench").

``ibv_rc_pingpong`` and perftest's latency tests await each SEND's completion (the peer's
ACK) as well as the answer. The responder coalesces its ACK until its own next request
(IBA 9.7.5.1.1). On an idle machine the request leaves first and the ACK right after
it: the peer begins on the request while the ACK is built. On a contended machine (the
busy poll's pacer says so: ``PollPacer.hold_acks``), where the peer sleeps between
datagrams, both go in one batch when the application awaited its earlier requests' ACKs
(``EngineQP.ack_rides_with``; one UDP GSO send: in the peer's socket at once, one
wake-up); a QP whose earlier requests are still unacknowledged (the bench's pipelining
ping-pong) sends its request first, alone, there too. Once each side acknowledges the
other's answer before its next request, each request asks for a prompt ACK
(``Port.ack_prompt``): on an idle machine it leaves from the step that took the
request, while the application makes its answer.
"""

from __future__ import annotations

import gc
import time
import weakref
from collections.abc import Iterator

import pytest
from harness.verbs_pair import Side, udp_rc_pair

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.drivers.links.udp import UdpLink
from softrdma.drivers.runtime.pacer import PollPacer
from softrdma.drivers.runtime.roce import Runtime
from softrdma.ib.qp import EngineQP

ROUNDS = 24
SEND = int(e.IBV_WC_SEND)
RECV = int(e.IBV_WC_RECV)


@pytest.fixture()
def pair() -> Iterator[tuple[Side, Side, UdpLink, UdpLink]]:
    """Two RC sides on UDP loopback with manual progress (no thread that sends ACKs)."""
    with udp_rc_pair("manual") as (a, b, la, lb):
        for s in (a, b):
            for _ in range(16):
                s.qp.post_recv(v.RecvWR(wr_id=1, num_sge=1, sg=[s.sge(0, 64)]))
        if la.gso_limit(bytes([127, 0, 0, 2])) < 2 or lb.gso_limit(bytes([127, 0, 0, 1])) < 2:
            pytest.skip("this kernel refuses UDP GSO on the loopback")
        yield a, b, la, lb


def _rt(s: Side) -> Runtime:
    rt = s.ctx.runtime
    assert isinstance(rt, Runtime)
    return rt


def _send_wr(s: Side, tag: int) -> v.SendWR:
    s.buf[64:128] = bytes([tag]) * 64
    return v.SendWR(wr_id=2, opcode=e.IBV_WR_SEND, num_sge=1, sg=[s.sge(64, 64)],
                    send_flags=e.IBV_SEND_SIGNALED)


def _until(s: Side, want: dict[int, int], deadline: float, also: Side | None = None,
           stop: object = None, sent_by: UdpLink | None = None) -> list[tuple[list[int], int]]:
    """The application's busy poll (a progress step, then the CQ) until ``want`` (opcode -> count) completions came; a
    RECV is checked and its receive posted again. ``also``: a peer polled meanwhile;
    ``stop``: the steps' ``stop_on``. Returns, for each poll that got completions, their
    opcodes and the datagrams ``sent_by`` (``s``'s link) sent during its step."""
    steps = []
    while any(want.values()):
        assert time.monotonic() < deadline, f"completions still awaited: {want}"
        if also is not None:
            _rt(also).progress_nonblocking()  # an idle poll: its pending ACKs leave
        sent0 = sent_by.stats.sent if sent_by is not None else 0
        _rt(s).progress_nonblocking(stop)
        got = []
        for wc in s.cq.poll(16)[1]:
            assert wc.status == 0, wc
            assert want.get(wc.opcode, 0) > 0, wc
            want[wc.opcode] -= 1
            got.append(wc.opcode)
            if wc.opcode == RECV:
                assert s.buf[0:64] == s.buf[0:1] * 64
                s.qp.post_recv(v.RecvWR(wr_id=1, num_sge=1, sg=[s.sge(0, 64)]))
        if got:
            steps.append((got, sent_by.stats.sent - sent0 if sent_by is not None else 0))
    return steps


def _post(me: Side, link: UdpLink, tag: int) -> bool:
    """``me`` posts its SEND of ``tag``: True if it owed an ACK, which ``link`` sent right
    after the SEND."""
    sent0 = link.stats.sent
    owes = bool(_rt(me).port.ack_pending)
    me.qp.post_send(_send_wr(me, tag))
    assert link.stats.sent == sent0 + 1 + owes  # the SEND, then the ACK owed
    return owes


def _machine(monkeypatch: pytest.MonkeyPatch, contended: bool, *sides: Side) -> None:
    """The busy poll's pacers find the machine ``contended`` or idle, whatever the load
    on the machine the test runs on; the ``sides``' ACKs are not held back (AckHold,
    tested elsewhere), so they leave with the requests."""
    monkeypatch.setattr(PollPacer, "hold_acks", lambda self: contended)
    for s in sides:
        monkeypatch.setattr(_rt(s), "_acks_go", lambda: True)


class _Always:
    """A ``stop_on`` that is always true: each busy-poll step stops after one datagram,
    as when the polled CQ got a completion from each."""

    def __bool__(self) -> bool:
        return True


def test_an_ack_waiting_pingpong_sends_each_request_with_its_ack_when_contended(
        pair: tuple[Side, Side, UdpLink, UdpLink], monkeypatch: pytest.MonkeyPatch) -> None:
    """Each side awaits its SEND's completion and the peer's SEND, on a contended
    machine: from the second round on every SEND leaves in one GSO send with the ACK for
    the SEND it answers, and the peer reads both at once."""
    a, b, la, lb = pair
    _machine(monkeypatch, True, a, b)
    deadline = time.monotonic() + 60.0
    gso0 = (la.stats.gso_sends, lb.stats.gso_sends)
    for i in range(ROUNDS):
        a.qp.post_send(_send_wr(a, i))
        # a's SEND, with the ACK of b's previous answer from the second round on
        _until(b, {RECV: 1, SEND: 1 if i else 0}, deadline)
        b.qp.post_send(_send_wr(b, i))
        _until(a, {RECV: 1, SEND: 1}, deadline)
    sends = (la.stats.gso_sends - gso0[0], lb.stats.gso_sends - gso0[1])
    # a's first SEND owes no ACK; every later one carries the ACK of b's answer, and every
    # answer of b the ACK of a's SEND
    assert sends == (ROUNDS - 1, ROUNDS), sends
    _until(b, {SEND: 1}, deadline, also=a)  # b's last answer: a's idle poll ACKs it


def test_an_ack_waiting_pingpong_sends_the_request_first_when_idle(
        pair: tuple[Side, Side, UdpLink, UdpLink], monkeypatch: pytest.MonkeyPatch) -> None:
    """The same ping-pong on an idle machine: no SEND shares a batch with an ACK (no GSO
    send); an ACK owed at a post leaves right after the SEND, so the peer's first step
    takes the SEND."""
    a, b, la, lb = pair
    _machine(monkeypatch, False, a, b)
    deadline = time.monotonic() + 60.0
    stop = _Always()
    gso0 = (la.stats.gso_sends, lb.stats.gso_sends)
    owed = 0  # ACKs a posted SEND went out with (riding after it)
    for i in range(ROUNDS):
        for me, peer, link in ((a, b, la), (b, a, lb)):
            owes = _post(me, link, i)
            owed += owes
            awaits = 1 if (i or peer is a) else 0  # the peer's own SEND's completion
            if owes:  # the ACK rides after the SEND: the peer's first datagram is the SEND
                rt = _rt(peer)
                while not rt.progress_nonblocking(stop):  # one datagram per step
                    assert time.monotonic() < deadline
                assert [wc.opcode for wc in peer.cq.poll(16)[1]] == [RECV]
                peer.qp.post_recv(v.RecvWR(wr_id=1, num_sge=1, sg=[peer.sge(0, 64)]))
                _until(peer, {SEND: awaits}, deadline)
            else:  # the ACK left before, from an ACK-only step
                _until(peer, {RECV: 1, SEND: awaits}, deadline)
    _until(b, {SEND: 1}, deadline, also=a)  # b's last answer: a's idle poll ACKs it
    assert (la.stats.gso_sends, lb.stats.gso_sends) == gso0
    assert owed  # some ACKs rode after a SEND (the others left from an ACK-only step)


def test_an_ack_waiting_pingpong_acks_each_request_in_the_step_that_takes_it_when_idle(
        pair: tuple[Side, Side, UdpLink, UdpLink], monkeypatch: pytest.MonkeyPatch) -> None:
    """The same ping-pong on an idle machine, each step taking one datagram: from the
    second round on, each side's ACK of the other's answer left before its next SEND
    (Port.ack_prompt): so the step that takes a SEND sends the ACK of that SEND, before
    the application sees its completion and answers, and no post owes an ACK."""
    a, b, la, lb = pair
    _machine(monkeypatch, False, a, b)
    deadline = time.monotonic() + 60.0
    stop = _Always()
    for i in range(ROUNDS):
        for me, peer, link, plink in ((a, b, la, lb), (b, a, lb, la)):
            owes = _post(me, link, i)
            assert not owes or i == 0, (i, me is a)
            # one datagram per step
            steps = _until(peer, {RECV: 1, SEND: 1 if (i or peer is a) else 0}, deadline,
                           stop=stop, sent_by=plink)
            assert peer.buf[0:64] == bytes([i]) * 64
            # the step that took the SEND sent its ACK (the first answer of b found a's
            # SEND unacknowledged: none then)
            assert [sent for got, sent in steps if RECV in got] == [1 if i else 0], (
                i, me is a)
    _until(b, {SEND: 1}, deadline)  # b's last answer: a's prompt ACK is in b's socket


def test_ack_awaited_while_an_awaiting_applications_request_is_unacknowledged(
        pair: tuple[Side, Side, UdpLink, UdpLink]) -> None:
    """``Runtime.ack_awaited``: the last post found its QP's earlier requests all
    complete (the application awaits each one) and its request awaits the ACK; not for a
    post behind an unacknowledged request (a pipelining application), nor once acked."""
    a, b, _la, _lb = pair
    deadline = time.monotonic() + 60.0
    rt = _rt(a)
    assert not rt.ack_awaited()
    a.qp.post_send(_send_wr(a, 1))
    assert rt.ack_awaited()
    a.qp.post_send(_send_wr(a, 2))  # posted behind the first: pipelining
    assert not rt.ack_awaited()
    _until(b, {RECV: 2}, deadline)
    _until(a, {SEND: 2}, deadline, also=b)
    assert not rt.ack_awaited()
    a.qp.post_send(_send_wr(a, 3))
    assert rt.ack_awaited()
    _until(b, {RECV: 1}, deadline)
    _until(a, {SEND: 1}, deadline, also=b)
    assert not rt.ack_awaited()


def test_a_destroyed_qp_that_awaited_its_ack_is_not_kept_alive(
        pair: tuple[Side, Side, UdpLink, UdpLink]) -> None:
    """The runtime remembers which QP's post awaits its ACK (``ack_awaited``) by number:
    a QP destroyed with its SEND unacknowledged is not held by it (before: the engine QP
    stayed reachable until the next post, one per runtime, and the connection soak's
    settle waited its 30 s for it at every measuring point)."""
    a, _b, _la, _lb = pair
    rt = _rt(a)
    engine = weakref.ref(a.qp.engine)
    a.qp.post_send(_send_wr(a, 1))
    assert rt.ack_awaited()
    a.qp.close()
    qp = engine()
    assert isinstance(qp, EngineQP) and qp.destroyed
    del qp
    assert not rt.ack_awaited()
    gc.collect()
    # the application's QP object still holds its engine; the runtime does not
    assert not any(r is vars(rt) for r in gc.get_referrers(engine()))


def test_a_request_posted_before_the_earlier_ones_were_acknowledged_leaves_first(
        pair: tuple[Side, Side, UdpLink, UdpLink], monkeypatch: pytest.MonkeyPatch) -> None:
    """A QP that owes an ACK but still awaits its own earlier request's ACK (a pipelining
    application, as the bench's ping-pong): its request leaves alone, the ACK after it,
    on a contended machine too."""
    a, b, la, lb = pair
    _machine(monkeypatch, True, a, b)
    deadline = time.monotonic() + 60.0
    b.qp.post_send(_send_wr(b, 1))  # b's first SEND: a has not read it yet
    a.qp.post_send(_send_wr(a, 2))
    _until(b, {RECV: 1}, deadline)  # b owes a's ACK; its own SEND is unacknowledged
    sent0, gso0 = lb.stats.sent, lb.stats.gso_sends
    b.qp.post_send(_send_wr(b, 3))
    assert lb.stats.gso_sends == gso0 and lb.stats.sent == sent0 + 2  # request, then ACK
    _until(a, {RECV: 2, SEND: 1}, deadline)
    _until(b, {SEND: 2}, deadline, also=a)


def test_the_ack_of_a_qp_left_alone_waits_for_nothing(
        pair: tuple[Side, Side, UdpLink, UdpLink]) -> None:
    """Without a request to ride with, the coalesced ACK leaves at the next idle poll."""
    a, b, _la, lb = pair
    a.qp.post_send(_send_wr(a, 5))
    deadline = time.monotonic() + 60.0
    _until(b, {RECV: 1}, deadline)
    sent0 = lb.stats.sent
    while lb.stats.sent == sent0:  # b's idle polls
        assert time.monotonic() < deadline
        _rt(b).progress_nonblocking()
    _until(a, {SEND: 1}, deadline)


def test_a_step_that_took_only_acks_sends_the_acks_owed(
        pair: tuple[Side, Side, UdpLink, UdpLink], monkeypatch: pytest.MonkeyPatch) -> None:
    """A step that took a request keeps the ACK it owes for the application's next post;
    a step that took only ACKs (the application awaits its own SEND's completion, so it
    polls on before it posts again) sends it then, and the peer, which awaits that ACK
    too, has it before the next request (before: only with that request). (b is
    contended, so its ACK rides with its answer and a reads both at once.)"""
    a, b, la, _lb = pair
    _machine(monkeypatch, True, a, b)
    deadline = time.monotonic() + 60.0
    a.qp.post_send(_send_wr(a, 1))
    _until(b, {RECV: 1}, deadline)  # b owes the ACK of a's SEND
    b.qp.post_send(_send_wr(b, 2))  # b's answer, that ACK riding with it
    stop = _Always()
    rt = _rt(a)
    while not rt.rx_pending():  # the answer alone; the ACK behind it stays
        assert time.monotonic() < deadline
        rt.progress_nonblocking(stop)
    got = {wc.opcode for wc in a.cq.poll(16)[1]}
    assert got == {RECV}, got
    sent0 = la.stats.sent
    rt.progress_nonblocking(stop)  # the ACK only: a's own SEND completes
    assert {wc.opcode for wc in a.cq.poll(16)[1]} == {SEND}
    assert la.stats.sent == sent0 + 1, "the ACK a owes did not leave"
    _until(b, {SEND: 1}, deadline)  # b's answer is acknowledged without a posting again
