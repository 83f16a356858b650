"""Events and the event channel of the rdma_cm-style API (librdmacm ``rdma_cma.h``).

:class:`RdmaCmEventType` has the numbering of ``enum rdma_cm_event_type`` (ADDR_RESOLVED
0 ... TIMEWAIT_EXIT 15), :class:`ConnParam` is ``struct rdma_conn_param``,
:class:`UdParam` ``struct rdma_ud_param``. :class:`EventChannel` is
``struct rdma_event_channel``: events of every id created on it, in arrival order,
through a blocking :meth:`~EventChannel.get_cm_event`, a descriptor that polls readable
while events are pending (:meth:`~EventChannel.fileno`, ``rdma_event_channel.fd``) or
``await channel.next_event()``. Events are queued by the connection managers (the IB CM's
event delivery, or iWARP connection threads) and never run application code.
"""

from __future__ import annotations

import asyncio
import logging
import select
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Generic, Self, TypeVar

from ..drivers.eventpipe import EventPipe
from ..errors import ClosedError
from ..ibcm.events import RejectInfo

#: the id an event is about: :class:`softrdma.cm.rdma_cm.CmId`, which binds it
#: (``rdma_cm.EventChannel``, ``rdma_cm.RdmaCmEvent``); the queue itself only compares ids
IdT = TypeVar("IdT")

__all__ = [
    "RdmaCmEventType", "ConnParam", "UdParam", "RdmaCmEvent", "EventChannel", "event_str",
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
        self._q: deque[RdmaCmEvent[IdT]] = deque()
        self._cv = threading.Condition()
        self._bell = EventPipe()
        self.closed = False
        self.unacked = 0

    def post(self, ev: RdmaCmEvent[IdT]) -> None:
        if _CM_LOG.isEnabledFor(logging.DEBUG):  # SOFTRDMA_TRACE=cm (softrdma.trace)
            _CM_LOG.debug("rdma_cm %s (id %s -> %s)", ev.text, getattr(ev.id, "local_addr",
                                                                         None),
                          getattr(ev.id, "peer_addr", None))
        with self._cv:
            if self.closed:
                return
            self._q.append(ev)
            self._bell.wake()
            self._cv.notify_all()

    def _pop(self) -> RdmaCmEvent[IdT] | None:
        """The next event, or None; :class:`ClosedError` once the channel is destroyed."""
        if self.closed:
            raise ClosedError("the event channel is destroyed")
        with self._cv:
            if not self._q:
                return None
            ev = self._q.popleft()
            self._bell.take()
            self.unacked += 1
            return ev

    def drop_for(self, cid: IdT) -> list[IdT]:
        """``rdma_destroy_id`` of ``cid``: drop the events still queued about it (Linux
        ``ucma_cleanup_events``), so a destroyed id and what it holds are not kept alive
        by events nobody will read. Returns the children of its dropped CONNECT_REQUESTs
        (the caller destroys them, as ucma does for a listener's pending requests)."""
        with self._cv:
            keep: deque[RdmaCmEvent[IdT]] = deque()
            children: list[IdT] = []
            for ev in self._q:
                if ev.id is cid:
                    continue
                if ev.listen_id is cid:
                    children.append(ev.id)
                    continue
                keep.append(ev)
            dropped = len(self._q) - len(keep)
            self._q = keep
            if dropped:
                self._bell.take(dropped)
        return children

    def pending(self) -> int:
        """Events waiting to be taken."""
        return len(self._q)

    def get_cm_event(self, timeout: float | None = None) -> RdmaCmEvent[IdT]:
        """``rdma_get_cm_event``: the next event; :class:`TimeoutError` after ``timeout``
        seconds (None: wait for ever)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            ev = self._pop()
            if ev is not None:
                return ev
            with self._cv:
                if self._q:
                    continue
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError("no rdma_cm event")
                self._cv.wait(0.5 if left is None else min(left, 0.5))

    def ack(self, event: RdmaCmEvent[IdT]) -> None:
        """``rdma_ack_cm_event`` (nothing to release; counts unacked events)."""
        if self.unacked > 0:
            self.unacked -= 1

    ack_cm_event = ack

    def fileno(self) -> int:
        """A descriptor readable while events are pending (``channel->fd``)."""
        return self._bell.r

    def poll(self, timeout: float) -> bool:
        """True if an event is pending within ``timeout`` seconds."""
        if self._q:
            return True
        select.select([self._bell.r], [], [], timeout)
        return bool(self._q)

    async def next_event(self) -> RdmaCmEvent[IdT]:
        """The asyncio form of :meth:`get_cm_event`."""
        loop = asyncio.get_running_loop()
        while True:
            ev = self._pop()
            if ev is not None:
                return ev
            fut: asyncio.Future[None] = loop.create_future()

            def ready(f: asyncio.Future[None] = fut) -> None:
                if not f.done():
                    f.set_result(None)
            loop.add_reader(self._bell.r, ready)
            try:
                if not self._q:
                    await fut
            finally:
                loop.remove_reader(self._bell.r)

    def take_events_of(self, cm_id: object) -> list[RdmaCmEvent[IdT]]:
        """Remove and return the pending events of ``cm_id`` (``rdma_migrate_id``)."""
        with self._cv:
            mine = [ev for ev in self._q if ev.id is cm_id or ev.listen_id is cm_id]
            if mine:
                self._q = deque(ev for ev in self._q if not (ev.id is cm_id
                                                              or ev.listen_id is cm_id))
                self._bell.take(len(mine))
            return mine

    def close(self) -> None:
        """``rdma_destroy_event_channel``."""
        with self._cv:
            if self.closed:
                return
            self.closed = True
            self._q.clear()
            self._cv.notify_all()
        self._bell.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
