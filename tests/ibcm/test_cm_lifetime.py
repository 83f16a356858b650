"""An IB CM binding and its connections keep their context no longer than the application
does, and no shorter.

The binding registers with the engine's port (QP1's completion sinks, its timer, the
async-event listener), and the port lives as long as the device file, which the
context's finalizer holds. Those registrations are weak (``softrdma.drivers.cm.gsi``);
the context holds its binding instead (``Context.retain``). Before, a context with an
established IB CM connection was never collected: port -> binding -> connection id ->
QP -> context."""

from __future__ import annotations

import gc
import threading
import time
import weakref
from typing import Any

from harness.cm import Pair
from harness.cm_ibcm import connect, server_id
from harness.cm_udp import contexts

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.drivers.cm.gsi import CmBinding
from softrdma.drivers.links.fabric import Fabric
from softrdma.drivers.runtime.clock import VirtualClock
from softrdma.drivers.runtime.progress import DeviceRuntime
from softrdma.ibcm.events import CmEvent
from softrdma.ibcm.events import CmEventType as T
from softrdma.ibcm.ipcm import IpCmClient, ip_listen
from softrdma.ibcm.model import CmState
from softrdma.wire.cm import CmAttr

ERR = int(e.IBV_QPS_ERR)
PAIRS = 3
DEADLINE_S = 60.0  # a busy machine
EVENT_THREAD = "softrdma-cm-events"


def _connected() -> tuple[list[weakref.ref[object]], list[DeviceRuntime]]:
    """Two contexts with an established IB CM connection, all dropped: weak references to
    the contexts and their bindings, and the contexts' runtimes."""
    p = Pair()
    cid, _, _, _ = connect(p)
    p.run(1.0)
    assert cid.state == CmState.ESTABLISHED
    assert server_id(p).state == CmState.ESTABLISHED
    # the Pair's own record of MADs is a rule of the fabric, which the runtimes hold: a
    # cycle through the Pair (harness) that an application does not have
    for rule in list(p.fab.rules):
        p.fab.remove_rule(rule)
    nodes = (p.a, p.b)
    refs: list[weakref.ref[object]] = [weakref.ref(n.ctx) for n in nodes]
    refs += [weakref.ref(n.cm) for n in nodes]
    return refs, [n.ctx.runtime for n in nodes]


def test_contexts_with_established_connections_are_collected() -> None:
    dropped = [_connected() for _ in range(PAIRS)]
    gc.collect()
    assert [[r() for r in refs] for refs, _ in dropped] == [[None] * 4] * PAIRS
    assert all(rt.closed for _, runtimes in dropped for rt in runtimes)


def test_the_binding_lives_as_long_as_its_context() -> None:
    """The application keeps only the client's context and QP: the binding still answers
    the server's DREQ (DREP) and moves the QP to ERR (IBA 12.9.7)."""
    p = Pair()
    cid, qa, _, _ = connect(p)
    p.run(1.0)
    assert cid.state == CmState.ESTABLISHED
    binding = weakref.ref(p.a.cm)
    p.a.cm = None  # type: ignore[assignment]
    p.a.agent = None  # type: ignore[assignment]
    p.a.events.clear()
    del cid
    gc.collect()
    assert binding() is not None
    server_id(p).disconnect()
    p.run(1.0)
    assert len(p.sent(CmAttr.DREP)) == 1
    assert qa.qp_state == ERR
    assert server_id(p).state in (CmState.TIMEWAIT, CmState.IDLE)


def test_a_closed_binding_is_let_go() -> None:
    ctx = v.Context(fabric=Fabric(VirtualClock()).link("10.2.0.1"))
    cm = CmBinding.attach(ctx)
    ref = weakref.ref(cm)
    cm.close()
    del cm
    gc.collect()
    assert ref() is None
    assert not ctx.closed
    ctx.close()


def _connected_udp() -> tuple[list[weakref.ref[object]], list[DeviceRuntime]]:
    """The same over UDP on the loopback with progress threads, the events going to
    handlers that are not lock-free, so through each binding's event thread."""
    ca, cb = contexts()
    a, b = CmBinding.attach(ca), CmBinding.attach(cb)
    got: list[CmEvent] = []
    done = threading.Event()

    def record(ev: CmEvent) -> None:
        got.append(ev)
        if ev.type == T.CONNECT_REQUEST:
            ev.cm_id.accept(qb)
        if sum(x.type == T.ESTABLISHED for x in got) == 2:
            done.set()

    def qp(ctx: Any) -> Any:
        cq = v.CQ(ctx, 8)
        return v.QP(v.PD(ctx), v.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq,
                                            cap=v.QPCap(4, 4)))
    qa, qb = qp(ca), qp(cb)
    ip_listen(b.agent.create_id(record), 7001)
    IpCmClient(a.agent.create_id(record)).connect(qa, "127.0.0.1", "127.0.0.2", 7001)
    assert done.wait(DEADLINE_S), got
    return ([weakref.ref(ca), weakref.ref(cb), weakref.ref(a), weakref.ref(b)],
            [ca.runtime, cb.runtime])


def test_threaded_contexts_are_collected_while_the_event_thread_waits() -> None:
    """The event thread lives on for a while after its last event; it holds its binding
    only while it delivers, so the contexts go at once, the thread still waiting."""
    before = set(threading.enumerate())  # event threads of earlier tests do not count
    refs, runtimes = _connected_udp()
    threads = [t for t in threading.enumerate() if t.name == EVENT_THREAD and t not in before]
    assert threads
    deadline = time.monotonic() + DEADLINE_S
    while any(r() is not None for r in refs) and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.01)  # an event thread may be ending its delivery
    assert [r() for r in refs] == [None] * 4
    assert any(t.is_alive() for t in threads)
    assert all(rt.closed for rt in runtimes)
