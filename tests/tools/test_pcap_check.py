"""softrdma.tools.capture.pcap_check: per-file summaries, failure lines and exit codes.

The RoCE packet counts are checked against tshark's count of UDP 4791 frames, and the
deliberately bad ICRC of host_peer_roce.pcap (captures README) must be the one failure.
"""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

from softrdma.tools.capture import pcap_check
from softrdma.wire import ib, roce
from softrdma.wire.pcap import PcapRecord, PcapWriter, read_pcap

CAPTURES = Path("/work/shared/captures")
ROCE_PCAPS = sorted(CAPTURES.glob("roce_*.pcap"))
SUMMARY = re.compile(r"^(?P<file>.+): (?P<n>\d+) packets, (?P<ok>\d+) ok, (?P<failed>\d+) failed$")


CONV = re.compile(r"^(?P<file>.+): (?P<n>\d+) connections? followed, (?P<bad>\d+) inconsistent"
                  r"(?: \(the first at frame \d+\))?$")


def _run(paths: list[str]) -> tuple[int, list[str]]:
    """stdout and stderr interleaved, as a terminal shows them."""
    out = io.StringIO()
    rc = pcap_check.run(paths, out, err=out)
    return rc, out.getvalue().splitlines()


def _packet_lines(lines: list[str]) -> list[str]:
    """Without the conversation summaries."""
    return [x for x in lines if not CONV.match(x)]


@pytest.fixture(autouse=True)
def _no_iwarp_checker(monkeypatch: pytest.MonkeyPatch) -> None:
    """Count RoCE only, whether or not the iWARP checker exists yet (tested separately)."""
    monkeypatch.setattr(pcap_check, "_checkers", lambda ports=frozenset((4791,)), verbose=None, prefix="":
                        [pcap_check.RoceChecker(ports, verbose, prefix)])


def _tshark_roce_count(path: Path) -> int:
    out = subprocess.run(["tshark", "-r", str(path), "-Y", "udp.dstport == 4791", "-T", "fields",
                          "-e", "frame.number"], capture_output=True, text=True, check=True,
                         timeout=60).stdout
    return len(out.split())


@pytest.mark.parametrize("path", ROCE_PCAPS, ids=[p.name for p in ROCE_PCAPS])
def test_every_roce_capture_passes(path: Path) -> None:
    rc, lines = _run([str(path)])
    assert rc == 0
    if path.name == "roce_ud_pingpong.pcap":  # UD: no connection to follow
        assert len(lines) == 1
    else:
        assert len(lines) == 2
        c = CONV.match(lines[1])
        assert c and c["file"] == str(path) and int(c["n"]) >= 1 and c["bad"] == "0"
    m = SUMMARY.match(lines[0])
    assert m and m["file"] == str(path)
    n = int(m["n"])
    assert n > 0 and int(m["ok"]) == n and int(m["failed"]) == 0
    if shutil.which("tshark"):
        assert n == _tshark_roce_count(path)


def test_all_roce_captures_in_one_run() -> None:
    rc, lines = _run([str(p) for p in ROCE_PCAPS])
    assert rc == 0 and len(lines) == 2 * len(ROCE_PCAPS) - 1  # UD pingpong: no connection
    assert all(SUMMARY.match(line) for line in _packet_lines(lines))
    assert sum(int(m["n"]) for m in map(CONV.match, lines) if m) == len(ROCE_PCAPS)
    assert all(m["bad"] == "0" for m in map(CONV.match, lines) if m)


def test_host_peer_has_exactly_one_bad_icrc() -> None:
    path = str(CAPTURES / "host_peer_roce.pcap")
    rc, lines = _run([path])
    assert rc == 1
    assert len(lines) == 2
    assert re.fullmatch(re.escape(path) + r": frame 1: bad ICRC \(got 0xf4a69cb4, expected 0x[0-9a-f]{8}\)",
                        lines[0])
    m = SUMMARY.match(lines[1])
    assert m and int(m["n"]) == 3 and int(m["ok"]) == 2 and int(m["failed"]) == 1


def test_non_roce_captures_count_nothing() -> None:
    rc, lines = _run([str(CAPTURES / "iwarp_rping.pcap")])
    assert rc == 0 and lines == [f"{CAPTURES / 'iwarp_rping.pcap'}: 0 packets, 0 ok, 0 failed"]


