"""``-g`` of every pingpong tool (issue 24): one default (GID index 0 on a RoCE port) and
one check at start: an index outside the GID table or an empty entry is a one-line error
naming ``-g``, before any peer is waited for (the server returns at once)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from harness.device import private_device
from harness.ports import free_port

SRC = str(Path(__file__).resolve().parents[2] / "src")
# uc/ud-pingpong share rc-pingpong's code (tools/ibverbs/pingpong.py)
TOOLS = ("rc-pingpong", "srq-pingpong", "xsrq-pingpong")


@pytest.fixture()
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    private_device("gid0", tmp_path, monkeypatch, subprocesses=False)
    return dict(os.environ, PYTHONPATH=SRC)


@pytest.mark.parametrize(("tool", "idx"), [*((t, "5") for t in TOOLS),
                                           ("srq-pingpong", "70000")])
def test_bad_gid_index_fails_at_start(env: dict[str, str], tool: str, idx: str) -> None:
    # A server: without the check it would wait for a client (the timeout kills it).
    r = subprocess.run([sys.executable, "-m", "softrdma", tool, "-d", "gid0", "-g", idx,
                        "-p", str(free_port())], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode in (1, 2), (r.returncode, r.stderr)
    assert "-g" in r.stderr and idx in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    if r.returncode == 1:  # the last line (a server may have said it is listening)
        assert r.stderr.splitlines()[-1].startswith(f"softrdma {tool}: error: -g {idx}: ")
