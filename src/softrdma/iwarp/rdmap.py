"""RDMAP receive side of one iWARP stream (RFC 5040): headers, opcodes, completions.

:class:`Rdmap` is the :class:`~.mpa_stream.FpduSink` above the framing, and the user of
the DDP placement (:class:`~.ddp_place.DdpRx`) and of the ORQ/IRQ
(:class:`~.orq_irq.ReadQueues`); siw does this work in ``siw_qp_rx.c`` (``siw_get_hdr``,
``siw_proc_rreq``, ``siw_proc_terminate``, ``siw_rdmap_complete``). The transmit side
is :mod:`.rdmap_tx`.

* Each segment's header is checked (DDP version, RDMAP version, which opcodes may use
  tagged/untagged buffers: RFC 5040 §4.3, §7.2) and its payload placed
  (:mod:`.ddp_place`).
* A Send completes its receive WQE when its last segment is delivered (§5.5 rule 16),
  invalidating the STag of a Send with Invalidate first (§6.9, §5.3); a Read Response
  completes the Read when its last segment is delivered (rule 19).
* An RDMA Read Request is checked against IRD and the source STag and queued on the IRQ
  as a Read Response (§4.4, §4.5); a Terminate is decoded and handed to the owner (§5.4).
* Before anything else, a responder that negotiated RFC 6581 RTR waits for the agreed
  zero-length RTR message (RFC 6581 §4) and only then opens the transmit gate.
* A peer-caused error raises :class:`~.terminate.IwarpFault`: the framing holds it until
  the FPDU's CRC is checked; the connection sends the Terminate (RFC 5040 §7).
"""

from __future__ import annotations

from ..enums import ibv_access_flags as ACC
from ..enums import ibv_wc_status as WCS
from ..errors import SoftRdmaError
from ..wire.ddp import (
    DDP_DV_MASK,
    DDP_VERSION,
    QN_READ_REQUEST,
    QN_SEND,
    QN_TERMINATE,
    RDMAP_OPCODE_MASK,
    RDMAP_RV_SHIFT,
    RDMAP_VERSION,
    READ_REQ,
    READ_REQ_LEN,
    TAGGED,
    UNTAGGED,
    DdpTaggedErrorCode,
    DdpUntaggedErrorCode,
    MpaErrorCode,
    RdmapErrorCode,
    RdmapOpcode,
    Terminate,
)
from .ddp_place import (
    DDP_L,
    DDP_T,
    TAGGED_HDR_LEN,
    UNTAGGED_HDR_LEN,
    DdpRx,
    PlacementDevice,
    TxMsg,
    access_error,
)
from .fast_path import write_run
from .mpa_setup import RTR_READ, RTR_SEND, RTR_WRITE
from .mpa_stream import FIRST_HDR, FpduRx
from .orq_irq import ReadQueues
from .rdmap_tx import W_DONE, RdmapOwner, RdmapQP, RdmapTx
from .stag import Access, check_access
from .terminate import RDMAP_CODE, IwarpFault

__all__ = ["Rdmap"]

_OP_WRITE = int(RdmapOpcode.RDMA_WRITE)
_OP_RREQ = int(RdmapOpcode.RDMA_READ_REQUEST)
_OP_RRESP = int(RdmapOpcode.RDMA_READ_RESPONSE)
_OP_SEND = int(RdmapOpcode.SEND)
_OP_SEND_INV = int(RdmapOpcode.SEND_INVALIDATE)
_OP_SEND_SE = int(RdmapOpcode.SEND_SE)
_OP_SEND_SE_INV = int(RdmapOpcode.SEND_SE_INVALIDATE)
_OP_TERM = int(RdmapOpcode.TERMINATE)
_SEND_OPS = frozenset((_OP_SEND, _OP_SEND_INV, _OP_SEND_SE, _OP_SEND_SE_INV))
_INV_OPS = frozenset((_OP_SEND_INV, _OP_SEND_SE_INV))
_SE_OPS = frozenset((_OP_SEND_SE, _OP_SEND_SE_INV))
_RR_ULPDU = UNTAGGED_HDR_LEN + READ_REQ_LEN  # a whole Read Request ULPDU: 46 octets
_RR_OFF = 2 + UNTAGGED_HDR_LEN               # its Read Request header in the FPDU
_RR_SIZE = 12                                # RDMARDSZ within that header
_U32_BE = 4

