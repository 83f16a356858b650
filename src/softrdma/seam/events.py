"""Typed events the transport engines emit (IBA 11.6.3 asynchronous events).

An engine never calls up into the verbs layer or the CM. It emits an
:class:`EngineEvent` into its device's :class:`EventQueue` while it runs under the
device runtime's lock; the subscribers only record it (the verbs ``Context`` queues it
and wakes its async-event descriptor), and act on it later in their own thread,
outside the engine lock (``Context.get_async_event`` resolves the engine object to its
verbs owner there). Completions go the same way: the engine hands each
:class:`~softrdma.seam.types.WorkCompletion` to its CQ's sink, which only queues it.

The event types are named by :class:`AsyncEventType`, whose values are libibverbs'
``enum ibv_event_type`` (IBA 11.6.3.1 affiliated, 11.6.3.2 unaffiliated events).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from ..enums import ibv_event_type as _E

__all__ = ["AsyncEventType", "EngineEvent", "EventListener", "EventQueue"]


class AsyncEventType(enum.IntEnum):
    """The asynchronous events an engine raises (IBA 11.6.3; values of ``ibv_event_type``)."""

    #: a CQ overran (IBA 11.6.3.1 CQ Error)
    CQ_ERR = int(_E.IBV_EVENT_CQ_ERR)
    #: a QP went to ERR on its own (IBA 11.6.3.1 Local Work Queue Catastrophic Error)
    QP_FATAL = int(_E.IBV_EVENT_QP_FATAL)
    #: the responder saw an invalid request (IBA 11.6.3.1 Invalid Request Local WQ Error)
    QP_REQ_ERR = int(_E.IBV_EVENT_QP_REQ_ERR)
    #: a remote access violation at the responder (IBA 11.6.3.1 Local Access Violation)
    QP_ACCESS_ERR = int(_E.IBV_EVENT_QP_ACCESS_ERR)
    #: the first packet arrived in RTR (IBA 11.6.3.1 Communication Established)
    COMM_EST = int(_E.IBV_EVENT_COMM_EST)
    #: the send queue drained in SQD (IBA 11.6.3.1 Send Queue Drained)
    SQ_DRAINED = int(_E.IBV_EVENT_SQ_DRAINED)
    #: the device failed (IBA 11.6.3.2 Local Catastrophic Error; no element)
    DEVICE_FATAL = int(_E.IBV_EVENT_DEVICE_FATAL)
    #: an SRQ failed (IBA 11.6.3.1 SRQ Catastrophic Error)
    SRQ_ERR = int(_E.IBV_EVENT_SRQ_ERR)
    #: an SRQ fell below its limit (IBA 10.2.9.6, 11.6.3.1 SRQ Limit Reached)
    SRQ_LIMIT_REACHED = int(_E.IBV_EVENT_SRQ_LIMIT_REACHED)
    #: a QP on an SRQ in ERR has no more WQEs (IBA 11.6.3.1 Last WQE Reached)
    QP_LAST_WQE_REACHED = int(_E.IBV_EVENT_QP_LAST_WQE_REACHED)


@dataclass(frozen=True, slots=True)
class EngineEvent:
    """One asynchronous event: its type and the engine object it is about (an engine QP
    or SRQ; None for a device event such as DEVICE_FATAL)."""

    type: AsyncEventType
    element: object | None = None


EventListener = Callable[[EngineEvent], None]


class EventQueue:
    """Where a device engine's events go: every subscriber receives each event as it is
    emitted, under the engine lock, and must only record it (append to a queue, wake a
    descriptor); the work an event causes runs later in the subscriber's own thread."""

    __slots__ = ("_listeners",)

    def __init__(self) -> None:
        self._listeners: tuple[EventListener, ...] = ()

    def subscribe(self, listener: EventListener) -> None:
        """Receive every event emitted from now on."""
        self._listeners = (*self._listeners, listener)

    def unsubscribe(self, listener: EventListener) -> None:
        """Stop receiving events (no-op for an unknown listener)."""
        self._listeners = tuple(fn for fn in self._listeners if fn != listener)

    def emit(self, event: EngineEvent) -> None:
        """Hand ``event`` to every subscriber, in subscription order."""
        for fn in self._listeners:
            fn(event)

    def raise_event(self, kind: AsyncEventType, element: object | None = None) -> None:
        """Emit ``EngineEvent(kind, element)``."""
        self.emit(EngineEvent(kind, element))
