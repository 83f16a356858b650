"""The send side of a QP: requester and completer (IBA 9.7.1-9.7.6, 9.9.2; rxe_req.c, rxe_comp.c).

Send WQEs stay in ``sq`` until they complete, in order. ``tx_idx``/``tx_pkt`` point at
the next packet to (re)transmit; PSNs are given to a WQE when it is first started and
kept for retransmissions (go-back-N from the oldest unacknowledged PSN, IBA 9.7.6.1).

* RC: the WQE completes when an ACK covers its last PSN (SEND, WRITE), when the last
  read response arrives (READ) or when the atomic acknowledge arrives.
* UC and UD: the WQE completes once its last packet has been handed to the driver.
"""

from __future__ import annotations

import struct
from collections import deque
from typing import TYPE_CHECKING

from ..enums import ibv_send_flags as SF
from ..enums import ibv_wc_opcode as WCO
from ..enums import ibv_wc_status as WCS
from ..enums import ibv_wr_opcode as WRO
from ..seam.events import AsyncEventType
from ..seam.memory import gather, resolve_sges, scatter
from ..seam.queues import take_done
from ..seam.states import ERR, QPT_RC, QPT_UC, QPT_UD, RTS, SQD, SQE
from ..seam.types import (
    PSN_MASK,
    WQE_DONE,
    WQE_SENDING,
    WQE_SENT,
    WQE_UNSENT,
    SendWQE,
    WorkCompletion,
    psn_diff,
)
from ..wire import ib as wib
from ..wire import opcodes as op
from ..wire.mad import GSI_QKEY
from . import fastpath
from .congestion import MAX_WINDOW, MIN_WINDOW, RetransmitTimer, Window
from .fastpath import ACKREQ_BIT, ACKREQ_EVERY
from .mw import BindRequest
from .pacing import ICRC_BYTES, Pacer

_POS_FIRST = int(op.Pos.FIRST)
_POS_LAST = int(op.Pos.LAST)
_POS_ONLY = int(op.Pos.ONLY)

if TYPE_CHECKING:
    from .qp import EngineQP

UNSENT, SENDING, SENT, DONE = WQE_UNSENT, WQE_SENDING, WQE_SENT, WQE_DONE

MAX_INFLIGHT = MAX_WINDOW  # unacknowledged PSNs (rxe: RXE_MAX_UNACKED_PSNS = 128)
_SIGNALED = int(SF.IBV_SEND_SIGNALED)  # plain ints: IntFlag '&' is slow per WR
_FENCE = int(SF.IBV_SEND_FENCE)
_SOLICITED = int(SF.IBV_SEND_SOLICITED)
MIN_CWND = MIN_WINDOW  # the send window never shrinks below this many PSNs

_W_WRITE = int(WRO.IBV_WR_RDMA_WRITE)
_W_WRITE_IMM = int(WRO.IBV_WR_RDMA_WRITE_WITH_IMM)
_W_SEND = int(WRO.IBV_WR_SEND)
_W_SEND_IMM = int(WRO.IBV_WR_SEND_WITH_IMM)
_W_READ = int(WRO.IBV_WR_RDMA_READ)
_W_CAS = int(WRO.IBV_WR_ATOMIC_CMP_AND_SWP)
_W_FAA = int(WRO.IBV_WR_ATOMIC_FETCH_AND_ADD)
_W_LOCAL_INV = int(WRO.IBV_WR_LOCAL_INV)
_W_SEND_INV = int(WRO.IBV_WR_SEND_WITH_INV)
_W_BIND_MW = int(WRO.IBV_WR_BIND_MW)
_W_ATOMIC_WRITE = int(WRO.IBV_WR_ATOMIC_WRITE)

_ACCESS_LOCAL_WRITE = 1

WC_OPCODE = {
    _W_WRITE: WCO.IBV_WC_RDMA_WRITE, _W_WRITE_IMM: WCO.IBV_WC_RDMA_WRITE,
    _W_SEND: WCO.IBV_WC_SEND, _W_SEND_IMM: WCO.IBV_WC_SEND, _W_SEND_INV: WCO.IBV_WC_SEND,
    _W_READ: WCO.IBV_WC_RDMA_READ, _W_CAS: WCO.IBV_WC_COMP_SWAP, _W_FAA: WCO.IBV_WC_FETCH_ADD,
    _W_LOCAL_INV: WCO.IBV_WC_LOCAL_INV, _W_BIND_MW: WCO.IBV_WC_BIND_MW,
    _W_ATOMIC_WRITE: WCO.IBV_WC_ATOMIC_WRITE,
}

