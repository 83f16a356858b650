"""An rping server and client as two processes.

(Moved from tests/tools/test_rping.py, which other test files imported.)"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from harness.ports import free_port
from harness.rdma_cm import (
    child_env,
    make_state_dir,
)


def _rping(*args: str) -> list[str]:
    return [sys.executable, "-m", "softrdma", "rping", *args]


def _run_pair(tmp_path: Path, transport: str, addr: str, count: int, size: int,
              sflags: tuple[str, ...] = (), cflags: tuple[str, ...] = ()) -> tuple[
        subprocess.CompletedProcess[str], str, str, int]:
    state, _ = make_state_dir(tmp_path)
    env = child_env(state)
    port = free_port()
    server = subprocess.Popen(
        _rping("-s", "-a", addr, "-p", str(port), "-v", "--transport", transport,
               "--timeout", "20", *sflags),
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        client = None
        for _ in range(40):  # until the server listens
            client = subprocess.run(
                _rping("-c", "-a", addr, "-p", str(port), "-v", "-V", "-C", str(count),
                       "-S", str(size), "--transport", transport, "--timeout", "20", *cflags),
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
