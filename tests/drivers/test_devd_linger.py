"""A devd that lingers after its last client (it exits ``idle_timeout`` seconds later)
never blocks the next client: one that finds it, or starts a new one, just as it exits
reuses or replaces it."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import pytest
from harness.rdma_cm import ROCE_DEV, make_state_dir

from softrdma.drivers.devd import client as devd_client
from softrdma.drivers.devd import spawn as devd_spawn
from softrdma.drivers.host.registry import Registry


def test_a_daemon_gone_before_the_connect_is_replaced(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_state_dir(tmp_path)
    rec = Registry(tmp_path).get(ROCE_DEV)
    real = devd_spawn.ensure_devd
    calls: list[int] = []

    def vanishing_once(*a: Any, **kw: Any) -> str:
        calls.append(1)
        if len(calls) == 1:  # the daemon it found exited (idle) before the connect
            raise devd_spawn.DevdVanished(f"devd {ROCE_DEV}: started but ... accepts no connection")
        return real(*a, **kw)

    monkeypatch.setattr(devd_client, "ensure_devd", vanishing_once)
    link = devd_client.DevdLink(rec, state_dir=tmp_path, idle_timeout=2.0)
    try:
        assert link.udp_port == rec.udp_port and len(calls) == 2
    finally:
        link.close()


def test_clients_arriving_as_the_daemon_exits(tmp_path: Path) -> None:
    """Open and close a client again and again around the daemon's idle exit."""
    make_state_dir(tmp_path)
    rec = Registry(tmp_path).get(ROCE_DEV)
    rng = random.Random(14)
    for _ in range(25):
        link = devd_client.DevdLink(rec, state_dir=tmp_path, idle_timeout=0.2)
        link.close()
        time.sleep(0.2 + rng.uniform(-0.03, 0.05))


def test_a_started_daemon_waits_for_its_first_client(tmp_path: Path) -> None:
    """A daemon started with a short idle timeout is still there for the client that
    started it when that client is descheduled (busy host) before it connects."""
    make_state_dir(tmp_path)
    rec = Registry(tmp_path).get(ROCE_DEV)
    path = devd_spawn.ensure_devd(rec, state_dir=tmp_path, idle_timeout=0.05)
    pid = int((tmp_path / f"{ROCE_DEV}.pid").read_text())
    time.sleep(1.0)  # the starting client, not scheduled for 20 idle timeouts
    assert Path(path).exists()
    link = devd_client.DevdLink(rec, state_dir=tmp_path, idle_timeout=0.05)
    try:
        assert link.daemon_pid == pid  # the daemon it started, not a replacement
    finally:
        link.close()
