"""Connecting iWARP QPs: TCP connect/accept, the MPA exchange, then RDMA mode.

This is the iWARP side of connection management, beside rdma_cm (:mod:`softrdma.cm.rdma_cm` uses
it for iWARP devices); the MPA rules themselves are :mod:`softrdma.iwarp.mpa_setup` and
the byte-level exchange is the engine's. Waiting is event-driven: a caller waits on the
device's :class:`~softrdma.drivers.runtime.tcp.TcpRuntime` condition
(:meth:`~softrdma.drivers.runtime.tcp.TcpRuntime.wait_changed`), notified after every
round of socket I/O, and a listener's socket is watched by the runtime, which accepts new
connections as they arrive.

The plain iWARP connection setup (RFC 5044 §7.1, RFC 6581; what siw's iWARP CM does
under rdma_cm, without the IP-addressed CM API, which is a separate layer):

* :func:`connect` (active side): TCP connect, MPA Request carrying ``private_data``,
  wait for the Reply; the QP is in RTS when it returns. A reject raises
  :class:`~softrdma.iwarp.mpa_setup.ConnectionRejected` (with the responder's private data).
* :func:`listen` (passive side) returns a :class:`Listener`;
  :meth:`Listener.get_request` accepts TCP connections, lets each negotiate MPA
  concurrently with its own timer, and returns the first parsed MPA Request (a peer that
  sends garbage gets its Terminate and is dropped; one that stays silent is closed when
  its timer expires), giving a :class:`ConnRequest` to :meth:`~ConnRequest.accept` on a QP
  (MPA Reply, QP to RTS) or :meth:`~ConnRequest.reject`. :meth:`Listener.accept` does
  both steps.

Without a waiting thread (issue 26; the rdma_cm layer's way): :func:`start_connect`
(:mod:`.iwconnecting`) and a :class:`Listener` with ``on_request`` are driven by the
connections' typed events, their MPA timers by :data:`timers`.

``private_data`` is the user part: with MPA revision 2 the RFC 6581 IRD/ORD block goes in
front of it on the wire and is removed on receipt (as siw does for rdma_cm users).
"""

from __future__ import annotations

import errno
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from ...errors import InvalidArgument, StateError
from ...iwarp.engine import ConnState, IwarpConn
from ...iwarp.events import ConnEvent, MpaRequestReceived
from ...iwarp.mpa_setup import ConnectionRejected, MpaConfig, with_device_crc
from ...iwarp.qp import INIT, RESET
from ...wire.mpa import MpaRequest
from ..runtime.tcp import TcpRuntime, tcp_mss
from .deadlines import Deadline
from .iwconnecting import (
    ConnectError,
    Connecting,
    Connection,
    _begin,
    _check_idle,
    _device_crc,
    _parts,
    _tcp_failed,
    start_connect,
    timers,
)

__all__ = ["connect", "start_connect", "Connecting", "listen", "Listener", "ConnRequest",
           "Connection", "ConnectError", "ConnectionRejected", "MpaConfig", "timers"]

DEFAULT_TIMEOUT = 10.0
MPA_REQUEST_TIMEOUT = 10.0  # s a new connection has to send its MPA Request (siw MPAREQ_TIMEOUT)
MAX_PENDING = 1024  # connections negotiating MPA at once per listener; beyond: oldest closed
_MIN_WAIT = 0.001  # s: an MPA timer just due is looked at again after this


@dataclass(eq=False, slots=True)
class _Pending:
    """An accepted TCP connection negotiating MPA (waiting for its Request)."""

    conn: IwarpConn
    peer: Any
    local: Any
    deadline: float
    timer: Deadline | None = None  # its MPA timer (a listener with ``on_request``)


def _wait(runtime: TcpRuntime, conn: IwarpConn, until: set[str], deadline: float) -> bool:
    """Wait until ``conn.state`` leaves the set ``until``; False on timeout. Woken by
    the runtime after each round of socket I/O (no polling)."""
    with runtime.lock:
        while conn.state in until:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            runtime.wait_changed(left)
        return True


