"""The TCP runtime of an iWARP device: non-blocking sockets around the sans-I/O engines.

:class:`TcpRuntime` plays the part :class:`~softrdma.drivers.runtime.roce.Runtime` plays for
RoCE (same lock / ``call`` / ``post_send`` / ``progress`` surface, so the verbs layer
needs no iWARP-specific code). Like it, it composes a
:class:`~softrdma.drivers.runtime.progress.ProgressCore` (the lock around every engine call,
deferred calls, the progress thread or manual progress, shutdown) and adds the socket
I/O of each connection (design.md, "Sans-I/O engines"):

* receive: ``recv_into`` one preallocated buffer (:data:`_RX_BUF`, 4 MiB: fewer system
  calls and fewer FPDUs cut by a read's end than with 1 MiB, about 15 % less receiver
  CPU per byte in ``bench/iwarp_write_bw.py``) handed to
  :meth:`~.engine.IwarpConn.receive`, which places each segment's payload with one
  ``memoryview`` slice assignment (runs of whole RDMA Write FPDUs take the fused path of
  :func:`~softrdma.iwarp.fast_path.write_run`: CRC over each contiguous FPDU, checks,
  one copy). ``SOFTRDMA_IWARP_DIRECT=1`` receives the payload straight into the MR
  (:meth:`~.engine.IwarpConn.rx_target`, ``recvmsg_into``): no copy, but a system call
  per FPDU, 2x the receiver's CPU per byte in bench/iwarp_write_bw.py, hence off;
* transmit: ``sendmsg`` with the engine's buffer list (headers, memoryview slices of the
  MR, pad + CRC), partial sends kept as sliced views, never joined; up to 1 MiB of whole
  FPDUs at a time (:data:`_TX_CHUNK`; the plain TCP baseline's ``sendall`` size);
* teardown: once the engine sets ``want_close`` and its bytes are out, ``shutdown`` the
  write side (the Terminate reaches the peer before the FIN, RFC 5040 §6.2.1 "graceful
  LLP teardown"), drain the read side until EOF or :data:`LINGER` seconds, close. A
  send that fails (the peer reset the connection) first reads what the peer sent before
  the reset, which waits in our socket, and hands it to the engine, in order; then the
  LLP is down (:meth:`TcpRuntime._tx`).

Connection setup (:mod:`softrdma.drivers.cm.iwconnect`) waits on :attr:`TcpRuntime.changed`, a
condition on the engine lock notified after every round of socket I/O, and hands listening
sockets to :meth:`TcpRuntime.watch` (accepted by whichever thread makes progress). Its MPA
Request, Reply and FIN go through :meth:`TcpRuntime.call_local`: a peer on this host has
them once the send returns, so the caller's thread serves its socket (accept, parse, FIN)
and delivers the events before it waits for them, and the progress thread, which would
find the sockets served, stands back (issue 26: ~12 context switches a connection -> <1).

Sockets get ``TCP_NODELAY`` (siw: ``siw_tcp_nagle = false``) and keep the kernel's
send-buffer autotuning, as the plain TCP baseline of ``bench/iwarp_write_bw.py`` does: a
fixed 4 MiB ``SO_SNDBUF`` doubles the bytes in flight and cost 15-25 % more CPU per byte
on each side there (cache misses). ``SOFTRDMA_IWARP_SNDBUF``: :func:`sndbuf_setting`.
"""

from __future__ import annotations

import os
import selectors
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ...errors import ClosedError, InvalidArgument
from ...iwarp.engine import IwarpConn
from ...iwarp.events import ConnEvent
from ...iwarp.mpa_stream import FPDU_STALL_S
from ...iwarp.qp import IwarpDevice
from ..capture.tap_stream import StreamTap
from ..host.port_totals import PUBLISH_INTERVAL, publish, retire
from .progress import ProgressCore, WakePipe, check_mode
from .tcp_events import ConnEvents
from .tcp_io import Sock as _Sock
from .tcp_io import Watch as _Watch
from .tcp_io import advance, tcp_mss

