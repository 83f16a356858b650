"""The device tables both transports' engines keep the same way: memory regions by key
and the timer owners (composed by :class:`~softrdma.ib.port.Port` and
:class:`~softrdma.iwarp.qp.IwarpDevice`)."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Container

from ..errors import InvalidArgument, ResourceError
from .protocols import Timed
from .types import MemoryRegion

__all__ = ["FIRST_QPN", "KEY_BITS", "MULTICAST_QPN", "MemoryTable", "QpnAllocator", "TimerSet"]

KEY_BITS = 32  # L_Key/R_Key (IBA 10.6.3.2) and STag (RFC 5040 §2.1) are 32-bit
FIRST_QPN = 0x11  # the first QPN rxe hands out (rxe_param.h RXE_MIN_QP_INDEX + 1)
MULTICAST_QPN = 0xFFFFFF  # IBA 9.2 / 10.5.2: the permissive DestQP of multicast packets


class QpnAllocator:
    """Local QP numbers (IBA 10.2.4): from :data:`FIRST_QPN` up, wrapping below the
    multicast QPN, skipping the numbers in ``in_use`` (the device's QP table)."""

    __slots__ = ("_next", "_in_use")

    def __init__(self, in_use: Container[int]) -> None:
        self._next = FIRST_QPN
        self._in_use = in_use

    def alloc(self) -> int:
        for _ in range(MULTICAST_QPN):
            qpn = self._next
            self._next = FIRST_QPN if qpn >= MULTICAST_QPN - 1 else qpn + 1
            if qpn not in self._in_use:
                return qpn
        raise ResourceError("no free QP number")


class MemoryTable:
    """Registered memory regions by key (IBA 10.6; on iWARP the STag, RFC 5040 §2.1).

    ``mrs`` maps the key (``lkey == rkey`` for softrdma MRs) to the region; the data path
    reads it directly. ``key_alloc`` gives keys (iWARP's STag allocator); by default a
    random 32-bit key not in use."""

    __slots__ = ("mrs", "_key_alloc")

    def __init__(self, key_alloc: Callable[[], int] | None = None) -> None:
        self.mrs: dict[int, MemoryRegion] = {}
        self._key_alloc = key_alloc

    def new_key(self) -> int:
        """A fresh, hard-to-guess key not in use (the low byte is the variant key)."""
        if self._key_alloc is not None:
            return self._key_alloc()
        while True:
            k = secrets.randbits(KEY_BITS)
            if k not in self.mrs and k != 0:
                return k

    def register(self, buf: memoryview, addr: int, access: int, pd: object,
                 zero_based: bool = False) -> MemoryRegion:
        if buf.ndim != 1 or buf.format != "B" or not buf.contiguous:
            raise InvalidArgument("buffer", "must be a contiguous 1-D byte buffer")
        key = self.new_key()
        mr = MemoryRegion(key, key, addr, buf, access, pd, zero_based)
        self.mrs[key] = mr
        return mr

    def deregister(self, mr: MemoryRegion) -> None:
        mr.valid = False
        if self.mrs.get(mr.lkey) is mr:
            del self.mrs[mr.lkey]


class TimerSet:
    """The timer owners of a device: each has a ``deadline``; ``on_timer(now)`` runs the
    due ones. Owners whose deadline went to None are dropped lazily."""

    __slots__ = ("owners",)

    def __init__(self) -> None:
        self.owners: set[Timed] = set()

    def arm(self, owner: Timed) -> None:
        """``owner.deadline`` changed to a finite value."""
        self.owners.add(owner)

    def discard(self, owner: Timed) -> None:
        self.owners.discard(owner)

    def clear(self) -> None:
        self.owners.clear()

    def next_deadline(self) -> float | None:
        best: float | None = None
        dead = []
        for t in self.owners:
            d = t.deadline
            if d is None:
                dead.append(t)
            elif best is None or d < best:
                best = d
        for t in dead:
            self.owners.discard(t)
        return best

    def on_timer(self, now: float) -> None:
        for t in list(self.owners):
            d = t.deadline
            if d is None:
                self.owners.discard(t)
            elif d <= now:
                t.on_timer(now)
