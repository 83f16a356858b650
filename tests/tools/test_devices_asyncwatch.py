"""``softrdma devices`` (``ibv_devices``) and ``softrdma asyncwatch``
(``ibv_asyncwatch``) with the port events behind it (issue 14): the device table, the
``PortState`` transitions, and (root) a device on a veth interface in a network
namespace of the test's: PORT_ERR when the interface goes down, PORT_ACTIVE when it
comes back, GID_CHANGE when an address is added."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness.device import reap, veth_device_netns
from harness.ports import free_port
from harness.wait import StreamLines

from softrdma import enums as e
from softrdma.drivers.host import registry
from softrdma.drivers.host.portwatch import PortState
from softrdma.tools.ibverbs import asyncwatch, devices

SRC = str(Path(__file__).resolve().parents[2] / "src")


def test_devices_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert devices.format_devices([("rxe0", 0x505400FFFE123456)]).splitlines() == [
        "    device          \t   node GUID",
        "    ------          \t----------------",
        "    rxe0            \t505400fffe123456",
    ]
    monkeypatch.setenv("SOFTRDMA_STATE_DIR", str(tmp_path / "state"))
    registry.add("dv0", "lo", "roce", free_port())
    proc = subprocess.run([sys.executable, "-m", "softrdma", "devices"], text=True,
                          capture_output=True, timeout=60, check=False,
                          env=dict(os.environ, PYTHONPATH=SRC))
    assert proc.returncode == 0, proc.stderr
    rows = proc.stdout.splitlines()[2:]
    assert any(r.split() == ["dv0", "020000fffe000000"] for r in rows), rows


def test_port_state_transitions() -> None:
    s = PortState()
    a, b = bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2])
    assert s.update(True, (a,)) == []  # the first sample only sets the state
    assert s.update(True, (a,)) == []
    assert s.update(False, (a,)) == [int(e.IBV_EVENT_PORT_ERR)]
    assert s.update(True, (a,)) == [int(e.IBV_EVENT_PORT_ACTIVE)]
    assert s.update(True, (a, b)) == [int(e.IBV_EVENT_GID_CHANGE)]
    assert s.update(False, ()) == [int(e.IBV_EVENT_PORT_ERR), int(e.IBV_EVENT_GID_CHANGE)]
    assert asyncwatch.event_name(int(e.IBV_EVENT_PORT_ERR)) == "IBV_EVENT_PORT_ERR"
    assert asyncwatch.event_name(int(e.IBV_EVENT_QP_FATAL)) == "unexpected"


def test_asyncwatch_unknown_device(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "softrdma", "asyncwatch", "-d", "nope"],
                          text=True, capture_output=True, timeout=60, check=False,
                          env=dict(os.environ, PYTHONPATH=SRC,
                                   SOFTRDMA_STATE_DIR=str(tmp_path / "s")))
    assert proc.returncode == 1
    assert proc.stderr.strip() == "softrdma asyncwatch: error: IB device nope not found"


@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (CI runs as root)")
def test_asyncwatch_reports_port_events(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=SRC, SOFTRDMA_STATE_DIR=str(tmp_path / "state"),
               SOFTRDMA_SHARED="0")
    with veth_device_netns("sraw", "aw0", "10.77.0.1", env, 30) as (ns, sh):
        watch: subprocess.Popen[str] | None = None
        try:
            watch = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-m",
                                      "softrdma", "asyncwatch", "-d", "aw0", "--count", "3"],
                                     env=env, text=True, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
            assert watch.stdout is not None
            assert watch.stderr is not None
            lines, errs = StreamLines(watch.stdout), StreamLines(watch.stderr)
            head = lines.wait_for(r"")
            assert head.string.startswith("aw0: async event FD "), head.string
            # each change once the watcher reported the one before
            sh("ip", "link", "set", "d0", "down")
            lines.wait_for("IBV_EVENT_PORT_ERR")
            sh("ip", "link", "set", "d0", "up")
            lines.wait_for("IBV_EVENT_PORT_ACTIVE")
            sh("ip", "addr", "add", "10.77.0.2/24", "dev", "d0")
            watch.wait(timeout=120)
            out, err = lines.join(), errs.join()
            assert watch.returncode == 0, err
            out = out.split("\n", 1)[1]  # the events after the head line
            assert out.splitlines() == [
                f"  event_type IBV_EVENT_PORT_ERR ({int(e.IBV_EVENT_PORT_ERR)}), port 1",
                f"  event_type IBV_EVENT_PORT_ACTIVE ({int(e.IBV_EVENT_PORT_ACTIVE)}), port 1",
                f"  event_type IBV_EVENT_GID_CHANGE ({int(e.IBV_EVENT_GID_CHANGE)}), port 1",
            ]
        finally:
            if watch is not None:
                reap(watch)


_WATCHER = """
import sys
sys.path.insert(0, sys.argv[1])
from softrdma.drivers.host.portwatch import PortWatch
pw = PortWatch("d0", lambda ev: print("event", ev, flush=True), interval=0.01)
print("ready", pw.samples, flush=True)
for _ in sys.stdin:
    print("samples", pw.samples, flush=True)
pw.stop()
print("stopped", flush=True)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (CI runs as root)")
def test_portwatch_is_told_by_rtnetlink_and_never_polls(tmp_path: Path) -> None:
    """The port watch samples the interface when rtnetlink reports a change, not on a
    timer (issue 22: its 0.2 s poll took the GIL five times a second from a C program
    spinning on ibv_poll_cq): left alone it samples nothing; each change is seen."""
    env = dict(os.environ, PYTHONPATH=SRC, SOFTRDMA_STATE_DIR=str(tmp_path / "state"),
               SOFTRDMA_SHARED="0")
    with veth_device_netns("srpw", "pw0", "10.78.0.1", env, 30) as (ns, sh):
        w = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", _WATCHER, SRC],
                             env=env, text=True, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            assert w.stdin is not None and w.stdout is not None and w.stderr is not None
            lines, errs = StreamLines(w.stdout), StreamLines(w.stderr)
            assert lines.wait_for(r"^ready ").string.strip() == "ready 1"
            # the observation window (the one sleep allowed): a poll every ``interval``
            # (0.01 s) would sample about 20 times in it
            time.sleep(0.2)
            w.stdin.write("\n")
            w.stdin.flush()
            # rtnetlink may still deliver one late notification of the set-up (linkwatch
            # sends carrier changes up to 1 s late)
            samples = int(lines.wait_for(r"^samples ").string.split()[1])
            assert samples <= 2, (samples, errs.join())
            sh("ip", "link", "set", "d0", "down")
            lines.wait_for(rf"^event {int(e.IBV_EVENT_PORT_ERR)}$")
            sh("ip", "link", "set", "d0", "up")
            lines.wait_for(rf"^event {int(e.IBV_EVENT_PORT_ACTIVE)}$")
            sh("ip", "addr", "add", "10.78.0.2/24", "dev", "d0")
            lines.wait_for(rf"^event {int(e.IBV_EVENT_GID_CHANGE)}$")
            w.stdin.close()
            lines.wait_for(r"^stopped$")
            assert w.wait(timeout=60) == 0, errs.join()
        finally:
            reap(w)
