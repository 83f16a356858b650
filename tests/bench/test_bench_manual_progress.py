"""``bench/roce_bench.py`` with ``SR_PROGRESS=manual``: its sides run in manual progress,
where a CQ poll does not run the engine (``verbs-api.md``), so the bench's own polls
must. Before, every ping-pong and WRITE of the bench hung there (both processes spun on
empty CQs, no datagram ever read)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from harness.ports import free_port

BENCH = Path(__file__).resolve().parents[2] / "bench"

_RUN = """
import multiprocessing as mp, sys
sys.path.insert(0, sys.argv[1])
import roce_bench as rb
mp.set_start_method("fork")
half = rb.rc_send_lat(200, int(sys.argv[2]))
bw = rb.rdma_write_bw(8 << 20, 1 << 20, int(sys.argv[3]))
print(f"{half:.9f} {bw:.1f}")
"""


def test_manual_progress_ping_pong_and_write_complete() -> None:
    env = {**os.environ, "SR_PROGRESS": "manual"}
    out = subprocess.run([sys.executable, "-c", _RUN, str(BENCH), str(free_port()),
                          str(free_port())], env=env, capture_output=True, text=True,
                         timeout=180, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr[-2000:]
    half, bw = (float(x) for x in out.stdout.split())
    assert half > 0 and bw > 0
