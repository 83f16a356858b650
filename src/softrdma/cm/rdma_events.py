"""Events and the event channel of the rdma_cm-style API (librdmacm ``rdma_cma.h``).

:class:`RdmaCmEventType` has the numbering of ``enum rdma_cm_event_type`` (ADDR_RESOLVED
0 ... TIMEWAIT_EXIT 15), :class:`ConnParam` is ``struct rdma_conn_param``,
:class:`UdParam` ``struct rdma_ud_param``. :class:`EventChannel` is
``struct rdma_event_channel``: events of every id created on it, in arrival order,
through a blocking :meth:`~EventChannel.get_cm_event`, a descriptor that polls readable
while events are pending (:meth:`~EventChannel.fileno`, ``rdma_event_channel.fd``) or
``await channel.next_event()``. Events are queued by the connection managers (the IB CM's
event delivery, or iWARP connection threads) and never run application code. The queue,
its locks and its waits are :class:`softrdma.drivers.cm.cm_channel.EventQueue`; this module
says which events it holds and which leave it with their id.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Generic, Self, TypeVar

from ..drivers.cm.cm_channel import EventQueue
from ..errors import InvalidArgument
from ..ibcm.events import RejectInfo
from ..verbs._args import u32, uint

#: the id an event is about: :class:`softrdma.cm.rdma_cm.CmId`, which binds it
#: (``rdma_cm.EventChannel``, ``rdma_cm.RdmaCmEvent``); the queue itself only compares ids
IdT = TypeVar("IdT")

__all__ = [
    "RdmaCmEventType", "ConnParam", "checked_conn_param", "checked_private_data", "UdParam",
    "RdmaCmEvent", "EventChannel", "event_str",
    "RDMA_CM_EVENT_ADDR_RESOLVED", "RDMA_CM_EVENT_ADDR_ERROR", "RDMA_CM_EVENT_ROUTE_RESOLVED",
    "RDMA_CM_EVENT_ROUTE_ERROR", "RDMA_CM_EVENT_CONNECT_REQUEST",
    "RDMA_CM_EVENT_CONNECT_RESPONSE", "RDMA_CM_EVENT_CONNECT_ERROR",
    "RDMA_CM_EVENT_UNREACHABLE", "RDMA_CM_EVENT_REJECTED", "RDMA_CM_EVENT_ESTABLISHED",
    "RDMA_CM_EVENT_DISCONNECTED", "RDMA_CM_EVENT_DEVICE_REMOVAL",
    "RDMA_CM_EVENT_MULTICAST_JOIN", "RDMA_CM_EVENT_MULTICAST_ERROR",
    "RDMA_CM_EVENT_ADDR_CHANGE", "RDMA_CM_EVENT_TIMEWAIT_EXIT",
]


class RdmaCmEventType(IntEnum):
    """``enum rdma_cm_event_type`` (librdmacm ``rdma_cma.h``), same values."""

    ADDR_RESOLVED = 0
    ADDR_ERROR = 1
    ROUTE_RESOLVED = 2
    ROUTE_ERROR = 3
    CONNECT_REQUEST = 4
    CONNECT_RESPONSE = 5
    CONNECT_ERROR = 6
    UNREACHABLE = 7
    REJECTED = 8
    ESTABLISHED = 9
    DISCONNECTED = 10
    DEVICE_REMOVAL = 11
    MULTICAST_JOIN = 12
    MULTICAST_ERROR = 13
    ADDR_CHANGE = 14
    TIMEWAIT_EXIT = 15


RDMA_CM_EVENT_ADDR_RESOLVED = RdmaCmEventType.ADDR_RESOLVED
RDMA_CM_EVENT_ADDR_ERROR = RdmaCmEventType.ADDR_ERROR
RDMA_CM_EVENT_ROUTE_RESOLVED = RdmaCmEventType.ROUTE_RESOLVED
RDMA_CM_EVENT_ROUTE_ERROR = RdmaCmEventType.ROUTE_ERROR
RDMA_CM_EVENT_CONNECT_REQUEST = RdmaCmEventType.CONNECT_REQUEST
RDMA_CM_EVENT_CONNECT_RESPONSE = RdmaCmEventType.CONNECT_RESPONSE
RDMA_CM_EVENT_CONNECT_ERROR = RdmaCmEventType.CONNECT_ERROR
RDMA_CM_EVENT_UNREACHABLE = RdmaCmEventType.UNREACHABLE
RDMA_CM_EVENT_REJECTED = RdmaCmEventType.REJECTED
RDMA_CM_EVENT_ESTABLISHED = RdmaCmEventType.ESTABLISHED
RDMA_CM_EVENT_DISCONNECTED = RdmaCmEventType.DISCONNECTED
RDMA_CM_EVENT_DEVICE_REMOVAL = RdmaCmEventType.DEVICE_REMOVAL
RDMA_CM_EVENT_MULTICAST_JOIN = RdmaCmEventType.MULTICAST_JOIN
RDMA_CM_EVENT_MULTICAST_ERROR = RdmaCmEventType.MULTICAST_ERROR
RDMA_CM_EVENT_ADDR_CHANGE = RdmaCmEventType.ADDR_CHANGE
RDMA_CM_EVENT_TIMEWAIT_EXIT = RdmaCmEventType.TIMEWAIT_EXIT


def event_str(event: int) -> str:
    """``rdma_event_str``: ``RDMA_CM_EVENT_ESTABLISHED`` etc."""
    try:
        return "RDMA_CM_EVENT_" + RdmaCmEventType(event).name
    except ValueError:
        return "UNKNOWN EVENT"


@dataclass(slots=True)
class ConnParam:
    """``struct rdma_conn_param``. On RoCE the REQ carries the A11 IP CM header before
    ``private_data`` (at most 56 bytes then); on iWARP it travels in the MPA frame.
    ``responder_resources``/``initiator_depth`` become the REQ fields (RoCE) or the MPA
    IRD/ORD (iWARP). ``qkey`` is for a UD (``RDMA_PS_UDP``) accept."""

    private_data: bytes = b""
    responder_resources: int = 1
    initiator_depth: int = 1
    flow_control: int = 0
    retry_count: int = 7
    rnr_retry_count: int = 7
    srq: int = 0
    qp_num: int = 0
    qkey: int | None = None


#: ``struct rdma_conn_param``'s integer fields and the largest values of their C types
#: (``uint8_t``, ``qp_num`` a ``uint32_t``): what librdmacm can be given. Retry counts
#: above 7 are taken as 7 later, as the kernel does; the transports check the rest.
_CONN_INTS = (("responder_resources", 0xFF), ("initiator_depth", 0xFF),
              ("flow_control", 0xFF), ("retry_count", 0xFF), ("rnr_retry_count", 0xFF),
              ("srq", 0xFF), ("qp_num", 0xFFFFFFFF))


def checked_conn_param(param: object) -> ConnParam:
    """``param`` if it is a :class:`ConnParam` (None: the defaults) whose fields have
    their C types' values; else :class:`InvalidArgument` naming the argument or field."""
    if param is None:
        return ConnParam()
    if not isinstance(param, ConnParam):
        raise InvalidArgument("param", f"expected a ConnParam, got {type(param).__name__}")
    checked_private_data(param.private_data, "param.private_data")
    for name, top in _CONN_INTS:
        uint(getattr(param, name), top, f"param.{name}")
    if param.qkey is not None:
        u32(param.qkey, "param.qkey")
    return param


