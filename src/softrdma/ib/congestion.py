"""RC requester congestion control and adaptive retransmission (sans-I/O, per QP).

IBA leaves how many packets a requester keeps in flight to the requester (IBA 9.7.7.2:
"the requester may limit the number of outstanding requests"; rxe uses a fixed 128
PSNs). A fixed window on a lossy or shared path resends a whole window into the same
overflow on every loss (go-back-N, IBA 9.7.6.1), so each QP keeps:

* :class:`Window`: a send window in PSNs, TCP-like AIMD (RFC 5681 §3.1: slow start below
  ``ssthresh``, then about one PSN more per window acknowledged; halved on each loss
  signal). Loss signals are the transport timer expiring and a PSN sequence error NAK
  (IBA 9.7.5.2.2). A responder NAKs a gap once (IBA 9.7.5.2.2, C9-105), so each NAK is a
  loss of its own, and go-back-N resends the whole window after it: a window cut only
  once per window (RFC 6582) would resend the same too-large window into the same
  overflow. A RoCEv2 CNP (opcode 0x81, the DCQCN reaction point) halves it too, at most
  once per window (RFC 6582's recovery point; a notification point sends one per
  50 us), and resends nothing. The window never
  exceeds what the driver says the peer can absorb (:meth:`Window.set_peer_budget`: its
  receive buffer in packets), nor :data:`MAX_WINDOW`.
* :class:`RetransmitTimer`: the transport timer of IBA 9.7.6.1.3. The QP's Local ACK
  Timeout (4.096 us * 2^timeout) is the least time the timer may run; IBA lets it expire
  up to four times later (the 4x bound as IBA 9.7.6.1.3 is usually quoted; the clause's
  text was not at hand to check it; NVIDIA's ADP notes also allow "up
  to a 4x delay in the effective timeout"). Like NVIDIA's adaptive retransmission ("Adaptive Retransmission:
  Parameters Control", ADP algorithm: the initial timeout is randomised so that QPs do not
  time out together, each value is doubled after its retries), the first period is drawn
  in [T, 2T), doubles on each consecutive expiry up to 4T, and falls back to the first
  period on forward progress. Expiries are counted, not elapsed time: a timer that fires
  late (the process was not running) is one expiry, and the time the process did not run
  is never charged to the peer: an expiry more than its period late uses no retry, at
  most ``retry_cnt`` times in a row (:meth:`~softrdma.ib.completer.Completer.on_timer`).
"""

from __future__ import annotations

import random

from ..errors import InvalidArgument
from ..seam.types import psn_diff

__all__ = ["MAX_WINDOW", "MIN_WINDOW", "Window", "RetransmitTimer"]

#: the most unacknowledged PSNs a requester keeps in flight (rxe: RXE_MAX_UNACKED_PSNS 128)
MAX_WINDOW = 256
#: the window never shrinks below this many PSNs
MIN_WINDOW = 8
#: the window a QP starts with: the whole MAX_WINDOW, as before congestion control (a
#: requester that starts lower changes when AckReq is set on the wire, IBA 9.7.5.1.2);
#: the peer's budget (:meth:`Window.set_peer_budget`) keeps it from overflowing the peer
INITIAL_WINDOW = MAX_WINDOW
#: the timer may run up to this many Local ACK Timeouts (IBA 9.7.6.1.3)
TIMER_SPAN = 4.0


