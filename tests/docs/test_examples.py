"""The worked examples under ``examples/`` (one per kind of user) run and say what their
docstrings promise, so they stay true."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from harness.ports import free_port
from harness.rdma_cm import ROCE_DEV, child_env, make_state_dir

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _run(tmp_path: Path, script: str, *args: str) -> subprocess.CompletedProcess[str]:
    state, _ = make_state_dir(tmp_path)
    return subprocess.run([sys.executable, str(EXAMPLES / script), *args],
                          env=child_env(state), capture_output=True, text=True, timeout=180)


@pytest.mark.parametrize("device", [ROCE_DEV, "softrdma_iw_lo"])
def test_application_developer_echo(tmp_path: Path, device: str) -> None:
    port = str(free_port())
    r = _run(tmp_path, "app_echo_asyncio.py", "--device", device, "--port", port,
             "--message", "ping over rdma_cm")
    assert r.returncode == 0, r.stdout + r.stderr
    assert set(r.stdout.splitlines()) == {
        "server: received 'ping over rdma_cm' (17 bytes)",
        "server: wrote 17 bytes into the client's buffer, sent done",
        "client: the server wrote back 'PING OVER RDMA_CM'"}


def test_nic_engineer_lossy_fabric(tmp_path: Path) -> None:
    pcap = tmp_path / "lossy.pcap"
    r = _run(tmp_path, "nic_lossy_fabric.py", "--drop", "0.05", "--seed", "7",
             "--pcap", str(pcap))
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    m = re.search(r"(\d+) datagrams sent, (\d+) dropped", out)
    assert m and int(m.group(2)) > 0  # the fabric really lost packets
    assert "completions: 3 (all successful), 64 KiB placed intact" in out
    m = re.search(r"requester: sent \d+ packets \((\d+) retransmitted\)", out)
    assert m and int(m.group(1)) > 0  # ... and the requester recovered them
    assert re.search(r"responder: .*NAKs sent [1-9]", out)
    m = re.search(r"pcap-check: (\d+) packets, (\d+) ok, 0 failed", out)
    assert m and m.group(1) == m.group(2)
    assert pcap.stat().st_size > 0


def test_student_packets(tmp_path: Path) -> None:
    r = _run(tmp_path, "student_packets.py")
    assert r.returncode == 0, r.stdout + r.stderr
    ops = [m.group(1) for m in re.finditer(r"\b(?:A|B) -> (?:A|B)  (RC_\w+)", r.stdout)]
    assert ops == [
        "RC_SEND_FIRST", "RC_SEND_MIDDLE", "RC_SEND_LAST", "RC_ACKNOWLEDGE",
        "RC_RDMA_READ_REQUEST", "RC_RDMA_READ_RESPONSE_FIRST", "RC_RDMA_READ_RESPONSE_LAST",
        "RC_SEND_FIRST", "RC_SEND_LAST", "RC_ACKNOWLEDGE", "RC_SEND_MIDDLE", "RC_SEND_LAST",
        "RC_ACKNOWLEDGE"]
    assert "NAK PSN sequence error" in r.stdout
    assert "ICRC BAD" not in r.stdout and r.stdout.count("ICRC ok") == len(ops)
    assert r.stdout.count("B IBV_WC_RECV success") == 2
