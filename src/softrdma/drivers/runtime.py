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

The lock, deferred calls, engine calls, the progress thread and shutdown are the
:class:`~softrdma.drivers.progress.ProgressCore` this runtime composes (the TCP runtime of
iWARP composes the same core). The four progress modes
(:class:`~softrdma.drivers.progress.ProgressMode`, in :attr:`Runtime.mode`):

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

import struct
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from ..errors import DeviceError, SoftRdmaError
from ..ib.port import Port, RxMeta, TxPacket
from ..wire.gid import gid_to_ip, ip_to_gid
from ..wire.opcodes import RC_REQUEST_MIDDLES, UD_OPCODES
from ..wire.roce import (
    icrc_ok_udp,
    icrc_ok_udp_id,
    icrc_v1,
    inet_checksum,
    recover_ipv4_id,
    udp_gso_iov,
    udp_run_bodies,
    udp_send_icrc,
)
from ..wire.rocev1 import GRH_SIZE, build_grh_v1
from .link import ROCE_V2_UDP_PORT, Datagram, GsoLink, Link, VirtualClock
from .progress import (
    DRAIN_TIMEOUT,
    EventWaiter,
    PollPacer,
    ProgressCore,
    ProgressMode,
    SelectWaiter,
    VirtualTimer,
    Waiter,
    WakePipe,
    check_mode,
    progress_mode,
)
from .resources import report_objects

if TYPE_CHECKING:
    from .tap import PacketTap

__all__ = ["Runtime", "icrc_v2", "icrc_ok", "build_grh"]

_IP4_HDR = struct.Struct("!BBHHHBBH4s4s")
_IP6_HDR = struct.Struct("!IHBB16s16s")
_ZERO20 = bytes(20)
_MAX_IDLE_WAIT = 0.01  # the progress thread re-checks timers at least this often (s)
DRAIN_MAX = 4096  # datagrams read before due timers run, at most (receive first)
REPORT_INTERVAL = 0.5  # a shared device's process reports its counters to devd this often (s)
ICRC_SIZE = 4  # bytes (IBA 7.8.1)
_BTH_SIZE = 12  # bytes (IBA 9.2)
GSO_MAX_PAYLOAD = 65507  # UDP payload bytes of one GSO send (65535 - IPv4 - UDP header)


def icrc_v2(src_ip: bytes, dst_ip: bytes, sport: int, dport: int, parts: Sequence[Any],
            length: int, ident: int = 0) -> bytes:
    """The 4 ICRC bytes of a RoCEv2 packet (IBA 7.8.1, Annex A17) whose BTH..pad are ``parts``.

    ``length`` is the byte length of BTH..pad. The IP header is the one Linux sends
    from an unconnected UDP socket with ``IP_PMTUDISC_DO``: IPv4 ID 0 and DF
    (:func:`softrdma.wire.roce.udp_send_icrc`, whose pseudo-header CRC is cached per flow).
    ``ident``: the IPv4 Identification instead (segment ``ident`` of a UDP GSO send).
    """
    return udp_send_icrc(src_ip, dst_ip, sport, dport, parts, length, ident)


def icrc_ok(src_ip: bytes, dst_ip: bytes, sport: int, dport: int, datagram: memoryview) -> bool:
    """True if the last 4 bytes of a RoCEv2 UDP payload are its ICRC (``wire.roce``;
    an IPv4 sender's unknown Identification is solved for, so rxe traffic passes)."""
    return icrc_ok_udp(src_ip, dst_ip, sport, dport, datagram)


def build_grh(d: Datagram, ident: int = 0, df: bool = True) -> bytes:
    """The 40-byte GRH area of a UD receive for datagram ``d`` (IBA 11.4.1.1, as rxe).

    IPv4: 20 zero bytes then the IPv4 header rebuilt from what the socket reports and
    the Identification/DF recovered from the ICRC (``wire.roce.recover_ipv4_id``), with a
    valid checksum. IPv6: the IPv6 header (flow label 0: a socket does not report it).
    """
    total = 20 + 8 + len(d.data)
    if len(d.src_ip) == 4:
        hdr = _IP4_HDR.pack(0x45, d.tos, total, ident, 0x4000 if df else 0, d.ttl, 17, 0,
                            d.src_ip, d.dst_ip)
        csum = inet_checksum(hdr)
        return _ZERO20 + hdr[:10] + struct.pack("!H", csum) + hdr[12:]
    return _IP6_HDR.pack((6 << 28) | (d.tos << 20), 8 + len(d.data), 17, d.ttl,
                         d.src_ip, d.dst_ip)


