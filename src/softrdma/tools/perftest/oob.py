"""perftest's out-of-band exchange (perftest_communication.c), byte for byte.

Every exchange is symmetric (``ctx_xchg_data`` / ``ctx_hand_shake``): the client writes
its message and then reads the server's; the server reads first, then writes. Over TCP
(port 18515, "Data ex. method: Ethernet") the messages are, in order:

* the version, 16 bytes: ``"6.06"`` NUL-padded (``exchange_versions``; a peer older than
  5.70 is refused as perftest does);
* ``check_sys_data``: the cycle buffer (page size) and the cache line size, each a
  big-endian 32-bit int;
* ``check_mtu``: the port's MTU enum as ``"%d"``, 2 bytes (``"3\\0"`` for 1024); the
  smaller of both is used;
* the handshakes: each QP's address as the 108-byte ``KEY_PRINT_FMT_GID`` text
  ``"%04x:%04x:%06x:%06x:%08x:%016llx:" + 16 x "%02x:" + "%08x:"`` and a NUL (LID, out
  reads, QPN, PSN, RKey, VAddr, GID bytes, SRQN), or the 59-byte ``KEY_PRINT_FMT``
  without a GID;
* BW tests: the report (``xchg_bw_reports``): size and iterations as big-endian 64-bit
  ints, peak, average and message rate as big-endian doubles;
* ``ctx_close_connection``: one more handshake, then ``"done\\0"`` both ways.

With ``-R`` ("Data ex. method: rdma_cm") the same messages travel as SENDs on an rdma_cm
RC connection to the same port, except that a handshake carries the binary
``struct pingpong_dest`` (56 bytes, big-endian fields, :data:`DEST_STRUCT`).

This module holds the codecs and the channels (:class:`TcpChannel`; the rdma_cm one is
:class:`..cmconn.CmChannel`).
"""

from __future__ import annotations

import contextlib
import socket
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from ...drivers.runtime.fdwait import readable
from ...errors import DecodeError
from .. import oobtcp
from .options import PerftestError

VERSION = "6.06"          # perftest 4.5-0.18 (Debian bookworm): configure.ac AC_INIT
MAX_VERSION = 16
MIN_PEER_VERSION = 5.70   # check_version_compatibility
SYS_INT = struct.Struct(">i")
MTU_MSG_LEN = 2           # sizeof(char[2]) for peers >= 5.31
KEY_MSG_SIZE = 59
KEY_MSG_SIZE_GID = 108
DONE_MSG = b"done\x00"
# struct pingpong_dest {int lid, out_reads, qpn, psn; unsigned rkey; (pad);
#   unsigned long long vaddr; union ibv_gid gid; unsigned srqn; int gid_index;}
DEST_STRUCT = struct.Struct(">iiiiI4xQ16sIi")
U64 = struct.Struct(">Q")
U32 = struct.Struct(">I")
DOUBLE = struct.Struct(">d")
DEFAULT_CYCLE_BUFFER = 4096
DEFAULT_CACHE_LINE = 64


@dataclass(frozen=True, slots=True)
class Dest:
    """One QP's address (``struct pingpong_dest``)."""

    lid: int
    out_reads: int
    qpn: int
    psn: int
    rkey: int
    vaddr: int
    gid: bytes = bytes(16)
    srqn: int = 0
    gid_index: int = -1


ZERO_DEST = Dest(0, 0, 0, 0, 0, 0)


@dataclass(frozen=True, slots=True)
class BwReport:
    """``struct bw_report_data`` as exchanged (the per-port fields are not sent)."""

    size: int
    iters: int
    bw_peak: float
    bw_avg: float
    msg_rate: float


# ---- codecs ----------------------------------------------------------------------------

def encode_version(version: str = VERSION) -> bytes:
    return version.encode("ascii")[:MAX_VERSION - 1].ljust(MAX_VERSION, b"\x00")


def decode_version(msg: bytes) -> str:
    text = msg.split(b"\x00", 1)[0].decode("ascii", "replace")
    try:
        value = float(text.split()[0]) if text.strip() else 0.0
    except ValueError:
        value = 0.0
    if value < MIN_PEER_VERSION:
        raise PerftestError(f"peer perftest version {text!r}: Current implementation is not "
                            f"compatible with versions older than {MIN_PEER_VERSION:.2f}")
    return text


def encode_mtu(mtu_enum: int) -> bytes:
    return f"{mtu_enum}\x00".encode("ascii")[:MTU_MSG_LEN]


def decode_mtu(msg: bytes) -> int:
    try:
        return int(msg.split(b"\x00", 1)[0].decode("ascii") or "0", 10)
    except (UnicodeDecodeError, ValueError):
        return 0


