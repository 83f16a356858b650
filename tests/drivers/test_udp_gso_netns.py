"""UDP GSO on the wire: an RC RDMA WRITE between two network namespaces over a veth pair,
captured with tcpdump and checked by an independent ICRC checker (root only).

On ``lo`` a GSO send stays one packet up to the receiving socket, so the IPv4
Identifications the ICRC covers never appear. Here the sending veth has
``gso_max_segs 1``, so the kernel segments every GSO send in software before the device
(``validate_xmit_skb``), exactly as for a NIC without UDP segmentation offload, and the
capture holds the packets as a peer receives them. Every captured RoCEv2 packet must
have a correct ICRC (``../shared/lab/verify_crc.py`` when present, and the checker
below, which is written from IBA 7.8.1 / Annex A17 with zlib only), the segments of a
batch must carry IDs 0, 1 .. n-1, batching must have happened (the writer's
``gso_sends``), and the target's memory must hold the written bytes. The same transfer
with ``SOFTRDMA_GSO=0`` sends every packet with ID 0.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import re
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness.wait import StreamLines

from softrdma.interop.lab import LabError, locate_shared

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tcpdump") is None,
    reason="the veth capture needs root (netns, veth), iproute2 and tcpdump")

HERE = Path(__file__).resolve().parents[1]
PEER = HERE / "harness/udp_gso_peer.py"


def _verify_crc() -> Path | None:
    """The lab's ICRC checker, where the project finds the lab (``locate_shared``:
    ``../shared`` beside the clone, ``$SOFTRDMA_SHARED``, ``/work/shared``); None without."""
    try:
        path = locate_shared(HERE.parent) / "lab" / "verify_crc.py"
    except LabError:
        return None
    return path if path.is_file() else None


VERIFY_CRC = _verify_crc()
A_IP, B_IP = "10.203.7.1", "10.203.7.2"
MSG, COUNT, MTU_1024 = 96 * 1024, 6, 3


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=30)


@pytest.fixture
def netns_pair() -> Iterator[tuple[str, str]]:
    tag = f"{os.getpid() % 100000}"
    a, b = f"srgso-a{tag}", f"srgso-b{tag}"
    try:
        sh("ip", "netns", "add", a)
        sh("ip", "netns", "add", b)
        sh("ip", "link", "add", "gsoa", "netns", a, "type", "veth", "peer", "name", "gsob",
           "netns", b)
        for ns, dev, ip in ((a, "gsoa", A_IP), (b, "gsob", B_IP)):
            sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        # segment in software before the device: the capture sees the real packets
        sh("ip", "-n", a, "link", "set", "gsoa", "gso_max_segs", "1")
        yield a, b
    finally:
        for ns in (a, b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


# ---- an independent ICRC checker (IBA 7.8.1, Annex A17; ../shared/specs/roce.md §2) ---------
def pcap_frames(path: Path) -> Iterator[bytes]:
    data = path.read_bytes()
    magic = struct.unpack_from("<I", data)[0]
    end = "<" if magic in (0xA1B2C3D4, 0xA1B23C4D) else ">"
    assert struct.unpack_from(end + "I", data, 20)[0] == 1, "expected Ethernet captures"
    off = 24
    while off + 16 <= len(data):
        _s, _u, incl, _orig = struct.unpack_from(end + "IIII", data, off)
        yield data[off + 16:off + 16 + incl]
        off += 16 + incl


def roce_packets(path: Path) -> list[tuple[str, int, bytes, bool]]:
    """(source IP, IPv4 ID, BTH .. ICRC, ICRC ok) of every IPv4 UDP/4791 frame."""
    out = []
    for f in pcap_frames(path):
        if len(f) < 14 + 20 + 8 or f[12:14] != b"\x08\x00":
            continue
        ip = f[14:]
        ihl = (ip[0] & 0xF) * 4
        total = struct.unpack_from("!H", ip, 2)[0]
        ip = ip[:total]
        if ip[9] != 17 or struct.unpack_from("!H", ip, ihl + 2)[0] != 4791:
            continue
        masked_ip = bytearray(ip[:ihl])
        masked_ip[1] = masked_ip[8] = 0xFF
        masked_ip[10:12] = b"\xff\xff"
        udp = bytearray(ip[ihl:ihl + 8])
        udp[6:8] = b"\xff\xff"
        ib = bytearray(ip[ihl + 8:-4])
        ib[4] = 0xFF
        want = zlib.crc32(b"\xff" * 8 + bytes(masked_ip) + bytes(udp) + bytes(ib))
        got = struct.unpack("<I", ip[-4:])[0]
        src = ".".join(str(x) for x in ip[12:16])
        out.append((src, struct.unpack_from("!H", ip, 4)[0], bytes(ip[ihl + 8:]), want == got))
    return out


def id_runs(ids: list[int], lost: int = 0) -> list[int]:
    """Lengths of the runs 0, 1, 2 .. in ``ids``; fails on an ID that continues none.

    With ``lost`` packets missing from the capture (tcpdump's "dropped by kernel"), a run
    may skip IDs, and a run may begin past 0 where its first IDs were lost (at most
    ``lost`` IDs skipped in all); within a run the IDs still strictly increase."""
    runs: list[int] = []
    last = -1
    for i in ids:
        if i == 0:
            runs.append(1)
        elif runs and last < i <= last + 1 + lost:
            lost -= i - last - 1
            runs[-1] += 1
        else:
            assert i <= lost, f"ID {i} after ID {last}, with {lost} lost IDs left to skip"
            lost -= i  # a run whose IDs 0 .. i - 1 the capture lost
            runs.append(1)
        last = i
    return runs


def test_id_runs_allows_only_what_the_capture_lost() -> None:
    assert id_runs([0, 1, 2, 0, 1]) == [3, 2]
    assert id_runs([0, 1, 3, 0], lost=1) == [3, 1]
    # the next run's IDs 0 .. 5 lost (CI: "ID 6 after ID 27" with 50 lost)
    assert id_runs([0, 1, 27, 6, 7, 0], lost=31) == [3, 2, 1]
    for ids, lost in (([0, 1, 0, 2], 0), ([0, 2], 0), ([0, 5, 3], 4), ([0, 1, 1], 0)):
        with pytest.raises(AssertionError):
            id_runs(ids, lost)


# ---- the transfer ---------------------------------------------------------------------------
class Peer:
    """A peer process; its stdout lines are read by a thread (queue with a timeout)."""

    def __init__(self, ns: str, ip: str, role: str, env: dict[str, str]) -> None:
        self.p = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, str(PEER), ip, role, str(MSG),
             str(COUNT), str(MTU_1024)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, env=env)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.p.stdout is not None
        for text in self.p.stdout:
            self.lines.put(text)
        self.lines.put("")

    def line(self, timeout: float = 60.0) -> dict[str, Any]:
        try:
            text = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError("peer did not answer in time") from None
        assert text, f"peer exited (rc {self.p.poll()})"
        return dict(json.loads(text))

    def tell(self, text: str) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write(text + "\n")
        self.p.stdin.flush()


Capture = tuple[list[tuple[str, int, bytes, bool]], dict[str, Any], dict[str, Any], int]


def transfer(a: str, b: str, tmp: Path, gso: bool) -> Capture:
    """The writer's transfer: (captured packets, writer's and target's reports, packets
    the capture lost)."""
    env = dict(os.environ, SOFTRDMA_GSO="1" if gso else "0",
               SOFTRDMA_STATE_DIR=str(tmp / "state"),
               PYTHONPATH=os.pathsep.join([str(HERE.parent / "src"),
                                           os.environ.get("PYTHONPATH", "")]))
    pcap = tmp / f"gso{int(gso)}.pcap"
    cap = subprocess.Popen(["ip", "netns", "exec", b, "tcpdump", "-i", "gsob", "-U", "-n",
                            "--immediate-mode", "-B", "16384",
                            "-s", "0", "-w", str(pcap), "udp", "port", "4791"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    procs: list[Peer] = []
    errs: StreamLines | None = None
    try:
        assert cap.stderr is not None
        cap.stderr.readline()  # "tcpdump: listening on gsob ..."
        errs = StreamLines(cap.stderr)
        writer = Peer(a, A_IP, "writer", env)
        procs.append(writer)
        target = Peer(b, B_IP, "target", env)
        procs.append(target)
        wi, ti = writer.line(), target.line()
        writer.tell(json.dumps(ti))
        target.tell(json.dumps(wi))
        # both QPs in RTS before the first WRITE (else it waits for a retransmission)
        assert writer.line(120.0) == {"ready": "writer"}
        assert target.line(120.0) == {"ready": "target"}
        writer.tell("go")
        wstats = writer.line(120.0)
        assert "error" not in wstats, wstats
        target.tell("check")
        digest = target.line()["sha256"]
        tstats = target.line()
        expected = bytes((i * 7 + (i >> 10)) & 0xFF for i in range(MSG))
        assert digest == hashlib.sha256(expected).hexdigest()
        for peer in procs:
            peer.tell("bye")
            peer.p.wait(30)
            assert peer.p.returncode == 0
        # the capture lags under load: wait until it holds what was sent and received, or
        # tcpdump counts the rest as dropped by the kernel (then waiting longer is useless)
        want = wstats["stats"]["sent"] + tstats["stats"]["sent"]
        end = time.monotonic() + 60
        while time.monotonic() < end:
            have = len(roce_packets(pcap))
            if have >= want or have + _dropped(cap, errs) >= want:
                break
            time.sleep(0.2)
    finally:
        for peer in procs:
            if peer.p.poll() is None:
                peer.p.kill()
                peer.p.wait(10)
        cap.send_signal(signal.SIGINT)
        try:
            cap.wait(timeout=10)
        except subprocess.TimeoutExpired:
            cap.kill()
            cap.wait()
    found = DROPPED.findall(errs.join(10) if errs is not None else "")
    return roce_packets(pcap), wstats, tstats, int(found[-1]) if found else 0


DROPPED = re.compile(r"(\d+) packets? dropped by kernel")


def _dropped(cap: subprocess.Popen[str], errs: StreamLines, timeout: float = 10.0) -> int:
    """The packets tcpdump counts as dropped by the kernel so far (SIGUSR1 makes it print
    its counts on stderr); 0 if it does not answer within ``timeout`` s."""
    seen = len(DROPPED.findall(errs.text()))
    cap.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + timeout
    while len(found := DROPPED.findall(errs.text())) == seen:
        if time.monotonic() > deadline or cap.poll() is not None:
            return 0
        time.sleep(0.02)
    return int(found[-1])


def test_gso_segments_carry_ids_0_to_n_minus_1_with_right_icrcs(
        netns_pair: tuple[str, str], tmp_path: Path) -> None:
    a, b = netns_pair
    pkts, wstats, tstats, lost = transfer(a, b, tmp_path, gso=True)
    assert wstats["gso"], "the writer's link did not use UDP GSO"
    st = wstats["stats"]
    data = [(i, ok) for src, i, _ib, ok in pkts if src == A_IP]
    packets_per_msg = -(-MSG // 1024)
    assert st["sent"] == COUNT * packets_per_msg  # no loss, no retransmission
    assert len(data) >= st["sent"] - lost  # every data packet was captured
    assert all(ok for _i, ok in data), f"{sum(not ok for _i, ok in data)} bad ICRCs"
    assert all(ok for _src, _i, _ib, ok in pkts)  # the target's ACKs too
    runs = id_runs([i for i, _ok in data], lost)
    assert st["gso_sends"] > 0 and max(runs) > 1
    assert sum(r for r in runs if r > 1) >= st["gso_segments"] - 2 * lost
    assert st["gso_refused"] == 0
    # the target received every segment as a datagram of its own (veth without GRO) and
    # solved the IDs; none failed
    assert tstats["stats"]["gro_id_failures"] == 0
    if VERIFY_CRC is not None:  # the lab's checker, as a second opinion
        out = subprocess.run([sys.executable, str(VERIFY_CRC), str(tmp_path / "gso1.pcap")],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
        assert " bad 0" in out.stdout


def test_without_gso_every_packet_has_id_0(netns_pair: tuple[str, str],
                                           tmp_path: Path) -> None:
    a, b = netns_pair
    pkts, wstats, _t, _lost = transfer(a, b, tmp_path, gso=False)
    assert not wstats["gso"] and wstats["stats"]["gso_sends"] == 0
    assert pkts and all(ok and i == 0 for _src, i, _ib, ok in pkts)
