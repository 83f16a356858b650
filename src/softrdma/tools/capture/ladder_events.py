"""The events of a capture as a ladder (sequence) diagram shows them: ``softrdma ladder``.

:func:`capture_events` reads a pcap/pcapng file with the project's decoders (RoCE:
:func:`softrdma.wire.roce.parse_frame`, the CM MADs :func:`softrdma.wire.cm.decode`,
the TCP 18515 exchange of the pingpong tools and perftest
:class:`softrdma.tools.capture.pcap_oob.OobScanner`; iWARP: :mod:`softrdma.tools.capture.ladder_iwarp`)
and returns a :class:`Ladder`: one lane per endpoint (RoCE: IP address and QPN; iWARP: IP
address and TCP port) and one row per arrow or mark, in capture order.

A UDP GSO batch captured on ``lo`` before the kernel cut it (one datagram holding up to
64 packets) is split into its packets first (:func:`softrdma.tools.capture.pcap_gso.split_gso`).

What a row says:

- CM messages (REQ, REP, RTU, DREQ, DREP, REJ, MRA, SIDR; IBA 12.6) and the MPA Request
  and Reply (RFC 5044 §7.1), drawn between the two ends of the connection they set up;
- data packets: a run of MIDDLE packets of one message (IBA 9.7.1) becomes one arrow
  labelled with its PSN range, as does a run of non-last DDP segments (RFC 5041 §5);
- ACK/NAK with the AETH syndrome and MSN (IBA 9.7.5.1, Table 44);
- RDMA READ responses, retransmissions (a request PSN behind the next one, IBA 9.7.2;
  a READ response PSN already seen) and Terminates (RFC 5040 §7.2) as such;
- gaps from capture loss (a request PSN ahead of the next one; octets missing from a
  TCP stream) as gap marks.

The PSN of each request and NAK is kept per connection direction for the PSN plot
(:mod:`softrdma.tools.capture.ladder_draw`).
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass

from ...errors import DecodeError, SoftRdmaError
from ...wire import cm as wcm
from ...wire import ib, roce
from ...wire.opcodes import Hdr, Kind, Pos
from ...wire.pcap import read_pcap
from ...wire.tcpstream import parse_tcp
from .ladder_iwarp import IwarpLadder
from .ladder_model import KINDS, End, Ladder, Lane, PsnPoint, Row
from .pcap_flow import GSI_QPN, MTUS, psn_delta
from .pcap_gso import split_gso
from .pcap_oob import OobScanner

__all__ = ["Lane", "Row", "PsnPoint", "Ladder", "capture_events", "KINDS"]

PSN_MOD = 1 << 24
MAX_PSN_POINTS = 200_000  # per connection direction, for the PSN plot


def _ip(b: bytes) -> str:
    a = ipaddress.ip_address(b)
    if isinstance(a, ipaddress.IPv6Address) and a.ipv4_mapped is not None:
        return str(a.ipv4_mapped)
    return str(a)


def _qp(qpn: int | None) -> str:
    return "QP ?" if qpn is None else f"QP {qpn:#x}"


def _aeth(p: ib.IBPacket) -> tuple[str, str]:
    """(kind, text) of an AETH: ACK / RNR NAK / NAK with its syndrome (IBA 9.7.5.2.1)."""
    t = p.syndrome & ib.AETH_TYPE_MASK
    if t == ib.AETH_ACK:
        return "ack", f"ACK PSN {p.psn:#x} MSN {p.msn}"
    if t == ib.AETH_RNR_NAK:
        return "nak", f"RNR NAK (timer {p.syndrome & 0x1F}) PSN {p.psn:#x} MSN {p.msn}"
    why = ib.NAK_NAMES.get(p.syndrome, f"syndrome {p.syndrome:#x}")
    return "nak", f"NAK {why} PSN {p.psn:#x} MSN {p.msn}"


def _short(name: str) -> str:
    """``RC_SEND_MIDDLE`` -> ``SEND MIDDLE`` (the service shows in the lanes)."""
    return name.split("_", 1)[1].replace("_", " ") if "_" in name else name


@dataclass
class _Flow:
    """The requests of one side of a RoCE connection (one direction) and their responses."""

    key: tuple[str, str, int]  # (src ip, dst ip, dest QPN) of the requests
    next_psn: int | None = None
    slack: int = 0  # PSNs after next_psn that may still be the next (a READ of unknown PMTU)
    read_high: int | None = None  # highest READ response PSN seen (response direction)
    pmtu: int | None = None


class _Builder:
    def __init__(self, ports: frozenset[int], max_rows: int = 0) -> None:
        self.ports = ports
        self.max_rows = max_rows
        self._left_out = 0
        self._truncated = False
        self.ladder = Ladder()
        self.t0: float | None = None
        self.t_last = 0.0
        # Pending rows whose ends are resolved once the capture is read.
        self._pending: list[tuple[Row, End, End]] = []
        self._flows: dict[tuple[str, str, int], _Flow] = {}
        self._peer: dict[tuple[str, int], tuple[str, int]] = {}  # (ip, qpn) <-> (ip, qpn)
        self._seen: dict[tuple[str, str], set[int]] = {}  # (src, dst) -> dest QPNs seen
        self._comm: dict[int, tuple[str, int]] = {}  # comm ID -> (ip, qpn)
        self._partner: dict[int, int] = {}  # comm ID <-> comm ID (from the REP)
        self._mtu: dict[tuple[str, int], int] = {}  # (ip, qpn) -> path MTU of its REQ
        self._oob = OobScanner()
        self._iwarp = IwarpLadder(self)
        self._psn_series: dict[tuple[str, str, int], list[PsnPoint]] = {}

    # -- rows --------------------------------------------------------------------------

    @property
    def notes(self) -> list[str]:
        """The ladder's notes (what could not be decoded, what was left out)."""
        return self.ladder.notes

    def add(self, row: Row, src: End, dst: End) -> None:
        if self.max_rows and len(self._pending) >= self.max_rows:
            self._left_out += 1  # kept: only the count, so memory stays flat
            self._truncated = True
            return
        """The ends, resolved once the capture is read: ("ip", addr, QPN) and ("src",
        addr, dst addr, dest QPN) for RoCE packets, ("cm", addr, comm ID) and ("cmr",
        addr, sender's comm ID, remote comm ID) for CM messages, ("lane", addr, text)."""
        self._pending.append((row, src, dst))

    def last(self) -> Row | None:
        """The last row, which a run may extend (none once rows are left out)."""
        return self._pending[-1][0] if self._pending and not self._truncated else None

    def _point(self, key: tuple[str, str, int], pt: PsnPoint) -> None:
        pts = self._psn_series.setdefault(key, [])
        if len(pts) < MAX_PSN_POINTS:
            pts.append(pt)
        elif len(pts) == MAX_PSN_POINTS:
            pts.append(pt)
            self.ladder.notes.append(f"PSN plot: only the first {MAX_PSN_POINTS} points of "
                                     f"a direction are kept")

    # -- RoCE --------------------------------------------------------------------------

    def feed(self, index: int, ts: float, linktype: int, data: bytes) -> None:
        self.ladder.frames += 1
        if self.t0 is None:
            self.t0 = ts
        t = self.t_last = ts - self.t0
        try:
            f = roce.parse_frame(data, linktype, self.ports)
        except SoftRdmaError as e:
            self.ladder.notes.append(f"frame {index}: not decoded: {e}")
            return
        if f is None:
            self._tcp_frame(index, t, linktype, data)
            return
        if len(f.packet.payload) > MTUS[-1]:  # more than a packet: a UDP GSO batch?
            batch = split_gso(f)
            if batch is not None:  # captured before the kernel cut it (tools.pcap_gso)
                for frame in batch.frames:
                    seg = roce.parse_frame(frame, linktype, self.ports)
                    assert seg is not None  # split_gso built it as a RoCEv2 frame
                    self._packet(index, t, seg)
                return
        self._packet(index, t, f)

    def _packet(self, index: int, t: float, f: roce.RoceFrame) -> None:
        p = f.packet
        src, dst = _ip(f.src_ip), _ip(f.dst_ip)
        if p.dqpn == GSI_QPN:
            self._mad(index, t, src, dst, p)
            return
        self._seen.setdefault((src, dst), set()).add(p.dqpn)
        if p.info.hdrs & Hdr.DETH:  # UD: the source QPN is on the wire (IBA 9.8.2)
            self._peer.setdefault((dst, p.dqpn), (src, p.src_qp))
        info = p.info
        if info.is_response:
            self._response(index, t, src, dst, p)
        elif info.is_request:
            self._request(index, t, src, dst, p)
        else:  # CNP
            self.add(Row(index, t, (src, ""), (dst, ""), _short(info.name), "data"),
                      ("src", src, dst, str(p.dqpn)), ("ip", dst, str(p.dqpn)))

    def _flow(self, key: tuple[str, str, int]) -> _Flow:
        fl = self._flows.get(key)
        if fl is None:
            fl = self._flows[key] = _Flow(key)
        return fl

    def _span(self, fl: _Flow, p: ib.IBPacket) -> tuple[int, int]:
        """The fewest and most PSNs request ``p`` takes: an RDMA READ takes
        ``ceil(length / PMTU)`` (IBA 9.7.4.1.3); until the PMTU is known, any of them."""
        if p.info.kind != Kind.READ_REQ:
            return 1, 1
        mtu = fl.pmtu or self._mtu.get((fl.key[1], p.dqpn))
        if mtu:
            n = max(1, -(-p.dma_len // mtu))
            return n, n
        return max(1, -(-p.dma_len // MTUS[-1])), max(1, -(-p.dma_len // MTUS[0]))

    def _request(self, index: int, t: float, src: str, dst: str, p: ib.IBPacket) -> None:
        key = (src, dst, p.dqpn)
        fl = self._flow(key)
        info = p.info
        if not info.pos & Pos.LAST and len(p.payload) in MTUS:
            fl.pmtu = len(p.payload)
        kind = "read" if info.kind == Kind.READ_REQ else "data"
        ends = (("src", src, dst, str(p.dqpn)), ("ip", dst, str(p.dqpn)))
        if fl.next_psn is not None:
            d = psn_delta(p.psn, fl.next_psn)
            if d < 0:
                kind = "retrans"
            elif d > fl.slack:
                self.add(Row(index, t, ("", ""), ("", ""),
                              f"capture gap: PSN {fl.next_psn:#x}..{(p.psn - 1) % PSN_MOD:#x} "
                              f"({d} packet{'s' if d > 1 else ''}) not in the capture", "gap"), *ends)
        low, high = self._span(fl, p)
        if kind != "retrans":
            fl.next_psn = (p.psn + low) % PSN_MOD
            fl.slack = high - low
        self._point(key, PsnPoint(t, p.psn, kind))
        name = _short(info.name) if kind == "data" else f"retransmitted {_short(info.name)}"
        if info.pos == Pos.MIDDLE and kind != "read" and self._extend(fl, p, name, kind):
            return
        label = f"{_short(info.name)} PSN {p.psn:#x}"
        if info.hdrs & Hdr.RETH:
            label += f" len {p.dma_len}"
        elif len(p.payload):
            label += f" len {len(p.payload)}"
        if kind == "retrans":
            label = f"retransmitted {label}"
        row = Row(index, t, ("", ""), ("", ""), label, kind)
        if info.pos == Pos.MIDDLE and kind != "read":
            row._run = (fl, p.opcode, p.psn, p.psn)
        self.add(row, *ends)

    def _extend(self, fl: _Flow | None, p: ib.IBPacket, name: str, kind: str) -> bool:
        """Add MIDDLE packet ``p`` to the run of MIDDLEs of the last row, if it continues
        it (same flow and opcode, next PSN)."""
        last = self.last()
        run = last._run if last is not None else None
        if (last is None or run is None or fl is None or run[0] is not fl
                or last.kind != kind or run[1] != p.opcode or (run[3] + 1) % PSN_MOD != p.psn):
            return False
        last.count += 1
        last.label = f"{name} x{last.count} PSN {run[2]:#x}..{p.psn:#x}"
        last._run = (fl, p.opcode, run[2], p.psn)
        return True

    def _response(self, index: int, t: float, src: str, dst: str, p: ib.IBPacket) -> None:
        # The responses of flow (dst -> src) come from src to the requester (dst, dqpn).
        info = p.info
        ends = (("src", src, dst, str(p.dqpn)), ("ip", dst, str(p.dqpn)))
        if info.kind == Kind.READ_RESP:
            fl = self._flow_towards(dst, src, p.dqpn)
            if fl is not None and not info.pos & Pos.LAST and len(p.payload) in MTUS:
                fl.pmtu = len(p.payload)
            label = f"READ response {_short(info.name).rsplit(' ', 1)[-1]} PSN {p.psn:#x}"
            kind = "read"
            if fl is not None:
                if fl.read_high is not None and psn_delta(p.psn, fl.read_high) <= 0:
                    kind, label = "retrans", f"retransmitted {label}"
                else:
                    fl.read_high = p.psn
            if info.hdrs & Hdr.AETH:
                label += f" MSN {p.msn}"
            if (info.pos == Pos.MIDDLE and kind == "read"
                    and self._extend(fl, p, "READ response MIDDLE", kind)):
                return
            row = Row(index, t, ("", ""), ("", ""), label, kind)
            if info.pos == Pos.MIDDLE and kind == "read" and fl is not None:
                row._run = (fl, p.opcode, p.psn, p.psn)
            self.add(row, *ends)
            return
        kind, label = _aeth(p)
        if info.kind == Kind.ATOMIC_ACK:
            label = f"ATOMIC {label}"
        if kind == "nak":
            fl = self._flow_towards(dst, src, p.dqpn)
            if fl is not None:
                self._point(fl.key, PsnPoint(t, p.psn, "nak"))
        self.add(Row(index, t, ("", ""), ("", ""), label, kind), *ends)

    def _flow_towards(self, req_src: str, req_dst: str, req_src_qpn: int) -> _Flow | None:
        """The flow of requests from (req_src, QP req_src_qpn) to req_dst."""
        peer = self._peer.get((req_src, req_src_qpn))
        if peer is not None and peer[0] == req_dst:
            return self._flows.get((req_src, req_dst, peer[1]))
        cands = [fl for k, fl in self._flows.items() if k[0] == req_src and k[1] == req_dst]
        return cands[0] if len(cands) == 1 else None

    def _mad(self, index: int, t: float, src: str, dst: str, p: ib.IBPacket) -> None:
        try:
            m = wcm.decode(p.payload).msg
        except SoftRdmaError:
            self.add(Row(index, t, ("", ""), ("", ""), "MAD", "cm"),
                      ("lane", src, "QP 0x1"), ("lane", dst, "QP 0x1"))
            return
        name = type(m).__name__.upper().replace("SIDRREQ", "SIDR_REQ").replace(
            "SIDRREP", "SIDR_REP")
        local = getattr(m, "local_comm_id", None)
        remote = getattr(m, "remote_comm_id", None)
        label = name
        if isinstance(m, wcm.Req):
            self._comm[m.local_comm_id] = (src, m.local_qpn)
            self._mtu[(src, m.local_qpn)] = MTUS[m.path_mtu - 1] if 1 <= m.path_mtu <= 5 else 0
            label += f" QPN {m.local_qpn:#x} PSN {m.starting_psn:#x}"
        elif isinstance(m, wcm.Rep):
            self._comm[m.local_comm_id] = (src, m.local_qpn)
            self._partner[m.local_comm_id] = m.remote_comm_id
            self._partner[m.remote_comm_id] = m.local_comm_id
            peer = self._comm.get(m.remote_comm_id)
            if peer is not None:
                self._peer[peer] = (src, m.local_qpn)
                self._peer[(src, m.local_qpn)] = peer
                mtu = self._mtu.get(peer)
                if mtu:
                    self._mtu[(src, m.local_qpn)] = mtu
            label += f" QPN {m.local_qpn:#x} PSN {m.starting_psn:#x}"
        elif isinstance(m, wcm.Rej):
            label += f" reason {m.reason}"
        if local is None:
            self.add(Row(index, t, ("", ""), ("", ""), label, "cm"),
                      ("lane", src, "QP 0x1"), ("lane", dst, "QP 0x1"))
            return
        self.add(Row(index, t, ("", ""), ("", ""), label, "cm"),
                  ("cm", src, str(local)), ("cmr", dst, str(local), str(remote or 0)))

    def _tcp_frame(self, index: int, t: float, linktype: int, data: bytes) -> None:
        try:
            seg = parse_tcp(linktype, data, index)
        except DecodeError as e:
            self.ladder.notes.append(f"frame {index}: not decoded: {e}")
            return
        if seg is None:
            return
        for pair in self._oob.feed(seg):
            a = (_ip(pair.client.ip), pair.client.qpn)
            b = (_ip(pair.server.ip), pair.server.qpn)
            self._peer[a] = b
            self._peer[b] = a
        self._iwarp.feed(t, seg)


    # -- the end -----------------------------------------------------------------------

    def finish(self) -> Ladder:
        self._iwarp.flush(self.t_last)
        lad = self.ladder
        lanes: dict[Lane, None] = {}
        for row, src, dst in self._pending:
            row.src = self._end(src)
            row.dst = self._end(dst)
            row._run = None
            lanes.setdefault(row.src)
            lanes.setdefault(row.dst)
        shown = [r for r, _, _ in self._pending]
        if not shown:
            lad.notes.append(f"no RoCE or iWARP traffic in {lad.frames} frames (RoCEv2 on UDP "
                             f"port{'s' if len(self.ports) > 1 else ''} "
                             f"{', '.join(map(str, sorted(self.ports)))}; a device on another "
                             f"UDP port needs --udp-port N)")
        if self._left_out:
            lad.notes.append(f"{self._left_out} more rows not shown (--max-rows "
                             f"{self.max_rows})")
        lad.rows = shown
        lad.lanes = list(lanes)
        for key, pts in self._psn_series.items():
            src_qpn = self._src_qpn(key[0], key[1], key[2])
            name = f"{key[0]} {_qp(src_qpn)} -> {key[1]} {_qp(key[2])}"
            lad.psns[name] = pts
        return lad

    def _src_qpn(self, src: str, dst: str, dqpn: int) -> int | None:
        peer = self._peer.get((dst, dqpn))
        if peer is not None and peer[0] == src:
            return peer[1]
        back = self._seen.get((dst, src), set())
        return next(iter(back)) if len(back) == 1 else None

    def _end(self, spec: End) -> Lane:
        kind = spec[0]
        if kind == "lane":
            return (spec[1], spec[2])
        if kind == "src":  # the sender of a packet: (ip, dst ip, dest QPN)
            return (spec[1], _qp(self._src_qpn(spec[1], spec[2], int(spec[3]))))
        if kind == "ip":
            return (spec[1], _qp(int(spec[2])))
        # CM: the sender's end is its comm ID's; the receiver's is its partner's.
        local = int(spec[2])
        if kind == "cm":
            hit = self._comm.get(local)
        else:
            other = self._partner.get(local) or int(spec[3]) or None
            hit = self._comm.get(other) if other is not None else None
        if hit is None or hit[0] != spec[1]:
            return (spec[1], "QP 0x1")
        return (hit[0], _qp(hit[1]))


def capture_events(path: str | os.PathLike[str], udp_ports: tuple[int, ...] = (),
                   max_rows: int = 0) -> Ladder:
    """The :class:`Ladder` of capture file ``path`` (pcap or pcapng); ``udp_ports``:
    more UDP ports to read as RoCEv2; ``max_rows``: keep the first N rows (0: all).
    Raises :class:`~softrdma.errors.DecodeError` for a file that is not a capture and
    :class:`OSError` for one that cannot be read."""
    b = _Builder(frozenset((roce.ROCE_V2_UDP_PORT, *udp_ports)), max_rows)
    for rec in read_pcap(path):
        b.feed(rec.index, rec.ts, rec.linktype, rec.data)
    return b.finish()
