"""The sans-I/O iWARP connection engine: MPA, DDP and RDMAP over one TCP byte stream.

An :class:`IwarpConn` is one LLP stream. It never touches a socket or a clock; its driver

* feeds received TCP bytes with :meth:`IwarpConn.receive` (or, for zero-copy placement,
  asks :meth:`IwarpConn.rx_target` for the buffer the next payload bytes belong in,
  ``recv_into``-s it and reports :meth:`IwarpConn.rx_placed`);
* takes bytes to send with :meth:`IwarpConn.pull_tx` (a list of buffers: headers, slices
  of the registered memory, pad + CRC; nothing copied) and reports how many the socket
  accepted with :meth:`IwarpConn.tx_sent` (a Send or RDMA Write completes only then,
  RFC 5040 §5.5 rule 14);
* reports the peer's FIN with :meth:`IwarpConn.on_eof`, and closes the socket once
  :attr:`IwarpConn.want_close` is set and everything pulled has been sent.

Protocol (iwarp.md; RFC 5044, RFC 6581, RFC 5041, RFC 5040):

* Setup: the initiator sends the MPA Request and waits for the Reply; the responder
  parses the Request and waits for :meth:`accept` / :meth:`reject` (:mod:`.mpa_setup`).
  With RFC 6581 peer-to-peer the initiator sends the agreed zero-length RTR message
  first and the responder sends nothing before it has received it.
* FPDUs: CRC32c both ways when negotiated, markers in each direction that asked for
  them (:class:`~softrdma.wire.mpa.FpduEncoder` on transmit; on receive the marker
  FPDUPTRs are checked and the markers folded into the CRC), one DDP segment per FPDU,
  segments no longer than the MULPDU derived from the TCP MSS (RFC 5044 §4.2).
* Receive: a streaming state machine; each DDP segment's header is validated as soon as
  it is complete (RFC 5041 §5, RFC 5040 §7.2) and its payload is placed into the target
  buffer as it arrives (tagged: the STag's region; untagged: the receive WQE at
  MSN/MO). An error found in a header is reported only after the FPDU's CRC checked
  out (a bad CRC is the MPA error, RFC 5044 §8). Tagged and untagged messages may
  interleave at segment boundaries (as siw accepts).
* Ordering (RFC 5040 §5.5): RDMAP messages go out in posting order (rule 13), Read
  Responses in Read Request order at message boundaries (rule 20), at most ORD
  outstanding Read Requests and IRD inbound ones (§6.1), IBV_SEND_FENCE waits for the
  outstanding Reads; completions are reported in posting order (rule 15), a Read only
  when its last Read Response segment is delivered (rule 19), a Send at the data sink
  only when its last segment is delivered (rule 16).
* Errors: every peer-caused error is an :class:`~.terminate.IwarpFault`; the engine
  sends the Terminate at the next FPDU boundary, moves the QP to the error state
  (error completion for the work request hit, flush for the rest) and asks to close.
  A received Terminate, an EOF or garbage end the stream the same way; no exception
  leaves :meth:`receive`.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..enums import ibv_access_flags as ACC
from ..enums import ibv_send_flags as SF
from ..enums import ibv_wc_status as WCS
from ..enums import ibv_wr_opcode as WR
from ..errors import SoftRdmaError
from ..ib.memory import gather, resolve_sges, total_len
from ..ib.types import SendWQE
from ..wire.crc import crc32c
from ..wire.ddp import (
    QN_READ_REQUEST,
    QN_SEND,
    QN_TERMINATE,
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
from ..wire.mpa import (
    MARKER_INTERVAL,
    FpduEncoder,
    MpaError,
    MpaFrameParser,
    MpaReply,
    MpaRequest,
    mulpdu,
)
from .mpa_setup import (
    RTR_READ,
    RTR_SEND,
    RTR_WRITE,
    ConnectionRejected,
    MpaConfig,
    Negotiated,
    build_request,
    check_reply,
    respond,
)
from .stag import Access, check_access
from .terminate import RDMAP_CODE, TAGGED_CODE, IwarpFault, terminate_ulpdu

if TYPE_CHECKING:
    from .qp import IwarpDevice, IwarpQP

__all__ = ["IwarpConn", "ConnState", "DEFAULT_MSS", "DIRECT_MIN"]

DEFAULT_MSS = 1460
DIRECT_MIN = 4096  # payload left in a segment worth a zero-copy recv_into of its own
_U16 = struct.Struct("!H")
_U32 = struct.Struct("!I")
_MARKER = struct.Struct("!HH")
_CRC_LE = struct.Struct("<I")
_FAST_TAGGED = struct.Struct("!HBBIQ")
_PADS = (b"", b"\0", b"\0\0", b"\0\0\0")
_MASK64 = (1 << 64) - 1
_TAGGED_LEN = 14
_UNTAGGED_LEN = 18
_RR_ULPDU = _UNTAGGED_LEN + READ_REQ_LEN  # 46

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

_RDMAP_CTRL = 0x40  # RV = 1
_DDP_T, _DDP_L, _DDP_DV = 0x80, 0x40, 0x01

_REMOTE_WRITE = int(ACC.IBV_ACCESS_REMOTE_WRITE)
_REMOTE_READ = int(ACC.IBV_ACCESS_REMOTE_READ)
_LOCAL_WRITE = int(ACC.IBV_ACCESS_LOCAL_WRITE)
_SOLICITED = int(SF.IBV_SEND_SOLICITED)
_FENCE = int(SF.IBV_SEND_FENCE)

# rx phases
_P_HDR, _P_BODY, _P_SKIP, _P_TRAIL = 0, 1, 2, 3
# what the FPDU being received is
_K_NONE, _K_WRITE, _K_RRESP, _K_SEND, _K_CTRL, _K_RTR_SEND = 0, 1, 2, 3, 4, 5

# SendWQE.state values used here
W_STARTED, W_DONE = 1, 2


class ConnState:
    """Connection states (strings, for readable diagnostics)."""

    AWAIT_REQUEST = "await-request"  # responder: reading the MPA Request
    ACCEPT_WAIT = "accept-wait"      # responder: Request parsed, waiting for accept/reject
    AWAIT_REPLY = "await-reply"      # initiator: Request sent, waiting for the Reply
    RTS = "rts"                      # full operation (FPDUs)
    FAILED = "failed"                # a fault, a Terminate, a reject, or EOF ended it
    CLOSED = "closed"                # closed locally or by the peer


class _TxMsg:
    """One outbound RDMAP message, cut into FPDUs on demand (RFC 5041 §5.1)."""

    __slots__ = ("tagged", "rdmap", "stag", "to", "rsvdulp", "qn", "msn", "extra", "segs",
                 "length", "off", "wqe", "read_resp", "rtr")

    def __init__(self, opcode: int, segs: list[memoryview], length: int, *, tagged: bool,
                 stag: int = 0, to: int = 0, rsvdulp: int = 0, qn: int = 0, msn: int = 0,
                 extra: bytes = b"", wqe: SendWQE | None = None, read_resp: bool = False,
                 rtr: bool = False) -> None:
        self.tagged = tagged
        self.rdmap = _RDMAP_CTRL | opcode
        self.stag = stag
        self.to = to
        self.rsvdulp = rsvdulp
        self.qn = qn
        self.msn = msn
        self.extra = extra
        self.segs = segs
        self.length = length
        self.off = 0
        self.wqe = wqe
        self.read_resp = read_resp
        self.rtr = rtr


class _ReadCtx:
    """An outstanding outbound RDMA Read (an ORQ entry): where its response goes."""

    __slots__ = ("wqe", "sink_stag", "sink_to", "size", "segs", "received")

    def __init__(self, wqe: SendWQE | None, sink_stag: int, sink_to: int, size: int,
                 segs: list[memoryview]) -> None:
        self.wqe = wqe
        self.sink_stag = sink_stag
        self.sink_to = sink_to
        self.size = size
        self.segs = segs
        self.received = 0


class IwarpConn:
    """One iWARP stream (see the module docstring).

    ``initiator`` selects the MPA role; ``cfg`` the MPA wishes; ``mss`` the TCP MSS the
    MULPDU is derived from. ``on_event(kind)`` is called with ``"request"``,
    ``"established"``, ``"rejected"``, ``"failed"``, ``"terminated"`` and ``"closed"``.
    """

    def __init__(self, dev: IwarpDevice, *, initiator: bool, cfg: MpaConfig | None = None,
                 mss: int = DEFAULT_MSS, qp: IwarpQP | None = None,
                 private_data: bytes = b"") -> None:
        self.dev = dev
        self.initiator = initiator
        self.cfg = cfg if cfg is not None else MpaConfig()
        self.mss = mss
        self.qp: IwarpQP | None = None
        self.on_event: Callable[[str], None] = lambda kind: None
        self.request: MpaRequest | None = None
        self.reply: MpaReply | None = None
        self.negotiated: Negotiated | None = None
        self.rejected: ConnectionRejected | None = None
        self.fault: IwarpFault | None = None  # the fault this side terminated with
        self.term_received: Terminate | None = None
        self.reason = ""
        self.want_close = False
        self.eof = False
        self.internal_errors = 0
        self.ird = self.cfg.ird
        self.ord = self.cfg.ord
        # transmit
        self._pre: deque[bytes] = deque()
        self._enc: FpduEncoder | None = None
        self._maxpay_t = self._maxpay_u = 1
        self._cur: _TxMsg | None = None
        self._term: bytes | None = None
        self._tx_stop = False
        self._tx_gate = False
        self._rtr_msg: _TxMsg | None = None
        self._irq: deque[_TxMsg] = deque()
        self._irq_count = 0
        self.orq: deque[_ReadCtx] = deque()
        self._pulled = 0
        self._sent = 0
        self._done: deque[tuple[int, _TxMsg]] = deque()
        self.tx_msn = [0, 0, 0]
        # receive
        self._parser: MpaFrameParser | None = None
        self._early = bytearray()
        # the initiator's first FPDU waits until this time (0: no hold), see FIRST_FPDU_HOLD_S
        self.tx_hold_until = 0.0
        self._dead = False
        self.rx_msn = [1, 1, 1]
        self._crc_on = False
        self._mk_rx = False
        self._pos = 0
        self._fpdu_start = 0
        self._mk_buf = bytearray(4)
        self._mk_have = 0
        self._phase = _P_HDR
        self._hbuf = bytearray(2 + 0xFFFF + 8)
        self._hmv = memoryview(self._hbuf)
        self._hhave = 0
        self._hneed = 16
        self._ulen = 0
        self._crc = 0
        self._rem = 0
        self._kind = _K_NONE
        self._last = False
        self._pending: IwarpFault | None = None
        self._tg: list[memoryview] = []
        self._tgi = 0
        self._tgo = 0
        self._tbuf = bytearray(8)
        self._tneed = 0
        self._thave = 0
        self._seg_hdr = b""
        self._paylen = 0
        # untagged (Send) message in progress
        self._ru_wqe: Any = None
        self._ru_segs: list[memoryview] = []
        self._ru_cap = 0
        self._ru_mo = 0
        self._ru_op = -1
        self._ru_inv = 0
        # tagged message in progress (siw: a Write or Read Response continues)
        self._rt_op = -1
        self._rt_stag = 0
        self._rt_to = 0
        self._await_rtr: str | None = None
        if initiator:
            self.state = ConnState.AWAIT_REPLY
            self.qp = qp
            self.request = build_request(self.cfg, private_data)
            self._pre.append(self.request.encode())
            self._parser = MpaFrameParser(MpaReply)
        else:
            self.state = ConnState.AWAIT_REQUEST
            self._parser = MpaFrameParser(MpaRequest)

    # ---- status -------------------------------------------------------------------------
    @property
    def established(self) -> bool:
        return self.state == ConnState.RTS

    @property
    def peer_private_data(self) -> bytes:
        """The peer's user private data (RFC 6581 block removed)."""
        if self.negotiated is not None:
            return self.negotiated.peer_private_data
        if self.request is not None and not self.initiator:
            return self.request.user_data
        if self.rejected is not None:
            return self.rejected.private_data
        return b""

    def tx_pending(self) -> bool:
        """True when :meth:`pull_tx` would return bytes."""
        if self._pre or self._term is not None:
            return True
        if self.state != ConnState.RTS or self._tx_stop:
            return False
        if self._cur is not None or self._rtr_msg is not None:
            return True
        if self._tx_gate:
            return False
        if self._irq:
            return True
        qp = self.qp
        return qp is not None and bool(qp.sq) and self._sq_ready(qp.sq[0])

    # ---- MPA setup: responder side ----------------------------------------------------------
    def accept(self, qp: IwarpQP, private_data: bytes = b"", cfg: MpaConfig | None = None) -> None:
        """Accept the parsed Request: bind ``qp``, send the Reply, enter full operation."""
        if self.state != ConnState.ACCEPT_WAIT or self.request is None:
            raise SoftRdmaError(f"accept in connection state {self.state}")
        if cfg is not None:
            self.cfg = cfg
        try:
            reply, neg = respond(self.request, self.cfg, private_data)
        except IwarpFault as f:
            self._fail(f)
            return
        self.reply = reply
        self.qp = qp
        self._pre.append(reply.encode())
        self._enter_rts(neg)
        early = bytes(self._early)
        self._early = bytearray()
        if early:
            self.receive(early)

    def reject(self, private_data: bytes = b"") -> None:
        """Refuse the parsed Request: Reply with R set, then close (RFC 5044 §7.1.1)."""
        if self.state != ConnState.ACCEPT_WAIT or self.request is None:
            raise SoftRdmaError(f"reject in connection state {self.state}")
        reply, _neg = respond(self.request, self.cfg, private_data, reject=True)
        self.reply = reply
        self._pre.append(reply.encode())
        self.state = ConnState.CLOSED
        self.reason = "rejected locally"
        self.want_close = True

    def _enter_rts(self, neg: Negotiated) -> None:
        self.negotiated = neg
        self.ird, self.ord = neg.ird, neg.ord
        self._crc_on = neg.crc
        self._mk_rx = neg.markers_rx
        self._enc = FpduEncoder(crc=neg.crc, markers=neg.markers_tx)
        self.update_mss(self.mss)
        self.state = ConnState.RTS
        if neg.rtr is not None:
            if self.initiator:
                self._rtr_msg = self._build_rtr(neg.rtr)
            else:
                self._await_rtr = neg.rtr
                self._tx_gate = True
        qp = self.qp
        if qp is not None:
            qp.on_established(self)
        self.on_event("established")

    def update_mss(self, mss: int) -> None:
        """The LLP's current effective MSS (RFC 5044 §4.2: the MULPDU follows the EMSS;
        siw re-reads ``mss_cache`` per work request): segments cut from now on fit it."""
        self.mss = mss
        markers = self._enc.markers if self._enc is not None else False
        mul = mulpdu(max(mss, 64), markers)
        self._maxpay_t = max(mul - _TAGGED_LEN, 1)
        self._maxpay_u = max(mul - _UNTAGGED_LEN, 1)

    def _build_rtr(self, kind: str) -> _TxMsg:
        """The initiator's zero-length RTR message (RFC 6581 §4; siw ``siw_qp_mpa_rts``)."""
        if kind == RTR_WRITE:
            return _TxMsg(_OP_WRITE, [], 0, tagged=True, stag=1, to=0, rtr=True)
        if kind == RTR_READ:
            self.tx_msn[QN_READ_REQUEST] += 1
            self.orq.append(_ReadCtx(None, 1, 0, 0, []))
            rr = READ_REQ.pack(1, 0, 0, 1, 0)
            return _TxMsg(_OP_RREQ, [], 0, tagged=False, qn=QN_READ_REQUEST,
                          msn=self.tx_msn[QN_READ_REQUEST], extra=rr, rtr=True)
        self.tx_msn[QN_SEND] += 1
        return _TxMsg(_OP_SEND, [], 0, tagged=False, qn=QN_SEND, msn=self.tx_msn[QN_SEND],
                      rtr=True)

    # ---- transmit ------------------------------------------------------------------------
    def pull_tx(self, max_bytes: int = 1 << 20, max_bufs: int = 512) -> list[Any]:
        """The next bytes to send (whole FPDUs), at least one FPDU if any is ready."""
        out: list[Any] = []
        total = 0
        while self._pre:
            b = self._pre.popleft()
            out.append(b)
            total += len(b)
            self._pulled += len(b)
        enc = self._enc
        if enc is None:
            return out
        while total < max_bytes and len(out) < max_bufs:
            if self._term is not None:
                bufs = enc.encode([self._term])
                self._term = None
                self._tx_stop = True
                self.want_close = True
                n = _nbytes(bufs)
                out.extend(bufs)
                self._pulled += n
                break
            if self._tx_stop or self.state != ConnState.RTS:
                break
            msg = self._cur
            if msg is None:
                msg = self._next_msg()
                if msg is None:
                    break
            bufs, n, last = self._fpdu(msg, enc)
            out.extend(bufs)
            total += n
            self._pulled += n
            if last:
                self._cur = None
                self._msg_pulled(msg)
            else:
                self._cur = msg
        return out

    def tx_sent(self, n: int) -> None:
        """``n`` more bytes of what :meth:`pull_tx` returned were accepted by the LLP."""
        self._sent += n
        done = self._done
        completed = False
        while done and done[0][0] <= self._sent:
            _end, msg = done.popleft()
            w = msg.wqe
            if w is not None and not msg.read_resp and w.opcode != WR.IBV_WR_RDMA_READ:
                w.state = W_DONE
                completed = True
        if completed and self.qp is not None:
            self.qp.complete_ready()

    def _fpdu(self, msg: _TxMsg, enc: FpduEncoder) -> tuple[list[Any], int, bool]:
        off = msg.off
        left = msg.length - off
        if msg.tagged:
            n = left if left < self._maxpay_t else self._maxpay_t
            last = n == left
            hdr = TAGGED.pack(_DDP_T | (_DDP_L if last else 0) | _DDP_DV, msg.rdmap, msg.stag,
                              (msg.to + off) & _MASK64)
        else:
            n = left if left < self._maxpay_u else self._maxpay_u
            last = n == left
            hdr = UNTAGGED.pack((_DDP_L if last else 0) | _DDP_DV, msg.rdmap, msg.rsvdulp,
                                msg.qn, msg.msn, off & 0xFFFFFFFF)
            if msg.extra:
                hdr += msg.extra
        if n:
            segs = msg.segs
            if len(segs) == 1:
                parts: list[Any] = [hdr, segs[0][off:off + n]]
            else:
                parts = [hdr, *gather(segs, off, n)]
        else:
            parts = [hdr]
        msg.off = off + n
        if enc.markers:
            bufs = enc.encode(parts)
            return bufs, _nbytes(bufs), last
        # RFC 5044 §4.1 without markers, as wire.mpa.fpdu_encode: one header buffer
        # (ULPDU_Length + DDP/RDMAP headers), the payload views, PAD + CRC
        ulen = len(hdr) + n
        head = _U16.pack(ulen) + hdr
        trail = _PADS[(-(ulen + 2)) & 3]
        if enc.crc:
            crc = crc32c(head)
            for p in parts[1:]:
                crc = crc32c(p, crc)
            if trail:
                crc = crc32c(trail, crc)
            trail += _CRC_LE.pack(crc)
        else:
            trail += b"\0\0\0\0"
        parts[0] = head
        parts.append(trail)
        enc.offset += ulen + 2 + len(trail)
        return parts, ulen + 2 + len(trail), last

    def _msg_pulled(self, msg: _TxMsg) -> None:
        if msg.read_resp:
            self._irq_count -= 1
        if msg.wqe is not None:
            self._done.append((self._pulled, msg))

    def _next_msg(self) -> _TxMsg | None:
        """Next message: the RTR, then Read Responses, then the send queue (RFC 5040 §5.5)."""
        rtr = self._rtr_msg
        if rtr is not None:
            self._rtr_msg = None
            return rtr
        if self._tx_gate:
            return None
        if self._irq:
            return self._irq.popleft()
        qp = self.qp
        if qp is None:
            return None
        sq = qp.sq
        while sq:
            w = sq[0]
            if not self._sq_ready(w):
                return None
            sq.popleft()
            w.state = W_STARTED
            qp.inflight.append(w)
            msg = self._start_wqe(qp, w)
            if msg is not None:
                return msg
            if self.state != ConnState.RTS:
                return None
        return None

    def _sq_ready(self, w: SendWQE) -> bool:
        """IBV_SEND_FENCE waits for the outstanding Reads; a Read waits for an ORD slot."""
        if w.send_flags & _FENCE and self.orq:
            return False
        return not (w.opcode == WR.IBV_WR_RDMA_READ and len(self.orq) >= self.ord > 0)

    def _start_wqe(self, qp: IwarpQP, w: SendWQE) -> _TxMsg | None:
        """Turn a send WQE into its RDMAP message (or execute a local operation)."""
        op = w.opcode
        if op == WR.IBV_WR_LOCAL_INV:
            mr = self.dev.mrs.get(w.invalidate_rkey)
            if mr is None or mr.pd is not qp.pd:
                self._local_error(w, int(WCS.IBV_WC_LOC_PROT_ERR), "LOCAL_INV of an unknown STag")
                return None
            mr.valid = False
            w.state = W_DONE
            qp.complete_ready()
            return None
        if w.inline_data is not None:
            segs: list[memoryview] | None = [memoryview(w.inline_data)] if w.inline_data else []
        else:
            need = _LOCAL_WRITE if op == WR.IBV_WR_RDMA_READ else 0
            segs = resolve_sges(self.dev.mrs, qp.pd, w.sg_list, need)
        if segs is None:
            self._local_error(w, int(WCS.IBV_WC_LOC_PROT_ERR), "local protection error")
            return None
        n = w.length
        if op == WR.IBV_WR_RDMA_WRITE:
            return _TxMsg(_OP_WRITE, segs, n, tagged=True, stag=w.rkey, to=w.remote_addr, wqe=w)
        if op == WR.IBV_WR_RDMA_READ:
            if self.ord == 0:
                self._local_error(w, int(WCS.IBV_WC_LOC_QP_OP_ERR), "RDMA Read with ORD 0")
                return None
            sge = w.sg_list[0] if w.sg_list else None
            sink_stag = sge.lkey if sge is not None else 0
            sink_to = sge.addr if sge is not None else 0
            self.tx_msn[QN_READ_REQUEST] = (self.tx_msn[QN_READ_REQUEST] + 1) & 0xFFFFFFFF
            self.orq.append(_ReadCtx(w, sink_stag, sink_to, n, segs))
            rr = READ_REQ.pack(sink_stag, sink_to, n, w.rkey, w.remote_addr)
            return _TxMsg(_OP_RREQ, [], 0, tagged=False, qn=QN_READ_REQUEST,
                          msn=self.tx_msn[QN_READ_REQUEST], extra=rr, wqe=w)
        se = bool(w.send_flags & _SOLICITED)
        if op == WR.IBV_WR_SEND_WITH_INV:
            opcode = _OP_SEND_SE_INV if se else _OP_SEND_INV
            inv = w.invalidate_rkey
        else:
            opcode = _OP_SEND_SE if se else _OP_SEND
            inv = 0
        self.tx_msn[QN_SEND] = (self.tx_msn[QN_SEND] + 1) & 0xFFFFFFFF
        return _TxMsg(opcode, segs, n, tagged=False, rsvdulp=inv, qn=QN_SEND,
                      msn=self.tx_msn[QN_SEND], wqe=w)

    def _local_error(self, w: SendWQE, status: int, reason: str) -> None:
        """RFC 5040 §7.1 case 1: an error creating a request sends a Terminate instead."""
        w.error = status
        w.state = W_DONE
        self._fail(IwarpFault.local_catastrophic(reason))

    # ---- receive -------------------------------------------------------------------------
    def receive(self, data: bytes | bytearray | memoryview, now: float = 0.0) -> None:
        """Consume received TCP bytes. Never raises: errors end the stream."""
        if self._dead or self.state in (ConnState.FAILED, ConnState.CLOSED):
            return
        try:
            mv = memoryview(data)
            if mv.format != "B" or mv.ndim != 1:
                mv = mv.cast("B")
            st = self.state
            if st == ConnState.ACCEPT_WAIT:
                if len(self._early) + len(mv) > 1 << 16:
                    raise IwarpFault.llp(MpaErrorCode.INVALID_REQ_REP,
                                         "data before the MPA Reply was sent")
                self._early += mv
                return
            if st in (ConnState.AWAIT_REQUEST, ConnState.AWAIT_REPLY):
                rest = self._rx_mpa(mv)
                if self.initiator and self.state == ConnState.RTS and self.cfg.first_fpdu_hold:
                    self.tx_hold_until = now + self.cfg.first_fpdu_hold
                if rest is None or not len(rest) or self.state != ConnState.RTS:
                    if rest is not None and len(rest) and self.state == ConnState.ACCEPT_WAIT:
                        self._early += rest
                    return
                mv = memoryview(rest)
            self._rx_stream(mv)
        except IwarpFault as f:
            self._fail(f)
        except Exception as exc:  # noqa: BLE001 - a bug must not leave the QP hung
            self.internal_errors += 1
            self._fail(IwarpFault.local_catastrophic(f"internal error: {exc!r}"))

    def _rx_mpa(self, mv: memoryview) -> bytes | None:
        parser = self._parser
        assert parser is not None
        try:
            frame = parser.feed(mv)
        except MpaError as e:
            raise IwarpFault.llp(MpaErrorCode.INVALID_REQ_REP, str(e)) from None
        if frame is None:
            return None
        self._parser = None
        rest = parser.remainder
        if isinstance(frame, MpaRequest):
            if frame.reject:
                # RFC 5044 §7.1.1: R is meaningful only in a Reply; a Request with R set is an
                # invalid frame (siw ``siw_proc_mpareq``): refused here in MPA with a
                # Terminate, never shown to the application as a connection request.
                self.dev.counters.rcvd_mpa_req_reject += 1
                raise IwarpFault.llp(MpaErrorCode.INVALID_REQ_REP,
                                     "an MPA Request must not set R (reject)")
            self.request = frame
            self.state = ConnState.ACCEPT_WAIT
            self.on_event("request")
            return rest
        assert isinstance(frame, MpaReply) and self.request is not None
        self.reply = frame
        try:
            neg = check_reply(self.cfg, self.request, frame)
        except ConnectionRejected as rej:
            self.rejected = rej
            self.state = ConnState.FAILED
            self.reason = "rejected by the peer"
            self.want_close = True
            self._dead = True
            if self.qp is not None:
                self.qp.on_conn_failed(self, None)
            self.on_event("rejected")
            return None
        self._enter_rts(neg)
        return rest

    def rx_target(self) -> memoryview | None:
        """Where the next received payload bytes go, for a zero-copy ``recv_into``: the
        rest of the current segment's payload in the target buffer (registered memory),
        or None (not in a payload, markers on, or less than :data:`DIRECT_MIN` left: then
        reading a larger chunk and copying is cheaper than one more system call)."""
        if self._phase != _P_BODY or self._mk_rx or self._dead or self._rem < DIRECT_MIN \
                or self.state != ConnState.RTS:
            return None
        t = self._tg[self._tgi]
        o = self._tgo
        n = len(t) - o
        if n > self._rem:
            n = self._rem
        return t[o:o + n]

    def rx_lookahead(self) -> int:
        """Bytes after :meth:`rx_target`'s buffer worth reading in the same system call:
        the pad and CRC, and the next segment's headers (``recvmsg_into`` scatter)."""
        if self._phase != _P_BODY or self._tgi >= len(self._tg) or \
                self._rem > len(self._tg[self._tgi]) - self._tgo:
            return 0  # not in a payload, or it continues in the next SGE
        return ((-(2 + self._ulen)) & 3) + 4 + 2 + _UNTAGGED_LEN

    def rx_placed(self, n: int) -> None:
        """``n`` bytes were received straight into :meth:`rx_target`'s buffer."""
        if n <= 0:
            return
        try:
            t = self._tg[self._tgi]
            o = self._tgo
            if self._crc_on:
                self._crc = crc32c(t[o:o + n], self._crc)
            o += n
            if o == len(t):
                self._tgi += 1
                o = 0
            self._tgo = o
            self._rem -= n
            self._pos += n
            if self._rem == 0:
                self._to_trailer()
        except IwarpFault as f:
            self._fail(f)
        except Exception as exc:  # noqa: BLE001 - see receive()
            self.internal_errors += 1
            self._fail(IwarpFault.local_catastrophic(f"internal error: {exc!r}"))

    def rx_want(self) -> int:
        """How many bytes the engine would like next (a hint for the receive size)."""
        ph = self._phase
        if self.state != ConnState.RTS or self._mk_rx or self._paylen < DIRECT_MIN:
            return 1 << 18  # small segments: many per system call
        if ph == _P_HDR:
            return self._hneed - self._hhave
        if ph == _P_TRAIL:
            return self._tneed - self._thave + 2 + _UNTAGGED_LEN
        return self._rem if self._rem < 1 << 18 else 1 << 18

    def on_eof(self) -> None:
        """The peer closed its side (TCP FIN): LLP teardown (RFC 5040 §6.2)."""
        if self.eof:
            return
        self.eof = True
        if self.state in (ConnState.FAILED, ConnState.CLOSED):
            self.want_close = True
            return
        mid = self.state == ConnState.RTS and (self._phase != _P_HDR or self._hhave
                                                 or self._ru_wqe is not None or self._rt_op >= 0)
        self.reason = "peer closed the connection" + (" mid-message" if mid else "")
        prev = self.state
        self.state = ConnState.CLOSED
        self._dead = True
        self.want_close = True
        self._abort_rx_wqe(int(WCS.IBV_WC_WR_FLUSH_ERR))
        if self.qp is not None:
            self.qp.on_conn_failed(self, None)
        self.on_event("failed" if prev != ConnState.RTS else "closed")

    def close(self) -> None:
        """Local close: stop generating messages; the driver closes after the flush."""
        if self.state not in (ConnState.FAILED, ConnState.CLOSED):
            self.state = ConnState.CLOSED
            self.reason = "closed locally"
        self._tx_stop = True
        self._dead = True
        self.want_close = True
        self._abort_rx_wqe(int(WCS.IBV_WC_WR_FLUSH_ERR))

    # ---- the FPDU receive state machine -----------------------------------------------------
    def _rx_stream(self, mv: memoryview) -> None:
        i = 0
        n = len(mv)
        step = self._rx_step
        if not self._mk_rx:
            fast = self._rx_whole_write
            while i < n and not self._dead:
                if self._phase == _P_HDR and not self._hhave and n - i >= 20:
                    k = fast(mv, i, n)
                    if k:
                        i += k
                        continue
                i += step(mv[i:] if i else mv)
            return
        while i < n and not self._dead:
            pos = self._pos
            r = pos % MARKER_INTERVAL
            if r == 0 or self._mk_have:
                take = min(4 - self._mk_have, n - i)
                self._mk_buf[self._mk_have:self._mk_have + take] = mv[i:i + take]
                self._mk_have += take
                self._pos += take
                i += take
                if self._mk_have == 4:
                    self._mk_have = 0
                    self._marker(self._pos - 4)
                continue
            lim = min(n - i, MARKER_INTERVAL - r)
            i += step(mv[i:i + lim])

    def _rx_whole_write(self, mv: memoryview, i: int, n: int) -> int:
        """Fast path: a whole, valid RDMA Write FPDU at ``mv[i:]`` (no markers) is checked
        (CRC first, then STag, PD, access, bounds: the checks of :meth:`_tagged_hdr`) and
        placed in one go. Returns the octets consumed, or 0 to let the general state
        machine handle it (another message type, a partial FPDU, any error)."""
        if mv[i + 2] & 0xBF != 0x81 or mv[i + 3] != 0x40 or self._await_rtr is not None:
            return 0  # not a tagged (DV 1) RDMA Write (RV 1)
        ulen: int
        c: int
        stag: int
        to: int
        ulen, c, _r, stag, to = _FAST_TAGGED.unpack_from(mv, i)
        end = i + 2 + ulen + ((-(2 + ulen)) & 3)
        if ulen <= _TAGGED_LEN or end + 4 > n:
            return 0
        if self._rt_op >= 0 and (self._rt_op != _OP_WRITE or stag != self._rt_stag
                                 or to != self._rt_to):
            return 0
        if self._crc_on and crc32c(mv[i:end]) != _CRC_LE.unpack_from(mv, end)[0]:
            return 0
        paylen = ulen - _TAGGED_LEN
        qp = self.qp
        mr = self.dev.mrs.get(stag)
        if mr is None or qp is None:
            return 0
        acc, off = check_access(mr, stag, qp.pd, to, paylen, _REMOTE_WRITE)
        if acc != Access.OK:
            return 0
        mr.buf[off:off + paylen] = mv[i + 16:i + 16 + paylen]
        last = c & _DDP_L
        self._rt_op = -1 if last else _OP_WRITE
        self._rt_stag = stag
        self._rt_to = (to + paylen) & _MASK64
        self._paylen = paylen
        self._ulen = ulen
        self._pos += end + 4 - i
        self._fpdu_start = self._pos
        return end + 4 - i

    def _marker(self, mpos: int) -> None:
        """A marker (RFC 5044 §5): FPDUPTR must point back to the current FPDU's start."""
        _rsvd, ptr = _MARKER.unpack_from(self._mk_buf, 0)
        if self._crc_on:
            self._crc = crc32c(self._mk_buf, self._crc)
        if ptr != mpos - self._fpdu_start:
            raise IwarpFault.llp(MpaErrorCode.MARKER_MISMATCH,
                                 f"marker at stream offset {mpos} has FPDUPTR {ptr}, the FPDU "
                                 f"starts {mpos - self._fpdu_start} octets back")

    def _rx_step(self, chunk: memoryview) -> int:
        ph = self._phase
        if ph == _P_BODY:
            k = self._rem if self._rem < len(chunk) else len(chunk)
            data = chunk[:k] if k != len(chunk) else chunk
            t = self._tg[self._tgi]
            o = self._tgo
            if o + k < len(t):
                t[o:o + k] = data
                self._tgo = o + k
            elif o + k == len(t):
                t[o:] = data
                self._tgi += 1
                self._tgo = 0
            else:
                self._place(data)
            if self._crc_on:
                self._crc = crc32c(data, self._crc)
            self._rem -= k
            self._pos += k
            if self._rem == 0:
                self._to_trailer()
            return k
        if ph == _P_HDR:
            have = self._hhave
            k = self._hneed - have
            if k > len(chunk):
                k = len(chunk)
            part = chunk[:k]
            self._hbuf[have:have + k] = part
            if self._crc_on:
                self._crc = crc32c(part, self._crc)
            self._hhave = have + k
            self._pos += k
            if have < 2 <= self._hhave:
                self._check_ulen()
            if self._hhave == self._hneed:
                self._hdr_bytes()
            return k
        if ph == _P_SKIP:
            k = self._rem if self._rem < len(chunk) else len(chunk)
            if self._crc_on:
                self._crc = crc32c(chunk[:k], self._crc)
            self._rem -= k
            self._pos += k
            if self._rem == 0:
                self._to_trailer()
            return k
        have = self._thave
        k = min(self._tneed - have, len(chunk))
        self._tbuf[have:have + k] = chunk[:k]
        self._thave = have + k
        self._pos += k
        if self._thave == self._tneed:
            self._fpdu_done()
        return k

    def _place(self, data: memoryview) -> None:
        tg = self._tg
        t = tg[self._tgi]
        o = self._tgo
        k = len(data)
        room = len(t) - o
        if k <= room:
            t[o:o + k] = data
            o += k
            if o == len(t):
                self._tgi += 1
                o = 0
            self._tgo = o
            return
        pos = 0
        while pos < k:
            t = tg[self._tgi]
            o = self._tgo
            take = min(len(t) - o, k - pos)
            t[o:o + take] = data[pos:pos + take]
            pos += take
            o += take
            if o == len(t):
                self._tgi += 1
                o = 0
            self._tgo = o

    def _to_trailer(self) -> None:
        self._phase = _P_TRAIL
        self._tneed = ((-(2 + self._ulen)) & 3) + 4
        self._thave = 0

    def _check_ulen(self) -> None:
        """The ULPDU_Length is in (RFC 5044 §4.1): a value shorter than any DDP header
        means the FPDU framing is lost."""
        (ulen,) = _U16.unpack_from(self._hbuf, 0)
        self._ulen = ulen
        if ulen < _TAGGED_LEN:
            raise IwarpFault.llp(MpaErrorCode.MARKER_MISMATCH,
                                 f"ULPDU_Length {ulen} is shorter than a DDP header: "
                                 "FPDU framing lost")

    def _hdr_bytes(self) -> None:
        """Enough header bytes are in: decide the FPDU's layout, then validate it."""
        h = self._hbuf
        if self._hneed == 16:
            ulen = self._ulen
            c = h[2]
            if not c & _DDP_T:
                op = h[3] & 0x0F
                if ulen < _UNTAGGED_LEN:
                    self._defer(IwarpFault.ddp_catastrophic(
                        f"untagged DDP segment of {ulen} bytes"), 16)
                    return
                if op in _SEND_OPS and (h[3] >> 6) == 1 and (c & 3) == 1:
                    self._hneed = 2 + _UNTAGGED_LEN
                else:
                    self._hneed = 2 + ulen
                return
        try:
            self._header()
        except IwarpFault as f:
            self._defer(f, self._hneed)

    def _defer(self, f: IwarpFault, consumed: int) -> None:
        """Keep a header error until the FPDU's CRC is known (RFC 5044 §8 first)."""
        self._pending = f
        self._kind = _K_NONE
        self._rem = 2 + self._ulen - consumed
        if self._rem > 0:
            self._phase = _P_SKIP
        else:
            self._to_trailer()

    def _header(self) -> None:
        h = self._hbuf
        ulen = self._ulen
        c = h[2]
        r = h[3]
        tagged = bool(c & _DDP_T)
        last = bool(c & _DDP_L)
        op = r & 0x0F
        hl = _TAGGED_LEN if tagged else _UNTAGGED_LEN
        hdr = bytes(h[2:2 + hl])
        self._seg_hdr = hdr
        self._last = last
        if c & 3 != 1:
            if tagged:
                raise IwarpFault.ddp_tagged(DdpTaggedErrorCode.INVALID_DDP_VERSION,
                                            f"DDP version {c & 3}", None, 0)
            raise IwarpFault.ddp_untagged(DdpUntaggedErrorCode.INVALID_DDP_VERSION,
                                          f"DDP version {c & 3}", None, 0)
        if r >> 6 != 1:
            raise IwarpFault.remote_operation(RdmapErrorCode.INVALID_RDMAP_VERSION,
                                              f"RDMAP version {r >> 6}", hdr, ulen - hl)
        if tagged:
            if op != _OP_WRITE and op != _OP_RRESP:
                raise IwarpFault.remote_operation(RdmapErrorCode.UNEXPECTED_OPCODE,
                                                  f"opcode {op:#x} on a tagged buffer",
                                                  hdr, ulen - hl)
            self._tagged_hdr(op, hdr, ulen - _TAGGED_LEN, last)
            return
        if op == _OP_WRITE or op == _OP_RRESP or op > _OP_TERM:
            raise IwarpFault.remote_operation(RdmapErrorCode.UNEXPECTED_OPCODE,
                                              f"opcode {op:#x} on an untagged buffer",
                                              hdr, ulen - hl)
        if op in _SEND_OPS:
            self._send_hdr(op, hdr, ulen - _UNTAGGED_LEN, last)
            return
        # Read Request or Terminate: the whole ULPDU is in; act on it after the CRC.
        self._kind = _K_CTRL
        self._to_trailer()

    def _start_body(self, kind: int, targets: list[memoryview], paylen: int) -> None:
        self._kind = kind
        self._paylen = paylen
        if paylen == 0:
            self._to_trailer()
            return
        self._tg = targets
        self._tgi = 0
        self._tgo = 0
        self._rem = paylen
        self._phase = _P_BODY

    def _tagged_hdr(self, op: int, hdr: bytes, paylen: int, last: bool) -> None:
        qp = self.qp
        assert qp is not None
        _c, _r, stag, to = TAGGED.unpack_from(self._hbuf, 2)
        if self._rt_op >= 0 and self._rt_op != op:
            raise IwarpFault.remote_operation(RdmapErrorCode.UNEXPECTED_OPCODE,
                                              "tagged message interleaved with another",
                                              hdr, paylen)
        if op == _OP_WRITE:
            if self._rt_op >= 0 and stag != self._rt_stag:
                raise IwarpFault.ddp_tagged(DdpTaggedErrorCode.INVALID_STAG,
                                            "STag changed within an RDMA Write", hdr, paylen)
            if self._rt_op >= 0 and to != self._rt_to:
                raise IwarpFault.ddp_tagged(DdpTaggedErrorCode.BASE_OR_BOUNDS_VIOLATION,
                                            "TO not contiguous within an RDMA Write", hdr, paylen)
            targets: list[memoryview] = []
            if paylen:
                mr = self.dev.mrs.get(stag)
                acc, off = check_access(mr, stag, qp.pd, to, paylen, _REMOTE_WRITE)
                if acc != Access.OK:
                    if acc == Access.ACCESS_PERM or acc == Access.PD_MISMATCH:
                        self.dev.on_async_event("QP_ACCESS_ERR", qp)
                    raise IwarpFault.ddp_tagged(TAGGED_CODE[acc],
                                                f"RDMA Write to STag {stag:#010x} TO {to:#x} "
                                                f"len {paylen}: {acc.name}", hdr, paylen)
                assert mr is not None
                targets = [mr.buf[off:off + paylen]]
            self._rt_op = -1 if last else op
            self._rt_stag = stag
            self._rt_to = (to + paylen) & _MASK64
            self._start_body(_K_WRITE, targets, paylen)
            return
        rd = self.orq[0] if self.orq else None
        if rd is None:
            raise IwarpFault.ddp_catastrophic("RDMA Read Response without an outstanding Read")
        if rd.wqe is not None:  # a bad response fails the Read it answers (IB: BAD_RESP_ERR)
            rd.wqe.error = int(WCS.IBV_WC_BAD_RESP_ERR)
        if stag != rd.sink_stag:
            raise IwarpFault.ddp_tagged(DdpTaggedErrorCode.INVALID_STAG,
                                        f"Read Response STag {stag:#010x}, the Read asked for "
                                        f"{rd.sink_stag:#010x}", hdr, paylen)
        if to != (rd.sink_to + rd.received) & _MASK64 or rd.received + paylen > rd.size or \
                (last and rd.received + paylen != rd.size):
            raise IwarpFault.ddp_tagged(DdpTaggedErrorCode.BASE_OR_BOUNDS_VIOLATION,
                                        f"Read Response TO {to:#x} len {paylen} outside the "
                                        f"{rd.size}-byte Read", hdr, paylen)
        if rd.wqe is not None:
            rd.wqe.error = 0
        self._rt_op = -1 if last else op
        targets = gather(rd.segs, rd.received, paylen) if paylen else []
        self._start_body(_K_RRESP, targets, paylen)

    def _send_hdr(self, op: int, hdr: bytes, paylen: int, last: bool) -> None:
        qp = self.qp
        assert qp is not None
        _c, _r, inv, qn, msn, mo = UNTAGGED.unpack_from(self._hbuf, 2)
        if qn != QN_SEND:
            raise IwarpFault.ddp_untagged(DdpUntaggedErrorCode.INVALID_QN,
                                          f"Send on QN {qn}", hdr, paylen)
        if msn != self.rx_msn[QN_SEND]:
            raise IwarpFault.ddp_untagged(DdpUntaggedErrorCode.INVALID_MSN_RANGE,
                                          f"Send MSN {msn}, expected {self.rx_msn[QN_SEND]}",
                                          hdr, paylen)
        if self._ru_op >= 0:
            if op != self._ru_op:
                raise IwarpFault.remote_operation(RdmapErrorCode.UNEXPECTED_OPCODE,
                                                  "opcode changed within a Send message",
                                                  hdr, paylen)
            if mo != self._ru_mo:
                raise IwarpFault.ddp_untagged(DdpUntaggedErrorCode.INVALID_MO,
                                              f"MO {mo}, expected {self._ru_mo}", hdr, paylen)
        else:
            if mo != 0:
                raise IwarpFault.ddp_untagged(DdpUntaggedErrorCode.INVALID_MO,
                                              f"first segment of a Send with MO {mo}", hdr, paylen)
            if self._await_rtr == RTR_SEND and paylen == 0 and last:
                self._kind = _K_RTR_SEND
                self._to_trailer()
                return
            rwqe = qp.take_rwqe()
            if rwqe is None:
                raise IwarpFault.ddp_untagged(DdpUntaggedErrorCode.INVALID_MSN_NO_BUFFER,
                                              f"Send MSN {msn}: no receive buffer posted",
                                              hdr, paylen)
            self._ru_wqe = rwqe
            self._ru_op = op
            self._ru_mo = 0
            self._ru_inv = inv
            segs = resolve_sges(self.dev.mrs, qp.rx_pd, rwqe.sg_list, _LOCAL_WRITE)
            if segs is None:
                self.dev.on_async_event("QP_ACCESS_ERR", qp)
                raise IwarpFault.ddp_catastrophic("receive WQE with a bad lkey",
                                                  int(WCS.IBV_WC_LOC_PROT_ERR))
            self._ru_segs = segs
            self._ru_cap = total_len(segs)
        if self._ru_mo + paylen > self._ru_cap:
            raise IwarpFault.ddp_untagged(DdpUntaggedErrorCode.MESSAGE_TOO_LONG,
                                          f"Send of more than {self._ru_cap} bytes for a "
                                          f"{self._ru_cap}-byte receive buffer", hdr, paylen,
                                          int(WCS.IBV_WC_LOC_LEN_ERR))
        targets = gather(self._ru_segs, self._ru_mo, paylen) if paylen else []
        self._ru_mo += paylen
        self._start_body(_K_SEND, targets, paylen)

    def _fpdu_done(self) -> None:
        """Pad and CRC are in: check the CRC, then act on the segment."""
        fault = self._pending
        if self._crc_on:
            pad = self._tneed - 4
            crc = crc32c(self._tbuf[:pad], self._crc) if pad else self._crc
            (field,) = struct.unpack_from("<I", self._tbuf, pad)
            if field != crc:
                fault = IwarpFault.llp(MpaErrorCode.CRC_MISMATCH,
                                       f"FPDU CRC32c {field:#010x}, computed {crc:#010x}")
        kind = self._kind
        self._pending = None
        self._phase = _P_HDR
        self._hhave = 0
        self._hneed = 16
        self._crc = 0
        self._kind = _K_NONE
        self._fpdu_start = self._pos
        if fault is not None:
            raise fault
        if self._await_rtr is not None:
            self._check_rtr(kind)
        if kind == _K_SEND:
            if self._last:
                self._send_delivered()
        elif kind == _K_RRESP:
            rd = self.orq[0]
            rd.received += self._paylen
            if self._last:
                self.orq.popleft()
                w = rd.wqe
                if w is not None:
                    w.state = W_DONE
                    assert self.qp is not None
                    self.qp.complete_ready()
        elif kind == _K_CTRL:
            self._control()
        elif kind == _K_RTR_SEND:
            self.rx_msn[QN_SEND] = (self.rx_msn[QN_SEND] + 1) & 0xFFFFFFFF

    def _check_rtr(self, kind: int) -> None:
        """The responder's first FPDU must be the agreed zero-length RTR (RFC 6581 §4)."""
        want = self._await_rtr
        h = self._hbuf
        ok = False
        if want == RTR_WRITE:
            ok = kind == _K_WRITE and self._paylen == 0 and self._last
        elif want == RTR_SEND:
            ok = kind == _K_RTR_SEND
        elif want == RTR_READ and kind == _K_CTRL and h[3] & 0x0F == _OP_RREQ \
                and self._ulen == _RR_ULPDU:
            ok = _U32.unpack_from(h, 2 + _UNTAGGED_LEN + 12)[0] == 0
        if not ok:
            raise IwarpFault.llp(MpaErrorCode.NO_MATCHING_RTR,
                                 f"the first FPDU is not the agreed zero-length {want} RTR")
        self._await_rtr = None
        self._tx_gate = False

    def _send_delivered(self) -> None:
        """Last segment of a Send: invalidate, complete the receive (RFC 5040 §5.3, §5.5)."""
        qp = self.qp
        assert qp is not None
        rwqe = self._ru_wqe
        op = self._ru_op
        inv = self._ru_inv
        byte_len = self._ru_mo
        self._ru_wqe = None
        self._ru_op = -1
        self._ru_segs = []
        self.rx_msn[QN_SEND] = (self.rx_msn[QN_SEND] + 1) & 0xFFFFFFFF
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
                    "QP's protection domain", self._seg_hdr, self._paylen)
            mr.valid = False
            invalidated = inv
        qp.complete_recv(rwqe, int(WCS.IBV_WC_SUCCESS), byte_len, invalidated, op in _SE_OPS)

    def _control(self) -> None:
        """A whole RDMA Read Request or Terminate ULPDU (RFC 5040 §4.4, §4.8)."""
        h = self._hbuf
        ulen = self._ulen
        hdr = self._seg_hdr
        _c, r, _ulp, qn, msn, mo = UNTAGGED.unpack_from(h, 2)
        op = r & 0x0F
        if op == _OP_TERM:
            if qn != QN_TERMINATE:
                raise IwarpFault.ddp_untagged(DdpUntaggedErrorCode.INVALID_QN,
                                              f"Terminate on QN {qn}", hdr, ulen - _UNTAGGED_LEN)
            self._terminated()
            return
        plen = ulen - _RR_ULPDU
        if qn != QN_READ_REQUEST:
            raise IwarpFault.ddp_untagged(DdpUntaggedErrorCode.INVALID_QN,
                                          f"RDMA Read Request on QN {qn}", hdr, plen)
        if msn != self.rx_msn[QN_READ_REQUEST]:
            raise IwarpFault.ddp_untagged(DdpUntaggedErrorCode.INVALID_MSN_RANGE,
                                          f"Read Request MSN {msn}, expected "
                                          f"{self.rx_msn[QN_READ_REQUEST]}", hdr, plen)
        if mo != 0 or not self._last:
            raise IwarpFault.ddp_untagged(DdpUntaggedErrorCode.INVALID_MO,
                                          "an RDMA Read Request is one whole segment", hdr, plen)
        if ulen != _RR_ULPDU:
            raise IwarpFault.remote_operation(RdmapErrorCode.UNSPECIFIED,
                                              f"RDMA Read Request ULPDU of {ulen} bytes", hdr,
                                              max(plen, 0))
        rrhdr = bytes(h[2 + _UNTAGGED_LEN:2 + _RR_ULPDU])
        sink_stag, sink_to, size, src_stag, src_to = READ_REQ.unpack_from(h, 2 + _UNTAGGED_LEN)
        if self._irq_count >= self.ird:
            raise IwarpFault.remote_operation(RdmapErrorCode.CATASTROPHIC_LOCALIZED,
                                              f"more than IRD={self.ird} outstanding RDMA Read "
                                              "Requests", hdr, 0)
        qp = self.qp
        assert qp is not None
        segs: list[memoryview] = []
        if size:
            mr = self.dev.mrs.get(src_stag)
            acc, off = check_access(mr, src_stag, qp.pd, src_to, size, _REMOTE_READ)
            if acc != Access.OK:
                self.dev.on_async_event("QP_ACCESS_ERR", qp)
                raise IwarpFault.remote_protection(
                    RDMAP_CODE[acc], f"RDMA Read of STag {src_stag:#010x} TO {src_to:#x} "
                    f"len {size}: {acc.name}", hdr, 0, rrhdr)
            assert mr is not None
            segs = [mr.buf[off:off + size]]
        self.rx_msn[QN_READ_REQUEST] = (self.rx_msn[QN_READ_REQUEST] + 1) & 0xFFFFFFFF
        self._irq_count += 1
        self._irq.append(_TxMsg(_OP_RRESP, segs, size, tagged=True, stag=sink_stag, to=sink_to,
                                read_resp=True))

    def _terminated(self) -> None:
        """The peer sent a Terminate (RFC 5040 §5.4): deliver it and tear down."""
        try:
            term: Terminate | None = Terminate.decode(self._hbuf[:2 + self._ulen],
                                                      2 + _UNTAGGED_LEN)
        except SoftRdmaError:
            term = None
        self.term_received = term
        self.reason = ("peer sent Terminate: " + term.describe()) if term is not None \
            else "peer sent a malformed Terminate"
        self.state = ConnState.FAILED
        self._dead = True
        self._tx_stop = True
        self.want_close = True
        self._abort_rx_wqe(int(WCS.IBV_WC_WR_FLUSH_ERR))
        if self.qp is not None:
            self.qp.on_conn_failed(self, term)
        self.on_event("terminated")

    # ---- teardown -------------------------------------------------------------------------
    def _abort_rx_wqe(self, status: int) -> None:
        rwqe = self._ru_wqe
        if rwqe is not None:
            self._ru_wqe = None
            self._ru_op = -1
            if self.qp is not None:
                self.qp.complete_recv(rwqe, status, 0, 0, False)

    def _fail(self, f: IwarpFault) -> None:
        """Terminate (RFC 5040 §6.2.1): queue the Terminate, error the QP, close."""
        if self.fault is not None or self.state in (ConnState.FAILED, ConnState.CLOSED):
            return
        self.fault = f
        self.reason = str(f)
        self._dead = True
        prev = self.state
        self.state = ConnState.FAILED
        if self._enc is None:
            # still in MPA setup: send the Terminate unframed by CRC/markers (as siw)
            self._enc = FpduEncoder(crc=False, markers=False)
        self._term = terminate_ulpdu(f.terminate())
        status = f.wc_status if f.wc_status is not None else int(WCS.IBV_WC_GENERAL_ERR)
        self._abort_rx_wqe(status)
        if self.qp is not None:
            self.qp.on_conn_failed(self, None)
        self.on_event("failed" if prev == ConnState.RTS else "setup-failed")


def _nbytes(bufs: list[Any]) -> int:
    n = 0
    for b in bufs:
        n += len(b)  # bytes, or byte-format memoryviews (wire.mpa casts to "B")
    return n
