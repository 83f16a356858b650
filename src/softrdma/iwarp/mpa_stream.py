"""The MPA stream of an iWARP connection: FPDU framing both ways (RFC 5044 §4-§5).

siw splits its receive path into the FPDU framing (``siw_tcp_rx_data``, ``siw_get_hdr``,
``siw_get_trailer``, ``siw_check_crc``) and the per-opcode DDP/RDMAP handlers; this module
is the first part, and the ``frame`` step of its transmit path (``siw_tx_hdt``).

* :class:`FpduRx` is a streaming receive state machine over the bytes of one direction
  in full operation: ULPDU_Length (RFC 5044 §4.1), header bytes, payload, then PAD and
  CRC. It checks the markers' FPDUPTR and folds the markers into the CRC (RFC 5044 §5),
  checks the CRC32c (§4.1) and reports a header error only once the FPDU's CRC checked
  out (§8: a bad CRC is the MPA error). What the header bytes mean is the
  :class:`FpduSink`'s business: it is told when the header bytes it asked for are in
  (``on_header``: ask for more with :meth:`FpduRx.need_header`, name the payload's
  target buffers with :meth:`FpduRx.start_body`, or raise an
  :class:`~.terminate.IwarpFault`) and when the FPDU is complete (``on_fpdu``). Payload
  bytes go straight into the target buffers; a driver can ``recv_into`` them
  (:meth:`FpduRx.target`, :meth:`FpduRx.placed`).
* :class:`StallWatch` bounds the wait for the rest of a partial FPDU: a header that
  announces 64 KiB and is followed by silence must not hold the connection (and its
  receive WQE) forever; the driver asks it on its housekeeping rounds. Silence between
  FPDUs is an idle connection, not a stall.
* :func:`frame` wraps one DDP segment (header + payload buffers) into an FPDU: length,
  PAD, CRC32c, and markers through :class:`~softrdma.wire.mpa.FpduEncoder`; payload
  buffers are never copied.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Protocol

from ..wire.crc import Buffer, crc32c
from ..wire.ddp import MpaErrorCode
from ..wire.mpa import MARKER_INTERVAL, FpduEncoder
from .terminate import IwarpFault

__all__ = ["FpduRx", "FpduSink", "frame", "nbytes", "Buf", "DIRECT_MIN", "FIRST_HDR",
           "MIN_ULPDU", "LOOKAHEAD_HDR", "FPDU_STALL_S", "StallWatch"]

#: A buffer of an outbound FPDU: bytes, or a byte-format memoryview of registered memory.
Buf = Buffer

#: Payload left in a segment worth a zero-copy ``recv_into`` of its own.
DIRECT_MIN = 4096
#: ULPDU_Length + the shorter (tagged, RFC 5041 §5.1) DDP header: what is read first.
FIRST_HDR = 16
#: The shortest ULPDU that holds a DDP header (tagged, 14 octets).
MIN_ULPDU = 14
#: Header octets of the next FPDU worth reading with a payload (ULPDU_Length + untagged).
LOOKAHEAD_HDR = 20
#: Seconds a partial FPDU may go without one more octet before the stream counts as lost
#: (:class:`StallWatch`): far beyond any retransmission a live TCP peer needs to send on.
FPDU_STALL_S = 30.0
_LEN = 2        # ULPDU_Length (RFC 5044 §4.1)
_CRC_LEN = 4
_MAX_ULPDU = 0xFFFF  # a 16-bit ULPDU_Length
_MAX_TRAILER = 8    # PAD (0-3) + CRC
_MARKER_LEN = 4
_BIG_READ = 1 << 18  # receive size hint when segments are small
_U16 = struct.Struct("!H")
_MARKER = struct.Struct("!HH")
_CRC_LE = struct.Struct("<I")
_PADS = (b"", b"\0", b"\0\0", b"\0\0\0")
_NO_CRC = b"\0\0\0\0"

# receive phases
P_HDR, P_BODY, P_SKIP, P_TRAIL = 0, 1, 2, 3


def nbytes(bufs: list[Buf]) -> int:
    """Total octets of a buffer list (bytes, or byte-format memoryviews)."""
    n = 0
    for b in bufs:
        n += len(b)
    return n


def frame(enc: FpduEncoder, parts: list[Buf], paylen: int) -> tuple[list[Buf], int]:
    """One FPDU around the DDP segment ``parts`` (header first, then ``paylen`` octets of
    payload views): ``(buffers, octets)``. ``parts`` is reused for the result."""
    if enc.markers:
        bufs: list[Buf] = enc.encode(parts)
        return bufs, nbytes(bufs)
    # RFC 5044 §4.1 without markers, as wire.mpa.fpdu_encode: one header buffer
    # (ULPDU_Length + DDP/RDMAP headers), the payload views, PAD + CRC
    ulen = len(parts[0]) + paylen
    head = _U16.pack(ulen) + parts[0]
    trail = _PADS[(-(ulen + _LEN)) & 3]
    if enc.crc:
        crc = crc32c(head)
        for p in parts[1:]:
            crc = crc32c(p, crc)
        if trail:
            crc = crc32c(trail, crc)
        trail += _CRC_LE.pack(crc)
    else:
        trail += _NO_CRC
    parts[0] = head
    parts.append(trail)
    size = ulen + _LEN + len(trail)
    enc.offset += size
    return parts, size


class FpduSink(Protocol):
    """The DDP/RDMAP layer above :class:`FpduRx` (:class:`~.rdmap.Rdmap`)."""

    def on_header(self) -> None:
        """``rx.hneed`` header octets are in ``rx.hbuf``; act, or raise IwarpFault."""

    def on_fpdu(self) -> None:
        """The FPDU is complete and its CRC good."""

    def fast_run(self, mv: memoryview, i: int, n: int) -> int:
        """Take the whole FPDUs at ``mv[i:n]`` (no markers) that the sink can place in one
        go, CRC included (:func:`~.fast_path.write_run`); stop at the first it cannot,
        having changed nothing for it. Returns the octets taken (0: none), after setting
        ``ulen``/``paylen`` of the framing to the last FPDU's."""