def checked_private_data(data: object, argument: str) -> None:
    """Private data is bytes (``bytes(5)`` would send five zero bytes); else
    :class:`InvalidArgument` naming ``argument``."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InvalidArgument(argument, f"expected bytes, got {type(data).__name__}")


@dataclass(slots=True)
class UdParam:
    """``struct rdma_ud_param``: where a resolved UD service is (SIDR answer)."""

    qp_num: int
    qkey: int
    ah_attr: Any
    private_data: bytes = b""


@dataclass(slots=True, eq=False)
class RdmaCmEvent(Generic[IdT]):
    """``struct rdma_cm_event``. ``status``: 0, the IB REJ reason (RoCE REJECTED, the
    SIDR status for UD), or a negative errno (``-ECONNREFUSED`` for an iWARP refusal,
    ``-ETIMEDOUT`` for UNREACHABLE), as librdmacm reports them. ``reject`` holds the
    readable cause (IB reason, A11 ARI, MPA refusal)."""

    event: RdmaCmEventType
    id: IdT
    listen_id: IdT | None = None
    status: int = 0
    private_data: bytes = b""
    param: ConnParam | None = None
    ud: UdParam | None = None
    reject: RejectInfo | None = None
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def text(self) -> str:
        """``RDMA_CM_EVENT_REJECTED: <why>`` style line."""
        name = event_str(self.event)
        if self.reject is not None:
            return f"{name}: {self.reject.text}"
        if self.status:
            return f"{name} (status {self.status})"
        return name

    def __repr__(self) -> str:
        return f"<RdmaCmEvent {self.text}>"


_CM_LOG = logging.getLogger("softrdma.cm")


class EventChannel(Generic[IdT]):
    """``rdma_create_event_channel``: the queue the events of its ids go to (created as
    :class:`softrdma.cm.rdma_cm.EventChannel`, whose ids are :class:`~.rdma_cm.CmId`)."""

    def __init__(self) -> None:
        self._queue: EventQueue[RdmaCmEvent[IdT]] = EventQueue()
        self.unacked = 0

    @property
    def closed(self) -> bool:
        """``rdma_destroy_event_channel`` was called."""
        return self._queue.closed

    def post(self, ev: RdmaCmEvent[IdT]) -> None:
        if _CM_LOG.isEnabledFor(logging.DEBUG):  # SOFTRDMA_TRACE=cm (softrdma.trace)
            _CM_LOG.debug("rdma_cm %s (id %s -> %s)", ev.text, getattr(ev.id, "local_addr",
                                                                         None),
                          getattr(ev.id, "peer_addr", None))
        self._queue.put(ev)

    def _pop(self) -> RdmaCmEvent[IdT] | None:
        """The next event, or None; :class:`~softrdma.errors.ClosedError` once the channel
        is destroyed."""
        ev = self._queue.pop()
        if ev is not None:
            self.unacked += 1
        return ev

    def drop_for(self, cid: IdT) -> list[IdT]:
        """``rdma_destroy_id`` of ``cid``: drop the events still queued about it (Linux
        ``ucma_cleanup_events``), so a destroyed id and what it holds are not kept alive
        by events nobody will read. Returns the children of its dropped CONNECT_REQUESTs
        (the caller destroys them, as ucma does for a listener's pending requests)."""
        dropped = self._queue.remove_if(lambda ev: ev.id is cid or ev.listen_id is cid)
        return [ev.id for ev in dropped if ev.id is not cid]

    def pending(self) -> int:
        """Events waiting to be taken."""
        return len(self._queue)

    def get_cm_event(self, timeout: float | None = None) -> RdmaCmEvent[IdT]:
        """``rdma_get_cm_event``: the next event; :class:`TimeoutError` after ``timeout``
        seconds (None: wait for ever), :class:`~softrdma.errors.ClosedError` once the
        channel is destroyed."""
        ev = self._queue.get(timeout)
        self.unacked += 1
        return ev

    def ack(self, event: RdmaCmEvent[IdT]) -> None:
        """``rdma_ack_cm_event`` (nothing to release; counts unacked events)."""
        if self.unacked > 0:
            self.unacked -= 1

    ack_cm_event = ack

    def fileno(self) -> int:
        """A descriptor readable while events are pending (``channel->fd``)."""
        return self._queue.fileno()

    def poll(self, timeout: float) -> bool:
        """True if an event is pending within ``timeout`` seconds."""
        return self._queue.poll(timeout)

    async def next_event(self) -> RdmaCmEvent[IdT]:
        """The asyncio form of :meth:`get_cm_event`."""
        ev = await self._queue.next()
        self.unacked += 1
        return ev

    def take_events_of(self, cm_id: object) -> list[RdmaCmEvent[IdT]]:
        """Remove and return the pending events of ``cm_id`` (``rdma_migrate_id``)."""
        return self._queue.remove_if(lambda ev: ev.id is cm_id or ev.listen_id is cm_id)

    def close(self) -> None:
        """``rdma_destroy_event_channel``."""
        self._queue.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
