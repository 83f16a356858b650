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

__all__ = ["udp_bound_count", "udp_bound_count_diag", "udp_bound_count_proc"]

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLMSG_ERROR = 2
NLMSG_DONE = 3
NLM_F_REQUEST = 0x01
NLM_F_DUMP = 0x300
ALL_STATES = 0xFFFFFFFF  # a bound UDP socket is TCP_CLOSE, a connected one ESTABLISHED

_NLMSGHDR = struct.Struct("=IHHII")
# struct inet_diag_req_v2: family, protocol, ext, pad, states; then struct
# inet_diag_sockid: sport, dport (big-endian), src[16], dst[16], if, cookie[2]
_REQ = struct.Struct("=BBBBI")
_SOCKID = struct.Struct(">HH16s16s")
_SOCKID_TAIL = struct.Struct("=III")
# struct inet_diag_msg: family, state, timer, retrans, then the inet_diag_sockid
_MSG_HEAD = struct.Struct("=BBBB")
_MSG_MIN = _MSG_HEAD.size + _SOCKID.size + _SOCKID_TAIL.size
PROC_TRIES = 5


def _align(n: int) -> int:
    return (n + 3) & ~3


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
            seq = 1
            sock.send(_NLMSGHDR.pack(_NLMSGHDR.size + len(body), SOCK_DIAG_BY_FAMILY,
                                     NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + body)
            count = 0
            while True:
                data = sock.recv(1 << 16)
                if not data:
                    return None
                off = 0
                while off + _NLMSGHDR.size <= len(data):
                    ln, typ, _flags, mseq, _pid = _NLMSGHDR.unpack_from(data, off)
                    if ln < _NLMSGHDR.size or off + ln > len(data):
                        return None
                    if mseq == seq:
                        if typ == NLMSG_DONE:
                            return count
                        if typ == NLMSG_ERROR:
                            return None
                        if typ == SOCK_DIAG_BY_FAMILY and ln - _NLMSGHDR.size >= _MSG_MIN:
                            at = off + _NLMSGHDR.size + _MSG_HEAD.size
                            sport, _dport, src, _dst = _SOCKID.unpack_from(data, at)
                            if sport == port and src[: len(ip)] == ip:
                                count += 1
                    off += _align(ln)
        except OSError:
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
