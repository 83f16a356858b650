"""MPA: connection setup frames, FPDU framing, markers and CRC (RFC 5044, RFC 6581).

Implements RFC 5044 §7.1, RFC 6581:

* MPA Request/Reply frames (RFC 5044 §7.1): :class:`MpaRequest`, :class:`MpaReply`
  (``encode`` / :func:`decode_mpa_frame`), the RFC 6581 enhanced-connection block
  (:class:`MpaV2Params`) and :class:`MpaFrameParser`, an incremental parser for the
  setup phase whose errors carry the MPA error code for the later Terminate.
* FPDUs (RFC 5044 §4.1-§4.3): ``ULPDU_Length(16) | ULPDU | PAD | CRC(32)``, where the
  pad makes ``2 + ULPDU_Length + PAD`` a multiple of 4 and the CRC is CRC32c over
  everything before it (markers included), stored least-significant byte first; with
  CRC off the field is present and 0. :func:`fpdu_encode` builds one without copying the
  payload (no markers); :class:`FpduEncoder` / :class:`FpduDeframer` are the stateful
  per-direction encoder and decoder, markers optional.
* Markers (RFC 5044 §5): 4 bytes ``Reserved(16) | FPDUPTR(16)`` at every 512th octet of
  the direction's stream, counted from the first octet of its first FPDU. FPDUPTR is the
  distance back from the marker to the start of the FPDU it lies in; a marker exactly at
  an FPDU boundary belongs to the FPDU that follows and has FPDUPTR 0. Markers are
  excluded from ULPDU_Length, covered by the CRC, and may fall between PAD and CRC.
* :func:`mulpdu` (RFC 5044 §4.2).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from ..errors import DecodeError, InvalidArgument, StateError
from .crc import Buffer, crc32c
from .ddp import TAGGED_HDR_LEN, MpaErrorCode
from .fields import U16, check_bits

__all__ = [
    "KEY_REQ", "KEY_REP", "KEY_LEN", "MPA_HDR_LEN", "MPA_MAX_PRIVDATA", "MPA_MAX_PRIVDATA_SEND",
    "FLAG_MARKERS", "FLAG_CRC", "FLAG_REJECT", "FLAG_ENHANCED", "MARKER_INTERVAL",
    "MpaError", "MpaFrameError", "MpaCrcError", "MpaMarkerError", "MpaLengthError",
    "MpaV2Params", "MpaFrame", "MpaRequest", "MpaReply", "decode_mpa_frame", "MpaFrameParser",
    "pad_len", "fpdu_encode", "marked_span", "Fpdu", "FpduEncoder", "FpduDeframer", "mulpdu",
]

KEY_REQ = b"MPA ID Req Frame"
KEY_REP = b"MPA ID Rep Frame"
KEY_LEN = 16
MPA_HDR_LEN = 20
MPA_MAX_PRIVDATA = 512  # RFC 5044 §7.1: PD_Length MUST NOT exceed 512
MPA_MAX_PRIVDATA_SEND = 256  # Linux (siw, cxgb4, rdma_cm) limit; keep to it for interop

FLAG_MARKERS = 0x80
FLAG_CRC = 0x40
FLAG_REJECT = 0x20
FLAG_ENHANCED = 0x10  # RFC 6581 enhanced RDMA connection establishment
FLAG_RESERVED = 0x0F

MPA_REVISION_1 = 1
MPA_REVISION_2 = 2

MARKER_INTERVAL = 512
MARKER_LEN = 4
ULPDU_LEN_LEN = 2
CRC_LEN = 4

_HDR = struct.Struct("!16sBBH")
_V2 = struct.Struct("!HH")
_MARKER = struct.Struct("!HH")
_CRC = struct.Struct("<I")
_ZERO_PAD = (b"", b"\0", b"\0\0", b"\0\0\0")

# RFC 6581 §5 IRD/ORD block bits (names as siw/cxgb4; RFC letters A-D unverified).
V2_PEER_TO_PEER = 0x8000  # in the IRD word
V2_RTR_SEND = 0x4000  # in the IRD word: zero-length Send RTR
V2_RTR_WRITE = 0x8000  # in the ORD word: zero-length RDMA Write RTR
V2_RTR_READ = 0x4000  # in the ORD word: zero-length RDMA Read RTR
V2_DEPTH_MASK = 0x3FFF


# --- errors --------------------------------------------------------------------------------


class MpaError(DecodeError):
    """An MPA protocol error; ``code`` is the MPA error code for the Terminate (RFC 5044 §8)."""

    code: MpaErrorCode = MpaErrorCode.LOCAL_CATASTROPHIC

    def __init__(self, message: str, code: MpaErrorCode | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        #: FPDUs completed by the same :meth:`FpduDeframer.feed` call before this error.
        self.fpdus: list[Fpdu] = []


class MpaFrameError(MpaError):
    """Invalid MPA Request/Reply frame: wrong key, PD too long, bad revision (code 0x04)."""

    code = MpaErrorCode.INVALID_REQ_REP


class MpaLengthError(MpaError):
    """ULPDU_Length out of range: FPDU framing lost (code 0x03); the stream is unusable."""

    code = MpaErrorCode.MARKER_MISMATCH


class MpaMarkerError(MpaError):
    """A marker's FPDUPTR does not point at its FPDU (code 0x03); the stream is unusable."""

    code = MpaErrorCode.MARKER_MISMATCH


