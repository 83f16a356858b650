"""The CM's driver: QP1 (the GSI, IBA 13.5.1) of an engine Port carrying CM MADs
(the CM's MADs: IBA 12.6, 13.4).

:class:`CmBinding` attaches a :class:`~softrdma.ibcm.agent.CmAgent` to a
:class:`softrdma.ib.port.Port`:

* QP1 is a UD engine QP (Q_Key ``GSI_QKEY``, IBA 13.5.1) with ``n_recv`` receive
  buffers of 40 + 256 bytes (GRH area + MAD) in one registered region, re-posted as they
  complete; each completion hands the MAD, the source GID (from the GRH area: IPv4
  header bytes 12-15 after 20 zero bytes, or the IPv6 source) and our destination GID to
  ``agent.on_mad``;
* the agent's MADs are posted as inline UD SENDs to QP1 of the peer (DETH Q_Key
  ``GSI_QKEY``, source QP 1, as Linux sends them);
* timers: a small object registered with ``port.arm`` so that the runtime (thread or
  virtual clock) runs ``agent.on_timer`` like any engine timer;
* locking: consumer calls on the agent's ids go through ``runtime.call_now`` (the
  device lock), MAD and timer processing already runs under it; the agent knows its
  callers by their thread (``agent.caller_id``), so that a handler's CM call made inside
  the agent's processing runs at once rather than wait for the lock its thread holds;
* events: the agent only queues them (typed, frozen :class:`~softrdma.ibcm.events.CmEvent`,
  ``agent.pop_events()``); the binding hands them to their consumers (the id's handler,
  else ``agent.on_event``, else ``agent.events``) once the device lock is released: at the end
  of a consumer call, in the caller's thread; after MAD or timer processing, from the
  virtual clock (a test fabric: the next callback at the same instant, so runs stay
  deterministic) or from the binding's event thread. Handlers may therefore block,
  call the CM, and create or destroy verbs objects. Handlers marked
  :func:`~softrdma.ibcm.events.lock_free` (they only queue: the rdma_cm layer's) are
  run at once instead, in the thread that processed the MAD or timer, on a real clock.
  Without a runtime (the caller drives the port and passes ``now``) events are delivered
  when the agent's operation ends, inside it;
* COMM_EST from the engine (a typed event on ``port.events``) is passed to the agent;
* lifetime: what the binding registers with the port (QP1's completion sinks, the
  timer, the async-event listener) and its event thread refer to it weakly, and
  :meth:`CmBinding.attach` has the context hold it (``Context.retain``) until
  :meth:`CmBinding.close`. The port lives as long as the device file, which the
  context's finalizer holds: strong references from it kept a dropped context with
  IB CM connections (binding -> id -> QP -> context) alive for ever;
* loopback: a MAD the agent sends to a GID of this port for one of its own ids
  (:attr:`~softrdma.ibcm.params.OutMad.local`: a REQ for its own listener, an answer
  naming its own comm ID) is handed back to ``agent.on_mad`` in the same operation, not
  posted on QP1, as Linux rxe loops a packet for one of its addresses back inside the
  device. Two ids of one process connect without a wire (or devd) hop per MAD (issue
  26); counted in ``loopback_mads``. ``SOFTRDMA_CM_LOOPBACK=0`` sends them on the wire
  (to capture them). Retransmissions always take the wire, and so does a DREQ that
  would overtake a packet of the data path (:meth:`~softrdma.ibcm.agent.CmAgent.takes`).

With a device shared through ``devd`` the link becomes a routed CM client
(``cm_slot()``): devd gives the process a slot byte that the agent puts in the top byte
of its comm IDs and SIDR request IDs, the agent tells devd the Service IDs it listens
on (``cm_listen``), and devd delivers each CM MAD to the one process it is for (REQs to
the listener, answers to the owner of the comm ID) and answers REJ 8 itself when nobody
listens. So the agent is ``exclusive`` again: what reaches it is its own to answer.
A devd without routing (``alloc_qpn(1)`` only) broadcasts QP1 MADs; the agent is then
not exclusive.
"""

from __future__ import annotations

import errno
import os
import threading
import time
import weakref
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

