"""InfiniBand CM MADs (IBA Vol 1 §12.6, Tables 106-120).

Every CM message is a MAD of management class 0x07, class version 2, whose 232 data
bytes hold one message body. This module is the MAD codec (:func:`encode`, :func:`decode`,
:func:`check_mad`, :func:`cm_header` as Linux ``cm_format_mad_hdr``) and re-exports, for
its many callers, the field values (:mod:`softrdma.wire.cm_codes`) and the message bodies
(:mod:`softrdma.wire.cm_messages`).

RoCE (IBA Annex A16.5.2): LIDs in REQ/LAP are reserved and ignored on receive (CA16-10,
CA16-12); REJ reasons 13 and 19 and APR status 7 must not be sent (CA16-11, CA16-13,
see :data:`ROCE_FORBIDDEN_REJ_REASONS`, :data:`ROCE_FORBIDDEN_APR_STATUS`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import DecodeError, InvalidArgument, SoftRdmaError
from .cm_codes import (
    ADDITIONAL_INFO_SIZE,
    ARI_SIZE,
    CM_CLASS_VERSION,
    PERMISSIVE_LID,
    PRIVATE_DATA_SIZE,
    ROCE_FORBIDDEN_APR_STATUS,
    ROCE_FORBIDDEN_REJ_REASONS,
    AprStatus,
    CmAttr,
    MsgType,
    RejReason,
    SidrStatus,
    TransportServiceType,
    time_code_s,
)
from .cm_messages import (
    MESSAGE_TYPES,
    Apr,
    CmMessage,
    Drep,
    Dreq,
    Lap,
    Mra,
    Rej,
    Rep,
    Req,
    Rtu,
    SidrRep,
    SidrReq,
)
from .mad import (
    BASE_VERSION,
    MAD_DATA_SIZE,
    MAD_HDR_SIZE,
    MAD_SIZE,
    CommonAttr,
    MadHeader,
    Method,
    MgmtClass,
)

__all__ = [
    "CM_CLASS_VERSION", "CmAttr", "RejReason", "MsgType", "TransportServiceType",
    "AprStatus", "SidrStatus", "PRIVATE_DATA_SIZE", "ARI_SIZE", "ADDITIONAL_INFO_SIZE",
    "ROCE_FORBIDDEN_REJ_REASONS", "ROCE_FORBIDDEN_APR_STATUS", "PERMISSIVE_LID",
    "Req", "Mra", "Rej", "Rep", "Rtu", "Dreq", "Drep", "SidrReq", "SidrRep", "Lap", "Apr",
    "CmMessage", "CmMad", "MESSAGE_TYPES", "decode", "decode_body", "encode", "cm_header",
    "check_mad", "time_code_s",
]


# --------------------------------------------------------------------------- MADs
@dataclass(slots=True)
class CmMad:
    """A whole CM MAD: the common header and the message its Attribute ID names."""

    hdr: MadHeader
    msg: CmMessage

    def encode(self) -> bytes:
        """The 256 MAD bytes. Raises InvalidArgument if the header does not fit the message."""
        return encode(self.msg, hdr=self.hdr)


def cm_header(msg: CmMessage, tid: int, *, attr_mod: int = 0,
              method: int = Method.SEND) -> MadHeader:
    """The header Linux puts on a CM message (cm.c ``cm_format_mad_hdr``)."""
    return MadHeader(BASE_VERSION, MgmtClass.CM, CM_CLASS_VERSION, method, 0, 0, tid,
                     msg.ATTR_ID, 0, attr_mod)


def encode(msg: CmMessage, *, tid: int = 0, hdr: MadHeader | None = None) -> bytes:
    """The 256-byte MAD carrying ``msg``: with ``hdr`` as given, else :func:`cm_header`."""
    if hdr is None:
        hdr = cm_header(msg, tid)
    elif hdr.attr_id != msg.ATTR_ID:
        raise InvalidArgument("hdr.attr_id", f"{hdr.attr_id:#06x} does not match "
                                             f"{type(msg).__name__} ({msg.ATTR_ID:#06x})")
    return hdr.encode() + msg.encode()


def decode_body(attr_id: int, body: Any) -> CmMessage:
    """Decode a 232-byte CM message body of the given attribute. Raises DecodeError."""
    cls = MESSAGE_TYPES.get(attr_id)
    if cls is None:
        try:
            name = CmAttr(attr_id).name
        except ValueError:
            name = "unknown"
        raise DecodeError(f"CM attribute {attr_id:#06x} ({name}) is not a CM message")
    n = len(body)
    if n != MAD_DATA_SIZE:
        raise DecodeError(f"CM {cls.__name__.upper()} body must be {MAD_DATA_SIZE} bytes, got {n}")
    return cls.decode(body)


def decode(mad: Any) -> CmMad:
    """Decode a 256-byte CM MAD. Raises DecodeError for a short/long MAD, another class,
    class version other than 2, or an attribute that is not a CM message."""
    n = len(mad)
    if n != MAD_SIZE:
        raise DecodeError(f"CM MAD must be {MAD_SIZE} bytes, got {n}")
    hdr = MadHeader.decode(mad)
    if hdr.base_version != BASE_VERSION:
        raise DecodeError(f"MAD base version {hdr.base_version}, expected {BASE_VERSION}")
    if hdr.mgmt_class != MgmtClass.CM:
        raise DecodeError(f"management class {hdr.mgmt_class:#04x} is not CM (0x07)")
    if hdr.class_version != CM_CLASS_VERSION:
        raise DecodeError(f"CM class version {hdr.class_version}, expected {CM_CLASS_VERSION}")
    mv = memoryview(mad).cast("B")
    return CmMad(hdr, decode_body(hdr.attr_id, mv[MAD_HDR_SIZE:]))


def check_mad(payload: memoryview) -> str | None:
    """Check the UD payload of a packet to QP1 (for ``softrdma pcap-check``).

    None if it is a well-formed MAD that re-encodes byte for byte: CM (class 0x07)
    messages fully decoded, any other class (and CM ClassPortInfo) by its common header.
    Otherwise one line saying what is wrong.
    """
    try:
        mv = memoryview(payload).cast("B")
        n = len(mv)
        if n != MAD_SIZE:
            return f"MAD must be {MAD_SIZE} bytes, got {n}"
        hdr = MadHeader.decode(mv)
        if hdr.base_version != BASE_VERSION:
            return f"MAD base version {hdr.base_version}, expected {BASE_VERSION}"
        if hdr.mgmt_class == MgmtClass.CM and hdr.attr_id != CommonAttr.CLASS_PORT_INFO:
            rebuilt = decode(mv).encode()
            what = f"CM {CmAttr(hdr.attr_id).name}"
        else:
            rebuilt = hdr.encode() + bytes(mv[MAD_HDR_SIZE:])
            what = f"MAD class {hdr.mgmt_class:#04x}"
        if rebuilt != mv:
            at = next(i for i in range(n) if rebuilt[i] != mv[i])
            return f"{what}: re-encoded MAD differs at byte {at}"
    except SoftRdmaError as e:
        return str(e)
    return None
