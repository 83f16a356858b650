"""A responder's coalesced ACK leaves before its QP goes to ERR (IBA 9.7.5.1.1 lets a
responder coalesce ACKs; rxe sends each at once). Regression: the last SEND of an
exchange was acknowledged only after the DREQ that the receiver's ``rdma_disconnect``
queued, so the sender's QP went to ERR first and its SEND completed with a flush error
(``softrdma rdma-server`` failed its ``rdma_get_send_comp`` that way). The same holds
when the QP is destroyed without going to ERR first, as libfabric's RxM closes an
endpoint (its DREQ follows from ``rdma_destroy_id``): ``fi_pingpong -p "verbs;ofi_rxm"``'s
client saw a flushed WR about once in 16 runs."""

from __future__ import annotations

import pytest
from harness.engine import Endpoint, Net, connect, deliver

from softrdma import enums as e
from softrdma.ib.qp import ERR, RESET
from softrdma.seam.types import SGE, RecvWQE, SendWQE
from softrdma.wire.opcodes import RC_ACK


def _received_one() -> tuple[Endpoint, Endpoint]:
    """A SEND from a to b, received and completed at b, its ACK coalesced (pending)."""
    net = Net()
    a = Endpoint(net.add_port(1))
    b = Endpoint(net.add_port(2))
    connect(a, b)
    b.qp.post_recv(RecvWQE(7, [SGE(b.mr.addr, 64, b.mr.lkey)]))
    a.qp.post_send(SendWQE(1, int(e.IBV_WR_SEND), int(e.IBV_SEND_SIGNALED),
                           [SGE(a.mr.addr, 16, a.mr.lkey)]), 0.0)
    assert len(deliver(a, b)) == 1
    assert [w.status for w in b.rcq] == [0]
    assert b.port.ack_pending  # coalesced, not sent yet
    return a, b


@pytest.mark.iba("9.7.5.1.1", "10.3.1.7")
def test_pending_ack_goes_out_before_the_qp_errors() -> None:
    a, b = _received_one()
    b.qp.to_error()  # rdma_disconnect: the QP goes to ERR, then the DREQ is queued
    sent = deliver(b, a, acks=False)  # what leaves before anything queued later
    assert [p[0] for p in sent] == [RC_ACK]  # BTH OpCode
    assert [w.status for w in a.scq] == [int(e.IBV_WC_SUCCESS)]
    assert not b.port.take_tx()  # acknowledged once


@pytest.mark.iba("9.7.5.1.1")
def test_pending_ack_goes_out_before_the_qp_is_destroyed() -> None:
    a, b = _received_one()
    b.qp.destroy()  # ibv_destroy_qp in RTS, then rdma_destroy_id queues the DREQ
    sent = deliver(b, a, acks=False)
    assert [p[0] for p in sent] == [RC_ACK]
    assert [w.status for w in a.scq] == [int(e.IBV_WC_SUCCESS)]
    assert not b.port.take_tx()


@pytest.mark.parametrize("state", ["ERR", "RESET"])
def test_a_qp_out_of_service_acknowledges_nothing_when_destroyed(state: str) -> None:
    """Destroyed from ERR (its ACK went at to_error) or RESET (its peer state is gone):
    no packet."""
    a, b = _received_one()
    if state == "ERR":
        b.qp.to_error()
        b.port.take_tx()
        assert b.qp.state == ERR
    else:
        b.qp.modify({"qp_state": int(e.IBV_QPS_RESET)}, 1.0)
        assert b.qp.state == RESET
    b.qp.destroy()
    assert not b.port.take_tx()
