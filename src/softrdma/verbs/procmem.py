"""The process's own address space as one memory region (implicit on-demand paging).

An implicit ODP MR (``ibv_reg_mr(pd, NULL, SIZE_MAX, access | IBV_ACCESS_ON_DEMAND)``)
covers every address of the process. softrdma's engine runs in the process that owns the
QP, so it can reach any of them; :class:`ProcessMemoryRegion` checks, on each access, that
the range is mapped with the permissions the region's access flags imply (readable; also
writable when the region grants any write access), asking the kernel about the mappings
that cover it (``PROCMAP_QUERY`` on ``/proc/self/maps``, Linux 6.11: one ``ioctl`` a
mapping, 1-2 us) or, on an older kernel, reading the whole of ``/proc/self/maps`` (about
440 us in a ``softrdma run`` process, whose 220-250 mappings made ``ibv_rc_pingpong -O``
take 2 ms an iteration). A range that is not mapped is out of bounds (``offset_of``
returns -1), so the engine completes the work request with a protection error or NAKs
the request, as a failed ODP page fault does; it never touches unmapped memory.

:class:`ImplicitMR` is such a region as a verbs object (``softrdma.capi``'s
``ibv_reg_mr(pd, NULL, SIZE_MAX, ...)``; the pyverbs layer has its own MR class over
:class:`ProcessMemoryRegion`). RoCE devices only: an iWARP device refuses it (EOPNOTSUPP).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import struct
import sys
import threading
from typing import Any

from .. import enums as e
from ..errors import InvalidArgument, NotSupported
from ..ib.port import Port
from ..seam.types import MemoryRegion
from ._object import EngineView, VerbsObject, release_on
from .pd import PD, open_pd

__all__ = ["ProcessMemory", "ProcessMemoryRegion", "SIZE_MAX", "mapped", "ImplicitMR"]

SIZE_MAX = (1 << 64) - 1
_WRITE = int(e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_ATOMIC)


def _maps() -> list[tuple[int, int, str]]:
    out = []
    with open("/proc/self/maps", "rb") as fh:
        for line in fh:
            rng, perms = line.split(b" ", 2)[:2]
            lo, hi = rng.split(b"-")
            out.append((int(lo, 16), int(hi, 16), perms.decode()))
    return out


# struct procmap_query (include/uapi/linux/fs.h): size, query_flags, query_addr, vma_start,
# vma_end, vma_flags, vma_page_size, vma_offset, inode, dev_major, dev_minor,
# vma_name_size, build_id_size, vma_name_addr, build_id_addr
_QUERY = struct.Struct("=9Q4I2Q")
PROCMAP_QUERY = 0xC0000000 | _QUERY.size << 16 | ord("f") << 8 | 17  # _IOWR('f', 17, ...)
_READABLE, _WRITABLE = 0x01, 0x02  # PROCMAP_QUERY_VMA_READABLE / _WRITABLE
_query_fd: tuple[int, int | None] | None = None  # (pid, descriptor or None: no query there)
_query_lock = threading.Lock()


def _query(fd: int, flags: int, addr: int) -> bytes:
    """``PROCMAP_QUERY``: the mapping that covers ``addr`` with the permissions ``flags``
    (a ``struct procmap_query``); OSError (ENOENT) when there is none."""
    return fcntl.ioctl(fd, PROCMAP_QUERY, _QUERY.pack(_QUERY.size, flags, addr, *[0] * 12))


def _query_maps_fd() -> int | None:
    """This process's ``/proc/self/maps``, open for ``PROCMAP_QUERY`` (reopened after a
    fork, the parent's closed: the descriptor names the process that opened it); None
    where the kernel lacks the query."""
    global _query_fd
    pid = os.getpid()
    got = _query_fd
    if got is not None and got[0] == pid:
        return got[1]
    with _query_lock:
        got = _query_fd
        if got is not None and got[0] == pid:  # another thread opened it
            return got[1]
        if got is not None and got[1] is not None:  # the parent's, inherited
            os.close(got[1])
        fd = os.open("/proc/self/maps", os.O_RDONLY | os.O_CLOEXEC)
        try:
            _query(fd, _READABLE, 0)
        except OSError as exc:
            if exc.errno != errno.ENOENT:  # ENOENT: nothing at address 0, the query works
                os.close(fd)
                fd = -1
        got = _query_fd = (pid, fd if fd >= 0 else None)
    return got[1]


def _mapped_by_query(fd: int, addr: int, end: int, write: bool) -> bool:
    flags = _READABLE | (_WRITABLE if write else 0)
    pos = addr
    while pos < end:  # the mapping covering pos, with the permissions asked, or ENOENT
        try:
            out = _query(fd, flags, pos)
        except OSError:
            return False
        pos = _QUERY.unpack(out)[4]  # vma_end
    return True


def _mapped_by_maps(addr: int, end: int, write: bool) -> bool:
    pos = addr
    for lo, hi, perms in _maps():
        if hi <= pos:
            continue
        if lo > pos:
            return False
        if perms[0] != "r" or (write and perms[1] != "w"):
            return False
        pos = hi
        if pos >= end:
            return True
    return False


def mapped(addr: int, length: int, write: bool) -> bool:
    """True if ``[addr, addr + length)`` is mapped readable (and writable if ``write``)."""
    if length == 0:
        return True
    fd = _query_maps_fd()
    if fd is not None:
        return _mapped_by_query(fd, addr, addr + length, write)
    return _mapped_by_maps(addr, addr + length, write)


class ProcessMemory:
    """``buf[a:b]``: a writable memoryview of the process's bytes at addresses a..b."""

    def __getitem__(self, key: slice) -> memoryview:
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("process memory is sliced with [start:stop]")
        start = int(key.start or 0)
        n = int(key.stop) - start
        if n <= 0:
            return memoryview(b"")
        return memoryview((ctypes.c_char * n).from_address(start)).cast("B")

    def __len__(self) -> int:
        return sys.maxsize


