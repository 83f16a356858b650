"""iWARP connections of the rdma_cm API whose stream the peer closes (FIN, Terminate):
a watcher thread reports DISCONNECTED on their ids (:mod:`softrdma.cm.rdma_cm`), as
Linux's iw_cm reports ``IW_CM_EVENT_CLOSE``.

An id is watched from ESTABLISHED until it is destroyed or its connection is gone; the
thread exists only while some id is watched.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from ..iwarp.engine import ConnState

__all__ = ["CONNECTING", "watch", "unwatch"]

POLL_S = 0.005


class _Connecting:
    """Marks an iWARP id whose connect thread runs."""


CONNECTING = _Connecting()
_watched: set[Any] = set()
_watch_lock = threading.Lock()
_watch_thread: threading.Thread | None = None


def watch(cid: Any) -> None:
    """Report DISCONNECTED on ``cid`` when the peer closes its iWARP stream."""
    global _watch_thread
    with _watch_lock:
        _watched.add(cid)
        if _watch_thread is None or not _watch_thread.is_alive():
            _watch_thread = threading.Thread(target=_watch_loop, name="rdma_cm-iw-watch",
                                             daemon=True)
            _watch_thread.start()


def unwatch(cid: Any) -> None:
    with _watch_lock:
        _watched.discard(cid)


def _watch_loop() -> None:
    global _watch_thread
    gone = (ConnState.FAILED, ConnState.CLOSED)
    while True:
        with _watch_lock:
            ids = list(_watched)
            if not ids:
                _watch_thread = None
                return
        for cid in ids:
            conn = cid.iw_connection
            if conn is None or conn is CONNECTING or conn.conn.state in gone:
                unwatch(cid)
                if conn is not None and conn is not CONNECTING:
                    cid.disconnected_event()
        time.sleep(POLL_S)
