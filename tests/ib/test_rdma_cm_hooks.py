"""The two engine hooks the CM relies on: COMM_EST from a QP in RTR (IBA 11.6.3) and
``Port.arm`` accepting any timer object (the CM's QP1 timer)."""

from __future__ import annotations

import pytest
from harness.engine import Endpoint, Net, connect

from softrdma import enums as e
from softrdma.ib.qp import AddressVector
from softrdma.seam.events import AsyncEventType, EngineEvent
from softrdma.seam.types import SGE, RecvWQE, SendWQE


def post_recv(ep: Endpoint, wr_id: int, off: int, length: int) -> None:
    ep.qp.post_recv(RecvWQE(wr_id, [SGE(ep.mr.addr + off, length, ep.mr.lkey)]))


def send(ep: Endpoint, wr_id: int, off: int, length: int) -> None:
    ep.qp.post_send(SendWQE(wr_id, int(e.IBV_WR_SEND), int(e.IBV_SEND_SIGNALED),
                            [SGE(ep.mr.addr + off, length, ep.mr.lkey)]), 0.0)


def _rtr_pair(net: Net) -> tuple[Endpoint, Endpoint]:
    a, b = Endpoint(net.add_port(1)), Endpoint(net.add_port(2))
    connect(a, b)
    b.qp.modify({"qp_state": 0}, 0.0)  # b back to RESET, then only up to RTR
    b.qp.modify({"qp_state": 1, "pkey_index": 0, "port_num": 1,
                 "access_flags": int(e.IBV_ACCESS_REMOTE_WRITE)}, 0.0)
    b.qp.modify({"qp_state": 2, "path_mtu": 3, "dest_qp_num": a.qp.qpn, "rq_psn": 0xFFFFF0,
                 "ah": AddressVector(a.port.gids[0]), "max_dest_rd_atomic": 4,
                 "min_rnr_timer": 1}, 0.0)
    return a, b


@pytest.mark.iba("11.6.3", "11.6.3.1", "12.9.7.3")
def test_comm_est_raised_once_in_rtr() -> None:
    net = Net()
    a, b = _rtr_pair(net)
    seen: list[EngineEvent] = []
    b.port.events.subscribe(seen.append)
    for i in range(3):
        post_recv(b, i, 0, 4096)
        send(a, i, 0, 16)
    net.run()
    assert [w.status for w in b.rcq] == [0, 0, 0]  # an RTR QP receives (IBA 10.3.1.3)
    assert seen == [EngineEvent(AsyncEventType.COMM_EST, b.qp)]


@pytest.mark.iba("11.6.3")
def test_no_comm_est_in_rts() -> None:
    net = Net()
    a, b = Endpoint(net.add_port(1)), Endpoint(net.add_port(2))
    connect(a, b)
    seen: list[EngineEvent] = []
    b.port.events.subscribe(seen.append)
    post_recv(b, 1, 0, 4096)
    send(a, 1, 0, 16)
    net.run()
    assert len(b.rcq) == 1 and seen == []


def test_port_arm_takes_any_timer() -> None:
    net = Net()
    port = net.add_port(1)

    class Timer:
        def __init__(self) -> None:
            self.deadline: float | None = 5.0
            self.fired: list[float] = []

        def on_timer(self, now: float) -> None:
            self.fired.append(now)
            self.deadline = None

    t = Timer()
    port.arm(t)
    assert port.next_deadline() == 5.0
    port.on_timer(4.0)
    assert t.fired == []
    port.on_timer(5.5)
    assert t.fired == [5.5] and port.next_deadline() is None
