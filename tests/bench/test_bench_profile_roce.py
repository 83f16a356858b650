"""``bench/profile_roce.py``'s one-phase runs run to the end and print both sides' CPU
beside plain UDP; the figures themselves are not asserted.

* ``--only ud``: every packet received and checked (a lost or short one stops it with an
  error); CPU per packet.
* ``--only ack``: each SEND received, its ACK sent alone and received, the send completion
  polled (a lost or missing one stops it with an error); CPU per ACK."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from harness.ports import free_port

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "profile_roce.py"


@pytest.mark.parametrize("args,header,sides", [
    (["--only", "ud", "--ud", "640"], "UD SEND 4092 B x 640, 64 per post, 1 in 16 signaled",
     ("sender", "receiver")),
    (["--only", "ack", "--acks", "300"], "RC ACK of a 64 B SEND x 300, CPU per ACK",
     ("ACK sent", "ACK received and completed")),
], ids=["ud", "ack"])
def test_profile_phase_runs(args: list[str], header: str, sides: tuple[str, ...]) -> None:
    port = free_port()
    out = subprocess.run([sys.executable, str(SCRIPT), *args, "--port", str(port)],
                         capture_output=True, text=True, timeout=240,
                         stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    assert header in out.stdout
    for side in sides:
        m = re.search(side + r":\s+([0-9.]+) us\s+plain UDP:\s+([0-9.]+) us", out.stdout)
        assert m is not None and float(m[1]) > 0 and float(m[2]) > 0, out.stdout
