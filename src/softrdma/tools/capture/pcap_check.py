"""``softrdma pcap-check``: verify every RDMA packet of capture files, and each connection.

For each file, every RoCE packet (UDP port 4791 or EtherType 0x8915) is decoded
(:func:`softrdma.wire.roce.parse_frame`), its ICRC verified (IBA 7.8.1, Annex A17) and the frame
re-encoded from the decoded fields and compared byte for byte with the capture. The
packets that pass are then followed as conversations (:mod:`softrdma.tools.capture.pcap_conv`):
each RC/UC connection from its CM REQ/REP or its TCP 18515 exchange
(:mod:`softrdma.tools.capture.pcap_oob`), checking first PSNs, PSN gaps, ACKs/NAKs, RDMA READ
responses and DREQ/DREP. If the iWARP checker (:mod:`softrdma.tools.capture.pcap_check_iwarp`,
class ``IwarpChecker``) is installed, it is fed every record too and its counts join the
same summary.

Output, per file:

- stderr: one line per failing packet and per conversation inconsistency
  (``FILE: frame N: reason``), streamed as found (nothing is kept, so memory stays flat
  however bad the input), at most ``max_errors`` of them (0: no limit), then
  ``FILE: N more failure lines not shown (--max-errors M)`` if some were held back;
  ``FILE: cannot read: REASON`` for a file that cannot be read;
- stdout: with ``verbose``, one decoded line per RoCE packet, MPA frame and FPDU (see
  :mod:`softrdma.tools.capture.pcap_check_iwarp`) and the conversation
  checks' notes (``FILE: frame N: note: ...``); then the summary
  ``FILE: N packets, N ok, N failed`` and, when a connection was followed or the CM was
  inconsistent, ``FILE: N connections followed, N inconsistent`` (with ``(the first at
  frame N)`` when some are); notes of the iWARP checker (``FILE: note: ...``).

A record of a link type pcap-check cannot decode (:data:`LINKTYPES`: Ethernet, Linux
cooked v1/v2, raw IP, BSD loopback) is not checked; the file then ends with
``FILE: cannot check N records of link type T (NAME): ...`` on stderr and counts as
unreadable, rather than passing as a file of 0 packets.

Exit status: 0 all packets and connections ok, 1 some failed, 2 some file could not be
read or holds records of a link type pcap-check cannot decode (or no file given).
"""

from __future__ import annotations

import importlib
import ipaddress
import sys
from typing import Protocol, TextIO, cast

from ...errors import SoftRdmaError
from ...wire import cm, ib, roce
from ...wire.mad import CommonAttr, MadHeader, MgmtClass
from ...wire.opcodes import Hdr
from ...wire.pcap import PcapRecord, read_pcap
from ...wire.tcpstream import parse_tcp
from .pcap_conv import ConversationChecker
from .pcap_flow import GSI_QPN
from .pcap_gso import GsoBatch, split_gso
from .pcap_oob import OobScanner

__all__ = ["Checker", "RoceChecker", "run", "check_file", "describe", "MAX_FAILURE_LINES",
           "LINKTYPES"]

MAX_FAILURE_LINES = 20  # the default of --max-errors

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_UNREADABLE = 2

#: the link types pcap-check decodes (tcpdump.org/linktypes.html; RoCE frames:
#: ``wire.roce.parse_frame``, TCP: ``wire.tcpstream.parse_tcp``)
LINKTYPES: dict[int, str] = {
    0: "NULL", 1: "ETHERNET", 12: "RAW (BSD)", 14: "RAW (BSD)", 101: "RAW", 113: "LINUX_SLL",
    228: "IPV4", 229: "IPV6", 276: "LINUX_SLL2",
}
#: names of other common link types, for the message about them
_OTHER_LINKTYPES: dict[int, str] = {
    6: "IEEE802_5", 9: "PPP", 105: "IEEE802_11", 119: "IEEE802_11_PRISM", 127:
    "IEEE802_11_RADIOTAP", 189: "USB_LINUX", 192: "PPI", 201: "BLUETOOTH_HCI_H4_WITH_PHDR",
    220: "USB_LINUX_MMAPPED", 247: "INFINIBAND", 249: "NETLINK",
    **{147 + i: f"USER{i}" for i in range(16)},
}
_CM_MAD_SIZE = 256
_NOTE = "note: "


