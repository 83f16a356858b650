"""Which request asks its responder for a prompt ACK (``Port.ack_prompt``,
``Responder.schedule_ack``; issue 26, "the tools are as fast as the bench").

A responder coalesces its ACKs (IBA 9.7.5.1.1) and sends them after the application's
next request. A peer that awaits each request's completion before its next one
(``ibv_rc_pingpong``, perftest's latency tests) acknowledges our requests before it
sends its own, and then awaits the ACK of its own: that request asks for a prompt ACK,
which the runtime sends at the end of the receive step. A request that arrives while
one of ours is unacknowledged, or after we posted again, asks for none (the bench's
ping-pong, a bulk sender), nor one to a QP that never sent.
"""

from __future__ import annotations

import pytest
from harness.engine import Endpoint, Net, connect, deliver

from softrdma import enums as e
from softrdma.seam.types import SGE, RecvWQE, SendWQE
from softrdma.wire.opcodes import RC_ACK, RC_SEND_ONLY, RC_WRITE_ONLY

SEND = int(e.IBV_WR_SEND)
WRITE = int(e.IBV_WR_RDMA_WRITE)
SIGNALED = int(e.IBV_SEND_SIGNALED)


def _deliver(src: Endpoint, dst: Endpoint, *, acks: bool = True) -> list[int]:
    """What ``src`` sends now, received by ``dst``: the BTH OpCodes."""
    return [p[0] for p in deliver(src, dst, acks=acks)]


def _send(x: Endpoint, wr_id: int, opcode: int = SEND, peer: Endpoint | None = None) -> None:
    sge = [SGE(x.mr.addr, 16, x.mr.lkey)]
    wqe = SendWQE(wr_id, opcode, SIGNALED, sge)
    if opcode == WRITE:
        assert peer is not None
        wqe.remote_addr, wqe.rkey = peer.mr.addr + 4096, peer.mr.rkey
    x.qp.post_send(wqe, 0.0)


@pytest.fixture()
def pair() -> tuple[Endpoint, Endpoint]:
    net = Net()
    a = Endpoint(net.add_port(1))
    b = Endpoint(net.add_port(2))
    connect(a, b)
    for x in (a, b):
        for i in range(8):
            x.qp.post_recv(RecvWQE(100 + i, [SGE(x.mr.addr + 2048, 64, x.mr.lkey)]))
    return a, b


@pytest.mark.iba("9.7.5.1.1")
@pytest.mark.parametrize("opcode", [SEND, WRITE])
def test_a_request_after_ours_were_acknowledged_asks_a_prompt_ack(
        pair: tuple[Endpoint, Endpoint], opcode: int) -> None:
    """a's request is acknowledged; b's next request then finds every request of a
    acknowledged and none posted since: a's port is asked for a prompt ACK, which its
    next output carries (and the ask ends there)."""
    a, b = pair
    _send(a, 1, opcode, b)
    assert _deliver(a, b, acks=False) == [RC_SEND_ONLY if opcode == SEND else RC_WRITE_ONLY]
    assert not b.port.ack_prompt  # b never sent: nothing of b's was acknowledged
    assert _deliver(b, a) == [RC_ACK]
    assert [w.wr_id for w in a.scq] == [1]
    _send(b, 2, opcode, a)
    assert not a.port.ack_prompt
    _deliver(b, a, acks=False)  # b's request, its ACK of nothing held
    assert a.port.ack_pending and a.port.ack_prompt
    assert _deliver(a, b) == [RC_ACK]
    assert not a.port.ack_prompt and not a.port.ack_pending
    assert [w.wr_id for w in b.scq] == [2]


@pytest.mark.iba("9.7.5.1.1")
def test_a_request_while_ours_is_unacknowledged_asks_none(
        pair: tuple[Endpoint, Endpoint]) -> None:
    """The bench's ping-pong answers before its own SEND's ACK came: b's answer reaches
    a while a's SEND awaits its ACK (the ACK rides behind the answer), so no ask; nor
    when a's earlier requests were acknowledged but a posted again since."""
    a, b = pair
    _send(a, 1)
    _deliver(a, b, acks=False)
    _send(b, 2)
    assert _deliver(b, a) == [RC_SEND_ONLY, RC_ACK]  # the answer first, then the ACK
    assert a.port.ack_pending and not a.port.ack_prompt  # a's SEND was outstanding
    _send(a, 3)  # a posts again before it ACKed b's answer
    assert _deliver(a, b) == [RC_SEND_ONLY, RC_ACK]
    assert not b.port.ack_prompt  # b's answer was acknowledged after a's request came
    assert _deliver(b, a) == [RC_ACK]  # b's idle output: the ACK of a's request
    assert [w.wr_id for w in a.scq] == [1, 3]
    _send(a, 4)  # every request of a acknowledged, then a new one posted
    _send(b, 5)
    _deliver(b, a, acks=False)
    assert a.port.ack_pending and not a.port.ack_prompt


@pytest.mark.iba("9.7.5.1.1")
def test_only_the_first_request_after_the_acknowledgement_asks(
        pair: tuple[Endpoint, Endpoint]) -> None:
    """A peer that sends on without awaiting our ACK (two requests in a row) asks for
    one prompt ACK at most: once the ACK left, its next request coalesces again; and an
    ACK the responder had to send another way (before a NAK) ends the ask."""
    a, b = pair
    _send(a, 1)
    _deliver(a, b, acks=False)
    _deliver(b, a)
    _send(b, 2)
    _deliver(b, a, acks=False)
    assert a.port.ack_prompt
    a.qp.resp.flush_pending_ack()  # as before a NAK: the ACK is sent, the ask ends
    assert not a.port.ack_pending and not a.port.ack_prompt
    assert _deliver(a, b) == [RC_ACK]
    _send(b, 3)
    _deliver(b, a, acks=False)
    assert a.port.ack_pending and not a.port.ack_prompt
    assert _deliver(a, b) == [RC_ACK]
    assert [w.wr_id for w in b.scq] == [2, 3]
