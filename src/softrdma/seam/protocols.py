"""What a device engine and a QP engine are to the layers above them.

Both transports implement these side by side, with no inheritance between them:
:class:`~softrdma.ib.port.Port` and :class:`~softrdma.ib.qp.EngineQP` (the IB transport
over RoCE, IBA chapters 9-10), :class:`~softrdma.iwarp.qp.IwarpDevice` and
:class:`~softrdma.iwarp.qp.IwarpQP` (RDMAP/DDP/MPA, RFC 5040/5041/5044). The verbs layer
(``softrdma.verbs``) reaches an engine only through them.

A device engine (IBA 11.2.1 HCA; one port) owns:

* the memory table: registration, deregistration and lookup of memory regions by key
  (L_Key/R_Key, or STag on iWARP: RFC 5040 §2.1) (IBA 10.6);
* QP number allocation (IBA 10.2.4) and the creation of QPs and SRQs;
* deadlines and timers: ``arm`` / ``next_deadline`` / ``on_timer(now)`` (the driver owns
  the clock and calls ``on_timer`` once ``now >= next_deadline()``);
* ``events``: the :class:`~softrdma.seam.events.EventQueue` its asynchronous events go to
  (IBA 11.6.3), typed :class:`~softrdma.seam.events.EngineEvent`s;
* the GID and P_Key tables and the port counters.

A QP engine (IBA 10.2.4, 11.2.4-11.2.5) takes ``modify`` (validated attributes, IBA 11.2.5.2
state transitions), ``query``, ``post_send`` / ``post_recv`` (work requests, IBA 11.4.1),
``to_error`` (the flush of IBA 10.3.1.7) and ``destroy``; it delivers completions to
its CQs' sinks and asynchronous events to its device's event queue.

Every sans-I/O protocol core a driver runs follows one :class:`Engine` contract: the
driver feeds it input (packets, bytes, MADs, consumer requests, each with the time),
then takes what it must send with ``take_output()``, the typed events for the layer
above with ``pop_events()``, and calls ``on_timer(now)`` once ``now >=
next_deadline()``. The four engines: :class:`~softrdma.ib.port.Port` (RoCE packets,
:class:`~softrdma.seam.events.EngineEvent`), :class:`~softrdma.iwarp.engine.IwarpConn`
(MPA/DDP/RDMAP bytes, :mod:`softrdma.iwarp.events`),
:class:`~softrdma.ipoib.iface.IpoibInterface` (IPoIB datagrams and link actions) and
:class:`~softrdma.ibcm.agent.CmAgent` (CM MADs, :class:`~softrdma.ibcm.events.CmEvent`).
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from typing import Protocol, TypeVar, runtime_checkable

from .attrs import ModifyAttrs, QueryAttrs
from .events import AsyncEventType, EventQueue
from .queues import EngineSRQ, QPInit, RecvFeed
from .types import MemoryRegion, RecvWQE, SendWQE

__all__ = ["CounterSet", "DeviceEngine", "Engine", "ModifyAttrs", "QPEngine", "QueryAttrs",
           "Timed"]

_Out = TypeVar("_Out")
_Ev = TypeVar("_Ev")


@runtime_checkable
class Engine(Protocol[_Out, _Ev]):
    """The contract between a sans-I/O protocol core and its driver (see the module
    docstring). The engine never reads a clock nor touches a socket: the driver owns
    both, and any lock or thread."""

    def take_output(self) -> list[_Out]:
        """What to send (packets, bytes, MADs or link actions), oldest first; each item
        is returned once."""

    def pop_events(self) -> list[_Ev]:
        """The typed events for the layer above since the last call, oldest first."""

    def next_deadline(self) -> float | None:
        """When :meth:`on_timer` must next run (None: no timer armed)."""

    def on_timer(self, now: float) -> None:
        """Run what is due at ``now`` (the driver calls it once ``now >=
        next_deadline()``)."""


class Timed(Protocol):
    """Anything a device's ``arm`` can run: an engine QP, or another timer owner (the CM
    on QP1). ``on_timer(now)`` runs once ``now >= deadline``."""

    deadline: float | None

    def on_timer(self, now: float) -> None: ...


class CounterSet(Protocol):
    """A port's counters (``softrdma.seam.counters.Counters``; IBA 16.1.3.5 PortCounters)."""

    rcvd_bad_pkey: int
    rcvd_bad_qkey: int

    def as_dict(self) -> dict[str, int]: ...


class QPEngine(Protocol):
    """One queue pair of a device engine (see the module docstring)."""

    qpn: int
    qp_type: int
    #: the creation attributes
    init: QPInit
    #: the protection domain (the verbs PD object; IBA 10.2.3)
    pd: object
    #: a cap in bit/s on the QP's packets (``ibv_modify_qp_rate_limit``; 0.0: none)
    rate_limit_bps: float

    @property
    def state(self) -> int: ...

    @property
    def srq(self) -> EngineSRQ | None: ...

    @property
    def send_opcodes(self) -> frozenset[int] | None:
        """The ``ibv_wr_opcode`` values the transport carries; None: every IB opcode."""

    @property
    def max_read_sge(self) -> int:
        """The scatter entries an RDMA Read may have (iWARP: one sink buffer)."""

    def modify(self, attrs: ModifyAttrs, now: float) -> None: ...

    def query(self) -> QueryAttrs: ...

    def post_send(self, wqe: SendWQE, now: float) -> None: ...

    def post_recv(self, rwqe: RecvWQE) -> None: ...

    def post_recvs(self, rwqes: list[RecvWQE]) -> None: ...

    def set_recv_feed(self, feed: RecvFeed | None) -> None:
        """Take receives posted into ``feed`` too (seam.queues.RecvFeed; None: detach)."""

    def to_error(self, event: AsyncEventType | None = None) -> None: ...

    def destroy(self) -> None: ...

    def attach_mcast(self, mgid: bytes) -> None: ...

    def detach_mcast(self, mgid: bytes) -> None: ...


class DeviceEngine(Protocol):
    """One port of a device, the engine all its QPs run in (see the module docstring)."""

    gids: list[bytes]
    gid_types: list[int]
    pkeys: tuple[int, ...]
    max_mtu: int
    events: EventQueue

    @property
    def counters(self) -> CounterSet: ...

    #: the memory table by key (memory windows' regions included, IBA 10.6.7)
    mrs: dict[int, MemoryRegion]

    @property
    def mcast(self) -> Mapping[bytes, AbstractSet[object]]:
        """Multicast groups (MGID) and their member QPs (IBA 10.5.2)."""

    def alloc_qpn(self) -> int: ...

    def create_qp(self, init: QPInit) -> QPEngine: ...

    def create_srq(self, pd: object, max_wr: int, max_sge: int,
                   srq_limit: int) -> EngineSRQ: ...

    def new_key(self) -> int: ...

    def register_mr(self, buf: memoryview, addr: int, access: int, pd: object,
                    zero_based: bool = False) -> MemoryRegion: ...

    def deregister_mr(self, mr: MemoryRegion) -> None: ...

    def lookup_mr(self, key: int) -> MemoryRegion | None: ...

    def arm(self, owner: Timed) -> None: ...

    def next_deadline(self) -> float | None: ...

    def on_timer(self, now: float) -> None: ...

    def device_fatal(self) -> None: ...
