"""A connection between two ids of one CM (one port): its MADs are handed back to the
agent without the wire (``CmBinding._loop_back``, as Linux rxe loops a packet for its own
address back inside the device), with the same state machine and events; what another
port or process would take still goes out, and so does a DREQ that would overtake a
packet of the data path (``CmAgent.takes``)."""

from __future__ import annotations

from typing import Any

from harness.cm import RC, Node, Pair, T

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.ibcm.agent import AcceptParams, ConnParams, IbCmId
from softrdma.ibcm.model import CmState
from softrdma.wire.cm import CmAttr

SID = 0x0000_0000_0000_4343


def self_connect(p: Pair, n: Node, mask: int | None = None,
                 cqs: list[Any] | None = None, qpt: int = RC) -> tuple[IbCmId, Any, Any]:
    """``n`` listens on SID (with ``mask``) and connects to its own GID with QPs of type
    ``qpt``; the listener accepts; returns (client id, its QP, the server's QP); ``cqs``
    gets the client's and the server's CQ."""
    qs, cq_s = n.qp(qpt)
    lst = n.new_id()
    if mask is None:
        lst.listen(SID)
    else:
        lst.listen(SID, mask=mask)

    def on(ev: Any) -> None:
        if ev.type == T.CONNECT_REQUEST and ev.listen_id is lst:
            ev.cm_id.accept(qs, AcceptParams(private_data=b"yes"))
    n.on = on
    qc, cq_c = n.qp(qpt)
    if cqs is not None:
        cqs[:] = [cq_c, cq_s]
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
    # REQ, REP, RTU, DREQ, DREP looped back: neither QP had a packet in flight, so the
    # DREQ overtakes nothing (CmAgent.takes)
    assert n.cm.loopback_mads - before == 5
    assert p.log == []
    assert n.agent.counters.mads_in == n.agent.counters.mads_out == 5


def _one(cq: Any) -> Any:
    n, wcs = cq.poll(1)
    return wcs[0] if n else None


def test_a_dreq_that_would_overtake_the_last_ack_takes_the_wire() -> None:
    """The server's last SEND is received, its ACK still on its way when the client
    disconnects: a DREQ handed back at once would move the server's QP to ERR first and
    flush that SEND (examples/app_echo_asyncio.py saw it); on the wire it follows the
    ACK and the SEND completes. The DREP moves no QP and loops back."""
    p = Pair(latency=1e-3)
    n = p.b
    cqs: list[Any] = []
    cid, qc, qs = self_connect(p, n, cqs=cqs)
    cq_c, cq_s = cqs
    rx = v.MR(n.pd, 64, int(e.IBV_ACCESS_LOCAL_WRITE))
    qc.post_recv(v.RecvWR(1, 1, [v.SGE(rx.addr, 64, rx.lkey)]))
    tx = v.MR(n.pd, 64, 0)
    tx.write(b"last words", 10)
    qs.post_send(v.SendWR(2, None, 1, [v.SGE(tx.addr, 10, tx.lkey)]))
    before = n.cm.loopback_mads
    got = None
    for _ in range(1000):  # virtual time, 10 us a step: the ACK takes 1 ms
        got = _one(cq_c)
        if got is not None:
            break
        p.run(1e-5)
    assert got is not None and got.status == e.IBV_WC_SUCCESS
    assert _one(cq_s) is None  # the server's SEND waits for its ACK
    cid.disconnect()
    p.run(1)
    sent = _one(cq_s)
    assert sent is not None and sent.wr_id == 2
    assert sent.status == e.IBV_WC_SUCCESS, e.ibv_wc_status(sent.status).name
    assert len(p.sent(CmAttr.DREQ)) == 1 and p.sent(CmAttr.DREP) == []
    assert n.cm.loopback_mads - before == 1  # the DREP


def _client_sends(p: Pair, data: bytes) -> tuple[Any, Any, Any, v.MR]:
    """A self-connection on ``p.b`` whose server posted a receive (wr_id 1) and whose
    client posted a SEND of ``data`` (wr_id 2): the id, the client QP, the server's CQ
    and the receive buffer."""
    n = p.b
    cqs: list[Any] = []
    cid, qc, qs = self_connect(p, n, cqs=cqs)
    rx = v.MR(n.pd, 64, int(e.IBV_ACCESS_LOCAL_WRITE))
    qs.post_recv(v.RecvWR(1, 1, [v.SGE(rx.addr, 64, rx.lkey)]))
    tx = v.MR(n.pd, 64, 0)
    tx.write(data, len(data))
    qc.post_send(v.SendWR(2, None, 1, [v.SGE(tx.addr, len(data), tx.lkey)]))
    return cid, qc, cqs[1], rx


def _assert_received(cq_s: Any, rx: v.MR, data: bytes) -> None:
    got = _one(cq_s)
    assert got is not None and got.wr_id == 1
    assert got.status == e.IBV_WC_SUCCESS, e.ibv_wc_status(got.status).name
    assert rx.read(len(data), 0) == data


def test_a_dreq_behind_the_senders_own_send_takes_the_wire() -> None:
    """The client sends and disconnects at once: its SEND is on the wire, so the DREQ
    follows it there and the server receives the data before its QP goes to ERR."""
    p = Pair()
    cid, _, cq_s, rx = _client_sends(p, b"goodbye")
    cid.disconnect()
    p.run(1)
    _assert_received(cq_s, rx, b"goodbye")
    assert len(p.sent(CmAttr.DREQ)) == 1


def test_a_dreq_from_a_qp_already_in_err_takes_the_wire() -> None:
    """The client sends, moves its QP to ERR itself (its SEND is flushed, yet on the
    wire), then disconnects: nothing says its packet has arrived, so the DREQ follows it
    on the wire and the server receives the data."""
    p = Pair()
    cid, qc, cq_s, rx = _client_sends(p, b"so long")
    qc.modify(v.QPAttr(qp_state=e.IBV_QPS_ERR), e.IBV_QP_STATE)
    cid.disconnect()
    p.run(1)
    _assert_received(cq_s, rx, b"so long")
    assert len(p.sent(CmAttr.DREQ)) == 1


def test_a_dreq_between_uc_qps_takes_the_wire() -> None:
    """UC completes a SEND once it is sent, not when it arrives: nothing tells that the
    QPs have no packet in flight, so the DREQ takes the wire (the DREP loops back)."""
    p = Pair()
    n = p.b
    cid, qc, qs = self_connect(p, n, qpt=int(e.IBV_QPT_UC))
    assert cid.state == CmState.ESTABLISHED
    before = n.cm.loopback_mads
    cid.disconnect()
    p.run(1)
    assert CmState(cid.state) == CmState.TIMEWAIT
    assert len(p.sent(CmAttr.DREQ)) == 1 and p.sent(CmAttr.DREP) == []
    assert n.cm.loopback_mads - before == 1


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