class Checker(Protocol):
    """What :func:`check_file` needs from a per-protocol checker (one instance per file)."""

    def feed(self, record: PcapRecord) -> None: ...

    def drain(self) -> list[str]:
        """The failure lines found since the last call, without the file name."""
        ...

    def results(self) -> tuple[int, int, list[str]]:
        """End of file: (packets checked, packets ok, lines not yet drained)."""
        ...


def describe(index: int, t: float, f: roce.RoceFrame) -> str:
    """One decoded line for a RoCE frame (``pcap-check -v``): frame number, time,
    source -> destination, opcode, QPN, PSN, payload length, RETH length, AETH
    syndrome and MSN, the CM message type and its comm IDs, QPN and Starting PSN."""
    p = f.packet
    s = (f"frame {index} {t:.6f} {ipaddress.ip_address(f.src_ip)} -> "
         f"{ipaddress.ip_address(f.dst_ip)} {p.info.name} QPN {p.dqpn:#08x} PSN {p.psn:#08x} "
         f"len {len(p.payload)}")
    if p.info.hdrs & Hdr.RETH:
        s += f" RETH len {p.dma_len}"
    if p.info.hdrs & Hdr.AETH:
        t_ = p.syndrome & ib.AETH_TYPE_MASK
        if t_ == ib.AETH_ACK:
            s += f" AETH ACK MSN {p.msn}"
        elif t_ == ib.AETH_RNR_NAK:
            s += f" AETH RNR-NAK timer {p.syndrome & 0x1F} MSN {p.msn}"
        else:
            s += f" AETH NAK {ib.NAK_NAMES.get(p.syndrome, hex(p.syndrome))} MSN {p.msn}"
    if p.dqpn == GSI_QPN and len(p.payload) == _CM_MAD_SIZE:
        try:
            hdr = MadHeader.decode(p.payload)
            if hdr.mgmt_class != MgmtClass.CM or hdr.attr_id == CommonAttr.CLASS_PORT_INFO:
                return (s + f" MAD class {hdr.mgmt_class:#04x} method {hdr.method:#04x} "
                            f"attr {hdr.attr_id:#06x}")
            m = cm.decode(p.payload).msg
        except SoftRdmaError:
            return s
        s += f" CM {type(m).__name__.upper()}"
        for name, label in (("local_comm_id", "comm"), ("remote_comm_id", "remote comm"),
                            ("local_qpn", "QPN"), ("starting_psn", "Starting PSN")):
            if hasattr(m, name):
                s += f" {label} {getattr(m, name):#x}"
        eecn = getattr(m, "local_eecn", 0)
        if eecn:  # an XRC TGT QP's number (its REP, Annex A14)
            s += f" EECN {eecn:#x}"
        if getattr(m, "transport_service_type", 0) == cm.TransportServiceType.EXTENDED:
            ext = getattr(m, "extended_transport_type", 0)
            s += " XRC" if ext == 1 else f" extended transport {ext}"
    return s


