"""A connection between two ids of one CM (one port): its MADs are handed back to the
agent without the wire (``CmBinding._loop_back``, as Linux rxe loops a packet for its own
address back inside the device), with the same state machine and events; what another
port or process would take still goes out."""

from __future__ import annotations

from typing import Any

from harness.cm import Node, Pair, T

from softrdma.ibcm.agent import AcceptParams, ConnParams, IbCmId
from softrdma.ibcm.model import CmState
from softrdma.wire.cm import CmAttr

SID = 0x0000_0000_0000_4343


def self_connect(p: Pair, n: Node, mask: int | None = None) -> tuple[IbCmId, Any, Any]:
    """``n`` listens on SID (with ``mask``) and connects to its own GID; the listener
    accepts; returns (client id, its QP, the server's QP)."""
    qs, _ = n.qp()
    lst = n.new_id()
    if mask is None:
        lst.listen(SID)
    else:
        lst.listen(SID, mask=mask)

    def on(ev: Any) -> None:
        if ev.type == T.CONNECT_REQUEST and ev.listen_id is lst:
            ev.cm_id.accept(qs, AcceptParams(private_data=b"yes"))
    n.on = on
    qc, _ = n.qp()
    cid = n.new_id()
    cid.connect(qc, ConnParams(SID, n.gid, private_data=b"self"))
    p.run(1)
    return cid, qc, qs


def test_a_connection_to_our_own_listener_skips_the_wire() -> None:
    p = Pair()
    n = p.b
    before = getattr(n.cm, "loopback_mads", 0)
    cid, qc, qs = self_connect(p, n)
    assert cid.state == CmState.ESTABLISHED
    assert p.log == []
    est = [ev for ev in n.of(T.ESTABLISHED)]
    assert len(est) == 2 and {ev.cm_id is cid for ev in est} == {True, False}
    req = n.of(T.CONNECT_REQUEST)[0]
    assert req.private_data.startswith(b"self")  # padded to the REQ field (IBA 12.6.5)
    assert qc.qp_state == qs.qp_state == 3  # both RTS
    cid.disconnect()
    p.run(1)
    assert T.DISCONNECTED in n.types(cid)
    assert n.types(req.cm_id).count(T.DISCONNECTED) == 1
    # REQ, REP, RTU looped back; DREQ and DREP took the fabric (they move a QP to ERR:
    # behind the data path's packets, CmAgent.takes)
    assert n.cm.loopback_mads - before == 3
    assert [attr for attr in (CmAttr.DREQ, CmAttr.DREP) if len(p.sent(attr)) == 1] == [
        CmAttr.DREQ, CmAttr.DREP]
    assert len(p.log) == 2
    assert n.agent.counters.mads_in == n.agent.counters.mads_out == 5


def test_a_listener_of_partial_mask_gets_its_req_from_the_wire() -> None:
    """A REQ for a listener of a partial mask might be another process's on a shared
    device (devd routes to the most specific listen): it takes the wire; the answers name
    our own comm IDs and loop back."""
    p = Pair()
    n = p.b
    cid, _, _ = self_connect(p, n, mask=0xFFFF_FFFF_FFFF_FF00)
    assert cid.state == CmState.ESTABLISHED
    assert len(p.sent(CmAttr.REQ)) == 1
    assert p.sent(CmAttr.REP) == [] and p.sent(CmAttr.RTU) == []


def test_mads_to_another_port_take_the_wire() -> None:
    p = Pair()
    qb, _ = p.b.qp()
    p.listen_accepting(SID, qb)
    qa, _ = p.a.qp()
    cid = p.a.new_id()
    cid.connect(qa, ConnParams(SID, p.b.gid))
    p.run(1)
    assert cid.state == CmState.ESTABLISHED
    assert p.a.cm.loopback_mads == p.b.cm.loopback_mads == 0
    assert len(p.sent(CmAttr.REQ)) == len(p.sent(CmAttr.REP)) == len(p.sent(CmAttr.RTU)) == 1
