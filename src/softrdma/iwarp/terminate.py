"""Errors a peer can cause, and the Terminate message that answers them.

RFC 5040 §7.1 / §4.8 (Figure 10) and siw ``siw_send_terminate``:

* every error detected on an incoming message is reported with a Terminate carrying
  the layer, error type and code (:class:`IwarpFault`), then the stream is torn down;
* Hdrct: DDP-layer errors and RDMAP Remote Operation errors carry the DDP Segment Length
  (M) and the terminated DDP header (D); RDMAP Remote Protection errors on an RDMA Read
  Request also carry the 28-byte Read Request header (R), on a Send with Invalidate only
  M and D ("The Terminated RDMA Header is only sent back if the terminate is associated
  with an RDMA Read Request Message"); LLP (MPA) errors, local catastrophic errors, and
  an invalid DDP version (whose header layout is unknown) carry no header;
* the DDP Segment Length is the payload length of the offending segment (its ULPDU
  length minus the DDP and RDMAP headers), as siw computes it;
* the Terminate itself is an untagged message on QN 2 with MSN 1, MO 0, L set
  (siw sends MSN 1: one Terminate per stream, RFC 5040 §5.4).

:func:`wc_status_for` maps a Terminate received from the peer to the libibverbs status
of the local work request it aborts.
"""

from __future__ import annotations

from ..enums import ibv_wc_status as WCS
from ..wire.ddp import (
    DDP_L,
    DDP_VERSION,
    QN_TERMINATE,
    RDMAP_VERSION,
    UNTAGGED,
    DdpEtype,
    DdpTaggedErrorCode,
    DdpUntaggedErrorCode,
    LlpEtype,
    MpaErrorCode,
    RdmapErrorCode,
    RdmapEtype,
    RdmapOpcode,
    Terminate,
    TerminateLayer,
    error_name,
)
from .stag import Access

__all__ = ["IwarpFault", "terminate_ulpdu", "wc_status_for", "TAGGED_CODE", "RDMAP_CODE"]

#: siw ``siw_tagged_error``: DDP has no access-rights code, so that is "Invalid STag".
TAGGED_CODE = {
    Access.INVALID: DdpTaggedErrorCode.INVALID_STAG,
    Access.BASE_BOUNDS: DdpTaggedErrorCode.BASE_OR_BOUNDS_VIOLATION,
    Access.PD_MISMATCH: DdpTaggedErrorCode.STAG_NOT_ASSOCIATED,
    Access.ACCESS_PERM: DdpTaggedErrorCode.INVALID_STAG,
    Access.TO_WRAP: DdpTaggedErrorCode.TO_WRAP,
}
#: siw ``siw_rdmap_error`` (RFC 5040 §4.8 Figure 9, Remote Protection Error codes).
RDMAP_CODE = {
    Access.INVALID: RdmapErrorCode.INVALID_STAG,
    Access.BASE_BOUNDS: RdmapErrorCode.BASE_OR_BOUNDS_VIOLATION,
    Access.PD_MISMATCH: RdmapErrorCode.STAG_NOT_ASSOCIATED,
    Access.ACCESS_PERM: RdmapErrorCode.ACCESS_RIGHTS_VIOLATION,
    Access.TO_WRAP: RdmapErrorCode.TO_WRAP,
}

_TERM_CTRL = (DDP_L | DDP_VERSION, (RDMAP_VERSION << 6) | RdmapOpcode.TERMINATE)


