"""rdma-core's rdma_cm tests on softrdma (issue 14): ``softrdma rdma-core-tests`` runs
the suite, as root, in a private mount namespace where softrdma's devices appear under
``/sys/class/infiniband/<dev>/device/net/<iface>`` (``softrdma.tools.suites.sysfs_ns``); the
host's ``/sys/class`` is untouched; without root the report says why those tests skip."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from harness.device import private_device

from softrdma.tools.suites import rdma_core_tests as rct
from softrdma.tools.suites import sysfs_ns

SRC = str(Path(__file__).resolve().parents[2] / "src")
ROOT = os.geteuid() == 0

needs_root = pytest.mark.skipif(not ROOT or sysfs_ns.unavailable_reason() is not None,
                                reason="mount namespaces need root (CI runs as root)")


@pytest.fixture()
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    return private_device("rcm0", tmp_path, monkeypatch)


@needs_root
def test_namespace_shows_the_devices_and_leaves_the_host_alone(tmp_path: Path) -> None:
    stash = tmp_path / "stash"
    stash.mkdir()
    script = ("ls /sys/class/infiniband/sr9/device/net/; "
              "ls /sys/class/infiniband/sr8/device/net/; ls /sys/class/net")
    cmd = sysfs_ns.wrap({"sr9": "lo", "sr8": "eth7"}, ["sh", "-c", script], stash)
    proc = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=SRC), capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.split()
    assert lines[:2] == ["lo", "eth7"]
    assert sorted(lines[2:]) == sorted(os.listdir("/sys/class/net"))  # other classes kept
    assert not Path("/sys/class/infiniband/sr9").exists()  # nothing reached the host
    assert list(stash.iterdir()) == []


def test_namespace_helper_refuses_bad_arguments(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert sysfs_ns.main(["dev=lo", "--", "true"]) == 1
    assert "usage" in capsys.readouterr().err
    assert sysfs_ns.main([f"--stash={tmp_path}", "dev", "--", "true"]) == 1
    assert "expected DEV=IFACE" in capsys.readouterr().err
    assert sysfs_ns.main([f"--stash={tmp_path}", "dev=lo", "--"]) == 1
    assert "no command" in capsys.readouterr().err
    (tmp_path / "x").write_text("")
    assert sysfs_ns.main([f"--stash={tmp_path}", "dev=lo", "--", "true"]) == 1
    assert "empty directory" in capsys.readouterr().err


def test_without_root_the_report_says_why(state: str, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    fake = tmp_path / "suite"
    fake.mkdir()
    (fake / "run_tests.py").write_text(
        "import os\n"
        "why = 'has' if os.path.exists('/sys/class/infiniband') else \"doesn't have\"\n"
        "print(f\"test_a (tests.test_rdmacm.CMTestCase.test_a) ... skipped 'Device {why} "
        "net interface'\")\n"
        "print('-' * 70)\nprint('Ran 1 test in 0.001s')\nprint()\nprint('OK (skipped=1)')\n")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert sysfs_ns.unavailable_reason() is not None
    args = argparse.Namespace(tests_dir=fake, no_install=True, dev=state, gid=0,
                              timeout=60.0, log=None, tests=[], hugepages=0)
    assert rct.run(args) == 0
    out = capsys.readouterr().out
    assert "note: the rdma_cm tests skip" in out and "needs root" in out
    assert "skipped x1: Device doesn't have net interface" in out


@needs_root
def test_rdma_core_rdmacm_tests_pass(state: str) -> None:
    if not (rct.TESTS_DIR / "run_tests.py").is_file() and shutil.which("apt-get") is None:
        pytest.skip("rdma-core's tests are not installed and apt-get is unavailable")
    proc = subprocess.run([sys.executable, "-m", "softrdma", "rdma-core-tests", "--dev", state,
                           "tests.test_rdmacm"], capture_output=True, text=True, timeout=600,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    last = proc.stdout.splitlines()[-1]
    m = re.fullmatch(r"rdma-core tests: (\d+) passed, (\d+) failed, (\d+) errors, (\d+) skipped",
                     last)
    assert m is not None, proc.stdout
    assert tuple(map(int, m.groups())) == (10, 0, 0, 0), proc.stdout