class ProcessMemoryRegion(MemoryRegion):
    """An engine memory region spanning the whole address space (VA 0 .. SIZE_MAX)."""

    __slots__ = ()

    def __init__(self, key: int, access: int, pd: Any) -> None:
        super().__init__(key, key, 0, ProcessMemory(), access, pd)  # type: ignore[arg-type]
        self.length = SIZE_MAX

    def offset_of(self, va: int, length: int) -> int:
        if length < 0 or va < 0 or va + length > SIZE_MAX:
            return -1
        if not mapped(va, length, bool(self.access & _WRITE)):
            return -1
        return va


_ODP = int(e.IBV_ACCESS_ON_DEMAND)
_ALLOWED = int(e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
               | e.IBV_ACCESS_REMOTE_ATOMIC | e.IBV_ACCESS_RELAXED_ORDERING) | _ODP
_NEEDS_LOCAL_WRITE = int(e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_ATOMIC)


class ImplicitMR(VerbsObject):
    """An implicit on-demand-paging MR of ``pd``: every address of the process, VA 0 ..
    SIZE_MAX (``ibv_reg_mr(pd, NULL, SIZE_MAX, access | IBV_ACCESS_ON_DEMAND)``,
    ``ibv_reg_mr(3)``). ``access`` must include ``IBV_ACCESS_ON_DEMAND`` (EINVAL)."""

    _close_rank = 2  # with the MRs

    def __init__(self, pd: PD, access: int) -> None:
        super().__init__()
        pd = open_pd(pd)
        if not isinstance(access, int) or access & ~_ALLOWED or not access & _ODP:
            raise InvalidArgument("access", "an implicit MR is IBV_ACCESS_ON_DEMAND, with "
                                  f"local/remote access only, got {access!r}")
        if access & _NEEDS_LOCAL_WRITE and not access & e.IBV_ACCESS_LOCAL_WRITE:
            raise InvalidArgument("access", "REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE")
        port = pd.ctx.port
        if not isinstance(port, Port):
            raise NotSupported("implicit ODP needs a RoCE device")
        self._runtime = pd.ctx.runtime
        self._port = port

        def register() -> ProcessMemoryRegion:
            key = port.new_key()
            emr = ProcessMemoryRegion(key, access & ~_ODP, pd.protection_domain)
            port.mrs[key] = emr
            return emr

        self.engine_mr: ProcessMemoryRegion = self._runtime.call(register)
        self._depend_on(pd)
        self.pd = pd
        self.access = access

    lkey = EngineView[int]("engine_mr.lkey")
    rkey = EngineView[int]("engine_mr.rkey")

    def _release(self) -> None:
        release_on(self._runtime, self._port.deregister_mr, self.engine_mr)
