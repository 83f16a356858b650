"""What a RoCE device sends and receives, seen from its runtime: a pcap capture
(``Context(..., pcap=FILE)``, ``--pcap FILE``, ``$SOFTRDMA_PCAP``) and the packet trace
(``SOFTRDMA_TRACE=pkt``, :mod:`softrdma.trace`). No root, no tcpdump.

The runtime calls :meth:`PacketTap.tx` with each datagram it hands to its link (the
UDP payload, BTH .. ICRC, and the addresses and ports it goes with) and
:meth:`PacketTap.rx` with each datagram it takes from the link. Captured frames are the
Ethernet/IPv4-or-IPv6/UDP frames a Linux sender emits for that payload (the framing of
:func:`softrdma.drivers.links.fabric.frame_of`: IPv4 ID 0 with DF, as rxe's sockets send, so
the ICRC checks; docs/protocols.md §1-2), which tshark dissects as
RoCE and ``softrdma pcap-check`` verifies.

All devices of a process that capture to the same file share one writer. A packet that
one of them sends and another (or the same one, on loopback) receives is written once,
when it is sent: the file then reads like a capture on the wire. RoCEv1 frames (Annex
A16, raw Ethernet) are captured the same way, as the frames the netdev carries:
Ethernet with EtherType 0x8915, GRH, BTH .. ICRC (linktype EN10MB; :meth:`PacketTap.tx_v1`
and :meth:`PacketTap.rx`). An iWARP device's TCP streams are captured by
:mod:`softrdma.drivers.capture.tap_stream` into the same kind of file.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ...errors import DecodeError
from ...trace import default_capture
from ...trace import logger as trace_logger
from ...wire import ib
from ...wire.gid import ip_to_gid
from ...wire.opcodes import Hdr
from ...wire.pcap import LINKTYPE_ETHERNET, PcapWriter
from ...wire.roce import icrc_v1
from ...wire.rocev1 import parse_grh
from ..links.fabric import frame_of
from ..links.link import Datagram

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

__all__ = ["PacketTap", "tap_for"]

ICRC_LEN = 4
RECENT_TX = 4096  # sent payloads remembered so that their loopback receipt is not written twice


class _SharedWriter:
    """One pcap file written by every tap of the process that captures to it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.writer = PcapWriter(path, LINKTYPE_ETHERNET)
        # re-entrant, as _writers_lock: a collection that starts inside a write (its
        # frame is an allocation) may run a freed context's finalizer, which closes
        # that context's tap, in the writing thread
        self.lock = threading.RLock()
        self.users = 0
        self.recent: OrderedDict[bytes, int] = OrderedDict()

    def write_tx(self, dg: Datagram) -> None:
        frame = frame_of(dg)
        with self.lock:
            key = bytes(dg.data)
            self.recent[key] = self.recent.get(key, 0) + 1
            self.recent.move_to_end(key)
            while len(self.recent) > RECENT_TX:
                self.recent.popitem(last=False)
            self.writer.write(frame, time.time())
            self.writer.flush()

    def write_rx(self, dg: Datagram) -> None:
        with self.lock:
            key = bytes(dg.data)
            n = self.recent.get(key, 0)
            if n:  # sent by a device of this process: already written
                if n == 1:
                    del self.recent[key]
                else:
                    self.recent[key] = n - 1
                return
            self.writer.write(frame_of(dg), time.time())
            self.writer.flush()


_writers: dict[str, _SharedWriter] = {}
_writers_lock = threading.RLock()


def _open_writer(path: str) -> _SharedWriter:
    key = os.path.abspath(path)
    with _writers_lock:
        w = _writers.get(key)
        if w is None:
            w = _writers[key] = _SharedWriter(key)
        w.users += 1
        return w


def _close_writer(w: _SharedWriter) -> None:
    with _writers_lock:
        w.users -= 1
        if w.users <= 0:
            _writers.pop(w.path, None)
            with w.lock:
                w.writer.close()


def _ip_text(ip: bytes) -> str:
    return socket.inet_ntop(socket.AF_INET if len(ip) == 4 else socket.AF_INET6, ip)


def _qpn_text(qpn: int | None) -> str:
    return "?" if qpn is None else f"0x{qpn:06x}"


class TapBase:
    """A tap's capture file: a shared writer (None when only tracing) that its first
    ``close`` releases (the file closes with its last tap)."""

    _closed: bool
    _writer: _SharedWriter | None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._writer is not None:
            _close_writer(self._writer)
            self._writer = None


