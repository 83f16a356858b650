"""The I/O under an rdma_cm event channel (librdmacm ``struct rdma_event_channel``): a
thread-safe queue of events whose waits block, poll or await.

:class:`softrdma.cm.rdma_events.EventChannel` holds the rdma_cm rules (which events, which
id they are about, what ``rdma_destroy_id`` and ``rdma_migrate_id`` take away); what it
queues waits here. :class:`EventQueue` is filled by the connection managers' threads (the
IB CM's event delivery, iWARP connection threads) and read by the application: a blocking
:meth:`~EventQueue.get` (``rdma_get_cm_event``), a descriptor readable while events are
pending (:meth:`~EventQueue.fileno`, ``rdma_event_channel.fd``, an
:class:`~.eventpipe.EventPipe` holding one byte per queued event, made when first asked
for), :meth:`~EventQueue.poll`
and ``await`` :meth:`~EventQueue.next`. :func:`id_lock` is the lock an rdma_cm id guards
its state moves with (the application's thread and the connection managers' both move it).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, TypeVar

from ...errors import ClosedError
from ..runtime import aio
from ..runtime.eventpipe import EventPipe
from ..runtime.fdwait import readable

if TYPE_CHECKING:
    import asyncio

__all__ = ["EventQueue", "id_lock"]

E = TypeVar("E")

#: a blocking wait re-checks the queue at least this often (s): a wait with no timeout
#: still sees a queue closed under it
_WAIT_SLICE = 0.5


def id_lock() -> threading.Lock:
    """A new lock for one rdma_cm id's state moves (:class:`softrdma.cm.rdma_cm.CmId`)."""
    return threading.Lock()


class EventQueue(Generic[E]):
    """Events in arrival order. :meth:`put` from any thread; :meth:`pop`, :meth:`get`,
    :meth:`poll`, :meth:`next` by the reader; :meth:`remove_if` takes events out of the
    middle. Once :meth:`close` d, :meth:`put` drops and the reads raise
    :class:`~softrdma.errors.ClosedError`."""

    def __init__(self) -> None:
        self._q: deque[E] = deque()
        self._cv = threading.Condition()
        #: the descriptor, made when first asked for (:meth:`_ring`): until then a
        #: blocking get() needs no byte written and read per event (issue 26)
        self._bell: EventPipe | None = None
        self.closed = False

    def _ring(self) -> EventPipe:
        """The descriptor, made now if need be with one byte per queued event (under
        the lock)."""
        bell = self._bell
        if bell is None:
            bell = self._bell = EventPipe()
            for _ in range(len(self._q)):
                bell.wake()
        return bell

    def put(self, ev: E) -> bool:
        """Queue ``ev``; False (dropped) if the queue is closed."""
        with self._cv:
            if self.closed:
                return False
            self._q.append(ev)
            if self._bell is not None:
                self._bell.wake()
            self._cv.notify_all()
            return True

    def pop(self) -> E | None:
        """The next event, or None; :class:`ClosedError` once the queue is closed."""
        if self.closed:
            raise ClosedError("the event channel is destroyed")
        with self._cv:
            if not self._q:
                return None
            ev = self._q.popleft()
            if self._bell is not None:
                self._bell.take()
            return ev

    def remove_if(self, pred: Callable[[E], bool]) -> list[E]:
        """Take out and return, in order, the queued events ``pred`` selects."""
        with self._cv:
            taken = [ev for ev in self._q if pred(ev)]
            if taken:
                self._q = deque(ev for ev in self._q if not pred(ev))
                if self._bell is not None:
                    self._bell.take(len(taken))
            return taken

    def __len__(self) -> int:
        return len(self._q)

    def get(self, timeout: float | None = None) -> E:
        """The next event, waiting for it; :class:`TimeoutError` after ``timeout``
        seconds (None: wait for ever), :class:`ClosedError` if the queue is closed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            ev = self.pop()
            if ev is not None:
                return ev
            with self._cv:
                if self._q or self.closed:
                    continue
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError("no rdma_cm event")
                self._cv.wait(_WAIT_SLICE if left is None else min(left, _WAIT_SLICE))

    def poll(self, timeout: float) -> bool:
        """True if an event is pending within ``timeout`` seconds; :class:`ClosedError`
        if the queue is closed."""
        if self._q:
            return True
        with self._cv:
            if self.closed:
                raise ClosedError("the event channel is destroyed")
            r = self._ring().r
        try:
            readable([r], timeout)
        except (OSError, ValueError):  # closed meanwhile (its descriptor is -1 or gone)
            pass
        if self.closed:
            raise ClosedError("the event channel is destroyed")
        return bool(self._q)

    async def next(self) -> E:
        """The asyncio form of :meth:`get` (no timeout: wrap it in ``asyncio.wait_for``)."""
        loop = aio.running_loop()
        while True:
            ev = self.pop()
            if ev is not None:
                return ev
            fut: asyncio.Future[None] = loop.create_future()

            def ready(f: asyncio.Future[None] = fut) -> None:
                if not f.done():
                    f.set_result(None)
            with self._cv:
                if self.closed:
                    raise ClosedError("the event channel is destroyed")
                r = self._ring().r
            loop.add_reader(r, ready)
            try:
                if not self._q:
                    await fut
            finally:
                loop.remove_reader(r)

    def fileno(self) -> int:
        """A descriptor readable while events are pending (-1 once closed)."""
        with self._cv:
            if self.closed:
                return self._bell.r if self._bell is not None else -1
            return self._ring().r

    def close(self) -> None:
        """Drop what is queued and every later event; wake the waiters."""
        with self._cv:
            if self.closed:
                return
            self.closed = True
            self._q.clear()
            self._cv.notify_all()
            bell = self._bell
        if bell is not None:
            bell.close()