from ...enums import ibv_access_flags as Access
from ...enums import ibv_qp_state as Qps
from ...enums import ibv_wc_status as Wcs
from ...enums import ibv_wr_opcode as Wro
from ...errors import ClosedError, DeviceError, StateError
from ...ib.port import Port
from ...ib.qp import AddressVector, EngineQP
from ...ibcm.agent import CmAgent, CmConfig, mtu_enum
from ...ibcm.events import CmEvent, CmEventType, is_lock_free, lock_free
from ...ibcm.params import OutMad
from ...ibcm.qpctl import QPT_UD
from ...seam.events import AsyncEventType, EngineEvent
from ...seam.queues import QPInit
from ...seam.types import SGE, RecvWQE, SendWQE, WorkCompletion
from ...wire.gid import ip_to_gid
from ...wire.mad import GSI_QKEY, MAD_SIZE
from ...wire.rocev1 import GRH_NEXT_HEADER_BTH
from ..devd.client import DevdLink
from ..links.link import Link
from ..runtime.clock import VirtualClock
from ..runtime.locks import acquire
from ..runtime.threads import QuietThread

__all__ = ["CmBinding", "GRH_SIZE", "SLOT"]

T = TypeVar("T")

GRH_SIZE = 40
SLOT = GRH_SIZE + MAD_SIZE
MAD_RESPONSE_HOP_LIMIT = 0xFF  # A16.4.4: HopLimit of a response on a RoCE port
_MAX_PEERS = 4096
_MR_ADDR = 0x10000
_EVENT_THREAD_IDLE_S = 5.0  # the event thread ends after this long without events
#: a MAD chain between two ids of one agent (REQ, REP, RTU) takes a few rounds; past this
#: many in one operation the MADs take the wire (a bug cannot spin with the lock held)
_LOOPBACK_ROUNDS = 16
#: "0": MADs to this port's own ids take the wire too (captures, before/after benchmarks)
LOOPBACK_ENV = "SOFTRDMA_CM_LOOPBACK"


class _CmTimer:
    """Registered with ``Port.arm``: the Port runs ``on_timer`` when ``deadline`` passes.
    It refers to its binding weakly, as the binding's other registrations with the port
    do (:func:`_weak`)."""

    __slots__ = ("binding", "deadline")

    def __init__(self, binding: CmBinding) -> None:
        self.binding = weakref.ref(binding)
        self.deadline: float | None = None

    def on_timer(self, now: float) -> None:
        self.deadline = None
        binding = self.binding()
        if binding is not None:
            binding.agent.on_timer(now)


def _weak(method: Callable[[T], None]) -> Callable[[T], None]:
    """``method`` (a bound method of a :class:`CmBinding`) called through a weak reference:
    what the binding registers with the engine's port (QP1's completion sinks, its async
    event listener). The port lives as long as the device file, which the context's
    finalizer holds; strong references from the port would keep the binding, its
    connections' ids, their QPs and so the context alive for ever once the application
    dropped them (the context holds its binding instead: ``Context.retain``)."""
    ref = weakref.WeakMethod(method)

    def call(arg: T) -> None:
        fn = ref()
        if fn is not None:
            fn(arg)
    return call


