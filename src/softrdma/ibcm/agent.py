"""The InfiniBand Communication Manager of one RoCE port, sans-I/O (IBA Vol 1 ch. 12).

A :class:`CmAgent` owns the port's connections (:class:`IbCmId`) and speaks the CM
protocol in 256-byte MADs (``softrdma.wire.cm``). Like the transport engine it never
reads a clock or a socket; its driver (``softrdma.drivers.cm.gsi``, or a test) calls:

* ``agent.on_mad(mad, src_gid, src_qpn, now, dst_gid=...)`` for each MAD received on QP1;
* ``agent.on_timer(now)`` when ``now >= agent.next_deadline()``;
* ``agent.take_output()`` for the MADs to send (:class:`OutMad`: addressed to QP1 of the
  peer with the QP1 Q_Key ``wire.mad.GSI_QKEY``, IBA 13.5.1;
  the CM's MADs, IBA 12.6 and 13.4);
* ``agent.pop_events()`` for the typed, frozen :class:`~softrdma.ibcm.events.CmEvent` s
  its :class:`IbCmId` s reported (each runs the state machine of
  :mod:`softrdma.ibcm.state`, IBA 12.9).

These are the driver's :class:`~softrdma.seam.protocols.Engine` contract; ``on_output``
tells the driver when an operation ends with output or events to take. The agent holds
no lock, starts no thread and calls no consumer: the driver delivers the events (to the
id's handler, ``on_event`` or ``events``) and serializes the agent's entry points.
Consumer requests (``connect``, ``accept``, ``reject``, ``disconnect`` ...) take ``now``
or, under a driver, get it from the driver's ``runner`` (which also takes the device
lock); one made by an event handler that the driver runs inside the agent's own
processing (same ``caller_id``) runs at once, at that processing's time.

Timers (IBA 12.6.5 and 12.6.6, A16 CA16-9): a message that expects an answer is
retransmitted (the same MAD, same TID) every ``2 * PacketLifeTime + remote CM response
time`` seconds, at most Max CM Retries times (15, as Linux), PacketLifeTime being
``SubnetTimeout`` (18 by default on RoCE) and our own response time ``RespTimeValue``
(19 by default); an MRA replaces the wait by its service timeout plus PacketLifeTime. TimeWait lasts the local
ACK timeout (4.096 us * 2^(PacketLifeTime + 1), as Linux ``cm_enter_timewait``); until
it ends the comm ID stays reserved, a REQ from the same remote QPN is rejected as stale
(IBA 12.9.8.3) and the local QPN cannot be connected again.

RoCE (Annex A16.5.2): the LID fields of REQ and LAP are never looked at (CA16-10,
CA16-12); REJ reasons 13/19 and APR status 7 are never sent (CA16-11, CA16-13): the
send paths raise :class:`~softrdma.errors.InvalidArgument` for them.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ..errors import DecodeError, InvalidArgument, SoftRdmaError, StateError
from ..seam.tables import os_randbits
from ..wire import cm as wcm
from ..wire.cm import MsgType, Rej, RejReason, time_code_s
from ..wire.gid import is_v4_mapped
from ..wire.ipcm import is_ip_cm_service_id
from ..wire.mad import Method
from . import qpctl, sidr
from .cmid import IbCmId
from .events import CmEvent
from .model import CmInput, CmState, CommEst, Disconnect, Received, Timeout
from .params import (
    ALL_ONES_MASK,
    AcceptParams,
    CmConfig,
    CmCounters,
    CmPath,
    ConnParams,
    Dialect,
    DialectReject,
    OutMad,
    ReqVerdict,
    SidrParams,
    check_roce_message,
    make_rej,
    mtu_enum,
)
from .ratelimit import RejLimiter
from .state import transition
from .userqp import req_qp_type

__all__ = [
    "CmConfig", "CmPath", "ConnParams", "AcceptParams", "SidrParams", "OutMad", "ReqVerdict",
    "DialectReject", "Dialect", "CmCounters", "CmAgent", "IbCmId", "mtu_enum",
    "ALL_ONES_MASK", "check_roce_message", "make_rej",
]

_T = TypeVar("_T")


def _one_caller() -> object:
    """The caller identity of an agent driven from one thread."""
    return _one_caller

_HALF_OPEN = (CmState.REP_SENT, CmState.MRA_REP_RCVD)  # passive side, waiting for the RTU


class CmAgent:
    """The CM of one port (see the module docstring).

    ``gids`` is the port's GID table (kept by reference: the agent sees later changes);
    ``guid`` the node GUID sent as Local CA GUID; ``mtu`` the port's active MTU code.
    ``exclusive`` False (a device shared through devd, where every process sees every
    QP1 MAD) stops the agent from answering what it does not own: REQs for Service IDs
    nobody here listens on, DREQs for unknown comm IDs. ``seed`` makes comm IDs, TIDs
    and PSNs reproducible.
    """

    def __init__(self, gids: Sequence[bytes], guid: int, *, mtu: int = 3,
                 config: CmConfig | None = None, seed: int | None = None,
                 exclusive: bool = True) -> None:
        self.gids = gids
        self.gid_v1: Sequence[bool] | None = None  # per GID: RoCEv1 type (Annex A16)
        self.guid = guid
        self.mtu = mtu
        self.config = config if config is not None else CmConfig()
        self.rng = random.Random(seed if seed is not None else os_randbits(64))
        self.exclusive = exclusive
        self.counters = CmCounters()
        self.ids: dict[int, IbCmId] = {}
        self.by_remote: dict[tuple[int, int], IbCmId] = {}
        self.by_remote_qpn: dict[tuple[int, bytes], IbCmId] = {}
        self.by_local_qpn: dict[int, IbCmId] = {}
        self.listeners: list[IbCmId] = []
        self.sidr_pending: dict[int, IbCmId] = {}
        self.sidr_server: dict[tuple[int, bytes], IbCmId] = {}
        self.sidr_cache: dict[tuple[int, bytes], bytes] = {}
        self.outq: list[OutMad] = []
        #: bounds the answers sent for state we do not hold (the DREP to a DREQ naming no
        #: connection): a forged source gets at most ``REJ_BURST``, then ``REJ_PER_SECOND``
        #: (the same per-source limit as devd's REJ, ``drivers.cm_reject``)
        self.stateless_limiter = RejLimiter()
        self.events: deque[CmEvent] = deque()
        self.errors: deque[BaseException] = deque(maxlen=16)  # handler/processing failures
        self.on_event: Callable[[CmEvent], None] | None = None
        self.on_output: Callable[[float], None] | None = None
        self.runner: Callable[[Callable[[float], Any]], Any] | None = None
        # devd routing (a device shared by processes): the slot byte put in the top byte
        # of our comm IDs and SIDR request IDs, and the hook telling devd our listens.
        self.id_prefix = 0
        self.on_listen: Callable[[int, int, bool], None] | None = None
        # Timers: a heap of (when, seq) and, by seq, the id whose current timer it is. An
        # id re-armed, or gone IDLE, leaves only two numbers in the heap, not itself (and
        # its QP): a closed connection's DREQ timer is cancelled by the DREP long before
        # it would reach the top.
        self._heap: list[tuple[float, int]] = []
        self._armed: dict[int, IbCmId] = {}
        self._tseq = 0
        self._tid = self.rng.getrandbits(32)
        #: events not yet taken by :meth:`pop_events`, oldest first
        self.outbox: deque[CmEvent] = deque()
        #: who calls (the driver gives its thread's identity): a consumer call made from
        #: inside the agent's own processing by the caller that runs it (an event handler
        #: run inline) runs at once, at that processing's time, not through ``runner``
        self.caller_id: Callable[[], object] = _one_caller
        self._busy = 0
        self._owner: object = None
        self._now = 0.0

    # ---- consumer side ----------------------------------------------------------------
    def create_id(self, handler: Callable[[CmEvent], None] | None = None,
                  context: Any = None) -> IbCmId:
        """A new connection identifier in IDLE (``ib_create_cm_id``)."""
        return IbCmId(self, handler, context)

    def passive_id(self, listener: IbCmId, service_id: int, tid: int, remote_id: int,
                   path: CmPath, state: CmState) -> IbCmId:
        """A new id for a REQ or SIDR_REQ that ``listener`` takes (IBA 12.9 Figure 150, 12.11.2):
        the listener's consumer and dialect, counted in its backlog."""
        child = IbCmId(self, listener.handler, listener.context)
        child.listen_id = listener
        child.dialect = listener.dialect
        child.service_id = service_id
        child.tid = tid
        child.remote_id = remote_id
        child.path = path
        child.state = state
        listener.pending += 1
        return child

    def take_output(self) -> list[OutMad]:
        """The MADs to send, oldest first."""
        out = self.outq
        self.outq = []
        return out

    def next_deadline(self) -> float | None:
        """When :meth:`on_timer` must next run, None if no timer is armed."""
        heap = self._heap
        while heap:
            when, seq = heap[0]
            if self._live(when, seq):
                return when
            heapq.heappop(heap)
        return None

    def _live(self, when: float, seq: int) -> bool:
        cid = self._armed.get(seq)
        return cid is not None and cid.timer_seq == seq and cid.deadline == when

    def timers(self) -> int:
        """How many timers are armed (for leak checks)."""
        return sum(1 for when, seq in self._heap if self._live(when, seq))

    def on_timer(self, now: float) -> None:
        """Run the timers due at ``now`` (retransmissions, give-ups, TimeWait ends)."""
        self._enter(now)
        try:
            heap = self._heap
            while heap and heap[0][0] <= now:
                when, seq = heapq.heappop(heap)
                cid = self._armed.pop(seq, None)
                if cid is None or cid.timer_seq != seq or cid.deadline != when:
                    continue
                cid.deadline = None
                self.counters.timeouts += 1
                try:
                    cid.handle(Timeout(), now)
                except SoftRdmaError as exc:
                    self.counters.errors += 1
                    self.errors.append(exc)
        finally:
            self._leave(now)

    def on_comm_est(self, qp: object, now: float) -> None:
        """The QP of a connection received its first packet before the RTU (IBA 12.9.7.3:
        the CM then considers the connection established)."""
        eq = qpctl.engine_of(qp)
        cid = self.by_local_qpn.get(eq.qpn)
        if cid is None:
            return
        self._enter(now)
        try:
            cid.handle(CommEst(), now)
        finally:
            self._leave(now)

    # ---- receive ----------------------------------------------------------------------
    def on_mad(self, mad: bytes | bytearray | memoryview, src_gid: bytes, src_qpn: int, now: float, *,
               dst_gid: bytes | None = None) -> None:
        """One MAD received on QP1 from ``src_gid`` (QP ``src_qpn``), sent to our
        ``dst_gid`` (default: our first GID). Malformed MADs are counted and dropped."""
        self.counters.mads_in += 1
        try:
            cmad = wcm.decode(mad)
        except DecodeError:
            self.counters.bad_mads += 1
            return
        if cmad.hdr.method != Method.SEND:
            self.counters.ignored += 1
            return
        src = bytes(src_gid)
        dst = bytes(dst_gid) if dst_gid is not None else (self.gids[0] if self.gids else bytes(16))
        self._enter(now)
        try:
            self._recv(cmad.hdr.tid, cmad.msg, src, dst, src_qpn, now)
        except SoftRdmaError as exc:
            # A MAD we cannot act on (e.g. a QP the consumer broke): never let it reach
            # the driver's receive loop.
            self.counters.errors += 1
            self.errors.append(exc)
        finally:
            self._leave(now)

    def _recv(self, tid: int, msg: wcm.CmMessage, src: bytes, dst: bytes, src_qpn: int,
              now: float) -> None:
        if isinstance(msg, wcm.Req):
            self._recv_req(msg, tid, src, dst, now)
            return
        if isinstance(msg, wcm.SidrReq):
            sidr.handle_sidr_req(self, msg, tid, src, dst, now)
            return
        if isinstance(msg, wcm.SidrRep):
            cid = self.sidr_pending.get(msg.request_id)
            if cid is None or cid.path is None or cid.path.dgid != src:
                self.counters.unknown_id += 1
                return
            cid.handle(Received(msg, tid, src, dst), now)
            return
        if isinstance(msg, wcm.Apr):
            self.counters.ignored += 1  # we never send a LAP
            return
        cid = self.ids.get(msg.remote_comm_id)
        if cid is None and isinstance(msg, Rej) and msg.reason == RejReason.TIMEOUT \
                and msg.ari_length == 8:
            # linux cm_acquire_rejected_id: a Timeout REJ names its sender by CA GUID (ARI)
            # and may come before the sender knew our comm ID.
            cid = self.by_remote.get((msg.local_comm_id, int.from_bytes(msg.ari_data, "big")))
        if cid is None or cid.path is None or cid.path.dgid != src or (
                cid.remote_id and msg.local_comm_id not in (cid.remote_id, 0)):
            self.counters.unknown_id += 1
            if isinstance(msg, wcm.Dreq) and self.exclusive:
                # linux cm_issue_drep: let a peer that lost its state finish; it goes
                # to the DREQ's source, so it is rate-limited per source (a spoofed
                # DREQ flood must not make us a reflector).
                if not self.stateless_limiter.allow(src, now):
                    self.counters.drep_limited += 1
                    return
                drep = wcm.Drep(local_comm_id=msg.remote_comm_id,
                                remote_comm_id=msg.local_comm_id)
                self.send_msg(dst, src, drep, tid)
            return
        cid.handle(Received(msg, tid, src, dst), now)

    def _recv_req(self, req: wcm.Req, tid: int, src: bytes, dst: bytes, now: float) -> None:
        # CA16-10: the four LID fields are reserved on RoCE and never examined here.
        cur = self.by_remote.get((req.local_comm_id, req.local_ca_guid))
        if cur is not None:
            self.counters.duplicates += 1
            cur.handle(Received(req, tid, src, dst), now)
            return
        old = self.by_remote_qpn.get((req.local_qpn, src))
        if old is not None:
            # IBA 12.9.8.3.2: a REQ from a QPN we still hold a connection (or TimeWait)
            # for is stale; an established old connection is torn down.
            self.counters.stale += 1
            self.reject_req(req, tid, src, dst, RejReason.STALE_CONN)
            if old.state == CmState.ESTABLISHED:
                old.handle(Disconnect(), now)
            return
        if req_qp_type(req) is None:  # RC, UC or XRC (Annex A14) only
            self.reject_req(req, tid, src, dst, RejReason.INVALID_TRANSPORT_TYPE)
            return
        listener = self.find_listener(req.service_id)
        if listener is None:
            self.counters.no_listener += 1
            if self.exclusive:
                self.reject_req(req, tid, src, dst, RejReason.INVALID_SERVICE_ID)
            else:
                self.counters.unclaimed += 1
            return
        # the table's (LISTEN, REQ) row: backlog, dialect, the new id in REQ_RCVD
        listener.handle(Received(req, tid, src, dst), now)

    def evict_half_open(self, listener: IbCmId, now: float) -> bool:
        """Make room in ``listener``'s full backlog: give up the oldest half-open
        connection (REP sent, no RTU) that has waited a whole response time already, as
        its retries running out would (REJ Timeout, UNREACHABLE; :mod:`.retry`). A peer
        that never answers its REP (a forged REQ's source) cannot keep a real client
        out; fresh half-open entries are kept, so a flood is still refused."""
        for cid in self.ids.values():
            if (cid.listen_id is listener and cid.state in _HALF_OPEN and cid.msg is not None
                    and now - cid.opened_at >= cid.timeout_s):
                self.counters.half_open_evicted += 1
                cid.max_retries = cid.retries  # no retry left: the Timeout gives up
                cid.handle(Timeout(), now)
                return listener.pending < listener.backlog
        return False

    def reject_req(self, req: wcm.Req, tid: int, src: bytes, dst: bytes, reason: int,
                    ari: bytes = b"", private_data: bytes = b"") -> None:
        """REJ a REQ we keep no state for (IBA 12.6.7: Local Communication ID 0)."""
        rej = make_rej(0, req.local_comm_id, MsgType.REQ, reason, ari, private_data)
        self.send_msg(dst, src, rej, tid)

    def find_listener(self, service_id: int) -> IbCmId | None:
        """The listener for ``service_id``, most specific mask first (None: nobody).
        A Service ID of the A11 range has none when IP CM is not supported (CA11-8)."""
        if not self.config.ip_cm_supported and is_ip_cm_service_id(service_id):
            return None
        best: IbCmId | None = None
        for lst in self.listeners:
            if service_id & lst.mask == lst.service_id & lst.mask and (
                    best is None or lst.mask > best.mask):
                best = lst
        return best

    # ---- the machine ------------------------------------------------------------------
    def handle(self, cid: IbCmId, inp: CmInput, now: float) -> None:
        """One input for ``cid``: the table's action, then its next state (IBA 12.9). A
        consumer request outside the table is a StateError; anything else is counted and
        dropped."""
        row = transition(cid.state, inp)
        if row is None:
            if inp.api:
                raise StateError(f"{inp.name} is not allowed in CM state {cid.state.name}")
            self.counters.ignored += 1
            return
        got = row.action(cid, now, inp)
        cid.set_state(row.next_state if got is None else got, now)
        follow = cid.follow
        if follow is not None:
            cid.follow = None
            self.handle(cid, follow, now)

    # ---- plumbing used by IbCmId -------------------------------------------------------
    def random_id(self) -> int:
        """A random non-zero 32-bit ID; with ``id_prefix`` (devd slot) its top byte."""
        while True:
            v = self.rng.getrandbits(32)
            if self.id_prefix:
                v = self.id_prefix << 24 | v & 0xFFFFFF
            if v and v not in self.ids and v not in self.sidr_pending:
                return v

    def new_comm_id(self, cid: IbCmId) -> int:
        """A fresh comm ID (IBA 12.6.5 Local Communication ID) bound to ``cid``."""
        v = self.random_id()
        self.ids[v] = cid
        return v

    def new_tid(self) -> int:
        """A fresh 64-bit transaction ID (high half fixed per agent, as Linux)."""
        self._tid = (self._tid + 1) & 0xFFFFFFFF
        return (self.guid & 0xFFFFFFFF) << 32 | self._tid

    def sgid_for(self, dgid: bytes, sgid: bytes | None) -> bytes:
        """``sgid`` checked against the GID table, or the first GID of ``dgid``'s family
        (IPv4-mapped or IPv6)."""
        if sgid is not None:
            if bytes(sgid) not in self.gids:
                raise InvalidArgument("sgid", f"{bytes(sgid).hex()} is not a GID of this port")
            return bytes(sgid)
        v4 = is_v4_mapped(dgid)
        for g in self.gids:
            if is_v4_mapped(g) == v4:
                return bytes(g)
        if not self.gids:
            raise StateError("the port has no GID")
        return bytes(self.gids[0])

    def sgid_index(self, sgid: bytes) -> int:
        """The GID index of ``sgid`` (0 if absent). Where a GID appears once per RoCE
        version (``gid_v1``, set by the binding), the RoCE v2 entry wins, as Linux's
        default RoCE mode for the CM is v2."""
        gids = list(self.gids)
        kinds = self.gid_v1
        if kinds is not None and len(kinds) == len(gids):
            for i, g in enumerate(gids):
                if g == sgid and not kinds[i]:
                    return i
        try:
            return gids.index(sgid)
        except ValueError:
            return 0

    def send_msg(self, sgid: bytes, dgid: bytes, msg: wcm.CmMessage, tid: int,
                  path: CmPath | None = None) -> bytes:
        check_roce_message(msg)
        mad = wcm.encode(msg, tid=tid)
        self.out(sgid, dgid, mad, path, local=dgid in self.gids and self.takes(msg))
        return mad

    def out(self, sgid: bytes, dgid: bytes, mad: bytes, path: CmPath | None = None, *,
            local: bool = False) -> None:
        """Queue ``mad`` for the driver (``local``: see :attr:`OutMad.local`)."""
        self.counters.mads_out += 1
        if path is None:  # answered from the received MAD's addressing alone
            self.outq.append(OutMad(sgid, dgid, mad, reversible=True, local=local))
        else:
            self.outq.append(OutMad(sgid, dgid, mad, path.hop_limit, path.traffic_class,
                                    path.flow_label, local=local))

    def takes(self, msg: wcm.CmMessage) -> bool:
        """Whether ``msg``, sent to a GID of this port, is for this agent and no other
        (the receiver a devd routing by Service ID and comm-ID slot would pick too,
        :mod:`softrdma.drivers.devd.cm`): a REQ or SIDR_REQ for one of its listeners of
        full mask (no more specific listen can exist elsewhere), a SIDR_REP to one of its
        request IDs, or another message to one of its comm IDs (IBA 12.6.5).

        A DREQ moves its receiver's QP to ERR (IBA 12.9.6), so on the wire it follows the
        packets its sender's QP sent before it, as with rxe; handed back at once it would
        overtake them (an ACK its sender's responder had just queued: the peer's last
        SEND was flushed). It is taken only when no packet can be overtaken: both QPs
        are RC and had nothing in flight (:func:`~softrdma.ibcm.qpctl.drained`: the
        sender's when it sent the DREQ, before its own flush; the receiver's now: an
        ACK its peer owes it means a request of its own still in flight). A DREP moves
        no QP (both are in ERR already) and follows the general rule."""
        if isinstance(msg, wcm.Dreq):
            sender = self.ids.get(msg.local_comm_id)
            receiver = self.ids.get(msg.remote_comm_id)
            return (sender is not None and sender.dreq_drained and receiver is not None
                    and receiver.remote_id == msg.local_comm_id and qpctl.drained(receiver.qp))
        if isinstance(msg, (wcm.Req, wcm.SidrReq)):
            lst = self.find_listener(msg.service_id)
            return lst is not None and lst.mask == ALL_ONES_MASK
        if isinstance(msg, wcm.SidrRep):
            return msg.request_id in self.sidr_pending
        remote = getattr(msg, "remote_comm_id", 0)
        return bool(remote) and remote in self.ids

    def arm(self, cid: IbCmId, when: float) -> None:
        """(Re)arm ``cid``'s one timer for ``when`` (an earlier arming is forgotten)."""
        self._armed.pop(cid.timer_seq, None)
        self._tseq += 1
        seq = cid.timer_seq = self._tseq
        cid.deadline = when
        self._armed[seq] = cid
        heap = self._heap
        heapq.heappush(heap, (when, seq))
        if len(heap) > 2 * len(self._armed) + 64:  # stale entries: keep the heap bounded
            heap[:] = [(w, q) for w, q in heap if self._live(w, q)]
            heapq.heapify(heap)

    def timewait_s(self, cid: IbCmId) -> float:
        cfg = self.config
        if cfg.timewait_s is not None:
            return cfg.timewait_s
        return time_code_s(min(31, cid.ack_timeout or cfg.subnet_timeout + 1))

    def unregister(self, cid: IbCmId) -> None:
        """Forget ``cid`` everywhere it is indexed (it entered IDLE)."""
        self._armed.pop(cid.timer_seq, None)
        if self.ids.get(cid.local_id) is cid:
            del self.ids[cid.local_id]
        key = (cid.remote_id, cid.remote_guid)
        if self.by_remote.get(key) is cid:
            del self.by_remote[key]
        if cid.path is not None:
            qkey = (cid.remote_qpn, cid.path.dgid)
            if self.by_remote_qpn.get(qkey) is cid:
                del self.by_remote_qpn[qkey]
        if cid.local_qpn is not None and self.by_local_qpn.get(cid.local_qpn) is cid:
            del self.by_local_qpn[cid.local_qpn]
        if cid in self.listeners:
            self.listeners.remove(cid)
            if self.on_listen is not None:
                try:
                    self.on_listen(cid.service_id, cid.mask, False)
                except SoftRdmaError as exc:  # the daemon may be gone
                    self.errors.append(exc)
        if self.sidr_pending.get(cid.local_id) is cid:
            del self.sidr_pending[cid.local_id]
        for k, v in list(self.sidr_server.items()):
            if v is cid:
                del self.sidr_server[k]

    def claim_qpn(self, cid: IbCmId, qpn: int) -> None:
        """Bind local QPN ``qpn`` to ``cid``: refused while another connection (one in
        TimeWait included) holds it (IBA 12.9.8.3: no QPN reuse before TimeWait ends)."""
        cur = self.by_local_qpn.get(qpn)
        if cur is not None and cur is not cid:
            raise StateError(f"QPN {qpn:#x} is still used by a connection in state "
                             f"{cur.state.name} (TimeWait must end before it is reused)")
        self.by_local_qpn[qpn] = cid
        cid.local_qpn = qpn

    # ---- events and re-entrancy -------------------------------------------------------
    def emit(self, ev: CmEvent) -> None:
        """Queue an event for :meth:`pop_events` (the driver delivers it, IBA 12.9)."""
        self.outbox.append(ev)

    def pop_events(self) -> list[CmEvent]:
        """The events queued since the last call, oldest first (the driver hands them to
        their consumers: ``drivers.cm.gsi``)."""
        box = self.outbox
        out = list(box)
        box.clear()
        return out

    def _enter(self, now: float) -> None:
        # the caller first: a caller that sees _busy set must never see its own identity
        # there unless it is the one inside (api() then runs without the runner)
        self._owner = self.caller_id()
        self._busy += 1
        self._now = now

    def _leave(self, now: float) -> None:
        try:
            if self._busy == 1 and self.on_output is not None:
                self.on_output(now)
        finally:
            if self._busy == 1:
                self._owner = None
            self._busy -= 1

    def api(self, fn: Callable[[float], _T], now: float | None) -> _T:
        """Run a consumer request: at ``now``; inside the agent's own processing, by the
        same caller (an event handler run inline), at the current time; else through the
        driver's runner (which takes the time and its lock)."""
        if now is None and self._busy and self._owner == self.caller_id():
            now = self._now
        if now is None:
            if self.runner is None:
                raise StateError("no driver: pass now= to CM calls")
            return self.runner(lambda t: self._api_at(fn, t))  # type: ignore[no-any-return]
        return self._api_at(fn, now)

    def _api_at(self, fn: Callable[[float], _T], now: float) -> _T:
        self._enter(now)
        try:
            return fn(now)
        finally:
            self._leave(now)

    def live_ids(self) -> int:
        """Connections and listeners the agent still tracks (for leak checks)."""
        return len(self.ids) + len(self.listeners) + len(self.sidr_pending)
