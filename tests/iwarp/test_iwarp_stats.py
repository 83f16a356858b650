"""``softrdma stats`` for iWARP devices (issue 24 §3): each process publishes its device
counters in the state directory and adds them to the device's saved total when it
closes the device, so they are every process's and outlive them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import pytest
from harness.wait import wait_until

from softrdma import verbs as v
from softrdma.drivers.host import port_totals
from softrdma.seam.counters import Counters
from softrdma.tools.cli import main

IW = "softrdma_iw_lo"


def _stats(capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["stats", "-j", "-d", IW]) == 0
    got = json.loads(capsys.readouterr().out)
    assert len(got) == 1 and got[0]["ifname"] == IW and got[0]["port"] == 1
    return dict(got[0])


def test_iwarp_stats_add_up_processes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SOFTRDMA_STATE_DIR", str(tmp_path))
    assert _stats(capsys)["sent_pkts"] == 0
    # a process that died without closing the device: its last publication counts
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    pid = int(dead.stdout)
    (tmp_path / f"{IW}.iw.{pid}.counters.json").write_text('{"sent_pkts": 4}')
    with v.Context(IW) as ctx:
        counters = cast(Counters, ctx.port.counters)
        counters.sent_pkts += 5  # as if it had sent five FPDUs
        counters.sent_terminate += 1
        got = wait_until(lambda: (s if (s := _stats(capsys))["sent_pkts"] == 9 else None),
                         20.0, "the live process's counters")
        assert got["sent_terminate"] == 1 and got["rcvd_icrc_err"] == 0
        assert not (tmp_path / f"{IW}.iw.{pid}.counters.json").exists()  # folded in
    # closed: the device keeps them
    assert _stats(capsys)["sent_pkts"] == 9
    assert port_totals.saved_counters(IW, tmp_path)["sent_pkts"] == 9
    assert not list(tmp_path.glob(f"{IW}.iw.*.counters.json"))
    assert main(["stats", "-d", IW]) == 0
    assert capsys.readouterr().out.startswith(f"link {IW}/1 sent_pkts 9 ")
    assert os.getpid() != pid
