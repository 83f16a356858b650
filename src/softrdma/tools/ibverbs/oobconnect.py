"""The out-of-band TCP connect of the pingpong and perftest tools (their port 18515).

Both C tools resolve the server's name, try each address, and retry while the server
refuses (it may still be starting) until their timeout; the first other error, or the
deadline, is the one line they print (``Couldn't connect to HOST:PORT: REASON``).
"""

from __future__ import annotations

import socket
import time

from ...errors import SoftRdmaError

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
