"""InfiniBand CM messages (IBA Vol 1 §12.6, Tables 106-120).

Every CM message is a MAD of management class 0x07, class version 2, whose 232 data
bytes hold one message body. Each body is a :class:`~softrdma.wire.mad.Body` dataclass;
field names follow the IBA 12.6 message tables, offsets and bit positions those of Linux
``include/rdma/ibta_vol1_c12.h``. Reserved bits are fields named ``rsvd_<byte offset>``
so that decode and encode are exact inverses. Private data is always the tail of the
body with a fixed size per message (:data:`PRIVATE_DATA_SIZE`); on encode a shorter
``private_data`` is zero-filled.

RoCE (IBA Annex A16.5.2): LIDs in REQ/LAP are reserved and ignored on receive (CA16-10,
CA16-12); REJ reasons 13 and 19 and APR status 7 must not be sent (CA16-11, CA16-13,
see :data:`ROCE_FORBIDDEN_REJ_REASONS`, :data:`ROCE_FORBIDDEN_APR_STATUS`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, ClassVar

from ..errors import DecodeError, InvalidArgument, SoftRdmaError
from .mad import (
    BASE_VERSION,
    MAD_DATA_SIZE,
    MAD_HDR_SIZE,
    MAD_SIZE,
    Body,
    CommonAttr,
    Layout,
    MadHeader,
    Method,
    MgmtClass,
    raw,
    u8,
    u16,
    u32,
    u64,
)

__all__ = [
    "CM_CLASS_VERSION", "CmAttr", "RejReason", "MsgType", "TransportServiceType",
    "AprStatus", "SidrStatus", "PRIVATE_DATA_SIZE", "ARI_SIZE", "ADDITIONAL_INFO_SIZE",
    "ROCE_FORBIDDEN_REJ_REASONS", "ROCE_FORBIDDEN_APR_STATUS", "PERMISSIVE_LID",
    "Req", "Mra", "Rej", "Rep", "Rtu", "Dreq", "Drep", "SidrReq", "SidrRep", "Lap", "Apr",
    "CmMessage", "CmMad", "MESSAGE_TYPES", "decode", "decode_body", "encode", "cm_header",
    "check_mad", "time_code_s",
]

CM_CLASS_VERSION = 2  # IB_CM_CLASS_VERSION (IBA 1.2)
ARI_SIZE = 72
ADDITIONAL_INFO_SIZE = 72
PERMISSIVE_LID = 0xFFFF


class CmAttr(IntEnum):
    """CM attribute IDs (IBA Table 104; ib_cm.h, umad_cm.h)."""

    CLASS_PORT_INFO = 0x0001
    REQ = 0x0010
    MRA = 0x0011
    REJ = 0x0012
    REP = 0x0013
    RTU = 0x0014
    DREQ = 0x0015
    DREP = 0x0016
    SIDR_REQ = 0x0017
    SIDR_REP = 0x0018
    LAP = 0x0019
    APR = 0x001A
    SAP = 0x001B
    SPR = 0x001C


# Private data bytes per message (IBA 12.6; ib_cm.h enum).
PRIVATE_DATA_SIZE: dict[CmAttr, int] = {
    CmAttr.REQ: 92, CmAttr.MRA: 222, CmAttr.REJ: 148, CmAttr.REP: 196, CmAttr.RTU: 224,
    CmAttr.DREQ: 220, CmAttr.DREP: 224, CmAttr.SIDR_REQ: 216, CmAttr.SIDR_REP: 136,
    CmAttr.LAP: 168, CmAttr.APR: 148,
}


class RejReason(IntEnum):
    """REJ reason codes (IBA 12.6.7 Table 109; linux ``enum ib_cm_rej_reason``)."""

    NO_QP = 1
    NO_EEC = 2
    NO_RESOURCES = 3
    TIMEOUT = 4
    UNSUPPORTED = 5
    INVALID_COMM_ID = 6
    INVALID_COMM_INSTANCE = 7
    INVALID_SERVICE_ID = 8
    INVALID_TRANSPORT_TYPE = 9
    STALE_CONN = 10
    RDC_NOT_EXIST = 11
    INVALID_GID = 12
    INVALID_LID = 13
    INVALID_SL = 14
    INVALID_TRAFFIC_CLASS = 15
    INVALID_HOP_LIMIT = 16
    INVALID_PACKET_RATE = 17
    INVALID_ALT_GID = 18
    INVALID_ALT_LID = 19
    INVALID_ALT_SL = 20
    INVALID_ALT_TRAFFIC_CLASS = 21
    INVALID_ALT_HOP_LIMIT = 22
    INVALID_ALT_PACKET_RATE = 23
    PORT_CM_REDIRECT = 24
    PORT_REDIRECT = 25
    INVALID_MTU = 26
    INSUFFICIENT_RESP_RESOURCES = 27
    CONSUMER_DEFINED = 28
    INVALID_RNR_RETRY = 29
    DUPLICATE_LOCAL_COMM_ID = 30
    INVALID_CLASS_VERSION = 31
    INVALID_FLOW_LABEL = 32
    INVALID_ALT_FLOW_LABEL = 33
    VENDOR_OPTION_NOT_SUPPORTED = 35


# Annex A16.5.2.2 CA16-11 / A16.5.2.4 CA16-13: not to be sent between RoCE ports.
ROCE_FORBIDDEN_REJ_REASONS = frozenset({RejReason.INVALID_LID, RejReason.INVALID_ALT_LID})


class MsgType(IntEnum):
    """The 2-bit "Message MRAed" (MRA) / "Message Rejected" (REJ) code (IBA 12.6.6-7)."""

    REQ = 0
    REP = 1
    OTHER = 2  # LAP for an MRA


class TransportServiceType(IntEnum):
    """REQ Transport Service Type (IBA 12.6.5)."""

    RC = 0
    UC = 1
    RD = 2
    EXTENDED = 3  # see the Extended Transport Type field (1 = XRC)


class AprStatus(IntEnum):
    """APR AP Status (IBA 12.8.2, Table 117)."""

    SUCCESS = 0
    INVALID_COMM_ID = 1
    UNSUPPORTED = 2
    REJECTED = 3
    REDIRECT = 4
    IS_CURRENT = 5
    INVALID_QPN_EECN = 6
    INVALID_LID = 7
    INVALID_GID = 8
    INVALID_FLOW_LABEL = 9
    INVALID_TCLASS = 10
    INVALID_HOP_LIMIT = 11
    INVALID_PACKET_RATE = 12
    INVALID_SL = 13


ROCE_FORBIDDEN_APR_STATUS = frozenset({AprStatus.INVALID_LID})


class SidrStatus(IntEnum):
    """SIDR_REP Status (IBA Table 121; linux ``enum ib_cm_sidr_status``)."""

    SUCCESS = 0
    UNSUPPORTED = 1  # service ID not supported
    REJECT = 2
    NO_QP = 3
    REDIRECT = 4  # additional information = ClassPortInfo
    UNSUPPORTED_VERSION = 5


def time_code_s(t: int) -> float:
    """An IBA 5-bit time code in seconds: 4.096 us * 2^t (the REQ's timeout fields, IBA
    12.6.5)."""
    if not 0 <= t <= 31:
        raise InvalidArgument("t", f"time code must be 0..31, got {t}")
    return 4.096e-6 * (1 << t)


def _zero(n: int) -> Any:
    return field(default=bytes(n))


# --------------------------------------------------------------------------- messages
@dataclass(slots=True)
class Req(Body):
    """ConnectRequest (IBA 12.6.5, Table 106)."""

    ATTR_ID: ClassVar[CmAttr] = CmAttr.REQ
    local_comm_id: int = 0
    rsvd_4: int = 0
    service_id: int = 0
    local_ca_guid: int = 0
    rsvd_24: int = 0
    local_qkey: int = 0
    local_qpn: int = 0
    responder_resources: int = 0
    local_eecn: int = 0
    initiator_depth: int = 0
    remote_eecn: int = 0
    remote_cm_response_timeout: int = 0
    transport_service_type: int = TransportServiceType.RC
    end_to_end_flow_control: int = 0
    starting_psn: int = 0
    local_cm_response_timeout: int = 0
    retry_count: int = 0
    pkey: int = 0xFFFF
    path_mtu: int = 0
    rdc_exists: int = 0
    rnr_retry_count: int = 0
    max_cm_retries: int = 0
    srq: int = 0
    extended_transport_type: int = 0
    primary_local_lid: int = 0
    primary_remote_lid: int = 0
    primary_local_gid: bytes = _zero(16)
    primary_remote_gid: bytes = _zero(16)
    primary_flow_label: int = 0
    rsvd_90: int = 0
    primary_packet_rate: int = 0
    primary_traffic_class: int = 0
    primary_hop_limit: int = 0
    primary_sl: int = 0
    primary_subnet_local: int = 0
    rsvd_94: int = 0
    primary_local_ack_timeout: int = 0
    rsvd_95: int = 0
    alt_local_lid: int = 0
    alt_remote_lid: int = 0
    alt_local_gid: bytes = _zero(16)
    alt_remote_gid: bytes = _zero(16)
    alt_flow_label: int = 0
    rsvd_134: int = 0
    alt_packet_rate: int = 0
    alt_traffic_class: int = 0
    alt_hop_limit: int = 0
    alt_sl: int = 0
    alt_subnet_local: int = 0
    rsvd_138: int = 0
    alt_local_ack_timeout: int = 0
    sap_supported: int = 0
    rsvd_139: int = 0
    private_data: bytes = b""

    LAYOUT: ClassVar[Layout] = Layout("req", (
        u32("local_comm_id"), u32("rsvd_4"), u64("service_id"), u64("local_ca_guid"),
        u32("rsvd_24"), u32("local_qkey"),
        u32(("local_qpn", 24), ("responder_resources", 8)),
        u32(("local_eecn", 24), ("initiator_depth", 8)),
        u32(("remote_eecn", 24), ("remote_cm_response_timeout", 5),
            ("transport_service_type", 2), ("end_to_end_flow_control", 1)),
        u32(("starting_psn", 24), ("local_cm_response_timeout", 5), ("retry_count", 3)),
        u16("pkey"),
        u8(("path_mtu", 4), ("rdc_exists", 1), ("rnr_retry_count", 3)),
        u8(("max_cm_retries", 4), ("srq", 1), ("extended_transport_type", 3)),
        u16("primary_local_lid"), u16("primary_remote_lid"),
        raw(16, "primary_local_gid"), raw(16, "primary_remote_gid"),
        u32(("primary_flow_label", 20), ("rsvd_90", 6), ("primary_packet_rate", 6)),
        u8("primary_traffic_class"), u8("primary_hop_limit"),
        u8(("primary_sl", 4), ("primary_subnet_local", 1), ("rsvd_94", 3)),
        u8(("primary_local_ack_timeout", 5), ("rsvd_95", 3)),
        u16("alt_local_lid"), u16("alt_remote_lid"),
        raw(16, "alt_local_gid"), raw(16, "alt_remote_gid"),
        u32(("alt_flow_label", 20), ("rsvd_134", 6), ("alt_packet_rate", 6)),
        u8("alt_traffic_class"), u8("alt_hop_limit"),
        u8(("alt_sl", 4), ("alt_subnet_local", 1), ("rsvd_138", 3)),
        u8(("alt_local_ack_timeout", 5), ("sap_supported", 1), ("rsvd_139", 2)),
        raw(92, "private_data", pad=True),
    ))


@dataclass(slots=True)
class Mra(Body):
    """MsgRcptAck (IBA 12.6.6, Table 107)."""

    ATTR_ID: ClassVar[CmAttr] = CmAttr.MRA
    local_comm_id: int = 0
    remote_comm_id: int = 0
    message_mraed: int = MsgType.REQ
    rsvd_8: int = 0
    service_timeout: int = 0
    rsvd_9: int = 0
    private_data: bytes = b""

    LAYOUT: ClassVar[Layout] = Layout("mra", (
        u32("local_comm_id"), u32("remote_comm_id"),
        u8(("message_mraed", 2), ("rsvd_8", 6)),
        u8(("service_timeout", 5), ("rsvd_9", 3)),
        raw(222, "private_data", pad=True),
    ))


@dataclass(slots=True)
class Rej(Body):
    """ConnectReject (IBA 12.6.7, Table 108). ``ari_length`` counts the ARI bytes used."""

    ATTR_ID: ClassVar[CmAttr] = CmAttr.REJ
    local_comm_id: int = 0
    remote_comm_id: int = 0
    message_rejected: int = MsgType.REQ
    rsvd_8: int = 0
    ari_length: int = 0
    rsvd_9: int = 0
    reason: int = 0
    ari: bytes = b""
    private_data: bytes = b""

    LAYOUT: ClassVar[Layout] = Layout("rej", (
        u32("local_comm_id"), u32("remote_comm_id"),
        u8(("message_rejected", 2), ("rsvd_8", 6)),
        u8(("ari_length", 7), ("rsvd_9", 1)),
        u16("reason"),
        raw(ARI_SIZE, "ari", pad=True),
        raw(148, "private_data", pad=True),
    ))

    @property
    def ari_data(self) -> bytes:
        """The ARI bytes in use (``ari_length`` of them, at most 72)."""
        return bytes(self.ari[:min(self.ari_length, ARI_SIZE)])


@dataclass(slots=True)
class Rep(Body):
    """ConnectReply (IBA 12.6.8, Table 110)."""

    ATTR_ID: ClassVar[CmAttr] = CmAttr.REP
    local_comm_id: int = 0
    remote_comm_id: int = 0
    local_qkey: int = 0
    local_qpn: int = 0
    rsvd_15: int = 0
    local_eecn: int = 0
    rsvd_19: int = 0
    starting_psn: int = 0
    rsvd_23: int = 0
    responder_resources: int = 0
    initiator_depth: int = 0
    target_ack_delay: int = 0
    failover_accepted: int = 0
    end_to_end_flow_control: int = 0
    rnr_retry_count: int = 0
    srq: int = 0
    rsvd_27: int = 0
    local_ca_guid: int = 0
    private_data: bytes = b""

    LAYOUT: ClassVar[Layout] = Layout("rep", (
        u32("local_comm_id"), u32("remote_comm_id"), u32("local_qkey"),
        u32(("local_qpn", 24), ("rsvd_15", 8)),
        u32(("local_eecn", 24), ("rsvd_19", 8)),
        u32(("starting_psn", 24), ("rsvd_23", 8)),
        u8("responder_resources"), u8("initiator_depth"),
        u8(("target_ack_delay", 5), ("failover_accepted", 2), ("end_to_end_flow_control", 1)),
        u8(("rnr_retry_count", 3), ("srq", 1), ("rsvd_27", 4)),
        u64("local_ca_guid"),
        raw(196, "private_data", pad=True),
    ))


@dataclass(slots=True)
class Rtu(Body):
    """ReadyToUse (IBA 12.6.9, Table 111)."""

    ATTR_ID: ClassVar[CmAttr] = CmAttr.RTU
    local_comm_id: int = 0
    remote_comm_id: int = 0
    private_data: bytes = b""

    LAYOUT: ClassVar[Layout] = Layout("rtu", (
        u32("local_comm_id"), u32("remote_comm_id"), raw(224, "private_data", pad=True),
    ))


@dataclass(slots=True)
class Dreq(Body):
    """DisconnectRequest (IBA 12.6.10, Table 112)."""

    ATTR_ID: ClassVar[CmAttr] = CmAttr.DREQ
    local_comm_id: int = 0
    remote_comm_id: int = 0
    remote_qpn_eecn: int = 0
    rsvd_11: int = 0
    private_data: bytes = b""

    LAYOUT: ClassVar[Layout] = Layout("dreq", (
        u32("local_comm_id"), u32("remote_comm_id"),
        u32(("remote_qpn_eecn", 24), ("rsvd_11", 8)),
        raw(220, "private_data", pad=True),
    ))


@dataclass(slots=True)
class Drep(Body):
    """DisconnectReply (IBA 12.6.11, Table 113)."""

    ATTR_ID: ClassVar[CmAttr] = CmAttr.DREP
    local_comm_id: int = 0
    remote_comm_id: int = 0
    private_data: bytes = b""

    LAYOUT: ClassVar[Layout] = Layout("drep", (
        u32("local_comm_id"), u32("remote_comm_id"), raw(224, "private_data", pad=True),
    ))


@dataclass(slots=True)
class SidrReq(Body):
    """ServiceIDResReq (IBA 12.11.1, Table 119)."""

    ATTR_ID: ClassVar[CmAttr] = CmAttr.SIDR_REQ
    request_id: int = 0
    pkey: int = 0xFFFF
    rsvd_6: int = 0
    service_id: int = 0
    private_data: bytes = b""

    LAYOUT: ClassVar[Layout] = Layout("sidr_req", (
        u32("request_id"), u16("pkey"), u16("rsvd_6"), u64("service_id"),
        raw(216, "private_data", pad=True),
    ))


@dataclass(slots=True)
class SidrRep(Body):
    """ServiceIDResReqResp (IBA 12.11.2, Table 120)."""

    ATTR_ID: ClassVar[CmAttr] = CmAttr.SIDR_REP
    request_id: int = 0
    status: int = SidrStatus.SUCCESS
    info_length: int = 0
    rsvd_6: int = 0
    qpn: int = 0
    rsvd_11: int = 0
    service_id: int = 0
    qkey: int = 0
    info: bytes = b""
    private_data: bytes = b""

    LAYOUT: ClassVar[Layout] = Layout("sidr_rep", (
        u32("request_id"), u8("status"), u8("info_length"), u16("rsvd_6"),
        u32(("qpn", 24), ("rsvd_11", 8)),
        u64("service_id"), u32("qkey"),
        raw(ADDITIONAL_INFO_SIZE, "info", pad=True),
        raw(136, "private_data", pad=True),
    ))


@dataclass(slots=True)
class Lap(Body):
    """LoadAlternatePath (IBA 12.8.1, Table 115)."""

    ATTR_ID: ClassVar[CmAttr] = CmAttr.LAP
    local_comm_id: int = 0
    remote_comm_id: int = 0
    rsvd_8: int = 0
    remote_qpn_eecn: int = 0
    remote_cm_response_timeout: int = 0
    rsvd_15: int = 0
    rsvd_16: int = 0
    alt_local_lid: int = 0
    alt_remote_lid: int = 0
    alt_local_gid: bytes = _zero(16)
    alt_remote_gid: bytes = _zero(16)
    alt_flow_label: int = 0
    rsvd_58: int = 0
    alt_traffic_class: int = 0
    alt_hop_limit: int = 0
    rsvd_61: int = 0
    alt_packet_rate: int = 0
    alt_sl: int = 0
    alt_subnet_local: int = 0
    rsvd_62: int = 0
    alt_local_ack_timeout: int = 0
    rsvd_63: int = 0
    private_data: bytes = b""

    LAYOUT: ClassVar[Layout] = Layout("lap", (
        u32("local_comm_id"), u32("remote_comm_id"), u32("rsvd_8"),
        u32(("remote_qpn_eecn", 24), ("remote_cm_response_timeout", 5), ("rsvd_15", 3)),
        u32("rsvd_16"),
        u16("alt_local_lid"), u16("alt_remote_lid"),
        raw(16, "alt_local_gid"), raw(16, "alt_remote_gid"),
        u32(("alt_flow_label", 20), ("rsvd_58", 4), ("alt_traffic_class", 8)),
        u8("alt_hop_limit"),
        u8(("rsvd_61", 2), ("alt_packet_rate", 6)),
        u8(("alt_sl", 4), ("alt_subnet_local", 1), ("rsvd_62", 3)),
        u8(("alt_local_ack_timeout", 5), ("rsvd_63", 3)),
        raw(168, "private_data", pad=True),
    ))


@dataclass(slots=True)
class Apr(Body):
    """AlternatePathResponse (IBA 12.8.2, Table 116)."""

    ATTR_ID: ClassVar[CmAttr] = CmAttr.APR
    local_comm_id: int = 0
    remote_comm_id: int = 0
    info_length: int = 0
    status: int = AprStatus.SUCCESS
    rsvd_10: int = 0
    info: bytes = b""
    private_data: bytes = b""

    LAYOUT: ClassVar[Layout] = Layout("apr", (
        u32("local_comm_id"), u32("remote_comm_id"),
        u8("info_length"), u8("status"), u16("rsvd_10"),
        raw(ADDITIONAL_INFO_SIZE, "info", pad=True),
        raw(148, "private_data", pad=True),
    ))


CmMessage = Req | Mra | Rej | Rep | Rtu | Dreq | Drep | SidrReq | SidrRep | Lap | Apr

MESSAGE_TYPES: dict[int, type[CmMessage]] = {
    c.ATTR_ID: c for c in (Req, Mra, Rej, Rep, Rtu, Dreq, Drep, SidrReq, SidrRep, Lap, Apr)
}

for _c in MESSAGE_TYPES.values():
    _c.check_fields()
    _pd = _c.LAYOUT.widths["private_data"] // 8
    if _c.LAYOUT.size != MAD_DATA_SIZE or _pd != PRIVATE_DATA_SIZE[_c.ATTR_ID]:
        raise TypeError(f"{_c.__name__}: layout is {_c.LAYOUT.size} bytes, private data {_pd}")


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
