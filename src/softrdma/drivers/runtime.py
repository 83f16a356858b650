"""The runtime: binds one sans-I/O engine :class:`~softrdma.ib.port.Port` to one packet link.

Duties (design.md, "Sans-I/O engines"):

* a lock around the engine: every engine call (post, modify, receive, timers) runs
  under :attr:`Runtime.lock`;
* transmit (:meth:`Runtime.flush_tx`): drain ``port.tx``, map GIDs to IP addresses
  (``::ffff:a.b.c.d`` -> IPv4, roce.md §4), ask the link for the real UDP source port,
  compute the RoCEv2 ICRC over exactly the IPv4/IPv6 + UDP headers the link will send
  (roce.md §2: IPv4 ID 0 + DF, as Linux sends with ``IP_PMTUDISC_DO``) and send
  ``[headers, payload, pad, icrc]`` without copying the payload;
* receive (:meth:`Runtime.poll_rx`): check each datagram's ICRC (bad -> dropped and
  counted in ``port.counters.rcvd_icrc_err``, as rxe_recv.c drops silently), build the
  :class:`~softrdma.ib.port.RxMeta` (GIDs from the IP addresses, the 40-byte GRH area a
  UD receive exposes: 20 zero bytes + the IPv4 header for IPv4, the IPv6 header for
  IPv6, as rxe does, ib-transport.md §11) and hand ``BTH .. pad`` to ``port.receive``;
* timers: ``port.on_timer(now)`` whenever ``now >= port.next_deadline()``.

Progress modes: ``"thread"`` runs a daemon thread that waits in ``select`` on the link's
descriptor with the next timer deadline as timeout; ``"manual"`` does nothing on its
own: :meth:`progress` (``ctx.progress()``) and the link's ``on_readable`` callback (the
in-memory fabric calls it) drive it. With a link that carries a virtual clock (the
fabric), ``now`` comes from that clock and engine timers are scheduled on it, so a
simulation runs by itself under ``clock.run()``.
"""

from __future__ import annotations

import os
import select
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import ClosedError, DeviceError, InvalidArgument, SoftRdmaError
from ..ib.port import Port, RxMeta, TxPacket
from ..wire.gid import gid_to_ip, ip_to_gid
from ..wire.roce import icrc_ok_udp, icrc_v1, inet_checksum, recover_ipv4_id, udp_send_icrc
from ..wire.rocev1 import GRH_SIZE, build_grh_v1
from .link import ROCE_V2_UDP_PORT, CounterReporter, Datagram, Link

__all__ = ["Runtime", "icrc_v2", "icrc_ok", "build_grh"]

_IP4_HDR = struct.Struct("!BBHHHBBH4s4s")
_IP6_HDR = struct.Struct("!IHBB16s16s")
_ZERO20 = bytes(20)
_MAX_IDLE_WAIT = 0.01  # the progress thread re-checks timers at least this often (s)
_POLL_GRACE = 0.005  # the progress thread stands back this long after an application poll (s)
REPORT_INTERVAL = 0.5  # a shared device's process reports its counters to devd this often (s)


def icrc_v2(src_ip: bytes, dst_ip: bytes, sport: int, dport: int, parts: Sequence[Any],
            length: int) -> bytes:
    """The 4 ICRC bytes of a RoCEv2 packet (roce.md §2) whose BTH..pad are ``parts``.

    ``length`` is the byte length of BTH..pad. The IP header is the one Linux sends
    from an unconnected UDP socket with ``IP_PMTUDISC_DO``: IPv4 ID 0 and DF
    (:func:`softrdma.wire.roce.udp_send_icrc`, whose pseudo-header CRC is cached per flow).
    """
    return udp_send_icrc(src_ip, dst_ip, sport, dport, parts, length)


