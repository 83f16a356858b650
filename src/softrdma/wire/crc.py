"""CRC-32 (the RoCE ICRC, IBA 7.8.1) and CRC-32C (the MPA FPDU CRC, RFC 5044 §8).

* :func:`crc32` is the ISO-HDLC CRC-32 (reflected polynomial 0xEDB88320, init and final
  XOR 0xFFFFFFFF), bit-identical to :func:`zlib.crc32`; it uses ISA-L
  (``isal.isal_zlib.crc32``) when available and :mod:`zlib` otherwise.
* :func:`crc32c` is CRC-32C (Castagnoli, reflected polynomial 0x82F63B78, RFC 3385,
  RFC 5044 §8.2 / Appendix); it is the ``crc32c`` package's C function itself (SSE4.2,
  three interleaved streams; it releases the GIL for large buffers), with a
  pure-Python table-driven fallback. ISA-L's Python binding (``isal``) offers only the
  CRC-32 of zlib, not CRC-32C, so the ``crc32c`` package is the fastest available here.

Both take any bytes-like object (bytes, bytearray, memoryview) and a running ``value``
from a previous call, so a CRC over several buffers needs no concatenation:
``crc32(b, crc32(a)) == crc32(a + b)``.

* :func:`crc32c_at` is the same CRC-32C over octets named by address (from
  :func:`buffer_address`), computed by ISA-L's ``crc32_iscsi`` (PCLMULQDQ folding), which
  the ``isal`` package's extension exports: on one machine about 1.8x the ``crc32c``
  package's speed on 64 KiB in cache (the MPA FPDUs of the iWARP data path, RFC 5044
  §4.1), on another half of it (see :func:`crc32c_by_address`), called through
  :mod:`ctypes` holding the GIL (as :data:`KEEP_GIL`). It is None where that symbol is
  not exported; callers then use :func:`crc32c`.
* :data:`crc32c_reg_at` is that ctypes function itself, on the uncomplemented CRC
  register (``crc32c_at(a, n, v) == crc32c_reg_at(a, n, v ^ M) ^ M``, ``M`` =
  :data:`CRC_MASK`): for the per-FPDU loops, which save the wrapper's Python frame (about
  a tenth of the call) by doing the two XORs inline.
* :func:`crc32c_by_address` tells those loops whether to use it at all: ISA-L picks its
  code by the CPU at run time, and whether it or the ``crc32c`` package is the faster
  depends on the machine, so the choice is measured once per process
  (``$SOFTRDMA_CRC32C`` = ``isal`` or ``crc32c`` makes it instead).
"""

from __future__ import annotations

import ctypes
import os
import time
import zlib
from collections.abc import Callable
from typing import Protocol, cast

Buffer = bytes | bytearray | memoryview

__all__ = ["Buffer", "CrcFunction", "CrcGilFunction", "KEEP_GIL", "crc32", "crc32_raw", "crc32c",
           "crc32c_gil", "crc32c_py", "CRC32_IMPL", "CRC32C_IMPL", "crc32c_at", "crc32c_reg_at",
           "CRC_MASK", "buffer_address", "crc32c_by_address", "CRC32C_CHOICE_ENV"]

_Crc = Callable[[Buffer, int], int]

_crc32_impl: _Crc
try:
    from isal import isal_zlib as _isal_zlib

    _crc32_impl = _isal_zlib.crc32
    CRC32_IMPL = "isal"
except ImportError:  # pragma: no cover - isal is a declared dependency
    _crc32_impl = zlib.crc32
    CRC32_IMPL = "zlib"


def crc32(data: Buffer, value: int = 0) -> int:
    """CRC-32 of ``data`` continuing from ``value`` (as :func:`zlib.crc32`)."""
    return _crc32_impl(data, value) & 0xFFFFFFFF


#: The implementation :func:`crc32` calls, without the wrapper: for per-packet code that
#: passes an unsigned 32-bit ``value`` (both implementations then return one unsigned).
crc32_raw: _Crc = _crc32_impl


def _make_table(poly: int) -> tuple[int, ...]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ poly if c & 1 else c >> 1
        table.append(c)
    return tuple(table)


_CRC32C_TABLE = _make_table(0x82F63B78)


