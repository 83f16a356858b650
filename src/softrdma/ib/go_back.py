"""Go-back-N of the requester: where to resend from after a NAK, a timeout or an RNR wait,
and what counts as a retransmission (IBA 9.7.6.1, 9.7.5.1.5; rxe_comp.c ``retry``).

PSNs are kept across retransmissions; the resend starts at the oldest unacknowledged PSN
(IBA 9.7.6.1, go-back-N), a READ or atomic from its first PSN (its responses are
re-requested, IBA 9.7.5.1.5). ``resend_until`` marks the first PSN never sent: the packets
before it are counted in ``retransmitted_pkts``. A resend that an ACK overtakes was
spurious: the window cut is undone (RFC 4015 §3.2) and the cursor skips what was sent once
(RFC 5682 §2.1). :class:`GoBackN` is a base of :class:`softrdma.ib.requester.Requester`,
whose state it moves; the completer calls :meth:`GoBackN.go_back` and
:meth:`GoBackN.go_back_to`.
"""

from __future__ import annotations

from collections import deque

from ..seam.types import PSN_MASK, SendWQE, psn_diff
from ..seam.types import WQE_DONE as DONE
from ..seam.types import WQE_SENDING as SENDING
from ..seam.types import WQE_SENT as SENT
from ..seam.types import WQE_UNSENT as UNSENT
from .congestion import Window
from .send_ops import W_READ as _W_READ
from .views import QpView


class GoBackN:
    """The requester's resend cursor rules (state: the requester's send queue and cursor)."""

    qp: QpView
    sq: deque[SendWQE]
    tx_idx: int  # the WQE the next packet comes from
    tx_pkt: int  # its packet index
    next_psn: int
    # After a go-back: packets sent before this PSN are retransmissions; None otherwise.
    resend_until: int | None
    window: Window
    cwnd: int

    def _overtaken(self) -> None:
        """An ACK overtook the resend cursor: the packets it acknowledges arrived the first
        time, so the loss signal that started the resend was spurious (the ACKs were late,
        a loaded host runs the peer late): undo its window cut (RFC 4015 §3.2)."""
        if self.resend_until is not None:
            self.window.undo()
            self.cwnd = self.window.size()
            self._skip_resend()

    def _skip_resend(self) -> None:
        """End a resend found spurious: the packets between the cursor and the first PSN
        never sent were sent once and are presumed in flight, as TCP's F-RTO goes on with
        new data (RFC 5682 §2.1 step 2b); a real loss among them is still NAKed or timed
        out (IBA 9.7.5.2.2, 9.7.6.1.3). A read or atomic stops the skip (its responses
        are re-requested, IBA 9.7.5.1.5)."""
        until = self.resend_until
        assert until is not None
        sq = self.sq
        i = self.tx_idx
        while i < len(sq):
            w = sq[i]
            s = w.state
            if s == DONE:
                i += 1
                continue
            if s == UNSENT or w.rd_atomic:
                break
            if psn_diff(until, w.last_psn) > 0:  # sent whole before the loss signal
                w.state = SENT
                i += 1
                continue
            k = psn_diff(until, w.first_psn)
            self.tx_idx = i
            self.tx_pkt = k if k > 0 else 0
            self.resend_until = None
            return
        if i > self.tx_idx:
            self.tx_idx = i
            self.tx_pkt = 0
        if i >= len(sq) or sq[i].state == UNSENT:
            self.resend_until = None

    def go_back(self, psn: int) -> None:
        for i, w in enumerate(self.sq):
            if w.state == SENDING or w.state == SENT:
                if psn_diff(psn, w.last_psn) <= 0:
                    self.go_back_to(i)
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

    def go_back_to(self, i: int) -> None:
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
