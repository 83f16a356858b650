"""CM events reach their handlers outside the device lock, so a handler may create and
destroy verbs objects (CQ, QP, MR, PD take that lock) and call the CM: on the virtual-clock
fabric (manual progress) and over real UDP with progress threads.

Before events were delivered from under the lock, each of these handlers deadlocked on
its first verbs call; the scenarios run in a worker thread so that such a regression
fails with a message instead of hanging the suite."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from harness.cm import Pair, T
from harness.cm_udp import contexts

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.drivers.cm.gsi import CmBinding
from softrdma.ibcm.events import CmEvent
from softrdma.ibcm.ipcm import IpCmClient, ip_listen
from softrdma.ibcm.params import AcceptParams, ConnParams
from softrdma.wire import cm as wcm

SID = 0x1000_0000_0000_0042


def run_bounded(fn: Callable[[], None], timeout: float = 60.0) -> None:
    """Run ``fn`` in a worker thread; fail (not hang) if it does not finish."""
    errors: list[BaseException] = []

    def body() -> None:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    t = threading.Thread(target=body, name="cm-unlocked-scenario", daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), "a CM event handler blocked (deadlock on the device lock?)"
    if errors:
        raise errors[0]


def test_fabric_handlers_create_and_destroy_verbs_objects() -> None:
    p = Pair(seed=7)
    made: dict[str, Any] = {}
    seen: list[tuple[str, bool]] = []

    def on_b(ev: CmEvent) -> None:
        seen.append((ev.type.name, p.b.ctx.runtime.lock.locked()))
        if ev.type == T.CONNECT_REQUEST:
            qp, cq = p.b.qp()  # CQ and QP created from the handler
            made["qp"], made["cq"] = qp, cq
            ev.cm_id.accept(qp, AcceptParams())
        elif ev.type == T.DISCONNECTED:
            made["qp"].close()  # and destroyed from the handler
            made["cq"].close()
            made["closed"] = True

    def on_a(ev: CmEvent) -> None:
        seen.append(("a:" + ev.type.name, p.a.ctx.runtime.lock.locked()))
        if ev.type == T.ESTABLISHED:
            pd = v.PD(p.a.ctx)
            mr = v.MR(pd, 64, int(e.IBV_ACCESS_LOCAL_WRITE))
            mr.close()
            pd.close()
            ev.cm_id.disconnect()

    def scenario() -> None:
        lst = p.b.agent.create_id(on_b)
        lst.listen(SID)
        qa, _ = p.a.qp()
        cid = p.a.agent.create_id(on_a)
        cid.connect(qa, ConnParams(SID, p.b.gid))
        p.run(2.0)
        assert made.get("closed"), seen
        assert qa.qp_state == e.IBV_QPS_ERR

    run_bounded(scenario)
    names = [n for n, _ in seen]
    assert names[:1] == ["CONNECT_REQUEST"] and "ESTABLISHED" in names, names
    assert "a:ESTABLISHED" in names and "DISCONNECTED" in names, names
    assert not any(locked for _, locked in seen), seen  # never under the device lock
    assert not p.a.agent.errors and not p.b.agent.errors, (p.a.agent.errors, p.b.agent.errors)


def test_threaded_handlers_create_and_destroy_verbs_objects() -> None:
    ca, cb = contexts()
    done = threading.Event()
    made: dict[str, Any] = {}
    locked: list[bool] = []
    try:
        a, b = CmBinding.attach(ca), CmBinding.attach(cb)
        pb = v.PD(cb)

        def on_b(ev: CmEvent) -> None:
            locked.append(cb.runtime.lock.locked() and not _lock_free(cb))
            if ev.type == T.CONNECT_REQUEST:
                cq = v.CQ(cb, 8)
                qp = v.QP(pb, v.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq,
                                           cap=v.QPCap(4, 4)))
                made["qp"], made["cq"] = qp, cq
                ev.cm_id.accept(qp)
            elif ev.type == T.DISCONNECTED:
                made["qp"].close()
                made["cq"].close()
                done.set()

        def scenario() -> None:
            lst = b.agent.create_id(on_b)
            ip_listen(lst, 7100)
            pa = v.PD(ca)
            cq = v.CQ(ca, 8)
            qa = v.QP(pa, v.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq,
                                       cap=v.QPCap(4, 4)))
            cid = a.agent.create_id()
            IpCmClient(cid).connect(qa, "127.0.0.1", "127.0.0.2", 7100)
            assert a.get_event(10).type == T.ESTABLISHED
            cid.disconnect()
            assert a.get_event(10).type == T.DISCONNECTED
            assert done.wait(10), "the passive side's DISCONNECTED handler did not finish"
            qa.close()
            cq.close()
            pa.close()

        run_bounded(scenario)
        assert made["qp"] is not None and not any(locked), locked
        assert not b.agent.errors, b.agent.errors
        a.close()
        b.close()
    finally:
        ca.close()
        cb.close()


def _lock_free(ctx: Any) -> bool:
    """True when this thread can take the device lock now (nobody, us included, holds
    it); the progress thread may hold it briefly, so try for a while."""
    lock = ctx.runtime.lock
    if lock.acquire(timeout=2.0):
        lock.release()
        return True
    return False


def test_request_for_a_listener_destroyed_before_delivery_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Events wait for the device lock to be released; a listener destroyed in between
    # must not strand the new connection in REQ_RCVD (the peer would wait for its REQ
    # timeouts): its id is destroyed, which sends REJ 28, as linux ucma_cleanup_events.
    p = Pair(seed=11)
    monkeypatch.setattr(p.b.cm, "_schedule_delivery", lambda: None)  # hold the events
    lst = p.b.new_id()
    lst.listen(SID)
    qa, _ = p.a.qp()
    cid = p.a.new_id()
    cid.connect(qa, ConnParams(SID, p.b.gid))
    p.run(0.01)
    assert [ev.type for ev in p.b.agent.outbox] == [T.CONNECT_REQUEST]
    lst.destroy()  # then the held events are delivered, outside the lock
    p.run(0.01)
    assert not p.b.agent.outbox and p.b.types() == []
    assert [r.reason for r in p.sent(wcm.CmAttr.REJ)] == [wcm.RejReason.CONSUMER_DEFINED]
    assert p.a.types(cid) == [T.REJECTED]
    assert p.b.agent.live_ids() == 0 and not p.b.agent.errors
