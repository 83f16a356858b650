"""The pingpong tools as processes on a private device.

(Moved from tests/tools/test_pingpong.py, which other test files imported.)"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.ports import free_port

SRC = str(Path(__file__).resolve().parents[2] / "src")


@pytest.fixture()
def device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A private roce device on lo with an ephemeral UDP port, in a private state dir."""
    from softrdma.drivers.host.registry import Registry

    monkeypatch.setenv("SOFTRDMA_STATE_DIR", str(tmp_path))
    name = "pptest"
    Registry(tmp_path).add(name, "lo", "roce", free_port())
    try:
        yield name
    finally:
        _kill_devd(tmp_path, name)


def _kill_devd(state: Path, name: str) -> None:
    """Stop the devd this test's processes started (found by its pid file) and wait for it
    to exit; a daemon still starting up (socket there, pid file not yet) is waited for."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            pid = int((state / f"{name}.pid").read_text().strip())
        except (OSError, ValueError):
            if not (state / f"{name}.sock").exists():
                return
            time.sleep(0.05)
            continue
        try:
            os.kill(pid, 15)
            while time.monotonic() < deadline:
                os.kill(pid, 0)
                time.sleep(0.02)
        except OSError:
            pass  # gone
        return


def _spawn(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "softrdma", *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, env.get("PYTHONPATH")) if p)
    return env
