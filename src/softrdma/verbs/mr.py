"""Memory regions (IBA 10.6; ``ibv_reg_mr``).

Any buffer-protocol object can be registered in place: ``bytearray``, ``memoryview``,
``mmap``, a C-contiguous numpy array, or (for local-read-only access) ``bytes``. The
region's virtual address defaults to the buffer's real address, obtained from the
buffer itself through ``ctypes``, so the ``addr`` of an SGE or a remote VA is a real
pointer as with libibverbs (pyverbs ``mr.buf``). ``address=`` overrides it; an
``IBV_ACCESS_ZERO_BASED`` region starts at VA 0.

Access checks (kernel ``ib_check_mr_access``): unknown flag bits -> EINVAL;
REMOTE_WRITE or REMOTE_ATOMIC without LOCAL_WRITE -> EINVAL; a read-only buffer with any
writable access -> EFAULT (``ib_umem_get`` cannot pin read-only pages for write).

On-demand paging (``IBV_ACCESS_ON_DEMAND``, ``ibv_reg_mr(3)``): accepted, and the region
is marked :attr:`MR.on_demand`. softrdma never pins memory: the engine reaches the
registered bytes in place when a packet needs them, which is what ODP promises, so an
ODP region behaves as any other (rxe has no ODP and refuses it; softrdma's pyverbs layer
reports ODP in ``query_device_ex().odp_caps`` and accepts it the same way).
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import weakref
from typing import Any

from .. import enums as e
from ..drivers.runtime.progress import DeviceRuntime
from ..errors import InvalidArgument
from ..seam.protocols import DeviceEngine
from ..seam.types import MemoryRegion
from ._args import U64, data_bytes, uint
from ._object import EngineView, VerbsObject, release_on
from .limits import max_mr_size
from .pd import PD, open_pd

__all__ = ["MR", "buffer_address", "ACCESS_SUPPORTED"]

ACCESS_SUPPORTED = int(
    e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
    | e.IBV_ACCESS_REMOTE_ATOMIC | e.IBV_ACCESS_MW_BIND | e.IBV_ACCESS_ZERO_BASED
    | e.IBV_ACCESS_ON_DEMAND | e.IBV_ACCESS_HUGETLB | e.IBV_ACCESS_RELAXED_ORDERING
)
_WRITABLE = int(e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_ATOMIC)
_NEEDS_LOCAL_WRITE = int(e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_ATOMIC)
_ODP = int(e.IBV_ACCESS_ON_DEMAND)


class _PyBuffer(ctypes.Structure):
    _fields_ = [
        ("buf", ctypes.c_void_p), ("obj", ctypes.py_object), ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t), ("readonly", ctypes.c_int), ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p), ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
        ("suboffsets", ctypes.c_void_p), ("internal", ctypes.c_void_p),
    ]


_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_get_buffer.restype = ctypes.c_int
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [ctypes.POINTER(_PyBuffer)]
_release_buffer.restype = None


def buffer_address(mv: memoryview) -> int:
    """The real address of the first byte of a contiguous buffer (writable or not)."""
    if len(mv) == 0:
        return 0
    if not mv.readonly:
        return ctypes.addressof((ctypes.c_char * mv.nbytes).from_buffer(mv))
    view = _PyBuffer()
    if _get_buffer(mv, ctypes.byref(view), 0) != 0:  # pragma: no cover - raises instead
        raise InvalidArgument("buffer", "cannot get the buffer's address")
    try:
        return int(view.buf or 0)
    finally:
        _release_buffer(ctypes.byref(view))


def _as_bytes_view(buffer: Any) -> memoryview:
    try:
        mv = memoryview(buffer)
    except TypeError:
        raise InvalidArgument("buffer", f"{type(buffer).__name__} does not support the buffer protocol") from None
    if not mv.c_contiguous:
        raise InvalidArgument("buffer", "must be C-contiguous")
    if mv.ndim != 1 or mv.format != "B":
        mv = mv.cast("B")
    return mv


class MR(VerbsObject):
    """A registered memory region of ``pd`` (pyverbs ``MR``)."""

    _close_rank = 2

    def __init__(self, pd: PD, length: int = 0, access: int = 0, *, buffer: Any = None,
                 address: int | None = None) -> None:
        super().__init__()
        pd = open_pd(pd)
        if not isinstance(access, int) or access < 0 or access & ~ACCESS_SUPPORTED:
            raise InvalidArgument("access", f"unknown access flags {access!r}")
        if access & _NEEDS_LOCAL_WRITE and not access & e.IBV_ACCESS_LOCAL_WRITE:
            raise InvalidArgument("access", "REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE "
                                  "(ib_check_mr_access)")
        length = uint(length, U64, "length")
        most = max_mr_size()
        if length > most:
            raise InvalidArgument("length", f"{length} bytes is more than this host can back "
                                  f"(max_mr_size {most})", errno=errno.ENOMEM)
        self._storage: Any
        if buffer is None:
            if length == 0:
                raise InvalidArgument("length", "must be > 0 when the library allocates the buffer")
            self._storage = _allocate(length)
            mv = memoryview(self._storage)
        else:
            self._storage = buffer
            mv = _as_bytes_view(buffer)
            if length == 0:
                # an empty buffer is a zero-length region (ibv_reg_dm_mr accepts one: the
                # kernel checks only that the range lies inside the device memory)
                length = mv.nbytes
            elif length > mv.nbytes:
                raise InvalidArgument("length", f"{length} is larger than the buffer ({mv.nbytes} bytes)")
            mv = mv[:length]
            if mv.readonly and access & _WRITABLE:
                raise InvalidArgument("buffer", "read-only buffer registered with write access",
                                      errno=errno.EFAULT)
        zero_based = bool(access & e.IBV_ACCESS_ZERO_BASED)
        real = buffer_address(mv)
        if address is None:
            va = 0 if zero_based else real
        else:
            if not isinstance(address, int) or address < 0 or address + length > 1 << 64:
                raise InvalidArgument("address", f"bad virtual address {address!r}")
            va = address
        ctx = pd.ctx
        runtime: DeviceRuntime = ctx.runtime
        port: DeviceEngine = ctx.port
        #: registered with IBV_ACCESS_ON_DEMAND (the engine's access is the rest)
        self.on_demand = bool(access & _ODP)
        with self._counting(ctx.objects, "max_mr"):
            self._emr: MemoryRegion = runtime.call(port.register_mr, mv, va, access & ~_ODP,
                                                   pd.protection_domain, zero_based)
        self._depend_on(pd)
        self.pd = pd
        self._runtime = runtime
        self._port = port
        self._buf = mv
        self.real_address = real
        self._finalizer = weakref.finalize(self, _defer_dereg, runtime, port, self._emr)

    # ---- pyverbs attributes ----------------------------------------------------------------
    lkey = EngineView[int]("_emr.lkey")
    rkey = EngineView[int]("_emr.rkey")
    addr = EngineView[int]("_emr.addr", "The region's virtual address (what SGE ``addr`` and "
                           "remote VAs refer to).")
    length = EngineView[int]("_emr.length")

    @property
    def buf(self) -> memoryview:
        """The registered bytes (a writable memoryview unless the buffer is read-only)."""
        self._check()
        return self._buf

    @property
    def access(self) -> int:
        """The access flags registered (``IBV_ACCESS_ON_DEMAND`` included if given)."""
        return self._emr.access | (_ODP if self.on_demand else 0)

    @property
    def engine_mr(self) -> MemoryRegion:
        return self._emr

    def read(self, length: int, offset: int = 0) -> bytes:
        """``length`` bytes at ``offset`` (pyverbs ``MR.read``)."""
        self._check()
        self._bounds(length, offset)
        return bytes(self._buf[offset:offset + length])

    def write(self, data: bytes | bytearray | memoryview | str, length: int | None = None,
              offset: int = 0) -> None:
        """Copy ``length`` bytes of ``data`` to ``offset`` (pyverbs ``MR.write``)."""
        self._check()
        src = data_bytes(data, "data")
        if length is None:
            length = len(src)
        if uint(length, U64, "length") > len(src):
            raise InvalidArgument("length", f"{length} > len(data) = {len(src)}")
        self._bounds(length, offset)
        if self._buf.readonly:
            raise InvalidArgument("mr", "the registered buffer is read-only")
        self._buf[offset:offset + length] = src[:length]

    def _bounds(self, length: int, offset: int) -> None:
        if not isinstance(length, int) or not isinstance(offset, int) or length < 0 or offset < 0:
            raise InvalidArgument("length", "length and offset must be non-negative ints")
        if offset + length > self._emr.length:
            raise InvalidArgument("offset", f"[{offset}, {offset + length}) is outside the "
                                  f"{self._emr.length}-byte region")

    def _release(self) -> None:
        self._finalizer.detach()
        release_on(self._runtime, self._port.deregister_mr, self._emr)

    def __repr__(self) -> str:
        return (f"<MR lkey={self._emr.lkey:#x} addr={self._emr.addr:#x} "
                f"length={self._emr.length} access={self._emr.access:#x}>")


def _allocate(length: int) -> mmap.mmap:
    """``length`` bytes of anonymous memory for an MR; ENOMEM naming the length when the
    host cannot give them (ib_umem_get's answer when pages cannot be had)."""
    try:
        return mmap.mmap(-1, length)
    except (OSError, OverflowError, MemoryError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        raise InvalidArgument("length", f"cannot allocate {length} bytes for the MR: {reason}",
                              errno=errno.ENOMEM) from None


def _defer_dereg(runtime: DeviceRuntime, port: DeviceEngine, emr: MemoryRegion) -> None:
    if runtime.closed:
        port.deregister_mr(emr)
    else:
        runtime.defer(lambda: port.deregister_mr(emr))
