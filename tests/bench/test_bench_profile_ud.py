"""``bench/profile_roce.py --only ud``: the UD phase runs to the end (every packet received
and checked: a lost or short one stops it with an error) and prints both sides' CPU per
packet beside plain UDP; the figures themselves are not asserted."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from harness.ports import free_port

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "profile_roce.py"


def test_profile_ud_phase_runs() -> None:
    port = free_port()
    out = subprocess.run([sys.executable, str(SCRIPT), "--only", "ud", "--ud", "640",
                          "--port", str(port)], capture_output=True, text=True, timeout=240,
                         stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    assert "UD SEND 4092 B x 640, 32 per post, 1 in 16 signaled" in out.stdout
    for side in ("sender", "receiver"):
        m = re.search(side + r":\s+([0-9.]+) us\s+plain UDP:\s+([0-9.]+) us", out.stdout)
        assert m is not None and float(m[1]) > 0 and float(m[2]) > 0, out.stdout
