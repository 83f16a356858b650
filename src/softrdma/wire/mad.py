"""Management datagrams: the 24-byte MAD common header and 256-byte MAD framing.

Implements IBA Vol 1 §13.4.2-13.4.3 (MAD format, common header)
as carried on the GSI (QP1, IBA 13.5.1) of a RoCE port:
every MAD is exactly :data:`MAD_SIZE` bytes, the header first, then :data:`MAD_DATA_SIZE`
bytes of class-specific data.

Header layout (big-endian)::

    0 BaseVersion(8) | 1 MgmtClass(8) | 2 ClassVersion(8) | 3 R(1) Method(7)
    4 Status(16) | 6 ClassSpecific(16) | 8 TransactionID(64)
    16 AttributeID(16) | 18 Reserved(16) | 20 AttributeModifier(32)

The module also provides :class:`Layout`, the codec behind every fixed MAD body in
``softrdma.wire`` (CM messages, IP CM private data, ...): a precompiled big-endian
``struct.Struct`` of byte-aligned units, each split into named bit fields listed most
significant bit first. Every bit of a unit belongs to a named field (reserved bits
included), so decode and encode are exact inverses.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, fields
from enum import IntEnum
from typing import Any, ClassVar, Self

from ..errors import DecodeError, InvalidArgument
from .fields import check_bits

__all__ = [
    "MAD_SIZE", "MAD_HDR_SIZE", "MAD_DATA_SIZE", "BASE_VERSION", "GSI_QPN", "GSI_QKEY",
    "MgmtClass", "Method", "CommonAttr", "MadStatus",
    "Layout", "Unit", "u8", "u16", "u32", "u64", "raw", "Body",
    "MadHeader", "decode_header", "split_mad", "build_mad",
]

MAD_SIZE = 256
MAD_HDR_SIZE = 24
MAD_DATA_SIZE = MAD_SIZE - MAD_HDR_SIZE  # 232
BASE_VERSION = 1

GSI_QPN = 1
# IBA 13.5.1: the well-known Q_Key of QP1, the GSI (linux IB_QP1_QKEY). The one
# definition: the transport's QP1 checks (ib/), the CM (drivers/cm/gsi.py) and devd's REJ use it.
GSI_QKEY = 0x80010000


class MgmtClass(IntEnum):
    """Management classes (IBA Table 110; umad_types.h)."""

    SUBN_LID_ROUTED = 0x01
    SUBN_ADM = 0x03  # SA
    PERF_MGMT = 0x04
    BM = 0x05
    DEVICE_MGMT = 0x06
    CM = 0x07
    SNMP = 0x08
    SUBN_DIRECTED_ROUTE = 0x81


class Method(IntEnum):
    """Common MAD methods (IBA Table 111); the R bit (0x80) marks responses."""

    GET = 0x01
    SET = 0x02
    SEND = 0x03
    TRAP = 0x05
    REPORT = 0x06
    TRAP_REPRESS = 0x07
    GET_RESP = 0x81
    REPORT_RESP = 0x86


class CommonAttr(IntEnum):
    """Attributes common to all classes (IBA 13.4.8)."""

    CLASS_PORT_INFO = 0x0001
    NOTICE = 0x0002
    INFORM_INFO = 0x0003


class MadStatus:
    """Bits of the common Status field (IBA Table 112; umad_types.h)."""

    BUSY = 0x0001
    REDIRECT = 0x0002
    INVALID_FIELD_MASK = 0x001C  # bits 4:2
    BAD_VERSION = 1 << 2
    METHOD_UNSUPPORTED = 2 << 2
    METHOD_ATTR_UNSUPPORTED = 3 << 2
    INVALID_ATTR_VALUE = 7 << 2
    CLASS_SPECIFIC_MASK = 0xFF00


# --------------------------------------------------------------------------- layouts
@dataclass(frozen=True, slots=True)
class Unit:
    """One byte-aligned piece of a layout.

    ``code`` is its ``struct`` code (``B``, ``H``, ``I``, ``Q`` or ``Ns``); ``fields`` the
    (name, bit width) pairs it is split into, most significant first (one entry for a
    byte string); ``pad`` allows a shorter byte string on encode (zero-filled).
    """

    code: str
    fields: tuple[tuple[str, int], ...]
    pad: bool = False


def u8(*fields: tuple[str, int] | str) -> Unit:
    """An 8-bit unit; a bare name is one field spanning the whole unit."""
    return _int_unit("B", 8, fields)


def u16(*fields: tuple[str, int] | str) -> Unit:
    """A 16-bit unit."""
    return _int_unit("H", 16, fields)


def u32(*fields: tuple[str, int] | str) -> Unit:
    """A 32-bit unit."""
    return _int_unit("I", 32, fields)


def u64(*fields: tuple[str, int] | str) -> Unit:
    """A 64-bit unit."""
    return _int_unit("Q", 64, fields)


def raw(size: int, name: str, *, pad: bool = False) -> Unit:
    """A byte string of ``size`` bytes (GIDs, private data, ARI ...)."""
    return Unit(f"{size}s", ((name, size * 8),), pad)


def _int_unit(code: str, bits: int, spec: Sequence[tuple[str, int] | str]) -> Unit:
    out = tuple((f, bits) if isinstance(f, str) else f for f in spec)
    if sum(w for _, w in out) != bits:
        raise ValueError(f"unit {out} does not cover exactly {bits} bits")
    return Unit(code, out)


class Layout:
    """A fixed big-endian layout: ``struct.Struct`` plus bit-field split/merge.

    Decoding produces a value for every named field; encoding checks every value against
    its width and raises :class:`InvalidArgument` naming ``what.field`` when it does not fit.
    """

    __slots__ = ("what", "units", "st", "size", "names", "widths", "_ops", "_flat", "_split",
                 "_vals", "_enc")

    def __init__(self, what: str, units: Sequence[Unit]) -> None:
        self.what = what
        self.units = tuple(units)
        self.st = struct.Struct("!" + "".join(u.code for u in self.units))
        self.size = self.st.size
        names: list[str] = []
        widths: dict[str, int] = {}
        # Per unit: (is_bytes, pad, ((name, shift, mask), ...)); for a byte string the
        # single entry is (name, size in bytes, 0).
        ops: list[tuple[bool, bool, tuple[tuple[str, int, int], ...]]] = []
        for u in self.units:
            if u.code.endswith("s"):
                name, w = u.fields[0]
                ops.append((True, u.pad, ((name, w // 8, 0),)))
                names.append(name)
                widths[name] = w
                continue
            shift = sum(w for _, w in u.fields)
            fops = []
            for name, w in u.fields:
                shift -= w
                fops.append((name, shift, (1 << w) - 1))
                names.append(name)
                widths[name] = w
            ops.append((False, False, tuple(fops)))
        if len(set(names)) != len(names):
            raise ValueError(f"{what}: duplicate field names")
        self.names = tuple(names)
        self.widths = widths
        self._ops = tuple(ops)
        # what the compiled encode checks: per unit (byte size, padded, ()) for a byte
        # string, (0, False, ((shift, mask), ...)) for an int unit
        self._flat = tuple((fops[0][1], pad, ()) if is_bytes
                           else (0, False, tuple((sh, m) for _, sh, m in fops))
                           for is_bytes, pad, fops in ops)
        # decode: per unit None when its value is the field's (a byte string, or one
        # field spanning the unit), else the (shift, mask) of each of its fields
        self._split = tuple(None if is_bytes or (len(fops) == 1 and fops[0][1] == 0)
                            else tuple((sh, m) for _, sh, m in fops)
                            for is_bytes, _pad, fops in ops)
        # compiled on first use: a process imports every CM layout and most use few
        # (a daemon's start-up took ~15 ms more when all were compiled at import)
        self._vals: Any = self._values_first
        self._enc: Any = self._encode_first

    def _values_first(self, buf: Any, offset: int = 0) -> list[Any]:
        self._vals, self._enc = self._compiled()
        return self._vals(buf, offset)  # type: ignore[no-any-return]

    def _encode_first(self, obj: object) -> bytes:
        self._vals, self._enc = self._compiled()
        return self._enc(obj)  # type: ignore[no-any-return]

    def _compiled(self) -> tuple[Any, Any]:
        """:meth:`values` and :meth:`encode` as straight-line code made for this layout:
        the same rules, without the per-field loop (a CM connection decodes and encodes
        ten MADs; the loops were ~40 % of their cost). Made at the first
        :meth:`values` or :meth:`encode` call."""
        n = len(self._split)
        us = [f"u{i}" for i in range(n)]
        outs: list[str] = []
        for u, split in zip(us, self._split, strict=True):
            if split is None:
                outs.append(u)
            else:
                outs.extend(f"({u} >> {sh}) & {m}" for sh, m in split)
        unpack = ", ".join(us) + ("," if n == 1 else "")
        src = [f"def values(buf, offset=0):\n    {unpack} = _unpack(buf, offset)\n"
               f"    return [{', '.join(outs)}]\n",
               "def encode(obj):"]
        args: list[str] = []
        k = 0
        for size, pad, fops in self._flat:
            if size:
                a = f"a{k}"
                k += 1
                src.append(f"    {a} = obj.{self.names[k - 1]}")
                short = f" and not len({a}) < {size}" if pad else ""
                src.append(f"    if type({a}) is not bytes or (len({a}) != {size}{short}):\n"
                           f"        return _checked(obj)")
                args.append(a)
                continue
            parts = []
            for shift, mask in fops:
                a = f"a{k}"
                k += 1
                src.append(f"    {a} = obj.{self.names[k - 1]}")
                src.append(f"    if (type({a}) is not int and (type({a}) is bool or not "
                           f"isinstance({a}, int))) or {a} < 0 or {a} > {mask}:\n"
                           f"        return _checked(obj)")
                parts.append(f"({a} << {shift})" if shift else a)
            args.append(" | ".join(parts))
        src.append(f"    return _pack({', '.join(args)})")
        env: dict[str, Any] = {"_unpack": self.st.unpack_from, "_pack": self.st.pack,
                               "_checked": self._encode_checked}
        exec("\n".join(src), env)  # noqa: S102 - names and numbers of this layout only
        return env["values"], env["encode"]

    def decode(self, buf: Any, offset: int = 0) -> dict[str, Any]:
        """Field values of the layout at ``buf[offset:]`` (the caller checks the length)."""
        return dict(zip(self.names, self.values(buf, offset), strict=True))

    def values(self, buf: Any, offset: int = 0) -> list[Any]:
        """The field values at ``buf[offset:]`` in the order of :attr:`names`."""
        return self._vals(buf, offset)  # type: ignore[no-any-return]

    def encode(self, obj: object) -> bytes:
        """Pack the attributes of ``obj`` named by the layout. Raises InvalidArgument.

        Values that are plain ints in range and byte strings that fit are packed at once
        (``struct`` zero-fills a short padded one); anything else (a bool, a bytearray,
        a bad value) takes :meth:`_encode_checked`, which packs it or names the field
        that does not fit."""
        return self._enc(obj)  # type: ignore[no-any-return]

    def _encode_checked(self, obj: object) -> bytes:
        """:meth:`encode` with every value checked on its own (names the bad field)."""
        args: list[int | bytes] = []
        for is_bytes, pad, fops in self._ops:
            if is_bytes:
                name, size, _ = fops[0]
                b = getattr(obj, name)
                if not isinstance(b, (bytes, bytearray, memoryview)):
                    raise InvalidArgument(f"{self.what}.{name}",
                                          f"must be bytes, got {type(b).__name__}")
                n = len(b)
                if n != size and not (pad and n < size):
                    want = f"at most {size}" if pad else f"exactly {size}"
                    raise InvalidArgument(f"{self.what}.{name}", f"must be {want} bytes, got {n}")
                args.append(bytes(b))  # struct zero-fills a short "Ns" value
                continue
            v = 0
            for name, shift, mask in fops:
                f = getattr(obj, name)
                if not isinstance(f, int) or isinstance(f, bool) and mask != 1:
                    raise InvalidArgument(f"{self.what}.{name}",
                                          f"must be an int, got {type(f).__name__}")
                check_bits(f"{self.what}.{name}", f, mask.bit_length())
                v |= f << shift
            args.append(v)
        return self.st.pack(*args)


class Body:
    """Base of the dataclasses coded by a :class:`Layout` (the class attribute LAYOUT).

    Subclasses are ``@dataclass(slots=True)`` classes whose fields are exactly the
    layout's field names (checked by :meth:`check_fields`).
    """

    __slots__ = ()
    LAYOUT: ClassVar[Layout]

    @classmethod
    def decode(cls, buf: Any, offset: int = 0) -> Self:
        """Decode ``buf[offset:offset + LAYOUT.size]``. Raises DecodeError if too short."""
        lay = cls.LAYOUT
        have = len(buf) - offset
        if have < lay.size:
            raise DecodeError(f"{lay.what}: needs {lay.size} bytes, got {max(have, 0)}")
        obj = cls(*lay._vals(buf, offset))  # fields in layout order (check_fields)
        obj.check_decoded()
        return obj

    def check_decoded(self) -> None:
        """Hook run on every decoded value: raise DecodeError for values the format forbids."""

    def encode(self) -> bytes:
        """The wire bytes (``LAYOUT.size`` of them). Raises InvalidArgument."""
        return self.LAYOUT._enc(self)  # type: ignore[no-any-return]

    @classmethod
    def check_fields(cls) -> None:
        """Raise TypeError unless the dataclass fields are exactly the layout's fields, in
        its order (:meth:`decode` passes the values to the constructor by position)."""
        have = tuple(f.name for f in fields(cls))  # type: ignore[arg-type]
        want = cls.LAYOUT.names
        if have != want:
            odd = sorted(set(have) ^ set(want))
            raise TypeError(f"{cls.__name__}: fields {odd or 'in another order'} disagree "
                            f"with its layout")


# --------------------------------------------------------------------------- header
@dataclass(slots=True)
class MadHeader(Body):
    """The MAD common header (IBA 13.4.2, Table 109). ``method`` includes the R bit."""

    base_version: int = BASE_VERSION
    mgmt_class: int = MgmtClass.CM
    class_version: int = 2
    method: int = Method.SEND
    status: int = 0
    class_specific: int = 0
    tid: int = 0
    attr_id: int = 0
    rsvd_18: int = 0
    attr_mod: int = 0

    LAYOUT: ClassVar[Layout] = Layout("mad", (
        u8("base_version"), u8("mgmt_class"), u8("class_version"), u8("method"),
        u16("status"), u16("class_specific"), u64("tid"),
        u16("attr_id"), u16("rsvd_18"), u32("attr_mod"),
    ))

    @property
    def is_response(self) -> bool:
        """The R bit (IBA 13.4.5): set on GetResp, ReportResp, ..."""
        return bool(self.method & 0x80)


MadHeader.check_fields()
assert MadHeader.LAYOUT.size == MAD_HDR_SIZE


def _check_size(mad: Any) -> None:
    n = len(mad)
    if n != MAD_SIZE:
        raise DecodeError(f"MAD must be {MAD_SIZE} bytes, got {n}")


def decode_header(mad: Any) -> MadHeader:
    """Decode the common header of a whole MAD (exactly 256 bytes, base version 1).

    Raises :class:`DecodeError` for a MAD of another size or base version.
    """
    _check_size(mad)
    h = MadHeader.decode(mad)
    if h.base_version != BASE_VERSION:
        raise DecodeError(f"MAD base version {h.base_version}, expected {BASE_VERSION}")
    return h


def split_mad(mad: Any) -> tuple[MadHeader, memoryview]:
    """(header, the 232 data bytes as a memoryview into ``mad``)."""
    h = decode_header(mad)
    return h, memoryview(mad).cast("B")[MAD_HDR_SIZE:]


def build_mad(hdr: MadHeader, data: bytes | bytearray | memoryview = b"") -> bytes:
    """A 256-byte MAD: ``hdr`` then ``data`` zero-filled to 232 bytes."""
    n = len(data)
    if n > MAD_DATA_SIZE:
        raise InvalidArgument("data", f"MAD data is at most {MAD_DATA_SIZE} bytes, got {n}")
    return hdr.encode() + bytes(data) + bytes(MAD_DATA_SIZE - n)