class MpaCrcError(MpaError):
    """An FPDU's CRC32c does not match (code 0x02). The FPDU (``fpdu``) was consumed."""

    code = MpaErrorCode.CRC_MISMATCH

    def __init__(self, message: str, fpdu: Fpdu, computed: int) -> None:
        super().__init__(message)
        self.fpdu = fpdu
        self.computed = computed


# --- MPA Request / Reply (RFC 5044 §7.1, RFC 6581 §5) --------------------------------------


@dataclass(frozen=True, slots=True)
class MpaV2Params:
    """The RFC 6581 IRD/ORD block: the first 4 bytes of private data when Enhanced is set.

    ``peer_to_peer`` asks for (Request) / accepts (Reply) an RTR message; ``rtr_send``,
    ``rtr_write``, ``rtr_read`` are the zero-length RTR types offered / chosen.
    """

    ird: int
    ord: int
    peer_to_peer: bool = False
    rtr_send: bool = False
    rtr_write: bool = False
    rtr_read: bool = False

    def encode(self) -> bytes:
        check_bits("ird", self.ird, 14)
        check_bits("ord", self.ord, 14)
        w1 = self.ird | (V2_PEER_TO_PEER if self.peer_to_peer else 0) | (V2_RTR_SEND if self.rtr_send else 0)
        w2 = self.ord | (V2_RTR_WRITE if self.rtr_write else 0) | (V2_RTR_READ if self.rtr_read else 0)
        return _V2.pack(w1, w2)

    @classmethod
    def decode(cls, buf: Buffer) -> MpaV2Params:
        if len(buf) < 4:
            raise MpaFrameError(f"MPA v2 IRD/ORD block needs 4 bytes, have {len(buf)}")
        w1, w2 = _V2.unpack_from(buf, 0)
        return cls(w1 & V2_DEPTH_MASK, w2 & V2_DEPTH_MASK, bool(w1 & V2_PEER_TO_PEER),
                   bool(w1 & V2_RTR_SEND), bool(w2 & V2_RTR_WRITE), bool(w2 & V2_RTR_READ))