def _check_range(d: Dest) -> None:
    for name, value, bits in (("lid", d.lid, 16), ("out_reads", d.out_reads, 16),
                              ("qpn", d.qpn, 24), ("psn", d.psn, 24), ("rkey", d.rkey, 32),
                              ("vaddr", d.vaddr, 64), ("srqn", d.srqn, 32)):
        if not 0 <= value < (1 << bits):
            raise PerftestError(f"{name} {value:#x} does not fit the exchange format")
    if len(d.gid) != 16:
        raise PerftestError("a GID is 16 bytes")


def encode_key(d: Dest, with_gid: bool) -> bytes:
    """``KEY_PRINT_FMT_GID`` (108 bytes) or ``KEY_PRINT_FMT`` (59 bytes), NUL included."""
    _check_range(d)
    head = (f"{d.lid:04x}:{d.out_reads:04x}:{d.qpn:06x}:{d.psn:06x}:{d.rkey:08x}:"
            f"{d.vaddr:016x}:")
    if with_gid:
        text = head + "".join(f"{b:02x}:" for b in d.gid) + f"{d.srqn:08x}:"
        size = KEY_MSG_SIZE_GID
    else:
        text = head + f"{d.srqn:08x}"
        size = KEY_MSG_SIZE
    return text.encode("ascii").ljust(size, b"\x00")[:size]


def decode_key(msg: bytes, with_gid: bool) -> Dest:
    """Parse the peer's key message (``ethernet_read_keys``)."""
    text = msg.split(b"\x00", 1)[0].decode("ascii", "replace")
    parts = text.split(":")
    want = 6 + (17 if with_gid else 1)
    if len(parts) < want:
        raise DecodeError(f"perftest address message is not "
                          f"LID:OUT:QPN:PSN:RKEY:VADDR{':GID' if with_gid else ''}:SRQN: "
                          f"{text!r}")
    try:
        lid, outs, qpn, psn, rkey, vaddr = (int(p, 16) for p in parts[:6])
        gid = bytes(int(p, 16) & 0xFF for p in parts[6:22]) if with_gid else bytes(16)
        srqn = int(parts[22 if with_gid else 6] or "0", 16)
    except ValueError as exc:
        raise DecodeError(f"perftest address message has a bad field: {text!r}") from exc
    return Dest(lid, outs, qpn, psn, rkey, vaddr, gid, srqn)


def encode_dest_struct(d: Dest) -> bytes:
    """``struct pingpong_dest`` with the big-endian fields of ``rdma_write_keys``."""
    _check_range(d)
    return DEST_STRUCT.pack(d.lid, d.out_reads, d.qpn, d.psn, d.rkey, d.vaddr, d.gid,
                            d.srqn, d.gid_index)


def decode_dest_struct(msg: bytes) -> Dest:
    if len(msg) < DEST_STRUCT.size:
        raise DecodeError(f"pingpong_dest is {DEST_STRUCT.size} bytes, got {len(msg)}")
    lid, outs, qpn, psn, rkey, vaddr, gid, srqn, gidx = DEST_STRUCT.unpack_from(msg)
    return Dest(lid & 0xFFFF, outs & 0xFFFF, qpn & 0xFFFFFF, psn & 0xFFFFFF, rkey, vaddr,
                bytes(gid), srqn, gidx)


# ---- channels --------------------------------------------------------------------------

class Channel(Protocol):
    """A connected exchange channel: whole messages in, whole messages out."""

    is_client: bool
    key_binary: bool  # handshakes carry struct pingpong_dest (rdma_cm) or the text key
    timeout: float | None  # seconds a read waits for the peer (None: until it answers)

    def write(self, data: bytes) -> None: ...
    def read(self, size: int) -> bytes: ...
    def close(self) -> None: ...


@contextlib.contextmanager
def waiting_for_whole_run(ch: Channel) -> Iterator[None]:
    """The passive side of a one-sided test (the target of WRITEs, READs or atomics) sees
    no completion while the active side runs, however long every size of ``-a`` takes:
    like perftest's server it waits for the peer's next message as long as it takes
    (``--timeout`` is for a peer that makes no progress; a peer that dies closes the
    channel, which ends the wait at once)."""
    saved = ch.timeout
    ch.timeout = None
    try:
        yield
    finally:
        ch.timeout = saved


def xchg(ch: Channel, mine: bytes, size: int | None = None) -> bytes:
    """``ctx_xchg_data``: client writes then reads, server reads then writes."""
    n = len(mine) if size is None else size
    if ch.is_client:
        ch.write(mine)
        return ch.read(n)
    got = ch.read(n)
    ch.write(mine)
    return got


