"""Port counters last as long as the device (issue 24 §3), as the kernel's do: when a
device's devd exits it saves them (``NAME.counters.json``), ``softrdma stats`` shows them
while no devd runs, and the next devd adds them back, so they never go backwards.
Deleting the device forgets them. All traffic is on 127.0.0.1."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from harness.ports import free_port

from softrdma.drivers.devd.client import DevdLink
from softrdma.drivers.devd.daemon import Devd
from softrdma.drivers.host.port_totals import saved_counters
from softrdma.drivers.host.registry import DeviceRecord, Registry
from softrdma.tools.cli import main

NAME = "persist0"


def _serve(state: Path, port: int) -> tuple[Devd, threading.Thread]:
    d = Devd(DeviceRecord(NAME, "lo", "roce", port), state, idle_timeout=30.0,
             ips=["127.0.0.1"])
    d.start()
    t = threading.Thread(target=d.serve_forever, daemon=True)
    t.start()
    return d, t


def _stop(d: Devd, t: threading.Thread) -> None:
    d.shutdown()
    t.join(10)
    assert not t.is_alive()


def test_port_counters_survive_devd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SOFTRDMA_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("SOFTRDMA_DEVD_DIRECT", "0")
    record = Registry(tmp_path).add(NAME, "lo", "roce", free_port())
    d, t = _serve(tmp_path, record.udp_port)
    try:
        with DevdLink(record, state_dir=tmp_path, spawn=False) as a:
            a.report_counters({"sent_pkts": 7, "rcvd_bytes": 300})
            assert a.device_counters()["sent_pkts"] == 7
    finally:
        _stop(d, t)
    assert saved_counters(NAME, tmp_path)["sent_pkts"] == 7
    # no devd: `softrdma stats` shows the saved counters, not zeros
    assert main(["stats", "-j", "-d", NAME]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got[0]["sent_pkts"] == 7 and got[0]["rcvd_bytes"] == 300
    # the next devd adds them back: the counters go on from there
    d, t = _serve(tmp_path, record.udp_port)
    try:
        with DevdLink(record, state_dir=tmp_path, spawn=False) as b:
            b.report_counters({"sent_pkts": 2})
            now = b.device_counters()
            assert now["sent_pkts"] == 9 and now["rcvd_bytes"] == 300
    finally:
        _stop(d, t)
    assert saved_counters(NAME, tmp_path)["sent_pkts"] == 9
    Registry(tmp_path).delete(NAME)
    assert saved_counters(NAME, tmp_path) == {}


def test_unreadable_saved_counters_restart_from_zero(tmp_path: Path) -> None:
    (tmp_path / f"{NAME}.counters.json").write_text('{"sent_pkts": -3, "x": "y"')
    assert saved_counters(NAME, tmp_path) == {}
    (tmp_path / f"{NAME}.counters.json").write_text('{"sent_pkts": -3, "rcvd_pkts": 4}')
    assert saved_counters(NAME, tmp_path) == {"rcvd_pkts": 4}