class CmBinding:
    """A CM agent on QP1 of ``port`` (see the module docstring).

    ``runtime`` is the :class:`~softrdma.drivers.runtime.roce.Runtime` driving the port
    (None: the caller drives the port itself and passes ``now``; ``clock`` then gives
    the time for MAD receipt). Use :meth:`attach` for a verbs ``Context``.
    """

    def __init__(self, port: Port, guid: int, *, runtime: Any = None,
                 config: CmConfig | None = None, seed: int | None = None,
                 n_recv: int = 256, exclusive: bool = True,
                 clock: Callable[[], float] | None = None, shared_link: Any = None) -> None:
        self.port = port
        self._shared_link = shared_link
        self.runtime = runtime
        self._clock = clock if clock is not None else (
            runtime.now if runtime is not None else time.monotonic)
        self.agent = CmAgent(port.gids, guid, mtu=mtu_enum(port.max_mtu), config=config,
                             seed=seed, exclusive=exclusive)
        self.agent.gid_v1 = port.gid_v1
        self.agent.on_output = self._pump
        self.agent.caller_id = threading.get_ident
        # events are delivered outside the device lock (see the module docstring)
        self._vclock = _virtual_clock(runtime)
        self._deliver_lock = threading.Lock()
        self._deliver_cv = threading.Condition()
        self._deliver_thread: threading.Thread | None = None
        self._deliver_scheduled = False
        #: True: events are delivered when the agent's operation ends (no runtime, so no
        #: lock); else once the device lock is released
        self.deliver_inline = runtime is None
        if runtime is not None:
            self.agent.runner = self._run_locked
        self._pd = object()
        self._buf = bytearray(n_recv * SLOT)
        self._mr = port.register_mr(memoryview(self._buf), _MR_ADDR,
                                    int(Access.IBV_ACCESS_LOCAL_WRITE), self._pd)
        self.qp1 = EngineQP(port, QPInit(QPT_UD, self._pd, _weak(self._on_send_wc),
                                         _weak(self._on_recv_wc), None, max_send_wr=1 << 16,
                                         max_recv_wr=n_recv, max_send_sge=1, max_recv_sge=1,
                                         max_inline_data=MAD_SIZE, sq_sig_all=False), qpn=1)
        now = self._clock()
        self.qp1.modify({"qp_state": int(Qps.IBV_QPS_INIT), "qkey": GSI_QKEY,
                         "pkey_index": 0, "port_num": 1}, now)
        self.qp1.modify({"qp_state": int(Qps.IBV_QPS_RTR)}, now)
        self.qp1.modify({"qp_state": int(Qps.IBV_QPS_RTS), "sq_psn": 0}, now)
        for i in range(n_recv):
            self._post(i)
        self._timer = _CmTimer(self)
        self._avs: dict[tuple[bytes, bytes, int, int, int, bool], AddressVector] = {}
        # (peer GID, our GID) -> (FlowLabel, TClass) of the last MAD received over RoCEv1
        self._v1_peers: dict[tuple[bytes, bytes], tuple[int, int]] = {}
        self._wr = 0
        self._closed = False
        #: MADs for this agent's own ids skip the wire (:meth:`_loop_back`); counted
        self.loopback = os.environ.get(LOOPBACK_ENV, "1") != "0"
        self.loopback_mads = 0
        self._event_cv = threading.Condition()
        #: ends the context's hold on this binding (attach: ``Context.retain``)
        self._let_go: Callable[[], None] | None = None
        self._async_listener = _weak(self._on_async)
        port.events.subscribe(self._async_listener)
        self.agent.on_event = self._queue_event

    # ---- construction from a verbs Context ------------------------------------------
    @classmethod
    def attach(cls, ctx: Any, *, config: CmConfig | None = None, seed: int | None = None,
               n_recv: int = 256) -> CmBinding:
        """A CM on the QP1 of a verbs ``Context`` (its port, runtime and node GUID)."""
        runtime = ctx.runtime
        link = runtime.link
        shared = isinstance(link, DevdLink)
        slot = 0
        if shared:
            try:
                slot = link.cm_slot()  # devd routes this process's CM MADs to it
            except DeviceError:
                link.alloc_qpn(1)  # an older devd: every QP1 MAD, not exclusive

        def make() -> CmBinding:
            b = cls(ctx.port, int(ctx.node_guid) or _guid_of(ctx.port.gids[0]),
                    runtime=runtime, config=config, seed=seed, n_recv=n_recv,
                    exclusive=not shared or bool(slot),
                    shared_link=link if shared else None)
            if slot:
                b.agent.id_prefix = slot
                b.agent.on_listen = partial(_devd_listen, link)
            return b
        binding: CmBinding = runtime.call(make)
        binding._let_go = ctx.retain(binding)  # the port refers to it weakly (_weak)
        return binding

    # ---- locking ----------------------------------------------------------------------
    def _run_locked(self, fn: Callable[[float], Any]) -> Any:
        if self._closed:
            raise ClosedError("the CM binding is closed")
        try:
            return self.runtime.call_now(fn)
        finally:
            self.deliver()  # the lock is released: the call's events, in this thread

    # ---- event delivery, outside the device lock ------------------------------------------
    def deliver(self, *, wait: bool = False) -> int:
        """Deliver the agent's queued events now, from this thread (which must not hold
        the device lock). One thread delivers at a time, in order; a call made while
        another thread (or a handler of this one) delivers returns at once, leaving
        the events to it, unless ``wait`` (a manual-progress loop that acts on its
        events next: it waits for that delivery to end; never from a handler).
        Returns how many were delivered."""
        n = 0
        if wait:  # let a delivery under way on another thread finish first
            with self._deliver_lock:
                n += self._deliver_events()
        while self.agent.outbox:
            if not acquire(self._deliver_lock, False):
                return n
            try:
                n += self._deliver_events()
            finally:
                self._deliver_lock.release()
        return n

    def _deliver_events(self) -> int:
        """Hand the agent's queued events to their consumers, oldest first (events their
        handlers cause included); returns how many. A handler's failure is counted and
        kept in ``agent.errors``."""
        agent = self.agent
        n = 0
        while True:
            evs = agent.pop_events()
            if not evs:
                return n
            for ev in evs:
                n += 1
                try:
                    self._deliver_one(ev)
                except Exception as exc:  # noqa: BLE001 - a consumer's handler failed
                    agent.counters.errors += 1
                    agent.errors.append(exc)

    def _consumer(self, ev: CmEvent) -> tuple[bool, Callable[[CmEvent], None] | None]:
        """Whether ``ev`` still has a consumer (its owner, the listener for a
        CONNECT_REQUEST, is not destroyed) and the handler it goes to (None: the
        ``agent.events`` queue)."""
        owner = ev.listen_id if ev.type == CmEventType.CONNECT_REQUEST else ev.cm_id
        if owner is not None and owner.destroyed:
            return False, None
        handler = owner.handler if owner is not None else None
        return True, handler if handler is not None else self.agent.on_event

    def _deliver_one(self, ev: CmEvent) -> None:
        live, handler = self._consumer(ev)
        if not live:
            if ev.type == CmEventType.CONNECT_REQUEST and not ev.cm_id.destroyed:
                # The listener went away before its consumer saw the request: refuse
                # it (REJ, or SIDR_REP status 2) rather than leave the peer waiting
                # (linux ucma_cleanup_events destroys the unread request's id).
                ev.cm_id.destroy()
            return
        if handler is None:
            self.agent.events.append(ev)
        else:
            handler(ev)

    def _outbox_lock_free(self) -> bool:
        """True if every queued event goes to a :func:`~softrdma.ibcm.events.lock_free`
        consumer or to ``agent.events``, or is dropped (its id was destroyed): delivery
        may then run under the device lock."""
        for ev in self.agent.outbox:
            live, handler = self._consumer(ev)
            if not live:
                if ev.type == CmEventType.CONNECT_REQUEST and not ev.cm_id.destroyed:
                    return False  # _deliver_one refuses it: a CM call
                continue
            if handler is not None and not is_lock_free(handler):
                return False
        return True

    def _schedule_delivery(self) -> None:
        """Called under the device lock when MAD or timer processing queued events."""
        if self._deliver_scheduled or self._closed:
            return
        self._deliver_scheduled = True
        if self._vclock is not None:
            self._vclock.call_at(self._vclock.now(), self._delivery_due)
            return
        with self._deliver_cv:
            if self._deliver_thread is None:
                self._deliver_thread = QuietThread(
                    target=_delivery_main, args=(weakref.ref(self), self._deliver_cv),
                    name="softrdma-cm-events", daemon=True)
                self._deliver_thread.start()
            self._deliver_cv.notify()

    def _deliver_now(self) -> bool:
        """Called under the device lock when MAD or timer processing queued events:
        deliver them at once, in this thread, if every consumer is
        :func:`~softrdma.ibcm.events.lock_free` (the rdma_cm layer's handlers only post
        to their event channel) and no other thread is delivering; False leaves them
        to the event thread. On a real clock only: a virtual-clock run keeps its order
        of callbacks. This saves the hand-off to the event thread (a thread switch per
        event: 4 of a RoCE connection's round trips, issue 26)."""
        agent = self.agent
        if self._vclock is not None or self._closed or not self._outbox_lock_free():
            return False
        if not acquire(self._deliver_lock, False):
            return False
        try:
            self._deliver_events()
        finally:
            self._deliver_lock.release()
        return not agent.outbox

    def _delivery_due(self) -> None:
        self._deliver_scheduled = False
        self.deliver()

    def now(self) -> float:
        return float(self._clock())

    # ---- receive ----------------------------------------------------------------------
    def _post(self, slot: int) -> None:
        sge = SGE(_MR_ADDR + slot * SLOT, SLOT, self._mr.lkey)
        self.qp1.post_recv(RecvWQE(slot, [sge]))

    def _on_recv_wc(self, wc: WorkCompletion) -> None:
        slot = int(wc.wr_id)
        if wc.status != Wcs.IBV_WC_SUCCESS:
            return  # flushed (QP1 is being destroyed)
        off = slot * SLOT
        mv = memoryview(self._buf)
        grh = bytes(mv[off:off + GRH_SIZE])
        mad = bytes(mv[off + GRH_SIZE:off + GRH_SIZE + MAD_SIZE]) \
            if wc.byte_len >= SLOT else b""
        if not self._closed:
            self._post(slot)
        if grh[0] >> 4 == 6:  # IPv6 header, or the GRH of a RoCEv1 packet
            src, dst = grh[8:24], grh[24:40]
            if grh[6] == GRH_NEXT_HEADER_BTH:  # RoCEv1 (a RoCEv2 IPv6 header says UDP)
                # A16.4.4: a response takes the reversible path of its request
                flow = int.from_bytes(grh[1:4], "big") & 0xFFFFF
                tclass = ((grh[0] & 0x0F) << 4) | (grh[1] >> 4)
                if len(self._v1_peers) >= _MAX_PEERS:
                    self._v1_peers.clear()
                self._v1_peers[(bytes(src), bytes(dst))] = (flow, tclass)
        else:  # 20 zero bytes, then the IPv4 header (rxe)
            src, dst = ip_to_gid(grh[32:36]), ip_to_gid(grh[36:40])
        self.agent.on_mad(mad, src, wc.src_qp, self.now(), dst_gid=dst)

    def _sgid_index(self, sgid: bytes, v1: bool) -> int:
        """The GID index of ``sgid`` with the wanted type (RoCEv1 for a reply to a RoCEv1
        request); else the agent's choice (a RoCE v2 entry first on a dual device, as
        Linux's default RoCE mode)."""
        if v1:
            i = self.port.gid_index_of(sgid, True)
            if i >= 0:
                return i
        return self.agent.sgid_index(sgid)

    def _on_send_wc(self, wc: WorkCompletion) -> None:
        return None

    # ---- transmit and timers ---------------------------------------------------------------
    def _pump(self, now: float) -> None:
        agent = self.agent
        rounds = 0
        while True:
            if self.deliver_inline:  # no lock: the handlers run inside the agent's operation
                self._deliver_events()
            rounds += 1
            looped = self._send_output(now, rounds <= _LOOPBACK_ROUNDS)
            if looped:
                self._loop_back(looped, now)
                continue  # what they caused: answers, events
            if not agent.outbox or self.deliver_inline:
                break
            if not self._deliver_now():
                self._schedule_delivery()
                break
            if not agent.outq:  # a handler's CM call (inline) may have queued MADs
                break
        d = agent.next_deadline()
        self._timer.deadline = d
        if d is not None:
            self.port.arm(self._timer)

    def _send_output(self, now: float, loop_ok: bool = True) -> list[OutMad]:
        """Post the agent's MADs on QP1; returns those to hand back to it instead
        (:meth:`_loop_back`), which ``loop_ok`` False sends on the wire too."""
        looped: list[OutMad] = []
        loop = loop_ok and self.loopback and self.agent.exclusive and not self._closed
        for m in self.agent.take_output():
            if m.local and loop:
                looped.append(m)
                continue
            v1 = False
            hop, tclass, flow = m.hop_limit, m.traffic_class, m.flow_label
            if m.reversible:
                rx = self._v1_peers.get((m.dgid, m.sgid))
                if rx is not None:
                    # A16.4.4: the request came over RoCEv1: swap its GIDs and QPs (the
                    # agent did), copy FlowLabel and TrafficClass, HopLimit 0xFF; the
                    # Q_Key is the request's, which QP1's receive check made GSI_QKEY.
                    v1 = True
                    flow, tclass = rx
                    hop = MAD_RESPONSE_HOP_LIMIT
            key = (m.dgid, m.sgid, hop, tclass, flow, v1)
            av = self._avs.get(key)
            if av is None:
                av = AddressVector(m.dgid, self._sgid_index(m.sgid, v1), flow, hop, tclass)
                if len(self._avs) > 4096:
                    self._avs.clear()
                self._avs[key] = av
            self._wr += 1
            wqe = SendWQE(self._wr, int(Wro.IBV_WR_SEND), 0, inline_data=m.mad, ah=av,
                          remote_qpn=m.dqpn, remote_qkey=GSI_QKEY)
            self.qp1.post_send(wqe, now)
        return looped

    def _loop_back(self, mads: list[OutMad], now: float) -> None:
        """Hand MADs the agent sent to itself (:attr:`OutMad.local`) back to it, as the
        wire would, at once: Linux rxe likewise loops a packet for one of its own
        addresses back inside the device (``rxe_loopback``) rather than through the
        network. The agent's operation is still open, so what these cause is queued,
        then sent or looped back by :meth:`_pump`'s next round."""
        for m in mads:
            self.loopback_mads += 1
            self.agent.on_mad(m.mad, m.sgid, 1, now, dst_gid=m.dgid)

    # ---- async events ----------------------------------------------------------------------
    def _on_async(self, ev: EngineEvent) -> None:
        if ev.type == AsyncEventType.COMM_EST and not self._closed:
            self.agent.on_comm_est(ev.element, self.now())

    # ---- events for consumers without handlers ----------------------------------------------
    @lock_free
    def _queue_event(self, ev: CmEvent) -> None:
        with self._event_cv:
            self.agent.events.append(ev)
            self._event_cv.notify_all()

    def get_event(self, timeout: float | None = None) -> CmEvent:
        """The next event of an id without its own handler; TimeoutError after
        ``timeout`` s. In manual progress mode the runtime is driven while waiting."""
        deadline = None if timeout is None else time.monotonic() + timeout
        manual = self.runtime is not None and not self.runtime.threaded
        while True:
            with self._event_cv:
                if self.agent.events:
                    return self.agent.events.popleft()
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError("no CM event")
                if not manual:
                    self._event_cv.wait(0.05 if left is None else min(left, 0.05))
                    continue
            self.runtime.progress(0.001 if left is None else min(left, 0.001))

    # ---- teardown -----------------------------------------------------------------------------
    def close(self) -> None:
        """Destroy QP1 and stop the timers (idempotent). Connections are not released."""
        if self._closed:
            return

        def run() -> None:
            self._closed = True
            self._timer.deadline = None
            self.qp1.destroy()
            self.port.deregister_mr(self._mr)
            self.port.events.unsubscribe(self._async_listener)
        if self.runtime is not None and not self.runtime.closed:
            self.runtime.call(run)
        else:
            run()
        with self._deliver_cv:
            self._deliver_cv.notify_all()  # the event thread ends
            t = self._deliver_thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=5.0)
        if self._let_go is not None:
            self._let_go()
            self._let_go = None
        link = self._shared_link
        if link is not None:
            try:
                link.free_qpn(1)
            except Exception:  # noqa: BLE001 - the daemon may be gone already
                pass


