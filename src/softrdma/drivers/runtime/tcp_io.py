"""Socket helpers of the TCP runtime (:mod:`.tcp`): the connection's MSS, what is left
of a send's buffers after a partial ``sendmsg``, and the runtime's record of each socket.
"""

from __future__ import annotations

import selectors
import socket
from collections.abc import Callable
from typing import Any

from ...iwarp.engine import IwarpConn
from ...iwarp.mpa_stream import StallWatch

__all__ = ["tcp_mss", "advance", "Sock", "Watch"]


def tcp_mss(sock: socket.socket) -> int:
    """The connection's TCP MSS (``TCP_MAXSEG``), the MULPDU basis (RFC 5044 §4.2)."""
    try:
        mss = int(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG))
    except OSError:
        mss = 0
    return mss if mss >= 64 else 1460


def advance(bufs: list[Any], n: int) -> list[Any]:
    """What is left of ``bufs`` after the first ``n`` bytes were sent (views, no copies;
    the engine's buffers are bytes or byte-format memoryviews, so ``len`` is their size)."""
    i = 0
    for b in bufs:
        ln = len(b)
        if n < ln:
            rest = [memoryview(b)[n:]]
            rest.extend(bufs[i + 1:])
            return rest
        n -= ln
        i += 1
    return []


class Watch:
    """A listening socket handed to :meth:`TcpRuntime.watch`: ``on_ready`` runs under
    the lock when it is readable."""

    __slots__ = ("sock", "on_ready")

    def __init__(self, sock: socket.socket, on_ready: Callable[[], None]) -> None:
        self.sock = sock
        self.on_ready = on_ready


class Sock:
    """A connection's socket in the runtime: its engine, unsent buffers, state."""

    __slots__ = ("sock", "conn", "pending", "closing", "close_at", "fd", "events", "done", "eof",
                 "stall", "tx_dead")

    def __init__(self, sock: socket.socket, conn: IwarpConn) -> None:
        self.sock = sock
        self.conn = conn
        self.pending: list[Any] = []
        self.closing = False
        self.close_at = 0.0
        self.fd = sock.fileno()
        self.events = selectors.EVENT_READ
        self.done = False
        self.eof = False
        self.stall = StallWatch()
        self.tx_dead = False  # a send failed: no more sends, the connection is ending
