"""SQD: the ACK that completes the last outstanding WQE raises SQ_DRAINED (IBA 10.3.1.5,
11.6.3), once, when the QP asked for it (``en_sqd_async_notify``). The completer's ACK
path (``Completer._progress``) checks for it only in SQD (issue 25: per-ACK work)."""

from __future__ import annotations

import pytest
from harness.engine import Endpoint, Net, connect, deliver

from softrdma import enums as e
from softrdma.seam.events import AsyncEventType
from softrdma.seam.states import SQD
from softrdma.seam.types import SGE, RecvWQE, SendWQE


def _drained(ep: Endpoint) -> int:
    return sum(1 for ev in ep.port.pop_events() if ev.type == AsyncEventType.SQ_DRAINED)


@pytest.mark.iba("10.3.1.5", "11.6.3")
@pytest.mark.parametrize("fast", [True, False])
def test_the_last_ack_in_sqd_raises_sq_drained_once(fast: bool) -> None:
    net = Net()
    a = Endpoint(net.add_port(1))
    b = Endpoint(net.add_port(2))
    a.port.fast_paths = b.port.fast_paths = fast
    connect(a, b)
    for i in range(2):
        b.qp.post_recv(RecvWQE(i, [SGE(b.mr.addr, 64, b.mr.lkey)]))
        a.qp.post_send(SendWQE(i, int(e.IBV_WR_SEND), int(e.IBV_SEND_SIGNALED),
                               [SGE(a.mr.addr, 16, a.mr.lkey)]), 0.0)
    a.qp.modify({"qp_state": SQD, "en_sqd_async_notify": True}, 0.0)
    a.port.pop_events()
    assert len(deliver(a, b)) == 2
    assert len(deliver(b, a)) == 1  # one coalesced ACK for both SENDs
    assert [w.status for w in a.scq] == [int(e.IBV_WC_SUCCESS)] * 2
    assert _drained(a) == 1
    assert _drained(a) == 0
