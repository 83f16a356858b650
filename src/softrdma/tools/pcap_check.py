"""``softrdma pcap-check``: verify every RDMA packet of capture files.

For each file, every RoCE packet (UDP port 4791 or EtherType 0x8915) is decoded
(:func:`softrdma.wire.roce.parse_frame`), its ICRC verified (roce.md §2) and the frame
re-encoded from the decoded fields and compared byte for byte with the capture. If the
iWARP checker (:mod:`softrdma.tools.pcap_check_iwarp`, class ``IwarpChecker``) is
installed, it is fed every record too and its counts join the same summary.

Output, per file: one line per failing packet (at most :data:`MAX_FAILURE_LINES`), then
``FILE: N packets, N ok, N failed``; a file that cannot be read gives one line
``FILE: cannot read: REASON`` instead. Exit status: 0 all packets ok, 1 some packet
failed, 2 some file could not be read.
"""

from __future__ import annotations

import importlib
import sys
from typing import Protocol, TextIO, cast

from ..errors import SoftRdmaError
from ..wire import cm, roce
from ..wire.pcap import PcapRecord, read_pcap

__all__ = ["Checker", "RoceChecker", "run", "MAX_FAILURE_LINES"]

MAX_FAILURE_LINES = 20

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_UNREADABLE = 2


class Checker(Protocol):
    """What :func:`run` needs from a per-protocol checker (one instance per file)."""

    def feed(self, record: PcapRecord) -> None: ...

    def results(self) -> tuple[int, int, list[str]]:
        """(packets checked, packets ok, one line per failure without the file name)."""
        ...


class RoceChecker:
    """Checks RoCE frames: decode, ICRC, byte-exact re-encode."""

    def __init__(self, ports: frozenset[int] = frozenset((roce.ROCE_V2_UDP_PORT,))) -> None:
        self.packets = 0
        self.ok = 0
        self.failures: list[str] = []
        self.ports = ports

    def feed(self, record: PcapRecord) -> None:
        """Check one captured frame; frames that are not RoCE are ignored."""
        data = record.data
        try:
            f = roce.parse_frame(data, record.linktype, self.ports)
        except SoftRdmaError as e:
            self._fail(record, f"{e}{self._cut(record)}")
            return
        if f is None:
            return
        want = roce.frame_icrc(f)
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
        if p.dqpn == 1 and p.opcode == 0x64:  # a MAD to the GSI (IBA 13.4): check it too
            err = cm.check_mad(p.payload)
            if err is not None:
                self._fail(record, f"MAD: {err}")
                return
        self.packets += 1
        self.ok += 1

    @staticmethod
    def _cut(record: PcapRecord) -> str:
        if record.orig_len > len(record.data):
            return f" (capture kept {len(record.data)} of {record.orig_len} bytes)"
        return ""

    def _fail(self, record: PcapRecord, why: str) -> None:
        self.packets += 1
        self.failures.append(f"frame {record.index}: {why}")

    def results(self) -> tuple[int, int, list[str]]:
        return self.packets, self.ok, self.failures


def _checkers(ports: frozenset[int] = frozenset((roce.ROCE_V2_UDP_PORT,))) -> list[Checker]:
    checkers: list[Checker] = [RoceChecker(ports)]
    name = f"{__package__}.pcap_check_iwarp"
    try:
        mod = importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name != name:  # the module exists but is broken: let that show
            raise
    else:
        checkers.append(cast(Checker, mod.IwarpChecker()))
    return checkers


def _reason(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e) or type(e).__name__


def check_file(path: str, out: TextIO,
               ports: frozenset[int] = frozenset((roce.ROCE_V2_UDP_PORT,))) -> int:
    """Check one capture file, print its lines, return its exit status."""
    checkers = _checkers(ports)
    try:
        for record in read_pcap(path):
            for c in checkers:
                c.feed(record)
    except (OSError, SoftRdmaError) as e:
        print(f"{path}: cannot read: {_reason(e)}", file=out)
        return EXIT_UNREADABLE
    packets = ok = 0
    lines: list[str] = []
    for c in checkers:
        n, k, fails = c.results()
        packets += n
        ok += k
        lines.extend(fails)
    for line in lines[:MAX_FAILURE_LINES]:
        print(line if line.startswith(f"{path}: ") else f"{path}: {line}", file=out)
    failed = packets - ok
    print(f"{path}: {packets} packets, {ok} ok, {failed} failed", file=out)
    return EXIT_FAILED if failed else EXIT_OK


def run(paths: list[str], out: TextIO = sys.stdout, udp_ports: tuple[int, ...] = ()) -> int:
    """Check every file in ``paths``; return 0, 1 or 2 (the worst over all files).

    ``udp_ports`` adds UDP ports to treat as RoCEv2 besides 4791."""
    if not paths:
        print("pcap-check: no capture files given", file=out)
        return EXIT_UNREADABLE
    ports = frozenset((roce.ROCE_V2_UDP_PORT, *udp_ports))
    status = EXIT_OK
    for path in paths:
        status = max(status, check_file(path, out, ports))
    return status
