"""The runtime: binds one sans-I/O engine :class:`~softrdma.ib.port.Port` to one packet link.

Duties (design.md, "Sans-I/O engines"):

* a lock around the engine: every engine call (post, modify, receive, timers) runs
  under :attr:`Runtime.lock`;
* transmit: drain ``port.tx``, map GIDs to IP addresses
  (``::ffff:a.b.c.d`` -> IPv4, Annex A17), ask the link for the real UDP source port,
  compute the RoCEv2 ICRC over exactly the IPv4/IPv6 + UDP headers the link will send
  (IBA 7.8.1, Annex A17: IPv4 ID 0 + DF, as Linux sends with ``IP_PMTUDISC_DO``) and send
  ``[headers, payload, pad, icrc]`` without copying the payload;
* receive: check each datagram's ICRC (bad -> dropped and
  counted in ``port.counters.rcvd_icrc_err``, as rxe_recv.c drops silently), build the
  :class:`~softrdma.ib.port.RxMeta` (GIDs from the IP addresses, the 40-byte GRH area a
  UD receive exposes: 20 zero bytes + the IPv4 header for IPv4, the IPv6 header for
  IPv6, as rxe does, IBA 11.4.1.1) and hand ``BTH .. pad`` to ``port.receive``;
* timers: ``port.on_timer(now)`` whenever ``now >= port.next_deadline()``.

The transmit side is :class:`~softrdma.drivers.runtime.roce_tx.RoceTx`, the receive side
:class:`~softrdma.drivers.runtime.roce_rx.RoceRx`; this module holds what binds them: the
engine's lock, progress and timers, the counters of a shared device, shutdown.

The lock, deferred calls, engine calls, the progress thread and shutdown are the
:class:`~softrdma.drivers.runtime.progress.ProgressCore` this runtime composes (the TCP runtime of
iWARP composes the same core). The four progress modes
(:class:`~softrdma.drivers.runtime.progress.ProgressMode`, in :attr:`Runtime.mode`):

* ``THREAD_SELECT`` (``mode="thread"``, a link with a descriptor: UDP, raw Ethernet,
  devd): a daemon thread waits in ``select`` on the link's descriptor and a wake pipe,
  with the next timer deadline as timeout (:class:`~.progress.SelectWaiter`);
* ``THREAD_EVENT`` (``mode="thread"``, a link without one: the in-memory fabric): the
  thread waits on an event the link's ``on_readable`` callback sets
  (:class:`~.progress.EventWaiter`);
* ``MANUAL`` (``mode="manual"``): nothing runs on its own; :meth:`Runtime.progress`
  (``ctx.progress()``), CQ polls and the link's ``on_readable`` callback drive it;
* ``VIRTUAL`` (``mode="manual"`` on a link with a virtual clock, the fabric): ``now``
  comes from that clock and the engine's timers are scheduled on it
  (:class:`~.progress.VirtualTimer`), so a simulation runs by itself under
  ``clock.run()``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, cast

from ...errors import SoftRdmaError
from ...ib.port import Port, RxMeta
from ...ib.views import AckOwner
from ...wire.gid import gid_to_ip, ip_to_gid
from ..host.resources import report_objects
from ..links.link import ROCE_V2_UDP_PORT, Datagram, GsoLink, Link, VirtualClock
from .locks import acquire
from .pacer import PollPacer
from .progress import (
    DRAIN_TIMEOUT,
    EventWaiter,
    ProgressCore,
    ProgressMode,
    SelectWaiter,
    VirtualTimer,
    Waiter,
    WakePipe,
    check_mode,
    progress_mode,
)
from .roce_rx import RoceRx, build_grh, icrc_ok
from .roce_tx import GSO_MAX_PAYLOAD, GSO_MAX_PAYLOAD_V6, ICRC_SIZE, RoceTx, icrc_v2

if TYPE_CHECKING:
    from ..capture.tap import PacketTap

__all__ = ["Runtime", "AckHold", "icrc_v2", "icrc_ok", "build_grh", "GSO_MAX_PAYLOAD",
           "GSO_MAX_PAYLOAD_V6", "ICRC_SIZE"]

_MAX_IDLE_WAIT = 0.01  # the progress thread re-checks timers at least this often (s)
DRAIN_MAX = 4096  # datagrams read before due timers run, at most (receive first)
REPORT_INTERVAL = 0.5  # a shared device's process reports its counters to devd this often (s)
ACK_HOLD = 0.001  # how long a contended busy poll may hold coalesced ACKs back (s)
ACK_HOLD_RX = 4  # datagrams received while ACKs are held that end the hold
#: ... unless about as many packets were sent meanwhile (a ping-pong); then this many
ACK_HOLD_RX_MAX = 8
ACK_STALE = 3  # holds in a row that a QP's peer waits out: it waits for its ACKs
ACK_PROMPT = 0.25  # such a QP gets its ACKs at once this long (s)


class AckHold:
    """Coalesced ACKs held back while the machine is contended (issue 25).

    Beside a busy process both ends of a ping-pong share one core, so a round trip costs
    all of both sides' CPU work, the ACKs included: each SEND's ACK is a datagram sent,
    received and completed. A responder may coalesce ACKs, one ACK acknowledging every
    request up to its PSN (IBA 9.7.5.1.1); while the busy poll finds the machine
    contended or our core shared with the peer (:meth:`~.pacer.PollPacer.hold_acks`),
    the pending ACKs stay back for at most :data:`ACK_HOLD` (a small part of any usual
    Local ACK Timeout, 67 ms at ``timeout`` 14, IBA 9.7.6.1.3) or until
    :data:`ACK_HOLD_RX` datagrams arrived (a bulk sender's window is not held, nor the
    send queue of a requester that posts on without awaiting its completions), so one
    ACK answers several requests. A ping-pong's peer sends one request per request of
    ours: while the datagrams received exceed the packets sent by less than
    :data:`ACK_HOLD_RX`, the hold lasts up to :data:`ACK_HOLD_RX_MAX` datagrams.

    A peer that waits for its ACK before the next request (a latency tool awaiting each
    SEND's completion) sends nothing during a hold: a QP whose PSN did not move during
    :data:`ACK_STALE` holds in a row that ran out (one such hold is also a peer that
    was descheduled) gets its ACKs at once for :data:`ACK_PROMPT` s (so a few holds'
    delay per that period at most). A duplicate request during a hold (the requester's
    timer ran out first: its timeout is short) ends the hold, and the held QPs get their
    ACKs at once for that long too. An idle machine, the progress thread, and a device
    without a busy poll never hold ACKs.
    """

    __slots__ = ("until", "rx", "sent0", "dups", "snap", "stale", "prompt", "ran_out")

    def __init__(self) -> None:
        self.until = 0.0  # when the current hold ends (the runtime's clock), 0.0: none
        self.rx = 0  # datagrams received during the current hold
        self.sent0 = 0  # the port's packets sent when it began
        self.dups = 0  # the port's duplicate requests when it began
        self.snap: list[tuple[AckOwner, int]] = []  # the held QPs and their PSNs then
        self.stale: dict[int, int] = {}  # id() of a QP -> holds in a row it sent nothing
        self.prompt: dict[int, float] = {}  # id() of a QP whose peer waits -> until when
        self.ran_out = 0  # holds that ended by time (tests, diagnostics)

    def go(self, pending: list[AckOwner], now: float, contended: bool, dups: int,
           sent: int = 0) -> bool:
        """True if the ``pending`` ACKs leave now; False holds them (``until`` is set).
        ``dups``: the port's count of duplicate requests received (``duplicate_request``);
        ``sent``: its count of packets sent (``sent_pkts``)."""
        until = self.until
        if not pending:
            if until:  # the ACKs left another way (the progress thread, a close)
                self.until = 0.0
                self.snap = []  # no QP kept alive by a hold
            return True
        if until == 0.0:
            if not contended:
                return True
            prompt = self.prompt
            if prompt:
                for qp in pending:
                    if prompt.get(id(qp), 0.0) > now:
                        return True
            self.until = now + ACK_HOLD
            self.rx = 0
            self.sent0 = sent
            self.dups = dups
            self.snap = [(qp, qp.ack_psn) for qp in pending]
            return False
        if dups != self.dups:  # a peer's transport timer fired before the hold ended: it
            # is sent its ACK at once (C9-105), and the held QPs are not held again a while
            self.until = 0.0
            self.snap = []
            self._prompt(pending, now)
            return True
        rx = self.rx
        if now < until and (rx < ACK_HOLD_RX or (
                rx < ACK_HOLD_RX_MAX and rx - (sent - self.sent0) < ACK_HOLD_RX)):
            return False
        self.until = 0.0
        if now >= until:  # ran out: did each held QP's peer send on meanwhile?
            self.ran_out += 1
            stale = self.stale
            for qp, psn in self.snap:
                key = id(qp)
                if qp.ack_psn != psn:
                    stale.pop(key, None)
                    continue
                # no new request during the hold: once in a while a descheduled peer;
                # ACK_STALE holds in a row, a peer that waits for the ACK
                k = stale.get(key, 0) + 1
                if k < ACK_STALE:
                    if len(stale) >= 256:
                        stale.clear()
                    stale[key] = k
                    continue
                stale.pop(key, None)
                self._prompt((qp,), now)
        self.snap = []
        return True

    def _prompt(self, qps: Iterable[AckOwner], now: float) -> None:
        """No hold for ``qps`` during :data:`ACK_PROMPT` s."""
        prompt = self.prompt
        for qp in qps:
            if len(prompt) >= 256:
                prompt.clear()
            prompt[id(qp)] = now + ACK_PROMPT


class _Memo(dict[bytes, bytes]):
    """``fn`` of a key, computed once (the GID <-> IP conversions on the packet path)."""

    def __init__(self, fn: Callable[[bytes], bytes]) -> None:
        super().__init__()
        self.fn = fn

    def __missing__(self, key: bytes) -> bytes:
        value = self[bytes(key)] = self.fn(key)
        return value


class Runtime(RoceTx, RoceRx):
    """Drives one engine :class:`Port` over one :class:`~softrdma.drivers.links.link.Link`.

    ``mode`` is ``"thread"`` or ``"manual"`` (see the module docstring). ``clock`` is a
    ``() -> float`` in seconds; by default the link's virtual clock when it has one
    (``link.clock.now``), else ``time.monotonic``. ``udp_port`` is the RoCEv2
    destination port (4791, Annex A17; a registry device may use another).
    """

    def __init__(self, port: Port, link: Link, *, mode: str = "thread",
                 clock: Callable[[], float] | None = None, batch: int = 64,
                 udp_port: int = ROCE_V2_UDP_PORT) -> None:
        threaded = check_mode(mode) == "thread"
        self.port = port
        self.link = link
        self.batch = batch
        self.udp_port = udp_port  # the destination port of every packet (the device's)
        vclock: VirtualClock | None = None
        if clock is None and link.clock is not None:  # a simulation's link (the fabric)
            vclock = link.clock
            clock = vclock.now
        self.now: Callable[[], float] = clock if clock is not None else time.monotonic
        core = ProgressCore(threaded=threaded, now=self.now, after=self._after_locked)
        self.core, self.lock, self.threaded = core, core.lock, threaded
        # the engine-call surface is the core's (bound here: no wrapper on the call path)
        self.call, self.call_now, self.defer, self.kick = (core.call, core.call_now,
                                                           core.defer, core.kick)
        self.about_to_block, self.serving = core.about_to_block, core.serving
        self._deferred = core.deferred
        self._ip_of = _Memo(gid_to_ip).__getitem__  # GID -> IP address, per packet sent
        self._gid_of = _Memo(ip_to_gid).__getitem__  # IP address -> GID, per packet received
        self._metas: dict[tuple[bytes, bytes, int, int, int], RxMeta] = {}
        self._backlog: list[Datagram] = []
        # the QPN of post_send's QP when it awaited its ACKs (ack_awaited); a number, not
        # the QP, so that a destroyed QP is not kept alive by it
        self._awaiting: int | None = None
        self._poll_ask = 1  # datagrams the next busy poll reads (progress_nonblocking)
        self._pending = False
        self._reporter = link if link.shared else None
        # a link that counts the kernel's receive-queue drops (UdpLink: SO_RXQ_OVFL)
        self._link_stats = link.overflow_stats
        self._rx_overflow = 0  # of those, already in the port counters
        self._gso: GsoLink | None = cast("GsoLink", link) if link.gso else None
        self.tap: PacketTap | None = None  # capture / packet trace (drivers.capture.tap), if asked
        self._next_report = 0.0
        fd = link.fileno()
        self._waiter: Waiter = (EventWaiter() if fd is None
                                else SelectWaiter(fd, WakePipe() if threaded else None))
        core.on_wake(self._waiter.wake)
        self._pacer = PollPacer(fd)  # the busy poll's spin-then-sleep (progress_nonblocking)
        self._ack_hold = AckHold()  # coalesced ACKs held back while contended
        self._vtimer = VirtualTimer(vclock, self._on_vtimer) if vclock is not None else None
        self.mode: ProgressMode = progress_mode(threaded, fd is not None,
                                                self._vtimer is not None)
        link.on_readable = self._on_readable  # a link without a descriptor calls it
        link.fast_rc_meta = True  # the engine needs ancillary data for UD only
        core.start(self._thread_step, "softrdma-progress")

    # ---- engine access ------------------------------------------------------------------
    @property
    def fatal(self) -> str | None:
        """Why the device failed (its devd died), else None: then every QP went to ERR
        with flush completions, IBV_EVENT_DEVICE_FATAL was raised, and calls raise
        :class:`DeviceError`."""
        return self.core.fatal

    def post_send(self, qp: Any, wqes: Sequence[Any]) -> None:
        """Post send WQEs to an engine QP and transmit at once from the caller's thread.

        This is the latency path: one lock, one clock read, the engine, the socket.
        """
        if self.core.fatal is not None:
            raise self.core.gone()
        with self.lock:  # not acquire() + try: a Ctrl-C between them left it held (locks.py)
            try:
                now = self.now()
                self._awaiting = qp.qpn if qp.awaits_acks() else None
                if len(wqes) == 1:
                    qp.post_send(wqes[0], now)
                else:
                    qp.post_sends(wqes, now)
            finally:
                port = self.port
                # the request first: coalesced ACKs are built after it left, while the
                # peer begins on the request; but on a contended machine a QP that awaited
                # its earlier requests' ACKs sends its own in one batch with it (the
                # peer, awaiting both, wakes once)
                if port.tx and not (port.ack_pending and qp.ack_rides_with(len(wqes))
                                    and self._pacer.hold_acks()):
                    pacer = self._pacer
                    if pacer.fd is None:
                        self._flush_tx_locked(False)
                    else:  # a slow send: the peer it woke may share our core
                        t0 = pacer.clock()
                        self._flush_tx_locked(False)
                        pacer.sent(t0)
                if port.ack_pending or port.tx:
                    self._flush_tx_locked(self._acks_go())
                if self._pending or self._deferred or self._vtimer is not None:
                    self._after_locked()

    # ---- progress -------------------------------------------------------------------------
    def progress(self, timeout: float = 0.0) -> int:
        """Receive, run due timers and transmit; wait up to ``timeout`` s for packets.

        Returns the number of datagrams received.
        """
        core = self.core
        if core.closed or core.fatal is not None:
            raise core.gone()
        n = self._progress_locked()
        if n or timeout <= 0:
            return n
        deadline = time.monotonic() + timeout
        wait = self._waiter.wait
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return n
            wait(min(left, _MAX_IDLE_WAIT))
            n = self._progress_locked()
            if n:
                return n

    def progress_nonblocking(self, stop_on: Any = None, taken: bool = False,
                             polls: int = 1) -> int:
        """One progress step if the lock is free (busy-polling ``cq.poll`` calls this).

        While an application busy-polls, the progress thread stands back (it stops
        watching the socket for a short grace time after the last poll), so the two
        threads do not fight over the GIL on every packet. An empty poll spins for a
        short while, then sleeps in the kernel until a datagram or a timer is due
        (:class:`~.pacer.PollPacer`): a spinning poller beside a busy process waits
        for its time slice, a sleeping one is woken when its answer arrives.

        ``taken``: the application took completions since its last step (ones the
        progress thread stored): the idle streak that step began is over, as if the
        step had received them, so the pacer spins afresh before it sleeps.

        ``polls``: while the pacer spins, up to this many empty polls in a row before
        the step returns empty (it returns at once on input, on ``stop_on`` and after a
        sleep). A C program's ``ibv_poll_cq`` (``softrdma.capi``) enters Python once per
        step, so its spin is better made here than by entering again and again.
        """
        core = self.core
        pacer = self._pacer
        if taken:
            pacer.busy()
        port = self.port
        woken = False  # after a sleep that input ended, read it at once
        while True:
            if not core.try_lock():
                return 0
            try:
                # A busy poll reads one datagram first (a ping-pong's answer then costs
                # one receive call, not a second, empty one); a full read doubles the next.
                ask = self._poll_ask
                n = self._poll_rx_locked(stop_on, ask)
                self._poll_ask = min(2 * ask, self.batch) if n >= ask else 1
                if (n or port.tx or port.ack_pending or self._deferred or self._pending
                        or self._vtimer is not None):
                    # New packets: let the application see their completions before the
                    # ACKs go out (they leave at the next idle poll, after the
                    # application's next post_send, or from the progress thread): the ACK
                    # is off the critical path of a request/response exchange (IBA
                    # 9.7.5.1.1 lets a responder coalesce). A step that took only ACKs
                    # counts as idle: the application polled on without posting, awaiting
                    # its own requests' completions, and the peer, if it does the same,
                    # awaits the ACKs we owe before it answers our next request.
                    # A step that took a request asking for a prompt ACK sends the ACKs
                    # too (Responder.schedule_ack: the peer acknowledged ours before it
                    # sent it, so it awaits its ACKs): the peer takes the ACK while our
                    # application makes its answer, not after the answer. Contended,
                    # they may wait longer (AckHold) and no ACK is prompt: the ACK
                    # then rides with our next request (ack_rides_with), one wake-up.
                    hold = self._ack_hold
                    if hold.until:
                        hold.rx += n
                    acks = not n or self._rx_acks_only or (
                        port.ack_prompt and not pacer.hold_acks())
                    self._after_locked(acks=acks and self._acks_go())
                    d = None if n or stop_on else port.next_deadline()
                    if hold.until and (d is None or hold.until < d):
                        d = hold.until
                else:
                    # An empty poll with nothing queued (most of them): the housekeeping
                    # has only a due timer to run.
                    d = port.next_deadline()
                    if d is not None and d <= self.now():
                        self._after_locked()
                        d = port.next_deadline()
            finally:
                self.lock.release()
            if n or stop_on:
                pacer.busy()
                return n
            if woken:
                break
            sleeps = pacer.sleeps
            if pacer.idle(None if d is None else d - self.now()):
                woken = True
                continue
            polls -= 1
            if polls <= 0 or pacer.sleeps != sleeps:  # the last poll, or a sleep
                break
        core.last_poll = time.monotonic()
        return 0

    def rx_pending(self) -> bool:
        return bool(self._backlog)

    def ack_awaited(self) -> bool:
        qpn = self._awaiting
        if qpn is None:
            return False
        qp = self.port.qps.get(qpn)
        return qp is not None and qp.acks_due()

    def _acks_go(self) -> bool:
        """Under the lock, on the busy poll's paths: True if the coalesced ACKs pending
        leave now, False while the machine is contended and :class:`AckHold` holds them."""
        port = self.port
        counters = port.counters
        return self._ack_hold.go(port.ack_pending, self.now(), self._pacer.hold_acks(),
                                 counters.duplicate_request, counters.sent_pkts)

    def _progress_locked(self) -> int:
        with self.lock:
            n = self._poll_rx_locked()
            self._after_locked()
            return n

    def _on_readable(self) -> None:
        """The link has datagrams (fabric callback). Re-entrant calls are deferred."""
        if self.core.closed:
            return
        if not acquire(self.lock, False):
            self._pending = True
            self._waiter.wake()
            return
        try:
            # drain the link: the fabric calls back once per delivery batch, which may
            # hold more datagrams than one receive batch
            while self._poll_rx_locked() >= self.batch:
                pass
            self._after_locked()
        finally:
            self.lock.release()
        self._waiter.wake()

    def _after_locked(self, acks: bool = True) -> None:
        """Housekeeping at the end of every locked operation: deferred work, late
        receives, due timers, transmit, virtual-clock timer scheduling.

        ``acks=False`` transmits everything but the coalesced ACKs, which stay pending."""
        port = self.port
        deferred = self._deferred
        if not (deferred or self._pending or port.tx or (acks and port.ack_pending)
                or self._vtimer is not None):
            d = port.next_deadline()
            if d is None or d > self.now():
                return  # nothing queued and no timer due (most calls: one check, no loop)
        for _ in range(64):
            while deferred:
                deferred.popleft()()
            if self._pending:
                self._pending = False
                self._poll_rx_locked()
            d = port.next_deadline()
            if d is not None and d <= self.now():
                # Receive first: an ACK already in our socket is not a lost ACK. A timer
                # that is due (perhaps late: this process was descheduled) runs only after
                # what arrived meanwhile was fed to the engine (issue 25).
                self._drain_rx_locked()
                if self.core.fatal is not None:
                    break
                port.on_timer(self.now())
            if port.tx or (acks and port.ack_pending):
                self._flush_tx_locked(acks)
            if not (self._pending or deferred or port.tx or (acks and port.ack_pending)):
                break
        vtimer = self._vtimer
        if vtimer is not None:
            vtimer.arm(port.next_deadline())

    def _drain_rx_locked(self) -> int:
        """Feed the engine everything the link holds now (at most :data:`DRAIN_MAX`
        datagrams, so a flood cannot keep the timers from running); returns how many."""
        taken = 0
        while taken < DRAIN_MAX:
            n = self._poll_rx_locked()
            if not n:
                break
            taken += n
        return taken

    def _on_vtimer(self) -> None:
        """A deadline armed on the virtual clock is due (the ``VIRTUAL`` mode)."""
        if self.core.closed:
            return
        if not acquire(self.lock, False):
            self._pending = True
            return
        try:
            self._after_locked()
        finally:
            self.lock.release()

    # ---- counters of a shared device ------------------------------------------------------------
    def report_counters(self) -> None:
        """Publish the port counters to a shared device's devd if they changed (design.md;
        the devd module docstring, "Port counters of a shared device"). Best effort: a
        daemon that went away loses the report, not the counters."""
        rep = self._reporter
        if rep is None:
            return
        self._next_report = time.monotonic() + REPORT_INTERVAL
        report_objects(rep, self.port, self.lock)  # for softrdma res show
        values = self.port.counters.as_dict()
        if values == rep.last_report:
            return
        try:
            rep.report_counters(values)
        except (SoftRdmaError, OSError):
            pass

    def device_counters(self) -> dict[str, int]:
        """The device's port counters: on a shared device every process's (this one's
        reported first, so they are current), else this port's own."""
        rep = self._reporter
        if rep is None or self.core.closed:
            return self.port.counters.as_dict()
        self.report_counters()
        return rep.device_counters()

    # ---- the progress thread ------------------------------------------------------------------
    def _thread_step(self) -> bool:
        """One round of the progress thread: receive, timers, transmit, then wait for the
        link (or a wake-up) until the next timer deadline; False once it must end."""
        with self.lock:
            self.core.took(self._poll_rx_locked())
            self._after_locked()
            d = self.port.next_deadline()
        wait = _MAX_IDLE_WAIT
        if d is not None:
            wait = min(max(d - self.now(), 0.0), _MAX_IDLE_WAIT)
        if not self._waiter.wait(wait):
            return False
        if self._reporter is not None and time.monotonic() >= self._next_report:
            self.report_counters()
        return True

    # ---- shutdown -------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        """Closed, or its device failed (objects are then released without the engine)."""
        return self.core.closed or self.core.fatal is not None

    def close(self, close_link: bool = True) -> None:
        """Stop the progress thread (joined) and close the link. Idempotent."""
        core = self.core
        if core.closed:
            return
        # ACKs coalesced but not yet sent go out now: a peer may be waiting for them.
        if acquire(self.lock, timeout=DRAIN_TIMEOUT):
            try:
                self._flush_tx_locked(True)
            except Exception:  # noqa: BLE001 - best effort at shutdown (link may be gone)
                pass
            finally:
                self.lock.release()
        self.report_counters()  # the device keeps this process's totals after it leaves
        core.close()
        self.link.on_readable = None
        if close_link:
            self.link.close()
        if self.tap is not None:
            self.tap.close()
        self._waiter.close()