class Window:
    """The send window of one requester, in PSNs (see the module docstring). A timer
    expiry restarts it from :data:`MIN_WINDOW` with ``ssthresh`` at half (RFC 5681 §3.1's
    loss window, so few packets are resent before a late ACK can show the expiry
    spurious), and :meth:`undo` gives back a loss cut found spurious (RFC 4015)."""

    __slots__ = ("cwnd", "ssthresh", "budget", "recover", "losses", "cnps", "prior", "undone")

    def __init__(self) -> None:
        self.cwnd = float(INITIAL_WINDOW)
        self.ssthresh = float(MAX_WINDOW)
        self.budget = MAX_WINDOW  # PSNs the peer can absorb (set_peer_budget)
        self.recover: int | None = None  # no cut until the ACKs pass this PSN
        self.losses = 0  # window cuts (loss signals acted on)
        self.cnps = 0  # window cuts by a CNP
        self.prior: tuple[float, float] | None = None  # (cwnd, ssthresh) before a loss cut
        self.undone = 0  # loss cuts undone as spurious (:meth:`undo`)

    def size(self) -> int:
        """PSNs the requester may have outstanding now."""
        w = int(self.cwnd)
        b = self.budget
        return w if w < b else b

    def set_peer_budget(self, packets: int | None) -> None:
        """Cap the window at ``packets`` (what the peer's receive buffer can absorb, as the
        driver knows it); None lifts the cap (back to :data:`MAX_WINDOW`)."""
        if packets is None:
            self.budget = MAX_WINDOW
            return
        if not isinstance(packets, int) or isinstance(packets, bool) or packets < 1:
            raise InvalidArgument("packets", f"must be a positive packet count, got {packets!r}")
        self.budget = min(MAX_WINDOW, max(1, packets))

    def on_ack(self, acked: int, psn: int) -> None:
        """``acked`` PSNs newly acknowledged, up to ``psn``: grow (RFC 5681 §3.1)."""
        rec = self.recover
        if rec is not None and psn_diff(psn, rec) >= 0:
            self.recover = None
        cw = self.cwnd
        if cw < self.ssthresh:
            cw += acked
        else:
            cw += acked / cw
        self.cwnd = cw if cw < MAX_WINDOW else float(MAX_WINDOW)

    def _cut(self, next_psn: int, once: bool, timeout: bool = False) -> bool:
        if once and self.recover is not None:  # once per window (RFC 6582 §3.2 step 4)
            return False
        half = max(float(MIN_WINDOW), min(self.cwnd, float(self.budget)) / 2)
        self.prior = None if once else (self.cwnd, self.ssthresh)
        self.ssthresh = half
        # after a timeout, restart from the least window (RFC 5681 §3.1: the loss window)
        # and slow start to ``half``: a late ACK of the originals then overtakes the few
        # packets resent (:meth:`undo`) instead of trailing a whole window of duplicates
        self.cwnd = float(MIN_WINDOW) if timeout else half
        self.recover = (next_psn - 1) & 0xFFFFFF
        return True

    def on_loss(self, next_psn: int, timeout: bool = False) -> None:
        """A loss signal (timer expiry if ``timeout``, else a PSN sequence NAK) with
        ``next_psn`` the next new PSN."""
        if self._cut(next_psn, False, timeout):
            self.losses += 1

    def undo(self) -> None:
        """The last loss signal was spurious (an ACK of packets sent before it overtook
        their resend: they were late, not lost): restore the window it cut, as the Eifel
        response does (RFC 4015 §3.2). Once per cut; a CNP's cut is never undone."""
        prior = self.prior
        if prior is not None:
            self.prior = None
            self.cwnd, self.ssthresh = prior
            self.undone += 1

    def on_cnp(self, next_psn: int) -> None:
        """A RoCEv2 CNP for this QP (the DCQCN reaction point): slow down, resend nothing."""
        if self._cut(next_psn, True):
            self.cnps += 1


class RetransmitTimer:
    """The period of a requester's transport timer (see the module docstring)."""

    __slots__ = ("base", "first", "period", "expiries", "_rng")

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)  # per QP, reproducible on a virtual clock
        self.base = 0.0
        self.first = 0.0
        self.period = 0.0
        self.expiries = 0  # consecutive expiries without forward progress

    def configure(self, local_ack_timeout_s: float) -> None:
        """The QP's Local ACK Timeout changed (0: no timer)."""
        self.base = local_ack_timeout_s
        self.first = local_ack_timeout_s * (1.0 + self._rng.random())
        self.period = self.first
        self.expiries = 0

    def on_expiry(self) -> None:
        """The timer expired (once, however late): the next period doubles, up to 4T."""
        self.expiries += 1
        limit = self.base * TIMER_SPAN
        p = self.period * 2
        self.period = p if p < limit else limit

    def on_progress(self) -> None:
        """An acknowledgement moved the window: back to the first period."""
        self.expiries = 0
        self.period = self.first
