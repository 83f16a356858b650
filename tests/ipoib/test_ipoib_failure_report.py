"""What a failed IPoIB test reports of its ``ipoib up`` processes (tests/conftest.py
appends :func:`harness.ipoib_netns.report` to the failure): each one's status (still
running, its exit code, or killed at teardown) and the tail of its stdout and stderr, which
go to a file as they are written (no pipe to fill). Root (network namespaces)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from harness.ipoib_netns import STARTED, TAIL, forget_torn_down, ipoib_up, report, start, started
from harness.netns import Network, skip_reason
from harness.wait import wait_until

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")

# a stand-in for an interface process that dies: 100 lines, then a traceback's last line
DIES = ("import sys\n"
        "for i in range(100):\n"
        "    print(f'line {i:03}', file=sys.stderr)\n"
        "print('struct.error: ushort format requires 0 <= number <= 65535', file=sys.stderr)\n"
        "sys.exit(3)\n")
RUNS = "import time\nprint('up', flush=True)\ntime.sleep(600)\n"


def test_report_gives_exit_code_and_output_tail(tmp_path: Path) -> None:
    with Network(1, tmp_path, device=False) as net:
        h = net.hosts[0]
        dies = start(h, [sys.executable, "-c", DIES])
        runs = start(h, [sys.executable, "-c", RUNS])
        assert dies.wait(timeout=60) == 3
        wait_until(lambda: started(runs).output() == "up\n", what="the running one's line")
        text = report()
        assert f"host1: ipoib up (pid {dies.pid}): exited 3; the last {TAIL} of 101 lines" in text
        assert "\n  struct.error: ushort format requires" in text, text
        assert "line 061" in text and "line 060" not in text, text  # the last 40 lines only
        assert f"host1: ipoib up (pid {runs.pid}): still running; the last 1 of 1 lines" in text
        assert text.endswith(f"({started(runs).log}):\n  up"), text
    # after teardown: the one that was running is told apart from one that died
    text = report()
    assert f"(pid {dies.pid}): exited 3" in text
    assert f"(pid {runs.pid}): still running at teardown (killed then)" in text
    forget_torn_down()
    assert not [s for s in STARTED if s.proc in (dies, runs)]


def test_a_real_ipoib_up_that_ends_is_reported(tmp_path: Path) -> None:
    """``ipoib_up`` itself: one refused at once (its error in the AssertionError too) and a
    running one killed."""
    with Network(1, tmp_path) as net:
        h = net.hosts[0]
        with pytest.raises(AssertionError) as refused:
            ipoib_up(h, addresses=["10.88.0.1"])
        assert "): exited 2; the last" in str(refused.value)
        assert "ADDR/PREFIX" in str(refused.value), refused.value
        p = ipoib_up(h)
        p.kill()
        p.wait(timeout=60)
        text = report()
        assert "ADDR/PREFIX" in text, text
        assert f"(pid {p.pid}): exited -9 (killed by SIGKILL)" in text, text
        assert "\n  sr-ib0: up, connected mode" in text, text  # its stdout
