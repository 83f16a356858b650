"""The TCP out-of-band exchange of the ``ibv_*_pingpong``, ``ibv_srq_pingpong``,
``ibv_xsrq_pingpong`` and perftest tools (their port 18515): one implementation of the
connect, listen, accept, read and write that their message codecs travel over.

* :func:`connect`: the C tools resolve the server's name, try each address, and fail at
  once on a refusal (the server may still be starting: a refusal is retried only for
  ``$SOFTRDMA_CONNECT_RETRY`` seconds, :mod:`softrdma.tools.waiting`); the first other
  error, or the deadline, is the one line they print (``Couldn't connect to HOST:PORT:
  REASON``).
* :func:`listen` and :func:`accept`: the server listens on every address (IPv6
  dual-stack when available, like the C tools' ``AI_PASSIVE``) and waits for its client
  until stopped, unless given a deadline.
* :func:`recv_exact` and :func:`send_all`: whole messages before a deadline; a timeout,
  an error or the peer's close is the tool's own error class, naming what was awaited.

Every failure raises the ``error`` class the tool passes (a :class:`SoftRdmaError`).
"""

from __future__ import annotations

import socket
import time
from typing import Any

from ..errors import SoftRdmaError
from .waiting import connect_retry_s

__all__ = ["DEFAULT_PORT", "connect", "connect_retrying", "listen", "accept",
           "recv_exact", "send_all"]

DEFAULT_PORT = 18515
RETRY_S = 0.1  # the pause between rounds while the server refuses
MIN_CONNECT_S = 0.05  # the shortest timeout one connect attempt gets


def connect_retrying(host: str, port: int, deadline: float, error: type[SoftRdmaError],
                     *, nodelay: bool = False, retry_until: float | None = None
                     ) -> socket.socket:
    """A connected TCP socket to ``host:port`` (``TCP_NODELAY`` with ``nodelay``), or
    ``error`` with the C tools' message. Refusals are retried until ``retry_until``
    (default: ``deadline``, which also bounds each attempt)."""
    stop = deadline if retry_until is None else retry_until
    try:
        infos = socket.getaddrinfo(host, port, socket.AF_UNSPEC, socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise error(f"{exc.strerror} for {host}:{port}") from exc
    while True:
        last: OSError | None = None
        for family, stype, proto, _name, addr in infos:
            sock = socket.socket(family, stype, proto)
            try:
                sock.settimeout(max(MIN_CONNECT_S, deadline - time.monotonic()))
                sock.connect(addr)
                if nodelay:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return sock
            except OSError as exc:
                last = exc
                sock.close()
        if time.monotonic() + RETRY_S >= stop or not isinstance(
                last, ConnectionRefusedError):
            reason = (last.strerror or str(last)) if last else "no address"
            raise error(f"Couldn't connect to {host}:{port}: {reason}")
        time.sleep(RETRY_S)


def connect(host: str, port: int, deadline: float, error: type[SoftRdmaError],
            *, nodelay: bool = False) -> socket.socket:
    """The client's connection: refusals retried for ``$SOFTRDMA_CONNECT_RETRY`` seconds
    at most (:mod:`softrdma.tools.waiting`), every attempt bounded by ``deadline``."""
    retry_until = min(deadline, time.monotonic() + connect_retry_s())
    return connect_retrying(host, port, deadline, error, nodelay=nodelay,
                            retry_until=retry_until)


def listen(port: int, error: type[SoftRdmaError], *, bind: str | None = None,
           backlog: int = 1) -> socket.socket:
    """The server's listening socket. ``bind`` None listens on every address (IPv6
    dual-stack when available, else what ``AI_PASSIVE`` resolves to); ``port`` 0 picks an
    ephemeral port."""
    candidates: list[tuple[socket.AddressFamily, Any]] = []
    if bind is None and socket.has_ipv6:
        candidates.append((socket.AF_INET6, ("::", port, 0, 0)))
    try:
        for info in socket.getaddrinfo(
                bind, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE):
            candidates.append((info[0], info[4]))
    except socket.gaierror as exc:
        raise error(f"{exc.strerror} for port {port}") from exc
    last: OSError | None = None
    for family, addr in candidates:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and bind is None:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind(addr)
            sock.listen(backlog)
            return sock
        except OSError as exc:
            last = exc
            sock.close()
    reason = (last.strerror or str(last)) if last else "no address"
    raise error(f"Couldn't listen to port {port}: {reason}")


def accept(lsock: socket.socket, error: type[SoftRdmaError], *,
           deadline: float | None = None, nodelay: bool = False) -> socket.socket:
    """One client's connection. Without ``deadline`` the client is awaited until the
    tool is stopped (or the listener is closed), as the C tools do."""
    lsock.settimeout(None if deadline is None else max(0.0, deadline - time.monotonic()))
    try:
        conn, _peer = lsock.accept()
    except TimeoutError as exc:
        raise error("accept() failed: no client came in time") from exc
    except OSError as exc:
        raise error(f"accept() failed: {exc.strerror or exc}") from exc
    if nodelay:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


def _left(deadline: float | None, error: type[SoftRdmaError], timed_out: str
          ) -> float | None:
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise error(timed_out)
    return left


def recv_exact(sock: socket.socket, n: int, deadline: float | None, what: str,
               error: type[SoftRdmaError], *, timed_out: str | None = None) -> bytes:
    """Exactly ``n`` bytes read before ``deadline`` (None: as long as it takes). A
    timeout raises ``error(timed_out)`` (default ``timed out waiting for WHAT``); a read
    error or the peer's close raises ``error`` naming ``what``."""
    late = timed_out if timed_out is not None else f"timed out waiting for {what}"
    buf = bytearray()
    while len(buf) < n:
        sock.settimeout(_left(deadline, error, late))
        try:
            chunk = sock.recv(n - len(buf))
        except TimeoutError as exc:
            raise error(late) from exc
        except OSError as exc:
            raise error(f"Couldn't read {what}: {exc.strerror or exc}") from exc
        if not chunk:
            raise error(f"the peer closed the connection during {what} "
                        f"({len(buf)}/{n} bytes)")
        buf += chunk
    return bytes(buf)


def send_all(sock: socket.socket, data: bytes, deadline: float | None, what: str,
             error: type[SoftRdmaError]) -> None:
    """``data`` written whole before ``deadline`` (None: as long as it takes), or
    ``error`` naming ``what``."""
    sock.settimeout(_left(deadline, error, f"timed out sending {what}"))
    try:
        sock.sendall(data)
    except OSError as exc:
        raise error(f"Couldn't send {what}: {exc.strerror or exc}") from exc