class FpduRx:
    """Receive-side MPA framing of one stream (see the module docstring).

    ``crc_on``/``markers`` are what MPA negotiated for this direction; ``pos`` counts
    the stream octets since the first FPDU (markers sit at multiples of 512, RFC 5044
    §5.1); ``dead`` stops the state machine (the stream failed or closed).
    """

    __slots__ = ("sink", "crc_on", "markers", "dead", "pos", "fpdu_start", "_mk_buf",
                 "_mk_have", "phase", "hbuf", "hhave", "hneed", "ulen", "crc", "rem",
                 "pending", "_tg", "_tgi", "_tgo", "_tbuf", "_tneed", "_thave", "paylen",
                 "fpdus", "_carry", "_chave", "_cneed", "direct")

    def __init__(self, sink: FpduSink, *, crc: bool = False, markers: bool = False) -> None:
        self.sink = sink
        self.crc_on = crc
        self.markers = markers
        self.dead = False
        self.pos = 0
        self.fpdus = 0  # whole FPDUs received with a good CRC (the device's rcvd_pkts)
        self.fpdu_start = 0
        self._mk_buf = bytearray(_MARKER_LEN)
        self._mk_have = 0
        self.phase = P_HDR
        self.hbuf = bytearray(_LEN + _MAX_ULPDU + _MAX_TRAILER)
        self.hhave = 0
        self.hneed = FIRST_HDR
        self.ulen = 0
        self.crc = 0
        self.rem = 0
        self.pending: IwarpFault | None = None
        self._tg: list[memoryview] = []
        self._tgi = 0
        self._tgo = 0
        self._tbuf = bytearray(8)
        self._tneed = 0
        self._thave = 0
        self.paylen = 0
        # a whole-FPDU buffer for the FPDU a chunk's end cut (see :meth:`feed`)
        self._carry = bytearray(0)
        self._chave = 0
        self._cneed = 0  # its length, 0: nothing carried
        self.direct = False  # the receiver asks for targets (:meth:`target`)

    @property
    def mid_fpdu(self) -> bool:
        """Some octets of an FPDU are in, not all."""
        return self.phase != P_HDR or self.hhave != 0 or self._cneed != 0

    # ---- what the sink calls from on_header --------------------------------------------
    def need_header(self, n: int) -> None:
        """Read the header up to ``n`` octets of the FPDU (ULPDU_Length included)."""
        self.hneed = n

    def start_body(self, targets: list[memoryview], paylen: int) -> None:
        """The segment's ``paylen`` payload octets go into ``targets`` (in order)."""
        self.paylen = paylen
        if paylen == 0:
            self.to_trailer()
            return
        self._tg = targets
        self._tgi = 0
        self._tgo = 0
        self.rem = paylen
        self.phase = P_BODY

    def to_trailer(self) -> None:
        """The ULPDU is all in: read PAD and CRC next."""
        self.phase = P_TRAIL
        self._tneed = ((-(_LEN + self.ulen)) & 3) + _CRC_LEN
        self._thave = 0

    def defer(self, f: IwarpFault, consumed: int) -> None:
        """Keep a header error until the FPDU's CRC is known (RFC 5044 §8 first)."""
        self.pending = f
        self.rem = _LEN + self.ulen - consumed
        if self.rem > 0:
            self.phase = P_SKIP
        else:
            self.to_trailer()

    # ---- zero-copy receive --------------------------------------------------------------
    def target(self) -> memoryview | None:
        """The rest of the current payload's target buffer, if worth a ``recv_into``:
        not with markers (they interleave) and not for less than :data:`DIRECT_MIN`.
        A receiver that asks for targets reads payloads into them: from its first call on,
        an FPDU that a read cuts with a target's worth of payload left is not carried
        (:meth:`_carry_out`), so that the rest of it can go straight into its target."""
        self.direct = True
        if self.phase != P_BODY or self.markers or self.dead or self.rem < DIRECT_MIN:
            return None
        t = self._tg[self._tgi]
        o = self._tgo
        n = len(t) - o
        if n > self.rem:
            n = self.rem
        return t[o:o + n]

    def lookahead(self) -> int:
        """Octets after :meth:`target`'s buffer worth reading in the same call: PAD, CRC
        and the next segment's headers (0 if the payload continues in the next SGE)."""
        if self.phase != P_BODY or self._tgi >= len(self._tg) or \
                self.rem > len(self._tg[self._tgi]) - self._tgo:
            return 0
        return ((-(_LEN + self.ulen)) & 3) + _CRC_LEN + LOOKAHEAD_HDR

    def placed(self, n: int) -> None:
        """``n`` octets were received straight into :meth:`target`'s buffer."""
        t = self._tg[self._tgi]
        o = self._tgo
        if self.crc_on:
            self.crc = crc32c(t[o:o + n], self.crc)
        o += n
        if o == len(t):
            self._tgi += 1
            o = 0
        self._tgo = o
        self.rem -= n
        self.pos += n
        if self.rem == 0:
            self.to_trailer()

    def want(self) -> int:
        """How many octets the framing would like next (a receive-size hint)."""
        if self._cneed:  # the rest of a carried FPDU, and the next one's headers
            return self._cneed - self._chave + LOOKAHEAD_HDR
        if self.markers or self.paylen < DIRECT_MIN:
            return _BIG_READ  # small segments: many per system call
        ph = self.phase
        if ph == P_HDR:
            return self.hneed - self.hhave
        if ph == P_TRAIL:
            return self._tneed - self._thave + LOOKAHEAD_HDR
        return self.rem if self.rem < _BIG_READ else _BIG_READ

    # ---- the state machine ---------------------------------------------------------------
    def feed(self, mv: memoryview) -> None:
        """Consume stream octets (a byte-format memoryview). Faults propagate.

        Without markers, whole FPDUs go to the sink's ``fast_run`` first. When a run of
        them ends at an FPDU the chunk's end cut, that FPDU's octets are carried (copied
        aside) until it is whole, then offered to ``fast_run`` from the copy: one copy of
        at most an FPDU instead of the general path's header, payload and trailer steps
        across two chunks (each read of the TCP runtime ends in such an FPDU). What
        ``fast_run`` does not take goes through the general path, octet for octet as
        if it had never been carried."""
        i = 0
        n = len(mv)
        step = self._step
        if not self.markers:
            fast = self.sink.fast_run
            ran = False
            if self._cneed:
                i = self._carry_in(mv, fast)
                ran = not self._cneed  # a run goes on past the carried FPDU
            while i < n and not self.dead:
                if self.phase == P_HDR and not self.hhave:
                    left = n - i
                    if left >= LOOKAHEAD_HDR:
                        k = fast(mv, i, n)
                        if k:
                            i += k
                            self.pos += k
                            self.fpdu_start = self.pos
                            ran = True
                            continue
                    if ran and left >= _LEN and self._carry_out(mv, i, left):
                        return
                i += step(mv[i:] if i else mv)
            return
        while i < n and not self.dead:
            r = self.pos % MARKER_INTERVAL
            if r == 0 or self._mk_have:
                take = min(_MARKER_LEN - self._mk_have, n - i)
                self._mk_buf[self._mk_have:self._mk_have + take] = mv[i:i + take]
                self._mk_have += take
                self.pos += take
                i += take
                if self._mk_have == _MARKER_LEN:
                    self._mk_have = 0
                    self._marker(self.pos - _MARKER_LEN)
                continue
            lim = min(n - i, MARKER_INTERVAL - r)
            i += step(mv[i:i + lim])

    def _carry_out(self, mv: memoryview, i: int, left: int) -> bool:
        """Carry ``mv[i:]``, the start of an FPDU it does not hold whole (a sane
        ULPDU_Length only: a short one is the general path's framing error at once)."""
        (ulen,) = _U16.unpack_from(mv, i)
        whole = _LEN + ulen + ((-(_LEN + ulen)) & 3) + _CRC_LEN
        if ulen < MIN_ULPDU or left >= whole:
            return False
        if self.direct and whole - left - _CRC_LEN - 3 >= DIRECT_MIN:
            return False  # the general path takes its headers; the payload, a target
        if not self._carry:
            self._carry = bytearray(_LEN + _MAX_ULPDU + _MAX_TRAILER)
        self._carry[:left] = mv[i:i + left]
        self._chave = left
        self._cneed = whole
        self.pos += left  # progress for the StallWatch; taken back when it is consumed
        return True

    def _carry_in(self, mv: memoryview, fast: Callable[[memoryview, int, int], int]) -> int:
        """Complete the carried FPDU from ``mv`` and consume it once whole; returns the
        octets of ``mv`` used."""
        have, need = self._chave, self._cneed
        take = min(need - have, len(mv))
        c = self._carry
        c[have:have + take] = mv[:take]
        self.pos += take
        if have + take < need:
            self._chave = have + take
            return take
        self._chave = self._cneed = 0
        self.pos -= need  # counted again below, as any FPDU's octets
        whole = memoryview(c)[:need]
        k = fast(whole, 0, need)
        if k:
            self.pos += k
            self.fpdu_start = self.pos
            return take
        j = 0
        step = self._step
        while j < need and not self.dead:
            j += step(whole[j:] if j else whole)
        return take

    def _marker(self, mpos: int) -> None:
        """A marker (RFC 5044 §5): FPDUPTR must point back to the current FPDU's start."""
        _rsvd, ptr = _MARKER.unpack_from(self._mk_buf, 0)
        if self.crc_on:
            self.crc = crc32c(self._mk_buf, self.crc)
        if ptr != mpos - self.fpdu_start:
            raise IwarpFault.llp(MpaErrorCode.MARKER_MISMATCH,
                                 f"marker at stream offset {mpos} has FPDUPTR {ptr}, the FPDU "
                                 f"starts {mpos - self.fpdu_start} octets back")

    def _step(self, chunk: memoryview) -> int:
        ph = self.phase
        if ph == P_BODY:
            k = self.rem if self.rem < len(chunk) else len(chunk)
            data = chunk[:k] if k != len(chunk) else chunk
            t = self._tg[self._tgi]
            o = self._tgo
            if o + k < len(t):
                t[o:o + k] = data
                self._tgo = o + k
            elif o + k == len(t):
                t[o:] = data
                self._tgi += 1
                self._tgo = 0
            else:
                self._scatter(data)
            if self.crc_on:
                self.crc = crc32c(data, self.crc)
            self.rem -= k
            self.pos += k
            if self.rem == 0:
                self.to_trailer()
            return k
        if ph == P_HDR:
            have = self.hhave
            k = self.hneed - have
            if k > len(chunk):
                k = len(chunk)
            part = chunk[:k]
            self.hbuf[have:have + k] = part
            if self.crc_on:
                self.crc = crc32c(part, self.crc)
            self.hhave = have + k
            self.pos += k
            if have < _LEN <= self.hhave:
                self._check_ulen()
            if self.hhave == self.hneed:
                try:
                    self.sink.on_header()
                except IwarpFault as f:
                    self.defer(f, self.hneed)
            return k
        if ph == P_SKIP:
            k = self.rem if self.rem < len(chunk) else len(chunk)
            if self.crc_on:
                self.crc = crc32c(chunk[:k], self.crc)
            self.rem -= k
            self.pos += k
            if self.rem == 0:
                self.to_trailer()
            return k
        have = self._thave
        k = min(self._tneed - have, len(chunk))
        self._tbuf[have:have + k] = chunk[:k]
        self._thave = have + k
        self.pos += k
        if self._thave == self._tneed:
            self._fpdu_done()
        return k

    def _scatter(self, data: memoryview) -> None:
        """Place payload octets that cross target buffers (a scatter list)."""
        tg = self._tg
        k = len(data)
        pos = 0
        while pos < k:
            t = tg[self._tgi]
            o = self._tgo
            take = min(len(t) - o, k - pos)
            t[o:o + take] = data[pos:pos + take]
            pos += take
            o += take
            if o == len(t):
                self._tgi += 1
                o = 0
            self._tgo = o

    def _check_ulen(self) -> None:
        """The ULPDU_Length is in (RFC 5044 §4.1): a value shorter than any DDP header
        means the FPDU framing is lost."""
        (ulen,) = _U16.unpack_from(self.hbuf, 0)
        self.ulen = ulen
        if ulen < MIN_ULPDU:
            raise IwarpFault.llp(MpaErrorCode.MARKER_MISMATCH,
                                 f"ULPDU_Length {ulen} is shorter than a DDP header: "
                                 "FPDU framing lost")

    def _fpdu_done(self) -> None:
        """PAD and CRC are in: check the CRC (RFC 5044 §4.1), then hand the FPDU up."""
        fault = self.pending
        if self.crc_on:
            pad = self._tneed - _CRC_LEN
            crc = crc32c(self._tbuf[:pad], self.crc) if pad else self.crc
            (field,) = _CRC_LE.unpack_from(self._tbuf, pad)
            if field != crc:
                fault = IwarpFault.llp(MpaErrorCode.CRC_MISMATCH,
                                       f"FPDU CRC32c {field:#010x}, computed {crc:#010x}")
        self.pending = None
        self.phase = P_HDR
        self.hhave = 0
        self.hneed = FIRST_HDR
        self.crc = 0
        self.fpdu_start = self.pos
        if fault is not None:
            raise fault
        self.fpdus += 1
        self.sink.on_fpdu()


