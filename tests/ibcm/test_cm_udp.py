"""The CM over real UDP on the loopback (127.0.0.1 <-> 127.0.0.2), progress threads and
the device lock: consumers call from their own thread and wait with ``get_event``."""

from __future__ import annotations

import time
from typing import Any

import pytest
from harness.cm_udp import contexts

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.drivers.cm.gsi import CmBinding
from softrdma.ibcm.events import CmEventType as T
from softrdma.ibcm.ipcm import IpCmClient, ip_listen


def rc_qp(ctx: Any, pd: Any) -> Any:
    cq = v.CQ(ctx, 8)
    return v.QP(pd, v.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=v.QPCap(4, 4)))


def test_connect_send_disconnect_over_udp_loopback() -> None:
    ca, cb = contexts()
    try:
        a, b = CmBinding.attach(ca), CmBinding.attach(cb)
        pa, pb = v.PD(ca), v.PD(cb)
        lst = b.agent.create_id()
        ip_listen(lst, 7000)
        n = 20
        qas = [rc_qp(ca, pa) for _ in range(n)]
        qbs = [rc_qp(cb, pb) for _ in range(n)]
        t0 = time.perf_counter()
        for i in range(n):
            cid = a.agent.create_id()
            IpCmClient(cid).connect(qas[i], "127.0.0.1", "127.0.0.2", 7000, src_port=1000 + i,
                                    private_data=f"conn {i}".encode())
            req = b.get_event(5)
            assert req.type == T.CONNECT_REQUEST and req.remote_port == 1000 + i
            assert req.private_data.rstrip(b"\0") == f"conn {i}".encode()
            req.cm_id.accept(qbs[i])
            assert a.get_event(5).type == T.ESTABLISHED
            assert b.get_event(5).type == T.ESTABLISHED
            assert qas[i].qp_state == qbs[i].qp_state == e.IBV_QPS_RTS
            if i == 0:  # one SEND over the connection the CM set up
                rx = v.MR(pb, 32, int(e.IBV_ACCESS_LOCAL_WRITE))
                qbs[0].post_recv(v.RecvWR(1, 1, [v.SGE(rx.addr, 32, rx.lkey)]))
                tx = v.MR(pa, 32, 0)
                tx.write(b"udp!", 4)
                qas[0].post_send(v.SendWR(1, None, 1, [v.SGE(tx.addr, 4, tx.lkey)]))
                deadline = time.monotonic() + 5
                while rx.read(4, 0) != b"udp!" and time.monotonic() < deadline:
                    time.sleep(0.001)
                assert rx.read(4, 0) == b"udp!"
            cid.disconnect()
            assert a.get_event(5).type == T.DISCONNECTED
            assert b.get_event(5).type == T.DISCONNECTED
        rate = n / (time.perf_counter() - t0)
        assert qas[-1].qp_state == e.IBV_QPS_ERR
        print(f"\n{rate:.0f} connections/s (connect + accept + disconnect), UDP loopback")
        a.close()
        b.close()
    finally:
        ca.close()
        cb.close()


def test_lock_free_consumers_get_their_events_without_the_event_thread(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 26: every CM event went through the binding's event thread (one thread
    switch per event). Consumers that only queue (the binding's own event queue here,
    the rdma_cm layer's handlers) now get them in the thread that processed the MAD;
    the A11 minor-version retry (CA11-3, a CM call from the client's handler) runs
    there too, inline."""
    scheduled: list[CmBinding] = []
    real = CmBinding._schedule_delivery

    def counting(self: CmBinding) -> None:
        scheduled.append(self)
        real(self)
    monkeypatch.setattr(CmBinding, "_schedule_delivery", counting)
    ca, cb = contexts()
    try:
        a, b = CmBinding.attach(ca), CmBinding.attach(cb)
        pa, pb = v.PD(ca), v.PD(cb)
        lst = b.agent.create_id()
        ip_listen(lst, 7001, minor=0)
        qa, qb = rc_qp(ca, pa), rc_qp(cb, pb)
        cid = a.agent.create_id()
        client = IpCmClient(cid, minor=3)
        client.connect(qa, "127.0.0.1", "127.0.0.2", 7001, src_port=999)
        req = b.get_event(10)
        assert req.type == T.CONNECT_REQUEST and req.info["ip_cm"].minv == 0
        req.cm_id.accept(qb)
        assert a.get_event(10).type == T.ESTABLISHED  # the REJ was handled below us
        assert client.downgrades == [0]
        assert b.get_event(10).type == T.ESTABLISHED
        cid.disconnect()
        assert a.get_event(10).type == T.DISCONNECTED
        assert b.get_event(10).type == T.DISCONNECTED
        assert scheduled == []
        a.close()
        b.close()
    finally:
        ca.close()
        cb.close()
