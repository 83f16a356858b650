"""The vocabulary of the CM state machine (IBA Vol 1 §12.9): its states and its inputs.

:class:`CmState` names the communication states of IBA Figures 149-153 (connection
establishment, release, SIDR) with Linux's names (``enum ib_cm_state``). An *input* is
one typed frozen dataclass per thing that can happen to a connection:

* a consumer request (:class:`Connect`, :class:`AcceptConn`, :class:`Reject`,
  :class:`Establish`, :class:`SendMra`, :class:`Disconnect`, :class:`SendDrep`,
  :class:`SidrResolve`), each carrying exactly what its action needs;
* a received CM message, :class:`Received` of its ``softrdma.wire.cm`` body (IBA 12.6.5
  REQ ... 12.6.11 DREP, 12.8.1 LAP, 12.11 SIDR_REQ/SIDR_REP) with the MAD's TID and
  addressing;
* :class:`Timeout` (a retransmission timer, IBA 12.6.5 Max CM Retries and A16 CA16-9,
  or the end of TimeWait, IBA 12.9 Figure 151) and
  :class:`CommEst` (the QP's communication-established event, IBA 12.9.7.3).

The table that maps ``(state, input)`` to a typed action and the next state is
:mod:`softrdma.ibcm.state`. What the machine reports to its consumer is named here too:
:class:`CmEventType` and :class:`RejectInfo` (the events themselves,
:class:`~.cmid.CmEvent`, name the id they are about).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, IntEnum
from typing import ClassVar, Generic, TypeVar

from ..wire import cm as wcm
from ..wire.cm import RejReason
from ..wire.ipcm import IpCmReject
from .params import AcceptParams, ConnParams, Dialect, SidrParams

__all__ = [
    "CmState", "PENDING_STATES", "CmInput", "ApiInput", "Connect", "AcceptConn", "Reject",
    "Establish", "SendMra", "Disconnect", "SendDrep", "SidrResolve", "Listen", "Received",
    "Timeout",
    "CommEst", "MsgT", "CmEventType", "RejectInfo",
]


class CmState(IntEnum):
    """Communication states (IBA 12.9, Figures 149-153; linux ``enum ib_cm_state``)."""

    IDLE = 0
    LISTEN = 1
    REQ_SENT = 2
    REQ_RCVD = 3
    MRA_REQ_SENT = 4
    MRA_REQ_RCVD = 5
    REP_SENT = 6
    REP_RCVD = 7
    MRA_REP_SENT = 8
    MRA_REP_RCVD = 9
    ESTABLISHED = 10
    DREQ_SENT = 11
    DREQ_RCVD = 12
    TIMEWAIT = 13
    SIDR_REQ_SENT = 14
    SIDR_REQ_RCVD = 15


# A listener's half-open connections, which its backlog bounds (as listen(backlog) bounds
# SYN_RECV + the accept queue): REQ received and not yet accepted, or accepted (REP sent)
# and waiting for the RTU.
PENDING_STATES = (CmState.REQ_RCVD, CmState.MRA_REQ_SENT, CmState.SIDR_REQ_RCVD,
                  CmState.REP_SENT, CmState.MRA_REP_RCVD)


class CmInput:
    """Base of every input. ``name`` is what a StateError calls it; ``api`` is True for
    consumer requests (refused with StateError outside the table), False for what the
    network or a timer brings (outside the table: counted and dropped)."""

    __slots__ = ()
    name: ClassVar[str] = "input"
    api: ClassVar[bool] = False


class ApiInput(CmInput):
    """A consumer request (``ib_send_cm_*``)."""

    __slots__ = ()
    api: ClassVar[bool] = True


@dataclass(frozen=True, slots=True)
class Connect(ApiInput):
    """``ib_send_cm_req``: a REQ for ``qp`` (IBA 12.6.5)."""

    name: ClassVar[str] = "connect"
    qp: object
    params: ConnParams
    dialect: Dialect | None = None


@dataclass(frozen=True, slots=True)
class AcceptConn(ApiInput):
    """``ib_send_cm_rep`` (IBA 12.6.8) or, for SIDR, ``ib_send_cm_sidr_rep`` status 0."""

    name: ClassVar[str] = "accept"
    qp: object
    params: AcceptParams


@dataclass(frozen=True, slots=True)
class Reject(ApiInput):
    """``ib_send_cm_rej`` (IBA 12.6.7) or a SIDR_REP with a non-zero status."""

    name: ClassVar[str] = "reject"
    private_data: bytes = b""
    reason: int = wcm.RejReason.CONSUMER_DEFINED
    ari: bytes = b""


@dataclass(frozen=True, slots=True)
class Establish(ApiInput):
    """``ib_send_cm_rtu`` (IBA 12.6.9)."""

    name: ClassVar[str] = "establish"
    private_data: bytes = b""


@dataclass(frozen=True, slots=True)
class SendMra(ApiInput):
    """``ib_send_cm_mra`` (IBA 12.6.6)."""

    name: ClassVar[str] = "send_mra"
    service_timeout: int
    private_data: bytes = b""


@dataclass(frozen=True, slots=True)
class Disconnect(ApiInput):
    """``ib_send_cm_dreq`` (IBA 12.6.10), or the REJ/DREP the state calls for."""

    name: ClassVar[str] = "disconnect"
    private_data: bytes = b""


@dataclass(frozen=True, slots=True)
class SendDrep(ApiInput):
    """``ib_send_cm_drep`` (IBA 12.6.11), sent at once after a DREQ is received."""

    name: ClassVar[str] = "drep"
    private_data: bytes = b""


@dataclass(frozen=True, slots=True)
class SidrResolve(ApiInput):
    """``ib_send_cm_sidr_req`` (IBA 12.11.1)."""

    name: ClassVar[str] = "sidr_resolve"
    params: SidrParams
    dialect: Dialect | None = None


@dataclass(frozen=True, slots=True)
class Listen(ApiInput):
    """``ib_cm_listen``: wait for REQs and SIDR_REQs whose Service ID matches under
    ``mask`` (IBA 12.9, Figure 150; 12.11.2); ``backlog`` bounds the half-open ones."""

    name: ClassVar[str] = "listen"
    service_id: int
    mask: int
    backlog: int
    dialect: Dialect | None = None


MsgT = TypeVar("MsgT", bound=wcm.CmMessage, covariant=True)


@dataclass(frozen=True, slots=True)
class Received(CmInput, Generic[MsgT]):
    """A CM message received on QP1: its body, the MAD's TID and the GIDs it came from
    (``src``, the peer) and to (``dst``, ours)."""

    name: ClassVar[str] = "message"
    msg: MsgT
    tid: int
    src: bytes
    dst: bytes


@dataclass(frozen=True, slots=True)
class Timeout(CmInput):
    """The id's timer ran out: retransmit or give up (IBA 12.6.5), or TimeWait ends."""

    name: ClassVar[str] = "timeout"