class StallWatch:
    """No progress on a partial FPDU for ``limit`` seconds ends the stream.

    Sans-I/O: the driver calls :meth:`check` with its time now and then (its
    housekeeping rounds). Progress is any new stream octet (``FpduRx.pos``); only a
    stream stopped inside an FPDU (:attr:`FpduRx.mid_fpdu`) is timed, so an idle
    connection between FPDUs stays open. The answer is an LLP fault, "TCP connection
    lost" (RFC 5044 §8 code 0x01): the engine sends its Terminate and closes.
    """

    __slots__ = ("_pos", "_since")

    def __init__(self) -> None:
        self._pos = -1
        self._since = 0.0

    def check(self, rx: FpduRx, now: float, limit: float = FPDU_STALL_S) -> IwarpFault | None:
        """The fault ending a stream stalled for ``limit`` s inside an FPDU, else None."""
        if rx.dead or not rx.mid_fpdu:
            self._pos = -1
            return None
        if rx.pos != self._pos:
            self._pos = rx.pos
            self._since = now
            return None
        if now - self._since < limit:
            return None
        return IwarpFault.llp(MpaErrorCode.TCP_CONNECTION_LOST,
                              f"no octet of the partial FPDU (ULPDU_Length {rx.ulen}) for "
                              f"{now - self._since:.1f} s: the stream is stalled")
