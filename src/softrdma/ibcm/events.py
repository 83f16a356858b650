"""CM events for the consumer (the rdma_cm-style layer above) and readable rejections.

Event names follow librdmacm (``enum rdma_cm_event_type``) so the connection API above
the CM is a thin mapping: :class:`CmEventType` values are the rdma_cm names.

:func:`describe_rej` turns a received REJ into a :class:`RejectInfo` with one distinct
text per cause: the IBA reason (IBA 12.6.7 Table 109)
and, for reason 28 (Consumer Reject) whose ARI names the RDMA IP CM Service layer, the
Annex A11 Table 5 code with its suggested value (A11.7, oA11-2).

:class:`CmEvent` (defined beside :class:`~.cmid.IbCmId`, which it names),
:class:`CmEventType` and :class:`RejectInfo` (:mod:`.model`) are re-exported here.
"""

from __future__ import annotations

from typing import TypeVar

from ..errors import DecodeError
from ..wire.cm import Rej, RejReason, SidrStatus
from ..wire.ipcm import IpCmAri, IpCmReject, UlpReject, decode_consumer_ari
from .cmid import CmEvent
from .model import CmEventType, RejectInfo

__all__ = ["CmEventType", "CmEvent", "RejectInfo", "describe_rej", "describe_sidr_status",
           "reason_name", "lock_free", "is_lock_free"]

_H = TypeVar("_H")
_LOCK_FREE = "cm_lock_free"


def lock_free(handler: _H) -> _H:
    """Mark an event handler (a function, or a ``functools.partial``) as one that never
    blocks and makes no verbs call (calls to the CM itself are allowed: from a handler
    they run inline, at the event's time). The CM's driver (:mod:`softrdma.drivers.cm.gsi`)
    may then run it as soon as a MAD or a timer produced the event, under the device
    lock, instead of handing the event to its event thread: the rdma_cm layer's
    handlers, which post to an event channel. A method marked in its class body stays
    marked when bound."""
    setattr(handler, _LOCK_FREE, True)
    return handler


def is_lock_free(handler: object) -> bool:
    """True if ``handler`` was marked with :func:`lock_free`."""
    return bool(getattr(handler, _LOCK_FREE, False))


_REASON_TEXT: dict[int, str] = {
    RejReason.NO_QP: "no QP available",
    RejReason.NO_EEC: "no EE context available",
    RejReason.NO_RESOURCES: "no resources available",
    RejReason.TIMEOUT: "timeout",
    RejReason.UNSUPPORTED: "unsupported request",
    RejReason.INVALID_COMM_ID: "invalid communication ID",
    RejReason.INVALID_COMM_INSTANCE: "invalid communication instance",
    RejReason.INVALID_SERVICE_ID: "invalid Service ID (nobody listens on it)",
    RejReason.INVALID_TRANSPORT_TYPE: "invalid transport service type",
    RejReason.STALE_CONN: "stale connection",
    RejReason.RDC_NOT_EXIST: "RDC does not exist",
    RejReason.INVALID_GID: "primary remote port GID rejected",
    RejReason.INVALID_LID: "primary remote port LID rejected",
    RejReason.INVALID_SL: "primary SL rejected",
    RejReason.INVALID_TRAFFIC_CLASS: "primary traffic class rejected",
    RejReason.INVALID_HOP_LIMIT: "primary hop limit rejected",
    RejReason.INVALID_PACKET_RATE: "primary packet rate rejected",
    RejReason.INVALID_ALT_GID: "alternate remote port GID rejected",
    RejReason.INVALID_ALT_LID: "alternate remote port LID rejected",
    RejReason.INVALID_ALT_SL: "alternate SL rejected",
    RejReason.INVALID_ALT_TRAFFIC_CLASS: "alternate traffic class rejected",
    RejReason.INVALID_ALT_HOP_LIMIT: "alternate hop limit rejected",
    RejReason.INVALID_ALT_PACKET_RATE: "alternate packet rate rejected",
    RejReason.PORT_CM_REDIRECT: "port and CM redirection",
    RejReason.PORT_REDIRECT: "port redirection",
    RejReason.INVALID_MTU: "invalid path MTU",
    RejReason.INSUFFICIENT_RESP_RESOURCES: "insufficient responder resources",
    RejReason.CONSUMER_DEFINED: "rejected by the remote consumer",
    RejReason.INVALID_RNR_RETRY: "invalid RNR retry count",
    RejReason.DUPLICATE_LOCAL_COMM_ID: "duplicate local communication ID",
    RejReason.INVALID_CLASS_VERSION: "invalid CM class version",
    RejReason.INVALID_FLOW_LABEL: "primary flow label rejected",
    RejReason.INVALID_ALT_FLOW_LABEL: "alternate flow label rejected",
    RejReason.VENDOR_OPTION_NOT_SUPPORTED: "vendor option not supported",
}

