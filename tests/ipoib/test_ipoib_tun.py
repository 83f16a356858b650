"""The TUN device under ``softrdma ipoib`` (root: a network namespace of its own):
packets cross it whole both ways behind the ``virtio_net_hdr`` (issue 26), and with no
offload enabled the kernel still verifies and computes every checksum."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from harness.netns import SRC, skip_reason

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")

CHECK = str(Path(__file__).resolve().parents[1] / "harness/ipoib_tun_check.py")
GRO_CHECK = str(Path(__file__).resolve().parents[1] / "harness/ipoib_gro_check.py")


def _in_netns(script: str) -> dict[str, object]:
    """Run ``script`` in a network namespace of its own; its JSON output."""
    ns = f"srtun{os.getpid()}x{secrets.token_hex(2)}"
    subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True, timeout=30)
    try:
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True,
                       capture_output=True, timeout=30)
        env = dict(os.environ, PYTHONPATH=SRC)
        res = subprocess.run(["ip", "netns", "exec", ns, sys.executable, script, "srtun0"],
                             capture_output=True, text=True, timeout=180, env=env, check=False)
        assert res.returncode == 0, res.stderr
        out: dict[str, object] = json.loads(res.stdout)
        return out
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def test_coalesced_tcp_reaches_the_socket_and_checksums_hold() -> None:
    """Merged segments (issue 26) are taken by the kernel's TCP; a merged packet with a
    damaged segment fails the kernel's checksum check and is dropped."""
    out = _in_netns(GRO_CHECK)
    assert out == {"wrote": [True, True, True], "segments": 9, "first_ok": True,
                   "damaged_dropped": True, "second_ok": True}, out


def test_tun_both_ways_with_checksums() -> None:
    out = _in_netns(CHECK)
    assert out["wrote"] == [True, True]
    assert out["first_is_good"]  # the bad-checksum copy was dropped by the kernel
    assert out["read"] == {"len": 3028, "total_len": 3028, "csum_ok": True,
                           "payload_ok": True}, out
    # read_framed (the runtime's per-packet read): header and packet in one buffer
    assert out["empty"] == 0, out
    assert out["framed"] == {"len": 2028, "total_len": 2028, "payload_ok": True,
                             "after_untouched": True}, out
