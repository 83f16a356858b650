"""``softrdma pyverbs`` and ``softrdma rdma-core-tests``: the shim environment, the
verbose-output parser and report, and rdma-core's own suite run through the command."""

from __future__ import annotations

import argparse
import gzip
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness.device import private_device

from softrdma.compat import DEVICE_ENV, SHIM_DIR
from softrdma.tools.suites import rdma_core_tests as rct
from softrdma.tools.suites import sysfs_ns
from softrdma.tools.suites.pyverbs_run import SOFTRDMA_ROOT, shim_env

SRC = str(Path(__file__).resolve().parents[2] / "src")

VERBOSE = """\
test_alloc_pd (tests.test_pd.PDTest.test_alloc_pd)
Test ibv_alloc_pd() ... ok
test_dev_list (tests.test_device.DeviceTest.test_dev_list) ... ok
test_create_dm (tests.test_device.DMTest.test_create_dm)
test ibv_alloc_dm() ... skipped 'Device memory is not supported'
test_is_fork_initialized (tests.test_fork.ForkAPITest.test_is_fork_initialized) ... is_fork_initialized() = 2
ok
test_rc_traffic (tests.test_qp.QPTest.test_rc_traffic) ... FAIL
test_other (tests.test_qp.QPTest.test_other) ... ERROR
test_skip2 (tests.test_qp.QPTest.test_skip2) ... skipped "Create XRCD isn't supported"

======================================================================
FAIL: test_rc_traffic (tests.test_qp.QPTest.test_rc_traffic)
----------------------------------------------------------------------
Traceback (most recent call last):
  File "x.py", line 1, in test_rc_traffic
AssertionError: 1 != 2

======================================================================
ERROR: setUpClass (tests.test_mr.MRTest)
----------------------------------------------------------------------
Traceback (most recent call last):
RuntimeError: boom
----------------------------------------------------------------------
Ran 7 tests in 0.1s

FAILED (failures=1, errors=1, skipped=2)
"""


def test_parse_verbose_and_report() -> None:
    results = rct.parse_verbose(VERBOSE)
    by_id = {r.test_id.split(".")[-1]: r for r in results}
    assert by_id["test_alloc_pd"].status == "passed"
    assert by_id["test_is_fork_initialized"].status == "passed"  # output before "ok"
    assert by_id["test_create_dm"].status == "skipped"
    assert by_id["test_create_dm"].reason == "Device memory is not supported"
    assert by_id["test_skip2"].reason == "Create XRCD isn't supported"
    assert by_id["test_rc_traffic"].status == "failed" and by_id["test_other"].status == "error"
    assert any(r.file == "test_mr" and r.status == "error" for r in results)  # setUpClass
    summary = rct.summarize(results, VERBOSE)
    assert (summary["test_qp"].failed, summary["test_qp"].errors, summary["test_qp"].skipped) == (1, 1, 1)
    assert "AssertionError: 1 != 2" in summary["test_qp"].problems[0]
    report = rct.format_report(summary)
    lines = report.splitlines()
    assert lines[-1] == "rdma-core tests: 3 passed, 1 failed, 2 errors, 2 skipped"
    assert sum(ln.startswith("rdma-core tests:") for ln in lines) == 1
    assert any("skipped x1: Device memory is not supported" in ln for ln in lines)


def test_prepare_tests_gunzips(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "run_tests.py").write_text("print('x')\n")
    with gzip.open(src / "test_a.py.gz", "wb") as fh:
        fh.write(b"A = 1\n")
    out = rct.prepare_tests(src, tmp_path / "work")
    assert (out / "test_a.py").read_text() == "A = 1\n"
    assert not list(out.glob("*.gz")) and (out / "run_tests.py").is_file()


def _where_is_pyverbs(env: dict[str, str]) -> str:
    code = ("import importlib.util as u; s = u.find_spec('pyverbs'); "
            "print(s.origin if s else 'none')")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=60, check=True)
    return proc.stdout.strip()


def test_shim_only_through_the_command(tmp_path: Path) -> None:
    plain = dict(os.environ, PYTHONPATH=SRC)
    assert str(SHIM_DIR) not in _where_is_pyverbs(plain)  # a real pyverbs is not shadowed
    env = shim_env("dev9", plain)
    assert env["PYTHONPATH"].split(os.pathsep)[:2] == [str(SHIM_DIR), str(SOFTRDMA_ROOT)]
    assert env[DEVICE_ENV] == "dev9"
    assert _where_is_pyverbs(env) == str(SHIM_DIR / "pyverbs" / "__init__.py")