class RoceChecker:
    """Checks RoCE frames: decode, ICRC, byte-exact re-encode; then the conversations."""

    def __init__(self, ports: frozenset[int] = frozenset((roce.ROCE_V2_UDP_PORT,)),
                 verbose: TextIO | None = None, prefix: str = "") -> None:
        self.packets = 0
        self.ok = 0
        self.ports = ports
        self.conv = ConversationChecker()
        self.oob = OobScanner()
        self.inconsistent = 0
        self.first_bad = 0  # the lowest frame number of an inconsistency
        self._failures: list[str] = []
        self._verbose = verbose
        self._prefix = prefix
        self._t0: float | None = None

    def feed(self, record: PcapRecord) -> None:
        """Check one captured frame; frames that are neither RoCE nor TCP are ignored."""
        data = record.data
        if self._t0 is None:
            self._t0 = record.ts
        try:
            f = roce.parse_frame(data, record.linktype, self.ports)
        except SoftRdmaError as e:
            self._fail(record, f"{e}{self._cut(record)}")
            return
        if f is None:
            self._tcp(record)
            return
        want = roce.frame_icrc(f)
        if want != f.icrc:
            batch = split_gso(f)
            if batch is not None:
                self._gso(record, batch)
                return
        self._check(record, data, f, want)

    def _gso(self, record: PcapRecord, batch: GsoBatch) -> None:
        """A UDP GSO batch captured before the kernel cut it (``tools.pcap_gso``): each
        segment is checked as the packet it becomes on the wire."""
        if self._verbose is not None:
            ids = "" if batch.base_id is None else (
                f", IPv4 IDs {batch.base_id}..{batch.base_id + len(batch) - 1}")
            print(f"{self._prefix}frame {record.index}: {_NOTE}a UDP GSO batch of "
                  f"{len(batch)} segments of {batch.size} bytes (captured before "
                  f"segmentation{ids}), checked one by one", file=self._verbose)
        for frame in batch.frames:
            seg = roce.parse_frame(frame, record.linktype, self.ports)
            assert seg is not None  # split_gso built it as a RoCEv2 frame
            self._check(record, frame, seg, roce.frame_icrc(seg))

    def _check(self, record: PcapRecord, data: bytes, f: roce.RoceFrame, want: bytes) -> None:
        assert self._t0 is not None
        if self._verbose is not None:
            print(self._prefix + describe(record.index, record.ts - self._t0, f),
                  file=self._verbose)
        if want != f.icrc:
            self._fail(record, f"bad ICRC (got 0x{f.icrc.hex()}, expected 0x{want.hex()})")
            return
        rebuilt = roce.build_frame(f)
        if rebuilt != data:
            at = next((i for i, (a, b) in enumerate(zip(rebuilt, data, strict=False)) if a != b),
                      min(len(rebuilt), len(data)))
            self._fail(record, f"re-encoded frame differs from the capture at byte {at} "
                               f"({len(rebuilt)} vs {len(data)} bytes)")
            return
        p = f.packet
        if p.dqpn == GSI_QPN and p.opcode == 0x64:  # a MAD to the GSI (IBA 13.4): check it too
            err = cm.check_mad(p.payload)
            if err is not None:
                self._fail(record, f"MAD: {err}")
                return
        self.packets += 1
        self.ok += 1
        self.conv.feed(record.index, f)
        self._findings()

    def _tcp(self, record: PcapRecord) -> None:
        try:
            seg = parse_tcp(record.linktype, record.data, record.index)
        except SoftRdmaError:
            return  # not ours to judge: the iWARP checker notes undecodable TCP
        if seg is None:
            return
        for pair in self.oob.feed(seg):
            self.conv.feed_oob(pair)
        self._findings()

    def _findings(self) -> None:
        found = self.conv.findings
        if not found:
            return
        for x in found:
            if x.note:
                if self._verbose is not None:
                    print(f"{self._prefix}frame {x.frame}: {_NOTE}{x.text}", file=self._verbose)
            else:
                self.inconsistent += 1
                self.first_bad = min(self.first_bad or x.frame, x.frame)
                self._failures.append(x.line())
        found.clear()

    @staticmethod
    def _cut(record: PcapRecord) -> str:
        if record.orig_len > len(record.data):
            return f" (capture kept {len(record.data)} of {record.orig_len} bytes)"
        return ""

    def _fail(self, record: PcapRecord, why: str) -> None:
        self.packets += 1
        self._failures.append(f"frame {record.index}: {why}")

    def drain(self) -> list[str]:
        out, self._failures = self._failures, []
        return out

    def results(self) -> tuple[int, int, list[str]]:
        self.conv.finish()
        self._findings()
        return self.packets, self.ok, self.drain()


def _checkers(ports: frozenset[int] = frozenset((roce.ROCE_V2_UDP_PORT,)),
              verbose: TextIO | None = None, prefix: str = "") -> list[Checker]:
    checkers: list[Checker] = [RoceChecker(ports, verbose, prefix)]
    name = f"{__package__}.pcap_check_iwarp"
    try:
        mod = importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name != name:  # the module exists but is broken: let that show
            raise
    else:
        checkers.append(cast(Checker, mod.IwarpChecker(verbose, prefix)))
    return checkers


def _reason(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e) or type(e).__name__