def connect(qp: Any, host: str, port: int, private_data: bytes = b"", *,
            cfg: MpaConfig | None = None, timeout: float = DEFAULT_TIMEOUT) -> Connection:
    """Connect ``qp`` (a verbs QP of an iWARP context, in RESET or INIT) to a listener."""
    engine, runtime, ctx = _parts(qp)
    cfg = with_device_crc(cfg if cfg is not None else MpaConfig(), _device_crc(ctx))
    _check_idle(engine, runtime)
    deadline = time.monotonic() + timeout
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        raise _tcp_failed(host, port, exc) from exc
    c = _begin(qp, sock, host, port, private_data, cfg)
    if not _wait(runtime, c.conn, {ConnState.AWAIT_REPLY}, deadline):
        raise c.give_up(timeout)
    return c.result()


class ConnRequest:
    """A parsed MPA Request waiting for :meth:`accept` or :meth:`reject`."""

    def __init__(self, listener: Listener, conn: IwarpConn, peer: Any, local: Any) -> None:
        self.listener = listener
        self.conn = conn
        self.peer_addr = peer
        self.local_addr = local

    @property
    def request(self) -> MpaRequest:
        assert self.conn.request is not None
        return self.conn.request

    @property
    def private_data(self) -> bytes:
        """The initiator's user private data."""
        return self.request.user_data

    def accept(self, qp: Any, private_data: bytes = b"", *, cfg: MpaConfig | None = None,
               timeout: float = DEFAULT_TIMEOUT) -> Connection:
        """Bind ``qp`` (RESET or INIT), send the MPA Reply, enter RDMA mode."""
        engine, runtime, ctx = _parts(qp)
        if runtime is not self.listener.runtime:
            raise InvalidArgument("qp", "the QP belongs to another device context")
        conn = self.conn
        use = with_device_crc(cfg if cfg is not None else self.listener.cfg, _device_crc(ctx))

        def _accept() -> None:
            if engine.state not in (RESET, INIT) or engine.conn is not None:
                raise StateError("accept needs a QP in RESET or INIT that is not connected")
            if conn.state != ConnState.ACCEPT_WAIT:
                raise ConnectError(f"the connection is gone: {conn.reason or conn.state}")
            before = engine.state
            if engine.state == RESET:
                engine.state = INIT
            engine.conn = conn
            try:
                conn.accept(engine, private_data, use, now=runtime.now())
            except InvalidArgument:  # the Reply cannot be built: nothing was sent, the
                engine.state, engine.conn = before, None  # request and the QP are as before
                raise

        runtime.call_local(_accept)
        if conn.state != ConnState.RTS:
            raise ConnectError(f"accept failed: {conn.reason}")
        return Connection(qp, conn, runtime, self.local_addr, self.peer_addr)

    def reject(self, private_data: bytes = b"") -> None:
        """Refuse: MPA Reply with R set carrying ``private_data``, then close."""
        self.listener.runtime.call_local(self.conn.reject, private_data)


