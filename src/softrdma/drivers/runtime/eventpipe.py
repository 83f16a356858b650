"""The readable descriptor of an event queue (``ibv_comp_channel.fd``,
``rdma_event_channel.fd``): the progress core's :class:`~.progress.WakePipe` holding one
byte per queued event, so that ``poll``/``select``/asyncio see the queue's events
without reading them.

Used by :class:`softrdma.verbs.cq.CompChannel` and
:class:`softrdma.cm.rdma_events.EventChannel`.
"""

from __future__ import annotations

import os

from .progress import WakePipe

__all__ = ["EventPipe"]


class EventPipe(WakePipe):
    """A :class:`WakePipe` rung once per queued event (:meth:`wake`; a full pipe loses
    nothing: the owner's queue holds the event and the descriptor is readable anyway)
    and read once per event taken (:meth:`take`)."""

    __slots__ = ()

    def take(self, n: int = 1) -> None:
        """``n`` events left the queue (fewer bytes may be there: taken is taken)."""
        try:
            os.read(self.r, n)
        except OSError:
            pass