class _Lines:
    """Streams failure lines to ``err``, at most ``limit`` (0: all), counting the rest.
    ``out`` is flushed first, so that the two keep their order on one terminal or file."""

    def __init__(self, path: str, out: TextIO, err: TextIO, limit: int) -> None:
        self.path = path
        self.out = out
        self.err = err
        self.limit = limit
        self.shown = 0
        self.held = 0

    def put(self, lines: list[str]) -> None:
        for line in lines:
            if self.limit and self.shown >= self.limit:
                self.held += 1
                continue
            self.shown += 1
            if self.out is not self.err:
                self.out.flush()
            print(line if line.startswith(f"{self.path}: ") else f"{self.path}: {line}",
                  file=self.err)


def check_file(path: str, out: TextIO,
               ports: frozenset[int] = frozenset((roce.ROCE_V2_UDP_PORT,)), *,
               err: TextIO | None = None, max_errors: int = MAX_FAILURE_LINES,
               verbose: bool = False) -> int:
    """Check one capture file, print its lines, return its exit status."""
    err = sys.stderr if err is None else err
    checkers = _checkers(ports, out if verbose else None, f"{path}: ")
    lines = _Lines(path, out, err, max_errors)
    unknown: dict[int, int] = {}  # link type -> records not checked
    try:
        for record in read_pcap(path):
            if record.linktype not in LINKTYPES:
                unknown[record.linktype] = unknown.get(record.linktype, 0) + 1
                continue
            for c in checkers:
                c.feed(record)
                lines.put(c.drain())
    except BrokenPipeError:  # the reader of our output went away (``| head``): not the file's fault
        raise
    except (OSError, SoftRdmaError) as e:
        print(f"{path}: cannot read: {_reason(e)}", file=err)
        return EXIT_UNREADABLE
    packets = ok = 0
    notes: list[str] = []
    for c in checkers:
        n, k, rest = c.results()
        packets += n
        ok += k
        notes.extend(x for x in rest if x.startswith(_NOTE))
        lines.put([x for x in rest if not x.startswith(_NOTE)])
    if lines.held:
        print(f"{path}: {lines.held} more failure lines not shown (--max-errors {max_errors})",
              file=err)
    for lt, n in unknown.items():
        name = _OTHER_LINKTYPES.get(lt, "unknown")
        print(f"{path}: cannot check {n} record{'s' if n != 1 else ''} of link type {lt} "
              f"({name}): pcap-check decodes link types "
              f"{', '.join(f'{k} ({v})' for k, v in LINKTYPES.items())}", file=err)
    for note in notes:
        print(f"{path}: {note}", file=out)
    failed = packets - ok
    print(f"{path}: {packets} packets, {ok} ok, {failed} failed", file=out)
    rc = cast(RoceChecker, checkers[0])
    bad = rc.inconsistent
    if rc.conv.followed or bad:
        n = rc.conv.followed
        first = f" (the first at frame {rc.first_bad})" if bad else ""
        print(f"{path}: {n} connection{'s' if n != 1 else ''} followed, {bad} inconsistent"
              f"{first}", file=out)
    if unknown:
        return EXIT_UNREADABLE
    return EXIT_FAILED if failed or bad else EXIT_OK


def run(paths: list[str], out: TextIO = sys.stdout, udp_ports: tuple[int, ...] = (), *,
        err: TextIO | None = None, max_errors: int = MAX_FAILURE_LINES,
        verbose: bool = False) -> int:
    """Check every file in ``paths``; return 0, 1 or 2 (the worst over all files).

    ``udp_ports`` adds UDP ports to treat as RoCEv2 besides 4791; failure lines go to
    ``err`` (default stderr), at most ``max_errors`` per file (0: no limit); ``verbose``
    prints a decoded line per RoCE packet and the conversation notes on ``out``."""
    err = sys.stderr if err is None else err
    if not paths:
        print("softrdma pcap-check: error: no capture files given", file=err)
        return EXIT_UNREADABLE
    if max_errors < 0:
        print(f"softrdma pcap-check: error: --max-errors must be >= 0, got {max_errors}",
              file=err)
        return EXIT_UNREADABLE
    ports = frozenset((roce.ROCE_V2_UDP_PORT, *udp_ports))
    status = EXIT_OK
    for path in paths:
        status = max(status, check_file(path, out, ports, err=err, max_errors=max_errors,
                                        verbose=verbose))
    return status
