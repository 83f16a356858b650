"""Waiting for descriptors to become ready, whatever their number.

``select(2)`` takes only descriptors below ``FD_SETSIZE`` (1024): Python's
``select.select`` raises ``ValueError`` for any other. A program that opened many files
or connections before it opened a device (an MPI rank, a storage target, a server) gets
its device's descriptors numbered past it, and every wait of softrdma's that used
``select`` failed there: ``ibv_get_cq_event`` and ``ibv_get_async_event`` raised, the
progress thread's wait and the busy poll's sleep returned at once (a spin). So waits go
through :func:`readable` / :class:`Readable`: ``select`` below ``FD_SETSIZE`` (its timeout
is exact to the microsecond, which the busy poll's sleep until the engine's next timer
uses), ``poll(2)`` (no limit; a timeout rounded up to the millisecond) from there on.

A descriptor closed under a wait is reported as ``select`` reports it: ``OSError``
(``EBADF``), where ``poll`` itself would only flag it ``POLLNVAL``.
"""

from __future__ import annotations

import errno
import math
import select
from collections.abc import Sequence

__all__ = ["FD_SETSIZE", "Readable", "readable", "writable"]

FD_SETSIZE = 1024  # glibc's: select(2) takes descriptors 0 .. FD_SETSIZE - 1

_BAD = select.POLLNVAL


def _ms(timeout: float | None) -> int:
    """A ``poll`` timeout: milliseconds, rounded up (never shorter than asked); -1: none."""
    if timeout is None:
        return -1
    return max(0, math.ceil(timeout * 1000))


def _polled(p: select.poll, timeout: float | None) -> list[int]:
    got = p.poll(_ms(timeout))
    if any(ev & _BAD for _, ev in got):
        raise OSError(errno.EBADF, "a descriptor waited on is closed")
    return [fd for fd, _ in got]


class Readable:
    """A wait for any of a fixed set of descriptors to become readable (built once,
    waited on many times: the progress thread's, the busy poll's)."""

    __slots__ = ("fds", "_poll")

    def __init__(self, fds: Sequence[int]) -> None:
        self.fds = list(fds)
        self._poll: select.poll | None = None
        if self.fds and max(self.fds) >= FD_SETSIZE:
            p = self._poll = select.poll()
            for fd in self.fds:
                p.register(fd, select.POLLIN)

    def wait(self, timeout: float | None) -> list[int]:
        """The descriptors readable within ``timeout`` seconds (None: no limit); empty when
        the time ran out. ``OSError`` if one of them is closed."""
        p = self._poll
        if p is None:
            return select.select(self.fds, [], [], timeout)[0]
        return _polled(p, timeout)


def readable(fds: Sequence[int], timeout: float | None) -> list[int]:
    """The descriptors of ``fds`` readable within ``timeout`` seconds (a one-off
    :class:`Readable`)."""
    return Readable(fds).wait(timeout)


def writable(fd: int, timeout: float | None) -> bool:
    """True if ``fd`` is writable within ``timeout`` seconds (a connecting socket:
    connected, or failed with its error pending)."""
    if fd < FD_SETSIZE:
        return bool(select.select([], [fd], [], timeout)[1])
    p = select.poll()
    p.register(fd, select.POLLOUT)
    return bool(_polled(p, timeout))
