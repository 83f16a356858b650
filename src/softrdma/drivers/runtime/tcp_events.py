"""The typed connection events (:mod:`softrdma.iwarp.events`) a
:class:`~softrdma.drivers.runtime.tcp.TcpRuntime` hands to the layer above: taken from the
listened connections under the runtime's lock (:meth:`ConnEvents.collect`), run outside it
(:meth:`ConnEvents.deliver`) by whichever thread made the progress (the progress thread,
or an application thread in ``TcpRuntime.call_local``), in the order they were taken even
when two threads deliver at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ...iwarp.engine import IwarpConn
from ...iwarp.events import ConnEvent

__all__ = ["ConnEvents"]

Listener = Callable[[ConnEvent], None]


class ConnEvents:
    """The listeners of a runtime's connections and the events taken for them."""

    def __init__(self) -> None:
        #: id(conn) -> (conn, listener); changed under the runtime's lock
        self.listeners: dict[int, tuple[IwarpConn, Listener]] = {}
        self._ready: list[tuple[Listener, ConnEvent]] = []
        self._lock = threading.Lock()
        # held while batches run, so they run in the order taken (re-entrant: a listener
        # may deliver itself)
        self._deliver_lock = threading.RLock()

    def listen(self, conn: IwarpConn, fn: Listener) -> None:
        """Under the runtime's lock: ``conn``'s events go to ``fn``."""
        self.listeners[id(conn)] = (conn, fn)

    def unlisten(self, conn: IwarpConn) -> None:
        """Under the runtime's lock: no more of ``conn``'s events (taken ones still run)."""
        self.listeners.pop(id(conn), None)

    def collect(self) -> None:
        """Under the runtime's lock: take the listened connections' events for delivery."""
        taken: list[tuple[Listener, ConnEvent]] = []
        for conn, fn in self.listeners.values():
            if conn.events:
                taken.extend((fn, ev) for ev in conn.pop_events())
        if taken:
            with self._lock:
                self._ready.extend(taken)

    def deliver(self) -> None:
        """Outside the runtime's lock: run the listeners on the events taken so far."""
        if not self._ready:
            return
        with self._deliver_lock:
            while True:
                with self._lock:
                    batch, self._ready = self._ready, []
                if not batch:
                    return
                for fn, ev in batch:
                    fn(ev)