@dataclass(frozen=True, slots=True)
class MpaFrame:
    """An MPA Request or Reply frame (RFC 5044 §7.1). ``private_data`` is all PD_Length
    bytes, including the RFC 6581 block when ``enhanced``; ``reserved`` is flag bits 3..0."""

    KEY: ClassVar[bytes] = b""

    markers: bool = False
    crc: bool = False
    reject: bool = False
    enhanced: bool = False
    revision: int = MPA_REVISION_2
    private_data: bytes = b""
    reserved: int = 0

    @property
    def flags(self) -> int:
        return ((FLAG_MARKERS if self.markers else 0) | (FLAG_CRC if self.crc else 0)
                | (FLAG_REJECT if self.reject else 0) | (FLAG_ENHANCED if self.enhanced else 0)
                | (self.reserved & FLAG_RESERVED))

    @property
    def v2(self) -> MpaV2Params | None:
        """The IRD/ORD block, when this is a revision 2 frame with Enhanced set."""
        if self.enhanced and self.revision == MPA_REVISION_2 and len(self.private_data) >= 4:
            return MpaV2Params.decode(self.private_data)
        return None

    @property
    def user_data(self) -> bytes:
        """The private data the ULP sees (after the IRD/ORD block, if any)."""
        return self.private_data[4:] if self.v2 is not None else self.private_data

    def encode(self) -> bytes:
        """The frame's 20 + PD_Length bytes; inverse of :func:`decode_mpa_frame`."""
        if len(self.KEY) != KEY_LEN:
            raise InvalidArgument("frame", "use MpaRequest or MpaReply, not MpaFrame")
        check_bits("reserved", self.reserved, 4)
        check_bits("revision", self.revision, 8)
        if len(self.private_data) > MPA_MAX_PRIVDATA:
            raise InvalidArgument("private_data", f"{len(self.private_data)} bytes, "
                                  f"RFC 5044 allows {MPA_MAX_PRIVDATA}")
        return _HDR.pack(self.KEY, self.flags, self.revision, len(self.private_data)) + bytes(self.private_data)

    @classmethod
    def build(cls, *, v2: MpaV2Params | None = None, user_data: bytes = b"", crc: bool = False,
              markers: bool = False, reject: bool = False, revision: int = MPA_REVISION_2) -> MpaFrame:
        """A frame to send: Enhanced + the v2 block when ``v2`` is given (revision 2 only);
        the whole private data is limited to :data:`MPA_MAX_PRIVDATA_SEND` bytes."""
        if v2 is not None and revision != MPA_REVISION_2:
            raise InvalidArgument("revision", "the RFC 6581 IRD/ORD block needs revision 2")
        pd = (v2.encode() if v2 is not None else b"") + bytes(user_data)
        if len(pd) > MPA_MAX_PRIVDATA_SEND:
            raise InvalidArgument("user_data", f"private data of {len(pd)} bytes exceeds "
                                  f"{MPA_MAX_PRIVDATA_SEND}")
        return cls(markers, crc, reject, v2 is not None, revision, pd)

    def describe(self) -> str:
        kind = "MPA Reply" if self.KEY == KEY_REP else "MPA Request"
        flags = "".join(c for c, on in (("M", self.markers), ("C", self.crc), ("R", self.reject),
                                        ("E", self.enhanced)) if on) or "-"
        s = f"{kind} rev={self.revision} flags={flags}"
        if self.reserved:
            s += f" rsvd={self.reserved:#x}"
        v2 = self.v2
        if v2 is not None:
            s += f" IRD={v2.ird} ORD={v2.ord}"
            rtr = "".join(c for c, on in (("P2P", v2.peer_to_peer), (",send", v2.rtr_send),
                                          (",write", v2.rtr_write), (",read", v2.rtr_read)) if on)
            if rtr:
                s += f" RTR={rtr.lstrip(',')}"
        return s + f" pd={len(self.private_data)}"


@dataclass(frozen=True, slots=True)
class MpaRequest(MpaFrame):
    """MPA Request frame, sent by the initiator (RFC 5044 §7.1)."""

    KEY: ClassVar[bytes] = KEY_REQ