@pytest.fixture()
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    return private_device("pvt0", tmp_path, monkeypatch)


def _softrdma(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "softrdma", *args], capture_output=True,
                          text=True, timeout=timeout, check=False)


def test_softrdma_pyverbs_runs_a_program(state: str, tmp_path: Path) -> None:
    prog = tmp_path / "prog.py"
    prog.write_text(
        "import pyverbs.device as d\n"
        "from pyverbs.pd import PD\n"
        "name = d.get_device_list()[0].name.decode()\n"
        "with d.Context(name=name) as ctx:\n"
        "    PD(ctx)\n"
        "    print(name, ctx.query_port(1).link_layer)\n")
    proc = _softrdma("pyverbs", "--dev", state, "--", sys.executable, str(prog))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [state, "2"]
    assert _softrdma("pyverbs").returncode == 2
    bad = _softrdma("pyverbs", "--dev", "nope", "--", sys.executable, "-c", "pass")
    assert bad.returncode == 1 and "nope" in bad.stderr
    fail = _softrdma("pyverbs", "--", sys.executable, "-c", "raise SystemExit(3)")
    assert fail.returncode == 3


SUBSET = ["tests.test_device", "tests.test_pd", "tests.test_addr", "tests.test_cq",
          "tests.test_qp", "tests.test_mr", "tests.test_atomic", "tests.test_fork",
          "tests.test_parent_domain", "tests.test_mlx5_cq", "tests.test_efadv"]