class PacketTap(TapBase):
    """The capture and packet trace of one device (see the module docstring)."""

    def __init__(self, device: str, pcap: str | None, log: logging.Logger | None,
                 qps: Mapping[int, Any] | None = None) -> None:
        self.device = device
        self.log = log
        #: the device's QPs by QPN (``Port.qps``): trace lines name the local QP of each
        #: packet and its peer, so that the two ends of a loopback pair tell apart
        self.qps = qps
        self._writer = _open_writer(pcap) if pcap else None
        self._closed = False

    def tx(self, src: bytes, dst: bytes, sport: int, dport: int,
           parts: Sequence[ReadableBuffer], tos: int, ttl: int, ident: int = -1) -> None:
        """A datagram handed to the link (``parts``: BTH .. ICRC; ``ident``: its IPv4
        Identification when not 0, i.e. segment ``ident`` of a UDP GSO send)."""
        data = memoryview(b"".join(parts))
        dg = Datagram(data, src, dst, sport, dport, tos, ttl, b"", ident)
        if self._writer is not None:
            self._writer.write_tx(dg)
        if self.log is not None:
            self._line("tx", dg)

    def tx_v1(self, grh: bytes, parts: Sequence[ReadableBuffer]) -> None:
        """A RoCEv1 packet handed to the link (Annex A16): its GRH and BTH .. payload;
        the ICRC is computed here as the link computes it (IBA 7.8.1, A16)."""
        body = b"".join(parts)
        data = memoryview(body + icrc_v1(grh, [body]))
        g = parse_grh(grh)
        dg = Datagram(data, g.sgid, g.dgid, 0, 0, g.tclass, g.hop_limit, grh=bytes(grh))
        if self._writer is not None:
            self._writer.write_tx(dg)
        if self.log is not None:
            self._line("tx", dg)

    def rx(self, dg: Datagram) -> None:
        """A datagram taken from the link (before the ICRC check: a bad one shows too);
        a RoCEv1 frame has its GRH in ``dg.grh``."""
        if self._writer is not None:
            self._writer.write_rx(dg)
        if self.log is not None:
            self._line("rx", dg)

    def _line(self, way: str, dg: Datagram) -> None:
        """``DEV tx|rx SRC[:PORT] (QP s) -> DST[:PORT] (QP d) OPCODE QP=d PSN=...``: the
        destination QP is the BTH DestQP (IBA 9.2), the source QP the DETH SrcQP of a
        datagram (IBA 9.3.2) or, RC/UC carrying none, the local QP's peer (``?`` when
        unknown)."""
        assert self.log is not None
        src_qp = dst_qp = ""
        try:
            pkt = ib.decode(dg.data[:-ICRC_LEN])
            text = ib.describe(pkt)
            src_qp = f" (QP {_qpn_text(self._source_qpn(way, pkt, dg))})"
            dst_qp = f" (QP {_qpn_text(pkt.dqpn)})"
        except DecodeError as exc:
            text = f"undecodable ({exc})"
        if dg.grh:  # RoCEv1: no UDP ports, the GIDs of the GRH
            self.log.debug("%s %s v1 %s%s -> %s%s %s", self.device, way, _ip_text(dg.src_ip),
                           src_qp, _ip_text(dg.dst_ip), dst_qp, text)
            return
        self.log.debug("%s %s %s:%d%s -> %s:%d%s %s", self.device, way, _ip_text(dg.src_ip),
                       dg.sport, src_qp, _ip_text(dg.dst_ip), dg.dport, dst_qp, text)

    def _source_qpn(self, way: str, pkt: ib.IBPacket, dg: Datagram) -> int | None:
        """The QP that sent ``pkt``: DETH SrcQP, else (RC/UC) for a received packet the
        peer of its local DestQP, for a sent one the local QP connected to DestQP at
        the destination GID."""
        if pkt.info.hdrs & Hdr.DETH:
            return int(pkt.src_qp)
        if self.qps is None:
            return None
        if way == "rx":
            qp = self.qps.get(pkt.dqpn)
            peer = getattr(qp, "dest_qpn", 0) if getattr(qp, "av", None) is not None else 0
            return int(peer) if peer else None
        dgid = ip_to_gid(dg.dst_ip)
        for qpn, qp in list(self.qps.items()):
            av = getattr(qp, "av", None)
            if (av is not None and getattr(qp, "dest_qpn", -1) == pkt.dqpn
                    and getattr(av, "dgid", None) == dgid):
                return int(qpn)
        return None



def tap_for(device: str, pcap: str | os.PathLike[str] | None = None,
            qps: Mapping[int, Any] | None = None) -> PacketTap | None:
    """The tap of a device being opened: capture to ``pcap`` (else ``$SOFTRDMA_PCAP``)
    and/or trace packets when ``softrdma.pkt`` is enabled; None when neither is asked.
    ``qps``: the device's QPs by QPN, which name a packet's source QP in the trace."""
    path = os.fspath(pcap) if pcap is not None else default_capture()
    log = trace_logger("pkt")
    traced = log.isEnabledFor(logging.DEBUG)
    if path is None and not traced:
        return None
    return PacketTap(device, path, log if traced else None, qps)