class IwarpFault(Exception):
    """An error that ends the RDMAP stream: what goes into the Terminate (RFC 5040 §4.8).

    ``ddp_hdr`` is the offending segment's DDP header (14 or 18 bytes), ``rdmap_hdr`` its
    28-byte Read Request header, ``seg_len`` its payload length; ``wc_status`` is the
    libibverbs status for the local work request the error hits (None: flushed).
    """

    def __init__(self, layer: int, etype: int, code: int, reason: str, *,
                 ddp_hdr: bytes | None = None, seg_len: int | None = None,
                 rdmap_hdr: bytes | None = None, wc_status: int | None = None) -> None:
        super().__init__(f"{error_name(layer, etype, code)}: {reason}")
        self.layer = layer
        self.etype = etype
        self.code = code
        self.reason = reason
        self.ddp_hdr = ddp_hdr
        self.seg_len = seg_len
        self.rdmap_hdr = rdmap_hdr
        self.wc_status = wc_status

    # ---- constructors, one per row of RFC 5040 Figure 10 -----------------------------------
    @classmethod
    def llp(cls, code: MpaErrorCode, reason: str) -> IwarpFault:
        """MPA error (RFC 5044 §8): no headers."""
        return cls(TerminateLayer.LLP, LlpEtype.MPA, code, reason)

    @classmethod
    def ddp_buffer(cls, code: DdpTaggedErrorCode | DdpUntaggedErrorCode, reason: str,
                   hdr: bytes | None, seg_len: int,
                   wc_status: int | None = None) -> IwarpFault:
        """DDP tagged or untagged buffer error (RFC 5041 §7.2), by the type of ``code``:
        M + D, unless the error is the DDP version."""
        tagged = isinstance(code, DdpTaggedErrorCode)
        etype = DdpEtype.TAGGED_BUFFER if tagged else DdpEtype.UNTAGGED_BUFFER
        if code == (DdpTaggedErrorCode.INVALID_DDP_VERSION if tagged
                    else DdpUntaggedErrorCode.INVALID_DDP_VERSION):
            hdr = None
        return cls(TerminateLayer.DDP, etype, code, reason, ddp_hdr=hdr,
                   seg_len=seg_len if hdr is not None else None, wc_status=wc_status)

    # the two rows of RFC 5040 Figure 10 by name
    ddp_tagged = ddp_buffer
    ddp_untagged = ddp_buffer

    @classmethod
    def ddp_catastrophic(cls, reason: str, wc_status: int | None = None) -> IwarpFault:
        """DDP local catastrophic error (siw: bad receive buffer, placement failure)."""
        return cls(TerminateLayer.DDP, DdpEtype.LOCAL_CATASTROPHIC, 0, reason,
                   wc_status=wc_status)

    @classmethod
    def remote_operation(cls, code: RdmapErrorCode, reason: str, hdr: bytes | None,
                         seg_len: int) -> IwarpFault:
        """RDMAP Remote Operation Error: M + D "if possible" (we always have the header)."""
        return cls(TerminateLayer.RDMAP, RdmapEtype.REMOTE_OPERATION, code, reason,
                   ddp_hdr=hdr, seg_len=seg_len if hdr is not None else None)

    @classmethod
    def remote_protection(cls, code: RdmapErrorCode, reason: str, hdr: bytes, seg_len: int,
                          rdmap_hdr: bytes | None = None,
                          wc_status: int | None = None) -> IwarpFault:
        """RDMAP Remote Protection Error: M + D, + R for an RDMA Read Request."""
        return cls(TerminateLayer.RDMAP, RdmapEtype.REMOTE_PROTECTION, code, reason,
                   ddp_hdr=hdr, seg_len=seg_len, rdmap_hdr=rdmap_hdr, wc_status=wc_status)

    @classmethod
    def local_catastrophic(cls, reason: str, wc_status: int | None = None) -> IwarpFault:
        """RDMAP local catastrophic error (siw: RDMAP_ETYPE_CATASTROPHIC, code 0xFF)."""
        return cls(TerminateLayer.RDMAP, RdmapEtype.LOCAL_CATASTROPHIC,
                   RdmapErrorCode.UNSPECIFIED, reason, wc_status=wc_status)

    def terminate(self) -> Terminate:
        """The Terminate header for this fault."""
        d = self.ddp_hdr is not None
        r = self.rdmap_hdr is not None and d
        return Terminate(self.layer, self.etype, self.code, m=d, d=d, r=r,
                         ddp_seg_len=(self.seg_len or 0) if d else None,
                         ddp_hdr=self.ddp_hdr if d else None,
                         rdmap_hdr=self.rdmap_hdr if r else None)


def terminate_ulpdu(term: Terminate) -> bytes:
    """The whole Terminate ULPDU: untagged DDP header (QN 2, MSN 1, MO 0, L) + header."""
    c, r = _TERM_CTRL
    return UNTAGGED.pack(c, r, 0, QN_TERMINATE, 1, 0) + term.encode()


def wc_status_for(term: Terminate | None) -> int:
    """The completion status of the local work request a received Terminate aborts."""
    if term is None:
        return int(WCS.IBV_WC_REM_OP_ERR)
    if term.layer == TerminateLayer.RDMAP and term.etype == RdmapEtype.REMOTE_PROTECTION:
        return int(WCS.IBV_WC_REM_ACCESS_ERR)
    if term.layer == TerminateLayer.DDP and term.etype == DdpEtype.TAGGED_BUFFER:
        return int(WCS.IBV_WC_REM_ACCESS_ERR)
    if term.layer == TerminateLayer.DDP and term.etype == DdpEtype.UNTAGGED_BUFFER:
        return int(WCS.IBV_WC_REM_INV_REQ_ERR)
    return int(WCS.IBV_WC_REM_OP_ERR)