def _delivery_main(ref: weakref.ref[CmBinding], cv: threading.Condition) -> None:
    """A binding's event thread: delivers what MAD and timer processing queued; it ends
    after ``_EVENT_THREAD_IDLE_S`` without work (the next event starts another), or once
    the binding is collected: it holds the binding only while it delivers, so that it
    does not keep a dropped context alive (:func:`_weak`)."""
    while True:
        with cv:
            b = ref()
            if b is None:
                return
            if not b._deliver_scheduled and not b._closed:
                del b
                cv.wait(_EVENT_THREAD_IDLE_S)
                b = ref()
                if b is None:
                    return
            if b._closed or not b._deliver_scheduled:
                b._deliver_thread = None
                return
        b._delivery_due()
        del b


def _virtual_clock(runtime: Any) -> VirtualClock | None:
    """The virtual clock driving ``runtime``'s link (a test fabric), if any."""
    if runtime is None:
        return None
    link: Link | None = getattr(runtime, "link", None)  # an iWARP runtime has none
    clock = link.clock if link is not None else None
    return clock if isinstance(clock, VirtualClock) else None


def _devd_listen(link: Any, service_id: int, mask: int, listen: bool) -> None:
    """Tell devd where REQs for ``service_id`` go; another process's listen on the
    same Service ID is a :class:`StateError` (EADDRINUSE), like a second listener here."""
    try:
        link.cm_listen(service_id, mask, listen)
    except DeviceError as exc:
        if listen and exc.errno == errno.EADDRINUSE:
            raise StateError(f"Service ID {service_id:#018x} already has a listener in "
                             "another process", errno=errno.EADDRINUSE) from None
        if listen:
            raise


def _guid_of(gid: bytes) -> int:
    """A node GUID for a device without a MAC: EUI-64 style from the GID's last bytes."""
    return int.from_bytes(b"\x02\x00" + bytes(gid[-4:]) + b"\xfe\x01", "big")