@dataclass(frozen=True, slots=True)
class MpaReply(MpaFrame):
    """MPA Reply frame, sent by the responder; ``reject`` refuses the connection."""

    KEY: ClassVar[bytes] = KEY_REP


def _frame_class(key: bytes) -> type[MpaFrame] | None:
    if key == KEY_REQ:
        return MpaRequest
    if key == KEY_REP:
        return MpaReply
    return None


def decode_mpa_frame(buf: Buffer, *, max_pd: int = MPA_MAX_PRIVDATA) -> MpaFrame:
    """Decode a whole Request/Reply frame (exactly 20 + PD_Length bytes)."""
    n = len(buf)
    if n < MPA_HDR_LEN:
        raise MpaFrameError(f"MPA frame needs {MPA_HDR_LEN} bytes, have {n}")
    key, flags, rev, pdlen = _HDR.unpack_from(buf, 0)
    cls = _frame_class(key)
    if cls is None:
        raise MpaFrameError(f"not an MPA Request/Reply key: {bytes(key)!r}")
    if pdlen > max_pd:
        raise MpaFrameError(f"PD_Length {pdlen} exceeds {max_pd}")
    if n != MPA_HDR_LEN + pdlen:
        raise MpaFrameError(f"MPA frame of {n} bytes, PD_Length {pdlen} says {MPA_HDR_LEN + pdlen}")
    return cls(bool(flags & FLAG_MARKERS), bool(flags & FLAG_CRC), bool(flags & FLAG_REJECT),
               bool(flags & FLAG_ENHANCED), rev, bytes(buf[MPA_HDR_LEN:]), flags & FLAG_RESERVED)


class MpaFrameParser:
    """Incremental parser for the connection-setup phase (RFC 5044 §7.1).

    ``expect`` is :class:`MpaRequest` (responder side), :class:`MpaReply` (initiator side)
    or ``None`` (either). :meth:`feed` returns the frame once complete; bytes after it are
    in :attr:`remainder` (the start of the FPDU stream). Raises :class:`MpaFrameError`
    for a wrong key (as soon as a byte differs), PD_Length above ``max_pd``, a revision
    not in ``revisions`` or an Enhanced revision-2 frame without its 4-byte block.
    """

    def __init__(self, expect: type[MpaFrame] | None = None, *, max_pd: int = MPA_MAX_PRIVDATA,
                 revisions: Sequence[int] = (MPA_REVISION_1, MPA_REVISION_2)) -> None:
        self._keys = (expect.KEY,) if expect is not None and expect.KEY else (KEY_REQ, KEY_REP)
        self._max_pd = max_pd
        self._revisions = frozenset(revisions)
        self._buf = bytearray()
        self._need = MPA_HDR_LEN
        self.frame: MpaFrame | None = None
        self.remainder = b""

    def feed(self, data: Buffer) -> MpaFrame | None:
        if self.frame is not None:
            raise StateError("MPA frame already complete; feed FPDU bytes to the deframer")
        had = len(self._buf)
        self._buf += data
        if had < KEY_LEN:
            head = bytes(self._buf[:KEY_LEN])
            if not any(k.startswith(head) for k in self._keys):
                raise MpaFrameError(f"bad MPA key {head!r}, expected "
                                    + " or ".join(repr(k) for k in self._keys))
        if len(self._buf) < self._need:
            return None
        if self._need == MPA_HDR_LEN:
            _key, flags, rev, pdlen = _HDR.unpack_from(self._buf, 0)
            if pdlen > self._max_pd:
                raise MpaFrameError(f"PD_Length {pdlen} exceeds {self._max_pd}")
            if rev not in self._revisions:
                raise MpaFrameError(f"MPA revision {rev} not supported "
                                    f"(accepted: {sorted(self._revisions)})")
            if flags & FLAG_ENHANCED and rev == MPA_REVISION_2 and pdlen < 4:
                raise MpaFrameError(f"Enhanced MPA v2 frame with PD_Length {pdlen} < 4")
            self._need = MPA_HDR_LEN + pdlen
            if len(self._buf) < self._need:
                return None
        self.frame = decode_mpa_frame(memoryview(self._buf)[:self._need], max_pd=self._max_pd)
        self.remainder = bytes(self._buf[self._need:])
        self._buf = bytearray()
        return self.frame