@pytest.mark.parametrize("content, why", [
    (b"garbage that is no capture file\n" * 3, "not a pcap"),
    (b"", "empty file"),
    (None, "No such file"),
    ("truncated", "truncated record"),
    ("short-header", "truncated pcap file header"),
])
def test_unreadable_files_give_exit_2_and_one_line(tmp_path: Path, content: bytes | str | None,
                                                   why: str) -> None:
    path = tmp_path / "input.pcap"
    if content == "truncated":
        raw = (CAPTURES / "roce_ucmatose.pcap").read_bytes()
        path.write_bytes(raw[:len(raw) // 2])
    elif content == "short-header":
        path.write_bytes((CAPTURES / "roce_ucmatose.pcap").read_bytes()[:17])
    elif isinstance(content, bytes):
        path.write_bytes(content)
    rc, lines = _run([str(path)])
    assert rc == 2
    assert len(lines) == 1
    assert lines[0].startswith(f"{path}: cannot read: ") and why in lines[0]
    assert "Traceback" not in lines[0]


def test_worst_status_wins(tmp_path: Path) -> None:
    good = str(ROCE_PCAPS[0])
    bad = str(CAPTURES / "host_peer_roce.pcap")
    assert _run([good])[0] == 0
    assert _run([good, bad])[0] == 1
    rc, lines = _run([good, str(tmp_path / "missing.pcap"), bad])
    assert rc == 2 and len(_packet_lines(lines)) == 1 + 1 + 2
    assert _run([])[0] == 2


def _roce_frames(name: str) -> list[bytes]:
    return [r.data for r in read_pcap(CAPTURES / f"{name}.pcap")
            if roce.parse_frame(r.data, r.linktype) is not None]


def test_bad_packets_inside_a_valid_pcap(tmp_path: Path) -> None:
    frames = _roce_frames("roce_rc_pingpong")
    good, other = frames[0], frames[1]
    corrupt = bytearray(other)
    corrupt[-10] ^= 0x01  # payload bit: ICRC no longer matches
    unknown_opcode = bytearray(good)
    unknown_opcode[14 + 28] = 0x15
    arp = bytes(12) + b"\x08\x06" + bytes(28)
    path = tmp_path / "mixed.pcap"
    with PcapWriter(path) as w:
        w.write(good, ts=1.0)                          # 1 ok
        w.write(good[:50], ts=2.0)                     # 2 truncated RoCE frame
        w.write(bytes(corrupt), ts=3.0)                # 3 bad ICRC
        w.write(arp, ts=4.0)                           # 4 not RoCE: skipped
        w.write(bytes(unknown_opcode), ts=5.0)         # 5 unknown opcode
        w.write(b"\x01\x02", ts=6.0)                   # 6 not even an Ethernet header
        w.write(other, ts=7.0)                         # 7 ok
    rc, lines = _run([str(path)])
    assert rc == 1
    p = str(path)
    assert lines[0] == f"{p}: frame 2: IPv4 total length {len(good) - 14} exceeds the 36 bytes captured"
    assert re.fullmatch(re.escape(p) + r": frame 3: bad ICRC \(got 0x[0-9a-f]{8}, expected 0x[0-9a-f]{8}\)", lines[1])
    assert lines[2].startswith(f"{p}: frame 5: IB transport: ") and "opcode 0x15" in lines[2]
    assert lines[3] == f"{p}: frame 6: truncated Ethernet header: 2 bytes"
    assert lines[4] == f"{p}: 6 packets, 2 ok, 4 failed"


def test_snaplen_cut_is_explained(tmp_path: Path) -> None:
    good = _roce_frames("roce_rc_pingpong")[0]
    path = tmp_path / "snap.pcap"
    with PcapWriter(path, snaplen=64) as w:
        w.write(good, ts=1.0)
    rc, lines = _run([str(path)])
    assert rc == 1
    assert lines[0].endswith(f"(capture kept 64 of {len(good)} bytes)")


def test_rebuild_mismatch_is_reported(tmp_path: Path) -> None:
    # Nonzero pad bytes are covered by the ICRC but re-encoded as zeros (IBA 9.2.3).
    src, dst = bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2])
    body = bytearray(ib.encode(ib.IBPacket(0x04, psn=1, dqpn=5, payload=b"abc")))
    body[-1] = 0x7F
    ic = roce.udp_send_icrc(src, dst, 0xC000, 4791, [body])
    ulen = 8 + len(body) + 4
    frame = (bytes(12) + b"\x08\x00" + roce.ipv4_header(src, dst, ulen)
             + roce.udp_header(0xC000, 4791, ulen) + bytes(body) + ic)
    path = tmp_path / "pad.pcap"
    with PcapWriter(path) as w:
        w.write(frame, ts=1.0)
    rc, lines = _run([str(path)])
    assert rc == 1
    assert lines[0] == f"{path}: frame 1: re-encoded frame differs from the capture at byte {len(frame) - 5} ({len(frame)} vs {len(frame)} bytes)"


