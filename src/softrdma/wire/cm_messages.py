"""The CM message bodies (IBA Vol 1 §12.6, 12.8, 12.11; Tables 106-120).

Each of the 232 data bytes of a CM MAD holds one message body, a
:class:`~softrdma.wire.mad.Body` dataclass; field names follow the IBA 12.6 message tables,
offsets and bit positions those of Linux ``include/rdma/ibta_vol1_c12.h``. Reserved bits are
fields named ``rsvd_<byte offset>`` so that decode and encode are exact inverses. Private
data is always the tail of the body with a fixed size per message
(:data:`~softrdma.wire.cm_codes.PRIVATE_DATA_SIZE`, checked at import); on encode a shorter
``private_data`` is zero-filled. The MAD around them is :mod:`softrdma.wire.cm`.

A declarative table: the bodies of equal shape (RTU and DREP, say) are separate rows of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from .cm_codes import (
    ADDITIONAL_INFO_SIZE,
    ARI_SIZE,
    PRIVATE_DATA_SIZE,
    AprStatus,
    CmAttr,
    MsgType,
    SidrStatus,
    TransportServiceType,
)
from .mad import MAD_DATA_SIZE, Body, Layout, raw, u8, u16, u32, u64

__all__ = [
    "Req", "Mra", "Rej", "Rep", "Rtu", "Dreq", "Drep", "SidrReq", "SidrRep", "Lap", "Apr",
    "CmMessage", "MESSAGE_TYPES",
]


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
