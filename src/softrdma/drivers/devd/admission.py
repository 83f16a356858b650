"""Admission of devd clients under a file-descriptor budget.

Each devd client costs the daemon two descriptors (its control connection and its end of
the data channel). A process that opens control connections without end must not make
the daemon fail for everyone (``accept``/``socketpair`` failing with EMFILE or ENFILE
would otherwise escape the loop and stop every process's data path):

* at start the soft ``RLIMIT_NOFILE`` is raised to the hard limit (:func:`raise_nofile`);
* one uid may hold at most half of the descriptor budget (:func:`per_uid_cap`), so another
  user's (or root's) clients still fit;
* when the descriptors run out anyway, the client being accepted is refused with a reason
  (:func:`refuse`) and the daemon goes on; a spare descriptor (:class:`Spare`) lets it
  accept and refuse a connection even when ``accept`` itself fails with EMFILE, so a
  pending connection never leaves the listener readable in a busy loop.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import socket
import struct

REFUSED_MAGIC = b"SRDR"  # a refusal instead of the HELLO: magic + UTF-8 reason, no descriptor
FDS_PER_CLIENT = 2
FD_RESERVE = 32  # descriptors kept for the daemon itself (UDP sockets, epoll, log, lock...)
MAX_CLIENTS_PER_UID = 1024
_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid (SO_PEERCRED)


def raise_nofile() -> int:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit; return the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft != hard:
        with contextlib.suppress(OSError, ValueError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    return soft


def per_uid_cap(nofile: int, configured: int = MAX_CLIENTS_PER_UID) -> int:
    """Clients one uid may hold: ``configured``, and at most half the descriptor budget."""
    budget = max(nofile - FD_RESERVE, FDS_PER_CLIENT) // FDS_PER_CLIENT
    return max(1, min(configured, budget // 2))


def out_of_descriptors(exc: OSError) -> bool:
    """Whether ``exc`` is the process (EMFILE) or system (ENFILE) descriptor limit."""
    return exc.errno in (errno.EMFILE, errno.ENFILE)


def peer_uid(sock: socket.socket) -> int:
    """The uid of a Unix-socket peer (``SO_PEERCRED``); -1 if unknown."""
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    except OSError:
        return -1
    return int(_UCRED.unpack(raw)[1])


def peer_pid(sock: socket.socket) -> int:
    """The pid of a Unix-socket peer (``SO_PEERCRED``); 0 if unknown."""
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    except OSError:
        return 0
    return max(int(_UCRED.unpack(raw)[0]), 0)


def refuse(ctrl: socket.socket, reason: str) -> None:
    """Tell a client why it is refused (best effort, never blocks) and close it."""
    with contextlib.suppress(OSError):
        ctrl.setblocking(False)
        ctrl.send(REFUSED_MAGIC + reason.encode("utf-8", "replace")[:200])
    ctrl.close()


def refusal_reason(msg: bytes) -> str | None:
    """The reason of a refusal message, or None if ``msg`` is not one."""
    if msg.startswith(REFUSED_MAGIC):
        return msg[len(REFUSED_MAGIC):].decode("utf-8", "replace")
    return None


class DevdRefused(ConnectionError):
    """The daemon refused this client (descriptor budget or per-uid cap); not retried."""


class Spare:
    """One descriptor held in reserve, released to accept-and-refuse under EMFILE."""

    def __init__(self) -> None:
        self._fd = -1
        self.take()

    def take(self) -> None:
        if self._fd < 0:
            with contextlib.suppress(OSError):
                self._fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def shed(self, listener: socket.socket, reason: str) -> bool:
        """Accept one pending connection with the spare descriptor and refuse it; False if
        none could be accepted."""
        self.release()
        try:
            ctrl, _ = listener.accept()
        except OSError:
            return False
        finally:
            self.take()
        refuse(ctrl, reason)
        return True

    def close(self) -> None:
        self.release()
