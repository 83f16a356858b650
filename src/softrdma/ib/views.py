"""The engine-facing views of a QP and of its port: what the transport engines (the
requester, completer and responder, IBA 9.7; and their helpers) read and call on the QP
they serve, and what a QP uses of its :class:`~.port.Port`.

The engines are built by :class:`~.qp.EngineQP` and the QPs by :class:`~.port.Port`;
naming those classes back would close a cycle, so each side names a narrow
:class:`typing.Protocol` of this leaf module instead (as the iWARP engine names its
connection's Protocols). :class:`~.qp.EngineQP` and :class:`~.port.Port` satisfy them
structurally; mypy checks it where the QP hands itself to its engines and where the port
hands itself to a new QP.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

from ..seam.counters import Counters, QpCounters
from ..seam.events import AsyncEventType
from ..seam.protocols import DeviceEngine
from ..seam.queues import QPInit
from ..seam.types import AddressHandle, CompletionSink, RecvWQE
from ..wire import ib as wib
from .av import AddressVector
from .packet import TxPacket

__all__ = ["AckOwner", "EnginePort", "QpPort", "QpView"]

QpT = TypeVar("QpT")


class AckOwner(Protocol):
    """A QP with a coalesced ACK pending on its port (``Port.ack_pending``), emitted when
    the driver takes the port's packets (IBA 9.7.5.1.1)."""

    #: the PSN the pending ACK acknowledges up to (-1: none pending)
    ack_psn: int

    def flush_ack(self) -> None: ...


class EnginePort(DeviceEngine, Protocol):
    """What the engines of a QP use of its port beyond the device contract
    (:class:`~softrdma.seam.protocols.DeviceEngine`): the packets out, the fast-path
    switch, the RoCEv1 flags of the GID table, the typed counters and the coalesced ACKs."""

    @property
    def fast_paths(self) -> bool: ...
    @property
    def counters(self) -> Counters: ...
    @property
    def tx(self) -> list[TxPacket]: ...
    @property
    def gid_v1(self) -> list[bool]: ...
    @property
    def ack_pending(self) -> list[AckOwner]: ...
    #: a pending ACK's peer awaits it: the runtime sends the ACKs promptly
    ack_prompt: bool


class QpPort(EnginePort, Protocol[QpT]):
    """What a QP (of type ``QpT``) uses of its port beyond its engines' view: the QP and
    multicast tables and the P_Key check (IBA 10.9.3)."""

    @property
    def mcast(self) -> dict[bytes, set[QpT]]: ...

    def add_qp(self, qp: QpT) -> None: ...

    def remove_qp(self, qp: QpT) -> None: ...

    def pkey_ok(self, pkey: int, qp_pkey: int, gsi: bool) -> bool: ...


class QpView(Protocol):
    """What the requester, completer and responder (and ``send_ops``, ``rd_atomic``) read
    and call on their QP: its attributes (IBA 11.2.5), its queues and completion sinks,
    and the few QP actions they trigger. The five plain attributes are the ones they set."""

    state: int
    deadline: float | None
    ack_psn: int
    sqd_notified: bool
    #: every request acknowledged, none posted since (Responder.schedule_ack)
    acked_ahead: bool

    @property
    def port(self) -> EnginePort: ...
    @property
    def init(self) -> QPInit: ...
    @property
    def qp_type(self) -> int: ...
    @property
    def qpn(self) -> int: ...
    @property
    def pd(self) -> object: ...
    @property
    def xrcd(self) -> object | None: ...
    @property
    def counters(self) -> QpCounters: ...

    def count(self, name: str) -> None: ...
    @property
    def complete_send(self) -> CompletionSink: ...
    @property
    def complete_recv(self) -> CompletionSink: ...
    @property
    def av(self) -> AddressVector | None: ...
    @property
    def dest_qpn(self) -> int: ...
    @property
    def qkey(self) -> int: ...
    @property
    def pkey(self) -> int: ...
    @property
    def access_flags(self) -> int: ...
    @property
    def mtu(self) -> int: ...
    @property
    def sport(self) -> int: ...
    @property
    def timeout(self) -> int: ...
    @property
    def retry_cnt(self) -> int: ...
    @property
    def rnr_retry(self) -> int: ...
    @property
    def min_rnr_timer(self) -> int: ...
    @property
    def max_rd_atomic(self) -> int: ...
    @property
    def en_sqd_async_notify(self) -> bool: ...
    @property
    def rate_limit_bps(self) -> float: ...
    @property
    def fast_rc(self) -> bool: ...
    @property
    def fast_post(self) -> bool: ...
    @property
    def fast_pkey(self) -> int: ...

    def take_rwqe(self) -> RecvWQE | None: ...

    def return_rwqe(self, rwqe: RecvWQE) -> None: ...

    def bind_srq(self, pkt: wib.IBPacket) -> bool: ...

    def tx(self, parts: list[bytes | bytearray | memoryview], length: int,
           av: AddressHandle | None = None) -> None: ...

    def set_deadline(self, t: float | None) -> None: ...

    def to_error(self, event: AsyncEventType | None = None) -> None: ...

    def flush_ack(self) -> None: ...
