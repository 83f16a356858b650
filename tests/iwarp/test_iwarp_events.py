"""Typed connection events of the iWARP engine (softrdma.iwarp.events).

Two engines joined by the in-memory pipe of tests/harness/iwarp.py: each phase change of
the stream (MPA Request, full operation, reject, fault, received Terminate, peer close)
appears once, as a frozen dataclass, in :meth:`IwarpConn.pop_events`.
"""

from __future__ import annotations

import dataclasses

import pytest
from harness.iwarp import Side, connect_pair, pump

from softrdma import enums as e
from softrdma.iwarp.engine import IwarpConn
from softrdma.iwarp.events import (
    Closed,
    Established,
    Failed,
    MpaRequestReceived,
    Rejected,
    Terminated,
)
from softrdma.wire.ddp import DdpEtype, DdpUntaggedErrorCode, TerminateLayer


def test_setup_events_on_both_sides() -> None:
    a, b = Side("a"), Side("b")
    connect_pair(a, b, pd_a=b"hi", pd_b=b"yo")
    (ea,) = a.conn.pop_events()
    assert isinstance(ea, Established) and ea.negotiated.peer_private_data == b"yo"
    req, est = b.conn.pop_events()
    assert isinstance(req, MpaRequestReceived) and req.request.user_data == b"hi"
    assert isinstance(est, Established)
    assert a.conn.pop_events() == []  # taken once
    with pytest.raises(dataclasses.FrozenInstanceError):
        ea.negotiated = est.negotiated  # type: ignore[misc]


def test_reject_is_one_rejected_event() -> None:
    a, b = Side("a"), Side("b")
    a.conn = IwarpConn(a.dev, initiator=True, qp=a.qp)
    b.conn = IwarpConn(b.dev, initiator=False)
    pump(a, b)
    b.conn.reject(b"no")
    pump(a, b)
    (ev,) = a.conn.pop_events()
    assert isinstance(ev, Rejected) and ev.rejected.private_data == b"no"


def test_fault_on_one_side_terminated_on_the_other() -> None:
    a, b = Side("a"), Side("b")
    connect_pair(a, b)
    a.conn.pop_events()
    b.conn.pop_events()
    a.post(e.IBV_WR_SEND, a.mr(16), 16)  # b posted no receive buffer
    pump(a, b)
    (fb,) = b.conn.pop_events()
    assert isinstance(fb, Failed) and not fb.during_setup and fb.fault is not None
    assert (fb.fault.layer, fb.fault.etype, fb.fault.code) == (
        TerminateLayer.DDP, DdpEtype.UNTAGGED_BUFFER, DdpUntaggedErrorCode.INVALID_MSN_NO_BUFFER)
    (ta,) = a.conn.pop_events()
    assert isinstance(ta, Terminated) and ta.term is not None
    assert ta.term.code == DdpUntaggedErrorCode.INVALID_MSN_NO_BUFFER


def test_peer_close_in_full_operation_and_during_setup() -> None:
    a, b = Side("a"), Side("b")
    connect_pair(a, b)
    a.conn.pop_events()
    a.conn.on_eof()
    (ev,) = a.conn.pop_events()
    assert isinstance(ev, Closed) and ev.reason == "peer closed the connection"
    c = Side("c")
    c.conn = IwarpConn(c.dev, initiator=True, qp=c.qp)
    c.conn.on_eof()
    (ev2,) = c.conn.pop_events()
    assert isinstance(ev2, Failed) and ev2.during_setup and ev2.fault is None