def hand_shake(ch: Channel, my: Dest, with_gid: bool) -> Dest:
    """``ctx_hand_shake``: exchange QP addresses."""
    if ch.key_binary:
        return decode_dest_struct(xchg(ch, encode_dest_struct(my)))
    size = KEY_MSG_SIZE_GID if with_gid else KEY_MSG_SIZE
    return decode_key(xchg(ch, encode_key(my, with_gid), size), with_gid)


def exchange_versions(ch: Channel) -> str:
    return decode_version(xchg(ch, encode_version()))


def check_sys_data(ch: Channel, cycle_buffer: int, cache_line: int) -> tuple[int, int]:
    """The larger page size / cache line of both sides."""
    rem_cb = SYS_INT.unpack(xchg(ch, SYS_INT.pack(cycle_buffer)))[0]
    rem_cl = SYS_INT.unpack(xchg(ch, SYS_INT.pack(cache_line)))[0]
    return max(cycle_buffer, rem_cb), max(cache_line, rem_cl)


def check_mtu(ch: Channel, mtu_enum: int) -> int:
    """The MTU enum both use: the smaller valid one (``check_mtu``)."""
    rem = decode_mtu(xchg(ch, encode_mtu(mtu_enum), MTU_MSG_LEN))
    return rem if 1 <= rem <= 5 and rem < mtu_enum else mtu_enum


def xchg_bw_reports(ch: Channel, mine: BwReport) -> BwReport:
    """``xchg_bw_reports`` for peers >= 5.33 (64-bit iterations)."""
    size = U64.unpack(xchg(ch, U64.pack(mine.size & (2**64 - 1))))[0]
    iters = U64.unpack(xchg(ch, U64.pack(mine.iters & (2**64 - 1))))[0]
    peak, avg, rate = (DOUBLE.unpack(xchg(ch, DOUBLE.pack(x)))[0]
                       for x in (mine.bw_peak, mine.bw_avg, mine.msg_rate))
    return BwReport(size, iters, peak, avg, rate)


def close_connection(ch: Channel, my: Dest, with_gid: bool) -> None:
    """``ctx_close_connection``: a handshake, then ``done`` both ways over TCP."""
    hand_shake(ch, my, with_gid)
    if not ch.key_binary:
        ch.write(DONE_MSG)
        ch.read(len(DONE_MSG))


class TcpChannel:
    """The TCP exchange ("Data ex. method: Ethernet"); every wait is bounded, but for
    :func:`waiting_for_whole_run`."""

    key_binary = False

    def __init__(self, sock: socket.socket, is_client: bool, timeout: float | None) -> None:
        self.sock = sock
        self.is_client = is_client
        self.timeout = timeout

    @classmethod
    def connect(cls, host: str, port: int, timeout: float) -> TcpChannel:
        """``ethernet_client_connect`` (:func:`softrdma.tools.oobtcp.connect`)."""
        sock = oobtcp.connect(host, port, time.monotonic() + timeout, PerftestError,
                              nodelay=True)
        return cls(sock, True, timeout)

    @classmethod
    def listen(cls, port: int) -> socket.socket:
        """The server's listening socket (all IPv4 addresses, as perftest's AF_INET)."""
        return oobtcp.listen(port, PerftestError, bind="0.0.0.0")

    @classmethod
    def accept(cls, lsock: socket.socket, timeout: float) -> TcpChannel:
        """``ethernet_server_connect``: one client, awaited until stopped
        (:mod:`softrdma.tools.waiting`), then the listener closes."""
        try:
            conn = oobtcp.accept(lsock, PerftestError, nodelay=True)
        finally:
            lsock.close()
        return cls(conn, False, timeout)

    def _deadline(self) -> float | None:
        return None if self.timeout is None else time.monotonic() + self.timeout

    def write(self, data: bytes) -> None:
        oobtcp.send_all(self.sock, data, self._deadline(), "a message", PerftestError)

    def read(self, size: int) -> bytes:
        late = f"the peer did not answer for {self.timeout or 0:g} s"
        return oobtcp.recv_exact(self.sock, size, self._deadline(), "a message", PerftestError,
                                 timed_out=late)

    def peer_closed(self) -> bool:
        """True once the peer closed (or reset) the exchange connection: it failed or
        stopped. Reads nothing (a peek that does not wait)."""
        try:
            # (a socket with a timeout waits for data before any recv: ask first)
            if not readable([self.sock.fileno()], 0):
                return False
            return self.sock.recv(1, socket.MSG_PEEK) == b""
        except (BlockingIOError, InterruptedError, TimeoutError):
            return False
        except (OSError, ValueError):
            return True

    def peer_waiting(self) -> bool:
        """Has the peer written to the exchange connection (it finished its part of the
        run, or left)? Reads nothing."""
        try:
            return bool(readable([self.sock.fileno()], 0))
        except (OSError, ValueError):
            return True

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