# NAK code -> requester completion status (IBA 9.7.5.2.3, rxe_comp.c check_ack).
NAK_STATUS = {
    wib.NAK_INVALID_REQUEST: WCS.IBV_WC_REM_INV_REQ_ERR,
    wib.NAK_REMOTE_ACCESS: WCS.IBV_WC_REM_ACCESS_ERR,
    wib.NAK_REMOTE_OP_ERR: WCS.IBV_WC_REM_OP_ERR,
    wib.NAK_INVALID_RD_REQUEST: WCS.IBV_WC_REM_INV_RD_REQ_ERR,
}

# Opcodes for (first, middle, last, only) x (plain, imm, inv) of SEND, and WRITE.
_SEND_OPS = {
    (True, True, 0): op.RC_SEND_ONLY, (True, True, 1): op.RC_SEND_ONLY_IMM,
    (True, True, 2): op.RC_SEND_ONLY_INV, (True, False, 0): op.RC_SEND_FIRST,
    (True, False, 1): op.RC_SEND_FIRST, (True, False, 2): op.RC_SEND_FIRST,
    (False, False, 0): op.RC_SEND_MIDDLE, (False, False, 1): op.RC_SEND_MIDDLE,
    (False, False, 2): op.RC_SEND_MIDDLE, (False, True, 0): op.RC_SEND_LAST,
    (False, True, 1): op.RC_SEND_LAST_IMM, (False, True, 2): op.RC_SEND_LAST_INV,
}
_WRITE_OPS = {
    (True, True, 0): op.RC_WRITE_ONLY, (True, True, 1): op.RC_WRITE_ONLY_IMM,
    (True, False, 0): op.RC_WRITE_FIRST, (True, False, 1): op.RC_WRITE_FIRST,
    (False, False, 0): op.RC_WRITE_MIDDLE, (False, False, 1): op.RC_WRITE_MIDDLE,
    (False, True, 0): op.RC_WRITE_LAST, (False, True, 1): op.RC_WRITE_LAST_IMM,
}

_BTH = wib.BTH
_RETH = wib.RETH
_ATMETH = wib.ATMETH
_U32 = wib.U32
_DETH = struct.Struct("!II")
_HOST_U64 = struct.Struct("=Q")
_PAD = (b"", b"\0", b"\0\0", b"\0\0\0")


