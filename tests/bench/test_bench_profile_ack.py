"""``bench/profile_roce.py --only ack``: the ACK phase runs to the end (each SEND received,
its ACK sent alone and received, the send completion polled: a lost or missing one stops
it with an error) and prints both sides' CPU per ACK beside a plain datagram's; the
figures themselves are not asserted."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from harness.ports import free_port

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "profile_roce.py"


def test_profile_ack_phase_runs() -> None:
    port = free_port()
    out = subprocess.run([sys.executable, str(SCRIPT), "--only", "ack", "--acks", "300",
                          "--port", str(port)], capture_output=True, text=True, timeout=240,
                         stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    assert "RC ACK of a 64 B SEND x 300, CPU per ACK" in out.stdout
    for what in ("ACK sent", "ACK received and completed"):
        m = re.search(what + r":\s+([0-9.]+) us\s+plain UDP:\s+([0-9.]+) us", out.stdout)
        assert m is not None and float(m[1]) > 0 and float(m[2]) > 0, out.stdout
