"""``softrdma rping``: server and client as two processes on one host, over the RoCE
device on lo (shared through devd) and over the built-in iWARP device; rping's output
lines and exit status; argument checks."""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rdma_cm_harness import child_env, make_state_dir

from softrdma.tools.rping import RPING_MIN_BUFSIZE, ping_pattern


def _rping(*args: str) -> list[str]:
    return [sys.executable, "-m", "softrdma", "rping", *args]


def _run_pair(tmp_path: Path, transport: str, addr: str, count: int, size: int) -> tuple[
        subprocess.CompletedProcess[str], str, str, int]:
    state, _ = make_state_dir(tmp_path)
    env = child_env(state)
    port = random.randrange(20000, 60000)
    server = subprocess.Popen(
        _rping("-s", "-a", addr, "-p", str(port), "-v", "--transport", transport,
               "--timeout", "20"),
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        client = None
        for _ in range(40):  # until the server listens
            client = subprocess.run(
                _rping("-c", "-a", addr, "-p", str(port), "-v", "-V", "-C", str(count),
                       "-S", str(size), "--transport", transport, "--timeout", "20"),
                env=env, capture_output=True, text=True, timeout=60)
            if client.returncode == 0 or "REJECTED" not in client.stderr:
                break
            time.sleep(0.25)
        assert client is not None
        sout, serr = server.communicate(timeout=30)
        return client, sout, serr, server.returncode
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()


@pytest.mark.parametrize(("transport", "addr"), [("roce", "127.0.0.1"), ("iwarp", "127.0.0.1"),
                                                  ("roce", "::1")])
def test_two_process_rping(tmp_path: Path, transport: str, addr: str) -> None:
    count, size = 5, 64
    client, sout, serr, src = _run_pair(tmp_path, transport, addr, count, size)
    assert client.returncode == 0, client.stderr
    want = []
    start = 65
    for i in range(count):
        want.append(ping_pattern(i, start, size).rstrip(b"\0").decode())
        start = start + 1 if start < 122 else 65
    assert client.stdout.splitlines() == [f"ping data: {w}" for w in want]
    assert "client DISCONNECT EVENT..." in client.stderr
    assert src == 0, serr
    assert sout.splitlines() == [f"server ping data: {w}" for w in want]
    assert "server DISCONNECT EVENT..." in serr


def test_ping_pattern_is_rpings() -> None:
    p = ping_pattern(0, 65, 64)
    assert p.startswith(b"rdma-ping-0: ABCDEFG") and p[-1] == 0 and len(p) == 64
    assert ping_pattern(3, 122, 20)[13:16] == b"zAB"  # wraps after 122 (z) to 65 (A)


@pytest.mark.parametrize("args", [["-c", "-a", "127.0.0.1", "-S", str(RPING_MIN_BUFSIZE - 1)],
                                  ["-c", "-a", "127.0.0.1", "-C", "-1"],
                                  ["-c", "-a", "not-an-ip"], ["-c"]])
def test_bad_arguments(tmp_path: Path, args: list[str]) -> None:
    state, _ = make_state_dir(tmp_path)
    env = child_env(state)
    r = subprocess.run(_rping(*args), env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and r.stderr.strip()
    assert "Traceback" not in r.stderr


def test_client_without_server_fails_cleanly(tmp_path: Path) -> None:
    state, _ = make_state_dir(tmp_path)
    env = child_env(state)
    r = subprocess.run(_rping("-c", "-a", "127.0.0.1", "-p", "9", "--timeout", "10"),
                       env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 1
    assert "cma event RDMA_CM_EVENT_REJECTED, error 8" in r.stderr  # devd: REJ 8
