"""A CM connection identifier (:class:`IbCmId`) and how it runs the IBA 12.9 state machine.

:class:`IbCmId` holds one connection's (or listener's) CM state: comm IDs, the path, the
QP, the message awaiting an answer and its retransmission timer. Its consumer requests
(``connect``, ``accept`` ... ``ib_send_cm_*``) and what the agent receives for it become
typed inputs (:mod:`.model`) that :meth:`IbCmId.handle` gives its agent, which looks
them up in the table of :mod:`.state` (:meth:`~.agent.CmAgent.handle`); the row's action
(a function of :mod:`.establish`, :mod:`.release`, :mod:`.mra_lap`, :mod:`.retry` or
:mod:`.sidr`) builds the messages (``softrdma.wire.cm``), moves the QP (:mod:`.qpctl`)
and queues the consumer's events (:class:`CmEvent`, which names its id, so it lives
here; :mod:`.events` re-exports it). The id sees its agent as :class:`CmAgentView`: this
module imports neither the agent nor the table, so no module cycle is left, type-only
imports included. See :mod:`softrdma.ibcm.agent` for the agent that owns the ids.

(This is the IB CM's id, ``struct ib_cm_id``; the librdmacm-shaped ``rdma_cm_id`` above
both transports is :class:`softrdma.cm.rdma_cm.CmId`.)
"""

from __future__ import annotations

import builtins
import errno
import logging
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from ..errors import InvalidArgument, StateError
from ..ib.qp import AddressVector
from ..wire import cm as wcm
from ..wire.cm import Rej, RejReason, Rep, Req, SidrRep, SidrReq
from ..wire.ipcm import IpAddress
from . import qpctl
from .model import (
    PENDING_STATES,
    AcceptConn,
    CmEventType,
    CmInput,
    CmState,
    CommEst,
    Connect,
    Disconnect,
    Establish,
    Listen,
    Reject,
    RejectInfo,
    SendMra,
    SidrResolve,
)
from .params import (
    ALL_ONES_MASK,
    AcceptParams,
    CmConfig,
    CmCounters,
    CmPath,
    ConnParams,
    Dialect,
    DialectReject,
    ReqVerdict,
    SidrParams,
)

__all__ = ["CmAgentView", "CmEvent", "IbCmId", "PENDING_STATES"]

_M = TypeVar("_M")
_T = TypeVar("_T")



_CM_LOG = logging.getLogger("softrdma.cm")

class CmAgentView(Protocol):
    """What an id and the table's actions use of the agent that owns it
    (:class:`~.agent.CmAgent`; named here so that neither needs the agent's module)."""

    @property
    def config(self) -> CmConfig: ...
    @property
    def counters(self) -> CmCounters: ...
    @property
    def gids(self) -> Sequence[bytes]: ...
    @property
    def guid(self) -> int: ...
    @property
    def mtu(self) -> int: ...
    @property
    def exclusive(self) -> bool: ...
    @property
    def rng(self) -> random.Random: ...
    @property
    def listeners(self) -> list[IbCmId]: ...
    @property
    def by_local_qpn(self) -> dict[int, IbCmId]: ...
    @property
    def by_remote(self) -> dict[tuple[int, int], IbCmId]: ...
    @property
    def by_remote_qpn(self) -> dict[tuple[int, bytes], IbCmId]: ...
    @property
    def sidr_pending(self) -> dict[int, IbCmId]: ...
    @property
    def sidr_server(self) -> dict[tuple[int, bytes], IbCmId]: ...
    @property
    def sidr_cache(self) -> dict[tuple[int, bytes], bytes]: ...
    @property
    def events(self) -> deque[CmEvent]: ...
    @property
    def on_event(self) -> Callable[[CmEvent], None] | None: ...
    @property
    def on_listen(self) -> Callable[[int, int, bool], None] | None: ...

    def api(self, fn: Callable[[float], _T], now: float | None) -> _T: ...
    def handle(self, cid: IbCmId, inp: CmInput, now: float) -> None: ...
    def emit(self, ev: CmEvent) -> None: ...
    def arm(self, cid: IbCmId, when: float) -> None: ...
    def timewait_s(self, cid: IbCmId) -> float: ...
    def unregister(self, cid: IbCmId) -> None: ...
    def claim_qpn(self, cid: IbCmId, qpn: int) -> None: ...
    def random_id(self) -> int: ...
    def new_comm_id(self, cid: IbCmId) -> int: ...
    def new_tid(self) -> int: ...
    def sgid_for(self, dgid: bytes, sgid: bytes | None) -> bytes: ...
    def sgid_index(self, sgid: bytes) -> int: ...
    def send_msg(self, sgid: bytes, dgid: bytes, msg: wcm.CmMessage, tid: int,
                 path: CmPath | None = None) -> bytes: ...
    def out(self, sgid: bytes, dgid: bytes, mad: bytes, path: CmPath | None = None) -> None: ...
    def reject_req(self, req: wcm.Req, tid: int, src: bytes, dst: bytes, reason: int,
                   ari: bytes = b"", private_data: bytes = b"") -> None: ...
    def find_listener(self, service_id: int) -> IbCmId | None: ...
    def evict_half_open(self, listener: IbCmId, now: float) -> bool: ...
    def passive_id(self, listener: IbCmId, service_id: int, tid: int, remote_id: int,
                   path: CmPath, state: CmState) -> IbCmId: ...


