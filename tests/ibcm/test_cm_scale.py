"""1000 connections opened and closed in one process (A11 client and server on the
fabric, 100 at a time): no QP, CM id, timer or memory is left behind."""

from __future__ import annotations

import gc
import time
import tracemalloc
import weakref
from typing import Any

from harness.cm import Pair, T
from harness.device import ib_port

from softrdma.ibcm.agent import IbCmId
from softrdma.ibcm.events import CmEvent
from softrdma.ibcm.ipcm import IpCmClient, ip_listen
from softrdma.ibcm.params import CmConfig

BATCH = 100
BATCHES = 10
WARMUP = 3


class Counter:
    """Counts events without keeping them (or the ids they name) alive."""

    def __init__(self) -> None:
        self.n: dict[T, int] = {}

    def __call__(self, ev: CmEvent) -> None:
        self.n[ev.type] = self.n.get(ev.type, 0) + 1


def accepting(cb: Counter, free: list[Any], children: list[IbCmId]) -> Any:
    """A listener's handler: counts with ``cb``, accepts each request with a QP from
    ``free`` and keeps the child id in ``children``."""
    def on(ev: CmEvent) -> None:
        cb(ev)
        if ev.type == T.CONNECT_REQUEST:
            children.append(ev.cm_id)
            ev.cm_id.accept(free.pop())
    return on


def run_batch(p: Pair, lst: IbCmId, ca: Counter, cb: Counter, refs: list[Any]) -> None:
    qas = [p.a.qp()[0] for _ in range(BATCH)]
    qbs = [p.b.qp()[0] for _ in range(BATCH)]
    free = list(qbs)
    children: list[IbCmId] = []
    lst.handler = accepting(cb, free, children)
    ids = []
    for i, qa in enumerate(qas):
        cid = p.a.agent.create_id(ca)
        IpCmClient(cid).connect(qa, "10.9.0.1", "10.9.0.2", 9000, src_port=10000 + i,
                                private_data=b"x" * 56)
        ids.append(cid)
    p.run(1)
    for cid in ids:
        cid.disconnect()
    p.run(10)  # DREQ/DREP and TimeWait (~2.1 s)
    for q in qas + qbs:
        q.close()
    refs.extend(weakref.ref(c) for c in ids + children)
    lst.handler = cb


def test_thousand_connections_no_leaks() -> None:
    p = Pair()
    for rule in p.fab.rules:  # the harness's MAD log would keep every message
        rule.remove()
    lst = p.b.new_id()
    ip_listen(lst, 9000)
    ca, cb = Counter(), Counter()
    refs: list[Any] = []
    base_qps = (len(ib_port(p.a.ctx).qps), len(ib_port(p.b.ctx).qps))
    t0 = time.perf_counter()
    tracemalloc.start()
    for _ in range(WARMUP):  # caches, free lists and container sizes settle
        run_batch(p, lst, ca, cb, refs)
    gc.collect()
    before = tracemalloc.take_snapshot()
    for _ in range(BATCHES - WARMUP):
        run_batch(p, lst, ca, cb, refs)
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    elapsed = time.perf_counter() - t0
    n = BATCH * BATCHES
    assert ca.n == {T.ESTABLISHED: n, T.DISCONNECTED: n, T.TIMEWAIT_EXIT: n}
    assert cb.n == {T.CONNECT_REQUEST: n, T.ESTABLISHED: n, T.DISCONNECTED: n,
                    T.TIMEWAIT_EXIT: n}
    # QPs: only QP1 (and whatever existed before) remain
    assert (len(ib_port(p.a.ctx).qps), len(ib_port(p.b.ctx).qps)) == base_qps
    for agent in (p.a.agent, p.b.agent):
        assert agent.timers() == 0 and agent.next_deadline() is None
        assert not agent.by_remote and not agent.by_remote_qpn and not agent.by_local_qpn
        assert not agent.ids and not agent.outq
    assert p.a.agent.live_ids() == 0 and p.b.agent.live_ids() == 1  # the listener
    assert lst.pending == 0
    assert all(r() is None for r in refs)  # every IbCmId was freed
    # Not counted: our own weakrefs to the ids, and the verbs layer's WeakSet and
    # weakref.finalize tables, which resize with the peak number of live QPs/CQs
    # (bounded, not per connection).
    keep = [tracemalloc.Filter(False, __file__), tracemalloc.Filter(False, "*_weakrefset.py"),
            tracemalloc.Filter(False, "*/weakref.py")]
    after, before = after.filter_traces(keep), before.filter_traces(keep)
    growth = sum(s.size_diff for s in after.compare_to(before, "filename"))
    # a leak of even one small object per connection would be > 700 * 56 bytes
    assert growth < 32 * 1024, "\n".join(str(s) for s in after.compare_to(before, "lineno")[:12])
    assert p.clock.pending() < 50
    print(f"\n{n} connections (connect + accept + disconnect) in {elapsed:.2f} s: "
          f"{n / elapsed:.0f}/s on the in-memory fabric; memory growth {growth} bytes")


def test_closed_ids_are_freed_before_their_cancelled_timers_would_fire() -> None:
    """An id whose DREQ timer the DREP cancelled (2.1 s at Remote CM Response Timeout 19)
    and whose TimeWait (50 ms here) ended is freed at once, with its QP, even while newer
    connections keep live timers armed: the agent's timer heap keeps only numbers for a
    cancelled timer. It kept the id, and with it the QP, until the cancelled deadline came:
    ~8 KB each, ~100 of them at 50 connections a second (the CI failure of
    tests/cm/test_conn_soak.py)."""
    cfg = CmConfig(timewait_s=0.05)
    p = Pair(config_a=cfg, config_b=cfg)
    for rule in p.fab.rules:
        rule.remove()
    lst = p.b.new_id()
    ip_listen(lst, 9000)
    ca, cb = Counter(), Counter()
    free: list[Any] = []
    children: list[IbCmId] = []
    lst.handler = accepting(cb, free, children)
    refs: list[list[Any]] = []
    qps: list[Any] = []
    n = 30
    for i in range(n):  # one connection every 20 ms; each one's TimeWait overlaps the next
        qa, qb = p.a.qp()[0], p.b.qp()[0]
        free.append(qb)
        cid = p.a.agent.create_id(ca)
        IpCmClient(cid).connect(qa, "10.9.0.1", "10.9.0.2", 9000, src_port=10000 + i)
        p.run(0.01)
        cid.disconnect()
        p.run(0.01)
        refs.append([weakref.ref(cid), weakref.ref(children.pop())])
        qps += [qa, qb]
        del cid
    for q in qps:
        q.close()
    gc.collect()
    assert p.clock.now() < 2.0  # before any cancelled DREQ timer would have come due
    assert ca.n[T.TIMEWAIT_EXIT] >= n - 4
    old = [r for pair in refs[:n - 5] for r in pair]  # TimeWait over for all of these
    alive = sum(r() is not None for r in old)
    assert alive == 0, f"{alive} of {len(old)} closed CM ids still referenced"
