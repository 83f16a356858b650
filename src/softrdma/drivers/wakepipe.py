"""The readable descriptor of an event queue (``ibv_comp_channel.fd``,
``rdma_event_channel.fd``): a non-blocking pipe holding one byte per queued event, so
that ``poll``/``select``/asyncio see the queue's events without reading them.

One implementation for :class:`softrdma.verbs.cq.CompChannel` and
:class:`softrdma.cm.rdma_events.EventChannel`.
"""

from __future__ import annotations

import os

__all__ = ["WakePipe"]


class WakePipe:
    """A pipe whose read end is readable while its owner's queue holds events."""

    __slots__ = ("r", "w")

    def __init__(self) -> None:
        self.r, self.w = os.pipe()
        os.set_blocking(self.r, False)
        os.set_blocking(self.w, False)

    def ring(self) -> None:
        """One event was queued. A full pipe loses nothing: the owner's queue holds the
        event and the descriptor is readable anyway."""
        try:
            os.write(self.w, b"\0")
        except OSError:
            pass

    def take(self, n: int = 1) -> None:
        """``n`` events left the queue (fewer bytes may be there: taken is taken)."""
        try:
            os.read(self.r, n)
        except OSError:
            pass

    def close(self) -> None:
        for fd in (self.r, self.w):
            try:
                os.close(fd)
            except OSError:
                pass
