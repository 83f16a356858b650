"""The pingpongs' out-of-band address exchange (rdma-core ``libibverbs/examples/pingpong.c``,
``pp_*_exch_dest``), TCP port 18515: :class:`Dest` and its 52-byte
``"%04x:%06x:%06x:%s\\0"`` C string (:func:`encode_dest` / :func:`decode_dest`), the
client's side (:func:`client_exchange`) and the server's (:class:`OOBListener`).
Re-exported by :mod:`.pingpong`.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from ...errors import DecodeError, InvalidArgument, SoftRdmaError
from .. import oobtcp

DEFAULT_TCP_PORT = oobtcp.DEFAULT_PORT
MSG_LEN = 52  # sizeof "0000:000000:000000:00000000000000000000000000000000"
DONE_MSG = b"done\x00"  # sizeof "done" == 5
DEFAULT_TIMEOUT = 30.0


class PingPongError(SoftRdmaError):
    """A pingpong run failed; the message is the one line the tool prints."""



# --------------------------------------------------------------------------------------
# The out-of-band address exchange (rdma-core libibverbs/examples/pingpong.c)
# --------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Dest:
    """One side's address: ``struct pingpong_dest`` (LID, QPN, PSN, GID)."""

    lid: int
    qpn: int
    psn: int
    gid: bytes  # 16 bytes, network order


def gid_text(gid: bytes) -> str:
    """The GID as ``inet_ntop(AF_INET6)`` prints it (``::ffff:10.50.0.11``, ``::``)."""
    return socket.inet_ntop(socket.AF_INET6, gid)


def encode_dest(dest: Dest) -> bytes:
    """``sprintf(msg, "%04x:%06x:%06x:%s", lid, qpn, psn, wire_gid)`` plus its NUL."""
    if not 0 <= dest.lid <= 0xFFFF:
        raise InvalidArgument("dest.lid", f"{dest.lid} is not a 16-bit LID")
    if not 0 <= dest.qpn <= 0xFFFFFF:
        raise InvalidArgument("dest.qpn", f"{dest.qpn} is not a 24-bit QPN")
    if not 0 <= dest.psn <= 0xFFFFFF:
        raise InvalidArgument("dest.psn", f"{dest.psn} is not a 24-bit PSN")
    if len(dest.gid) != 16:
        raise InvalidArgument("dest.gid", f"a GID is 16 bytes, not {len(dest.gid)}")
    return f"{dest.lid:04x}:{dest.qpn:06x}:{dest.psn:06x}:{dest.gid.hex()}\x00".encode("ascii")


def decode_dest(msg: bytes) -> Dest:
    """Parse the peer's message the way ``sscanf("%x:%x:%x:%s")`` + ``wire_gid_to_gid`` do.

    Raises :class:`DecodeError` unless it is four ``:``-separated hex fields with a
    32-digit GID, NUL-terminated (or exactly filling the 52 bytes).
    """
    text_b = msg.split(b"\x00", 1)[0]
    try:
        text = text_b.decode("ascii")
    except UnicodeDecodeError as exc:
        raise DecodeError(f"pingpong address message is not ASCII: {msg[:MSG_LEN]!r}") from exc
    parts = text.split(":")
    if len(parts) != 4:
        raise DecodeError(f"pingpong address message is not LID:QPN:PSN:GID: {text!r}")
    lid_s, qpn_s, psn_s, gid_s = parts
    try:
        lid, qpn, psn = int(lid_s, 16), int(qpn_s, 16), int(psn_s, 16)
        if len(gid_s) != 32:
            raise ValueError("GID length")
        gid = bytes.fromhex(gid_s)
    except ValueError as exc:
        raise DecodeError(f"pingpong address message has a bad field: {text!r}") from exc
    if lid > 0xFFFF or qpn > 0xFFFFFF or psn > 0xFFFFFF or min(lid, qpn, psn) < 0:
        raise DecodeError(f"pingpong address message field out of range: {text!r}")
    return Dest(lid, qpn, psn, gid)


def client_exchange(host: str, port: int, my: Dest, timeout: float = DEFAULT_TIMEOUT) -> Dest:
    """The client side of the exchange (``pp_client_exch_dest``).

    A refused connection fails at once (retried only for ``$SOFTRDMA_CONNECT_RETRY``
    seconds, :mod:`softrdma.tools.waiting`); then: send our address, read the server's, send ``done``.
    """
    deadline = time.monotonic() + timeout
    msg = encode_dest(my)
    sock = oobtcp.connect(host, port, deadline, PingPongError)
    with sock:
        oobtcp.send_all(sock, msg, deadline, "local address", PingPongError)
        reply = oobtcp.recv_exact(sock, MSG_LEN, deadline, "remote address", PingPongError)
        oobtcp.send_all(sock, DONE_MSG, deadline, "\"done\"", PingPongError)
    return decode_dest(reply)


class OOBListener:
    """The server side of the exchange (``pp_server_exch_dest``), listening from creation.

    ``bind`` None listens on every address (IPv6 dual-stack when available, like the C
    tool's ``AI_PASSIVE``); ``port`` 0 picks an ephemeral port (see :attr:`port`).
    """

    def __init__(self, port: int = DEFAULT_TCP_PORT, bind: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        self.timeout = timeout
        self._sock = oobtcp.listen(port, PingPongError, bind=bind)

    @property
    def port(self) -> int:
        """The TCP port actually listened on."""
        return int(self._sock.getsockname()[1])

    def close(self) -> None:
        """Stop listening (an ``exchange`` blocked in accept fails at once)."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()

    def exchange(self, my: Dest, on_remote: Callable[[Dest], None]) -> Dest:
        """Accept one client: read its address, ``on_remote(dest)`` (connect the QP), answer
        with ``my``, wait for ``done``. Returns the client's address."""
        try:  # the client is awaited until stopped (tools.waiting)
            conn = oobtcp.accept(self._sock, PingPongError)
        finally:
            self.close()
        deadline = time.monotonic() + self.timeout
        with conn:
            rem = decode_dest(oobtcp.recv_exact(conn, MSG_LEN, deadline, "remote address",
                                                PingPongError))
            on_remote(rem)
            oobtcp.send_all(conn, encode_dest(my), deadline, "local address", PingPongError)
            done = oobtcp.recv_exact(conn, len(DONE_MSG), deadline, "\"done\"", PingPongError)
            if done != DONE_MSG:
                raise PingPongError(f"peer sent {done!r} instead of \"done\"")
        return rem
