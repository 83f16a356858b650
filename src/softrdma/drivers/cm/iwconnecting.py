"""The active side of an iWARP connection setup without a thread of its own (issue 26):
:func:`start_connect` sends the MPA Request at once when the TCP connection is up at
once (a local peer), and :meth:`Connecting.follow` reports the outcome from the
connection's typed events, or from :data:`timers` when no Reply comes in time. Also the
pieces :mod:`.iwconnect` (its module docstring has the whole setup) shares with it:
:class:`Connection`, :class:`ConnectError`. Names are re-exported by :mod:`.iwconnect`.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from ...errors import InvalidArgument, SoftRdmaError, StateError
from ...iwarp.engine import ConnState, IwarpConn
from ...iwarp.events import ConnEvent
from ...iwarp.mpa_setup import MpaConfig, Negotiated, with_device_crc
from ...iwarp.qp import INIT, RESET, IwarpQP
from ..runtime.fdwait import writable
from ..runtime.tcp import TcpRuntime, tcp_mss
from .deadlines import Deadlines

__all__ = ["ConnectError", "Connection", "Connecting", "start_connect", "timers"]

#: the MPA timers of listeners with ``on_request`` and of :func:`start_connect` users
timers = Deadlines("softrdma-iw-timers")


class ConnectError(SoftRdmaError):
    """The connection could not be set up (TCP failure, MPA error, timeout)."""

    errno = errno.ECONNABORTED


def _parts(qp: Any) -> tuple[IwarpQP, TcpRuntime, Any]:
    engine = getattr(qp, "engine", qp)
    if not isinstance(engine, IwarpQP):
        raise InvalidArgument("qp", "not a QP of an iWARP device")
    ctx = getattr(qp, "ctx", None)
    runtime = getattr(ctx, "runtime", None)
    if not isinstance(runtime, TcpRuntime):
        raise InvalidArgument("qp", "the QP's context has no iWARP runtime")
    return engine, runtime, ctx


def _device_crc(ctx: Any) -> bool:
    """The context's MPA CRC wish (``Context.mpa_crc``: the device's ``mpa_crc`` setting
    or ``$SOFTRDMA_MPA_CRC``); applied to the initiator's Request and the responder's
    Reply alike, as siw's ``mpa_crc_required``."""
    return bool(getattr(ctx, "mpa_crc", False))


class Connection:
    """An established iWARP connection of ``qp``: the peer's private data, the agreed
    options, addresses; :meth:`disconnect` closes it (QP to ERR, flushing)."""

    def __init__(self, qp: Any, conn: IwarpConn, runtime: TcpRuntime,
                 local: Any = None, peer: Any = None) -> None:
        self.qp = qp
        self.conn = conn
        self.runtime = runtime
        self.local_addr = local
        self.peer_addr = peer

    @property
    def private_data(self) -> bytes:
        """The peer's user private data."""
        return self.conn.peer_private_data

    @property
    def negotiated(self) -> Negotiated:
        neg = self.conn.negotiated
        assert neg is not None
        return neg

    @property
    def connected(self) -> bool:
        return self.conn.state == ConnState.RTS

    def disconnect(self) -> None:
        """Close the stream (FIN); the QP goes to ERR and its work requests are flushed."""
        engine = getattr(self.qp, "engine", self.qp)

        def _close() -> None:
            if isinstance(engine, IwarpQP):
                engine.to_error()
            self.conn.close()

        if not self.runtime.closed:
            self.runtime.call_local(_close)


