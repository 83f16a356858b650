"""A RoCE device of a test's own: a private state directory and a free UDP port on lo.

Tests that run ``softrdma`` subprocesses or share a device between processes use it, so
that they never touch the built-in device on 4791 nor another test's registry.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness import ports
from softrdma import verbs as v
from softrdma.drivers.host import registry
from softrdma.ib.port import Port

SRC = str(Path(__file__).resolve().parents[2] / "src")


@contextlib.contextmanager
def veth_device_netns(prefix: str, device: str, addr: str, env: dict[str, str],
                      timeout: float) -> Iterator[tuple[str, Callable[..., None]]]:
    """A network namespace ``<prefix><pid>`` (root) holding a veth pair d0/d1, both up,
    IPv6 off (link-local addresses would come and go with the link: GID changes), d0 at
    ``addr``/24 and softrdma device ``device`` on d0. Yields the namespace's name and
    ``sh(*cmd)``, which runs a command in it with ``env`` (``timeout`` seconds, failing
    on an error exit); the namespace is deleted at the end, even on failure."""
    ns = f"{prefix}{os.getpid()}"

    def sh(*cmd: str) -> None:
        subprocess.run(["ip", "netns", "exec", ns, *cmd], check=True, timeout=timeout,
                       env=env)

    subprocess.run(["ip", "netns", "add", ns], check=True, timeout=30)
    try:
        sh("sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1")
        sh("ip", "link", "add", "d0", "type", "veth", "peer", "name", "d1")
        sh("ip", "link", "set", "d1", "up")
        sh("ip", "link", "set", "d0", "up")
        sh("ip", "addr", "add", f"{addr}/24", "dev", "d0")
        sh(sys.executable, "-m", "softrdma", "link", "add", device, "netdev", "d0", "port",
           str(ports.free_port()))
        yield ns, sh
    finally:
        subprocess.run(["ip", "netns", "del", ns], timeout=30, check=False)


def reap(*procs: subprocess.Popen[Any]) -> None:
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
    registry.add(name, "lo", "roce", ports.free_port())
    return name


def shared_device(name: str, tmp_path: Path,
                  monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fixture's body: RoCE device ``name`` on lo, shared through its devd, in the state
    directory ``tmp_path``; its devd is stopped at the end (it lingers otherwise)."""
    monkeypatch.setenv("SOFTRDMA_STATE_DIR", str(tmp_path))
    monkeypatch.delenv("SOFTRDMA_SHARED", raising=False)
    registry.Registry(tmp_path).add(name, "lo", "roce", ports.free_port())
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
