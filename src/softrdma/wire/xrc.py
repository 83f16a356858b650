"""The XRC Extended Transport Header (XRCETH) and the XRC opcodes (IBA 9.3 / Annex A14;
IBA 9.2 Table 35, transport prefix 101b).

XRCETH (4 bytes, right after the BTH of every XRC *request*; responses have none)::

    Resv(8) | XRCSRQ(24)     the number of the XRC SRQ that is to receive the request

The XRC opcodes are the RC ones with the transport bits 0xA0 (``XRC_SEND_ONLY`` = 0xA4,
``XRC_ACKNOWLEDGE`` = 0xB1, ...); :mod:`softrdma.wire.opcodes` lists them with their
headers as data and :mod:`softrdma.wire.ib` decodes and encodes them, the XRCETH as
``IBPacket.xrceth`` (the whole 32-bit word, so the reserved byte round-trips). This
module names the field and turns an RC header into the XRC one, which is how the engine
builds XRC packets (:mod:`softrdma.ib.xrc`).
"""

from __future__ import annotations

import struct

from ..errors import DecodeError
from .opcodes import BTH_SIZE, Transport

__all__ = ["XRCETH", "XRCETH_SIZE", "XRCSRQ_MASK", "pack_xrceth", "unpack_xrceth",
           "xrceth_srqn", "xrc_request_header", "xrc_response_header"]

XRCETH = struct.Struct("!I")
XRCETH_SIZE = XRCETH.size
XRCSRQ_MASK = 0xFFFFFF
_RESV_SHIFT = 24
_XRC = int(Transport.XRC)
_OPCODE_MASK = 0x1F  # the operation bits 4..0 of the opcode


def pack_xrceth(srqn: int, resv: int = 0) -> bytes:
    """The 4 bytes of an XRCETH naming SRQ ``srqn`` (24 bits; reserved byte ``resv``)."""
    return XRCETH.pack(((resv & 0xFF) << _RESV_SHIFT) | (srqn & XRCSRQ_MASK))


def unpack_xrceth(buf: bytes | memoryview, offset: int = 0) -> tuple[int, int]:
    """``(resv, srqn)`` of the XRCETH at ``offset``; inverse of :func:`pack_xrceth`.
    :class:`~softrdma.errors.DecodeError` if ``buf`` ends before it."""
    if not 0 <= offset <= len(buf) - XRCETH_SIZE:
        raise DecodeError(f"no XRCETH at offset {offset} of {len(buf)} bytes")
    w = XRCETH.unpack_from(buf, offset)[0]
    return w >> _RESV_SHIFT, w & XRCSRQ_MASK


def xrceth_srqn(word: int) -> int:
    """The XRCSRQ field of an XRCETH word (``IBPacket.xrceth``)."""
    return word & XRCSRQ_MASK


def xrc_request_header(rc_header: bytes, srqn: int) -> bytes:
    """The XRC request header for an RC request header (BTH + extension headers): the
    opcode's transport bits become XRC and the XRCETH goes right after the BTH, before
    RETH / AtomicETH / ImmDt / IETH (IBA 9.2, Annex A14 header order)."""
    op = (rc_header[0] & _OPCODE_MASK) | _XRC
    return bytes((op,)) + rc_header[1:BTH_SIZE] + XRCETH.pack(srqn & XRCSRQ_MASK) + \
        rc_header[BTH_SIZE:]


def xrc_response_header(rc_header: bytes) -> bytes:
    """The XRC response header for an RC response header (ACK, READ response, atomic
    ACK): the same headers with the XRC opcode (responses carry no XRCETH)."""
    return bytes(((rc_header[0] & _OPCODE_MASK) | _XRC,)) + rc_header[1:]
