"""The TCP driver of an iWARP device: non-blocking sockets around the sans-I/O engines.

:class:`IwarpRuntime` plays the part :class:`~softrdma.drivers.runtime.Runtime` plays for
RoCE (same lock / ``call`` / ``post_send`` / ``progress`` surface, so the verbs layer
needs no iWARP-specific code): one lock around every engine call, a progress thread
(or manual progress), and the socket I/O of each connection (design.md, "Sans-I/O
engines"):

* receive: ``recv_into`` one preallocated buffer (:data:`_RX_BUF`, 1 MiB) handed to
  :meth:`~.engine.IwarpConn.receive`, which places each segment's payload with one
  ``memoryview`` slice assignment (whole RDMA Write FPDUs take a fast path: CRC over the
  contiguous FPDU, checks, one copy). With ``SOFTRDMA_IWARP_DIRECT=1`` the payload is
  instead received straight into the registered memory the engine names
  (:meth:`~.engine.IwarpConn.rx_target`) by ``recvmsg_into([MR slice, lookahead])``, the
  pad, CRC and next headers landing in the lookahead buffer: no copy in Python, but one
  system call per FPDU, which measured slower than the copy on the 2-CPU VMs this was
  tuned on (bench/iwarp_write_bw.py), hence off by default;
* transmit: ``sendmsg`` with the engine's buffer list (headers, memoryview slices of the
  MR, pad + CRC), partial sends kept as sliced views, never joined;
* teardown: once the engine sets ``want_close`` and its bytes are out, ``shutdown`` the
  write side (the Terminate reaches the peer before the FIN, RFC 5040 §6.2.1 "graceful
  LLP teardown"), drain the read side until EOF or :data:`LINGER` seconds, close.

Sockets get ``TCP_NODELAY`` (siw: ``siw_tcp_nagle = false``) and a 4 MiB send buffer
(``SOFTRDMA_IWARP_SNDBUF``; 0 keeps the kernel's autotuning), so one ``sendmsg`` takes a
whole megabyte-sized message without partial sends.
"""

from __future__ import annotations

import os
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from ..drivers.runtime import Runtime
from ..errors import ClosedError, InvalidArgument
from .engine import IwarpConn
from .qp import IwarpDevice

__all__ = ["IwarpRuntime", "LINGER", "tcp_mss"]

LINGER = 2.0  # seconds a closing socket waits for the peer's FIN
DIRECT = os.environ.get("SOFTRDMA_IWARP_DIRECT", "0") == "1"
SOCK_BUF = int(os.environ.get("SOFTRDMA_IWARP_SNDBUF", str(1 << 22)))
_RX_BUF = int(os.environ.get("SOFTRDMA_IWARP_RXBUF", str(1 << 20)))
_TX_CHUNK = 1 << 21
_RX_BUDGET = 1 << 23
_MAX_IDLE_WAIT = 0.05
_POLL_GRACE = 0.005  # the progress thread stands back this long after an application poll


def tcp_mss(sock: socket.socket) -> int:
    """The connection's TCP MSS (``TCP_MAXSEG``), the MULPDU basis (RFC 5044 §4.2)."""
    try:
        mss = int(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG))
    except OSError:
        mss = 0
    return mss if mss >= 64 else 1460


class _NullLink:
    """The runtime's ``link``: iWARP has no datagram link (only the verbs layer's
    multicast hooks look at it, and iWARP has no multicast)."""

    local_ips: tuple[bytes, ...] = ()

    def effective_sport(self, requested: int) -> int:
        return requested

    def send(self, dst_ip: bytes, dport: int, sport: int, parts: Sequence[Any],
             tos: int = 0, ttl: int = 64) -> None:
        raise ClosedError("an iWARP device has no datagram link")

    def recv_batch(self, max_n: int = 64) -> list[Any]:
        return []

    def fileno(self) -> int | None:
        return None

    def close(self) -> None:
        pass


