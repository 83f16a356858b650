"""The device tables both transports' engines keep the same way: memory regions by key,
QP numbers, the timer owners and the event queue, gathered in :class:`DeviceTables`,
the part of a :class:`~softrdma.seam.protocols.DeviceEngine` that
:class:`~softrdma.ib.port.Port` and :class:`~softrdma.iwarp.qp.IwarpDevice` share."""

from __future__ import annotations

import random
from collections.abc import Callable, Container
from typing import Generic, Protocol, TypeVar

from ..enums import ibv_gid_type
from ..errors import InvalidArgument, ResourceError
from .events import AsyncEventType, EventQueue
from .protocols import Timed
from .queues import EngineSRQ
from .types import MemoryRegion

#: unguessable bits from the OS (what ``secrets.randbits`` is), for R_Keys, STags and the CM's
#: seed, without importing ``secrets``:
#: it imports ``hmac`` and so OpenSSL's libcrypto, whose exit handler frees memory, and a C
#: program under ``softrdma run`` that calls ``exit`` from a signal handler (qperf) while
#: its thread is inside ``malloc`` in our Python would then deadlock (design.md, "C programs")
os_randbits = random.SystemRandom().getrandbits

__all__ = ["DEFAULT_PKEY", "DeviceTables", "FIRST_QPN", "GID_TYPE_ROCE_V1", "GID_TYPE_ROCE_V2",
           "KEY_BITS", "MULTICAST_QPN", "MemoryTable", "QpnAllocator", "TimerSet", "os_randbits"]

DEFAULT_PKEY = 0xFFFF  # the default (full membership) partition key (IBA 10.9.1.2)
GID_TYPE_ROCE_V1 = int(ibv_gid_type.IBV_GID_TYPE_ROCE_V1)  # "IB/RoCE v1" (Annex A16)
GID_TYPE_ROCE_V2 = int(ibv_gid_type.IBV_GID_TYPE_ROCE_V2)  # "RoCE v2" (Annex A17)
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

    __slots__ = ("mrs", "_key_alloc", "_key_free")

    def __init__(self, key_alloc: Callable[[], int] | None = None,
                 key_free: Callable[[int], None] | None = None) -> None:
        self.mrs: dict[int, MemoryRegion] = {}
        self._key_alloc = key_alloc
        self._key_free = key_free

    def new_key(self) -> int:
        """A fresh, hard-to-guess key not in use (the low byte is the variant key)."""
        if self._key_alloc is not None:
            return self._key_alloc()
        while True:
            k = os_randbits(KEY_BITS)
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
        if self._key_free is not None:
            self._key_free(mr.lkey)


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


class _ErrorableQP(Protocol):
    def to_error(self, event: AsyncEventType | None = None) -> None: ...


QP_T = TypeVar("QP_T", bound=_ErrorableQP)


class DeviceTables(Generic[QP_T]):
    """What every device engine keeps the same way: the QP table and QPN allocation
    (IBA 10.2.4), the memory table (IBA 10.6; STags on iWARP, RFC 5040 §2.1), the timer
    owners, the event queue (IBA 11.6.3) and the local catastrophic error.

    ``qpn_alloc`` / ``key_alloc`` / ``key_free`` replace the local allocators (a shared
    device gets QPNs from its demultiplexer; iWARP STags from its STag allocator)."""

    def __init__(self, *, qpn_alloc: Callable[[], int] | None = None,
                 key_alloc: Callable[[], int] | None = None,
                 key_free: Callable[[int], None] | None = None) -> None:
        self.qps: dict[int, QP_T] = {}
        self.memory = MemoryTable(key_alloc, key_free)
        self.mrs = self.memory.mrs  # by key; rkey == lkey for softrdma MRs
        self.events = EventQueue()
        self._timers = TimerSet()
        self._qpns = QpnAllocator(self.qps)
        self._qpn_alloc = qpn_alloc

    # ---- QPs and SRQs --------------------------------------------------------------------
    def alloc_qpn(self) -> int:
        """A QP number for a new QP (the device's allocator, else from 0x11 up, as rxe)."""
        if self._qpn_alloc is not None:
            return self._qpn_alloc()
        return self._qpns.alloc()

    def create_srq(self, pd: object, max_wr: int, max_sge: int, srq_limit: int) -> EngineSRQ:
        """A new SRQ (IBA 10.2.9)."""
        return EngineSRQ(self.events, pd, max_wr, max_sge, srq_limit)

    def device_fatal(self) -> None:
        """The device failed: every QP to ERR, flushing its work requests with
        IBV_WC_WR_FLUSH_ERR (IBA 10.3.1.7), then the unaffiliated DEVICE_FATAL event
        (IBA 11.6.3.2 Local Catastrophic Error)."""
        for qp in list(self.qps.values()):
            qp.to_error()
        self._timers.clear()
        self.events.raise_event(AsyncEventType.DEVICE_FATAL)

    # ---- memory regions ------------------------------------------------------------------
    def new_key(self) -> int:
        """A fresh, hard-to-guess 32-bit key not in use (the low byte is the variant key)."""
        return self.memory.new_key()

    def register_mr(self, buf: memoryview, addr: int, access: int, pd: object,
                    zero_based: bool = False) -> MemoryRegion:
        # a plain int: the access checks of the data path are then plain int operations
        return self.memory.register(buf, addr, int(access), pd, zero_based)

    def deregister_mr(self, mr: MemoryRegion) -> None:
        self.memory.deregister(mr)

    def lookup_mr(self, key: int) -> MemoryRegion | None:
        return self.mrs.get(key)

    # ---- timers --------------------------------------------------------------------------
    def arm(self, owner: Timed) -> None:
        """Called by a QP (or any :class:`Timed`) whose ``deadline`` changed to a finite
        value."""
        self._timers.arm(owner)

    def next_deadline(self) -> float | None:
        return self._timers.next_deadline()

    def on_timer(self, now: float) -> None:
        self._timers.on_timer(now)