class _Memo(dict[bytes, bytes]):
    """``fn`` of a key, computed once (the GID <-> IP conversions on the packet path)."""

    def __init__(self, fn: Callable[[bytes], bytes]) -> None:
        super().__init__()
        self.fn = fn

    def __missing__(self, key: bytes) -> bytes:
        value = self[bytes(key)] = self.fn(key)
        return value


class Runtime:
    """Drives one engine :class:`Port` over one :class:`~softrdma.drivers.link.Link`.

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
        self._deferred = core.deferred
        self._ip_of = _Memo(gid_to_ip).__getitem__  # GID -> IP address, per packet sent
        self._gid_of = _Memo(ip_to_gid).__getitem__  # IP address -> GID, per packet received
        self._metas: dict[tuple[bytes, bytes, int, int, int], RxMeta] = {}
        self._backlog: list[Datagram] = []
        self._poll_ask = 1  # datagrams the next busy poll reads (progress_nonblocking)
        self._pending = False
        self._reporter = link if link.shared else None
        # a link that counts the kernel's receive-queue drops (UdpLink: SO_RXQ_OVFL)
        self._link_stats = link.overflow_stats
        self._rx_overflow = 0  # of those, already in the port counters
        self._gso: GsoLink | None = cast("GsoLink", link) if link.gso else None
        self.tap: PacketTap | None = None  # capture / packet trace (drivers.tap), if asked
        self._next_report = 0.0
        fd = link.fileno()
        self._waiter: Waiter = (EventWaiter() if fd is None
                                else SelectWaiter(fd, WakePipe() if threaded else None))
        core.on_wake(self._waiter.wake)
        self._pacer = PollPacer(fd)  # the busy poll's spin-then-sleep (progress_nonblocking)
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
        lock = self.lock
        lock.acquire()
        try:
            now = self.now()
            post = qp.post_send
            for w in wqes:
                post(w, now)
        finally:
            try:
                port = self.port
                if port.tx:  # the request first: coalesced ACKs are built after it left
                    self._flush_tx_locked(False)
                if port.ack_pending or port.tx:
                    self._flush_tx_locked()
                if self._pending or self._deferred or self._vtimer is not None:
                    self._after_locked()
            finally:
                lock.release()

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

    def progress_nonblocking(self, stop_on: Any = None) -> int:
        """One progress step if the lock is free (busy-polling ``cq.poll`` calls this).

        While an application busy-polls, the progress thread stands back (it stops
        watching the socket for a short grace time after the last poll), so the two
        threads do not fight over the GIL on every packet. An empty poll spins for a
        short while, then sleeps in the kernel until a datagram or a timer is due
        (:class:`~.progress.PollPacer`): a spinning poller beside a busy process waits
        for its time slice, a sleeping one is woken when its answer arrives.
        """
        core = self.core
        pacer = self._pacer
        for woken in (False, True):  # after a sleep that input ended, read it at once
            if not core.try_lock():
                return 0
            try:
                # A busy poll reads one datagram first (a ping-pong's answer then costs
                # one receive call, not a second, empty one); a full read doubles the next.
                ask = self._poll_ask
                n = self._poll_rx_locked(stop_on, ask)
                self._poll_ask = min(2 * ask, self.batch) if n >= ask else 1
                # New packets: let the application see their completions before the
                # ACKs go out (they leave at the next idle poll, after the application's
                # next post_send, or from the progress thread): the ACK is off the
                # critical path of a request/response exchange (IBA 9.7.5.1.1 lets a
                # responder coalesce).
                self._after_locked(acks=not n)
                d = None if n or stop_on else self.port.next_deadline()
            finally:
                self.lock.release()
            if n or stop_on:
                pacer.busy()
                return n
            if woken or not pacer.idle(None if d is None else d - self.now()):
                break
        core.last_poll = time.monotonic()
        return 0

    def _progress_locked(self) -> int:
        with self.lock:
            n = self._poll_rx_locked()
            self._after_locked()
            return n

    def _on_readable(self) -> None:
        """The link has datagrams (fabric callback). Re-entrant calls are deferred."""
        if self.core.closed:
            return
        if not self.lock.acquire(False):
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
        if not self.lock.acquire(False):
            self._pending = True
            return
        try:
            self._after_locked()
        finally:
            self.lock.release()

    # ---- transmit --------------------------------------------------------------------------
    def _flush_tx_locked(self, acks: bool = True) -> int:
        port = self.port
        if not (port.tx or (acks and port.ack_pending)):
            return 0
        pkts: list[TxPacket] = port.take_tx(acks)
        if self._gso is not None and len(pkts) > 1:
            self._flush_gso(pkts, self._gso)
            return len(pkts)
        link = self.link
        send = link.send
        eff = link.effective_sport
        ip_of = self._ip_of
        dport = self.udp_port
        tap = self.tap
        for p in pkts:
            if p.v1:
                self._send_v1(p)
                continue
            src = ip_of(p.sgid)
            dst = ip_of(p.dgid)
            sport = eff(p.sport)
            icrc = icrc_v2(src, dst, sport, dport, p.parts, p.length)
            send(dst, dport, sport, [*p.parts, icrc], p.tclass, p.hop_limit)
            if tap is not None:
                tap.tx(src, dst, sport, dport, [*p.parts, icrc], p.tclass, p.hop_limit)
        return len(pkts)

    def _flush_gso(self, pkts: list[TxPacket], link: GsoLink) -> None:
        """Transmit ``pkts`` batching runs through UDP GSO (design.md, "RoCEv2 batching").

        A run is consecutive RoCEv2 packets with the same addresses, source port, traffic
        class, hop limit and BTH DestQP, all of one length but the last (which may be
        shorter), at most ``link.gso_limit`` of them and :data:`GSO_MAX_PAYLOAD` bytes.
        One DestQP per run: a receiver that coalesces the run (UDP GRO) hands it to one
        socket, which a shared device's reuseport program picks by the first packet's
        DestQP (:mod:`softrdma.drivers.devd.reuseport`). Segment ``i``
        leaves with IPv4 Identification ``i`` (Linux ``inet_gso_segment`` numbers the
        segments of a DF super-packet from its ID, 0 on an unconnected socket), so its
        ICRC is computed with ID ``i`` (IBA 7.8.1, Annex A17).
        A refused batch is sent again one datagram per call with ID-0 ICRCs.
        """
        ip_of = self._ip_of
        eff = link.effective_sport
        send = link.send
        dport = self.udp_port
        tap = self.tap
        limits: dict[bytes, int] = {}
        n = len(pkts)
        i = 0
        while i < n:
            p = pkts[i]
            if p.v1:
                self._send_v1(p)
                i += 1
                continue
            src = ip_of(p.sgid)
            dst = ip_of(p.dgid)
            sport = eff(p.sport)
            size = p.length
            j = i + 1
            limit = limits.get(dst)
            if limit is None:
                limit = limits[dst] = link.gso_limit(dst)
            hdr = p.parts[0]
            if limit > 1 and len(hdr) >= _BTH_SIZE:
                dqpn = hdr[5:8]  # BTH DestQP (IBA 9.2)
                # at most GSO_MAX_PAYLOAD bytes: segments of ``size`` and a shorter last one
                end = min(n, i + limit, i + GSO_MAX_PAYLOAD // (size + ICRC_SIZE))
                sgid, dgid, req, tclass, hop = p.sgid, p.dgid, p.sport, p.tclass, p.hop_limit
                while j < end:
                    q = pkts[j]
                    qlen = q.length
                    if (qlen > size or q.dgid != dgid or q.sport != req or q.tclass != tclass
                            or q.hop_limit != hop or q.sgid != sgid or q.v1
                            or q.parts[0][5:8] != dqpn):
                        break
                    j += 1
                    if qlen < size:  # a shorter segment ends the run
                        if j - i == 2:  # one packet and a shorter one (a SEND and its ACK):
                            j = i + 1   # two plain sends cost less than a GSO send
                        break
            if j - i == 1:
                icrc = udp_send_icrc(src, dst, sport, dport, p.parts, size)
                send(dst, dport, sport, [*p.parts, icrc], p.tclass, p.hop_limit)
                if tap is not None:
                    tap.tx(src, dst, sport, dport, [*p.parts, icrc], p.tclass, p.hop_limit)
                i = j
                continue
            last = pkts[j - 1]
            if last.length == size:
                iov = udp_gso_iov(src, dst, sport, dport, [q.parts for q in pkts[i:j]], size)
            else:  # a shorter last segment: its own pseudo-header length
                iov = udp_gso_iov(src, dst, sport, dport, [q.parts for q in pkts[i:j - 1]],
                                  size)
                iov += last.parts
                iov.append(udp_send_icrc(src, dst, sport, dport, last.parts, last.length,
                                         j - 1 - i))
            if not link.send_gso(dst, dport, sport, iov, size + ICRC_SIZE, j - i, p.tclass,
                                 p.hop_limit):
                for k in range(i, j):  # refused: one datagram per call, ID 0
                    q = pkts[k]
                    icrc = udp_send_icrc(src, dst, sport, dport, q.parts, q.length)
                    send(dst, dport, sport, [*q.parts, icrc], q.tclass, q.hop_limit)
                    if tap is not None:
                        tap.tx(src, dst, sport, dport, [*q.parts, icrc], q.tclass,
                               q.hop_limit)
            elif tap is not None:
                off = 0
                for k in range(i, j):
                    q = pkts[k]
                    seg = iov[off:off + len(q.parts) + 1]
                    off += len(q.parts) + 1
                    tap.tx(src, dst, sport, dport, seg, q.tclass, q.hop_limit, k - i)
            i = j

    def _send_v1(self, p: TxPacket) -> None:
        """RoCEv1 (Annex A16): the GRH is always present (A16.3.1), its PayLen counts BTH
        through the ICRC (IBA 8.3.1); the ICRC covers it with TClass, FlowLabel and HopLmt
        masked (IBA 7.8.1, Annex A16, ``wire.roce.icrc_v1``)."""
        if not self.link.roce_v1:  # a GID typed RoCE v1 on a link that cannot carry it
            self.port.counters.link_downed += 1
            return
        send_v1 = self.link.send_v1
        grh = build_grh_v1(p.sgid, p.dgid, p.length + 4, p.tclass, p.flow_label, p.hop_limit)
        send_v1(p.dgid, [grh, *p.parts, icrc_v1(grh, p.parts)], p.sl)
        if self.tap is not None:  # capture / packet trace (drivers.tap)
            self.tap.tx_v1(grh, p.parts)

    def _rx_v1(self, d: Datagram, now: float) -> None:
        """One RoCEv1 packet: GRH checks, ICRC, then the engine (A16.7.1: no LRH checks;
        the engine drops a packet from or to the loopback GID ::1, A16.7.2)."""
        port = self.port
        counters = port.counters
        grh = d.grh
        data = d.data
        if len(grh) != GRH_SIZE or len(data) < 16:
            counters.rcvd_malformed += 1
            return
        sgid, dgid = d.src_ip, d.dst_ip
        body = data[:-4]
        if icrc_v1(grh, (body,)) != data[-4:]:
            counters.rcvd_icrc_err += 1
            return
        flow = int.from_bytes(grh[1:4], "big") & 0xFFFFF
        meta = RxMeta(sgid, dgid, 0, d.tos, d.ttl, flow, bytes(grh), False, True)
        port.receive(body, meta, now)

    # ---- receive ----------------------------------------------------------------------------
    def _poll_rx_locked(self, stop_on: Any = None, max_n: int = 0) -> int:
        """Feed received datagrams to the engine; returns how many were taken.

        With ``stop_on`` (a polling CQ's queue), processing stops as soon as that CQ has a
        completion: the application sees it before the datagrams behind it (typically
        the ACK that followed a response) are processed. Those wait in ``_backlog``,
        still in the link's receive ring, which is not reused until they are done.
        """
        dgrams = self._backlog
        if dgrams:
            self._backlog = []
        else:
            if self.core.fatal is not None:
                return 0
            try:
                dgrams = self.link.recv_batch(max_n or self.batch)
            except DeviceError as exc:  # the link's daemon is gone (DevdLink)
                self._device_fatal_locked(str(exc))
                return 0
            if not dgrams:
                return 0
        port = self.port
        counters = port.counters
        ls = self._link_stats
        if ls is not None and ls.rx_overflow != self._rx_overflow:  # the kernel's drops
            counters.rcvd_rx_overflow += ls.rx_overflow - self._rx_overflow
            self._rx_overflow = ls.rx_overflow
        receive = port.receive
        gid_of = self._gid_of
        metas = self._metas
        now = self.now()
        taken = 0
        tap = self.tap
        bias = misses = failures = 0  # coalesced receives: ID hint offset, what failed
        n_dg = len(dgrams)
        while taken < n_dg:
            d = dgrams[taken]
            taken += 1
            if tap is not None:
                tap.rx(d)
            data = d.data
            if d.grh:
                self._rx_v1(d, now)
                if stop_on and taken < len(dgrams):
                    self._backlog = dgrams[taken:]
                    break
                continue
            if len(data) < 16:
                counters.rcvd_malformed += 1
                continue
            src, dst = d.src_ip, d.dst_ip
            hint = d.ident
            if hint >= 0 and len(src) == 4:
                # Segment ``hint`` of a coalesced receive: a softrdma GSO sender gave it
                # IPv4 ID ``hint``; another sender (rxe: a per-destination counter) gives
                # consecutive IDs from elsewhere, found for the first segment by recovery
                # and kept as ``bias`` for the next ones.
                if hint == 0:
                    bias = 0
                ident = (hint + bias) & 0xFFFF
                df = True
                if not icrc_ok_udp_id(src, dst, d.sport, d.dport, data, ident):
                    misses += 1
                    solved = recover_ipv4_id(src, dst, d.sport, d.dport, data)
                    if solved is None:
                        failures += 1
                        counters.rcvd_icrc_err += 1
                        continue
                    ident, df = solved
                    bias = (ident - hint) & 0xFFFF
                grh = build_grh(d, ident, df) if data[0] in UD_OPCODES else b""
            # Only UD places the GRH area in the receive buffer; rxe copies the real IPv4
            # header, whose ID the ICRC lets us recover.
            elif data[0] in UD_OPCODES:
                if len(src) == 4:
                    found = recover_ipv4_id(src, dst, d.sport, d.dport, data)
                    if found is None:
                        counters.rcvd_icrc_err += 1
                        continue
                    grh = build_grh(d, found[0], found[1])
                else:
                    if not icrc_ok_udp(src, dst, d.sport, d.dport, data):
                        counters.rcvd_icrc_err += 1
                        continue
                    grh = build_grh(d)
            else:
                if not icrc_ok_udp(src, dst, d.sport, d.dport, data):
                    counters.rcvd_icrc_err += 1
                    continue
                grh = b""
            body = data[:-4]
            if grh:
                meta = RxMeta(gid_of(src), gid_of(dst), d.sport, d.tos, d.ttl, 0, grh,
                              len(src) == 4)
            else:  # RC/UC: the engine reads only the addresses; reuse one per flow
                key = (src, dst, d.sport, d.tos, d.ttl)
                meta = metas.get(key)  # type: ignore[assignment]
                if meta is None:
                    meta = RxMeta(gid_of(src), gid_of(dst), d.sport, d.tos, d.ttl, 0, b"",
                                  len(src) == 4)
                    if len(metas) >= 4096:
                        metas.clear()
                    metas[key] = meta
                if (hint >= 0 and tap is None and taken < n_dg
                        and data[0] in RC_REQUEST_MIDDLES):
                    # the MIDDLE packets that follow in this coalesced read, checked
                    # together and executed by the engine in one call (Port.receive_run)
                    run = self._middle_run(dgrams, taken, d, (hint + 1 + bias) & 0xFFFF)
                    if run:
                        k = port.receive_run([body, *run], meta)
                        if k:  # a MIDDLE completes nothing: no stop_on check
                            taken += k - 1
                            continue
            receive(body, meta, now)
            if stop_on and taken < len(dgrams):
                self._backlog = dgrams[taken:]
                break
        if (misses or failures) and self._gso is not None:
            self._gso.note_rx_ids(misses, failures)
        return taken

    @staticmethod
    def _middle_run(dgrams: list[Datagram], start: int, first: Datagram,
                    first_ident: int) -> list[memoryview]:
        """The bodies (BTH .. pad) of the datagrams from index ``start`` that follow
        ``first`` in its coalesced read (the next segment indices), with its length and
        opcode and a right ICRC (segment i with IPv4 ID ``first_ident + i``)."""
        data = first.data
        size = len(data)
        opcode = data[0]
        hint = first.ident
        datas: list[memoryview] = []
        for j in range(start, len(dgrams)):
            dj = dgrams[j]
            x = dj.data
            hint += 1
            if dj.ident != hint or len(x) != size or x[0] != opcode:
                break  # (the engine checks each DestQP)
            datas.append(x)
        if not datas:
            return datas
        return udp_run_bodies(first.src_ip, first.dst_ip, first.sport, first.dport, datas,
                              first_ident)

    def _device_fatal_locked(self, why: str) -> None:
        """The device is gone (IBA 11.6.3 "Unaffiliated asynchronous events": Local
        Catastrophic Error; ``IBV_EVENT_DEVICE_FATAL``): every QP to ERR, flushing its work
        requests, the async event raised, the progress thread stopped. Later verbs calls
        raise :class:`DeviceError` with ``why``; destroying objects still works."""
        core = self.core
        if core.fatal is not None:
            return
        core.fatal = f"{why}: the device is no longer usable (IBV_EVENT_DEVICE_FATAL)"
        core.stop.set()
        self.port.device_fatal()

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
            self._poll_rx_locked()
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
        if self.lock.acquire(timeout=DRAIN_TIMEOUT):
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
