"""Root test: the interop smoke against real Linux rxe/siw in the lab (../shared/lab).

Runs ``softrdma interop --cases rc_pingpong/rxe/s4096 --guest 4 --json`` (one case, both
directions: the whole smoke runs once, from ``.ci/run``, right after the tests) and checks
every run passed with a capture that pcap-check accepts, then that the run tore down what
it started: the namespace, its
state directory and guest g4 when the test booted it. Skips when not root, when the lab's
scripts are not found, or when qemu is not installed (``../shared/lab/build.sh``
installs it; ``.ci/run`` builds the lab before the tests), and, saying so, when the guest
could not boot because the host is too loaded (:data:`TOO_LOADED`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from softrdma.interop.lab import (
    DEFAULT_CACHE,
    LAB_NETNS,
    Lab,
    LabError,
    load_factor,
    locate_shared,
    netns_exists,
)

ROOT = Path(__file__).resolve().parents[2]
GUEST = 4
SUITE_TIMEOUT = 1800
# A guest that could not boot on a host this loaded (load per core) skips the test, saying
# so; on a less loaded host it is a failure. The boot itself waits as long as the guest's
# console shows progress (softrdma.interop.lab.Lab.boot).
TOO_LOADED = 2.0


def _lab_reason() -> str:
    if os.geteuid() != 0:
        return "the lab needs root"
    try:
        locate_shared(ROOT)
    except LabError as e:
        return str(e)
    if shutil.which("qemu-system-x86_64") is None:
        return "qemu-system-x86_64 is not installed (../shared/lab/build.sh installs it)"
    return ""


def _guest_running(cache: Path, n: int) -> bool:
    return Lab(locate_shared(ROOT), cache).running(n)


def _interop(cases: str) -> tuple[list[dict[str, str]], subprocess.CompletedProcess[str]]:
    """``softrdma interop --cases CASES`` on guest g4 (captures in $LAB_CACHE/interop/);
    the results, every one of them asserted to pass."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    cp = subprocess.run([sys.executable, "-m", "softrdma", "interop", "--cases", cases,
                         "--guest", str(GUEST), "--json"],
                        capture_output=True, text=True, env=env, timeout=SUITE_TIMEOUT,
                        check=False, stdin=subprocess.DEVNULL)
    assert "Traceback" not in cp.stderr, cp.stderr[-3000:]
    if cp.returncode != 0 and "did not boot" in cp.stderr and load_factor() >= TOO_LOADED:
        pytest.skip(f"the host is too loaded to boot guest g{GUEST} (load "
                    f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores): "
                    f"{cp.stderr.strip().splitlines()[-1]}")
    assert cp.stdout.strip(), f"no results (exit {cp.returncode}): {cp.stderr[-3000:]}"
    results: list[dict[str, str]] = json.loads(cp.stdout)["results"]
    failed = [f"{r['case']} {r['direction']}: {r['result']} {r['reasons']}"
              for r in results if r["result"] != "pass"]
    assert not failed, "\n".join(failed) + "\n" + cp.stderr[-2000:]
    return results, cp


def _clean_up(cache: Path, was_running: bool, had_lab_netns: bool) -> None:
    """Whatever a failed run left: its namespace, the guest if this test booted it, and
    the lab's namespace if the run made it and no guest runs."""
    subprocess.run(["ip", "netns", "del", f"srinterop-g{GUEST}"], capture_output=True,
                   check=False)
    shared = locate_shared(ROOT)
    if not was_running and _guest_running(cache, GUEST):
        subprocess.run(["bash", str(shared / "lab" / "run.sh"), "stop", str(GUEST)],
                       capture_output=True, check=False, timeout=120)
    if not had_lab_netns and not Lab(shared, cache).guests_running():
        subprocess.run(["bash", str(shared / "lab" / "run.sh"), "net-down"],
                       capture_output=True, check=False, timeout=120)


@pytest.mark.slow  # CI: .ci/run's smoke right after the suite, and the mckey test below
@pytest.mark.skipif(bool(_lab_reason()), reason=_lab_reason() or "lab available")
def test_interop_smoke_against_linux() -> None:
    cache = Path(os.environ.get("LAB_CACHE", str(DEFAULT_CACHE)))
    was_running = _guest_running(cache, GUEST)
    had_lab_netns = netns_exists(LAB_NETNS)
    try:
        results, cp = _interop("rc_pingpong/rxe/s4096")
        assert len(results) == 2 and cp.returncode == 0
        for r in results:
            assert Path(r["pcap"]).is_file() and " 0 failed" in r["pcap_check"], r
        # teardown: the namespace and state directory are gone, the guest too if we booted
        # it, and the lab's namespace if the run made it (no other guest runs here)
        assert not netns_exists(f"srinterop-g{GUEST}")
        assert not Path(f"/tmp/softrdma-interop-g{GUEST}-state").exists()
        assert _guest_running(cache, GUEST) == was_running
        if not had_lab_netns and not Lab(locate_shared(ROOT), cache).guests_running():
            assert not netns_exists(LAB_NETNS)
    finally:
        _clean_up(cache, was_running, had_lab_netns)


@pytest.mark.skipif(bool(_lab_reason()), reason=_lab_reason() or "lab available")
def test_mckey_and_rdma_examples_against_linux() -> None:
    """softrdma's mckey and rdma-server/rdma-client against rdma-core's mckey,
    rdma_server and rdma_client on rxe, both directions (issue 14): each run passes,
    with a capture that pcap-check passes (the simultaneous DREQs of the examples'
    disconnect included)."""
    cache = Path(os.environ.get("LAB_CACHE", str(DEFAULT_CACHE)))
    was_running = _guest_running(cache, GUEST)
    had_lab_netns = netns_exists(LAB_NETNS)
    try:
        results, cp = _interop("mckey/rxe,rdma_server/rxe")
        assert len(results) == 4 and cp.returncode == 0
        for r in results:
            assert " 0 failed" in r["pcap_check"], r
    finally:
        _clean_up(cache, was_running, had_lab_netns)