class IbCmId:
    """One connection (or listener) and its IBA 12.9 state (see :mod:`.state`).

    Events go to ``handler``, else to the agent's ``on_event``, else to
    ``agent.events``. Under a driver (:class:`~softrdma.drivers.cm.gsi.CmBinding`) they are
    delivered after the device lock is released, so a handler may do anything: CM
    calls, creating or destroying verbs objects, blocking. ``context`` is the
    consumer's. After ``TIMEWAIT_EXIT`` (or a rejection ending in IDLE) the id may
    connect again.
    """

    __slots__ = (
        "agent", "handler", "context", "state", "local_id", "remote_id", "remote_guid",
        "remote_qpn", "local_qpn", "qp", "path", "service_id", "mask", "tid", "msg",
        "last_reply", "retries", "max_retries", "timeout_s", "deadline", "timer_seq",
        "listen_id", "pending", "backlog", "dialect", "params", "req", "rep", "local_psn",
        "ack_timeout", "local_ack_timeout", "destroyed", "follow", "drep_tid", "auto_rtu",
        "sidr_key", "reject_info", "psn_drawn", "opened_at", "dreq_drained", "__weakref__",
    )

    def __init__(self, agent: CmAgentView, handler: Callable[[CmEvent], None] | None = None,
                 context: Any = None) -> None:
        self.agent = agent
        self.handler = handler
        self.context = context
        self.state = CmState.IDLE
        self.local_id = 0
        self.remote_id = 0
        self.remote_guid = 0
        self.remote_qpn = 0
        self.local_qpn: int | None = None
        self.qp: object = None  # the CM-moved QP (verbs or engine), None: the consumer's
        self.path: CmPath | None = None
        self.service_id = 0
        self.mask = ALL_ONES_MASK
        self.tid = 0
        self.msg: bytes | None = None
        self.last_reply: bytes | None = None
        self.retries = 0
        self.max_retries = agent.config.max_cm_retries
        self.timeout_s = 0.0
        self.deadline: float | None = None
        self.timer_seq = 0  # which armed timer is this id's current one (CmAgent.arm)
        self.listen_id: IbCmId | None = None
        self.pending = 0
        self.backlog = agent.config.default_backlog
        self.dialect: Dialect | None = None
        self.params: ConnParams | SidrParams | None = None
        self.req: wcm.Req | None = None
        self.rep: wcm.Rep | None = None
        self.local_psn = 0
        self.ack_timeout = 0
        #: the consumer's Local ACK Timeout for its own QP (librdmacm
        #: RDMA_OPTION_ID_ACK_TIMEOUT); None: the REQ's (IBA 12.7.34)
        self.local_ack_timeout: int | None = None
        self.destroyed = False
        #: an input an action asks to run right after it (the DREP after a DREQ)
        self.follow: CmInput | None = None
        self.drep_tid = 0
        self.auto_rtu = True
        self.sidr_key: tuple[int, bytes] | None = None
        self.reject_info: RejectInfo | None = None
        self.psn_drawn = False
        #: when the passive side sent its REP (the half-open wait for the RTU began)
        self.opened_at = 0.0
        #: its QP had nothing in flight when it sent its DREQ (:func:`.qpctl.drained`)
        self.dreq_drained = False

    def __repr__(self) -> str:
        return f"<IbCmId {self.local_id:#010x} {self.state.name}>"

    # ---- consumer requests --------------------------------------------------------------
    def listen(self, service_id: int, *, mask: int = ALL_ONES_MASK, backlog: int | None = None,
               dialect: Dialect | None = None, now: float | None = None) -> None:
        """Listen for REQs/SIDR_REQs whose Service ID matches under ``mask``
        (``ib_cm_listen``). ``backlog`` bounds the unanswered CONNECT_REQUESTs."""
        if not 0 <= service_id <= ALL_ONES_MASK:
            raise InvalidArgument("service_id", "must be a 64-bit value")
        size = self.agent.config.default_backlog if backlog is None else backlog
        # the table's IDLE -> LISTEN (the A11 dialect by default in the A11 range)
        self.request(Listen(service_id, mask, size, dialect), now)

    def connect(self, qp: object, params: ConnParams, *, dialect: Dialect | None = None,
                now: float | None = None) -> None:
        """Send a REQ for ``qp`` (RC or UC) with ``params`` (``ib_send_cm_req``)."""
        self.request(Connect(qp, params, dialect), now)

    def accept(self, qp: object = None, params: AcceptParams | None = None, *,
               now: float | None = None) -> None:
        """Answer a CONNECT_REQUEST: REP (the QP moved to RTS first) or, for SIDR, a
        SIDR_REP with the QP's number and Q_Key."""
        self.request(AcceptConn(qp, params if params is not None else AcceptParams()), now)

    def reject(self, private_data: bytes = b"", *, reason: int = RejReason.CONSUMER_DEFINED,
               ari: bytes = b"", now: float | None = None) -> None:
        """REJ the REQ (or REP) this id received; reason 28 by default (``rdma_reject``)."""
        self.request(Reject(bytes(private_data), reason, bytes(ari)), now)

    def establish(self, private_data: bytes = b"", *, now: float | None = None) -> None:
        """Send the RTU after a CONNECT_RESPONSE (``ib_send_cm_rtu``)."""
        self.request(Establish(bytes(private_data)), now)

    def send_mra(self, service_timeout: int | None = None, private_data: bytes = b"", *,
                 now: float | None = None) -> None:
        """Ask the peer for more time to answer its REQ or REP (``ib_send_cm_mra``)."""
        st = self.agent.config.mra_service_timeout if service_timeout is None else service_timeout
        self.request(SendMra(st, bytes(private_data)), now)

    def disconnect(self, private_data: bytes = b"", *, now: float | None = None) -> None:
        """Release the connection: DREQ (QP to ERR), or the REJ/DREP the state calls for."""
        self.request(Disconnect(bytes(private_data)), now)

    def sidr_resolve(self, params: SidrParams, *, dialect: Dialect | None = None,
                     now: float | None = None) -> None:
        """Send a SIDR_REQ (IBA 12.11); ESTABLISHED brings the remote UD QPN and Q_Key."""
        self.request(SidrResolve(params, dialect), now)

    def notify_comm_est(self, *, now: float | None = None) -> None:
        """The QP received data before the RTU (``ib_cm_notify(IB_EVENT_COMM_EST)``, IBA
        12.9.7.3): REP_SENT or MRA_REP_RCVD move to ESTABLISHED. As Linux ``cm_establish``,
        an established id is ``EISCONN`` and any other state ``EINVAL``."""
        def run(t: float) -> None:
            if self.state == CmState.ESTABLISHED:
                raise StateError("the connection is already established", errno=errno.EISCONN)
            if self.state not in (CmState.REP_SENT, CmState.MRA_REP_RCVD):
                raise StateError(f"COMM_EST is not allowed in CM state {self.state.name}")
            self.handle(CommEst(), t)
        self.agent.api(run, now)

    def destroy(self, *, now: float | None = None) -> None:
        """Forget the id (``ib_destroy_cm_id``): what ``disconnect`` would send is sent,
        no more events are delivered, TimeWait still runs out before the comm ID and
        QPN are free."""
        def run(t: float) -> None:
            self.destroyed = True
            if self.state in _DESTROY_SENDS:
                self.handle(Disconnect(), t)
            if self.state not in (CmState.TIMEWAIT, CmState.DREQ_SENT):
                self.set_state(CmState.IDLE, t)
            elif self.state == CmState.TIMEWAIT:
                self._let_go()
        self.agent.api(run, now)

    def request(self, inp: CmInput, now: float | None) -> None:
        """Run a consumer request through the agent (its clock and lock)."""
        self.agent.api(lambda t: self.handle(inp, t), now)

    # ---- the machine ------------------------------------------------------------------
    def handle(self, inp: CmInput, now: float) -> None:
        """One input: the agent runs it through the table (IBA 12.9,
        :meth:`~.agent.CmAgent.handle`)."""
        self.agent.handle(self, inp, now)

    def set_state(self, new: CmState, now: float) -> None:
        """Enter ``new``: TimeWait arms its timer (IBA 12.9, Figure 151), IDLE forgets the id."""
        old = self.state
        if old == new:
            return
        self.state = new
        if _CM_LOG.isEnabledFor(logging.DEBUG):  # SOFTRDMA_TRACE=cm (softrdma.trace)
            _CM_LOG.debug("CM 0x%08x (remote 0x%08x): %s -> %s", self.local_id,
                          self.remote_id, old.name, new.name)
        if old in PENDING_STATES and new not in PENDING_STATES and self.listen_id is not None:
            self.listen_id.pending -= 1
        if new == CmState.TIMEWAIT:
            self.msg = None
            self.agent.arm(self, now + self.agent.timewait_s(self))
            self._let_go()
        elif new == CmState.IDLE:
            self.deadline = None
            self.msg = None
            self.agent.unregister(self)
            self.local_qpn = None

    def _let_go(self) -> None:
        """In TimeWait an id needs only its comm IDs, QPN and timer (a DREQ again gets
        the DREP again, a REQ for it is stale: IBA 12.9.8.3): it lets go of its QP,
        which every way into TimeWait moved to ERR already, and, once its consumer
        destroyed it, of the consumer's handler and context. A closed connection's
        objects (QP, engine, rdma_cm id, channel references) are then freed when the
        consumer drops them, not when TimeWait runs out; until then they were kept,
        about 100 objects per connection, which the collector walked again and
        again at high connection rates."""
        self.qp = None
        if self.destroyed:
            self.handler = None
            self.context = None

    # ---- helpers of the actions ---------------------------------------------------------
    def send(self, msg: wcm.CmMessage, tid: int, now: float, *, retransmit: bool) -> bytes:
        """Send ``msg`` on the id's path; ``retransmit``: keep it and arm the timer
        (IBA 12.6.5 Max CM Retries), else remember it as the answer to a duplicate."""
        assert self.path is not None
        mad = self.agent.send_msg(self.path.sgid, self.path.dgid, msg, tid, self.path)
        if retransmit:
            self.msg = mad
            self.retries = 0
            self.agent.arm(self, now + self.timeout_s)
        else:
            self.last_reply = mad
        return mad

    def cancel_timer(self) -> None:
        """Stop retransmitting: the answer came (or the connection ends)."""
        self.deadline = None
        self.msg = None

    def emit(self, kind: CmEventType, private_data: bytes = b"", **kw: Any) -> None:
        """Queue an event about this id for its consumer."""
        self.agent.emit(CmEvent(kind, self, private_data=private_data, **kw))

    def check_req(self, service_id: int, private_data: bytes,
                  sidr: bool) -> ReqVerdict | DialectReject:
        """A listener's verdict on a REQ or SIDR_REQ (``sidr``) for ``service_id``: its
        dialect's (A11: the IP CM private data, Annex A11.4), or accepted as it is."""
        if self.dialect is not None:
            return self.dialect.check_req(self, service_id, private_data, sidr)
        return ReqVerdict(private_data)

    def emit_connect_request(self, child: IbCmId, verdict: ReqVerdict,
                             info: dict[str, Any]) -> None:
        """CONNECT_REQUEST for this listener's consumer: the new id ``child`` with what
        its dialect accepted (private data, addresses) and ``info``."""
        self.agent.emit(CmEvent(CmEventType.CONNECT_REQUEST, child, self, verdict.private_data,
                                remote_ip=verdict.remote_ip, remote_port=verdict.remote_port,
                                local_ip=verdict.local_ip, local_port=verdict.local_port,
                                info={**info, **verdict.info}))

    def qp_err(self, now: float) -> None:
        """The CM-moved QP to ERR (a REJ, DREQ or DREP ends the connection)."""
        if self.qp is not None:
            qpctl.to_err(qpctl.engine_of(self.qp), now)

    def av(self) -> AddressVector:
        """The address vector of the connection's path, for the QP's RTR."""
        p = self.path
        assert p is not None
        return AddressVector(p.dgid, self.agent.sgid_index(p.sgid), p.flow_label, p.hop_limit,
                             p.traffic_class)


