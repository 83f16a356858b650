"""``pyverbs.mem_alloc``: raw memory helpers (rdma-core ``pyverbs/mem_alloc.pyx`` API).

Thin ``ctypes`` wrappers around libc ``malloc``/``posix_memalign``/``free``/``mmap``/
``munmap`` and byte-order helpers that read and write at raw addresses, as pyverbs
programs use them to build buffers for MRs.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap as _mmap
import struct

from .base import PyverbsRDMAErrno
from .pyverbs_error import PyverbsError

__all__ = [
    "malloc", "posix_memalign", "free", "mmap", "munmap", "read", "write", "read32",
    "read64", "writebe32", "writebe64",
    "MAP_ANONYMOUS_", "MAP_FIXED_", "MAP_GROWSDOWN_", "MAP_HUGETLB_", "MAP_LOCKED_",
    "MAP_NORESERVE_", "MAP_POPULATE_", "MAP_PRIVATE_", "MAP_SHARED_", "MAP_STACK_",
    "PROT_EXEC_", "PROT_NONE_", "PROT_READ_", "PROT_WRITE_",
]

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.malloc.argtypes = [ctypes.c_size_t]
_libc.malloc.restype = ctypes.c_void_p
_libc.free.argtypes = [ctypes.c_void_p]
_libc.free.restype = None
_libc.posix_memalign.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t,
                                 ctypes.c_size_t]
_libc.posix_memalign.restype = ctypes.c_int
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.mmap.restype = ctypes.c_void_p
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.munmap.restype = ctypes.c_int

MAP_SHARED_ = _mmap.MAP_SHARED
MAP_PRIVATE_ = _mmap.MAP_PRIVATE
MAP_ANONYMOUS_ = _mmap.MAP_ANONYMOUS
MAP_FIXED_ = 0x10
MAP_GROWSDOWN_ = 0x100
MAP_LOCKED_ = 0x2000
MAP_NORESERVE_ = 0x4000
MAP_POPULATE_ = 0x8000
MAP_STACK_ = 0x20000
MAP_HUGETLB_ = 0x40000
PROT_NONE_ = 0
PROT_READ_ = _mmap.PROT_READ
PROT_WRITE_ = _mmap.PROT_WRITE
PROT_EXEC_ = _mmap.PROT_EXEC
_MAP_FAILED = ctypes.c_void_p(-1).value

_U32 = struct.Struct("=I")
_U64 = struct.Struct("=Q")
_BE32 = struct.Struct(">I")
_BE64 = struct.Struct(">Q")


def malloc(size: int) -> int:
    """``malloc``: the address, or 0 when the request fails."""
    return int(_libc.malloc(size) or 0)


def posix_memalign(size: int, alignment: int = 8) -> int:
    """``posix_memalign`` + zero fill: an ``alignment``-aligned block of ``size`` bytes."""
    ptr = ctypes.c_void_p()
    rc = _libc.posix_memalign(ctypes.byref(ptr), alignment, size)
    if rc != 0 or not ptr.value:
        raise PyverbsError(f"Failed to allocate memory ({errno.errorcode.get(rc, rc)})")
    ctypes.memset(ptr.value, 0, size)
    return int(ptr.value)


def free(ptr: int) -> None:
    """``free``."""
    _libc.free(ptr)


def mmap(addr: int = 0, length: int = 0, prot: int = PROT_READ_ | PROT_WRITE_,
         flags: int = MAP_PRIVATE_ | MAP_ANONYMOUS_, fd: int = 0, offset: int = 0) -> int:
    """``mmap``: the mapped address (PyverbsRDMAError with errno on failure)."""
    p = _libc.mmap(addr or None, length, prot, flags, fd, offset)
    if p is None or p == _MAP_FAILED:
        raise PyverbsRDMAErrno("Failed to mmap memory")
    return int(p)


def munmap(addr: int, length: int) -> None:
    """``munmap``."""
    if _libc.munmap(addr, length) != 0:
        raise PyverbsRDMAErrno("Failed to munmap memory")


def read(addr: int, length: int, offset: int = 0) -> bytes:
    """``length`` bytes at ``addr + offset``."""
    return ctypes.string_at(addr + offset, length)


def write(addr: int, data: str | bytes, length: int, offset: int = 0) -> None:
    """Copy ``length`` bytes of ``data`` to ``addr + offset``."""
    buf = data.encode() if isinstance(data, str) else bytes(data)
    ctypes.memmove(addr + offset, buf[:length], min(length, len(buf)))


def read32(addr: int, offset: int = 0) -> int:
    """The host-order 32-bit value at ``addr + 4*offset``."""
    return int(_U32.unpack(ctypes.string_at(addr + 4 * offset, 4))[0])


def read64(addr: int, offset: int = 0) -> int:
    """The host-order 64-bit value at ``addr + 8*offset``."""
    return int(_U64.unpack(ctypes.string_at(addr + 8 * offset, 8))[0])


def writebe32(addr: int, val: int, offset: int = 0) -> None:
    """Write ``val`` big-endian at ``addr + 4*offset``."""
    ctypes.memmove(addr + 4 * offset, _BE32.pack(val & 0xFFFFFFFF), 4)


def writebe64(addr: int, val: int, offset: int = 0) -> None:
    """Write ``val`` big-endian at ``addr + 8*offset``."""
    ctypes.memmove(addr + 8 * offset, _BE64.pack(val & 0xFFFFFFFFFFFFFFFF), 8)