@dataclass(frozen=True, slots=True)
class CommEst(CmInput):
    """The QP received a packet before the RTU (IBA 12.9.7.3: communication established)."""

    name: ClassVar[str] = "comm_est"


# ---- what the machine reports (its events: softrdma.ibcm.cmid.CmEvent) -------------
class CmEventType(Enum):
    """What happened to a connection (librdmacm ``RDMA_CM_EVENT_*`` names)."""

    CONNECT_REQUEST = "CONNECT_REQUEST"  # a REQ (or SIDR_REQ) for a listener
    CONNECT_RESPONSE = "CONNECT_RESPONSE"  # a REP on an id that sends its RTU itself
    ESTABLISHED = "ESTABLISHED"  # RTU sent/received, or SIDR resolved
    REJECTED = "REJECTED"  # REJ (or SIDR_REP with a non-zero status) received
    UNREACHABLE = "UNREACHABLE"  # no answer after every retry
    CONNECT_ERROR = "CONNECT_ERROR"  # our QP could not take the REP's parameters
    DISCONNECTED = "DISCONNECTED"  # DREQ received, or DREP / DREQ timeout after our DREQ
    TIMEWAIT_EXIT = "TIMEWAIT_EXIT"  # the comm ID and QPN may be reused


@dataclass(slots=True)
class RejectInfo:
    """A rejection as the consumer sees it.

    ``reason`` is the IBA REJ reason (or, for SIDR, None and ``sidr_status`` set);
    ``ip_cm`` the A11 Table 4 ARI when the IP CM Service rejected; ``ulp_ari`` the
    RDMA-aware ULP's own ARI bytes (Table 3 layer 0x01); ``text`` one readable line.
    """

    reason: int | None
    text: str
    ari: bytes = b""
    ip_cm: IpCmReject | None = None
    ulp_ari: bytes | None = None
    sidr_status: int | None = None

    @property
    def consumer_reject(self) -> bool:
        """True for reason 28 (rdma_cm ``rdma_is_consumer_reject``)."""
        return self.reason == RejReason.CONSUMER_DEFINED
