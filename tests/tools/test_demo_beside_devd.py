"""``softrdma demo`` runs while another program uses ``softrdma_lo``: with its UDP port
(4791) taken, by that device's devd or anything else, the demo's in-process device takes
a free port and says so; an explicit ``--port`` that is taken is still an error."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from softrdma.tools import demo
from softrdma.tools.cli import main


def test_demo_takes_a_free_port_when_its_default_is_held(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SOFTRDMA_STATE_DIR", str(tmp_path))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as held:
        held.bind(("127.0.0.1", 0))  # stands for softrdma_lo's devd on 4791
        busy = held.getsockname()[1]
        monkeypatch.setattr(demo, "ROCE_V2_PORT", busy)
        rc = main(["demo", "--size", "64"])
        out = capsys.readouterr().out
    assert rc == 0, out
    assert f"(UDP {busy} is in use" in out
    assert f"127.0.0.1:{busy} " not in out
    assert out.rstrip().endswith("OK: all 5 checks passed")


def test_demo_beside_a_running_devd_of_softrdma_lo(tmp_path: Path) -> None:
    """The real case: a shared softrdma_lo (devd on 4791, opened by another process)
    and the demo at the same time. Skipped when 4791 is already taken by someone else
    (then the first test covers it)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.bind(("127.0.0.1", demo.ROCE_V2_PORT))
    except OSError:
        pytest.skip("UDP 4791 is in use by another program on this machine")
    finally:
        probe.close()
    env = {"SOFTRDMA_STATE_DIR": str(tmp_path), "SOFTRDMA_SHARED": "1",
           "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src"),
           "PATH": "/usr/bin:/bin"}
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from softrdma import verbs as v; "
         "ctx = v.Context('softrdma_lo'); print('up', flush=True); sys.stdin.read()"],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "up\n"
        r = subprocess.run([sys.executable, "-m", "softrdma", "demo", "--size", "64"],
                           env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "(UDP 4791 is in use" in r.stdout
    finally:
        holder.communicate("", timeout=30)
