"""TCP throughput (iperf3) through ``softrdma ipoib`` between two network namespaces,
connected and datagram mode, as a ratio to the same transfer over the bare veth pair.

Two namespaces joined by one veth pair (MTU 9000, so the RoCE device's IB MTU is 4096
and the IPoIB-UD MTU 4092); each runs its own devd and ``softrdma ipoib up``. For each
round: iperf3 over the veth pair (the baseline), then through the IPoIB interface in
connected mode (RC, the default MTU: 65212) and in datagram mode (UD, MTU 4092). Prints
every round and, per mode, the best and the median of the ratios. Root only; needs iperf3
(``apt-get install -y iperf3``).

Run: ``sudo python bench/ipoib_iperf.py [--rounds 3] [--seconds 5] [--mode connected]``;
``bench/run.py`` reports it as the ``ipoib_connected`` / ``ipoib_datagram`` figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

from harness.ipoib_netns import IFACE, ipoib_up, veth_pair  # noqa: E402
from harness.netns import Host  # noqa: E402

PORT = 5399
MODES = ("connected", "datagram")


def iperf(client: Host, server: Host, addr: str, seconds: float) -> float:
    """Bits per second received by ``server`` from ``client`` over ``addr``."""
    return iperf_bytes(client, server, addr, seconds)[0]


def iperf_bytes(client: Host, server: Host, addr: str, seconds: float) -> tuple[float, float]:
    """Bits per second and bytes received by ``server`` from ``client`` over ``addr``."""
    srv = server.popen(["iperf3", "-s", "-1", "-p", str(PORT)])
    try:
        deadline = time.monotonic() + 60  # until the server listens (a busy machine)
        while f":{PORT} " not in server.run(["ss", "-Hltn"]).stdout + " ":
            if time.monotonic() > deadline or srv.poll() is not None:
                raise RuntimeError("iperf3 -s did not start listening")
            time.sleep(0.05)
        out = client.run(["iperf3", "-c", addr, "-p", str(PORT), "-t", str(seconds), "-J"],
                         timeout=seconds + 60)
        res = json.loads(out.stdout)
        got = res["end"]["sum_received"]
        return float(got["bits_per_second"]), float(got["bytes"])
    finally:
        try:
            srv.wait(timeout=10)
        except subprocess.TimeoutExpired:
            srv.kill()


def unavailable() -> str | None:
    """Why this bench cannot run here, else None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, TUN)"
    if shutil.which("iperf3") is None:
        return "iperf3 is missing (apt-get install -y iperf3)"
    return None


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _mode_bps(hosts: list[Host], mode: str, seconds: float,
              cpu: list[tuple[float, float, float, float]] | None = None) -> float:
    """iperf3 through the IPoIB interfaces in ``mode``; with ``cpu``, the CPU seconds per
    GB carried of the sending and the receiving IPoIB process, then the share of a core
    each used while iperf3 ran (CPU seconds over wall seconds: one interface is one
    process, so 1.0 is its ceiling on any machine), are appended to it."""
    a, b = hosts
    procs = [ipoib_up(h, "--mode", mode) for h in hosts]
    try:
        a.run(["ping", "-c", "1", "-W", "5", "10.88.0.2"], timeout=30)
        t0 = [cpu_s(p.pid) for p in procs]
        w0 = time.monotonic()
        bps, nbytes = iperf_bytes(a, b, "10.88.0.2", seconds)
        wall = time.monotonic() - w0
        t1 = [cpu_s(p.pid) for p in procs]
        if cpu is not None and nbytes > 0:
            gb = nbytes / 1e9
            used = (t1[0] - t0[0], t1[1] - t0[1])
            cpu.append((used[0] / gb, used[1] / gb, used[0] / wall, used[1] / wall))
        return bps
    finally:
        for h, p in zip(hosts, procs, strict=True):
            h.softrdma("ipoib", "down", IFACE, check=False)
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=15)


def rounds(n: int, seconds: float, modes: Sequence[str] = MODES,
           report: Callable[[int, float, dict[str, float]], None] | None = None,
           cpu: dict[str, list[tuple[float, float, float, float]]] | None = None
           ) -> list[tuple[float, dict[str, float]]]:
    """``n`` rounds on one veth pair; each round measures the bare veth (bits/s), then
    each mode through IPoIB: ``[(veth, {mode: bits/s}), ...]``; ``cpu`` (if given) gets
    per mode the CPU s/GB of the sending and receiving IPoIB process of each round, then
    the share of a core each used (:func:`_mode_bps`)."""
    out: list[tuple[float, dict[str, float]]] = []
    with tempfile.TemporaryDirectory() as tmp, veth_pair(Path(tmp)) as hosts:
        a, b = hosts
        for rnd in range(1, n + 1):
            base = iperf(a, b, b.ipv4, seconds)
            got = {mode: _mode_bps(hosts, mode, seconds,
                                   None if cpu is None else cpu.setdefault(mode, []))
                   for mode in modes}
            out.append((base, got))
            if report is not None:
                report(rnd, base, got)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--mode", action="append", choices=MODES,
                    help="measure only this mode (repeatable; default both)")
    args = ap.parse_args()
    why = unavailable()
    if why is not None:
        print(f"ipoib_iperf: {why}", file=sys.stderr)
        return 1
    modes = tuple(args.mode or MODES)

    def report(rnd: int, base: float, got: dict[str, float]) -> None:
        line = [f"round {rnd}: veth {base / 1e9:.2f} Gbit/s"]
        line += [f"{m} {bps / 1e6:.0f} Mbit/s = {bps / base:.4f} x veth"
                 for m, bps in got.items()]
        print("; ".join(line), flush=True)

    cpu: dict[str, list[tuple[float, float, float, float]]] = {}
    res = rounds(args.rounds, args.seconds, modes, report, cpu)
    for mode in modes:
        rs = [got[mode] / base for base, got in res]
        cs = cpu.get(mode, [])
        per = ", ".join(f"{s:.2f}/{r:.2f}" for s, r, _, _ in cs)
        cores = ", ".join(f"{s:.2f}/{r:.2f}" for _, _, s, r in cs)
        print(f"{mode}: ratio to bare veth best {max(rs):.4f}, median "
              f"{statistics.median(rs):.4f} ({len(rs)} runs); CPU s/GB sender/receiver "
              f"IPoIB process: {per}; share of a core: {cores}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