@pytest.mark.slow  # the same command on a subset: test_whole_rdma_core_suite_in_ci runs it all
def test_rdma_core_suite_through_the_command(state: str) -> None:
    if not (rct.TESTS_DIR / "run_tests.py").is_file() and shutil.which("apt-get") is None:
        pytest.skip("rdma-core's tests are not installed and apt-get is unavailable")
    proc = _softrdma("rdma-core-tests", "--dev", state, *SUBSET, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    summary = [ln for ln in lines if ln.startswith("rdma-core tests:")]
    assert len(summary) == 1 and lines[-1] == summary[0]
    m = re.fullmatch(r"rdma-core tests: (\d+) passed, (\d+) failed, (\d+) errors, (\d+) skipped",
                     summary[0])
    assert m is not None
    passed, failed, errors, skipped = map(int, m.groups())
    assert passed >= 60, proc.stdout  # rxe passes 61 of these, softrdma 70
    assert skipped >= 20  # DM, dma-buf, raw packet, and the mlx5/EFA files skip cleanly
    assert any(ln.startswith("test_mlx5_cq") for ln in lines)


def test_whole_rdma_core_suite_in_ci(state: str) -> None:
    """The whole generic + vendor suite through the command, as CI runs it (issue 5): a
    summary line, a per-file table, and at least the 110 passes the issue asks for.
    No list of expected failures is pinned."""
    if not (rct.TESTS_DIR / "run_tests.py").is_file() and shutil.which("apt-get") is None:
        pytest.skip("rdma-core's tests are not installed and apt-get is unavailable")
    # Idle, the suite takes about 3 minutes. Beside 4 busy loops on 2 cores (the stress job)
    # it gets a small share of a CPU: the command's own limit is generous, and its
    # per-test lines (stderr) say where a run cut short was.
    proc = _softrdma("rdma-core-tests", "--dev", state, "--timeout", "2400", timeout=2500)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = proc.stdout.splitlines()
    m = re.fullmatch(r"rdma-core tests: (\d+) passed, (\d+) failed, (\d+) errors, (\d+) skipped",
                     lines[-1])
    assert m is not None, lines[-5:]
    passed, failed, errors, skipped = map(int, m.groups())
    print("\n" + "\n".join(lines[-25:]))
    assert passed >= 110, proc.stdout
    if os.geteuid() == 0:  # issue 14: 145, none failing (rdma_cm and huge pages need root)
        # Issue 25: none failing at load either. The late completions a loaded host used
        # to cause ("Got timeout on polling", "Failed to poll CQ", "Retry exceeded" in
        # the traffic tests, XRC most often) were datagrams of live QPs delivered to the
        # wrong context for good: devd's mirror of the reuseport group went out of step
        # when a context closed while the next one bound (tests/drivers/test_reuseport_join_race.py)
        assert failed == 0 and errors == 0, proc.stdout
        assert passed >= 145, proc.stdout
    assert passed + failed + errors + skipped >= 250  # the whole suite ran
    for name in ("test_device", "test_qp", "test_odp", "test_mlx5_cq"):
        assert any(ln.startswith(name) for ln in lines), name


CRASHING_SUITE = """\
import os, signal, sys
print("test_alloc_pd (tests.test_pd.PDTest.test_alloc_pd) ... ok", flush=True)
print("test_odp_rc (tests.test_odp.OdpTestCase.test_odp_rc) ... ERROR", flush=True)
print("test_next (tests.test_odp.OdpTestCase.test_next) ... ", end="", flush=True)
if sys.argv[-1] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
os._exit(0)
"""


@pytest.mark.parametrize(("how", "said"), [("0", "exit status 0"), ("kill", "killed by signal 9")])
def test_a_suite_that_stops_early_fails_the_command(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        how: str, said: str) -> None:
    """Issue 25: the pyverbs process died mid-suite (after test_odp) and the command still
    exited 0; a run without unittest's ``Ran N tests`` summary is partial: exit 1 naming the
    file it stopped in, even when the process itself exited 0."""
    tests_dir = tmp_path / "suite"
    tests_dir.mkdir()
    (tests_dir / "run_tests.py").write_text(CRASHING_SUITE)
    monkeypatch.setattr(sysfs_ns, "unavailable_reason", lambda: "not in this test")
    parser = argparse.ArgumentParser()
    rct.add_arguments(parser)
    args = parser.parse_args(["--dev", "nodev", "--tests-dir", str(tests_dir), "--no-install",
                              "--hugepages", "0", "--timeout", "120", how])
    assert rct.run(args) == 1
    out = capsys.readouterr()
    assert "rdma-core tests: 1 passed, 0 failed, 1 errors, 0 skipped" in out.out
    assert "stopped early" in out.err and "test_odp" in out.err
    assert said in out.err


def test_a_complete_suite_with_failures_exits_0(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Failing tests stay reported, not fatal, when the suite ran to its end."""
    tests_dir = tmp_path / "suite"
    tests_dir.mkdir()
    (tests_dir / "run_tests.py").write_text(
        f"import sys\nsys.stdout.write({VERBOSE!r})\nsys.exit(1)\n")
    monkeypatch.setattr(sysfs_ns, "unavailable_reason", lambda: "not in this test")
    parser = argparse.ArgumentParser()
    rct.add_arguments(parser)
    args = parser.parse_args(["--dev", "nodev", "--tests-dir", str(tests_dir), "--no-install",
                              "--hugepages", "0", "--timeout", "120"])
    assert rct.run(args) == 0
    assert rct.stopped_early(VERBOSE, 1, rct.parse_verbose(VERBOSE)) is None


HANGING_SUITE = """\
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open(sys.argv[-1], "w").write(str(child.pid))
print("test_alloc_pd (tests.test_pd.PDTest.test_alloc_pd) ... ok", flush=True)
print("test_stuck (tests.test_qp.QPTest.test_stuck) ... ", end="", flush=True)
time.sleep(600)
"""


def test_a_suite_past_its_timeout_shows_where_it_was(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 25: the suite ran past its test's limit in a stress run, and the command, which
    printed only at its end, left no clue where it was. Each line now reaches stderr as it
    comes, stamped with the seconds since the start; at the timeout the whole process group
    (here a grandchild too) is killed, and the report of what ran is still printed."""
    tests_dir = tmp_path / "suite"
    tests_dir.mkdir()
    (tests_dir / "run_tests.py").write_text(HANGING_SUITE)
    pid_file = tmp_path / "grandchild.pid"
    monkeypatch.setattr(sysfs_ns, "unavailable_reason", lambda: "not in this test")
    parser = argparse.ArgumentParser()
    rct.add_arguments(parser)
    args = parser.parse_args(["--dev", "nodev", "--tests-dir", str(tests_dir), "--no-install",
                              "--hugepages", "0", "--timeout", "6", str(pid_file)])
    started = time.monotonic()
    assert rct.run(args) == 1
    assert time.monotonic() - started < 60
    out = capsys.readouterr()
    assert "rdma-core tests: 1 passed, 0 failed, 0 errors, 0 skipped" in out.out
    assert re.search(r"^\[ *[0-9.]+ s\] test_alloc_pd \(.*\) \.\.\. ok$", out.err, re.M), out.err
    assert re.search(r"^\[ *[0-9.]+ s\] test_stuck \(.*\) \.\.\. $", out.err, re.M), out.err
    assert "did not finish within 6 s" in out.err
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 30
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild), "the suite's grandchild outlived it"


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for init to reap it does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"