@dataclass(frozen=True, slots=True)
class CmEvent:
    """One event, immutable. ``cm_id`` is the connection it is about; for
    CONNECT_REQUEST it is the new passive id and ``listen_id`` the listener. Address
    fields are filled by a dialect that carries them (A11, Hello) and from the path
    otherwise. The agent queues events (:meth:`~softrdma.ibcm.agent.CmAgent.pop_events`);
    its driver delivers them once its lock is released (``drivers.cm.gsi``)."""

    type: CmEventType
    cm_id: IbCmId
    listen_id: IbCmId | None = None
    private_data: bytes = b""
    reject: RejectInfo | None = None
    remote_ip: IpAddress | None = None
    remote_port: int | None = None
    local_ip: IpAddress | None = None
    local_port: int | None = None
    ud_qpn: int | None = None
    ud_qkey: int | None = None
    info: dict[str, Any] = field(default_factory=dict)

    # ---- typed views of ``info`` (the message that caused the event) --------------------
    def _message(self, key: str, cls: builtins.type[_M]) -> _M | None:
        """``info[key]`` if it is a ``cls`` message, else None."""
        m = self.info.get(key)
        return m if isinstance(m, cls) else None

    @property
    def req(self) -> Req | None:
        """The REQ of a CONNECT_REQUEST (IBA 12.6.5)."""
        return self._message("req", Req)

    @property
    def rep(self) -> Rep | None:
        """The REP of a CONNECT_RESPONSE or an active side's ESTABLISHED (IBA 12.6.8)."""
        return self._message("rep", Rep)

    @property
    def rej(self) -> Rej | None:
        """The REJ of a REJECTED (IBA 12.6.7)."""
        return self._message("rej", Rej)

    @property
    def sidr(self) -> bool:
        """A SIDR CONNECT_REQUEST (IBA 12.11): accept it with a UD QP."""
        return self.info.get("sidr") is True

    @property
    def sidr_req(self) -> SidrReq | None:
        """The SIDR_REQ of a SIDR CONNECT_REQUEST (IBA 12.11.1)."""
        return self._message("sidr_req", SidrReq)

    @property
    def sidr_rep(self) -> SidrRep | None:
        """The SIDR_REP of a SIDR ESTABLISHED or REJECTED (IBA 12.11.2)."""
        return self._message("sidr_rep", SidrRep)

    @property
    def text(self) -> str:
        """A readable line (the rejection text for REJECTED/UNREACHABLE)."""
        if self.reject is not None:
            return f"{self.type.value}: {self.reject.text}"
        return self.type.value

    def __repr__(self) -> str:
        return f"<CmEvent {self.text} id={self.cm_id.local_id:#010x}>"


# States in which destroy() sends what disconnect() sends (linux ib_destroy_cm_id).
_DESTROY_SENDS = frozenset((
    CmState.REQ_SENT, CmState.MRA_REQ_RCVD, CmState.REQ_RCVD, CmState.MRA_REQ_SENT,
    CmState.REP_SENT, CmState.MRA_REP_RCVD, CmState.REP_RCVD, CmState.MRA_REP_SENT,
    CmState.ESTABLISHED, CmState.DREQ_RCVD, CmState.SIDR_REQ_SENT,
    CmState.SIDR_REQ_RCVD, CmState.LISTEN))