def icrc_ok(src_ip: bytes, dst_ip: bytes, sport: int, dport: int, datagram: memoryview) -> bool:
    """True if the last 4 bytes of a RoCEv2 UDP payload are its ICRC (``wire.roce``;
    an IPv4 sender's unknown Identification is solved for, so rxe traffic passes)."""
    return icrc_ok_udp(src_ip, dst_ip, sport, dport, datagram)


def build_grh(d: Datagram, ident: int = 0, df: bool = True) -> bytes:
    """The 40-byte GRH area of a UD receive for datagram ``d`` (rxe, ib-transport.md §11).

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


class Runtime:
    """Drives one engine :class:`Port` over one :class:`~softrdma.drivers.link.Link`.

    ``mode`` is ``"thread"`` or ``"manual"`` (see the module docstring). ``clock`` is a
    ``() -> float`` in seconds; by default the link's virtual clock when it has one
    (``link.clock.now``), else ``time.monotonic``. ``udp_port`` is the RoCEv2
    destination port (4791, roce.md §1; a registry device may use another).
    """

    #: why the device failed (its devd died), else None (a class default: subclasses
    #: such as the iWARP runtime that do not run this __init__ have it too)
    fatal: str | None = None

    def __init__(self, port: Port, link: Link, *, mode: str = "thread",
                 clock: Callable[[], float] | None = None, batch: int = 64,
                 udp_port: int = ROCE_V2_UDP_PORT) -> None:
        if mode not in ("thread", "manual"):
            raise InvalidArgument("progress", f"must be 'thread' or 'manual', got {mode!r}")
        self.port = port
        self.link = link
        self.mode = mode
        self.threaded = mode == "thread"
        self.batch = batch
        self.udp_port = udp_port  # the destination port of every packet (the device's)
        self.lock = threading.Lock()
        self.last_poll = 0.0
        self._kick = threading.Event()
        self._vclock: Any = None
        if clock is None:
            vclock = getattr(link, "clock", None)
            if vclock is None:
                vclock = getattr(getattr(link, "fabric", None), "clock", None)
            if vclock is not None and callable(getattr(vclock, "now", None)):
                clock = vclock.now
                if callable(getattr(vclock, "call_at", None)):
                    self._vclock = vclock
        self.now: Callable[[], float] = clock if clock is not None else time.monotonic
        self._deferred: deque[Callable[[], None]] = deque()
        self._gid_ip: dict[bytes, bytes] = {}
        self._ip_gid: dict[bytes, bytes] = {}
        self._metas: dict[tuple[bytes, bytes, int, int, int], RxMeta] = {}
        self._backlog: list[Datagram] = []
        self._pending = False
        self._closed = False
        # Why the device failed (its devd died): then every QP went to ERR with flush
        # completions, IBV_EVENT_DEVICE_FATAL was raised, and calls raise DeviceError.
        self.fatal: str | None = None
        self._timer_at: float | None = None  # virtual-clock timer already scheduled
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._wake_r = self._wake_w = -1
        self._rx_event = threading.Event()
        self._reporter = link if isinstance(link, CounterReporter) else None
        self._next_report = 0.0
        if hasattr(link, "on_readable"):
            link.on_readable = self._on_readable
        if hasattr(link, "fast_rc_meta"):
            link.fast_rc_meta = True  # the engine needs ancillary data for UD only
        if self.threaded:
            self._wake_r, self._wake_w = os.pipe()
            os.set_blocking(self._wake_r, False)
            os.set_blocking(self._wake_w, False)
            self._thread = threading.Thread(target=self._thread_main, name="softrdma-progress",
                                            daemon=True)
            self._thread.start()

    # ---- engine access ------------------------------------------------------------------
    def _gone(self) -> ClosedError | DeviceError:
        """The error a call on a closed runtime raises: the device's failure if it failed."""
        if self.fatal is not None:
            return DeviceError(self.fatal)
        return ClosedError("the device runtime is closed")

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` under the engine lock, then transmit what it queued."""
        if self._closed or self.fatal is not None:
            raise self._gone()
        with self.lock:
            try:
                return fn(*args)
            finally:
                self._after_locked(acks=False)

    def call_now(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Like :meth:`call` with the current time appended to the arguments."""
        if self._closed or self.fatal is not None:
            raise self._gone()
        with self.lock:
            try:
                return fn(*args, self.now())
            finally:
                self._after_locked()

    def post_send(self, qp: Any, wqes: Sequence[Any]) -> None:
        """Post send WQEs to an engine QP and transmit at once from the caller's thread.

        This is the latency path: one lock, one clock read, the engine, the socket.
        """
        if self.fatal is not None:
            raise self._gone()
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
                if port.tx or port.ack_pending:
                    self._flush_tx_locked()
                if self._pending or self._deferred or self._vclock is not None:
                    self._after_locked()
            finally:
                lock.release()

    def defer(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` under the lock at the next engine operation (safe from finalizers)."""
        self._deferred.append(fn)

    # ---- progress -------------------------------------------------------------------------
    def progress(self, timeout: float = 0.0) -> int:
        """Receive, run due timers and transmit; wait up to ``timeout`` s for packets.

        Returns the number of datagrams received.
        """
        if self._closed or self.fatal is not None:
            raise self._gone()
        n = self._progress_locked()
        if n or timeout <= 0:
            return n
        deadline = time.monotonic() + timeout
        fd = self.link.fileno()
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return n
            if fd is not None:
                select.select([fd], [], [], min(left, _MAX_IDLE_WAIT))
            else:
                self._rx_event.wait(min(left, _MAX_IDLE_WAIT))
                self._rx_event.clear()
            n = self._progress_locked()
            if n:
                return n

    def progress_nonblocking(self, stop_on: Any = None) -> int:
        """One progress step if the lock is free (busy-polling ``cq.poll`` calls this).

        While an application busy-polls, the progress thread stands back (it stops
        watching the socket for ``_POLL_GRACE`` seconds after the last poll), so the two
        threads do not fight over the GIL on every packet.
        """
        self.last_poll = time.monotonic()
        lock = self.lock
        if not lock.acquire(False):
            # The progress thread holds the lock: give it the GIL now rather than spin
            # for a whole switch interval (5 ms) while it waits for us.
            time.sleep(0)
            return 0
        try:
            n = self._poll_rx_locked(stop_on)
            # New packets: let the application see their completions before the ACKs
            # go out (they leave at the next idle poll, after the application's next
            # post_send, or from the progress thread): the ACK is off the critical path
            # of a request/response exchange (IBA 9.7.5.1.1 lets a responder coalesce).
            self._after_locked(acks=not n)
            return n
        finally:
            lock.release()

    def kick(self) -> None:
        """The application stops busy-polling (it is about to block): the progress thread
        resumes watching the link at once."""
        self.last_poll = 0.0
        self._kick.set()

    def _progress_locked(self) -> int:
        with self.lock:
            n = self._poll_rx_locked()
            self._after_locked()
            return n

    def _on_readable(self) -> None:
        """The link has datagrams (fabric callback). Re-entrant calls are deferred."""
        if self._closed:
            return
        if not self.lock.acquire(False):
            self._pending = True
            self._rx_event.set()
            return
        try:
            # drain the link: the fabric calls back once per delivery batch, which may
            # hold more datagrams than one receive batch
            while self._poll_rx_locked() >= self.batch:
                pass
            self._after_locked()
        finally:
            self.lock.release()
        self._rx_event.set()

    def _after_locked(self, acks: bool = True) -> None:
        """Housekeeping at the end of every locked operation: deferred work, late
        receives, due timers, transmit, virtual-clock timer scheduling.

        ``acks=False`` transmits everything but the coalesced ACKs, which stay pending."""
        port = self.port
        for _ in range(64):
            while self._deferred:
                self._deferred.popleft()()
            if self._pending:
                self._pending = False
                self._poll_rx_locked()
            d = port.next_deadline()
            if d is not None and d <= self.now():
                port.on_timer(self.now())
            if port.tx or (acks and port.ack_pending):
                self._flush_tx_locked(acks)
            if not (self._pending or self._deferred or port.tx or (acks and port.ack_pending)):
                break
        if self._vclock is not None:
            self._schedule_vtimer(port.next_deadline())

    def _schedule_vtimer(self, d: float | None) -> None:
        if d is None:
            return
        at = self._timer_at
        if at is not None and at <= d:
            return
        self._timer_at = d
        self._vclock.call_at(d, self._on_vtimer, d)

    def _on_vtimer(self, when: float) -> None:
        if self._timer_at == when:
            self._timer_at = None
        if self._closed:
            return
        if not self.lock.acquire(False):
            self._pending = True
            return
        try:
            self._after_locked()
        finally:
            self.lock.release()

    # ---- transmit --------------------------------------------------------------------------
    def flush_tx(self) -> int:
        """Send every packet the engine queued; returns how many."""
        with self.lock:
            return self._flush_tx_locked()

    def _ip_of(self, gid: bytes) -> bytes:
        ip = self._gid_ip.get(gid)
        if ip is None:
            ip = gid_to_ip(gid)
            self._gid_ip[bytes(gid)] = ip
        return ip

    def _flush_tx_locked(self, acks: bool = True) -> int:
        port = self.port
        if not (port.tx or (acks and port.ack_pending)):
            return 0
        pkts: list[TxPacket] = port.take_tx(acks)
        link = self.link
        send = link.send
        eff = link.effective_sport
        ip_of = self._ip_of
        dport = self.udp_port
        for p in pkts:
            if p.v1:
                self._send_v1(p)
                continue
            src = ip_of(p.sgid)
            dst = ip_of(p.dgid)
            sport = eff(p.sport)
            icrc = icrc_v2(src, dst, sport, dport, p.parts, p.length)
            send(dst, dport, sport, [*p.parts, icrc], p.tclass, p.hop_limit)
        return len(pkts)

    def _send_v1(self, p: TxPacket) -> None:
        """RoCEv1 (Annex A16): the GRH is always present (A16.3.1), its PayLen counts BTH
        through the ICRC (IBA 8.3.1); the ICRC covers it with TClass, FlowLabel and HopLmt
        masked (roce.md §2, ``wire.roce.icrc_v1``)."""
        send_v1 = getattr(self.link, "send_v1", None)
        if send_v1 is None:  # a GID typed RoCE v1 on a link that cannot carry it
            self.port.counters.link_downed += 1
            return
        grh = build_grh_v1(p.sgid, p.dgid, p.length + 4, p.tclass, p.flow_label, p.hop_limit)
        send_v1(p.dgid, [grh, *p.parts, icrc_v1(grh, p.parts)], p.sl)

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
    def poll_rx(self) -> int:
        """Receive what the link has (without blocking) and feed it to the engine."""
        with self.lock:
            n = self._poll_rx_locked()
            self._after_locked()
            return n

    def _gid_of(self, ip: bytes) -> bytes:
        gid = self._ip_gid.get(ip)
        if gid is None:
            gid = ip_to_gid(ip)
            self._ip_gid[bytes(ip)] = gid
        return gid

    def _poll_rx_locked(self, stop_on: Any = None) -> int:
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
            if self.fatal is not None:
                return 0
            try:
                dgrams = self.link.recv_batch(self.batch)
            except DeviceError as exc:  # the link's daemon is gone (DevdLink)
                self._device_fatal_locked(str(exc))
                return 0
            if not dgrams:
                return 0
        port = self.port
        counters = port.counters
        receive = port.receive
        gid_of = self._gid_of
        metas = self._metas
        now = self.now()
        taken = 0
        for d in dgrams:
            taken += 1
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
            # Only UD (opcodes 0x60-0x7f) places the GRH area in the receive buffer; rxe
            # copies the real IPv4 header, whose ID the ICRC lets us recover.
            if data[0] & 0xE0 == 0x60:
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
            receive(body, meta, now)
            if stop_on and taken < len(dgrams):
                self._backlog = dgrams[taken:]
                break
        return taken

    def _device_fatal_locked(self, why: str) -> None:
        """The device is gone (IBA 11.6.3 "Unaffiliated asynchronous events": Local
        Catastrophic Error; ``IBV_EVENT_DEVICE_FATAL``): every QP to ERR, flushing its work
        requests, the async event raised, the progress thread stopped. Later verbs calls
        raise :class:`DeviceError` with ``why``; destroying objects still works."""
        if self.fatal is not None:
            return
        self.fatal = f"{why}: the device is no longer usable (IBV_EVENT_DEVICE_FATAL)"
        self._stop.set()
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
        if rep is None or self._closed:
            return self.port.counters.as_dict()
        self.report_counters()
        return rep.device_counters()

    # ---- the progress thread ------------------------------------------------------------------
    def _thread_main(self) -> None:
        fd = self.link.fileno()
        wake = self._wake_r
        rlist = [wake] if fd is None else [fd, wake]
        stop = self._stop
        kick = self._kick
        while not stop.is_set() and self.fatal is None:
            if time.monotonic() - self.last_poll < _POLL_GRACE:
                # an application thread is busy-polling and makes progress itself
                kick.wait(_POLL_GRACE)
                kick.clear()
                continue
            try:
                with self.lock:
                    self._poll_rx_locked()
                    self._after_locked()
                    d = self.port.next_deadline()
            except ClosedError:
                return
            wait = _MAX_IDLE_WAIT
            if d is not None:
                wait = min(max(d - self.now(), 0.0), _MAX_IDLE_WAIT)
            if fd is None:
                self._rx_event.wait(wait)
                self._rx_event.clear()
                continue
            try:
                ready, _, _ = select.select(rlist, [], [], wait)
            except (OSError, ValueError):  # descriptor closed under us: shutting down
                return
            if wake in ready:
                try:
                    os.read(wake, 4096)
                except BlockingIOError:
                    pass
            if self._reporter is not None and time.monotonic() >= self._next_report:
                self.report_counters()

    # ---- shutdown -------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        """Closed, or its device failed (objects are then released without the engine)."""
        return self._closed or self.fatal is not None

    def close(self, close_link: bool = True) -> None:
        """Stop the progress thread (joined) and close the link. Idempotent."""
        if self._closed:
            return
        # ACKs coalesced but not yet sent go out now: a peer may be waiting for them.
        if self.lock.acquire(timeout=1.0):
            try:
                self._flush_tx_locked(True)
            except Exception:  # noqa: BLE001 - best effort at shutdown (link may be gone)
                pass
            finally:
                self.lock.release()
        self.report_counters()  # the device keeps this process's totals after it leaves
        self._closed = True
        self._stop.set()
        self._kick.set()
        self._rx_event.set()
        if self._wake_w >= 0:
            try:
                os.write(self._wake_w, b"\0")
            except OSError:
                pass
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=5.0)
        self._thread = None
        # A finalizer may run this from a thread that holds the lock (cyclic GC inside
        # an engine call): never wait for the lock for long.
        if self.lock.acquire(timeout=1.0):
            try:
                while self._deferred:
                    try:
                        self._deferred.popleft()()
                    except Exception:  # noqa: BLE001 - best effort cleanup at shutdown
                        pass
            finally:
                self.lock.release()
        if hasattr(self.link, "on_readable"):
            self.link.on_readable = None
        if close_link:
            self.link.close()
        for fdn in (self._wake_r, self._wake_w):
            if fdn >= 0:
                os.close(fdn)
        self._wake_r = self._wake_w = -1
