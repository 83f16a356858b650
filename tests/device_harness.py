"""A RoCE device of a test's own: a private state directory and a free UDP port on lo.

Tests that run ``softrdma`` subprocesses or share a device between processes use it, so
that they never touch the built-in device on 4791 nor another test's registry.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from softrdma import verbs as v
from softrdma.drivers import registry
from softrdma.ib.port import Port

SRC = str(Path(__file__).resolve().parents[1] / "src")


def free_port(kind: socket.SocketKind = socket.SOCK_DGRAM) -> int:
    """A port free on 127.0.0.1 now (UDP by default, ``SOCK_STREAM`` for TCP)."""
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def reap(*procs: subprocess.Popen[str]) -> None:
    """Kill, and wait for, those of ``procs`` still running (a test's cleanup)."""
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def private_device(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                   *, subprocesses: bool = True) -> str:
    """Point ``SOFTRDMA_STATE_DIR`` at a fresh directory holding one RoCE device ``name``
    on lo; with ``subprocesses``, ``PYTHONPATH`` makes child processes run this tree."""
    monkeypatch.setenv("SOFTRDMA_STATE_DIR", str(tmp_path / "state"))
    if subprocesses:
        monkeypatch.setenv("PYTHONPATH", SRC)
    registry.add(name, "lo", "roce", free_port())
    return name


def shared_device(name: str, tmp_path: Path,
                  monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fixture's body: RoCE device ``name`` on lo, shared through its devd, in the state
    directory ``tmp_path``; its devd is stopped at the end (it lingers otherwise)."""
    monkeypatch.setenv("SOFTRDMA_STATE_DIR", str(tmp_path))
    monkeypatch.delenv("SOFTRDMA_SHARED", raising=False)
    registry.Registry(tmp_path).add(name, "lo", "roce", free_port())
    try:
        yield name
    finally:
        pid_file = tmp_path / f"{name}.pid"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (tmp_path / f"{name}.sock").exists():
            try:
                pid = int(pid_file.read_text().strip())
                if b"softrdma.drivers.devd.daemon" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, signal.SIGTERM)
            except (OSError, ValueError):
                pass
            time.sleep(0.1)


def ib_port(ctx: v.Context) -> Port:
    """The IB engine of a RoCE context (the tests that look inside it)."""
    port = ctx.port
    assert isinstance(port, Port)
    return port
