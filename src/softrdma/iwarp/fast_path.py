"""The fused fast paths of the iWARP data path: runs of whole FPDUs without markers.

The general path handles one DDP segment at a time through the layers: on transmit
:func:`~.ddp_place.segment` cuts it and :func:`~.mpa_stream.frame` frames it; on receive
:class:`~.mpa_stream.FpduRx` reads the ULPDU_Length, the :class:`~.rdmap.Rdmap` sink
checks the header, :class:`~.ddp_place.DdpRx` resolves the STag, the framing checks the
CRC. For bulk data (RDMA Write, Read Response, Send payloads of many segments) that
costs a dozen Python calls per 64 KiB FPDU. siw fuses the same steps in its transmit and
receive loops (``siw_tx_hdt``, ``siw_tcp_rx_data``); so do these two functions, for the
common case only, and hand everything else back to the general path:

* :func:`frame_run` cuts and frames successive segments of one message whose payload is
  one contiguous view (RFC 5041 §5.1 segmentation, RFC 5044 §4.1 framing: ULPDU_Length,
  PAD, CRC32c), one ``struct`` pack per FPDU for ULPDU_Length and the DDP/RDMAP header
  together, the CRC over the payload computed holding the GIL (:data:`~softrdma.wire.crc.KEEP_GIL`):
  by ISA-L on the registered memory's address where it can and where ISA-L is the faster
  here (writable memory, :func:`~softrdma.wire.crc.crc32c_by_address`:
  :data:`~softrdma.wire.crc.crc32c_reg_at`, the ctypes function called without a Python
  wrapper), else by :func:`~softrdma.wire.crc.crc32c`. Its buffers are byte-identical to
  ``segment`` + ``frame``'s.
* :func:`write_run` places successive whole RDMA Write FPDUs found in one received chunk:
  the checks of :meth:`~.ddp_place.DdpRx.write` (the STag's validity, PD, REMOTE_WRITE
  and bounds, RFC 5041 §7.2 via :func:`~.stag.check_access` once per STag per run, then
  bounds arithmetic; contiguous TOs within a message), the CRC32c (RFC 5044 §4.1), then
  one slice assignment into the registered memory. It stops at the first FPDU that is
  not such a segment, is cut by the chunk's end, or fails any check: the general path
  then takes that FPDU and reports the error exactly as it always does (a bad CRC is
  the MPA error, RFC 5044 §8; a header error waits for the CRC). The CRC is ISA-L's by
  address too where the received chunk is writable (the TCP runtime's receive buffer)
  and ISA-L is the faster here: a chunk a read has just filled is in the cache, where
  ISA-L took 2.2 us per 64 KiB against 3.7 for the ``crc32c`` package on one machine,
  and 8.2 against 4.2 on another (a read-only chunk keeps ``crc32c``).

Markers (RFC 5044 §5) never take these paths. Equivalence with the general path is
tested in ``tests/iwarp/test_iwarp_fast_path.py``.
"""

from __future__ import annotations

import struct

from ..enums import ibv_access_flags as ACC
from ..wire.crc import (
    CRC_MASK,
    KEEP_GIL,
    buffer_address,
    crc32c,
    crc32c_by_address,
    crc32c_gil,
    crc32c_reg_at,
)
from ..wire.ddp import DDP_L, DDP_T, DDP_VERSION, TAGGED, TAGGED_HDR_LEN, UNTAGGED_HDR_LEN
from ..wire.mpa import FpduEncoder
from .ddp_place import MASK32, MASK64, RDMAP_RV, DdpRx, TxMsg
from .mpa_stream import Buf
from .stag import Access, check_access

__all__ = ["frame_run", "write_run", "fast_tx_ok", "WRITE_CTRL", "WRITE_CTRL_MASK",
           "WRITE_RDMAP", "MIN_WHOLE"]

_LEN = 2                          # ULPDU_Length (RFC 5044 §4.1)
_CRC_LEN = 4
#: ULPDU_Length + a tagged DDP/RDMAP header (RFC 5041 §5.1, RFC 5040 §4.3), packed at once
_LEN_TAGGED = struct.Struct("!HBBIQ")
#: ULPDU_Length + an untagged DDP/RDMAP header (RFC 5041 §5.2)
_LEN_UNTAGGED = struct.Struct("!HBBIIII")
_U16 = struct.Struct("!H")
_CRC_LE = struct.Struct("<I")
_PADS = (b"", b"\0", b"\0\0", b"\0\0\0")
_NO_CRC = b"\0\0\0\0"
_U64 = 1 << 64
_OP_WRITE = 0x0  # RDMAP opcode RDMA Write (RFC 5040 §4.3)
_REMOTE_WRITE = int(ACC.IBV_ACCESS_REMOTE_WRITE)

#: DDP control octet of an RDMA Write segment: T=1, DV=1, any L (RFC 5041 §5.1)
WRITE_CTRL, WRITE_CTRL_MASK = DDP_T | DDP_VERSION, 0xFF ^ DDP_L
#: RDMAP control octet of an RDMA Write: RV=1, opcode 0 (RFC 5040 §4.3)
WRITE_RDMAP = RDMAP_RV | _OP_WRITE
#: the shortest FPDU with a tagged header: ULPDU_Length, the header, the CRC
MIN_WHOLE = _LEN + TAGGED_HDR_LEN + _CRC_LEN


def fast_tx_ok(enc: FpduEncoder, msg: TxMsg) -> bool:
    """:func:`frame_run` can cut ``msg``'s next segments: no markers, payload left in one
    contiguous view, and no extra header (a Read Request's)."""
    return (not enc.markers and len(msg.segs) == 1 and msg.off < msg.length
            and not msg.extra)


