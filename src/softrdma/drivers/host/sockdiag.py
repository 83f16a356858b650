"""How many UDP sockets are bound to one address and port: the members of a reuseport group.

devd compares the kernel's count with its own mirror of each group before it lets a
client on the direct receive path (``drivers.devd.qpn``), so the count must be a
snapshot. The kernel's socket diagnostics give one: a ``SOCK_DIAG_BY_FAMILY`` dump
(sock_diag(7)) of UDP sockets filtered on the local port walks the one hash slot that
holds every socket bound to that port under the slot's lock (Linux ``udp_dump``), so a
group's members arrive together, whatever other sockets come and go meanwhile.

``/proc/net/udp`` is only the fallback (no ``NETLINK_SOCK_DIAG``, or no UDP diagnostics
in the kernel): it is a ``seq_file`` read a page at a time, and each read starts again
by position, so sockets created or closed elsewhere between two reads shift the lines
and can drop or repeat those of the group (a miscount made devd refuse a client the
direct path now and then while other processes churned their sockets). The fallback
therefore reads the file until two reads agree.
"""

from __future__ import annotations

import socket
import struct
import sys
from pathlib import Path

from . import netlink

__all__ = ["udp_bound_count", "udp_bound_count_diag", "udp_bound_count_proc"]

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
ALL_STATES = 0xFFFFFFFF  # a bound UDP socket is TCP_CLOSE, a connected one ESTABLISHED

# struct inet_diag_req_v2: family, protocol, ext, pad, states; then struct
# inet_diag_sockid: sport, dport (big-endian), src[16], dst[16], if, cookie[2]
_REQ = struct.Struct("=BBBBI")
_SOCKID = struct.Struct(">HH16s16s")
_SOCKID_TAIL = struct.Struct("=III")
# struct inet_diag_msg: family, state, timer, retrans, then the inet_diag_sockid
_MSG_HEAD = struct.Struct("=BBBB")
_MSG_MIN = _MSG_HEAD.size + _SOCKID.size + _SOCKID_TAIL.size
PROC_TRIES = 5


def udp_bound_count_diag(ip: bytes, port: int) -> int | None:
    """The count from a sock_diag dump (one consistent pass over the port's hash slot);
    None where the kernel offers no UDP socket diagnostics or the reply is cut short."""
    family = socket.AF_INET if len(ip) == 4 else socket.AF_INET6
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG)
    except OSError:
        return None
    with sock:
        try:
            sock.bind((0, 0))
            body = (_REQ.pack(family, socket.IPPROTO_UDP, 0, 0, ALL_STATES)
                    + _SOCKID.pack(port, 0, b"", b"") + _SOCKID_TAIL.pack(0, 0xFFFFFFFF,
                                                                        0xFFFFFFFF))
            count = 0
            for typ, msg in netlink.dump(sock, SOCK_DIAG_BY_FAMILY, body):
                if typ == SOCK_DIAG_BY_FAMILY and len(msg) >= _MSG_MIN:
                    sport, _dport, src, _dst = _SOCKID.unpack_from(msg, _MSG_HEAD.size)
                    if sport == port and src[: len(ip)] == ip:
                        count += 1
            return count
        except OSError:  # netlink.DumpError and DumpTruncated included
            return None


def _proc_count(ip: bytes, port: int) -> int | None:
    words = (ip[i : i + 4] for i in range(0, len(ip), 4))
    want = "".join(f"{int.from_bytes(w, sys.byteorder):08X}" for w in words) + f":{port:04X}"
    try:
        text = Path(f"/proc/net/{'udp' if len(ip) == 4 else 'udp6'}").read_text()
    except OSError:
        return None
    return sum(1 for line in text.splitlines()[1:] if line.split()[1:2] == [want])


def udp_bound_count_proc(ip: bytes, port: int) -> int | None:
    """The count from ``/proc/net/udp`` or ``udp6`` (proc(5): each 32-bit word of the
    address in host byte order, the port in hex), read until two reads agree (at most
    :data:`PROC_TRIES` reads; then the last); None if unreadable."""
    last = _proc_count(ip, port)
    for _ in range(PROC_TRIES - 1):
        if last is None:
            return None
        now = _proc_count(ip, port)
        if now == last:
            return now
        last = now
    return last


def udp_bound_count(ip: bytes, port: int) -> int | None:
    """How many UDP sockets of this network namespace are bound to ``ip``:``port``: from
    sock_diag, else from ``/proc``; None if neither can tell."""
    got = udp_bound_count_diag(ip, port)
    return got if got is not None else udp_bound_count_proc(ip, port)