_REMOTE_READ = int(ACC.IBV_ACCESS_REMOTE_READ)
_SUCCESS = int(WCS.IBV_WC_SUCCESS)

# what the FPDU being received is
_K_NONE, _K_WRITE, _K_RRESP, _K_SEND, _K_CTRL, _K_RTR_SEND = 0, 1, 2, 3, 4, 5


class Rdmap:
    """RDMAP of one stream in full operation (see the module docstring).

    ``rx`` is its framing, ``ddp`` its placement, ``rq`` its ORQ/IRQ, ``tx`` the transmit
    side (whose gate the RTR opens); ``qp`` is bound by the connection; ``await_rtr`` is
    the RTR type a responder waits for; ``kind``/``last``/``seg_hdr`` describe the
    segment being received.
    """

    __slots__ = ("owner", "dev", "qp", "rx", "ddp", "rq", "tx", "await_rtr", "kind", "last",
                 "seg_hdr")

    def __init__(self, owner: RdmapOwner, dev: PlacementDevice, rq: ReadQueues, tx: RdmapTx,
                 qp: RdmapQP | None = None) -> None:
        self.owner = owner
        self.dev = dev
        self.qp = qp
        self.rx = FpduRx(self)
        self.ddp = DdpRx(dev)
        self.rq = rq
        self.tx = tx
        self.await_rtr: str | None = None
        self.kind = _K_NONE
        self.last = False
        self.seg_hdr = b""

    # ---- receive: headers ---------------------------------------------------------------------
    def on_header(self) -> None:
        rx = self.rx
        h = rx.hbuf
        ulen = rx.ulen
        c = h[2]
        r = h[3]
        tagged = bool(c & DDP_T)
        if rx.hneed == FIRST_HDR and not tagged:
            if ulen < UNTAGGED_HDR_LEN:
                raise IwarpFault.ddp_catastrophic(f"untagged DDP segment of {ulen} bytes")
            if r & RDMAP_OPCODE_MASK in _SEND_OPS and r >> RDMAP_RV_SHIFT == RDMAP_VERSION \
                    and c & DDP_DV_MASK == DDP_VERSION:
                rx.need_header(2 + UNTAGGED_HDR_LEN)
            else:  # a Read Request or Terminate is read whole, then acted on after the CRC
                rx.need_header(2 + ulen)
            return
        self.kind = _K_NONE
        last = bool(c & DDP_L)
        op = r & RDMAP_OPCODE_MASK
        hl = TAGGED_HDR_LEN if tagged else UNTAGGED_HDR_LEN
        hdr = bytes(h[2:2 + hl])
        paylen = ulen - hl
        self.seg_hdr = hdr
        self.last = last
        if c & DDP_DV_MASK != DDP_VERSION:
            if tagged:
                raise IwarpFault.ddp_tagged(DdpTaggedErrorCode.INVALID_DDP_VERSION,
                                            f"DDP version {c & DDP_DV_MASK}", None, 0)
            raise IwarpFault.ddp_untagged(DdpUntaggedErrorCode.INVALID_DDP_VERSION,
                                          f"DDP version {c & DDP_DV_MASK}", None, 0)
        if r >> RDMAP_RV_SHIFT != RDMAP_VERSION:
            raise IwarpFault.remote_operation(RdmapErrorCode.INVALID_RDMAP_VERSION,
                                              f"RDMAP version {r >> RDMAP_RV_SHIFT}", hdr,
                                              paylen)
        qp = self.qp
        if tagged:
            assert qp is not None
            if op != _OP_WRITE and op != _OP_RRESP:
                raise IwarpFault.remote_operation(RdmapErrorCode.UNEXPECTED_OPCODE,
                                                  f"opcode {op:#x} on a tagged buffer",
                                                  hdr, paylen)
            _c, _r, stag, to = TAGGED.unpack_from(h, 2)
            if op == _OP_WRITE:
                self.kind = _K_WRITE
                rx.start_body(self.ddp.write(qp, op, stag, to, paylen, last, hdr), paylen)
            else:
                targets = self.ddp.read_response(self.rq.oldest(), op, stag, to, paylen,
                                                 last, hdr)
                self.kind = _K_RRESP
                rx.start_body(targets, paylen)
            return
        if op == _OP_WRITE or op == _OP_RRESP or op > _OP_TERM:
            raise IwarpFault.remote_operation(RdmapErrorCode.UNEXPECTED_OPCODE,
                                              f"opcode {op:#x} on an untagged buffer",
                                              hdr, paylen)
        if op not in _SEND_OPS:
            self.kind = _K_CTRL
            rx.to_trailer()
            return
        assert qp is not None
        _c, _r, inv, qn, msn, mo = UNTAGGED.unpack_from(h, 2)
        new = self.ddp.send_check(op, qn, msn, mo, paylen, hdr)
        if new and self.await_rtr == RTR_SEND and paylen == 0 and last:
            self.kind = _K_RTR_SEND
            rx.to_trailer()
            return
        targets = self.ddp.send(qp, new, op, inv, msn, paylen, hdr)
        self.kind = _K_SEND
        rx.start_body(targets, paylen)

    def fast_run(self, mv: memoryview, i: int, n: int) -> int:
        """Whole RDMA Write FPDUs in one go (:func:`~.fast_path.write_run`); not while a
        responder awaits the RTR (RFC 6581 §4: that FPDU goes through the checks)."""
        qp = self.qp
        if self.await_rtr is not None or qp is None:
            return 0
        rx = self.rx
        k, ulen, placed = write_run(self.ddp, qp.pd, mv, i, n, rx.crc_on)
        if k:
            rx.fpdus += placed
            rx.ulen = ulen
            rx.paylen = ulen - TAGGED_HDR_LEN
        return k

    # ---- receive: whole FPDUs -----------------------------------------------------------------
    def on_fpdu(self) -> None:
        kind = self.kind
        self.kind = _K_NONE
        if self.await_rtr is not None:
            self._check_rtr(kind)
        if kind == _K_SEND:
            if self.last:
                self._send_delivered()
        elif kind == _K_RRESP:
            rd = self.rq.oldest()
            assert rd is not None  # checked when the header came in
            rd.received += self.rx.paylen
            if self.last:
                self.rq.retire()
                w = rd.wqe
                if w is not None:
                    w.state = W_DONE
                    assert self.qp is not None
                    self.qp.complete_ready()
        elif kind == _K_CTRL:
            self._control()
        elif kind == _K_RTR_SEND:
            self.ddp.advance_msn(QN_SEND)

    def _check_rtr(self, kind: int) -> None:
        """The responder's first FPDU must be the agreed zero-length RTR (RFC 6581 §4)."""
        want = self.await_rtr
        rx = self.rx
        h = rx.hbuf
        ok = False
        if want == RTR_WRITE:
            ok = kind == _K_WRITE and rx.paylen == 0 and self.last
        elif want == RTR_SEND:
            ok = kind == _K_RTR_SEND
        elif want == RTR_READ and kind == _K_CTRL and h[3] & RDMAP_OPCODE_MASK == _OP_RREQ \
                and rx.ulen == _RR_ULPDU:
            ok = int.from_bytes(h[_RR_OFF + _RR_SIZE:_RR_OFF + _RR_SIZE + _U32_BE]) == 0
        if not ok:
            raise IwarpFault.llp(MpaErrorCode.NO_MATCHING_RTR,
                                 f"the first FPDU is not the agreed zero-length {want} RTR")
        self.await_rtr = None
        self.tx.gate = False

    def _send_delivered(self) -> None:
        """Last segment of a Send: invalidate, complete the receive (RFC 5040 §5.3, §5.5)."""
        qp = self.qp
        assert qp is not None
        rwqe, op, inv, byte_len = self.ddp.send_done()
        invalidated = 0
        if op in _INV_OPS:
            # siw's rule, not rxe's: any valid STag of the QP's PD the peer was given may be
            # invalidated remotely (RFC 5040 §6.9; siw_invalidate_stag). RoCE allows only
            # type-2 windows (softrdma.ib.mw.remotely_invalidatable).
            mr = self.dev.mrs.get(inv)
            if mr is None or not mr.valid or mr.pd is not qp.pd:
                qp.complete_recv(rwqe, int(WCS.IBV_WC_REM_INV_REQ_ERR), 0, 0, False)
                raise IwarpFault.remote_protection(
                    RdmapErrorCode.STAG_CANNOT_BE_INVALIDATED,
                    f"Send with Invalidate of STag {inv:#010x}: not a valid STag of this "
                    "QP's protection domain", self.seg_hdr, self.rx.paylen)
            mr.valid = False
            invalidated = inv
        qp.complete_recv(rwqe, _SUCCESS, byte_len, invalidated, op in _SE_OPS)

    def _control(self) -> None:
        """A whole RDMA Read Request or Terminate ULPDU (RFC 5040 §4.4, §4.8)."""
        rx = self.rx
        h = rx.hbuf
        ulen = rx.ulen
        hdr = self.seg_hdr
        _c, r, _ulp, qn, msn, mo = UNTAGGED.unpack_from(h, 2)
        if r & RDMAP_OPCODE_MASK == _OP_TERM:
            if qn != QN_TERMINATE:
                raise IwarpFault.ddp_untagged(DdpUntaggedErrorCode.INVALID_QN,
                                              f"Terminate on QN {qn}", hdr,
                                              ulen - UNTAGGED_HDR_LEN)
            try:
                term: Terminate | None = Terminate.decode(h[:2 + ulen], 2 + UNTAGGED_HDR_LEN)
            except SoftRdmaError:
                term = None
            self.owner.peer_terminated(term)
            return
        # the Terminate's DDP Segment Length: the bytes past the Read Request's headers
        # (siw_send_terminate); none for a ULPDU too short to hold them
        plen = max(ulen - _RR_ULPDU, 0)
        self.ddp.read_request_check(qn, msn, mo, self.last, hdr, plen)
        if ulen != _RR_ULPDU:
            raise IwarpFault.remote_operation(RdmapErrorCode.UNSPECIFIED,
                                              f"RDMA Read Request ULPDU of {ulen} bytes", hdr,
                                              plen)
        rrhdr = bytes(h[_RR_OFF:2 + _RR_ULPDU])
        sink_stag, sink_to, size, src_stag, src_to = READ_REQ.unpack_from(h, _RR_OFF)
        self.rq.check_room(hdr)
        qp = self.qp
        assert qp is not None
        segs: list[memoryview] = []
        if size:
            mr = self.dev.mrs.get(src_stag)
            acc, off = check_access(mr, src_stag, qp.pd, src_to, size, _REMOTE_READ)
            if acc != Access.OK:
                access_error(self.dev, qp)
                raise IwarpFault.remote_protection(
                    RDMAP_CODE[acc], f"RDMA Read of STag {src_stag:#010x} TO {src_to:#x} "
                    f"len {size}: {acc.name}", hdr, 0, rrhdr)
            assert mr is not None
            segs = [mr.buf[off:off + size]]
        self.ddp.advance_msn(QN_READ_REQUEST)
        self.rq.owe(TxMsg(_OP_RRESP, segs, size, tagged=True, stag=sink_stag, to=sink_to,
                          read_resp=True))