def test_at_most_20_failure_lines(tmp_path: Path) -> None:
    good = _roce_frames("roce_rc_pingpong")[0]
    path = tmp_path / "many.pcap"
    with PcapWriter(path) as w:
        for i in range(30):
            w.write(good[:40 + i], ts=float(i))
        w.write(good, ts=99.0)
    rc, lines = _run([str(path)])
    assert rc == 1
    assert len(lines) == 22
    assert [int(re.search(r"frame (\d+):", x)[1]) for x in lines[:20]] == list(range(1, 21))  # type: ignore[index]
    assert lines[20] == f"{path}: 10 more failure lines not shown (--max-errors 20)"
    assert lines[21] == f"{path}: 31 packets, 1 ok, 30 failed"


def test_iwarp_extension_point(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A ``pcap_check_iwarp.IwarpChecker`` is fed every record and joins the summary."""
    monkeypatch.undo()  # use the real _checkers
    seen: list[int] = []

    class FakeIwarpChecker:
        def __init__(self, verbose: object = None, prefix: str = "") -> None:
            pass  # the -v stream and line prefix (issue 24: -v decodes iWARP too)

        def feed(self, record: PcapRecord) -> None:
            seen.append(record.index)

        def drain(self) -> list[str]:
            return []

        def results(self) -> tuple[int, int, list[str]]:
            return 5, 4, ["frame 3: bad MPA CRC"]

    mod = types.ModuleType("softrdma.tools.capture.pcap_check_iwarp")
    mod.IwarpChecker = FakeIwarpChecker  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "softrdma.tools.capture.pcap_check_iwarp", mod)
    path = CAPTURES / "roce_ucmatose.pcap"
    rc, lines = _run([str(path)])
    assert rc == 1
    assert lines == [f"{path}: frame 3: bad MPA CRC", f"{path}: 30 packets, 29 ok, 1 failed",
                     f"{path}: 1 connection followed, 0 inconsistent"]
    assert seen == list(range(1, 26))


def test_missing_iwarp_module_is_fine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.undo()
    monkeypatch.setitem(sys.modules, "softrdma.tools.capture.pcap_check_iwarp", None)  # import fails
    with pytest.raises(ImportError):
        import softrdma.tools.capture.pcap_check_iwarp  # noqa: F401
    checkers = pcap_check._checkers()
    assert [type(c).__name__ for c in checkers] == ["RoceChecker"]


def test_unknown_link_type_exits_2_and_names_it(tmp_path: Path) -> None:
    """Issue 21: a capture of a link type pcap-check cannot decode passed as "0 packets"
    with exit 0; it is unreadable (2), and the message names the link type."""
    path = tmp_path / "user0.pcap"
    with PcapWriter(path, linktype=147) as w:  # LINKTYPE_USER0
        w.write(bytes(60), 1.0)
        w.write(bytes(60), 2.0)
    out, err = io.StringIO(), io.StringIO()
    rc = pcap_check.run([str(path)], out, err=err)
    assert rc == 2
    assert err.getvalue().startswith(f"{path}: cannot check 2 records of link type 147 (USER0): "
                                     "pcap-check decodes link types 0 (NULL), 1 (ETHERNET)")
    # a decodable capture beside it is still checked, and the worst status wins
    other = Path(__file__).parents[1] / "data" / "rxe_write_bw_tail_loss.pcap"
    out = io.StringIO()
    rc = pcap_check.run([str(other), str(path)], out, err=io.StringIO())
    assert rc == 2
    assert f"{other}: 52 packets, 52 ok, 0 failed" in out.getvalue().splitlines()
