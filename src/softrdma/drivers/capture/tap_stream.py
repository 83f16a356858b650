"""What an iWARP device sends and receives on its TCP streams: the capture
(``Context(..., pcap=FILE)``, ``--pcap FILE``, ``$SOFTRDMA_PCAP``) and the packet trace
(``SOFTRDMA_TRACE=pkt``), as :mod:`softrdma.drivers.capture.tap` gives them for RoCE.

The TCP runtime hands :meth:`StreamTap.tx` the bytes each ``sendmsg`` took and
:meth:`StreamTap.rx` the bytes each receive returned. The capture writes them as the
Ethernet/IPv4-or-IPv6/TCP frames a capture on the interface would show (linktype EN10MB,
RFC 9293 §3.1 headers with real checksums, PSH|ACK, sequence and acknowledgment numbers
consistent per direction): the stream of MPA frames and FPDUs (RFC 5044 §7-8), which
tshark dissects as ``iwarp_mpa`` / ``iwarp_ddp_rdmap`` and ``softrdma pcap-check``
re-parses. A stream that starts with an MPA Request is preceded by a three-way handshake
(SYN from the Request's sender), so relative sequence numbers start at 1 as on the wire.
Large sends are cut into segments of at most :data:`MAX_SEGMENT` bytes (as TSO would).

Within one process both ends of a connection may be tapped (the loopback device): each
byte of a direction is written once, when the first of its two taps reports it (its
receive may be recorded before its send).

The trace writes one line per send or receive: the device, the direction, the TCP
endpoints, the length and what the bytes hold (the MPA Request/Reply, or the RDMAP
opcodes of the FPDUs that start in it, RFC 5040 §4.3; only the length once markers are
in use, RFC 5044 §5).
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ...trace import default_capture
from ...trace import logger as trace_logger
from ...wire.ddp import opcode_name
from ...wire.mpa import CRC_LEN, FLAG_MARKERS, KEY_REP, KEY_REQ, MPA_HDR_LEN
from ...wire.roce import ETH_P_IP, ETH_P_IPV6
from ...wire.tcpstream import IPPROTO_TCP, TCP_ACK, TCP_PSH, TCP_SYN
from .tap import TapBase, _ip_text, _open_writer, _SharedWriter

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

__all__ = ["StreamTap", "MAX_SEGMENT", "stream_tap_for", "tcp_frame"]

#: the largest TCP payload written in one frame (fits an IPv4 / IPv6 length field)
MAX_SEGMENT = 65000
TCP_PSH_ACK = TCP_PSH | TCP_ACK
TCP_SYN_ACK = TCP_SYN | TCP_ACK
ISN = 0  # relative numbering: the SYN takes sequence 0, data starts at 1
WINDOW = 65535
_ETH = struct.Struct("!6s6sH")
_IPV4 = struct.Struct("!BBHHHBBH4s4s")
_IPV6 = struct.Struct("!IHBB16s16s")
_TCP = struct.Struct("!HHIIBBHHH")
_ZERO_MAC = bytes(6)

Endpoint = tuple[bytes, int]


def _checksum(data: bytes) -> int:
    """The Internet checksum (RFC 1071)."""
    if len(data) % 2:
        data += b"\0"
    total: int = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def _endpoint(addr: object) -> Endpoint | None:
    """(IP bytes, port) of a socket address; v4-mapped IPv6 becomes IPv4."""
    if not isinstance(addr, tuple) or len(addr) < 2:
        return None
    host, port = str(addr[0]).split("%")[0], int(addr[1])
    if ":" in host:
        raw = socket.inet_pton(socket.AF_INET6, host)
        if raw[:12] == b"\0" * 10 + b"\xff\xff":
            raw = raw[12:]
    else:
        raw = socket.inet_pton(socket.AF_INET, host)
    return raw, port


def tcp_frame(src: Endpoint, dst: Endpoint, seq: int, ack: int, flags: int,
              payload: bytes) -> bytes:
    """One Ethernet/IP/TCP frame (RFC 791 or 8200, RFC 9293 §3.1) with checksums."""
    tcp0 = _TCP.pack(src[1], dst[1], seq & 0xFFFFFFFF, ack & 0xFFFFFFFF, 5 << 4, flags,
                     WINDOW, 0, 0)
    tlen = len(tcp0) + len(payload)
    if len(src[0]) == 4:
        pseudo = src[0] + dst[0] + struct.pack("!BBH", 0, IPPROTO_TCP, tlen)
        ip0 = _IPV4.pack(0x45, 0, 20 + tlen, 0, 0x4000, 64, IPPROTO_TCP, 0, src[0], dst[0])
        ip = ip0[:10] + struct.pack("!H", _checksum(ip0)) + ip0[12:]
        ethertype = ETH_P_IP
    else:
        pseudo = src[0] + dst[0] + struct.pack("!IxxxB", tlen, IPPROTO_TCP)
        ip = _IPV6.pack(6 << 28, tlen, IPPROTO_TCP, 64, src[0], dst[0])
        ethertype = ETH_P_IPV6
    csum = _checksum(pseudo + tcp0 + payload)
    tcp = tcp0[:16] + struct.pack("!H", csum) + tcp0[18:]
    return b"".join((_ETH.pack(_ZERO_MAC, _ZERO_MAC, ethertype), ip, tcp, payload))


@dataclass
class _Direction:
    """One direction of a connection: its next sequence number and FPDU walk."""

    seq: int = ISN + 1
    sent: int = 0  # stream bytes its sender's tap reported so far
    received: int = 0  # ... and its receiver's
    skip: int = 0  # stream bytes before the next header (MPA frame or FPDU)
    head: bytearray = field(default_factory=bytearray)  # a header cut by a segment
    started: bool = False  # the MPA frame has been passed: FPDUs follow
    markers: bool = False


@dataclass
class _Flow:
    dirs: dict[Endpoint, _Direction] = field(default_factory=dict)
    opened: bool = False


_Flows = dict[frozenset[Endpoint], _Flow]
#: the connections seen by each open capture file (under its writer's lock)
_flow_tables: weakref.WeakKeyDictionary[_SharedWriter, _Flows] = weakref.WeakKeyDictionary()


def _flows(writer: _SharedWriter) -> _Flows:
    flows = _flow_tables.get(writer)
    if flows is None:
        flows = _flow_tables[writer] = {}
    return flows


class StreamTap(TapBase):
    """The capture and packet trace of one iWARP device (see the module docstring)."""

    def __init__(self, device: str, pcap: str | None, log: logging.Logger | None) -> None:
        self.device = device
        self.log = log
        self._writer = _open_writer(pcap) if pcap else None
        self._ends: weakref.WeakKeyDictionary[socket.socket, tuple[Endpoint, Endpoint]] = (
            weakref.WeakKeyDictionary())
        # the trace's FPDU walk per direction, sent and received apart (both ends of a
        # loopback connection may be this device's)
        self._walk: dict[tuple[Endpoint, Endpoint, bool], _Direction] = {}
        self._closed = False

    def _pair(self, sock: socket.socket) -> tuple[Endpoint, Endpoint] | None:
        pair = self._ends.get(sock)
        if pair is None:
            try:
                local, peer = _endpoint(sock.getsockname()), _endpoint(sock.getpeername())
            except OSError:
                return None
            if local is None or peer is None:
                return None
            pair = self._ends[sock] = (local, peer)
        return pair

    def tx(self, sock: socket.socket, bufs: Sequence[ReadableBuffer], n: int) -> None:
        """``sendmsg`` took the first ``n`` bytes of ``bufs``."""
        pair = self._pair(sock)
        if pair is None or n <= 0:
            return
        data = b"".join(bytes(b) for b in bufs)[:n]
        self._record(pair[0], pair[1], data, sent=True)

    def rx(self, sock: socket.socket, bufs: Sequence[ReadableBuffer]) -> None:
        """A receive returned these bytes (in order)."""
        pair = self._pair(sock)
        data = b"".join(bytes(b) for b in bufs)
        if pair is None or not data:
            return
        self._record(pair[1], pair[0], data, sent=False)

    def _record(self, src: Endpoint, dst: Endpoint, data: bytes, sent: bool) -> None:
        if self._writer is not None:
            self._write(src, dst, data, sent)
        if self.log is not None:
            d = self._walk.setdefault((src, dst, sent), _Direction())
            self.log.debug("%s %s %s:%d -> %s:%d TCP len=%d %s", self.device,
                           "tx" if sent else "rx", _ip_text(src[0]), src[1], _ip_text(dst[0]),
                           dst[1], len(data), _describe(d, data))

    def _write(self, src: Endpoint, dst: Endpoint, data: bytes, sent: bool) -> None:
        w = self._writer
        assert w is not None
        with w.lock:
            flow = _flows(w).setdefault(frozenset((src, dst)), _Flow())
            out = flow.dirs.setdefault(src, _Direction())
            back = flow.dirs.setdefault(dst, _Direction())
            # Both ends of a loopback connection may be tapped here, and either may report
            # the same bytes first (a receive can be recorded before the send that fed it,
            # when the sending thread lost its CPU between sendmsg and its tap): each byte
            # is written once, by the first report that reaches it.
            if sent:
                start, out.sent = out.sent, out.sent + len(data)
            else:
                start, out.received = out.received, out.received + len(data)
            written = out.seq - (ISN + 1)
            if start + len(data) <= written:
                return  # the other end's tap wrote these bytes
            data = data[written - start:]
            now = time.time()
            if not flow.opened:
                flow.opened = True
                if data.startswith(KEY_REQ):  # the initiator: a handshake first
                    w.writer.write(tcp_frame(src, dst, ISN, 0, TCP_SYN, b""), now)
                    w.writer.write(tcp_frame(dst, src, ISN, ISN + 1, TCP_SYN_ACK, b""), now)
                    w.writer.write(tcp_frame(src, dst, ISN + 1, ISN + 1, TCP_ACK, b""), now)
            for off in range(0, len(data), MAX_SEGMENT):
                seg = data[off:off + MAX_SEGMENT]
                w.writer.write(tcp_frame(src, dst, out.seq, back.seq, TCP_PSH_ACK, seg), now)
                out.seq += len(seg)
            w.writer.flush()


def _describe(d: _Direction, data: bytes) -> str:
    """What ``data`` (the next bytes of direction ``d``) holds, for the trace."""
    if not d.started and not d.skip and not d.head:
        if data.startswith((KEY_REQ, KEY_REP)) and len(data) >= MPA_HDR_LEN:
            d.started = True
            d.markers = bool(data[16] & FLAG_MARKERS)
            consumed = MPA_HDR_LEN + struct.unpack_from("!H", data, 18)[0]
            what = "MPA Request" if data.startswith(KEY_REQ) else "MPA Reply"
            if len(data) < consumed:
                d.skip = consumed - len(data)
                return what
            rest = _walk(d, data[consumed:]) if not d.markers else []
            return ", ".join([what, *rest])
        d.started = True
    if d.markers:
        return "FPDUs (markers)"
    return ", ".join(_walk(d, data)) or "FPDU continuation"


def _walk(d: _Direction, data: bytes) -> list[str]:
    """The RDMAP opcodes of the FPDUs starting in ``data`` (RFC 5044 §8: ULPDU_LENGTH,
    ULPDU, pad to 4, CRC; the DDP and RDMAP control bytes lead the ULPDU)."""
    runs: list[tuple[str, int]] = []  # "Send x3" for a run of FPDUs of one opcode
    pos = 0
    n = len(data)
    while pos < n:
        if d.skip:
            step = min(d.skip, n - pos)
            d.skip -= step
            pos += step
            continue
        need = 4 - len(d.head)
        d.head += data[pos:pos + need]
        pos += min(need, n - pos)
        if len(d.head) < 4:
            break
        ulpdu_len = struct.unpack_from("!H", d.head, 0)[0]
        name = opcode_name(d.head[3] & 0x0F)
        if runs and runs[-1][0] == name:
            runs[-1] = (name, runs[-1][1] + 1)
        else:
            runs.append((name, 1))
        total = 2 + ulpdu_len
        total += -total % 4 + CRC_LEN
        d.skip = total - 4
        d.head.clear()
    return [f"{name} x{count}" if count > 1 else name for name, count in runs]


def stream_tap_for(device: str, pcap: str | os.PathLike[str] | None = None) -> StreamTap | None:
    """The stream tap of an iWARP device being opened: capture to ``pcap`` (else
    ``$SOFTRDMA_PCAP``) and/or trace when ``softrdma.pkt`` is enabled; None when neither
    is asked (as :func:`~.tap.tap_for`)."""
    path = os.fspath(pcap) if pcap is not None else default_capture()
    log = trace_logger("pkt")
    traced = log.isEnabledFor(logging.DEBUG)
    if path is None and not traced:
        return None
    return StreamTap(device, path, log if traced else None)