class Connecting:
    """A connect whose TCP connection is up and whose MPA Request is on its way: the
    engine connection ``conn`` ends in RTS, rejected or failed (its typed events,
    :meth:`TcpRuntime.listen_events <softrdma.drivers.runtime.tcp.TcpRuntime.listen_events>`,
    tell when); :meth:`result` is then the :class:`Connection` or raises as
    :func:`connect` does; :meth:`give_up` when no Reply came in time."""

    def __init__(self, qp: Any, conn: IwarpConn, runtime: TcpRuntime, local: Any,
                 peer: Any, host: str, port: int) -> None:
        self.qp = qp
        self.conn = conn
        self.runtime = runtime
        self.local_addr = local
        self.peer_addr = peer
        self._where = f"{host}:{port}"

    @property
    def waiting(self) -> bool:
        """The MPA Reply has not come yet."""
        return self.conn.state == ConnState.AWAIT_REPLY

    def result(self) -> Connection:
        """The connection, or ConnectionRejected / ConnectError (after the Reply)."""
        conn = self.conn
        if conn.rejected is not None:
            raise conn.rejected
        if conn.state != ConnState.RTS:
            raise ConnectError(f"connection to {self._where} failed: {conn.reason}")
        return Connection(self.qp, conn, self.runtime, self.local_addr, self.peer_addr)

    def give_up(self, timeout: float) -> ConnectError:
        """Close the connection (no Reply within ``timeout`` s); the error to report."""
        if not self.runtime.closed:
            self.runtime.call(self.conn.close)
        return ConnectError(f"no MPA Reply from {self._where} within {timeout:g} s",
                            errno=errno.ETIMEDOUT)

    def follow(self, timeout: float, done: Callable[[Connection | SoftRdmaError], None],
               later: Callable[[ConnEvent], None]) -> None:
        """Call ``done`` once with the outcome: the :class:`Connection`, or the error of
        :meth:`result` (from the runtime's thread, on the connection's events) or of
        :meth:`give_up` (from :data:`timers`, ``timeout`` s from now). ``later`` gets
        the connection's events that came with the outcome's (its end, if that was
        quick); after ``done`` the caller listens to the connection's events itself."""
        lock = threading.Lock()
        finished = False

        def finish() -> bool:
            nonlocal finished
            with lock:
                if finished:
                    return False
                finished = True
            timer.cancel()
            return True

        def on_event(ev: ConnEvent) -> None:
            if finished:
                later(ev)
                return
            if self.waiting or not finish():
                return
            try:
                got: Connection | SoftRdmaError = self.result()
            except SoftRdmaError as exc:
                self.runtime.unlisten_events(self.conn)
                got = exc
            done(got)

        def on_timeout() -> None:
            if finish():
                self.runtime.unlisten_events(self.conn)
                done(self.give_up(timeout))

        timer = timers.at(time.monotonic() + timeout, on_timeout)
        self.runtime.listen_events(self.conn, on_event)


def _check_idle(engine: IwarpQP, runtime: TcpRuntime) -> None:
    with runtime.lock:
        if engine.state not in (RESET, INIT) or engine.conn is not None:
            raise StateError("connect needs a QP in RESET or INIT that is not connected")


def _begin(qp: Any, sock: socket.socket, host: str, port: int, private_data: bytes,
           cfg: MpaConfig) -> Connecting:
    """Attach the connected ``sock`` to ``qp``'s runtime and send the MPA Request."""
    engine, runtime, _ = _parts(qp)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        local, peer = sock.getsockname(), sock.getpeername()
        mss = tcp_mss(sock)

        def _start() -> IwarpConn:
            if engine.state == RESET:
                engine.state = INIT
            c = IwarpConn(runtime.dev, initiator=True, cfg=cfg, mss=mss, qp=engine,
                          private_data=private_data)
            engine.conn = c
            runtime.attach(c, sock)
            return c

        conn: IwarpConn = runtime.call_local(_start)
    except BaseException:
        sock.close()
        raise
    return Connecting(qp, conn, runtime, local, peer, host, port)


def _tcp_failed(host: str, port: int, exc: OSError) -> ConnectError:
    return ConnectError(f"TCP connect to {host}:{port} failed: {exc.strerror or exc}",
                        errno=exc.errno or errno.ECONNREFUSED)


def start_connect(qp: Any, host: str, port: int, private_data: bytes = b"", *,
                  cfg: MpaConfig | None = None) -> Connecting | None:
    """:func:`connect` without waiting: if the TCP connection to ``host`` (an IP
    address) is up at once (the loopback, a local address), attach it and send the MPA
    Request; the caller then waits for the connection's events. None when it is not up
    at once (the caller uses :func:`connect`, from a thread of its own); a refusal
    raises ConnectError as :func:`connect` does."""
    engine, runtime, ctx = _parts(qp)
    cfg = with_device_crc(cfg if cfg is not None else MpaConfig(), _device_crc(ctx))
    _check_idle(engine, runtime)
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    if ip.version == 6 and ip.is_link_local:
        return None  # a scope to pick: create_connection's business
    sock = socket.socket(socket.AF_INET if ip.version == 4 else socket.AF_INET6,
                         socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        err = sock.connect_ex((host, port))
        if err == errno.EINPROGRESS:  # a local peer has answered by now
            if not writable(sock.fileno(), 0):
                sock.close()
                return None
            err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            raise _tcp_failed(host, port, OSError(err, os.strerror(err)))
    except BaseException:
        sock.close()
        raise
    return _begin(qp, sock, host, port, private_data, cfg)
