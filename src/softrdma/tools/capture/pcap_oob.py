"""The out-of-band QP exchange of ``ibv_*_pingpong`` and perftest over TCP, as captured.

rdma-core's pingpong examples and perftest 4.5 (without ``-R``) connect their QPs by
sending each other, over a TCP connection to port 18515, one NUL-terminated ASCII
message per QP (seen in captures of ``ibv_rc_pingpong`` and
``ib_read_bw`` between rxe hosts):

- pingpong (``libibverbs/examples/rc_pingpong.c``, ``pp_client_exch_dest``):
  ``LID:QPN:PSN:GID`` as ``%04x:%06x:%06x:%s`` with the GID as 32 hex digits;
- xsrq_pingpong (``libibverbs/examples/xsrq_pingpong.c``, XRC): one message
  ``LID:RECV_QPN:SEND_QPN:PSN:SRQN:GID`` as ``%04x:%06x:%06x:%06x:%06x:%32s``; it stands
  for two QP pairs, each side's XRC INI (send) QP with the other's TGT (recv) QP, the
  INI QP sending from the side's PSN (:mod:`softrdma.tools.ibverbs.xsrq_msg`);
- perftest (``src/perftest_communication.c``, ``KEY_PRINT_FMT_GID``):
  ``LID:OUT_READS:QPN:PSN:RKEY:VADDR:GID:SRQN:`` as
  ``%04x:%04x:%06x:%06x:%08x:%016Lx:`` then the 16 GID octets as ``%02x:`` each, then
  ``%08x:``; or ``KEY_PRINT_FMT`` without the GID. perftest sends the same message more
  than once (its handshake repeats).

The messages are found in a stream by their shape and decoded by the tools' own codecs
(:func:`softrdma.tools.ibverbs.pingpong.decode_dest`, :func:`softrdma.tools.perftest.oob.decode_key`).

In both, the PSN is the one the *sender* sends from (``attr.sq_psn = my_dest.psn``) and
its peer receives at (``attr.rq_psn = dest->psn``). :class:`OobScanner` finds these
messages in the reassembled TCP streams (:mod:`softrdma.wire.tcpstream`) and pairs the
i-th distinct QP of the connecting side with the i-th of the listening side.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from ...errors import DecodeError
from ...wire.gid import gid_to_ip as _gid_to_ip
from ...wire.tcpstream import StreamData, StreamEvent, TcpReassembler, TcpSegment, TcpStream
from ..ibverbs.pingpong import decode_dest
from ..ibverbs.xsrq_msg import decode_xdest
from ..perftest.oob import decode_key

__all__ = ["OOB_PORT", "OobMessage", "OobPair", "OobScanner", "gid_to_ip"]

OOB_PORT = 18515  # rdma-core examples and perftest: the default TCP port
# Where a message is in a stream (its shape); its fields come from the tool's codec.
_PINGPONG = re.compile(rb"(?<![0-9a-f:])[0-9a-f]{4}:[0-9a-f]{6}:[0-9a-f]{6}:[0-9a-f]{32}\0")
_XSRQ = re.compile(rb"[0-9a-f]{4}:[0-9a-f]{6}:[0-9a-f]{6}:[0-9a-f]{6}:[0-9a-f]{6}:[0-9a-f]{32}\0")
_PERFTEST_HEAD = rb"[0-9a-f]{4}:[0-9a-f]{4}:[0-9a-f]{6}:[0-9a-f]{6}:[0-9a-f]{8}:[0-9a-f]{16}:"
_PERFTEST_GID = re.compile(_PERFTEST_HEAD + rb"(?:[0-9a-f]{2}:){16}[0-9a-f]{8}:\0")
_PERFTEST = re.compile(_PERFTEST_HEAD + rb"[0-9a-f]{8}\0")
_MAX_MESSAGE = 160  # longer than either format: how much of a stream tail to keep
_MAX_QPS = 4096  # per direction: perftest -q is far below


def gid_to_ip(gid: bytes) -> bytes | None:
    """The IP address RoCEv2 uses for ``gid`` (IPv4-mapped -> 4 bytes); None for GID 0."""
    if not any(gid):
        return None
    return _gid_to_ip(gid)


@dataclass(frozen=True, slots=True)
class OobMessage:
    """One side's QP, as announced over TCP (``frame``: the frame completing it)."""

    frame: int
    ip: bytes  # the sender's RoCE address: from its GID, else its TCP address
    qpn: int
    psn: int
    lid: int
    tool: str  # "pingpong", "xsrq_pingpong" or "perftest"