# --- FPDU framing (RFC 5044 §4) --------------------------------------------------------------


def pad_len(ulpdu_len: int) -> int:
    """Pad octets after a ULPDU of ``ulpdu_len`` bytes (RFC 5044 §4.1)."""
    return (-(ulpdu_len + ULPDU_LEN_LEN)) & 3


def _ulpdu_len(parts: Sequence[Buffer]) -> int:
    n = 0
    for p in parts:
        n += len(p)
    if n > 0xFFFF:
        raise InvalidArgument("ulpdu_parts", f"ULPDU of {n} bytes exceeds 65535")
    return n


def _pad(n: int, pad: bytes | None) -> bytes:
    if pad is None:
        return _ZERO_PAD[pad_len(n)]
    if len(pad) != pad_len(n):
        raise InvalidArgument("pad", f"{len(pad)} octets, a {n}-byte ULPDU needs {pad_len(n)}")
    return bytes(pad)


def fpdu_encode(ulpdu_parts: Sequence[Buffer], crc: bool, pad: bytes | None = None) -> list[Buffer]:
    """One FPDU without markers as buffers ``[ULPDU_Length, *parts, PAD + CRC]``.

    The payload parts are not copied; the CRC32c (RFC 5044 §4.1) is computed part by part.
    With ``crc`` False the CRC field is 0. The pad is zeros (RFC 5044 §4.1: "MUST be set
    to zero by the sender and ignored by the receiver"); ``pad`` overrides it, to
    reproduce a captured FPDU from a sender that leaves garbage there (Linux siw does).
    """
    n = _ulpdu_len(ulpdu_parts)
    hdr = U16.pack(n)
    pad = _pad(n, pad)
    value = 0
    if crc:
        value = crc32c(hdr)
        for p in ulpdu_parts:
            value = crc32c(p, value)
        value = crc32c(pad, value)
    out: list[Buffer] = [hdr]
    out.extend(p for p in ulpdu_parts if len(p))
    out.append(pad + _CRC.pack(value))
    return out


