"""Ports for the tests' devices and tools: below the kernel's ephemeral range, a block of
them for each pytest-xdist worker.

A port that ``bind(("127.0.0.1", 0))`` hands out lies in the ephemeral range
(``net.ipv4.ip_local_port_range``, 32768-60999 by default), the same range from which the
kernel picks the local port of every outgoing connection on the machine. Between the
pick and a tool's own ``bind``, another process's ``connect`` may take the port: a fresh
clone's suite once failed in ``tests/drivers/test_reuseport_death.py`` with
"rc-pingpong: Couldn't listen to port 57366: Address already in use". No ``connect`` ever
takes a port below the range.

:func:`free_port` therefore hands out ports from a block of this process's own
(:data:`BLOCK` ports from :data:`BASE`, one block per xdist worker ``gwN``; another
process, such as a benchmark, takes one of two blocks after them by its process ID), in
turn from an offset set by the process ID and wrapping around, each one free when handed
out (:func:`port_free`: UDP and TCP on 127.0.0.1, 127.0.0.2, a RoCE device's peer address
on the loopback, and ``::1``). The tools' default ports are never handed out.
``bench/run.py`` takes its ports from 20000 up, checked by :func:`port_free` too.
"""

from __future__ import annotations

import errno
import os
import socket

__all__ = ["free_port", "port_free", "BASE", "BLOCK"]

BASE = 10000
BLOCK = 1000
_WORKER_BLOCKS = 8  # gw0 .. gw7 (gw8 shares gw0's block, still checked port by port)
#: the rdma-core tools' default ports (perftest, the pingpongs: 18515) and ours
_DEFAULTS = frozenset({18515})

_next: int | None = None


def _block() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and worker[2:].isdigit():
        return int(worker[2:]) % _WORKER_BLOCKS
    return _WORKER_BLOCKS + os.getpid() % 2


def port_free(port: int) -> bool:
    """True if ``port`` can be bound now: UDP and TCP (as a listener would, with
    SO_REUSEADDR) on 127.0.0.1 and 127.0.0.2, UDP and TCP on ``::1`` where IPv6 is on."""
    for family, addrs in ((socket.AF_INET, ("127.0.0.1", "127.0.0.2")),
                          (socket.AF_INET6, ("::1",))):
        for addr in addrs:
            for kind in (socket.SOCK_DGRAM, socket.SOCK_STREAM):
                try:
                    sock = socket.socket(family, kind)
                except OSError:  # no IPv6 in this kernel
                    break
                with sock:
                    if kind == socket.SOCK_STREAM:
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    try:
                        sock.bind((addr, port))
                    except OSError as exc:
                        if exc.errno == errno.EADDRNOTAVAIL:  # IPv6 off: ::1 absent
                            break
                        return False
    return True


def free_port() -> int:
    """The next port of this process's block that is free now (see the module
    docstring); RuntimeError if none of the block is."""
    global _next
    first = BASE + _block() * BLOCK
    if _next is None:  # a process a test starts may share the block: start elsewhere
        _next = os.getpid() * 7 % BLOCK
    for _ in range(BLOCK):
        port = first + _next
        _next = (_next + 1) % BLOCK
        if port not in _DEFAULTS and port_free(port):
            return port
    raise RuntimeError(f"no free port in {first}-{first + BLOCK - 1}")