def frame_run(enc: FpduEncoder, msg: TxMsg, maxpay_t: int, maxpay_u: int, out: list[Buf],
              room: int, max_bufs: int) -> tuple[int, bool]:
    """Append the FPDUs of ``msg``'s next segments to ``out`` (``[header, payload view,
    PAD + CRC]`` each, as ``frame(enc, segment(msg, ...))``), at least one, and more while
    fewer than ``room`` octets were added and ``out`` holds fewer than ``max_bufs``
    buffers. Returns ``(octets added, the message's last segment was cut)``. Only for a
    message :func:`fast_tx_ok` accepts."""
    seg = msg.segs[0]
    off = msg.off
    length = msg.length
    crc_on = enc.crc
    rdmap = msg.rdmap
    tagged = msg.tagged
    maxpay = maxpay_t if tagged else maxpay_u
    hl = TAGGED_HDR_LEN if tagged else UNTAGGED_HDR_LEN
    stag, to = msg.stag, msg.to
    rsvdulp, qn, msn = msg.rsvdulp, msg.qn, msg.msn
    pack_t = _LEN_TAGGED.pack
    pack_u = _LEN_UNTAGGED.pack
    pack_crc = _CRC_LE.pack
    append = out.append
    total = 0
    last = False
    crc_at = crc32c_reg_at  # ISA-L on the register: value ^ CRC_MASK in and out
    addr = buffer_address(seg) if crc_on and crc_at is not None and crc32c_by_address() \
        else None
    while True:
        left = length - off
        n = left if left < maxpay else maxpay
        last = n == left
        ulen = hl + n
        if tagged:
            head = pack_t(ulen, DDP_T | (DDP_L if last else 0) | DDP_VERSION, rdmap, stag,
                          (to + off) & MASK64)
        else:
            head = pack_u(ulen, (DDP_L if last else 0) | DDP_VERSION, rdmap, rsvdulp, qn, msn,
                          off & MASK32)
        pay = seg[off:off + n]
        pad = _PADS[(-(ulen + _LEN)) & 3]
        if crc_on:
            if addr is not None and crc_at is not None:
                c = crc_at(addr + off, n, crc32c(head) ^ CRC_MASK) ^ CRC_MASK
            else:
                c = crc32c_gil(pay, crc32c(head), KEEP_GIL)
            trail = pad + pack_crc(crc32c(pad, c) if pad else c)
        else:
            trail = pad + _NO_CRC
        append(head)
        append(pay)
        append(trail)
        total += _LEN + ulen + len(trail)
        off += n
        if last or total >= room or len(out) >= max_bufs:
            break
    msg.off = off
    enc.offset += total
    return total, last


def write_run(ddp: DdpRx, pd: object, mv: memoryview, i: int, n: int,
              crc_on: bool) -> tuple[int, int, int]:
    """Place the whole RDMA Write FPDUs at ``mv[i:n]`` (no markers) until one is not
    (see the module docstring). Returns ``(octets consumed, ULPDU_Length of the last
    FPDU placed, FPDUs placed)``; ``(0, 0, 0)`` when the first FPDU is not taken."""
    start = i
    placed = 0
    mrs = ddp.dev.mrs
    u16 = _U16.unpack_from
    tagged_hdr = TAGGED.unpack_from
    crc_field = _CRC_LE.unpack_from
    cur_stag = -1
    buf = mv  # the MR's buffer once an STag is resolved
    base = 0  # TO of buf[0]
    limit = 0  # octets in buf
    ulen = 0
    last_ulen = 0
    crc_at = crc32c_reg_at
    addr = -1  # the chunk's address for ISA-L (0: none, a read-only chunk)
    while n - i >= MIN_WHOLE:
        ulen = u16(mv, i)[0]
        end = i + _LEN + ulen + ((-(_LEN + ulen)) & 3)
        if end + _CRC_LEN > n or ulen <= TAGGED_HDR_LEN:
            break
        c, r, stag, to = tagged_hdr(mv, i + _LEN)
        if c & WRITE_CTRL_MASK != WRITE_CTRL or r != WRITE_RDMAP:
            break
        rt_op = ddp.rt_op
        if rt_op >= 0 and (rt_op != _OP_WRITE or stag != ddp.rt_stag or to != ddp.rt_to):
            break
        paylen = ulen - TAGGED_HDR_LEN
        if stag != cur_stag:
            mr = mrs.get(stag)
            acc, off = check_access(mr, stag, pd, to, paylen, _REMOTE_WRITE)
            if acc != Access.OK or mr is None:
                break
            cur_stag = stag
            buf = mr.buf
            base = 0 if mr.zero_based else mr.addr
            limit = mr.length
        else:
            # the same STag in this run: nothing that could invalidate it runs in between
            # (the run holds the engine; only Writes are taken), so bounds are what is left
            off = to - base
            if off < 0 or off + paylen > limit or to + paylen > _U64:
                break
        if crc_on:
            if addr < 0:  # once per run, at its first whole FPDU
                a = buffer_address(mv) if crc_at is not None and crc32c_by_address() \
                    else None
                addr = a if a is not None else 0
            if addr and crc_at is not None:
                crc = crc_at(addr + i, end - i, CRC_MASK) ^ CRC_MASK
            else:
                crc = crc32c_gil(mv[i:end], 0, KEEP_GIL)
            if crc != crc_field(mv, end)[0]:
                break
        top = i + _LEN + ulen
        buf[off:off + paylen] = mv[top - paylen:top]
        ddp.rt_op = -1 if c & DDP_L else _OP_WRITE
        ddp.rt_stag = stag
        ddp.rt_to = (to + paylen) & MASK64
        last_ulen = ulen
        placed += 1
        i = end + _CRC_LEN
    return i - start, last_ulen, placed
