"""The CM under loss, duplication, reordering and delay of MADs (hypothesis over fault
seeds): a connection ends ESTABLISHED on both sides or on neither (REJECTED /
UNREACHABLE / never seen), never half-open; release then brings both to IDLE with the
QPs in ERR and nothing left in the agents (IBA 12.9: retries, duplicates from state)."""

from __future__ import annotations

from typing import Any

import pytest
from harness.cm import Pair, T, is_attr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from softrdma import enums as e
from softrdma.ibcm.agent import AcceptParams, CmConfig, ConnParams
from softrdma.ibcm.events import CmEvent
from softrdma.ibcm.state import CmState
from softrdma.wire.cm import CmAttr

SID = 0x5151
RTS = int(e.IBV_QPS_RTS)
ERR = int(e.IBV_QPS_ERR)
_DOWN = {T.REJECTED, T.UNREACHABLE}


def run_connection(p: Pair, accept_delay: float) -> tuple[Any, Any, Any, Any]:
    """a connects to a listener on b that accepts ``accept_delay`` s after the
    CONNECT_REQUEST; runs until every timer has run out."""
    qb, _ = p.b.qp()
    lst = p.b.new_id()
    lst.listen(SID)
    children: list[Any] = []

    def accept(child: Any) -> None:
        if child.state in (CmState.REQ_RCVD, CmState.MRA_REQ_SENT):
            child.accept(qb, AcceptParams())

    def on(ev: CmEvent) -> None:
        if ev.type == T.CONNECT_REQUEST:
            children.append(ev.cm_id)
            if accept_delay:
                p.clock.call_later(accept_delay, accept, ev.cm_id)
            else:
                accept(ev.cm_id)
    p.b.on = on
    qa, _ = p.a.qp()
    cid = p.a.new_id()
    cid.connect(qa, ConnParams(SID, p.b.gid, private_data=b"fault test"))
    p.run(600)  # every timer has run out by then (16 tries x ~4.3 s, TimeWait ~2 s)
    assert len(children) <= 1, children  # duplicates never make a second request
    srv = children[0] if children else None
    return cid, srv, qa, qb


def check_outcome(p: Pair, cid: Any, srv: Any, qa: Any, qb: Any) -> bool:
    """The never-half-open property; returns whether the connection is up."""
    a_up = cid.state == CmState.ESTABLISHED
    b_up = srv is not None and srv.state == CmState.ESTABLISHED
    assert a_up == b_up, (cid, srv, p.a.events, p.b.events)
    first = [t for t in p.a.types(cid) if t in _DOWN | {T.ESTABLISHED}]
    assert first, p.a.events
    if a_up:
        assert qa.qp_state == qb.qp_state == RTS
        assert qa.engine.dest_qpn == qb.qp_num and qb.engine.dest_qpn == qa.qp_num
        assert p.b.types(srv).count(T.ESTABLISHED) == 1
        assert p.a.types(cid).count(T.ESTABLISHED) == 1
    else:
        assert qa.qp_state == ERR
        assert set(p.a.types(cid)) & _DOWN
        if srv is not None and srv.state != CmState.IDLE:
            assert srv.state == CmState.TIMEWAIT
        if srv is not None:
            assert qb.qp_state in (ERR, int(e.IBV_QPS_RESET))
            assert not (set(p.b.types(srv)) - {T.CONNECT_REQUEST}) or \
                set(p.b.types(srv)) & (_DOWN | {T.TIMEWAIT_EXIT, T.DISCONNECTED})
    return a_up


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31), drop=st.sampled_from([0.0, 0.1, 0.2, 0.3]),
       dup=st.sampled_from([0.0, 0.2, 0.5]), reorder=st.sampled_from([0.0, 0.3]),
       delay=st.sampled_from([0.0, 0.5, 5.0]), accept_delay=st.sampled_from([0.0, 6.0]))
@pytest.mark.iba("12.9")
def test_never_half_open(seed: int, drop: float, dup: float, reorder: float, delay: float,
                         accept_delay: float) -> None:
    p = Pair(seed=seed % 1000, drop=drop, duplicate=dup, reorder=reorder, delay=delay,
             reorder_window=1.0)
    cid, srv, qa, qb = run_connection(p, accept_delay)
    up = check_outcome(p, cid, srv, qa, qb)
    if up:
        (srv if seed & 1 else cid).disconnect()
        p.run(600)
        assert cid.state == srv.state == CmState.IDLE
        assert qa.qp_state == qb.qp_state == ERR
        assert p.a.types(cid).count(T.DISCONNECTED) == 1
        assert p.b.types(srv).count(T.DISCONNECTED) == 1
    assert p.a.agent.live_ids() == 0 and p.a.agent.timers() == 0
    assert p.b.agent.live_ids() == 1 and p.b.agent.timers() == 0  # the listener


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31), which=st.sampled_from([CmAttr.REP, CmAttr.RTU]),
       count=st.integers(1, 20))
@pytest.mark.iba("12.6.8", "12.6.9", "12.9")
def test_lost_rep_or_rtu_never_half_open(seed: int, which: CmAttr, count: int) -> None:
    """Drop the first ``count`` REPs or RTUs: both ends agree (max 3 CM retries, so
    long losses do exhaust the retries)."""
    cfg = CmConfig(max_cm_retries=3)
    p = Pair(seed=seed % 1000, config_a=cfg, config_b=cfg)
    p.fab.add_rule(is_attr(which), "drop", count=count)
    cid, srv, qa, qb = run_connection(p, 0.0)
    up = check_outcome(p, cid, srv, qa, qb)
    if count <= 3:  # fewer losses than retries: always recovered
        assert up
