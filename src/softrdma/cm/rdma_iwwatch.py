"""iWARP connections of the rdma_cm API whose stream ends (the peer's FIN or Terminate, or
a fault): DISCONNECTED is reported on their ids (:mod:`softrdma.cm.rdma_cm`), as Linux's
iw_cm reports ``IW_CM_EVENT_CLOSE``.

An id is watched from ESTABLISHED until it is destroyed or its connection ends. Watching
subscribes to the connection's typed events (:class:`~softrdma.iwarp.events.Closed`,
:class:`~softrdma.iwarp.events.Terminated`, :class:`~softrdma.iwarp.events.Failed`), which
the TCP runtime delivers outside its lock; nothing polls.
"""

from __future__ import annotations

from typing import Any

from ..iwarp.events import Closed, ConnEvent, Failed, Terminated

__all__ = ["CONNECTING", "watch", "unwatch"]

_END_EVENTS = (Closed, Terminated, Failed)


class _Connecting:
    """Marks an iWARP id whose connect thread runs."""


CONNECTING = _Connecting()


def watch(cid: Any) -> None:
    """Report DISCONNECTED on ``cid`` when its iWARP stream ends."""
    conn = cid.iw_connection
    if conn is None or conn is CONNECTING:
        return
    engine_conn = conn.conn

    def on_event(ev: ConnEvent) -> None:
        if isinstance(ev, _END_EVENTS):
            conn.runtime.unlisten_events(engine_conn)
            cid.disconnected_event()

    conn.runtime.listen_events(engine_conn, on_event)


def unwatch(cid: Any) -> None:
    """Stop watching ``cid`` (it is destroyed)."""
    conn = cid.iw_connection
    if conn is None or conn is CONNECTING:
        return
    conn.runtime.unlisten_events(conn.conn)
