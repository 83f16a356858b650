"""RoCEv1 (Annex A16) against RoCEv2, each measured in the same run.

1. In-memory fabric (any user): CPU time to move 32 MiB by RC RDMA WRITE (1 MiB messages,
   path MTU 4096) between two devices, RoCEv1 fabric links vs RoCEv2 ones: the cost of
   the v1 path (GRH build, RoCEv1 ICRC, GRH receive checks) against the v2 one (UDP
   pseudo-header ICRC).
2. Two network namespaces joined by a veth pair (root): ``rc-pingpong`` between in-process
   ``roce_ver both`` devices, GID 1 (RoCE v1: raw Ethernet) against GID 2 (RoCE v2: UDP),
   64 B latency and 64 KiB throughput.

Each figure is the best and the median of ``--repeat`` runs, and the ratio v1 / v2.
Run: ``python bench/rocev1_bench.py [--repeat N]`` (part 2 is skipped unless root).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

from test_verbs_data import RC, Side, connect  # noqa: E402

from softrdma import enums as e  # noqa: E402
from softrdma import verbs as v  # noqa: E402
from softrdma.drivers.links.fabric import Fabric  # noqa: E402
from softrdma.drivers.runtime.clock import VirtualClock  # noqa: E402

MiB = 1 << 20


def fabric_write_seconds(roce_ver: str, total: int = 32 * MiB) -> float:
    """CPU seconds to RDMA WRITE ``total`` bytes in 1 MiB messages over the fabric."""
    clock = VirtualClock()
    fab = Fabric(clock, seed=1)
    a = Side(v.Context(fabric=fab.link("10.5.0.1", roce_ver=roce_ver)), RC, bytearray(MiB))
    b = Side(v.Context(fabric=fab.link("10.5.0.2", roce_ver=roce_ver)), RC, bytearray(MiB))
    try:
        connect(a, b, mtu=int(e.IBV_MTU_4096))
        t0 = time.process_time()
        for i in range(total // MiB):
            w = v.SendWR(i, opcode=int(e.IBV_WR_RDMA_WRITE), sg=[a.sge(0, MiB)],
                         send_flags=int(e.IBV_SEND_SIGNALED))
            w.set_wr_rdma(b.mr.rkey, b.mr.addr)
            a.qp.post_send(w)
            clock.run(max_events=1_000_000)
            n, wcs = a.cq.poll(1)
            assert n == 1 and wcs[0].status == 0, wcs
        return time.process_time() - t0
    finally:
        a.ctx.close()
        b.ctx.close()


def _sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=30)


def _pingpong(ns: tuple[str, str], ip: str, gid: str, size: int, iters: int,
              state: tuple[str, str]) -> tuple[float, float]:
    """(usec/iter, Mbit/s) of one rc-pingpong run between the namespaces."""
    args = [sys.executable, "-m", "softrdma", "rc-pingpong", "-d", "rb", "-g", gid, "-s",
            str(size), "-n", str(iters), "-m", "4096"]
    env = dict(os.environ, SOFTRDMA_SHARED="0",
               PYTHONPATH=os.path.join(os.path.dirname(__file__), "..", "src"))
    srv = subprocess.Popen(["ip", "netns", "exec", ns[1], *args],
                           env=dict(env, SOFTRDMA_STATE_DIR=state[1]),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(1.0)
    cli = subprocess.run(["ip", "netns", "exec", ns[0], *args, ip],
                         env=dict(env, SOFTRDMA_STATE_DIR=state[0]), capture_output=True,
                         text=True, timeout=300)
    srv.communicate(timeout=60)
    if cli.returncode != 0:
        raise RuntimeError(cli.stdout + cli.stderr)
    usec = float(re.search(r"= ([\d.]+) usec/iter", cli.stdout).group(1))  # type: ignore[union-attr]
    mbit = float(re.search(r"= ([\d.]+) Mbit/sec", cli.stdout).group(1))  # type: ignore[union-attr]
    return usec, mbit


def netns_runs(repeat: int) -> dict[str, list[tuple[float, float]]]:
    tag = f"{os.getpid() % 100000}"
    ns = (f"srv1benA{tag}", f"srv1benB{tag}")
    ifs = (f"v1bA{tag}"[:15], f"v1bB{tag}"[:15])
    state = (f"/tmp/srv1bench-{tag}-a", f"/tmp/srv1bench-{tag}-b")
    made = []
    out: dict[str, list[tuple[float, float]]] = {}
    try:
        for n in ns:
            _sh("ip", "netns", "add", n)
            made.append(n)
        _sh("ip", "link", "add", ifs[0], "netns", ns[0], "type", "veth", "peer", "name",
            ifs[1], "netns", ns[1])
        for i, (n, ifname) in enumerate(zip(ns, ifs, strict=True)):
            _sh("ip", "-n", n, "link", "set", ifname, "mtu", "9000")
            _sh("ip", "-n", n, "addr", "add", f"10.233.7.{i + 1}/24", "dev", ifname)
            _sh("ip", "-n", n, "link", "set", ifname, "up")
            _sh("ip", "-n", n, "link", "set", "lo", "up")
            subprocess.run(["ip", "netns", "exec", n, sys.executable, "-m", "softrdma", "link",
                            "add", "rb", "netdev", ifname, "roce_ver", "both"], check=True,
                           env=dict(os.environ, SOFTRDMA_STATE_DIR=state[i],
                                    PYTHONPATH=os.path.join(os.path.dirname(__file__), "..",
                                                            "src")))
        for _ in range(repeat):
            for gid, name in (("1", "v1"), ("2", "v2")):
                out.setdefault(f"{name} 64B", []).append(
                    _pingpong(ns, "10.233.7.2", gid, 64, 500, state))
                out.setdefault(f"{name} 64KiB", []).append(
                    _pingpong(ns, "10.233.7.2", gid, 65536, 100, state))
    finally:
        for n in made:
            subprocess.run(["ip", "netns", "del", n], capture_output=True)
        for d in state:
            subprocess.run(["rm", "-rf", d], capture_output=True)
    return out


def _fmt(values: list[float]) -> str:
    return f"best {min(values):.3f}, median {statistics.median(values):.3f}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()
    v1 = [fabric_write_seconds("1") for _ in range(a.repeat)]
    v2 = [fabric_write_seconds("2") for _ in range(a.repeat)]
    print("1. fabric, 32 MiB RC RDMA WRITE, CPU seconds")
    print(f"   RoCEv2 (baseline): {_fmt(v2)}")
    print(f"   RoCEv1:            {_fmt(v1)}")
    print(f"   ratio v1/v2: best {min(v1) / min(v2):.2f}, "
          f"median {statistics.median(v1) / statistics.median(v2):.2f}")
    if os.geteuid() != 0:
        print("2. skipped: the namespace benchmark needs root")
        return 0
    runs = netns_runs(a.repeat)
    print("2. rc-pingpong between two namespaces (veth, MTU 9000), roce_ver both devices")
    for size, idx, unit, better_low in (("64B", 0, "usec/iter", True),
                                        ("64KiB", 1, "Mbit/s", False)):
        v2s = [r[idx] for r in runs[f"v2 {size}"]]
        v1s = [r[idx] for r in runs[f"v1 {size}"]]
        best2, best1 = (min(v2s), min(v1s)) if better_low else (max(v2s), max(v1s))
        print(f"   {size} {unit}: RoCEv2 (baseline) best {best2:.1f} median "
              f"{statistics.median(v2s):.1f}; RoCEv1 best {best1:.1f} median "
              f"{statistics.median(v1s):.1f}; ratio v1/v2 best {best1 / best2:.2f}, median "
              f"{statistics.median(v1s) / statistics.median(v2s):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
