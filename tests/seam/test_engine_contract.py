"""The one engine contract (softrdma.seam.protocols.Engine, issue 23): the IB port, the
iWARP connection, the IPoIB interface and the IB CM agent give their driver output with
``take_output()``, typed events with ``pop_events()``, and a timer through
``next_deadline()`` / ``on_timer(now)``; none of them calls a consumer or holds a lock."""

from __future__ import annotations

from typing import Any, Never

import pytest

from softrdma.ib.packet import TxPacket
from softrdma.ib.port import Port
from softrdma.ibcm.agent import CmAgent, OutMad
from softrdma.ibcm.events import CmEvent, CmEventType
from softrdma.ipoib.events import McastJoin, Output
from softrdma.ipoib.iface import IfaceConfig, IpoibInterface
from softrdma.iwarp.engine import IwarpConn
from softrdma.iwarp.events import ConnEvent
from softrdma.iwarp.mpa_stream import Buf
from softrdma.iwarp.qp import IwarpDevice
from softrdma.seam.events import AsyncEventType, EngineEvent
from softrdma.seam.protocols import Engine
from softrdma.wire import cm as wcm
from softrdma.wire.gid import ip_to_gid

GID_A = ip_to_gid(bytes([10, 9, 0, 1]))
GID_B = ip_to_gid(bytes([10, 9, 0, 2]))
SID = 0x4242


def _port() -> Port:
    return Port([GID_B])


def _conn() -> IwarpConn:
    return IwarpConn(IwarpDevice([GID_B]), initiator=True)


def _iface() -> IpoibInterface:
    return IpoibInterface(IfaceConfig(gid=GID_B, ud_qpn=0x40, ud_mtu=2044, addresses=(),
                                      mode="datagram"))


def _agent() -> CmAgent:
    return CmAgent([GID_B], 0xB0B, seed=1)


def _typed(port: Port, conn: IwarpConn, iface: IpoibInterface,
           agent: CmAgent) -> list[Engine[Any, Any]]:
    """mypy checks that each class implements the contract with its own types."""
    p: Engine[TxPacket, EngineEvent] = port
    c: Engine[Buf, ConnEvent] = conn
    i: Engine[Output, Never] = iface
    a: Engine[OutMad, CmEvent] = agent
    return [p, c, i, a]


@pytest.mark.parametrize("make", [_port, _conn, _iface, _agent])
def test_each_engine_has_the_contract(make: Any) -> None:
    engine = make()
    engines = _typed(_port(), _conn(), _iface(), _agent())
    assert type(engine) in {type(x) for x in engines}
    assert isinstance(engine, Engine)
    assert isinstance(engine.take_output(), list)
    assert engine.pop_events() == []
    assert engine.next_deadline() is None
    engine.on_timer(1.0)  # nothing due: nothing happens
    assert engine.pop_events() == []


def test_port_events_are_popped_once_and_still_pushed() -> None:
    port = _port()
    seen: list[EngineEvent] = []
    port.events.subscribe(seen.append)
    port.events.raise_event(AsyncEventType.DEVICE_FATAL)
    assert [ev.type for ev in seen] == [AsyncEventType.DEVICE_FATAL]
    assert [ev.type for ev in port.pop_events()] == [AsyncEventType.DEVICE_FATAL]
    assert port.pop_events() == []


def test_iwarp_first_fpdu_hold_is_the_connection_timer() -> None:
    conn = _conn()
    assert conn.take_output()  # the MPA Request
    conn.tx_hold_until = 5.0
    assert conn.next_deadline() == 5.0
    conn.on_timer(4.0)
    assert conn.next_deadline() == 5.0
    conn.on_timer(5.0)
    assert conn.next_deadline() is None


def test_ipoib_output_is_taken_once() -> None:
    iface = _iface()
    iface.start(0.0)
    out = iface.take_output()
    assert any(isinstance(o, McastJoin) for o in out)
    assert iface.take_output() == []


def test_cm_agent_returns_events_and_calls_no_handler() -> None:
    """The agent queues a REQ's CONNECT_REQUEST for its driver; it never runs the
    consumer's handler itself (delivery lives in drivers.cm.gsi)."""
    agent = _agent()
    called: list[CmEvent] = []
    lst = agent.create_id(called.append)
    lst.listen(SID, now=0.0)
    req = wcm.Req(local_comm_id=0x1234, service_id=SID, local_ca_guid=0xA0A, local_qpn=0x99,
                  starting_psn=7, path_mtu=3, max_cm_retries=3, local_cm_response_timeout=19,
                  primary_local_gid=GID_A, primary_remote_gid=GID_B, primary_hop_limit=64,
                  primary_local_ack_timeout=19)
    agent.on_mad(wcm.encode(req, tid=5), GID_A, 1, 0.0, dst_gid=GID_B)
    (ev,) = agent.pop_events()
    assert ev.type == CmEventType.CONNECT_REQUEST and ev.listen_id is lst
    assert called == [] and agent.pop_events() == []
    ev.cm_id.reject(now=0.5)
    (out,) = agent.take_output()
    rej = wcm.decode(out.mad).msg
    assert isinstance(rej, wcm.Rej) and rej.remote_comm_id == 0x1234
    assert out.dgid == GID_A and agent.take_output() == []