class _Sock:
    __slots__ = ("sock", "conn", "pending", "closing", "close_at", "fd", "events", "done", "eof")

    def __init__(self, sock: socket.socket, conn: IwarpConn) -> None:
        self.sock = sock
        self.conn = conn
        self.pending: list[Any] = []
        self.closing = False
        self.close_at = 0.0
        self.fd = sock.fileno()
        self.events = selectors.EVENT_READ
        self.done = False
        self.eof = False


def _advance(bufs: list[Any], n: int) -> list[Any]:
    """What is left of ``bufs`` after the first ``n`` bytes were sent (views, no copies;
    the engine's buffers are bytes or byte-format memoryviews, so ``len`` is their size)."""
    i = 0
    for b in bufs:
        ln = len(b)
        if n < ln:
            rest = [memoryview(b)[n:]]
            rest.extend(bufs[i + 1:])
            return rest
        n -= ln
        i += 1
    return []


class IwarpRuntime(Runtime):
    """Drives an :class:`~.qp.IwarpDevice` and its TCP connections (see the module doc)."""

    def __init__(self, dev: IwarpDevice, *, mode: str = "thread",
                 clock: Callable[[], float] | None = None) -> None:
        # Runtime.__init__ binds a datagram link; this runtime owns sockets instead.
        if mode not in ("thread", "manual"):
            raise InvalidArgument("progress", f"must be 'thread' or 'manual', got {mode!r}")
        self.port = dev
        self.dev = dev
        self.link = _NullLink()
        self.mode = mode
        self.threaded = mode == "thread"
        self.lock = threading.Lock()
        self.now: Callable[[], float] = clock if clock is not None else time.monotonic
        self._deferred: deque[Callable[[], None]] = deque()
        self._closed = False
        self._socks: dict[int, _Sock] = {}
        self._by_conn: dict[int, _Sock] = {}
        self._sel = selectors.DefaultSelector()
        self._rxbuf = bytearray(_RX_BUF)
        self._rxmv = memoryview(self._rxbuf)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._stop = threading.Event()
        self.last_poll = 0.0
        self._kick = threading.Event()
        self._thread: threading.Thread | None = None
        if self.threaded:
            self._thread = threading.Thread(target=self._thread_main, name="softrdma-iwarp",
                                            daemon=True)
            self._thread.start()

    # ---- engine access -------------------------------------------------------------------
    # call / call_now / defer are Runtime's; what they run after an engine call is this
    # runtime's housekeeping (there are no coalesced ACKs on TCP).
    def _after_locked(self, acks: bool = True) -> None:
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
                if s is not None:
                    self._tx(s)
                if self._deferred:
                    self._housekeep()

    def attach(self, conn: IwarpConn, sock: socket.socket) -> None:
        """Drive ``conn`` over ``sock`` (connected; made non-blocking here). Call under
        the lock or before any other thread uses the runtime."""
        if self._closed:
            raise ClosedError("the device runtime is closed")
        sock.setblocking(False)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if SOCK_BUF:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCK_BUF)
        except OSError:
            pass
        s = _Sock(sock, conn)
        self._socks[s.fd] = s
        self._by_conn[id(conn)] = s
        self._sel.register(s.fd, selectors.EVENT_READ, s)
        self._tx(s)
        self._wake()

    def kick(self) -> None:
        """The application is about to block: make the progress thread look now."""
        self.last_poll = 0.0
        self._kick.set()
        self._wake()

    def _wake(self) -> None:
        if self.threaded:
            try:
                os.write(self._wake_w, b"\0")
            except OSError:
                pass

    # ---- progress --------------------------------------------------------------------------
    def progress(self, timeout: float = 0.0) -> int:
        if self._closed:
            raise ClosedError("the device runtime is closed")
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            n = self._poll(max(left, 0.0) if timeout > 0 else 0.0)
            if n or left <= 0:
                return n

    def progress_nonblocking(self, stop_on: Any = None) -> int:
        """One non-blocking step from an application thread that busy-polls a CQ; while
        it does, the progress thread stands back (as the RoCE runtime does), so the two
        do not fight over the lock and the GIL on the latency path."""
        self.last_poll = time.monotonic()
        if not self.lock.acquire(False):
            time.sleep(0)
            return 0
        try:
            return self._service(self._ready(0.0))
        finally:
            self.lock.release()

    def _poll(self, wait: float) -> int:
        ready = self._ready(wait)
        with self.lock:
            return self._service(ready)

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
                try:
                    os.read(self._wake_r, 4096)
                except OSError:
                    pass
                continue
            if s.done:
                continue
            if ev & selectors.EVENT_READ:
                n += self._rx(s, now)
            if ev & selectors.EVENT_WRITE and not s.done:
                self._tx(s)
        self._housekeep()
        return n

    def _housekeep(self) -> None:
        while self._deferred:
            self._deferred.popleft()()
        now = time.monotonic()
        for s in list(self._socks.values()):
            if not s.done and not s.pending:  # pending: EVENT_WRITE resumes it
                self._tx(s)
            if s.closing and not s.done and now >= s.close_at:
                self._drop(s)

    # ---- socket I/O ------------------------------------------------------------------------
    def _rx(self, s: _Sock, now: float) -> int:
        conn = s.conn
        sock = s.sock
        total = 0
        buf = self._rxbuf
        mv = self._rxmv
        while total < _RX_BUDGET and not s.done:
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
                    if n:
                        conn.rx_placed(n if n < t else t)
                        if n > t:
                            conn.receive(mv[:n - t], now)
                else:
                    want = conn.rx_want() if DIRECT else 0
                    n = sock.recv_into(buf, want if 0 < want < len(buf) else len(buf))
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
        conn = s.conn
        sock = s.sock
        while not s.done and not s.closing:
            if s.pending:
                bufs = s.pending
            elif conn.tx_hold_until and not conn.want_close:
                # the initiator's first FPDU waits (FIRST_FPDU_HOLD_S); housekeeping, at
                # least every _MAX_IDLE_WAIT, sends it once the hold is over
                if self.now() < conn.tx_hold_until:
                    break
                conn.tx_hold_until = 0.0
                continue
            elif conn.tx_pending():
                if conn.established:
                    mss = tcp_mss(sock)
                    if mss != conn.mss:
                        conn.update_mss(mss)
                bufs = conn.pull_tx(_TX_CHUNK, 512)
                if not bufs:
                    break
            else:
                break
            try:
                n = sock.sendmsg(bufs)
            except (BlockingIOError, InterruptedError):
                s.pending = bufs
                break
            except OSError:
                s.pending = []
                s.eof = True
                conn.on_eof()
                self._drop(s)
                return
            conn.tx_sent(n)
            s.pending = _advance(bufs, n)
            if s.pending:
                break
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
    def _thread_main(self) -> None:
        stop = self._stop
        kick = self._kick
        while not stop.is_set():
            if time.monotonic() - self.last_poll < _POLL_GRACE:
                kick.wait(_POLL_GRACE)  # an application thread polls and progresses
                kick.clear()
                continue
            ready = self._ready(_MAX_IDLE_WAIT)
            if stop.is_set():
                return
            try:
                with self.lock:
                    self._service(ready)
            except ClosedError:
                return

    # ---- shutdown ---------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    def close(self, close_link: bool = True) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._kick.set()
        self._wake()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=5.0)
        self._thread = None
        if self.lock.acquire(timeout=1.0):
            try:
                while self._deferred:
                    try:
                        self._deferred.popleft()()
                    except Exception:  # noqa: BLE001 - best effort cleanup at shutdown
                        pass
                for s in list(self._socks.values()):
                    s.conn.close()
                    self._drop(s)
            finally:
                self.lock.release()
        try:
            self._sel.close()
        except OSError:
            pass
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