class Listener:
    """A TCP listening socket of an iWARP context (see the module docstring).

    With ``on_request`` each parsed MPA Request is handed to it, from the runtime's
    thread, as soon as it is parsed (outside the runtime's lock), rather than returned
    by :meth:`get_request` (not to be used then): no thread waits for the requests
    (issue 26). The MPA timer of a connection still waiting for its Request runs on
    :data:`timers`."""

    def __init__(self, ctx: Any, port: int = 0, host: str = "127.0.0.1", *,
                 cfg: MpaConfig | None = None, backlog: int = 16,
                 on_request: Callable[[ConnRequest], None] | None = None) -> None:
        self.on_request = on_request
        runtime = getattr(ctx, "runtime", None)
        if not isinstance(runtime, TcpRuntime):
            raise InvalidArgument("ctx", "not an iWARP device context")
        self.ctx = ctx
        self.runtime = runtime
        self.cfg = cfg if cfg is not None else MpaConfig()
        infos = socket.getaddrinfo(host or None, port, socket.AF_UNSPEC, socket.SOCK_STREAM,
                                   0, socket.AI_PASSIVE)
        last: OSError | None = None
        self._sock: socket.socket | None = None
        for family, stype, proto, _n, addr in infos:
            s = socket.socket(family, stype, proto)
            try:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(addr)
                s.listen(backlog)
            except OSError as exc:
                last = exc
                s.close()
                continue
            self._sock = s
            break
        if self._sock is None:
            raise ConnectError(f"cannot listen on {host}:{port}: "
                               f"{(last.strerror or last) if last else 'no address'}")
        self._pending: list[_Pending] = []  # guarded by the runtime's lock
        self._error: ConnectError | None = None  # an accept() failure, raised to the waiter
        self.mpa_timeout = MPA_REQUEST_TIMEOUT
        sock = self._sock
        try:
            runtime.call(runtime.watch, sock, self._on_ready)
        except BaseException:
            sock.close()
            raise

    @property
    def port(self) -> int:
        assert self._sock is not None
        return int(self._sock.getsockname()[1])

    def close(self) -> None:
        """Stop listening; connections still negotiating MPA are closed."""
        s = self._sock
        self._sock = None
        runtime = self.runtime
        pending: list[_Pending] = []
        if not runtime.closed:
            def _close() -> None:
                nonlocal pending
                if s is not None:
                    runtime.unwatch(s)
                pending, self._pending = self._pending, []
                for p in pending:
                    p.conn.close()
                runtime.changed.notify_all()  # a get_request waiting elsewhere sees it

            runtime.call(_close)
        else:
            pending, self._pending = self._pending, []
        for p in pending:
            self._forget(p)
        if s is not None:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def __enter__(self) -> Listener:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def get_request(self, timeout: float | None = DEFAULT_TIMEOUT) -> ConnRequest:
        """The next connection's parsed MPA Request (TimeoutError-like ConnectError).

        Every accepted TCP connection negotiates MPA on its own, concurrently with the
        others, with its own :data:`MPA_REQUEST_TIMEOUT` (siw's MPA request timer): a silent
        or slow connection neither blocks nor drops the ones behind it. Requests are
        returned in the order they complete. At most :data:`MAX_PENDING` connections may
        wait for their Request; beyond that the oldest is closed. The runtime accepts the
        connections (it watches the listening socket); this waits on its condition."""
        deadline = None if timeout is None else time.monotonic() + timeout
        runtime = self.runtime
        with runtime.lock:
            while True:
                if self._sock is None or runtime.closed:
                    raise ConnectError("the listener is closed", errno=errno.EBADF)
                if self._error is not None:
                    err, self._error = self._error, None
                    raise err
                now = time.monotonic()
                req = self._next_request_locked(now)
                if req is not None:
                    return req
                left = None if deadline is None else deadline - now
                if left is not None and left <= 0:
                    raise ConnectError("no connection request", errno=errno.ETIMEDOUT)
                # wake for the earliest MPA timer of a pending connection too; with none
                # and no deadline, only a round of I/O or close() wakes this (no polling)
                first = min((p.deadline for p in self._pending), default=None)
                if first is None and left is None:
                    runtime.wait_changed(None)
                    continue
                wait = min(w for w in (None if first is None else first - now, left)
                           if w is not None)
                runtime.wait_changed(max(wait, 0.0) or _MIN_WAIT)

    def _on_ready(self) -> None:
        """The listening socket is readable (the runtime calls this under its lock)."""
        s = self._sock
        if s is None:
            return
        try:
            self._accept_pending(s)
        except ConnectError as exc:
            self._error = exc

    def _accept_pending(self, s: socket.socket) -> None:
        """Accept every queued TCP connection and start its MPA negotiation (under the
        runtime's lock)."""
        runtime = self.runtime
        while True:
            try:
                sock, peer = s.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if self._sock is None:  # closed by another thread
                    raise ConnectError("the listener is closed", errno=errno.EBADF) from None
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    return  # out of resources: the connection waits in the backlog
                if exc.errno in (errno.ECONNABORTED, errno.EPROTO):
                    continue
                raise ConnectError(f"accept failed: {exc.strerror or exc}") from exc
            try:
                local = sock.getsockname()
                mss = tcp_mss(sock)
            except OSError:  # the peer reset the connection before we looked at it
                sock.close()
                continue
            conn = IwarpConn(runtime.dev, initiator=False, cfg=self.cfg, mss=mss)
            runtime.attach(conn, sock)
            p = _Pending(conn, peer, local, time.monotonic() + self.mpa_timeout)
            self._pending.append(p)
            if self.on_request is not None:
                runtime.listen_events_locked(conn, partial(self._pending_event, p))
                p.timer = timers.at(p.deadline, partial(self._expire, p))
            over = len(self._pending) - MAX_PENDING
            if over > 0:
                oldest = self._pending[:over]
                del self._pending[:over]
                for p in oldest:
                    p.conn.close()

    # ---- with on_request: each connection's events and MPA timer --------------------------
    def _forget(self, p: _Pending) -> None:
        """Stop following ``p`` (outside the runtime's lock)."""
        if p.timer is not None:
            p.timer.cancel()
            if not self.runtime.closed:
                self.runtime.unlisten_events(p.conn)

    def _pending_event(self, p: _Pending, ev: ConnEvent) -> None:
        """An event of a connection negotiating MPA (the runtime's thread, outside its
        lock): its parsed Request goes to ``on_request``; a failed connection is dropped
        (the engine sent its Terminate and closes the stream)."""
        with self.runtime.lock:
            if p in self._pending:
                st = p.conn.state
                if st == ConnState.AWAIT_REQUEST or (
                        st == ConnState.ACCEPT_WAIT and not isinstance(ev, MpaRequestReceived)):
                    return
                self._pending.remove(p)
            else:
                st = None  # expired, closed, or pushed out by MAX_PENDING
        self._forget(p)
        on_request = self.on_request
        if st == ConnState.ACCEPT_WAIT and on_request is not None and self._sock is not None:
            on_request(ConnRequest(self, p.conn, p.peer, p.local))

    def _expire(self, p: _Pending) -> None:
        """``p``'s MPA timer (:data:`timers`' thread): no Request in time, closed (siw:
        MPA timeout)."""
        runtime = self.runtime

        def run() -> bool:
            if p in self._pending and p.conn.state == ConnState.AWAIT_REQUEST:
                self._pending.remove(p)
                p.conn.close()
                return True
            return False
        if not runtime.closed and runtime.call(run):
            runtime.unlisten_events(p.conn)

    def _next_request_locked(self, now: float) -> ConnRequest | None:
        """The oldest connection whose Request is parsed; drops failed and expired ones
        (under the runtime's lock)."""
        found: _Pending | None = None
        keep: list[_Pending] = []
        expired = False
        for p in self._pending:
            st = p.conn.state
            if st == ConnState.ACCEPT_WAIT and found is None:
                found = p
            elif st == ConnState.AWAIT_REQUEST:
                if now >= p.deadline:  # no Request within the MPA timer (siw: MPA timeout)
                    p.conn.close()
                    expired = True
                else:
                    keep.append(p)
            elif st == ConnState.ACCEPT_WAIT:
                keep.append(p)
            # else: a bad Request; the engine sent its Terminate and closes the stream
        self._pending = keep
        if expired:
            self.runtime.housekeep()  # the closes go out now
        if found is None:
            return None
        return ConnRequest(self, found.conn, found.peer, found.local)

    def accept(self, qp: Any, private_data: bytes = b"", *, timeout: float | None = DEFAULT_TIMEOUT,
               cfg: MpaConfig | None = None) -> Connection:
        """:meth:`get_request` then :meth:`ConnRequest.accept` on ``qp``."""
        req = self.get_request(timeout)
        return req.accept(qp, private_data, cfg=cfg)


def listen(ctx: Any, port: int = 0, host: str = "127.0.0.1", *,
           cfg: MpaConfig | None = None) -> Listener:
    """Listen for iWARP connections on ``host:port`` of context ``ctx`` (port 0: any)."""
    return Listener(ctx, port, host, cfg=cfg)
