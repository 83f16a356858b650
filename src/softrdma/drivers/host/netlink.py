"""One netlink dump (netlink(7)): a request with ``NLM_F_DUMP`` and its multipart reply,
read until ``NLMSG_DONE``. The rtnetlink neighbour table (:mod:`.neigh`) and the socket
diagnostics (:mod:`.sockdiag`) both read the kernel this way."""

from __future__ import annotations

import errno
import os
import socket
import struct
import time
from collections.abc import Iterator

__all__ = ["NLMSG_ERROR", "NLMSG_DONE", "NLM_F_REQUEST", "NLM_F_DUMP", "NLMSGHDR", "align",
           "DumpError", "DumpTruncated", "dump"]

NLMSG_ERROR = 2
NLMSG_DONE = 3
NLM_F_REQUEST = 0x01
NLM_F_DUMP = 0x300
NLMSGHDR = struct.Struct("=IHHII")  # struct nlmsghdr: length, type, flags, seq, pid


def align(n: int) -> int:
    """``NLMSG_ALIGN`` / ``RTA_ALIGN``: ``n`` rounded up to 4 octets."""
    return (n + 3) & ~3


class DumpError(OSError):
    """The kernel answered the dump with ``NLMSG_ERROR`` (its errno)."""


class DumpTruncated(OSError):
    """The reply ended inside a message (or the socket returned nothing)."""

    def __init__(self) -> None:
        super().__init__(errno.EPROTO, "netlink dump reply cut short")


def dump(sock: socket.socket, msg_type: int, body: bytes) -> Iterator[tuple[int, bytes]]:
    """Send a dump request of ``msg_type`` with ``body`` on ``sock`` (bound) and yield
    ``(type, payload)`` for each message of its reply, until ``NLMSG_DONE``. Raises
    :class:`DumpError` for an ``NLMSG_ERROR`` answer, :class:`DumpTruncated` for a message
    cut short (what was yielded before stands), ``OSError`` from the socket."""
    seq = int(time.monotonic_ns() & 0x7FFFFFFF)
    sock.send(NLMSGHDR.pack(NLMSGHDR.size + len(body), msg_type, NLM_F_REQUEST | NLM_F_DUMP,
                            seq, 0) + body)
    hl = NLMSGHDR.size
    while True:
        data = sock.recv(1 << 16)
        if not data:
            raise DumpTruncated()
        off = 0
        while off + hl <= len(data):
            ln, typ, _flags, mseq, _pid = NLMSGHDR.unpack_from(data, off)
            if ln < hl or off + ln > len(data):
                raise DumpTruncated()
            if mseq == seq:
                if typ == NLMSG_DONE:
                    return
                if typ == NLMSG_ERROR:
                    code = -struct.unpack_from("=i", data, off + hl)[0]
                    raise DumpError(code, os.strerror(code) if code > 0 else "netlink error")
                yield typ, data[off + hl : off + ln]
            off += align(ln)