def marked_span(pos: int, n: int) -> int:
    """Stream octets taken by ``n`` non-marker octets sent from stream offset ``pos`` when
    a marker precedes every octet at a multiple of 512 (RFC 5044 §5)."""
    first = (-pos) % MARKER_INTERVAL
    if n <= first:
        return n
    return n + MARKER_LEN * (1 + (n - first - 1) // (MARKER_INTERVAL - MARKER_LEN))


@dataclass(frozen=True, slots=True)
class Fpdu:
    """One received FPDU.

    ``offset`` is the stream offset (from the first octet of the first FPDU of this
    direction) of its first octet, ``raw`` its exact wire bytes (markers included),
    ``ulpdu`` the marker-free ULPDU, ``crc`` the CRC field's value and ``markers`` the
    ``(reserved, fpduptr)`` of each marker inside it.
    """

    offset: int
    raw: bytes
    ulpdu: bytes | memoryview
    pad: bytes
    crc: int
    markers: tuple[tuple[int, int], ...] = field(default=())

    def __len__(self) -> int:
        return len(self.raw)


class FpduEncoder:
    """Stateful FPDU encoder for one direction (RFC 5044 §4-§5).

    ``stream_offset`` is the number of octets this direction has sent since its first
    FPDU; it decides where markers go. Payload buffers are sliced, never copied.
    """

    def __init__(self, *, crc: bool, markers: bool, stream_offset: int = 0) -> None:
        self.crc = crc
        self.markers = markers
        self.offset = stream_offset

    def encode(self, ulpdu_parts: Sequence[Buffer], pad: bytes | None = None) -> list[Buffer]:
        """The next FPDU as buffers; ``pad`` as for :func:`fpdu_encode`."""
        n = _ulpdu_len(ulpdu_parts)
        if not self.markers:
            framed = fpdu_encode(ulpdu_parts, self.crc, pad)
            self.offset += ULPDU_LEN_LEN + n + pad_len(n) + CRC_LEN
            return framed
        start = self.offset
        pieces: list[Buffer] = [U16.pack(n), *ulpdu_parts, _pad(n, pad)]
        out: list[Buffer] = []
        pos = start
        value = 0
        for piece in pieces:
            mv = memoryview(piece)
            if mv.format != "B" or mv.ndim != 1:
                mv = mv.cast("B")
            i = 0
            ln = len(mv)
            while i < ln:
                if pos % MARKER_INTERVAL == 0:
                    mk = self._marker(pos - start)
                    out.append(mk)
                    pos += MARKER_LEN
                room = MARKER_INTERVAL - pos % MARKER_INTERVAL
                take = min(room, ln - i)
                chunk = mv[i:i + take] if (i or take != ln) else mv
                out.append(chunk)
                i += take
                pos += take
        if pos % MARKER_INTERVAL == 0:  # a marker between PAD and CRC
            out.append(self._marker(pos - start))
            pos += MARKER_LEN
        if self.crc:
            for b in out:
                value = crc32c(b, value)
        out.append(_CRC.pack(value))
        self.offset = pos + CRC_LEN
        return [b for b in out if len(b)]

    @staticmethod
    def _marker(ptr: int) -> bytes:
        if ptr > 0xFFFF:
            raise InvalidArgument("ulpdu_parts", "FPDU too long for a 16-bit marker FPDUPTR")
        return _MARKER.pack(0, ptr)


class FpduDeframer:
    """Incremental FPDU decoder for one direction (RFC 5044 §4-§5).

    :meth:`push` appends stream bytes, :meth:`pop` returns the next complete FPDU or
    ``None``; :meth:`feed` does both and returns every complete FPDU. FPDUs may span
    pushes and one push may hold several. Errors:

    * :class:`MpaLengthError` - ULPDU_Length outside ``[min_ulpdu, max_ulpdu]``;
    * :class:`MpaMarkerError` - a marker whose FPDUPTR is wrong;

      after either the framing is lost: every later call raises the same error until
      :meth:`resync`.
    * :class:`MpaCrcError` - bad CRC32c (only with ``crc`` and ``check_crc``); that FPDU
      is consumed and decoding can go on.

    :meth:`feed` attaches the FPDUs completed before an error as ``error.fpdus``.
    """

    def __init__(self, *, crc: bool, markers: bool, stream_offset: int = 0, check_crc: bool = True,
                 min_ulpdu: int = TAGGED_HDR_LEN, max_ulpdu: int = 0xFFFF) -> None:
        self.crc = crc
        self.markers = markers
        self.check_crc = check_crc
        self.min_ulpdu = min_ulpdu
        self.max_ulpdu = max_ulpdu
        self.offset = stream_offset
        self._buf = bytearray()
        self._rd = 0
        self._error: MpaError | None = None

    @property
    def buffered(self) -> int:
        """Octets received but not yet part of a complete FPDU."""
        return len(self._buf) - self._rd

    @property
    def failed(self) -> MpaError | None:
        """The framing error that stopped this deframer, if any."""
        return self._error

    def resync(self, stream_offset: int) -> None:
        """Drop buffered bytes and the error; the next pushed byte is the first octet of an
        FPDU at ``stream_offset``."""
        self._buf = bytearray()
        self._rd = 0
        self._error = None
        self.offset = stream_offset

    def push(self, data: Buffer) -> None:
        if self._rd and self._rd >= len(self._buf) // 2:
            del self._buf[:self._rd]
            self._rd = 0
        self._buf += data

    def feed(self, data: Buffer) -> list[Fpdu]:
        self.push(data)
        out: list[Fpdu] = []
        while True:
            try:
                f = self.pop()
            except MpaError as e:
                e.fpdus = out
                raise
            if f is None:
                return out
            out.append(f)

    def _fail(self, err: MpaError) -> MpaError:
        self._error = err
        return err

    def pop(self) -> Fpdu | None:
        if self._error is not None:
            raise self._error
        buf = self._buf
        rd = self._rd
        avail = len(buf) - rd
        pos = self.offset
        lead = MARKER_LEN if self.markers and pos % MARKER_INTERVAL == 0 else 0
        if avail < lead + ULPDU_LEN_LEN:
            return None
        (n,) = U16.unpack_from(buf, rd + lead)
        if not self.min_ulpdu <= n <= self.max_ulpdu:
            raise self._fail(MpaLengthError(
                f"ULPDU_Length {n} at stream offset {pos} outside [{self.min_ulpdu}, {self.max_ulpdu}]"))
        plain = ULPDU_LEN_LEN + n + pad_len(n) + CRC_LEN
        span = marked_span(pos, plain) if self.markers else plain
        if avail < span:
            return None
        with memoryview(buf) as whole:
            raw = bytes(whole[rd:rd + span])
        mv = memoryview(raw)
        markers: tuple[tuple[int, int], ...] = ()
        if self.markers:
            data, markers = self._strip_markers(mv, pos)
            ulpdu: bytes | memoryview = data[ULPDU_LEN_LEN:ULPDU_LEN_LEN + n]
            pad = data[ULPDU_LEN_LEN + n:-CRC_LEN]
        else:
            ulpdu = mv[ULPDU_LEN_LEN:ULPDU_LEN_LEN + n]
            pad = raw[ULPDU_LEN_LEN + n:span - CRC_LEN]
        (crc_field,) = _CRC.unpack_from(raw, span - CRC_LEN)
        self._rd = rd + span
        self.offset = pos + span
        fpdu = Fpdu(pos, raw, ulpdu, pad, crc_field, markers)
        if self.crc and self.check_crc:
            computed = crc32c(mv[:span - CRC_LEN])
            if computed != crc_field:
                raise MpaCrcError(f"bad CRC32c at stream offset {pos}: field {crc_field:#010x}, "
                                  f"computed {computed:#010x}", fpdu, computed)
        return fpdu

    def _strip_markers(self, mv: memoryview, pos: int) -> tuple[bytes, tuple[tuple[int, int], ...]]:
        span = len(mv)
        first = (-pos) % MARKER_INTERVAL
        parts: list[memoryview] = []
        markers: list[tuple[int, int]] = []
        i = 0
        m = first
        while m < span:
            parts.append(mv[i:m])
            rsvd, ptr = _MARKER.unpack_from(mv, m)
            if ptr != m:
                raise self._fail(MpaMarkerError(
                    f"marker at stream offset {pos + m} has FPDUPTR {ptr}, FPDU starts {m} octets back"))
            markers.append((rsvd, ptr))
            i = m + MARKER_LEN
            m += MARKER_INTERVAL
        parts.append(mv[i:])
        return b"".join(parts), tuple(markers)


def mulpdu(mss: int, markers: bool) -> int:
    """Largest ULPDU that fits one TCP segment of ``mss`` octets (RFC 5044 §4.2):
    ``EMSS - (6 + EMSS mod 4)``, with markers ``EMSS - (6 + 4*ceil(EMSS/512) + EMSS mod 4)``."""
    over = 6 + mss % 4
    if markers:
        over += MARKER_LEN * (-(-mss // MARKER_INTERVAL))
    n = min(mss - over, 0xFFFF)
    if n <= 0:
        raise InvalidArgument("mss", f"{mss} leaves no room for a ULPDU")
    return n
