"""Processes on one shared device with the direct receive path (drivers/devd/reuseport.py): a
client killed with SIGKILL mid-traffic does not take the device down for the others, and
their data never goes through devd. rc-pingpong pairs in subprocesses, on a private
device (lo, a free UDP port, a private state directory)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness.device import SRC, reap
from harness.ports import free_port
from harness.wait import wait_until

from softrdma.drivers.devd.client import DevdLink
from softrdma.drivers.host.registry import Registry

NAME = "rpdeath"
ITERS_RE = re.compile(r"^(\d+) iters in \d+\.\d\d seconds", re.M)


def _spawn(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "softrdma", *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _pair(port: int, iters: int, env: dict[str, str]) -> list[subprocess.Popen[str]]:
    common = ["-d", NAME, "-p", str(port), "-s", "64", "-n", str(iters), "--timeout", "120"]
    server = _spawn(["rc-pingpong", *common], env)  # the client retries its connect
    client = _spawn(["rc-pingpong", *common, "127.0.0.1"], env)
    return [server, client]


def _devd_stats(state: Path) -> dict[str, int]:
    rec = Registry(state).get(NAME)
    with DevdLink(rec, state_dir=state, spawn=False, direct=False) as link:
        return link.stats()


def _kill_devd(state: Path) -> None:
    try:
        pid = int((state / f"{NAME}.pid").read_text().strip())
    except (OSError, ValueError):
        return
    try:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            os.kill(pid, 0)
            time.sleep(0.02)
    except OSError:
        pass


def _report(procs: list[subprocess.Popen[str]], state: Path) -> str:
    """What a failed wait needs: each process's exit status and output (those still running
    are killed first), devd's stats and its log."""
    parts = []
    for i, p in enumerate(procs):
        if p.poll() is None:
            p.kill()
        try:
            out, err = p.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            out, err = "", "(no output within 10 s)"
        parts.append(f"--- process {i} {p.args!r} exit {p.returncode}\n"
                     f"stdout: {out[-2000:]}\nstderr: {err[-4000:]}")
    try:
        parts.append(f"--- devd stats {_devd_stats(state)}")
    except Exception as e:  # noqa: BLE001 - a report, whatever devd's state
        parts.append(f"--- devd stats unavailable: {e!r}")
    log = state / f"{NAME}.log"
    if log.exists():
        parts.append(f"--- devd log\n{log.read_text(errors='replace')[-6000:]}")
    return "\n".join(parts)


def test_sigkill_of_one_client_leaves_the_other_pair_running(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = tmp_path / "state"
    monkeypatch.setenv("SOFTRDMA_STATE_DIR", str(state))
    monkeypatch.delenv("SOFTRDMA_DEVD_DIRECT", raising=False)
    Registry(state).add(NAME, "lo", "roce", free_port())
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, env.get("PYTHONPATH")) if p)
    procs: list[subprocess.Popen[str]] = []
    try:
        doomed = _pair(free_port(), 10**7, env)  # runs until killed
        procs += doomed
        # wait until the doomed pair's QPs exist (both processes joined), then start the
        # survivors, so that the kill happens while both pairs exchange
        # (direct_clients counts every client that ever joined)
        try:
            wait_until(lambda: (state / f"{NAME}.sock").exists()
                       and _devd_stats(state)["direct_clients"] >= 2,
                       what="the doomed pair joined", interval=0.1)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{_report(procs, state)}") from None
        survivors = _pair(free_port(), 1500, env)
        procs += survivors

        def four_joined() -> dict[str, int] | None:
            s = _devd_stats(state)
            return s if s["direct_clients"] >= 4 else None

        try:
            before = wait_until(four_joined, what="the survivors joined", interval=0.05)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{_report(procs, state)}") from None
        assert before["direct_clients"] == 4, before
        doomed[1].send_signal(signal.SIGKILL)  # the doomed pair's client, mid-traffic
        outs = [p.communicate(timeout=180) for p in survivors]
        for p, (out, err) in zip(survivors, outs, strict=True):
            assert p.returncode == 0, err
            m = ITERS_RE.search(out)
            assert m is not None and int(m.group(1)) == 1500, out
        after = _devd_stats(state)
        # 2 x 1500 SENDs and their ACKs: the survivors' data went past devd; what devd
        # forwarded is at most the moved client's datagrams while the group was re-mapped
        assert after["forwarded"] - before["forwarded"] < 60, (before, after)
        # a new pair after the death still maps right
        fresh = _pair(free_port(), 200, env)
        procs += fresh
        for p in fresh:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
        assert _devd_stats(state)["direct_clients"] >= 6
    finally:
        reap(*procs)
        _kill_devd(state)
