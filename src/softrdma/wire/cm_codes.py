"""The values of CM message fields (IBA Vol 1 §12.6-12.11, Tables 104-121).

Attribute IDs (Table 104), private-data sizes per message (IBA 12.6; ``ib_cm.h``), REJ
reasons (Table 109), the MRA/REJ message code, transport service types (12.6.5), APR
status (Table 117), SIDR_REP status (Table 121), and the time codes of the REQ (12.6.5).
RoCE (IBA Annex A16.5.2): REJ reasons 13 and 19 and APR status 7 must not be sent (CA16-11,
CA16-13, :data:`ROCE_FORBIDDEN_REJ_REASONS`, :data:`ROCE_FORBIDDEN_APR_STATUS`).
"""

from __future__ import annotations

from enum import IntEnum

from ..errors import InvalidArgument

__all__ = [
    "CM_CLASS_VERSION", "CmAttr", "RejReason", "MsgType", "TransportServiceType",
    "AprStatus", "SidrStatus", "PRIVATE_DATA_SIZE", "ARI_SIZE", "ADDITIONAL_INFO_SIZE",
    "ROCE_FORBIDDEN_REJ_REASONS", "ROCE_FORBIDDEN_APR_STATUS", "PERMISSIVE_LID", "time_code_s",
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
