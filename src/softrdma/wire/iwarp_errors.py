"""The iWARP error taxonomy of the Terminate message: layers, error types and codes
(RFC 5040 §4.8 Figure 9 and §7, RFC 5041 §7, RFC 5044 §8, RFC 6581 §8; names as in siw
iwarp.h and Wireshark), and :func:`error_name` to read a triple in the RFCs' words.

The Terminate message that carries them is :class:`softrdma.wire.ddp.Terminate`;
:mod:`softrdma.wire.ddp` re-exports these names for its callers.
"""

from __future__ import annotations

from enum import IntEnum

__all__ = [
    "TerminateLayer", "RdmapEtype", "RdmapErrorCode", "DdpEtype", "DdpTaggedErrorCode",
    "DdpUntaggedErrorCode", "LlpEtype", "MpaErrorCode", "error_name",
]


class TerminateLayer(IntEnum):
    """Terminate Control "Layer" (RFC 5040 §4.8)."""

    RDMAP = 0
    DDP = 1
    LLP = 2


class RdmapEtype(IntEnum):
    """RDMAP error types (RFC 5040 §4.8 Figure 9)."""

    LOCAL_CATASTROPHIC = 0
    REMOTE_PROTECTION = 1
    REMOTE_OPERATION = 2


class RdmapErrorCode(IntEnum):
    """RDMAP error codes (RFC 5040 §4.8 Figure 9)."""

    INVALID_STAG = 0x00
    BASE_OR_BOUNDS_VIOLATION = 0x01
    ACCESS_RIGHTS_VIOLATION = 0x02
    STAG_NOT_ASSOCIATED = 0x03
    TO_WRAP = 0x04
    INVALID_RDMAP_VERSION = 0x05
    UNEXPECTED_OPCODE = 0x06
    CATASTROPHIC_LOCALIZED = 0x07
    CATASTROPHIC_GLOBAL = 0x08
    STAG_CANNOT_BE_INVALIDATED = 0x09
    UNSPECIFIED = 0xFF


class DdpEtype(IntEnum):
    """DDP error types (RFC 5041 §7.2); 3 is reserved for the LLP."""

    LOCAL_CATASTROPHIC = 0
    TAGGED_BUFFER = 1
    UNTAGGED_BUFFER = 2
    RESERVED_LLP = 3


class DdpTaggedErrorCode(IntEnum):
    """DDP tagged buffer error codes (RFC 5041 §7.2)."""

    INVALID_STAG = 0x00
    BASE_OR_BOUNDS_VIOLATION = 0x01
    STAG_NOT_ASSOCIATED = 0x02
    TO_WRAP = 0x03
    INVALID_DDP_VERSION = 0x04


class DdpUntaggedErrorCode(IntEnum):
    """DDP untagged buffer error codes (RFC 5041 §7.2)."""

    INVALID_QN = 0x01
    INVALID_MSN_NO_BUFFER = 0x02
    INVALID_MSN_RANGE = 0x03
    INVALID_MO = 0x04
    MESSAGE_TOO_LONG = 0x05
    INVALID_DDP_VERSION = 0x06


class LlpEtype(IntEnum):
    """LLP error types; MPA is the only one (RFC 5044 §8)."""

    MPA = 0


class MpaErrorCode(IntEnum):
    """MPA error codes carried in a Terminate with Layer LLP (RFC 5044 §8, RFC 6581 §8)."""

    TCP_CONNECTION_LOST = 0x01
    CRC_MISMATCH = 0x02
    MARKER_MISMATCH = 0x03
    INVALID_REQ_REP = 0x04
    LOCAL_CATASTROPHIC = 0x05
    INSUFFICIENT_IRD = 0x06
    NO_MATCHING_RTR = 0x07


_LAYER_NAMES = {0: "RDMAP", 1: "DDP", 2: "LLP"}
_ETYPE_NAMES: dict[tuple[int, int], str] = {
    (0, 0): "Local Catastrophic Error",
    (0, 1): "Remote Protection Error",
    (0, 2): "Remote Operation Error",
    (1, 0): "Local Catastrophic Error",
    (1, 1): "Tagged Buffer Error",
    (1, 2): "Untagged Buffer Error",
    (1, 3): "Reserved for the LLP",
    (2, 0): "MPA Error",
}

_RDMAP_CODE_NAMES = {
    0x00: "Invalid STag",
    0x01: "Base or bounds violation",
    0x02: "Access rights violation",
    0x03: "STag not associated with RDMAP Stream",
    0x04: "TO wrap",
    0x05: "Invalid RDMAP version",
    0x06: "Unexpected OpCode",
    0x07: "Catastrophic error, localized to RDMAP Stream",
    0x08: "Catastrophic error, global",
    0x09: "STag cannot be Invalidated",
    0xFF: "Unspecified Error",
}
_DDP_TAGGED_CODE_NAMES = {
    0x00: "Invalid STag",
    0x01: "Base or bounds violation",
    0x02: "STag not associated with DDP Stream",
    0x03: "TO wrap",
    0x04: "Invalid DDP version",
}
_DDP_UNTAGGED_CODE_NAMES = {
    0x01: "Invalid QN",
    0x02: "Invalid MSN - no buffer available",
    0x03: "Invalid MSN - MSN range is not valid",
    0x04: "Invalid MO",
    0x05: "DDP Message too long for available buffer",
    0x06: "Invalid DDP version",
}
_MPA_CODE_NAMES = {
    0x01: "TCP connection closed, terminated or lost",
    0x02: "Received MPA CRC does not match",
    0x03: "Received Marker (and ULPDU Length field) mismatch",
    0x04: "Invalid MPA Request/Reply frame",
    0x05: "Local catastrophic error",
    0x06: "Insufficient IRD resources",
    0x07: "No matching RTR option",
}


def error_name(layer: int, etype: int, code: int) -> str:
    """``"<layer> / <error type> / <error code>"`` in the words of the RFC tables."""
    lname = _LAYER_NAMES.get(layer, f"layer {layer}")
    ename = _ETYPE_NAMES.get((layer, etype), f"etype {etype}")
    table: dict[int, str] = {}
    if layer == TerminateLayer.RDMAP and etype != RdmapEtype.LOCAL_CATASTROPHIC:
        table = _RDMAP_CODE_NAMES
    elif layer == TerminateLayer.DDP and etype == DdpEtype.TAGGED_BUFFER:
        table = _DDP_TAGGED_CODE_NAMES
    elif layer == TerminateLayer.DDP and etype == DdpEtype.UNTAGGED_BUFFER:
        table = _DDP_UNTAGGED_CODE_NAMES
    elif layer == TerminateLayer.LLP:
        table = _MPA_CODE_NAMES
    cname = table.get(code, f"code {code:#04x}")
    return f"{lname} / {ename} / {cname}"