def crc32c_py(data: Buffer, value: int = 0) -> int:
    """Pure-Python CRC-32C (table driven, a byte at a time): the fallback and test oracle."""
    table = _CRC32C_TABLE
    c = (value & 0xFFFFFFFF) ^ 0xFFFFFFFF
    for b in memoryview(data).cast("B"):
        c = table[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def _crc32c_fallback(data: Buffer, value: int = 0, /) -> int:
    """CRC-32C of ``data`` continuing from ``value`` (RFC 3385 / RFC 5044 §8)."""
    return crc32c_py(data, value)


class CrcFunction(Protocol):
    """``f(data, value=0) -> int``: a CRC over ``data`` continuing from ``value``."""

    def __call__(self, data: Buffer, value: int = 0, /) -> int: ...


class CrcGilFunction(Protocol):
    """``f(data, value, gil_release_mode) -> int``: :data:`crc32c` with the ``crc32c``
    package's GIL choice (:data:`KEEP_GIL`: hold it throughout)."""

    def __call__(self, data: Buffer, value: int, gil_release_mode: int, /) -> int: ...


#: ``gil_release_mode`` that keeps the GIL during the computation. The package's default
#: releases it for buffers over 32 KiB; on the iWARP data path (64 KiB FPDUs, a progress
#: thread beside the application's) that hands the GIL to the other thread mid-FPDU and
#: costs a thread switch to get it back: about 10 % more CPU per byte on each side of
#: ``bench/iwarp_write_bw.py``.
KEEP_GIL = 0


def _crc32c_gil_fallback(data: Buffer, value: int, gil_release_mode: int, /) -> int:
    return crc32c_py(data, value)


crc32c: CrcFunction
"""CRC-32C of ``data`` continuing from ``value`` (RFC 3385 / RFC 5044 §8):
``crc32c(data, value=0)``. With the ``crc32c`` package this *is* its C function (no
Python frame per call: the FPDU paths call it several times per FPDU); its result is
already a 32-bit unsigned value."""
crc32c_gil: CrcGilFunction
CRC32C_IMPL: str
"""``"crc32c"`` (the package) or ``"python"`` (:func:`crc32c_py`)."""

#: the names bound on first use (:func:`__getattr__`)
_LAZY = frozenset({"crc32c", "crc32c_gil", "CRC32C_IMPL"})


def __getattr__(name: str) -> object:
    """PEP 562: :data:`crc32c`, :data:`crc32c_gil` and :data:`CRC32C_IMPL` are bound when
    first asked for (``from softrdma.wire.crc import crc32c`` asks). Importing the
    ``crc32c`` package costs more than the rest of this module (it reads its own version
    through ``importlib.metadata``), and only iWARP uses CRC-32C: a RoCE process never
    pays for it."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    g = globals()
    try:
        from crc32c import crc32c as _crc32c_c

        g.update(crc32c=_crc32c_c, crc32c_gil=_crc32c_c, CRC32C_IMPL="crc32c")
    except ImportError:  # pragma: no cover - crc32c is a declared dependency
        g.update(crc32c=_crc32c_fallback, crc32c_gil=_crc32c_gil_fallback,
                 CRC32C_IMPL="python")
    return g[name]


_MASK32 = 0xFFFFFFFF
#: the CRC-32C pre- and post-conditioning XOR (RFC 3385): register = CRC value ^ CRC_MASK
CRC_MASK = _MASK32


def _isal_crc32c() -> Callable[[int, int, int], int] | None:
    """ISA-L's ``crc32_iscsi(buf, len, init)`` from the ``isal`` extension, if exported.
    It works on the uncomplemented register: ``crc32c(d, v) == f(d, len, v ^ M) ^ M``."""
    try:
        from isal import isal_zlib as _mod

        lib = ctypes.PyDLL(_mod.__file__)  # PyDLL: the call keeps the GIL
        fn = lib.crc32_iscsi
    except (ImportError, OSError, AttributeError):  # pragma: no cover - other isal builds
        return None
    fn.restype = ctypes.c_uint32
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
    probe = bytearray(b"123456789")
    if fn(ctypes.addressof(ctypes.c_char.from_buffer(probe)), 9, _MASK32) ^ _MASK32 \
            != 0xE3069283:  # pragma: no cover - RFC 3385's check value for "123456789"
        return None
    f: Callable[[int, int, int], int] = fn
    return f


def _bind_crc32c_at(iscsi: Callable[[int, int, int], int] | None
                    ) -> Callable[[int, int, int], int] | None:
    if iscsi is None:  # pragma: no cover - other isal builds
        return None

    def crc32c_at(addr: int, n: int, value: int = 0) -> int:
        """CRC-32C of the ``n`` octets (``n`` < 2**31: ISA-L takes an ``int``) at address
        ``addr`` continuing from ``value`` (as :func:`crc32c`); ``addr`` from
        :func:`buffer_address`, its buffer kept alive."""
        return iscsi(addr, n, value ^ _MASK32) ^ _MASK32

    return crc32c_at


#: ISA-L's ``crc32_iscsi(addr, n, register) -> register`` (see the module docstring), or
#: None where the ``isal`` build does not export it
crc32c_reg_at = _isal_crc32c()
crc32c_at = _bind_crc32c_at(crc32c_reg_at)


def buffer_address(buf: Buffer) -> int | None:
    """The address of a writable, contiguous byte buffer's first octet (for
    :func:`crc32c_at`); None for a read-only, empty or non-contiguous one. The address
    stays valid while the buffer lives and is not resized (registered memory, a
    runtime's preallocated receive buffer)."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(buf))
    except (TypeError, ValueError, BufferError):
        return None


#: ``isal``: the FPDU paths take the CRC-32C by address (:data:`crc32c_reg_at`) wherever
#: they can; ``crc32c``: never (the ``crc32c`` package over a view); unset or anything
#: else: :func:`crc32c_by_address` measures which is faster here
CRC32C_CHOICE_ENV = "SOFTRDMA_CRC32C"
_CALIBRATE_LEN = 64 * 1024  # an FPDU on the loopback (MSS 65483): the bulk case
_by_address: bool | None = None


def _best_ns(fn: Callable[[], object], calls: int = 8, rounds: int = 5) -> int:
    """The shortest of ``rounds`` timings of ``calls`` calls of ``fn``."""
    best = 1 << 62
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        t = time.perf_counter_ns() - t0
        if t < best:
            best = t
    return best


def crc32c_by_address() -> bool:
    """Whether the iWARP FPDU paths should compute CRC-32C by address with ISA-L
    (:data:`crc32c_reg_at`) rather than with the ``crc32c`` package over a memoryview.

    Decided once per process, at the first call. ``$SOFTRDMA_CRC32C`` (``isal`` or
    ``crc32c``) decides where set; otherwise both are timed on one 64 KiB buffer in cache
    (best of 5 rounds of 8 calls each, under a millisecond) and the faster is kept. ISA-L's
    ``crc32_iscsi`` dispatches on the CPU's features, and the outcome differs by machine:
    2.2 against 3.7 us per 64 KiB for ISA-L on the machine where this path was written,
    8.2 against 4.2 us (ISA-L slower) on an AMD EPYC without AVX-512, where ISA-L cost
    the iWARP engines 0.08 CPU s/GB more at the sender and 0.10 more at the receiver
    (``bench/iwarp_write_bw.py --engine --crc on``, issue 26). Both give the same CRC."""
    global _by_address
    if _by_address is None:
        _by_address = _choose_by_address(os.environ.get(CRC32C_CHOICE_ENV, ""))
    return _by_address


def _choose_by_address(choice: str) -> bool:
    """The decision of :func:`crc32c_by_address` for ``choice``, the environment's value
    (``isal``, ``crc32c``, or anything else: measure)."""
    at = crc32c_reg_at
    if at is None or choice == "crc32c":
        return False
    if choice == "isal":
        return True
    buf = bytearray(_CALIBRATE_LEN)
    view = memoryview(buf)
    addr = buffer_address(buf)
    if addr is None:  # pragma: no cover - a bytearray always has one
        return False
    pkg = cast(CrcGilFunction, __getattr__("crc32c_gil"))
    n = _CALIBRATE_LEN
    t_isal = _best_ns(lambda: at(addr, n, CRC_MASK))
    t_pkg = _best_ns(lambda: pkg(view, 0, KEEP_GIL))
    return t_isal < t_pkg
