"""DDP (RFC 5041) and RDMAP (RFC 5040) headers and the Terminate message; the iWARP
error-code tables it carries (RFC 5040 §7, RFC 5041 §7, RFC 5044 §8, RFC 6581 §8) are
:mod:`softrdma.wire.iwarp_errors`, re-exported here.

Byte layouts follow RFC 5041 (all big-endian):

* DDP control byte (RFC 5041 §4.2): ``T(1) L(1) Rsvd(4) DV(2)``; DV = 1.
* RDMAP control byte = the DDP "RsvdULP" byte (RFC 5040 §4.1): ``RV(2) Rsvd(2) Opcode(4)``; RV = 1.
* Tagged header (14 bytes, RFC 5041 §4.3): ``ctrl | rdmap ctrl | STag(32) | TO(64)``.
* Untagged header (18 bytes, RFC 5041 §4.4): ``ctrl | rdmap ctrl | RsvdULP(32) | QN(32) |
  MSN(32) | MO(32)``; RDMAP puts the Invalidate STag in RsvdULP (RFC 5040 §4.3).
* Read Request header (28 bytes, RFC 5040 §4.4): sink STag, sink TO, message size,
  source STag, source TO.
* Terminate header (RFC 5040 §4.8): ``Layer(4) EType(4) ErrorCode(8) M D R Rsvd(13)``,
  then the DDP Segment Length (16, present when M or D), the terminated DDP header
  (14 or 18 bytes, when D) and the terminated RDMAP header (28 bytes, when R).

Reserved bits and version fields are kept, so :func:`decode_segment` and
:func:`encode_segment` are exact inverses for every input that decodes; whether a
version or opcode is acceptable is the engine's decision (it answers with a Terminate).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import ClassVar

from ..errors import DecodeError, InvalidArgument
from .fields import U16, check_bits

# the error tables of the Terminate message, re-exported for its callers
from .iwarp_errors import DdpEtype as DdpEtype
from .iwarp_errors import DdpTaggedErrorCode as DdpTaggedErrorCode
from .iwarp_errors import DdpUntaggedErrorCode as DdpUntaggedErrorCode
from .iwarp_errors import LlpEtype as LlpEtype
from .iwarp_errors import MpaErrorCode as MpaErrorCode
from .iwarp_errors import RdmapErrorCode as RdmapErrorCode
from .iwarp_errors import RdmapEtype as RdmapEtype
from .iwarp_errors import TerminateLayer as TerminateLayer
from .iwarp_errors import error_name as error_name

TAGGED = struct.Struct("!BBIQ")
UNTAGGED = struct.Struct("!BBIIII")
READ_REQ = struct.Struct("!IQIIQ")
TERM_CTRL = struct.Struct("!I")

TAGGED_HDR_LEN = TAGGED.size  # 14
UNTAGGED_HDR_LEN = UNTAGGED.size  # 18
READ_REQ_LEN = READ_REQ.size  # 28
TERM_CTRL_LEN = TERM_CTRL.size  # 4

DDP_T = 0x80
DDP_L = 0x40
DDP_RSVD_MASK = 0x3C
DDP_DV_MASK = 0x03
DDP_VERSION = 1
RDMAP_RV_SHIFT = 6
RDMAP_RSVD_MASK = 0x30
RDMAP_OPCODE_MASK = 0x0F
RDMAP_VERSION = 1

# Queue numbers of the untagged buffer model (RFC 5040 §5.1).
QN_SEND = 0
QN_READ_REQUEST = 1
QN_TERMINATE = 2


class RdmapOpcode(IntEnum):
    """RDMAP opcodes (RFC 5040 §4.1 Figure 2; 0x8-0xB from RFC 7306)."""

    RDMA_WRITE = 0x0
    RDMA_READ_REQUEST = 0x1
    RDMA_READ_RESPONSE = 0x2
    SEND = 0x3
    SEND_INVALIDATE = 0x4
    SEND_SE = 0x5
    SEND_SE_INVALIDATE = 0x6
    TERMINATE = 0x7
    IMMEDIATE_DATA = 0x8
    IMMEDIATE_DATA_SE = 0x9
    ATOMIC_REQUEST = 0xA
    ATOMIC_RESPONSE = 0xB


OPCODE_NAMES: dict[int, str] = {
    RdmapOpcode.RDMA_WRITE: "RDMA Write",
    RdmapOpcode.RDMA_READ_REQUEST: "RDMA Read Request",
    RdmapOpcode.RDMA_READ_RESPONSE: "RDMA Read Response",
    RdmapOpcode.SEND: "Send",
    RdmapOpcode.SEND_INVALIDATE: "Send with Invalidate",
    RdmapOpcode.SEND_SE: "Send with Solicited Event",
    RdmapOpcode.SEND_SE_INVALIDATE: "Send with Solicited Event and Invalidate",
    RdmapOpcode.TERMINATE: "Terminate",
    RdmapOpcode.IMMEDIATE_DATA: "Immediate Data",
    RdmapOpcode.IMMEDIATE_DATA_SE: "Immediate Data with Solicited Event",
    RdmapOpcode.ATOMIC_REQUEST: "Atomic Request",
    RdmapOpcode.ATOMIC_RESPONSE: "Atomic Response",
}


def opcode_name(opcode: int) -> str:
    """Readable RDMAP opcode name; reserved values read ``reserved opcode 0xN``."""
    return OPCODE_NAMES.get(opcode, f"reserved opcode {opcode:#x}")


# --- headers -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DdpTagged:
    """DDP tagged buffer header with the RDMAP control byte (RFC 5041 §4.3, RFC 5040 §4.1)."""

    opcode: int
    stag: int
    to: int
    last: bool = True
    ddp_rsvd: int = 0
    dv: int = DDP_VERSION
    rv: int = RDMAP_VERSION
    rdmap_rsvd: int = 0

    #: the T bit (RFC 5041 §4.2) and the header's length with the RDMAP control byte
    tagged: ClassVar[bool] = True
    hdr_len: ClassVar[int] = TAGGED_HDR_LEN


@dataclass(frozen=True, slots=True)
class DdpUntagged:
    """DDP untagged buffer header with the RDMAP control byte (RFC 5041 §4.4, RFC 5040 §4.1).

    ``rsvdulp`` is the Invalidate STag for Send with Invalidate (RFC 5040 §4.3), else 0.
    """

    opcode: int
    qn: int
    msn: int
    mo: int = 0
    last: bool = True
    rsvdulp: int = 0
    ddp_rsvd: int = 0
    dv: int = DDP_VERSION
    rv: int = RDMAP_VERSION
    rdmap_rsvd: int = 0

    #: the T bit (RFC 5041 §4.2) and the header's length with the RDMAP control byte
    tagged: ClassVar[bool] = False
    hdr_len: ClassVar[int] = UNTAGGED_HDR_LEN


DdpHeader = DdpTagged | DdpUntagged


def _ctrl_bytes(h: DdpHeader) -> tuple[int, int]:
    ddp = ((DDP_T if h.tagged else 0) | (DDP_L if h.last else 0)
           | ((h.ddp_rsvd & 0xF) << 2) | (h.dv & DDP_DV_MASK))
    rdmap = ((h.rv & 3) << RDMAP_RV_SHIFT) | ((h.rdmap_rsvd & 3) << 4) | (h.opcode & RDMAP_OPCODE_MASK)
    return ddp, rdmap


def decode_ddp(buf: bytes | bytearray | memoryview, offset: int = 0) -> DdpHeader:
    """Decode the DDP header (tagged or untagged by the T bit) at ``offset`` (RFC 5041 §4)."""
    n = len(buf) - offset
    if n < 1:
        raise DecodeError("DDP segment is empty")
    c = buf[offset]
    if c & DDP_T:
        if n < TAGGED_HDR_LEN:
            raise DecodeError(f"DDP tagged header needs {TAGGED_HDR_LEN} bytes, have {n}")
        c, r, stag, to = TAGGED.unpack_from(buf, offset)
        return DdpTagged(r & RDMAP_OPCODE_MASK, stag, to, bool(c & DDP_L), (c & DDP_RSVD_MASK) >> 2,
                         c & DDP_DV_MASK, r >> RDMAP_RV_SHIFT, (r & RDMAP_RSVD_MASK) >> 4)
    if n < UNTAGGED_HDR_LEN:
        raise DecodeError(f"DDP untagged header needs {UNTAGGED_HDR_LEN} bytes, have {n}")
    c, r, ulp, qn, msn, mo = UNTAGGED.unpack_from(buf, offset)
    return DdpUntagged(r & RDMAP_OPCODE_MASK, qn, msn, mo, bool(c & DDP_L), ulp,
                       (c & DDP_RSVD_MASK) >> 2, c & DDP_DV_MASK, r >> RDMAP_RV_SHIFT,
                       (r & RDMAP_RSVD_MASK) >> 4)


def encode_ddp(h: DdpHeader) -> bytes:
    """The 14- or 18-byte DDP header of ``h``; inverse of :func:`decode_ddp`."""
    for name, value, bits in (("opcode", h.opcode, 4), ("ddp_rsvd", h.ddp_rsvd, 4), ("dv", h.dv, 2),
                              ("rv", h.rv, 2), ("rdmap_rsvd", h.rdmap_rsvd, 2)):
        check_bits(name, value, bits)
    c, r = _ctrl_bytes(h)
    try:
        if isinstance(h, DdpTagged):
            return TAGGED.pack(c, r, h.stag, h.to)
        return UNTAGGED.pack(c, r, h.rsvdulp, h.qn, h.msn, h.mo)
    except struct.error as e:
        raise InvalidArgument("ddp header", f"field out of range: {e}") from None


@dataclass(frozen=True, slots=True)
class ReadRequest:
    """RDMA Read Request header (RFC 5040 §4.4)."""

    sink_stag: int
    sink_to: int
    size: int
    src_stag: int
    src_to: int

    def encode(self) -> bytes:
        try:
            return READ_REQ.pack(self.sink_stag, self.sink_to, self.size, self.src_stag, self.src_to)
        except struct.error as e:
            raise InvalidArgument("read request", f"field out of range: {e}") from None

    @classmethod
    def decode(cls, buf: bytes | bytearray | memoryview, offset: int = 0) -> ReadRequest:
        if len(buf) - offset < READ_REQ_LEN:
            raise DecodeError(f"RDMA Read Request header needs {READ_REQ_LEN} bytes, "
                              f"have {len(buf) - offset}")
        return cls(*READ_REQ.unpack_from(buf, offset))


@dataclass(frozen=True, slots=True)
class Terminate:
    """Terminate header (RFC 5040 §4.8).

    ``ddp_seg_len`` is present iff M or D; ``ddp_hdr`` (the terminated DDP header, 14 or
    18 bytes by its T bit) iff D; ``rdmap_hdr`` (28 bytes) iff R. ``trailing`` keeps any
    bytes after them so that decoding stays lossless.
    """

    layer: int
    etype: int
    code: int
    m: bool = False
    d: bool = False
    r: bool = False
    reserved: int = 0
    ddp_seg_len: int | None = None
    ddp_hdr: bytes | None = None
    rdmap_hdr: bytes | None = None
    trailing: bytes = b""

    def encode(self) -> bytes:
        check_bits("layer", self.layer, 4)
        check_bits("etype", self.etype, 4)
        check_bits("code", self.code, 8)
        check_bits("reserved", self.reserved, 13)
        w = ((self.layer << 28) | (self.etype << 24) | (self.code << 16) | (0x8000 if self.m else 0)
             | (0x4000 if self.d else 0) | (0x2000 if self.r else 0) | self.reserved)
        parts = [TERM_CTRL.pack(w)]
        if self.m or self.d:
            if self.ddp_seg_len is None:
                raise InvalidArgument("ddp_seg_len", "required when M or D is set")
            check_bits("ddp_seg_len", self.ddp_seg_len, 16)
            parts.append(U16.pack(self.ddp_seg_len))
        elif self.ddp_seg_len is not None:
            raise InvalidArgument("ddp_seg_len", "present only when M or D is set")
        if self.d:
            if self.ddp_hdr is None or len(self.ddp_hdr) != _ddp_hdr_len(self.ddp_hdr):
                raise InvalidArgument("ddp_hdr", "D needs a whole terminated DDP header")
            parts.append(bytes(self.ddp_hdr))
        elif self.ddp_hdr is not None:
            raise InvalidArgument("ddp_hdr", "present only when D is set")
        if self.r:
            if self.rdmap_hdr is None or len(self.rdmap_hdr) != READ_REQ_LEN:
                raise InvalidArgument("rdmap_hdr", f"R needs the {READ_REQ_LEN}-byte RDMAP header")
            parts.append(bytes(self.rdmap_hdr))
        elif self.rdmap_hdr is not None:
            raise InvalidArgument("rdmap_hdr", "present only when R is set")
        parts.append(bytes(self.trailing))
        return b"".join(parts)

    @classmethod
    def decode(cls, buf: bytes | bytearray | memoryview, offset: int = 0) -> Terminate:
        end = len(buf)
        if end - offset < TERM_CTRL_LEN:
            raise DecodeError(f"Terminate header needs {TERM_CTRL_LEN} bytes, have {end - offset}")
        (w,) = TERM_CTRL.unpack_from(buf, offset)
        off = offset + TERM_CTRL_LEN
        m, d, r = bool(w & 0x8000), bool(w & 0x4000), bool(w & 0x2000)
        seg_len: int | None = None
        ddp_hdr: bytes | None = None
        rdmap_hdr: bytes | None = None
        if m or d:
            if end - off < 2:
                raise DecodeError("Terminate: M/D set but no DDP Segment Length")
            (seg_len,) = U16.unpack_from(buf, off)
            off += 2
        if d:
            if end - off < 1:
                raise DecodeError("Terminate: D set but no terminated DDP header")
            hl = TAGGED_HDR_LEN if buf[off] & DDP_T else UNTAGGED_HDR_LEN
            if end - off < hl:
                raise DecodeError(f"Terminate: terminated DDP header needs {hl} bytes, have {end - off}")
            ddp_hdr = bytes(buf[off:off + hl])
            off += hl
        if r:
            if end - off < READ_REQ_LEN:
                raise DecodeError(f"Terminate: terminated RDMAP header needs {READ_REQ_LEN} bytes, "
                                  f"have {end - off}")
            rdmap_hdr = bytes(buf[off:off + READ_REQ_LEN])
            off += READ_REQ_LEN
        return cls(w >> 28, (w >> 24) & 0xF, (w >> 16) & 0xFF, m, d, r, w & 0x1FFF, seg_len, ddp_hdr,
                   rdmap_hdr, bytes(buf[off:end]))

    def describe(self) -> str:
        flags = "".join(f for f, on in (("M", self.m), ("D", self.d), ("R", self.r)) if on)
        s = f"{error_name(self.layer, self.etype, self.code)}"
        if flags:
            s += f" hdrct={flags}"
        if self.ddp_seg_len is not None:
            s += f" seglen={self.ddp_seg_len}"
        if self.ddp_hdr is not None:
            try:
                s += f" [{describe_ddp(decode_ddp(self.ddp_hdr))}]"
            except DecodeError:
                pass
        return s


def _ddp_hdr_len(h: bytes) -> int:
    return (TAGGED_HDR_LEN if h[0] & DDP_T else UNTAGGED_HDR_LEN) if h else 0


# --- one DDP segment as RDMAP sees it --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Segment:
    """One DDP segment (an MPA ULPDU): DDP header, RDMAP header if any, payload.

    ``read_request`` is set for an untagged RDMA Read Request, ``terminate`` for an
    untagged Terminate; ``payload`` is a memoryview into the decoded buffer (no copy).
    """

    ddp: DdpHeader
    payload: bytes | memoryview = b""
    read_request: ReadRequest | None = None
    terminate: Terminate | None = None

    def describe(self) -> str:
        return describe(self)


def decode_segment(ulpdu: bytes | bytearray | memoryview) -> Segment:
    """Decode an MPA ULPDU into DDP + RDMAP headers and payload (RFC 5041 §4, RFC 5040 §4)."""
    mv = memoryview(ulpdu)
    h = decode_ddp(mv)
    off = h.hdr_len
    rr: ReadRequest | None = None
    term: Terminate | None = None
    if isinstance(h, DdpUntagged):
        if h.opcode == RdmapOpcode.RDMA_READ_REQUEST:
            rr = ReadRequest.decode(mv, off)
            off += READ_REQ_LEN
        elif h.opcode == RdmapOpcode.TERMINATE:
            term = Terminate.decode(mv, off)
            off = len(mv)
    return Segment(h, mv[off:], rr, term)


def encode_segment_headers(seg: Segment) -> bytes:
    """DDP header + RDMAP header of ``seg`` (everything but the payload)."""
    hdr = encode_ddp(seg.ddp)
    untagged = isinstance(seg.ddp, DdpUntagged)
    if seg.read_request is not None:
        if not (untagged and seg.ddp.opcode == RdmapOpcode.RDMA_READ_REQUEST):
            raise InvalidArgument("read_request", "only an untagged RDMA Read Request carries one")
        hdr += seg.read_request.encode()
    elif untagged and seg.ddp.opcode == RdmapOpcode.RDMA_READ_REQUEST:
        raise InvalidArgument("read_request", "an untagged RDMA Read Request needs its header")
    if seg.terminate is not None:
        if not (untagged and seg.ddp.opcode == RdmapOpcode.TERMINATE):
            raise InvalidArgument("terminate", "only an untagged Terminate carries one")
        if len(seg.payload):
            raise InvalidArgument("payload", "a Terminate has no payload after its header")
        hdr += seg.terminate.encode()
    elif untagged and seg.ddp.opcode == RdmapOpcode.TERMINATE:
        raise InvalidArgument("terminate", "an untagged Terminate needs its header")
    return hdr


def encode_segment(seg: Segment) -> list[bytes | memoryview]:
    """``[headers, payload]`` (payload not copied); inverse of :func:`decode_segment`."""
    hdr = encode_segment_headers(seg)
    if len(seg.payload):
        return [hdr, memoryview(seg.payload)]
    return [hdr]


def encode_segment_bytes(seg: Segment) -> bytes:
    """The whole ULPDU of ``seg`` as one bytes object."""
    return b"".join(encode_segment(seg))


def describe_ddp(h: DdpHeader) -> str:
    """One readable line for a DDP header."""
    s = opcode_name(h.opcode)
    if isinstance(h, DdpTagged):
        s += f" STag={h.stag:#010x} TO={h.to:#x}"
    else:
        s += f" QN={h.qn} MSN={h.msn} MO={h.mo}"
        if h.rsvdulp:
            s += f" InvSTag={h.rsvdulp:#010x}"
    s += " L" if h.last else " (more)"
    if h.dv != DDP_VERSION:
        s += f" DV={h.dv}"
    if h.rv != RDMAP_VERSION:
        s += f" RV={h.rv}"
    if h.ddp_rsvd or h.rdmap_rsvd:
        s += f" rsvd={h.ddp_rsvd:#x}/{h.rdmap_rsvd:#x}"
    return s


def describe(seg: Segment) -> str:
    """One readable line for a decoded segment, e.g. ``Send QN=0 MSN=1 MO=0 L len=5``."""
    s = describe_ddp(seg.ddp)
    rr = seg.read_request
    if rr is not None:
        s += (f" sink={rr.sink_stag:#010x}@{rr.sink_to:#x} size={rr.size}"
              f" src={rr.src_stag:#010x}@{rr.src_to:#x}")
    if seg.terminate is not None:
        s += f" {seg.terminate.describe()}"
    if len(seg.payload):
        s += f" len={len(seg.payload)}"
    return s


_TAGGED_OPCODES = frozenset((RdmapOpcode.RDMA_WRITE, RdmapOpcode.RDMA_READ_RESPONSE))
_OPCODE_QN = {
    RdmapOpcode.RDMA_READ_REQUEST: QN_READ_REQUEST,
    RdmapOpcode.SEND: QN_SEND,
    RdmapOpcode.SEND_INVALIDATE: QN_SEND,
    RdmapOpcode.SEND_SE: QN_SEND,
    RdmapOpcode.SEND_SE_INVALIDATE: QN_SEND,
    RdmapOpcode.TERMINATE: QN_TERMINATE,
}
_INVALIDATE_OPCODES = frozenset((RdmapOpcode.SEND_INVALIDATE, RdmapOpcode.SEND_SE_INVALIDATE))


def check_segment(seg: Segment) -> str | None:
    """The first RFC 5040/5041 rule ``seg`` breaks, or ``None``: versions (DV = RV = 1),
    reserved control bits zero, an RFC 5040 opcode on its buffer model and queue
    (RFC 5040 §4.1, §5.1), RsvdULP zero unless an Invalidate STag is carried (§4.3), and a
    Read Request / Terminate being one whole segment (§4.4, §4.8)."""
    h = seg.ddp
    if h.dv != DDP_VERSION:
        return f"DDP version {h.dv}, expected {DDP_VERSION}"
    if h.rv != RDMAP_VERSION:
        return f"RDMAP version {h.rv}, expected {RDMAP_VERSION}"
    if h.ddp_rsvd or h.rdmap_rsvd:
        return f"reserved control bits set (DDP {h.ddp_rsvd:#x}, RDMAP {h.rdmap_rsvd:#x})"
    op = h.opcode
    name = opcode_name(op)
    if op > RdmapOpcode.TERMINATE:
        return f"unexpected RDMAP opcode {op:#x} ({name})"
    if isinstance(h, DdpTagged):
        if op not in _TAGGED_OPCODES:
            return f"{name} must use the untagged buffer model"
        return None
    if op in _TAGGED_OPCODES:
        return f"{name} must use the tagged buffer model"
    qn = _OPCODE_QN[RdmapOpcode(op)]
    if h.qn != qn:
        return f"{name} on QN {h.qn}, expected {qn}"
    if h.rsvdulp and op not in _INVALIDATE_OPCODES:
        return f"{name} with nonzero RsvdULP {h.rsvdulp:#x}"
    if op in (RdmapOpcode.RDMA_READ_REQUEST, RdmapOpcode.TERMINATE):
        if not h.last or h.mo != 0:
            return f"{name} must be a single DDP segment (L=1, MO=0)"
        if len(seg.payload):
            return f"{name} with {len(seg.payload)} bytes after its header"
    return None
