"""softrdma's perftest tools against a baseline measured in the same run.

Two processes on one RoCE device on ``lo`` (a private registry, a free UDP port, shared
through devd as every multi-process softrdma run), each case ``--reps`` times:

* baseline: ``softrdma rc-pingpong`` (4096 B SEND ping-pong over RC, the same engine and
  devd path): its Mbit/s as MB/s (both directions counted, as it prints) and its
  usec/iter halved (one-way latency);
* ``write-bw`` / ``send-bw`` (4096 B): BW average[MB/sec] of the client;
* ``send-lat`` / ``write-lat`` (4096 B): t_typical[usec] of the client.

Prints best and median of each, and their ratio to the baseline's (bandwidth: tool /
baseline; latency: tool / baseline, so < 1 is faster).
Run: ``python bench/perftest_bench.py [--reps 3] [-n 400]``.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

from harness.perftest import env_for, kill_devd, make_device  # noqa: E402

SIZE = 4096
BW_ROW = re.compile(r"^ (\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$")
LAT_ROW = re.compile(r"^ (\d+)\s+(\d+)" + r"\s+([\d.]+)" * 7 + r"\s*$")
PP_BW = re.compile(r"= ([\d.]+) Mbit/sec")
PP_LAT = re.compile(r"= ([\d.]+) usec/iter")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pair(args: list[str], env: dict[str, str]) -> str:
    """Run server and client of ``args``; the client's stdout."""
    port = str(_port())
    cmd = [sys.executable, "-m", "softrdma", *args, "-p", port]
    srv = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    try:
        time.sleep(0.3)
        cli = subprocess.run([*cmd, "127.0.0.1"], env=env, capture_output=True, text=True,
                             timeout=300)
        srv.communicate(timeout=60)
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.communicate()
    if cli.returncode or srv.returncode:
        raise RuntimeError(f"{args[0]} failed: {cli.stderr.strip()}")
    return cli.stdout


def _first(pattern: re.Pattern[str], text: str, group: int) -> float:
    for line in text.splitlines():
        m = pattern.search(line)
        if m:
            return float(m.group(group))
    raise RuntimeError(f"no result in:\n{text}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("-n", "--iters", type=int, default=400)
    a = ap.parse_args()
    n = str(a.iters)
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp)
        dev = make_device(state, "ptbench")
        env = env_for(state)
        runs: dict[str, list[float]] = {k: [] for k in (
            "baseline MB/s", "baseline us", "write-bw MB/s", "send-bw MB/s",
            "send-lat us", "write-lat us")}
        try:
            for _ in range(a.reps):
                pp = _pair(["rc-pingpong", "-d", dev, "-s", str(SIZE), "-n", n], env)
                runs["baseline MB/s"].append(_first(PP_BW, pp, 1) / 8 * 1e6 / 2**20)
                runs["baseline us"].append(_first(PP_LAT, pp, 1) / 2)
                for tool in ("write-bw", "send-bw"):
                    out = _pair([tool, "-d", dev, "-s", str(SIZE), "-n", n], env)
                    runs[f"{tool} MB/s"].append(_first(BW_ROW, out, 4))
                for tool in ("send-lat", "write-lat"):
                    out = _pair([tool, "-d", dev, "-s", str(SIZE), "-n", n], env)
                    runs[f"{tool} us"].append(_first(LAT_ROW, out, 5))
        finally:
            kill_devd(state)
    base_bw = statistics.median(runs["baseline MB/s"])
    base_us = statistics.median(runs["baseline us"])
    print(f"{a.reps} runs of {n} x {SIZE} B, two processes through devd on lo")
    print(f"{'case':<16}{'best':>10}{'median':>10}{'median/baseline':>18}")
    for key, vals in runs.items():
        bw = key.endswith("MB/s")
        best = max(vals) if bw else min(vals)
        med = statistics.median(vals)
        ratio = med / (base_bw if bw else base_us)
        print(f"{key:<16}{best:>10.2f}{med:>10.2f}{ratio:>18.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
