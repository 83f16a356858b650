"""Socket helpers of the TCP runtime (:mod:`.tcp`): the connection's MSS, and what is left
of a send's buffers after a partial ``sendmsg``.
"""

from __future__ import annotations

import socket
from typing import Any

__all__ = ["tcp_mss", "advance"]


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
