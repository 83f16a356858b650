"""rdma_cm address resolution follows the kernel's route (Linux ``rdma_resolve_addr``).

Regression: with the built-in ``softrdma_lo`` listed first, a client resolving a
destination on another interface got ``softrdma_lo`` and source 127.0.0.1, and its first
CM MAD failed with "UDP send ... Invalid argument" (found against the lab's rxe guest:
``softrdma udaddy -s 10.50.0.13`` without ``-b``). Run in a network namespace this test
creates, with a veth interface holding 10.77.0.1/24 and a RoCE device on it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[1] / "src")

PROBE = """
import ipaddress, sys
from pathlib import Path
from softrdma.cm.rdma_devices import find_device
from softrdma.drivers.registry import Registry
Registry(Path(sys.argv[1])).add("rt0", "v0", "roce", 40123)
for dst in sys.argv[2:]:
    entry, src = find_device(None, ipaddress.ip_address(dst), "roce")
    print(dst, entry.name, src)
"""

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None,
                                reason="needs root and iproute2 for a network namespace")


def test_resolution_picks_the_device_of_the_routes_source(tmp_path: Path) -> None:
    ns = f"cmrt-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        setup = ("ip link set lo up && ip link add v0 type veth peer name v1 && "
                 "ip addr add 10.77.0.1/24 dev v0 && ip link set v0 up && ip link set v1 up")
        subprocess.run(["ip", "netns", "exec", ns, "sh", "-c", setup], check=True)
        env = dict(os.environ, SOFTRDMA_STATE_DIR=str(tmp_path), PYTHONPATH=SRC)
        r = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", PROBE,
                            str(tmp_path), "10.77.0.9", "127.0.0.1", "10.77.0.1"],
                           env=env, capture_output=True, text=True, timeout=60)
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["10.77.0.9 rt0 10.77.0.1",       # via v0's route
                                     "127.0.0.1 softrdma_lo 127.0.0.1",  # loopback
                                     "10.77.0.1 rt0 10.77.0.1"]       # our own address
