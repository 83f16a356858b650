"""The sans-I/O iWARP connection engine: one LLP stream, MPA setup, then FPDUs.

An :class:`IwarpConn` is one TCP byte stream. It composes the parts siw splits its data
path into, each its own module and testable alone:

========================  ==================================================================
:mod:`.mpa_stream`        MPA framing both ways: ULPDU_Length, markers, PAD, CRC32c,
                          FPDU boundaries (RFC 5044 §4-§5)
:mod:`.ddp_place`         DDP segmentation out, tagged/untagged placement in (RFC 5041)
:mod:`.rdmap`             RDMAP receive: header checks, opcodes, completions, Read
                          Requests, received Terminates, the RTR check (RFC 5040)
:mod:`.rdmap_tx`          RDMAP transmit: work requests to messages, ordering (RFC 5040)
:mod:`.orq_irq`           the ORQ/IRQ: outstanding RDMA Reads each way, ORD/IRD
:mod:`.mpa_setup`         MPA Request/Reply negotiation (RFC 5044 §7.1, RFC 6581)
this module               MPA setup state, the transmit loop, teardown, events
========================  ==================================================================

The driver (the TCP runtime) uses only this interface; it never touches a socket or a
clock here:

* :meth:`IwarpConn.receive` takes received TCP bytes; for zero-copy placement it asks
  :meth:`IwarpConn.rx_target` for the buffer the next payload bytes belong in (and
  :meth:`IwarpConn.rx_lookahead` for what to read after it), ``recv_into``-s it and
  reports :meth:`IwarpConn.rx_placed`; :meth:`IwarpConn.rx_want` hints a receive size;
* :meth:`IwarpConn.tx_pending` / :meth:`IwarpConn.take_output` give the bytes to send (a
  list of buffers: headers, slices of the registered memory, pad + CRC; nothing copied)
  and :meth:`IwarpConn.tx_sent` takes how many the socket accepted (a Send or RDMA
  Write completes only then, RFC 5040 §5.5 rule 14); :meth:`IwarpConn.update_mss`
  follows the TCP MSS (RFC 5044 §4.2); an initiator's first FPDU waits until
  ``tx_hold_until`` (driver time, see :data:`~.mpa_setup.FIRST_FPDU_HOLD_S`), and so do a
  responder's FPDUs, until the initiator's first arrives (RFC 5044 §7.1.2, at most
  :data:`~.mpa_setup.RESPONDER_HOLD_S`): until :meth:`IwarpConn.next_deadline` the driver
  takes MPA frames and a Terminate only (``take_output(fpdus=False)``). The
  connection's one timer: :meth:`IwarpConn.next_deadline`, :meth:`IwarpConn.on_timer`;
* :meth:`IwarpConn.on_eof` reports the peer's FIN; the driver closes the socket once
  :attr:`IwarpConn.want_close` is set and everything pulled has been sent;
* :meth:`IwarpConn.pop_events` returns the typed connection events
  (:mod:`.events`) for the connection manager: no callbacks, no strings.

These are the driver's :class:`~softrdma.seam.protocols.Engine` contract.

The connection manager calls :meth:`IwarpConn.accept` / :meth:`IwarpConn.reject` on a
responder and :meth:`IwarpConn.close`, and reads ``state``, ``reason``, ``negotiated``,
``rejected``, ``request``, ``peer_private_data``, ``ird`` and ``ord``.

Its QP is seen through :class:`ConnQP` (:class:`~.qp.IwarpQP` implements it): receive
WQEs and completions, the send queue's head, and two notifications, ``on_established``
and ``on_conn_failed`` (error the QP, RFC 5040 §6.2.1). Its device through
:class:`ConnDevice`: the STag-keyed memory table, the async-event hook, the counters.

Errors: every peer-caused error is an :class:`~.terminate.IwarpFault`; the engine sends
the Terminate at the next FPDU boundary (its layer, type and code: RFC 5040 §7), moves
the QP to the error state (error completion for the work request hit, flush for the
rest) and asks to close. A received Terminate, an EOF or garbage end the stream the same
way; no exception leaves :meth:`IwarpConn.receive`.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

from ..enums import ibv_wc_status as WCS
from ..errors import SoftRdmaError
from ..seam.counters import Counters
from ..wire.ddp import MpaErrorCode, Terminate, TerminateLayer
from ..wire.mpa import FpduEncoder, MpaError, MpaFrameParser, MpaReply, MpaRequest, mulpdu
from .ddp_place import PlacementDevice
from .events import (
    Closed,
    ConnEvent,
    Established,
    Failed,
    MpaRequestReceived,
    Rejected,
    Terminated,
)
from .mpa_setup import (
    ConnectionRejected,
    MpaConfig,
    Negotiated,
    build_request,
    check_reply,
    respond,
)
from .mpa_stream import DIRECT_MIN, Buf, nbytes
from .orq_irq import ReadQueues
from .rdmap import Rdmap
from .rdmap_tx import RdmapQP, RdmapTx
from .terminate import IwarpFault, terminate_ulpdu

__all__ = ["IwarpConn", "ConnState", "ConnQP", "ConnDevice", "DEFAULT_MSS", "DIRECT_MIN"]

DEFAULT_MSS = 1460
_MIN_MSS = 64
_MAX_EARLY = 1 << 16  # octets a responder buffers before it has sent its Reply
_DEFAULT_PULL = 1 << 20
_DEFAULT_BUFS = 512
_FLUSH = int(WCS.IBV_WC_WR_FLUSH_ERR)


class ConnState:
    """Connection states (strings, for readable diagnostics)."""

    AWAIT_REQUEST = "await-request"  # responder: reading the MPA Request
    ACCEPT_WAIT = "accept-wait"      # responder: Request parsed, waiting for accept/reject
    AWAIT_REPLY = "await-reply"      # initiator: Request sent, waiting for the Reply
    RTS = "rts"                      # full operation (FPDUs)
    FAILED = "failed"                # a fault, a Terminate, a reject, or EOF ended it
    CLOSED = "closed"                # closed locally or by the peer


class ConnQP(RdmapQP, Protocol):
    """What the connection needs of its QP (:class:`~.qp.IwarpQP`)."""

    def on_established(self, conn: IwarpConn) -> None:
        """The connection reached full operation: the QP is in RTS."""

    def on_conn_failed(self, conn: IwarpConn, term: Terminate | None) -> None:
        """The stream ended (fault, Terminate, EOF): error the QP (RFC 5040 §6.2.1)."""


class ConnDevice(PlacementDevice, Protocol):
    """What the connection needs of its device (:class:`~.qp.IwarpDevice`)."""

    counters: Counters


class IwarpConn:
    """One iWARP stream (see the module docstring).

    ``initiator`` selects the MPA role; ``cfg`` the MPA wishes; ``mss`` the TCP MSS the
    MULPDU is derived from; ``qp`` the initiator's QP (a responder's comes with
    :meth:`accept`).
    """

    def __init__(self, dev: ConnDevice, *, initiator: bool, cfg: MpaConfig | None = None,
                 mss: int = DEFAULT_MSS, qp: ConnQP | None = None,
                 private_data: bytes = b"") -> None:
        self.dev = dev
        self.initiator = initiator
        self.cfg = cfg if cfg is not None else MpaConfig()
        self.mss = mss
        self.qp: ConnQP | None = None
        self.events: deque[ConnEvent] = deque()
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
        self.rq = ReadQueues(self.cfg.ird, self.cfg.ord)
        self.tx = RdmapTx(self, dev, self.rq)
        self.rdmap = Rdmap(self, dev, self.rq, self.tx)
        self._rx = self.rdmap.rx
        # transmit
        self._pre: deque[bytes] = deque()  # MPA frames, sent before any FPDU
        self._enc: FpduEncoder | None = None
        self._term: bytes | None = None
        self._tx_stop = False
        # MPA setup
        self._early = bytearray()
        # FPDUs wait until this time (0: no hold): the initiator's first (FIRST_FPDU_HOLD_S),
        # the responder's until the initiator's first FPDU (RESPONDER_HOLD_S)
        self.tx_hold_until = 0.0
        self._parser: MpaFrameParser | None
        if initiator:
            self.state = ConnState.AWAIT_REPLY
            self._bind(qp)
            self.request = build_request(self.cfg, private_data)
            self._pre.append(self.request.encode())
            self._parser = MpaFrameParser(MpaReply)
        else:
            self.state = ConnState.AWAIT_REQUEST
            self._parser = MpaFrameParser(MpaRequest)

    def _bind(self, qp: ConnQP | None) -> None:
        self.qp = self.rdmap.qp = self.tx.qp = qp

    # ---- status -------------------------------------------------------------------------
    @property
    def established(self) -> bool:
        return self.state == ConnState.RTS

    @property
    def ird(self) -> int:
        """Inbound RDMA Read depth (negotiated once established)."""
        return self.rq.ird

    @property
    def ord(self) -> int:
        """Outbound RDMA Read depth (negotiated once established)."""
        return self.rq.ord

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

    def pop_events(self) -> list[ConnEvent]:
        """The connection events since the last call, oldest first."""
        out = list(self.events)
        self.events.clear()
        return out

    def tx_pending(self) -> bool:
        """True when :meth:`take_output` would return bytes."""
        if self._pre or self._term is not None:
            return True
        if self.state != ConnState.RTS or self._tx_stop:
            return False
        return self.tx.cur is not None or self.tx.has_tx()

    # ---- MPA setup: responder side ----------------------------------------------------------
    def accept(self, qp: ConnQP, private_data: bytes = b"", cfg: MpaConfig | None = None,
               now: float = 0.0) -> None:
        """Accept the parsed Request: bind ``qp``, send the Reply, enter full operation;
        without RTR our FPDUs wait for the initiator's first, from ``now`` on at most
        ``cfg.responder_hold`` seconds (RFC 5044 §7.1.2)."""
        if self.state != ConnState.ACCEPT_WAIT or self.request is None:
            raise SoftRdmaError(f"accept in connection state {self.state}")
        if cfg is not None:
            self.cfg = cfg
        try:
            reply, neg = respond(self.request, self.cfg, private_data)
        except IwarpFault as f:
            self.fail(f)
            return
        self.reply = reply
        self._bind(qp)
        self._pre.append(reply.encode())
        self._enter_rts(neg)
        if neg.rtr is None and self.cfg.responder_hold:
            self.tx_hold_until = now + self.cfg.responder_hold
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
        self.rq.ird, self.rq.ord = neg.ird, neg.ord
        rx = self._rx
        rx.crc_on = neg.crc
        rx.markers = neg.markers_rx
        self._enc = FpduEncoder(crc=neg.crc, markers=neg.markers_tx)
        self.update_mss(self.mss)
        self.state = ConnState.RTS
        if neg.rtr is not None:  # RFC 6581 §4: the RTR goes first, nothing before it
            if self.initiator:
                self.tx.send_rtr(neg.rtr)
            else:
                self.rdmap.await_rtr = neg.rtr
                self.tx.gate = True
        qp = self.qp
        if qp is not None:
            qp.on_established(self)
        self.events.append(Established(neg))

    def update_mss(self, mss: int) -> None:
        """The LLP's current effective MSS (RFC 5044 §4.2: the MULPDU follows the EMSS;
        siw re-reads ``mss_cache`` per work request): segments cut from now on fit it."""
        self.mss = mss
        markers = self._enc.markers if self._enc is not None else False
        self.tx.set_mulpdu(mulpdu(max(mss, _MIN_MSS), markers))

    def _rx_mpa(self, mv: memoryview) -> bytes | None:
        """MPA Request or Reply bytes (RFC 5044 §7.1); the bytes after the frame."""
        parser = self._parser
        assert parser is not None
        try:
            mpa = parser.feed(mv)
        except MpaError as e:
            raise IwarpFault.llp(MpaErrorCode.INVALID_REQ_REP, str(e)) from None
        if mpa is None:
            return None
        self._parser = None
        rest = parser.remainder
        if isinstance(mpa, MpaRequest):
            if mpa.reject:
                # RFC 5044 §7.1.1: R is meaningful only in a Reply; a Request with R set is an
                # invalid frame (siw ``siw_proc_mpareq``): refused here in MPA with a
                # Terminate, never shown to the application as a connection request.
                self.dev.counters.rcvd_mpa_req_reject += 1
                raise IwarpFault.llp(MpaErrorCode.INVALID_REQ_REP,
                                     "an MPA Request must not set R (reject)")
            self.request = mpa
            self.state = ConnState.ACCEPT_WAIT
            self.events.append(MpaRequestReceived(mpa))
            return rest
        assert isinstance(mpa, MpaReply) and self.request is not None
        self.reply = mpa
        try:
            neg = check_reply(self.cfg, self.request, mpa)
        except ConnectionRejected as rej:
            self.rejected = rej
            self._end(ConnState.FAILED, "rejected by the peer", _FLUSH, None, Rejected(rej))
            return None
        self._enter_rts(neg)
        return rest

    # ---- transmit ------------------------------------------------------------------------
    def take_output(self, max_bytes: int = _DEFAULT_PULL,
                    max_bufs: int = _DEFAULT_BUFS, fpdus: bool = True) -> list[Buf]:
        """The next bytes to send (whole FPDUs), at least one FPDU if any is ready;
        without ``fpdus`` only MPA frames and a Terminate (the driver, during a hold:
        :meth:`next_deadline`)."""
        out: list[Buf] = []
        total = 0
        tx = self.tx
        while self._pre:
            b = self._pre.popleft()
            out.append(b)
            total += len(b)
            tx.offset += len(b)
        enc = self._enc
        if enc is None:
            return out
        if fpdus and self._term is None and not self._tx_stop and self.state == ConnState.RTS:
            cut = tx.fpdus
            total += tx.pull(enc, out, max_bytes - total, max_bufs)
            self.dev.counters.sent_pkts += tx.fpdus - cut
        if self._term is not None and total < max_bytes and len(out) < max_bufs:
            bufs: list[Buf] = enc.encode([self._term])
            self._term = None
            self._tx_stop = True
            self.want_close = True
            out.extend(bufs)
            tx.offset += nbytes(bufs)
        return out

    #: the name :meth:`take_output` had before the engine contract
    pull_tx = take_output

    def next_deadline(self) -> float | None:
        """When held FPDUs may leave (``tx_hold_until``), None if no hold."""
        return self.tx_hold_until or None

    def on_timer(self, now: float) -> None:
        """The hold ends once ``now`` reaches it."""
        if self.tx_hold_until and now >= self.tx_hold_until:
            self.tx_hold_until = 0.0

    def tx_sent(self, n: int) -> None:
        """``n`` more bytes of what :meth:`take_output` returned were accepted by the LLP."""
        self.dev.counters.sent_bytes += n
        self.tx.acked(n)

    # ---- receive -------------------------------------------------------------------------
    def receive(self, data: bytes | bytearray | memoryview, now: float = 0.0) -> None:
        """Consume received TCP bytes. Never raises: errors end the stream."""
        if self._rx.dead or self.state in (ConnState.FAILED, ConnState.CLOSED):
            return
        rx = self._rx
        got = rx.fpdus
        c = self.dev.counters
        try:
            mv = memoryview(data)
            if mv.format != "B" or mv.ndim != 1:
                mv = mv.cast("B")
            c.rcvd_bytes += len(mv)
            st = self.state
            if st == ConnState.ACCEPT_WAIT:
                if len(self._early) + len(mv) > _MAX_EARLY:
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
            self._rx.feed(mv)
            if self.tx_hold_until and not self.initiator and rx.fpdus != got:
                self.tx_hold_until = 0.0  # the initiator's first FPDU: ours may go
        except IwarpFault as f:
            self.fail(f)
        except Exception as exc:  # noqa: BLE001 - a bug must not leave the QP hung
            self.internal_errors += 1
            self.fail(IwarpFault.local_catastrophic(f"internal error: {exc!r}"))
        finally:
            c.rcvd_pkts += rx.fpdus - got

    def rx_target(self) -> memoryview | None:
        """Where the next received payload bytes go, for a zero-copy ``recv_into``: the
        rest of the current segment's payload in the target buffer (registered memory),
        or None (not in a payload, markers on, or less than :data:`DIRECT_MIN` left: then
        reading a larger chunk and copying is cheaper than one more system call)."""
        if self.state != ConnState.RTS:
            return None
        return self._rx.target()

    def rx_lookahead(self) -> int:
        """Bytes after :meth:`rx_target`'s buffer worth reading in the same system call:
        the pad and CRC, and the next segment's headers (``recvmsg_into`` scatter)."""
        return self._rx.lookahead()

    def rx_placed(self, n: int) -> None:
        """``n`` bytes were received straight into :meth:`rx_target`'s buffer."""
        if n <= 0:
            return
        rx = self._rx
        got = rx.fpdus
        c = self.dev.counters
        c.rcvd_bytes += n
        try:
            rx.placed(n)
        except IwarpFault as f:
            self.fail(f)
        except Exception as exc:  # noqa: BLE001 - see receive()
            self.internal_errors += 1
            self.fail(IwarpFault.local_catastrophic(f"internal error: {exc!r}"))
        finally:
            c.rcvd_pkts += rx.fpdus - got

    def rx_want(self) -> int:
        """How many bytes the engine would like next (a hint for the receive size)."""
        if self.state != ConnState.RTS:
            return 1 << 18
        return self._rx.want()

    # ---- teardown -------------------------------------------------------------------------
    def on_eof(self) -> None:
        """The peer closed its side (TCP FIN): LLP teardown (RFC 5040 §6.2)."""
        if self.eof:
            return
        self.eof = True
        if self.state in (ConnState.FAILED, ConnState.CLOSED):
            self.want_close = True
            return
        rts = self.state == ConnState.RTS
        mid = rts and (self._rx.mid_fpdu or self.rdmap.ddp.mid_message)
        reason = "peer closed the connection" + (" mid-message" if mid else "")
        self._end(ConnState.CLOSED, reason, _FLUSH, None,
                  Closed(reason) if rts else Failed(reason, None, during_setup=True))

    def close(self) -> None:
        """Local close: stop generating messages; the driver closes after the flush."""
        if self.state not in (ConnState.FAILED, ConnState.CLOSED):
            self.state = ConnState.CLOSED
            self.reason = "closed locally"
        self._tx_stop = True
        self._rx.dead = True
        self.want_close = True
        self._abort_rx_wqe(_FLUSH)

    def peer_terminated(self, term: Terminate | None) -> None:
        """The peer sent a Terminate (RFC 5040 §5.4): deliver it and tear down."""
        self.term_received = term
        self.dev.counters.rcvd_terminate += 1
        self._tx_stop = True
        reason = ("peer sent Terminate: " + term.describe()) if term is not None \
            else "peer sent a malformed Terminate"
        self._end(ConnState.FAILED, reason, _FLUSH, term, Terminated(reason, term))

    def fail(self, f: IwarpFault) -> None:
        """Terminate (RFC 5040 §6.2.1, §7.1): queue the Terminate, error the QP, close."""
        if self.fault is not None or self.state in (ConnState.FAILED, ConnState.CLOSED):
            return
        self.fault = f
        c = self.dev.counters
        c.sent_terminate += 1
        if f.layer == TerminateLayer.LLP and f.code == MpaErrorCode.CRC_MISMATCH:
            c.rcvd_icrc_err += 1  # the MPA CRC (RFC 5044 §8)
        if self._enc is None:
            # still in MPA setup: send the Terminate unframed by CRC/markers (as siw)
            self._enc = FpduEncoder(crc=False, markers=False)
        try:
            self._term = terminate_ulpdu(f.terminate())
        except SoftRdmaError as exc:  # a fault we cannot describe: a bug, still no hang
            self.internal_errors += 1
            f = IwarpFault.local_catastrophic(f"{f} (its Terminate: {exc})", f.wc_status)
            self.fault = f
            self._term = terminate_ulpdu(f.terminate())
        status = f.wc_status if f.wc_status is not None else int(WCS.IBV_WC_GENERAL_ERR)
        self._end(ConnState.FAILED, str(f), status, None,
                  Failed(str(f), f, during_setup=self.state != ConnState.RTS))

    def _end(self, state: str, reason: str, status: int, term: Terminate | None,
             event: ConnEvent) -> None:
        """The stream ends: stop receiving, complete the receive WQE of a Send in progress
        with ``status``, error the QP (RFC 5040 §6.2.1), report ``event``."""
        self.state = state
        self.reason = reason
        self._rx.dead = True
        self.want_close = True
        self._abort_rx_wqe(status)
        if self.qp is not None:
            self.qp.on_conn_failed(self, term)
        self.events.append(event)

    def _abort_rx_wqe(self, status: int) -> None:
        rwqe = self.rdmap.ddp.abort_recv()
        if rwqe is not None and self.qp is not None:
            self.qp.complete_recv(rwqe, status, 0, 0, False)
