"""Callbacks run at their deadlines by one daemon thread: the MPA timers of iWARP
connections that are set up without a thread of their own (:mod:`.iwconnect`,
:mod:`softrdma.cm.rdma_transport`; issue 26).

:meth:`Deadlines.at` queues a callback for a monotonic time and returns a
:class:`Deadline` whose :meth:`~Deadline.cancel` is O(1): a cancelled entry stays in the
heap until its time comes. The thread sleeps until the earliest entry, so an entry
later than that one (a new connection's timer, with the same timeout as the ones before
it) wakes nobody; it starts on the first entry and ends after :data:`IDLE_S` without
any. Cancelled entries let go of their callback at once and are swept from the heap once
they are more than half of it, so memory follows the live timers. Callbacks run outside
the lock, one at a time; one that raises is logged.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import os
import threading
import time
from collections.abc import Callable

from ..runtime.threads import QuietThread

__all__ = ["Deadline", "Deadlines", "IDLE_S"]

IDLE_S = 5.0  # the thread ends after this long with no entry
_LOG = logging.getLogger("softrdma.cm")


def _nothing() -> None:
    return None


class Deadline:
    """One queued callback (:meth:`Deadlines.at`)."""

    __slots__ = ("when", "fn", "cancelled", "_owner")

    def __init__(self, when: float, fn: Callable[[], None], owner: Deadlines) -> None:
        self.when = when
        self.fn = fn
        self.cancelled = False
        self._owner = owner

    def cancel(self) -> None:
        """The callback will not run (if it has not started); what it holds is let go."""
        if not self.cancelled:
            self.cancelled = True
            self.fn = _nothing
            self._owner._cancelled_one()


class Deadlines:
    """Callbacks at monotonic times, run by one daemon thread called ``name``."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._reset()
        os.register_at_fork(after_in_child=self._reset)  # the thread is not copied

    def _reset(self) -> None:
        self._cv = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int, Deadline]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._wake_at = -math.inf  # when the waiting thread wakes (-inf: not waiting)
        self._cancelled = 0  # cancelled entries still in the heap

    def _cancelled_one(self) -> None:
        with self._cv:
            self._cancelled += 1
            heap = self._heap
            if self._cancelled > 32 and 2 * self._cancelled > len(heap):
                heap[:] = [e for e in heap if not e[2].cancelled]
                heapq.heapify(heap)
                self._cancelled = 0

    def at(self, when: float, fn: Callable[[], None]) -> Deadline:
        """Run ``fn()`` once ``time.monotonic() >= when`` (unless cancelled)."""
        d = Deadline(when, fn, self)
        with self._cv:
            heapq.heappush(self._heap, (when, next(self._seq), d))
            if self._thread is None:
                self._thread = QuietThread(target=self._main, name=self._name, daemon=True)
                self._thread.start()
            elif when < self._wake_at:
                self._cv.notify()
        return d

    def pending(self) -> int:
        """Entries not cancelled yet (for tests and leak checks)."""
        with self._cv:
            return sum(1 for _, _, d in self._heap if not d.cancelled)

    def _next_due(self) -> Deadline | None:
        """Under the lock: the next due entry, waiting for it; None when the thread ends."""
        heap = self._heap
        while True:
            while heap and heap[0][2].cancelled:
                heapq.heappop(heap)
                self._cancelled = max(self._cancelled - 1, 0)
            now = time.monotonic()
            if not heap:
                self._wake_at = now + IDLE_S
                self._cv.wait(IDLE_S)
                self._wake_at = -math.inf
                if not heap:
                    self._thread = None
                    return None
                continue
            when = heap[0][0]
            if when <= now:
                return heapq.heappop(heap)[2]
            self._wake_at = when
            self._cv.wait(when - now)
            self._wake_at = -math.inf

    def _main(self) -> None:
        while True:
            with self._cv:
                d = self._next_due()
            if d is None:
                return
            if d.cancelled:
                continue
            try:
                d.fn()
            except Exception:  # noqa: BLE001 - one callback never ends the others
                _LOG.exception("rdma_cm: a connection timer failed")