class Requester:
    """Requester + completer of one QP."""

    def __init__(self, qp: EngineQP) -> None:
        self.qp = qp
        self.sq: deque[SendWQE] = deque()
        self.tx_idx = 0
        self.tx_pkt = 0
        self.next_psn = 0
        self.retry_left = 7
        self.rnr_left = 7
        self.rnr_wait = False
        self.rnr_psn = 0
        self.rd_atomic_out = 0
        # The read/atomic WQE whose lost responses were re-requested (IBA 9.7.5.1.5) and
        # not yet answered: further gaps or ACKs beyond it re-request it no more until it
        # completes or the transport timer expires (once per loss episode, as rxe's
        # completer does). Without this, every response of the re-requested stream that
        # moved the expected PSN re-armed the gap check: a READ request storm (issue 21).
        self.reread: SendWQE | None = None
        self.acked_psn = PSN_MASK  # last PSN covered by an ACK
        # Send window in PSNs (softrdma.ib.congestion): AIMD, cut on loss signals and
        # CNPs, capped by the peer's budget. Not a wire rule (IBA leaves the window to the
        # requester, rxe uses a fixed 128); ``cwnd`` is ``window.size()``, read per packet.
        self.window = Window()
        self.cwnd = self.window.size()
        # the transport timer's period (IBA 9.7.6.1.3, adaptive: softrdma.ib.congestion)
        self.timer = RetransmitTimer(qp.qpn)
        self._timer_code = -1  # the QP ``timeout`` the timer was configured for
        self.ack_edge = False
        # After a go-back: packets sent before the PSN in here are retransmissions
        # (counted in ``retransmitted_pkts``); None while sending new packets.
        self.resend_until: int | None = None
        self.pacer = Pacer(self.pump)

    # ---- queue management ---------------------------------------------------------------
    def depth(self) -> int:
        return len(self.sq)

    def outstanding(self) -> int:
        return sum(1 for w in self.sq if w.state in (SENDING, SENT))

    def _in_flight(self) -> bool:
        """Whether any WQE has packets in flight (``outstanding() > 0``, without counting)."""
        for w in self.sq:
            s = w.state
            if s == SENDING or s == SENT:
                return True
        return False

    def set_psn(self, psn: int) -> None:
        self.next_psn = psn & PSN_MASK
        self.acked_psn = (psn - 1) & PSN_MASK

    def reset(self) -> None:
        self.sq.clear()
        self.tx_idx = self.tx_pkt = 0
        self.rnr_wait = False
        self.rd_atomic_out = 0
        self.reread = None
        self.resend_until = None
        budget = self.window.budget  # the driver's cap outlives a reset
        self.window = Window()
        self.window.budget = budget
        self.cwnd = self.window.size()
        self._timer_code = -1

    def post(self, wqe: SendWQE, now: float) -> None:
        qp = self.qp
        wqe.signaled = qp.init.sq_sig_all or bool(wqe.send_flags & _SIGNALED)
        o = wqe.opcode
        wqe.rd_atomic = o == _W_READ or o == _W_CAS or o == _W_FAA
        if o == _W_CAS or o == _W_FAA:
            wqe.length = 8
        sq = self.sq
        sq.append(wqe)
        if len(sq) == 1 or self.tx_idx == len(sq) - 1:
            if (qp.fast_rc and fastpath.ENABLED and qp.state == RTS and not self.rnr_wait
                    and self.resend_until is None and fastpath.post_one(self, wqe, now)):
                return
            self.pump(now)

    # ---- transmission -----------------------------------------------------------------------
    def pump(self, now: float) -> None:
        """Send as many packets as the window, rd_atomic limit and fences allow."""
        qp = self.qp
        st = qp.state
        if st != RTS and st != SQD:
            return
        sq = self.sq
        rc = qp.qp_type == QPT_RC
        sent = False
        while self.tx_idx < len(sq) and not self.rnr_wait:
            wqe = sq[self.tx_idx]
            s = wqe.state
            if s == DONE:  # completed under the cursor (an ACK overtook a retransmission)
                self.tx_idx += 1
                self.tx_pkt = 0  # the packet cursor belonged to that WQE
                continue
            if s == UNSENT:
                if qp.state != RTS:
                    break
                if wqe.opcode == _W_LOCAL_INV:
                    if not self._local_inv(wqe):
                        return
                    self.tx_idx += 1
                    continue
                if wqe.opcode == _W_BIND_MW:
                    if not self._bind_mw(wqe):
                        return
                    self.tx_idx += 1
                    continue
                if rc:
                    if wqe.send_flags & _FENCE and self.rd_atomic_out > 0:
                        break
                    if wqe.rd_atomic and self.rd_atomic_out >= max(1, qp.max_rd_atomic):
                        break
                if not self._start(wqe):
                    return
            head = None
            if rc and sq[0].state != UNSENT:
                head = self._una()
                if head is not None:
                    d = psn_diff((wqe.first_psn + self.tx_pkt) & PSN_MASK, head)
                    if d >= self.cwnd:
                        break
                    self.ack_edge = d + 1 >= self.cwnd
            if self.resend_until is not None:
                self._count_resend(wqe)
            av = wqe.ah if wqe.ah is not None else qp.av
            bps = av.rate_bps if av is not None else 0.0
            lim = qp.rate_limit_bps
            if lim and (not bps or lim < bps):
                bps = lim
            k = self.tx_pkt
            if (head is not None and not bps and 0 < k < wqe.npkts - 1 and qp.av is not None
                    and self.resend_until is None and wqe.segs and qp.fast_rc
                    and fastpath.ENABLED):
                o = wqe.opcode
                is_write = o == _W_WRITE or o == _W_WRITE_IMM
                if is_write or o == _W_SEND or o == _W_SEND_IMM or o == _W_SEND_INV:
                    # a run of MIDDLE packets at once (softrdma.ib.fastpath)
                    self.tx_pkt = fastpath.emit_middles(self, wqe, k, head, is_write)
                    sent = True
                    continue
            if bps:  # static rate control (IBA 9.11, CA16-15.1.1)
                pacer = self.pacer
                if pacer.must_wait(now):
                    pacer.deadline = pacer.next_at
                    qp.port.arm(pacer)
                    break
                tx = qp.port.tx
                n_before = len(tx)
                self._send_pkt(wqe)
                if len(tx) > n_before:
                    pacer.sent(tx[-1].length + ICRC_BYTES, bps, now)
                sent = True
                continue
            self._send_pkt(wqe)
            sent = True
        if rc and sent and qp.deadline is None and qp.timeout:
            qp.set_deadline(now + self.timer_period())
        if not rc or (sq and sq[0].state == DONE):  # local operations (LOCAL_INV, BIND_MW)
            self._complete_head()

    def timer_period(self) -> float:
        """Seconds the transport timer runs now: at least the Local ACK Timeout, at most
        four times it (IBA 9.7.6.1.3; adaptive, softrdma.ib.congestion.RetransmitTimer)."""
        t = self.timer
        code = self.qp.timeout
        if code != self._timer_code:
            self._timer_code = code
            t.configure(wib.ack_timeout_s(code))
        return t.period

    def set_peer_budget(self, packets: int | None) -> None:
        """Cap the send window at ``packets`` PSNs: what the peer's receive buffer can
        absorb, as the driver knows it (None: no cap). Takes effect on the next packet."""
        self.window.set_peer_budget(packets)
        self.cwnd = self.window.size()

    def on_cnp(self, now: float) -> None:
        """A RoCEv2 CNP for this QP (DCQCN reaction point): cut the window, resend nothing."""
        self.window.on_cnp(self.next_psn)
        self.cwnd = self.window.size()

    def _una(self) -> int | None:
        """Oldest unacknowledged PSN, or None when nothing is outstanding."""
        for w in self.sq:
            if w.state == SENDING or w.state == SENT:
                if w.opcode == _W_READ:
                    return (w.first_psn + w.read_received // self.qp.mtu) & PSN_MASK
                nxt = (self.acked_psn + 1) & PSN_MASK
                if psn_diff(nxt, w.first_psn) > 0 and psn_diff(nxt, w.last_psn) <= 0:
                    return nxt
                return w.first_psn
            if w.state == UNSENT:
                return None
        return None

    def _start(self, wqe: SendWQE) -> bool:
        """Resolve local keys and assign PSNs (IBA 9.7.1); False on a local error."""
        qp = self.qp
        if wqe.inline_data is not None:
            wqe.segs = [memoryview(wqe.inline_data)]
        else:
            need = _ACCESS_LOCAL_WRITE if wqe.rd_atomic else 0
            segs = resolve_sges(qp.port.mrs, qp.pd, wqe.sg_list, need)
            if segs is None:
                self._fail(wqe, WCS.IBV_WC_LOC_PROT_ERR)
                return False
            wqe.segs = segs
        mtu = qp.mtu
        length = wqe.length
        if qp.qp_type == QPT_UD and length > mtu:  # UD: one packet per message (IBA 9.8.2)
            self._fail(wqe, WCS.IBV_WC_LOC_LEN_ERR)
            return False
        if wqe.rd_atomic and wqe.opcode != _W_READ:
            npkts = 1
        else:
            npkts = (length + mtu - 1) // mtu if length else 1
        wqe.npkts = npkts
        wqe.first_psn = self.next_psn
        wqe.last_psn = (self.next_psn + npkts - 1) & PSN_MASK
        self.next_psn = (self.next_psn + npkts) & PSN_MASK
        wqe.state = SENDING
        if wqe.rd_atomic:
            self.rd_atomic_out += 1
        self.tx_pkt = 0
        return True

    def _send_pkt(self, wqe: SendWQE) -> None:
        qp = self.qp
        qtype = qp.qp_type
        o = wqe.opcode
        pkey = qp.pkey
        if o == _W_READ:
            mtu = qp.mtu
            got = wqe.read_received
            psn = (wqe.first_psn + got // mtu) & PSN_MASK
            hdr = _BTH.pack(op.RC_READ_REQUEST, 0, pkey, qp.dest_qpn, 0x80000000 | psn) + \
                _RETH.pack(wqe.remote_addr + got, wqe.rkey, wqe.length - got)
            qp.tx([hdr], 28)
            self._advance(wqe)
            return
        if o == _W_CAS or o == _W_FAA:
            opcode = op.RC_CMP_SWAP if o == _W_CAS else op.RC_FETCH_ADD
            if o == _W_CAS:
                swap_add, compare = wqe.swap, wqe.compare_add
            else:
                swap_add, compare = wqe.compare_add, 0
            hdr = _BTH.pack(opcode, 0, pkey, qp.dest_qpn, 0x80000000 | wqe.first_psn) + \
                _ATMETH.pack(wqe.remote_addr, wqe.rkey, swap_add & 0xFFFFFFFFFFFFFFFF,
                             compare & 0xFFFFFFFFFFFFFFFF)
            qp.tx([hdr], 40)
            self._advance(wqe)
            return
        if o == _W_ATOMIC_WRITE:  # RC RDMA Atomic Write: RETH + the 8 bytes (opcode 0x1D)
            hdr = _BTH.pack(op.RC_ATOMIC_WRITE, 0, pkey, qp.dest_qpn,
                            0x80000000 | wqe.first_psn) + _RETH.pack(wqe.remote_addr, wqe.rkey, 8)
            qp.tx([hdr, *gather(wqe.segs or [], 0, 8)], len(hdr) + 8)
            self._advance(wqe)
            return
        mtu = qp.mtu
        k = self.tx_pkt
        n = wqe.npkts
        off = k * mtu
        length = wqe.length
        plen = length - off if length - off < mtu else mtu
        first = k == 0
        last = k == n - 1
        is_write = o == _W_WRITE or o == _W_WRITE_IMM
        variant = 1 if (o == _W_SEND_IMM or o == _W_WRITE_IMM) else (2 if o == _W_SEND_INV else 0)
        ext = b""
        av = None
        if qtype == QPT_UD:  # UD: SEND_ONLY(_IMM) + DETH (IBA 9.8.3)
            opcode = op.UD_SEND_ONLY_IMM if variant == 1 else op.UD_SEND_ONLY
            if qp.qpn == 1:
                qkey = GSI_QKEY
            else:
                qkey = qp.qkey if wqe.remote_qkey & 0x80000000 else wqe.remote_qkey
            ext = _DETH.pack(qkey, qp.qpn)
            dqpn = wqe.remote_qpn
            av = wqe.ah
        else:
            table = _WRITE_OPS if is_write else _SEND_OPS
            opcode = table[(first, last, variant)]
            if qtype == QPT_UC:
                opcode |= 0x20
            if first and is_write:
                ext = _RETH.pack(wqe.remote_addr, wqe.rkey, length)
            dqpn = qp.dest_qpn
        if last:
            if variant == 1:
                ext += _U32.pack(wqe.imm_data & 0xFFFFFFFF)
            elif variant == 2:
                ext += _U32.pack(wqe.invalidate_rkey & 0xFFFFFFFF)
        pad = (-plen) & 3
        b1 = pad << 4
        if last and wqe.send_flags & _SOLICITED and (not is_write or variant == 1):
            b1 |= 0x80
        w2 = (wqe.first_psn + k) & PSN_MASK
        if qtype == QPT_RC and (last or (k % ACKREQ_EVERY) == ACKREQ_EVERY - 1 or self.ack_edge):
            w2 |= ACKREQ_BIT  # AckReq: end of message, every 32 packets, or a full window
        hdr = _BTH.pack(opcode, b1, pkey, dqpn, w2) + ext
        segs = wqe.segs
        if plen and segs:
            parts: list[bytes | bytearray | memoryview] = [hdr, *gather(segs, off, plen)]
        else:
            parts = [hdr]
        if pad:
            parts.append(_PAD[pad])
        qp.tx(parts, len(hdr) + plen + pad, av)
        if last:
            self._advance(wqe)
            if qtype != QPT_RC:
                wqe.state = DONE
        else:
            self.tx_pkt = k + 1

    def _advance(self, wqe: SendWQE) -> None:
        wqe.state = SENT
        self.tx_idx += 1
        self.tx_pkt = 0

    def _local_inv(self, wqe: SendWQE) -> bool:
        """IBV_WR_LOCAL_INV: invalidate an MR of this PD (IBA 10.6.5)."""
        qp = self.qp
        mr = qp.port.lookup_mr(wqe.invalidate_rkey)
        if mr is None or mr.pd is not qp.pd:
            self._fail(wqe, WCS.IBV_WC_MW_BIND_ERR)
            return False
        mr.valid = False
        wqe.state = DONE
        return True

    def _bind_mw(self, wqe: SendWQE) -> bool:
        """IBV_WR_BIND_MW: bind a memory window in send-queue order (IBA 10.6.7.2)."""
        qp = self.qp
        bind = wqe.bind
        status = (bind.execute(qp.port, qp, qp.pd) if isinstance(bind, BindRequest)
                  else int(WCS.IBV_WC_MW_BIND_ERR))
        if status:
            self._fail(wqe, status)
            return False
        wqe.state = DONE
        return True

    # ---- completer --------------------------------------------------------------------------
    def on_response(self, pkt: wib.IBPacket, now: float) -> None:
        """Process an ACK, NAK, read response or atomic acknowledge (IBA 9.7.5.1; rxe_comp.c)."""
        qp = self.qp
        psn = pkt.psn
        if psn_diff(psn, self.next_psn) >= 0:
            qp.port.counters.rcvd_seq_err += 1  # acknowledges a PSN never sent: ghost
            qp.counters.rcvd_seq_err += 1
            return
        kind = pkt.info.kind
        if kind == op.Kind.ACK:
            self._on_aeth(psn, pkt.syndrome, now)
            return
        if kind == op.Kind.READ_RESP:
            self._read_response(pkt, now)
            return
        if kind == op.Kind.ATOMIC_ACK:
            self._ack_upto((psn - 1) & PSN_MASK, now)
            w = self._oldest()
            if w is None or w.state == UNSENT or w.first_psn != psn or not w.rd_atomic \
                    or w.opcode == _W_READ:
                qp.port.counters.rcvd_malformed += 1
                qp.counters.rcvd_malformed += 1
                return
            if w.state != DONE:
                segs = w.segs
                if segs:
                    scatter(segs, 0, memoryview(_HOST_U64.pack(pkt.orig)))
                w.state = DONE
                self.rd_atomic_out -= 1
            self._progress(now)

    def _on_aeth(self, psn: int, syn: int, now: float) -> None:
        """An ACK, RNR NAK or NAK with AETH syndrome ``syn`` for ``psn`` (IBA 9.7.5.2)."""
        qp = self.qp
        t = syn & wib.AETH_TYPE_MASK
        if t == wib.AETH_ACK:
            self._ack_upto(psn, now)
        elif t == wib.AETH_RNR_NAK:
            qp.port.counters.rcvd_rnr_nak += 1
            qp.counters.rcvd_rnr_nak += 1
            self._ack_upto((psn - 1) & PSN_MASK, now)
            self._rnr(psn, syn & 0x1F, now)
        elif t == wib.AETH_NAK:
            qp.port.counters.rcvd_nak += 1
            qp.counters.rcvd_nak += 1
            self._ack_upto((psn - 1) & PSN_MASK, now)
            if syn == wib.NAK_PSN_SEQ_ERR:
                self._retry(psn, now)
            else:
                w = self._wqe_at(psn)
                if w is not None:
                    self._fail(w, NAK_STATUS.get(syn, WCS.IBV_WC_REM_OP_ERR))

    def fast_ack(self, data: memoryview, now: float) -> bool:
        """Fast path for a 16-byte RC ACKNOWLEDGE (BTH + AETH, IBA 9.7.5.2) whose header
        checks ``Port.receive`` has done: what :meth:`on_response` does with it, without
        building an IBPacket. False (nothing done) where the general path must run."""
        st = self.qp.state
        if st != RTS and st != SQD and st != SQE:
            return False
        psn = int.from_bytes(data[9:12], "big")
        if psn_diff(psn, self.next_psn) >= 0:
            return False  # a ghost: the general path counts it
        self._on_aeth(psn, data[12], now)
        return True

    def _oldest(self) -> SendWQE | None:
        for w in self.sq:
            if w.state != DONE:
                return w
        return None

    def _wqe_at(self, psn: int) -> SendWQE | None:
        for w in self.sq:
            if w.state == SENDING or w.state == SENT:
                if psn_diff(psn, w.first_psn) >= 0 and psn_diff(psn, w.last_psn) <= 0:
                    return w
        return None

    def _ack_upto(self, psn: int, now: float) -> None:
        """Complete SEND/WRITE WQEs whose last PSN <= psn (ACK coalescing, IBA 9.7.5.1.2)."""
        progressed = False
        d = psn_diff(psn, self.acked_psn)
        if d > 0:
            self.acked_psn = psn
            progressed = True
            self.window.on_ack(d, psn)
            self.cwnd = self.window.size()
        for i, w in enumerate(self.sq):
            s = w.state
            if s == DONE:
                continue
            if s == UNSENT:
                break
            if psn_diff(w.last_psn, psn) > 0:
                break
            if w.rd_atomic:
                # An ACK beyond an unanswered read/atomic: its responses were lost
                # (IBA 9.7.5.1.5): re-request it, once per loss episode.
                self._reread(w, i, now)
                break
            w.state = DONE
            progressed = True
        if progressed:
            self._progress(now)

    def _progress(self, now: float) -> None:
        qp = self.qp
        self.retry_left = qp.retry_cnt
        self.rnr_left = qp.rnr_retry
        self.timer.on_progress()
        self._complete_head()
        if qp.state == ERR:  # the QP went to ERR while completing
            return
        if self._in_flight():
            if qp.timeout and not self.rnr_wait:
                qp.set_deadline(now + self.timer_period())
        elif not self.rnr_wait:
            qp.set_deadline(None)
        if self.tx_idx < len(self.sq):  # something left to send
            self.pump(now)
        self.check_drained()

    def _complete_head(self) -> None:
        qp = self.qp
        for w in take_done(self.sq, DONE):
            if self.tx_idx:
                self.tx_idx -= 1
            else:
                # The cursor was on the WQE just completed (an ACK covered it while it was
                # being retransmitted): the next WQE starts at its first packet, not at the
                # old WQE's packet index (which would send past the end of its message).
                self.tx_pkt = 0
            if w.signaled:
                qp.complete_send(WorkCompletion(w.wr_id, WCS.IBV_WC_SUCCESS, WC_OPCODE[w.opcode],
                                                qp.qpn, byte_len=w.length))

    def _read_response(self, pkt: wib.IBPacket, now: float) -> None:
        qp = self.qp
        psn = pkt.psn
        self._ack_upto((psn - 1) & PSN_MASK, now)
        w = self._oldest()
        if w is None or w.opcode != _W_READ or w.state == UNSENT:
            qp.port.counters.rcvd_malformed += 1
            qp.counters.rcvd_malformed += 1
            return
        mtu = qp.mtu
        got = w.read_received
        expected = (w.first_psn + got // mtu) & PSN_MASK
        d = psn_diff(psn, expected)
        if d < 0:
            qp.port.counters.duplicate_request += 1
            qp.counters.duplicate_request += 1
            return
        if d > 0:
            # a response packet was lost: re-request from the first missing one (go-back-N)
            self._reread(w, self.sq.index(w), now)
            if psn_diff(psn, w.last_psn) > 0:
                self._later_read_response(pkt)
            return
        if not self._take_read_data(w, pkt):
            return
        self.window.on_ack(1, psn)
        self.cwnd = self.window.size()
        if w.state == DONE:
            self.reread = None
        self._progress(now)

    def _take_read_data(self, w: SendWQE, pkt: wib.IBPacket) -> bool:
        """Place the in-sequence read response ``pkt`` of READ ``w`` (IBA 9.7.5.1.4); False
        (and ``w`` failed) if its length does not fit the READ."""
        mtu = self.qp.mtu
        got = w.read_received
        plen = len(pkt.payload)
        remaining = w.length - got
        last = bool(pkt.info.pos_int & _POS_LAST)
        if (last and plen != remaining) or (not last and (plen != mtu or plen >= remaining)):
            self._fail(w, WCS.IBV_WC_BAD_RESP_ERR)
            return False
        segs = w.segs
        if plen and segs is not None:
            scatter(segs, got, pkt.payload)
        w.read_received = got + plen
        if last:
            w.state = DONE
            self.rd_atomic_out -= 1
        return True

    def _later_read_response(self, pkt: wib.IBPacket) -> None:
        """A response of a READ behind the oldest one, whose responses were lost: place it
        if it is the next one that READ expects. The responder answers READs in order, so
        those responses are the ones it sends while the oldest READ is re-requested; kept,
        they spare re-reading them (the READ's re-request, if any, starts after them: its
        PSN and RETH offset follow ``read_received``). It completes in order later."""
        r = self._wqe_at(pkt.psn)
        if r is None or r.opcode != _W_READ:
            return
        if (r.first_psn + r.read_received // self.qp.mtu) & PSN_MASK != pkt.psn:
            return  # out of its sequence too: recovered when it is the oldest
        self._take_read_data(r, pkt)

    def _reread(self, w: SendWQE, i: int, now: float) -> None:
        """Re-request read/atomic ``w`` (at ``sq[i]``) whose responses were lost, from its
        first missing PSN (IBA 9.7.5.1.5), unless that was done already in this loss
        episode: the responses still in flight from the earlier request(s) arrive out of
        sequence too, and must not re-request it again (the timer recovers further losses)."""
        if self.reread is w:
            return
        self._go_back_to(i)
        self.reread = w
        self.qp.port.counters.completer_retry += 1
        self.qp.counters.completer_retry += 1
        self.pump(now)

    def _rnr(self, psn: int, timer: int, now: float) -> None:
        """RNR NAK: wait the responder's RNR timer, then resend from ``psn`` (IBA 9.7.5.2.8)."""
        qp = self.qp
        w = self._wqe_at(psn)
        if w is None:
            return
        if qp.rnr_retry != 7:
            if self.rnr_left <= 0:
                qp.port.counters.rnr_nak_retry_err += 1
                qp.counters.rnr_nak_retry_err += 1
                self._fail(w, WCS.IBV_WC_RNR_RETRY_EXC_ERR)
                return
            self.rnr_left -= 1
        self.rnr_wait = True
        self.rnr_psn = psn
        qp.set_deadline(now + wib.RNR_TIMER_S[timer])

    def _retry(self, psn: int, now: float) -> None:
        """Go back to ``psn`` after a PSN sequence NAK or a timeout (IBA 9.7.6.1.3)."""
        qp = self.qp
        w = self._wqe_at(psn)
        if w is None:
            return
        if self.retry_left <= 0:
            qp.port.counters.retry_exceeded_err += 1
            qp.counters.retry_exceeded_err += 1
            self._fail(w, WCS.IBV_WC_RETRY_EXC_ERR)
            return
        self.retry_left -= 1
        qp.port.counters.completer_retry += 1
        qp.counters.completer_retry += 1
        self.window.on_loss(self.next_psn)
        self.cwnd = self.window.size()
        self._go_back(psn)
        if qp.timeout:
            qp.set_deadline(now + self.timer_period())
        self.pump(now)

    def _go_back(self, psn: int) -> None:
        for i, w in enumerate(self.sq):
            if w.state == SENDING or w.state == SENT:
                if psn_diff(psn, w.last_psn) <= 0:
                    self._go_back_to(i)
                    if not w.rd_atomic:
                        k = psn_diff(psn, w.first_psn)
                        self.tx_pkt = k if k > 0 else 0
                    return
            elif w.state == UNSENT:
                return

    def _psn_of_next(self, wqe: SendWQE) -> int:
        """The PSN of the next packet of a started ``wqe``."""
        if wqe.opcode == _W_READ:
            return (wqe.first_psn + wqe.read_received // self.qp.mtu) & PSN_MASK
        return (wqe.first_psn + self.tx_pkt) & PSN_MASK

    def _count_resend(self, wqe: SendWQE) -> None:
        assert self.resend_until is not None
        if psn_diff(self._psn_of_next(wqe), self.resend_until) < 0:
            self.qp.port.counters.retransmitted_pkts += 1
            self.qp.counters.retransmitted_pkts += 1
        else:
            self.resend_until = None

    def _go_back_to(self, i: int) -> None:
        if self.resend_until is None:  # the first PSN never sent so far
            sq = self.sq
            cur = sq[self.tx_idx] if self.tx_idx < len(sq) else None
            self.resend_until = (self._psn_of_next(cur) if cur is not None and cur.state == SENDING
                                 else self.next_psn)
        self.tx_idx = i
        self.tx_pkt = 0
        for j in range(i, len(self.sq)):
            w = self.sq[j]
            if w.state == SENT:
                w.state = SENDING
            elif w.state == UNSENT:
                break

    def on_timer(self, now: float) -> None:
        qp = self.qp
        qp.deadline = None
        if self.rnr_wait:
            self.rnr_wait = False
            self._go_back(self.rnr_psn)
            if qp.timeout:
                qp.set_deadline(now + self.timer_period())
            self.pump(now)
            return
        una = self._una()
        if una is None:
            return
        # One expiry, however late ``now`` is (the process may not have run for a while):
        # one retry is used and the next period doubles (IBA 9.7.6.1.3; see congestion).
        self.timer.on_expiry()
        self.reread = None  # a new loss episode
        self._retry(una, now)

    # ---- errors -----------------------------------------------------------------------------
    def _fail(self, wqe: SendWQE, status: int) -> None:
        """Complete ``wqe`` in error (always, even unsignaled: IBA 10.7.3.1) and go to ERR."""
        qp = self.qp
        self._complete_head()
        try:
            self.sq.remove(wqe)
        except ValueError:
            pass
        qp.complete_send(WorkCompletion(wqe.wr_id, status, WC_OPCODE.get(wqe.opcode, 0), qp.qpn))
        if qp.qp_type != QPT_RC and qp.state in (RTS, SQD):
            # UC/UD: a send error stops the send queue only (SQE, IBA 10.3.1.6); the
            # receive queue keeps working and SQE -> RTS resumes sending.
            self.flush()
            qp.state = SQE
            return
        qp.to_error()

    def flush(self) -> None:
        """Flush every WQE not yet completed with IBV_WC_WR_FLUSH_ERR."""
        self._complete_head()
        sq = self.sq
        self.sq = deque()
        self.tx_idx = self.tx_pkt = 0
        self.rd_atomic_out = 0
        self.rnr_wait = False
        for w in sq:
            self.flush_one(w)

    def flush_one(self, wqe: SendWQE) -> None:
        qp = self.qp
        qp.complete_send(WorkCompletion(wqe.wr_id, WCS.IBV_WC_WR_FLUSH_ERR,
                                        WC_OPCODE.get(wqe.opcode, 0), qp.qpn))

    def check_drained(self) -> None:
        """SQD: raise SQ_DRAINED once no WQE is in flight (IBA 10.3.1.5)."""
        qp = self.qp
        if qp.state == SQD and not qp.sqd_notified and self.outstanding() == 0:
            qp.sqd_notified = True
            if qp.en_sqd_async_notify:
                qp.port.events.raise_event(AsyncEventType.SQ_DRAINED, qp)