__all__ = ["TcpRuntime", "LINGER", "tcp_mss", "sndbuf_setting", "sock_buf_wanted"]

LINGER = 2.0  # seconds a closing socket waits for the peer's FIN
DIRECT = os.environ.get("SOFTRDMA_IWARP_DIRECT", "0") == "1"
_WMEM_MAX = "/proc/sys/net/core/wmem_max"
_TCP_WMEM = "/proc/sys/net/ipv4/tcp_wmem"
_RX_BUF = int(os.environ.get("SOFTRDMA_IWARP_RXBUF", str(1 << 22)))
#: octets of whole FPDUs pulled per ``sendmsg`` (at least one FPDU); 1 MiB against 64 KiB,
#: alternated: 5-12 % less CPU per byte a side, CRC on and off (docs/design.md, issue 26)
_TX_CHUNK = 1 << 20
_RX_BUDGET = 1 << 23
_MAX_IDLE_WAIT = 0.05
_SETTLE_ROUNDS = 4  # rounds of TcpRuntime.settle (a loopback connect takes two)
#: a send to a reset connection: EPIPE, not SIGPIPE, which ends a C program (siw raises none)
_NOSIGNAL = socket.MSG_NOSIGNAL


def _sysctl_ints(path: str) -> list[int]:
    try:
        with open(path) as f:
            return [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        return []


def sock_buf_wanted() -> int:
    """The send buffer asked for by ``SOFTRDMA_IWARP_SNDBUF`` (octets; 0, the default:
    the kernel's autotuning, see the module docstring)."""
    raw = os.environ.get("SOFTRDMA_IWARP_SNDBUF", "0")
    try:
        return max(int(raw), 0)
    except ValueError:
        raise InvalidArgument("SOFTRDMA_IWARP_SNDBUF",
                              f"{raw!r} is not a number of octets") from None


def sndbuf_setting(want: int | None = None) -> int:
    """The ``SO_SNDBUF`` to set on a connection, or 0 to leave the kernel's autotuning;
    ``want`` defaults to :func:`sock_buf_wanted`.

    Linux caps ``SO_SNDBUF`` at ``net.core.wmem_max`` (doubled) and a socket that sets it
    loses autotuning (up to ``net.ipv4.tcp_wmem[2]``): it is set only where the capped
    value beats autotuning's maximum (not with the default 208 KiB ``wmem_max``)."""
    if want is None:
        want = sock_buf_wanted()
    if want <= 0:
        return 0
    wmem_max = _sysctl_ints(_WMEM_MAX)
    tcp_wmem = _sysctl_ints(_TCP_WMEM)
    if not wmem_max or len(tcp_wmem) != 3:
        return want
    return want if 2 * min(want, wmem_max[0]) > tcp_wmem[2] else 0


class TcpRuntime:
    """Drives an :class:`~softrdma.iwarp.qp.IwarpDevice` and its TCP connections (see the
    module docstring)."""

    #: an iWARP device has no datagram link (the verbs layer's multicast hooks look here)
    link: None = None
    tap: StreamTap | None = None  # capture / packet trace (drivers.capture.tap_stream), if asked
    #: seconds a partial FPDU may stall before its connection is ended (mpa_stream.StallWatch)
    fpdu_stall_s = FPDU_STALL_S

    def __init__(self, dev: IwarpDevice, *, mode: str = "thread",
                 clock: Callable[[], float] | None = None) -> None:
        threaded = check_mode(mode) == "thread"
        self.port = dev
        self.dev = dev
        self.threaded = threaded
        self.now: Callable[[], float] = clock if clock is not None else time.monotonic
        core = ProgressCore(threaded=threaded, now=self.now, after=self._after_locked)
        self.core, self.lock = core, core.lock
        self.call, self.call_now, self.defer, self.kick = (core.call, core.call_now,
                                                           core.defer, core.kick)
        self.about_to_block, self.serving = core.about_to_block, core.serving
        #: notified (under the lock) after every round of socket I/O and engine calls:
        #: connection setup waits on it for a state change
        self.changed = threading.Condition(core.lock)
        # the layer above subscribes to a connection's typed events (iwarp.events); they
        # are taken from the connection under the lock and delivered outside it
        self._events = ConnEvents()
        self._waiting = 0  # threads waiting on ``changed``
        self._deferred = core.deferred
        self._socks: dict[int, _Sock] = {}
        self._by_conn: dict[int, _Sock] = {}
        self._sel = selectors.DefaultSelector()
        self._sndbuf = sndbuf_setting()
        self._rxbuf = bytearray(_RX_BUF)
        self._rxmv = memoryview(self._rxbuf)
        self._pipe = WakePipe()
        self._sel.register(self._pipe.r, selectors.EVENT_READ, None)
        #: the device's name, once the layer above sets it: this process's counters are
        #: then published for ``softrdma stats`` (:mod:`.port_totals`)
        self.counters_name: str | None = None
        self._published: dict[str, int] = {}
        self._next_publish = 0.0
        if threaded:
            core.on_wake(self._pipe.wake)
        core.start(self._thread_step, "softrdma-iwarp")

    @property
    def fatal(self) -> str | None:
        """Why the device failed, else None (a TCP device does not fail as a whole)."""
        return self.core.fatal

    # ---- engine access -------------------------------------------------------------------
    def _after_locked(self, acks: bool = True) -> None:
        """The housekeeping after an engine call (there are no coalesced ACKs on TCP)."""
        self._housekeep()

    def post_send(self, qp: Any, wqes: Sequence[Any]) -> None:
        """Post and transmit from the caller's thread (the latency path)."""
        with self.lock:
            try:
                now = self.now()
                for w in wqes:
                    qp.post_send(w, now)
            finally:
                conn = getattr(qp, "conn", None)
                s = self._by_conn.get(id(conn)) if conn is not None else None
                # with bytes still pending the socket was full: whoever waits for
                # EVENT_WRITE pulls the new work request, no EAGAIN round here
                if s is not None and not s.pending:
                    self._tx(s)
                if self._deferred:
                    self._housekeep()

    def call_local(self, fn: Callable[..., Any], *args: object) -> Any:
        """:meth:`call`, then, still under the lock, serve the sockets ready now (at most
        :data:`_SETTLE_ROUNDS` rounds: a local peer's, see the module docstring); the
        events are delivered outside the lock."""
        core = self.core
        if core.closed or core.fatal is not None:
            raise core.gone()
        try:
            with self.lock:
                try:
                    return fn(*args)
                finally:
                    self._housekeep()
                    for _ in range(_SETTLE_ROUNDS):  # the wake pipe is the thread's
                        ready = [r for r in self._ready(0.0) if r[0] is not None]
                        if not ready:
                            break
                        core.last_poll = time.monotonic()  # the progress thread stands back
                        self._service(ready)
        finally:
            self._events.deliver()

    def device_counters(self) -> dict[str, int]:
        """This process's port counters of the device (``softrdma stats`` adds up every
        process's, :mod:`.port_totals`)."""
        return self.dev.counters.as_dict()

    def publish_counters(self) -> None:
        """Publish this process's counters if they changed (best effort)."""
        name = self.counters_name
        if name is None:
            return
        self._next_publish = time.monotonic() + PUBLISH_INTERVAL
        values = self.dev.counters.as_dict()
        if values != self._published:
            self._published = values
            publish(name, values)

    def wait_changed(self, timeout: float | None) -> None:
        """Under the lock: wait up to ``timeout`` s (None: no limit) for the next round of
        I/O (the lock is released meanwhile). In manual mode nothing else makes progress,
        so this makes it (waiting for the sockets)."""
        if timeout is not None and timeout <= 0:
            return
        if not self.threaded:
            try:  # release inside: after a Ctrl-C the lock is retaken (locks.py)
                self.lock.release()
                self.progress(_MAX_IDLE_WAIT if timeout is None else min(timeout, _MAX_IDLE_WAIT))
            finally:
                self.lock.acquire()
            return
        self._waiting += 1
        try:
            self.changed.wait(timeout)
        finally:
            self._waiting -= 1

    def watch(self, sock: socket.socket, on_ready: Callable[[], None]) -> None:
        """Call ``on_ready()`` under the lock whenever the listening socket ``sock`` is
        readable (until :meth:`unwatch`). Call under the lock."""
        if self.core.closed:
            raise ClosedError("the device runtime is closed")
        sock.setblocking(False)
        self._sel.register(sock.fileno(), selectors.EVENT_READ, _Watch(sock, on_ready))
        self._pipe.wake()

    def unwatch(self, sock: socket.socket) -> None:
        """Stop watching ``sock`` (call under the lock, before closing it)."""
        try:
            self._sel.unregister(sock.fileno())
        except (KeyError, ValueError, OSError):
            pass

    def attach(self, conn: IwarpConn, sock: socket.socket) -> None:
        """Drive ``conn`` over ``sock`` (connected; made non-blocking here). Call under
        the lock or before any other thread uses the runtime."""
        if self.core.closed:
            raise ClosedError("the device runtime is closed")
        sock.setblocking(False)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._sndbuf:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._sndbuf)
        except OSError:
            pass
        s = _Sock(sock, conn)
        self._socks[s.fd] = s
        self._by_conn[id(conn)] = s
        self._sel.register(s.fd, selectors.EVENT_READ, s)
        self._tx(s)
        self._wake()

    def _wake(self) -> None:
        if self.threaded:
            self._pipe.wake()

    # ---- progress --------------------------------------------------------------------------
    def progress(self, timeout: float = 0.0) -> int:
        """Socket I/O and housekeeping; wait up to ``timeout`` s for a socket to be ready.
        Returns the number of bytes received."""
        if self.core.closed:
            raise ClosedError("the device runtime is closed")
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            n = self._poll(max(left, 0.0) if timeout > 0 else 0.0)
            if n or left <= 0:
                return n

    def rx_pending(self) -> bool:
        """Never: a step serves its ready connections whole (``stop_on`` is not used)."""
        return False

    def ack_awaited(self) -> bool:
        """Never: an iWARP SEND completes once TCP took it (RFC 5040 §7.1), no ACK."""
        return False

    def progress_nonblocking(self, stop_on: Any = None, taken: bool = False,
                             polls: int = 1) -> int:
        """One non-blocking step from a thread that busy-polls a CQ (the progress thread
        stands back, as the RoCE runtime's; ``taken``: its pacing, never a sleep here):
        up to ``polls`` empty polls in a row (a step from C), or until one took input."""
        n = 0
        for _ in range(polls):
            if not self.core.try_lock():
                return 0
            try:
                n = self._service(self._ready(0.0))
            finally:
                self.lock.release()
            self.deliver_events()
            if n or stop_on:
                break
        return n

    def _poll(self, wait: float) -> int:
        ready = self._ready(wait)
        with self.lock:
            n = self._service(ready)
        self.deliver_events()
        return n

    def _ready(self, wait: float) -> list[tuple[Any, int]]:
        try:
            return [(k.data, ev) for k, ev in self._sel.select(wait)]
        except (OSError, ValueError):
            return []

    def _service(self, ready: list[tuple[Any, int]]) -> int:
        """Under the lock: receive from ready sockets, transmit, housekeeping."""
        n = 0
        now = self.now()
        for s, ev in ready:
            if s is None:
                self._pipe.drain()
                continue
            if isinstance(s, _Watch):
                s.on_ready()
                continue
            if s.done:
                continue
            if ev & selectors.EVENT_READ:
                n += self._rx(s, now)
            if ev & selectors.EVENT_WRITE and not s.done:
                self._tx(s)
        self._housekeep()
        return n

    def housekeep(self) -> None:
        """Under the lock: deferred calls, transmit, lingering closes, wake the waiters."""
        self._housekeep()

    def _housekeep(self) -> None:
        deferred = self._deferred
        while deferred:
            deferred.popleft()()
        now = time.monotonic()
        for s in list(self._socks.values()):
            if not s.done and not s.closing:
                stalled = s.stall.check(s.conn.rdmap.rx, now, self.fpdu_stall_s)
                if stalled is not None:
                    s.conn.fail(stalled)  # Terminate, then close (RFC 5040 §6.2.1)
            if not s.done and not s.pending:  # pending: EVENT_WRITE resumes it
                self._tx(s)
            if s.closing and not s.done and now >= s.close_at:
                self._drop(s)
        if self._events.listeners:
            self._events.collect()
        if self._waiting:
            self.changed.notify_all()

    # ---- typed connection events for the layer above ---------------------------------------
    def listen_events(self, conn: IwarpConn, fn: Callable[[ConnEvent], None]) -> None:
        """Deliver ``conn``'s typed events (:mod:`softrdma.iwarp.events`) to ``fn``, events
        already queued on it first, from the thread that makes progress and outside the
        runtime's lock (so ``fn`` may create or destroy verbs objects; :mod:`.tcp_events`)."""
        with self.lock:
            self._events.listen(conn, fn)
            self._events.collect()
        self._events.deliver()

    def listen_events_locked(self, conn: IwarpConn, fn: Callable[[ConnEvent], None]) -> None:
        """:meth:`listen_events` from under the lock (a :meth:`watch` callback that just
        attached ``conn``): its events are taken at the end of this round."""
        self._events.listen(conn, fn)

    def unlisten_events(self, conn: IwarpConn) -> None:
        """Stop delivering ``conn``'s events (those already taken are still delivered)."""
        with self.lock:
            self._events.unlisten(conn)

    def deliver_events(self) -> None:
        """Outside the lock: run the listeners on the events taken so far, in order."""
        self._events.deliver()

    # ---- socket I/O ------------------------------------------------------------------------
    def _rx(self, s: _Sock, now: float, drain: bool = False) -> int:
        """Receive from ``s`` up to :data:`_RX_BUDGET` octets, or (``drain``) all that
        waits; at EOF or a reset, the engine's ``on_eof``."""
        conn = s.conn
        sock = s.sock
        total = 0
        budget = 1 << 62 if drain else _RX_BUDGET
        buf = self._rxbuf
        mv = self._rxmv
        while total < budget and not s.done:
            try:
                tgt = None if s.closing or not DIRECT else conn.rx_target()
                if tgt is not None:
                    # the payload straight into the MR, the trailer and the next headers
                    # into our buffer: one system call per FPDU, no payload copy here
                    la = conn.rx_lookahead()
                    if la:
                        n = sock.recvmsg_into([tgt, mv[:la]])[0]
                    else:
                        n = sock.recv_into(tgt)
                    t = len(tgt)
                    if self.tap is not None and n:  # capture / trace (drivers.capture.tap_stream)
                        self.tap.rx(sock, [tgt[:min(n, t)], mv[:max(0, n - t)]])
                    if n:
                        conn.rx_placed(n if n < t else t)
                        if n > t:
                            conn.receive(mv[:n - t], now)
                else:
                    want = conn.rx_want() if DIRECT else 0
                    n = sock.recv_into(buf, want if 0 < want < len(buf) else len(buf))
                    if self.tap is not None and n:  # capture / trace (drivers.capture.tap_stream)
                        self.tap.rx(sock, [mv[:n]])
                    if n and not s.closing:
                        conn.receive(mv[:n], now)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                n = 0
            if n == 0:
                s.eof = True
                conn.on_eof()
                self._tx(s)
                if s.closing:
                    self._drop(s)
                break
            total += n
        return total

    def _tx(self, s: _Sock) -> None:
        if s.tx_dead:
            return
        conn = s.conn
        sock = s.sock
        mss_check = True  # the MSS once per call (a system call), not per 64 KiB
        while not s.done and not s.closing:
            if s.pending:
                bufs = s.pending
            elif ((hold := conn.next_deadline()) is not None and not conn.want_close
                  and (now := self.now()) >= hold):
                # held FPDUs (FIRST_FPDU_HOLD_S, RESPONDER_HOLD_S) go once the hold is
                # over: housekeeping, at least every _MAX_IDLE_WAIT, comes here; until
                # then only MPA frames and a Terminate leave (fpdus below)
                conn.on_timer(now)
                continue
            elif conn.tx_pending():
                if mss_check and conn.established:
                    mss_check = False
                    if (mss := tcp_mss(sock)) != conn.mss:
                        conn.update_mss(mss)
                # ``hold``: the deadline read just above (no hold, or not reached yet)
                bufs = conn.take_output(_TX_CHUNK, 512, hold is None or conn.want_close)
                if not bufs:
                    break
            else:
                break
            try:
                n = sock.sendmsg(bufs, (), _NOSIGNAL)
            except (BlockingIOError, InterruptedError):
                s.pending = bufs
                break
            except OSError:
                # the peer reset the connection: what it sent before the reset still
                # waits in our socket and is taken first, in order, as by siw, whose
                # receive path runs as the bytes arrive (a credit update that rsockets
                # sent after the peer's last data and close dropped that data: rstream
                # over siw hung); then the LLP is down (RFC 5040 §6.2)
                s.pending = []
                s.tx_dead = True
                self._rx(s, self.now(), drain=True)
                if not s.done:
                    s.eof = True
                    conn.on_eof()
                    self._drop(s)
                return
            conn.tx_sent(n)
            if self.tap is not None:  # capture / packet trace (drivers.capture.tap_stream)
                self.tap.tx(sock, bufs, n)
            if n != sum(map(len, bufs)):  # a partial send: keep the rest as views
                s.pending = advance(bufs, n)
                break
            s.pending = []
        if s.done:
            return
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if s.pending else 0)
        if events != s.events:
            s.events = events
            try:
                self._sel.modify(s.fd, events, s)
            except (KeyError, ValueError, OSError):
                pass
        if conn.want_close and not s.pending and not s.closing and not conn.tx_pending():
            # everything (the Terminate included) is out: FIN, then wait for the peer's
            s.closing = True
            s.close_at = time.monotonic() + LINGER
            try:
                s.sock.shutdown(socket.SHUT_WR)
            except OSError:
                self._drop(s)
                return
            if s.eof:
                self._drop(s)

    def _drop(self, s: _Sock) -> None:
        if s.done:
            return
        s.done = True
        try:
            self._sel.unregister(s.fd)
        except (KeyError, ValueError, OSError):
            pass
        self._socks.pop(s.fd, None)
        self._by_conn.pop(id(s.conn), None)
        try:
            s.sock.close()
        except OSError:
            pass

    def sockets(self) -> int:
        """Connections still open (for tests and diagnostics)."""
        return len(self._socks)

    # ---- the progress thread -------------------------------------------------------------------
    def _thread_step(self) -> bool:
        """One round of the progress thread: wait for the sockets, then serve them; after
        a stand-back that ran out, a look first: input unread through it (``took``)."""
        core = self.core
        ready: list[tuple[Any, int]] = []
        if core.resumed:
            ready = self._ready(0.0)
            core.took(sum(1 for s, ev in ready if type(s) is _Sock and ev & selectors.EVENT_READ))
        if not ready:
            ready = self._ready(_MAX_IDLE_WAIT)
        if core.stop.is_set():
            return False
        with self.lock:
            self._service(ready)
        self.deliver_events()
        if self.counters_name is not None and time.monotonic() >= self._next_publish:
            self.publish_counters()
        return True

    # ---- shutdown ---------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        """Closed (objects are then released without the engine)."""
        return self.core.closed

    def close(self, close_link: bool = True) -> None:
        """Stop the progress thread (joined), close every connection and socket.
        Idempotent; ``close_link`` is accepted for the RoCE runtime's signature."""
        core = self.core
        if core.closed:
            return
        core.close(self._close_sockets)
        try:
            self._sel.close()
        except OSError:
            pass
        self._pipe.close()
        if self.counters_name is not None:  # the device keeps this process's totals
            retire(self.counters_name, self.dev.counters.as_dict())

    def _close_sockets(self) -> None:
        for s in list(self._socks.values()):
            s.conn.close()
            self._drop(s)
        if self._waiting:
            self.changed.notify_all()
