"""The kernel's choice of source address for a destination (``ip route get DST``).

rdma_cm resolves an address through the routing table (Linux ``rdma_resolve_addr`` ->
``rdma_translate_ip``/``addr_resolve``: the route's source address names the device).
Connecting a UDP socket asks the kernel for the same route without sending anything;
its local address is the route's preferred source.
"""

from __future__ import annotations

import errno
import socket

__all__ = ["route_source"]

_DISCARD_PORT = 9  # any port: a UDP connect sends nothing


def route_source(dst: bytes) -> bytes | int:
    """The source address (4 or 16 bytes, packed) the kernel would use to reach ``dst``
    (4 or 16 bytes); the route lookup's errno if it has no route (``ENETUNREACH``,
    ``EHOSTUNREACH`` for an unreachable route...) or cannot say."""
    fam = socket.AF_INET if len(dst) == 4 else socket.AF_INET6
    try:
        with socket.socket(fam, socket.SOCK_DGRAM) as s:
            s.connect((socket.inet_ntop(fam, dst), _DISCARD_PORT))
            return socket.inet_pton(fam, str(s.getsockname()[0]).split("%", 1)[0])
    except OSError as exc:
        return exc.errno or errno.ENETUNREACH