@dataclass(frozen=True, slots=True)
class OobPair:
    """A QP pair connected by the exchange: ``client`` connected to ``server``."""

    client: OobMessage
    server: OobMessage


class _Dir:
    __slots__ = ("stream", "tail", "qps")

    def __init__(self, stream: TcpStream) -> None:
        self.stream = stream
        self.tail = b""
        self.qps: list[OobMessage] = []


class OobScanner:
    """Follows TCP connections to ``ports`` and yields :class:`OobPair` s as they complete."""

    def __init__(self, ports: frozenset[int] = frozenset((OOB_PORT,))) -> None:
        self.ports = ports
        self._tcp = TcpReassembler()
        self._dirs: dict[int, _Dir] = {}
        self._paired: dict[tuple[int, int], int] = {}  # (client dir id, server dir id) -> n

    def feed(self, seg: TcpSegment) -> list[OobPair]:
        """Take one TCP segment; return the QP pairs it completes."""
        if seg.sport not in self.ports and seg.dport not in self.ports:
            return []
        out: list[OobPair] = []
        for ev in self._tcp.feed(seg):
            self._event(ev, out)
        return out

    def _event(self, ev: StreamEvent, out: list[OobPair]) -> None:
        st = ev.stream
        d = self._dirs.get(st.id)
        if d is None:
            d = self._dirs[st.id] = _Dir(st)
        if not isinstance(ev, StreamData):
            d.tail = b""  # a hole: a message across it cannot be read
            return
        buf = d.tail + ev.data
        end = 0
        for rx, tool in ((_PINGPONG, "pingpong"), (_XSRQ, "xsrq_pingpong"),
                         (_PERFTEST_GID, "perftest"), (_PERFTEST, "perftest")):
            for m in rx.finditer(buf):
                self._message(d, m.group(0), rx, tool, ev.frame)
                end = max(end, m.end())
        rest = buf[end:]
        d.tail = rest[-_MAX_MESSAGE:]
        if d.qps:
            self._pair(d, out)

    def _message(self, d: _Dir, msg: bytes, rx: re.Pattern[bytes], tool: str,
                 frame: int) -> None:
        qpns: tuple[int, ...]
        try:
            if rx is _PINGPONG:
                pp = decode_dest(msg)
                lid, qpns, psn, gid = pp.lid, (pp.qpn,), pp.psn, pp.gid
            elif rx is _XSRQ:
                xd = decode_xdest(msg)
                lid, psn, gid = xd.lid, xd.psn, xd.gid
                # pairs by position: the client's INI with the server's TGT, then the
                # client's TGT with the server's INI
                client = d.stream.dst[1] in self.ports
                qpns = (xd.send_qpn, xd.recv_qpn) if client else (xd.recv_qpn, xd.send_qpn)
            else:
                pt = decode_key(msg, rx is _PERFTEST_GID)
                lid, qpns, psn, gid = pt.lid, (pt.qpn,), pt.psn, pt.gid
        except DecodeError:
            return  # the right shape, not a message after all
        ip = gid_to_ip(gid)
        if ip is None:
            ip = ipaddress.ip_address(d.stream.src[0]).packed
        for qpn in qpns:
            if any(q.qpn == qpn and q.ip == ip for q in d.qps) or len(d.qps) >= _MAX_QPS:
                return  # perftest repeats its message
            d.qps.append(OobMessage(frame, ip, qpn, psn, lid, tool))

    def _pair(self, d: _Dir, out: list[OobPair]) -> None:
        s = d.stream
        rev = self._tcp.streams.get((s.dst[0], s.dst[1], s.src[0], s.src[1]))
        peer = self._dirs.get(rev.id) if rev is not None else None
        if peer is None:
            return
        client, server = (d, peer) if s.dst[1] in self.ports else (peer, d)
        key = (client.stream.id, server.stream.id)
        done = self._paired.get(key, 0)
        n = min(len(client.qps), len(server.qps))
        for i in range(done, n):
            out.append(OobPair(client.qps[i], server.qps[i]))
        self._paired[key] = max(done, n)
