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
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Protocol

Buffer = bytes | bytearray | memoryview

__all__ = ["Buffer", "CrcFunction", "CrcGilFunction", "KEEP_GIL", "crc32", "crc32_raw", "crc32c",
           "crc32c_gil", "crc32c_py", "CRC32_IMPL", "CRC32C_IMPL"]

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
crc32c_gil: CrcGilFunction
"""CRC-32C of ``data`` continuing from ``value`` (RFC 3385 / RFC 5044 §8):
``crc32c(data, value=0)``. With the ``crc32c`` package this *is* its C function (no
Python frame per call: the FPDU paths call it several times per FPDU); its result is
already a 32-bit unsigned value."""
try:
    from crc32c import crc32c as _crc32c_c

    crc32c = _crc32c_c
    crc32c_gil = _crc32c_c
    CRC32C_IMPL = "crc32c"
except ImportError:  # pragma: no cover - crc32c is a declared dependency
    crc32c = _crc32c_fallback
    crc32c_gil = _crc32c_gil_fallback
    CRC32C_IMPL = "python"