_ARI_TEXT: dict[int, str] = {
    IpCmAri.UNSPECIFIED: "unspecified reason",
    IpCmAri.MAJOR_VERSION: "IP CM major version not supported",
    IpCmAri.MINOR_VERSION: "IP CM minor version not supported",
    IpCmAri.IPV: "IP version not supported",
    IpCmAri.SOURCE_IP: "source IP address inconsistent with the IP version",
    IpCmAri.DESTINATION_IP: "destination IP address inconsistent with the IP version",
    IpCmAri.UNKNOWN_IP: "unknown IP address (the destination is not the server's)",
}


def reason_name(reason: int) -> str:
    """``RejReason`` name of a code, or ``reason <n>`` for an unassigned one."""
    try:
        return RejReason(reason).name
    except ValueError:
        return f"reason {reason}"


def _suggested_text(ari: IpCmReject) -> str:
    s = ari.suggested
    if not s:
        return ""
    if ari.code in (IpCmAri.MAJOR_VERSION, IpCmAri.MINOR_VERSION):
        return f"; server suggests version {s[0]}"
    if ari.code == IpCmAri.IPV:
        return "; server supports " + " and ".join(f"IPv{b}" for b in s)
    return f"; suggested value {s.hex()}"


def describe_rej(rej: Rej) -> RejectInfo:
    """The consumer's view of a REJ (distinct text per reason and per A11 ARI code)."""
    reason = rej.reason
    ari = rej.ari_data
    base = _REASON_TEXT.get(reason, f"unassigned reason {reason}")
    if reason != RejReason.CONSUMER_DEFINED or not ari:
        return RejectInfo(reason, f"{base} ({reason_name(reason)})", ari)
    try:
        layer = decode_consumer_ari(ari)
    except DecodeError as e:
        return RejectInfo(reason, f"{base} (malformed ARI: {e})", ari)
    if isinstance(layer, UlpReject):
        return RejectInfo(reason, f"{base}: ULP reject, ARI {layer.data.hex() or 'empty'}",
                          ari, ulp_ari=layer.data)
    what = _ARI_TEXT.get(layer.code, f"unknown IP CM ARI code {layer.code:#04x}")
    text = f"rejected by the RDMA IP CM Service: {what}{_suggested_text(layer)}"
    return RejectInfo(reason, text, ari, ip_cm=layer)


_SIDR_TEXT: dict[int, str] = {
    SidrStatus.UNSUPPORTED: "Service ID not supported (nobody listens on it)",
    SidrStatus.REJECT: "rejected by the service provider",
    SidrStatus.NO_QP: "no QP available",
    SidrStatus.REDIRECT: "redirected",
    SidrStatus.UNSUPPORTED_VERSION: "unsupported version",
}


def describe_sidr_status(status: int, info: bytes = b"") -> RejectInfo:
    """The consumer's view of a SIDR_REP with a non-zero status (IBA Table 121)."""
    text = _SIDR_TEXT.get(status, f"unknown SIDR status {status}")
    ip_cm = None
    if status == SidrStatus.REJECT and info[:1] == b"\x00" and len(info) >= 4:
        try:
            got = decode_consumer_ari(info)
        except DecodeError:
            got = None
        if isinstance(got, IpCmReject):
            ip_cm = got
            text = (f"rejected by the RDMA IP CM Service: "
                    f"{_ARI_TEXT.get(got.code, hex(got.code))}{_suggested_text(got)}")
    return RejectInfo(None, f"SIDR: {text}", info, ip_cm=ip_cm, sidr_status=status)
