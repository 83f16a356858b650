"""Helpers of the ``softrdma run`` tests (tests/capi/test_capi_*.py): the built library, the
stock tools, running a program under ``softrdma run`` and a server/client pair."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.device import private_device, reap
from harness.ports import free_port
from softrdma.capi import build, launch

TIMEOUT = 180.0  # a whole pair or program, on a busy machine (s)


def need_build() -> Path:
    """The C interface's library (built once, cached), or skip naming what is missing."""
    missing = build.missing_packages()
    if missing:
        pytest.skip("cannot build the C interface: install " + ", ".join(missing))
    return build.build()


#: the C test programs (tests/capi/NAME.c) and their shared header, common.h
C_DIR = Path(__file__).resolve().parents[1] / "capi"


def compile_c(out_dir: Path, name: str, *libs: str) -> Path:
    """tests/capi/``name``.c built into ``out_dir`` (``-I tests/capi`` for common.h,
    linked with ``libs``); the compiler's message if it fails."""
    exe = out_dir / name
    c = subprocess.run(["gcc", "-O2", "-Wall", "-I", str(C_DIR), "-o", str(exe),
                        str(C_DIR / f"{name}.c"), *libs],
                       capture_output=True, text=True, check=False)
    assert c.returncode == 0, c.stderr
    return exe


def cm_device(prefix: str, tool: str | None, tmp_path: Path,
              monkeypatch: pytest.MonkeyPatch) -> str:
    """A private RoCE device on lo that a librdmacm program's ids resolve to
    (``SOFTRDMA_CAPI_DEVICE``, as ``softrdma run -d`` sets it), once the C interface is
    built and rdmacm-utils' ``tool`` is there (else skip; None: a test program of
    tests/capi): its name."""
    need_build()
    if tool is not None:
        need_tool(tool, "rdmacm-utils")
    name = private_device(prefix, tmp_path, monkeypatch)
    monkeypatch.setenv("SOFTRDMA_CAPI_DEVICE", name)
    return name


def need_tool(name: str, package: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (Debian package {package})")
    return path


def run_cmd(*args: str) -> list[str]:
    """``softrdma run -- ARGS`` (the wrapper)."""
    return [sys.executable, "-m", "softrdma", "run", "--", *args]


def preloaded(*args: str) -> list[str]:
    """``ARGS`` with the environment ``softrdma run`` would give them, set by ``env``
    (``env LD_PRELOAD=... PROGRAM``): one Python start less per process than the wrapper."""
    env = launch.preload_env(build.build())
    return ["env", *(f"{k}={env[k]}" for k in _PRELOAD_KEYS if k in env), *args]


_PRELOAD_KEYS = ("LD_PRELOAD", "SOFTRDMA_CAPI_PATH", "SOFTRDMA_CAPI_PYTHON")


def run(*args: str, timeout: float = TIMEOUT,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``softrdma run -- ARGS`` to its end (killed after ``timeout``), in ``env`` (default:
    this process's environment)."""
    return subprocess.run(run_cmd(*args), capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ) if env is None else env, check=False)


def _listening(port: int) -> bool:
    """True once something listens on TCP ``port`` (read from /proc: a probe connection
    would be taken by the pingpong server as its client)."""
    want = f":{port:04X}"
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    fields = line.split()
                    if fields[1].endswith(want) and fields[3] == "0A":
                        return True
        except OSError:
            continue
    return False


def run_pair(server: list[str], client: list[str], port: int, *more: list[str]
             ) -> tuple[list[subprocess.Popen[str]], list[tuple[str, str]]]:
    """Start ``server``, wait until it listens on TCP ``port``, run ``client`` (and the
    ``more`` clients) against it; all to their end: the processes and their (stdout,
    stderr)."""
    procs: list[subprocess.Popen[str]] = []
    env = dict(os.environ)
    try:
        procs.append(subprocess.Popen(server, env=env, text=True, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE))
        deadline = time.monotonic() + TIMEOUT
        while not _listening(port):
            if procs[0].poll() is not None or time.monotonic() > deadline:
                out, err = procs[0].communicate()
                raise AssertionError(f"server did not listen: rc={procs[0].returncode} {err}")
            time.sleep(0.05)
        for cmd in (client, *more):
            procs.append(subprocess.Popen(cmd, env=env, text=True, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE))
        outs = [p.communicate(timeout=TIMEOUT) for p in procs]
    finally:
        reap(*procs)
    return procs, outs


def tcp_port() -> int:
    return free_port()
